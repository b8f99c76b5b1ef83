// SPDX-License-Identifier: MIT OR Apache-2.0
//! What one walk of the bus found, kept. A driver domain gets its devices from the
//! toolstack before it starts, so the walk at boot serves every later look-up; each
//! configuration access is a VM exit (under Xen's HVM a round trip to the device model
//! in dom0), and a walk of one bus is some sixty of them. A look-up the kept walk cannot
//! answer walks the bus once more (a device added since) before it gives up. BARs are
//! read, and sized, once each, when first asked for.

use crate::{
    enumerate_tree, memory_bar_addresses, read_bar, Bar, BarError, ConfigAccess, Function,
    PciAddress,
};
use alloc::vec::Vec;

/// BAR `index` as `read_bar` gave it, once read.
type CachedBar = Option<Result<Option<Bar>, BarError>>;

struct Entry {
    function: Function,
    bars: [CachedBar; 6],
}

/// The functions reachable from one root bus, in walk order, with the BARs read so far.
pub struct Inventory {
    root_bus: u8,
    entries: Vec<Entry>,
    walks: u32,
}

impl Inventory {
    /// Walks the tree below `root_bus` (bridges followed) and keeps what it found.
    pub fn walk(config: &dyn ConfigAccess, root_bus: u8) -> Inventory {
        let mut inventory = Inventory {
            root_bus,
            entries: Vec::new(),
            walks: 0,
        };
        inventory.rewalk(config);
        inventory
    }

    /// Walks the tree again; a function found again (same address and identity) keeps
    /// the BARs read of it.
    fn rewalk(&mut self, config: &dyn ConfigAccess) {
        let mut old = core::mem::take(&mut self.entries);
        let mut entries = Vec::new();
        enumerate_tree(config, self.root_bus, &mut |function| {
            let bars = old
                .iter_mut()
                .find(|e| e.function == function)
                .map_or([None; 6], |e| core::mem::take(&mut e.bars));
            entries.push(Entry { function, bars });
        });
        self.entries = entries;
        self.walks += 1;
    }

    /// How many times the bus was walked.
    pub fn walks(&self) -> u32 {
        self.walks
    }

    /// Every function found, in walk order.
    pub fn functions(&self) -> impl Iterator<Item = &Function> + '_ {
        self.entries.iter().map(|e| &e.function)
    }

    fn nth(&self, wanted: fn(&Function) -> bool, index: usize) -> Option<Function> {
        self.functions().filter(|f| wanted(f)).nth(index).copied()
    }

    /// The `index`-th function (in walk order) that `wanted` accepts: from what was
    /// found, or, when that has fewer, from one more walk of the bus (kept for later).
    pub fn find(
        &mut self,
        config: &dyn ConfigAccess,
        wanted: fn(&Function) -> bool,
        index: usize,
    ) -> Option<Function> {
        if let Some(found) = self.nth(wanted, index) {
            return Some(found);
        }
        self.rewalk(config);
        self.nth(wanted, index)
    }

    /// BAR `index` of the function at `address`, decoded and sized by `read_bar` the
    /// first time only (a function the walks did not find is read every time).
    pub fn bar(
        &mut self,
        config: &dyn ConfigAccess,
        address: PciAddress,
        index: u8,
    ) -> Result<Option<Bar>, BarError> {
        let Some(slot) = self
            .entries
            .iter_mut()
            .find(|e| e.function.address == address)
            .and_then(|e| e.bars.get_mut(usize::from(index)))
        else {
            return read_bar(config, address, index);
        };
        *slot.get_or_insert_with(|| read_bar(config, address, index))
    }

    /// The address of every assigned memory BAR of every device function found (not
    /// bridges), read without sizing (`memory_bar_addresses`).
    pub fn memory_bar_addresses(&self, config: &dyn ConfigAccess) -> Vec<u64> {
        self.functions()
            .filter(|f| f.header_type == 0)
            .flat_map(|f| memory_bar_addresses(config, f.address))
            .collect()
    }
}
