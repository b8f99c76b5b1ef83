// SPDX-License-Identifier: MIT OR Apache-2.0
//! Where a RAM disk's stripes come from: memory of their own, not the heap.
//!
//! A live upgrade hands a RAM disk's stripes to the next image by address (its heap
//! cannot be adopted: the allocator's metadata is the old build's), so stripes live in
//! 64 KiB-aligned units the kernel takes out of its frame allocator at boot
//! ([`StripeArena`], filled by the kernel's physical-memory layer, the only place that
//! turns addresses into memory). The disk logic reaches them through [`StripeFrames`]
//! alone, as virtio-drivers reach DMA through their `Hal`: tests give it a fake.

use alloc::vec::Vec;
use spin::Mutex;

use super::stripes::STRIPE_BYTES;

/// A source of stripes: `STRIPE_BYTES` of memory each, `STRIPE_BYTES`-aligned where
/// the source says so ([`StripeArena`]: always).
pub trait StripeFrames: Sync + core::fmt::Debug {
    /// A stripe of its own (contents undefined: the disk zeroes it), or `None`.
    fn take(&self) -> Option<&'static mut [u8]>;
    /// A stripe taken from here (by `take` or `adopt`) comes back, zeroed by the disk.
    fn give(&self, stripe: &'static mut [u8]);
    /// The stripe at `address` that the previous image handed over, if it is this
    /// source's and not in use; `None` otherwise (then the disk is refused).
    fn adopt(&self, address: u64) -> Option<&'static mut [u8]>;
    /// Bytes `take` could still hand out.
    fn free_bytes(&self) -> u64;
}

/// The address a stripe lies at (identity mapped in the kernel: its physical address).
pub fn address_of(stripe: &[u8]) -> u64 {
    stripe.as_ptr() as usize as u64
}

#[derive(Debug)]
struct Unit {
    address: u64,
    /// `None` while a disk holds it.
    memory: Option<&'static mut [u8]>,
}

#[derive(Debug, Default)]
struct Units {
    /// Sorted by address.
    all: Vec<Unit>,
    /// Indices into `all` of the units not in use.
    free: Vec<u32>,
}

/// Stripe memory in fixed regions, cut into `STRIPE_BYTES`-aligned units: the kernel's
/// (filled from its frame allocator at boot) and the tests'. Taking and giving back are
/// the control path's (growing a disk, `maintain`), never the I/O path's.
#[derive(Debug)]
pub struct StripeArena {
    units: Mutex<Units>,
}

impl Default for StripeArena {
    fn default() -> Self {
        Self::new()
    }
}

impl StripeArena {
    pub const fn new() -> Self {
        StripeArena {
            units: Mutex::new(Units {
                all: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    /// Adds the whole aligned units inside `region` (the rest of it is not used);
    /// returns the bytes added.
    pub fn add(&self, region: &'static mut [u8]) -> u64 {
        let start = address_of(region);
        let skip = (start.next_multiple_of(STRIPE_BYTES as u64) - start) as usize;
        if skip >= region.len() {
            return 0;
        }
        let (_, aligned) = region.split_at_mut(skip);
        let mut units = self.units.lock();
        let mut added = 0;
        for unit in aligned.chunks_exact_mut(STRIPE_BYTES) {
            units.all.push(Unit {
                address: address_of(unit),
                memory: Some(unit),
            });
            added += STRIPE_BYTES as u64;
        }
        units.all.sort_unstable_by_key(|unit| unit.address);
        let Units { all, free } = &mut *units;
        free.clear();
        free.extend(
            all.iter()
                .enumerate()
                .filter(|(_, unit)| unit.memory.is_some())
                .map(|(n, _)| n as u32),
        );
        // Taken from the end: the lowest addresses first.
        free.reverse();
        added
    }

    /// Bytes of every unit, in use or not.
    pub fn total_bytes(&self) -> u64 {
        self.units.lock().all.len() as u64 * STRIPE_BYTES as u64
    }

    fn find(all: &[Unit], address: u64) -> Option<usize> {
        all.binary_search_by_key(&address, |unit| unit.address).ok()
    }
}

impl StripeFrames for StripeArena {
    fn take(&self) -> Option<&'static mut [u8]> {
        let mut units = self.units.lock();
        let n = units.free.pop()? as usize;
        units.all[n].memory.take()
    }

    fn give(&self, stripe: &'static mut [u8]) {
        let mut units = self.units.lock();
        let address = address_of(stripe);
        match Self::find(&units.all, address) {
            Some(n) if units.all[n].memory.is_none() && stripe.len() == STRIPE_BYTES => {
                units.all[n].memory = Some(stripe);
                units.free.push(n as u32);
            }
            // Not one of ours (cannot happen: a disk gives back what it took): kept out
            // of use rather than handed out twice.
            _ => {}
        }
    }

    fn adopt(&self, address: u64) -> Option<&'static mut [u8]> {
        let mut units = self.units.lock();
        let n = Self::find(&units.all, address)?;
        let memory = units.all[n].memory.take()?;
        units.free.retain(|&free| free as usize != n);
        Some(memory)
    }

    fn free_bytes(&self) -> u64 {
        self.units.lock().free.len() as u64 * STRIPE_BYTES as u64
    }
}

/// The stripes of a disk made without a budget (tests, and the crates' tests built on
/// this one): from the heap, and kept for reuse when given back (never freed: a
/// `&'static mut` cannot go back to the heap without unsafe code).
#[derive(Debug)]
pub(super) struct HeapStripes {
    spare: Mutex<Vec<&'static mut [u8]>>,
}

pub(super) static HEAP_STRIPES: HeapStripes = HeapStripes {
    spare: Mutex::new(Vec::new()),
};

impl StripeFrames for HeapStripes {
    fn take(&self) -> Option<&'static mut [u8]> {
        if let Some(stripe) = self.spare.lock().pop() {
            return Some(stripe);
        }
        let mut memory = Vec::new();
        memory.try_reserve_exact(STRIPE_BYTES).ok()?;
        memory.resize(STRIPE_BYTES, 0);
        Some(memory.leak())
    }

    fn give(&self, stripe: &'static mut [u8]) {
        let mut spare = self.spare.lock();
        if spare.try_reserve(1).is_ok() {
            spare.push(stripe);
        }
    }

    fn adopt(&self, _address: u64) -> Option<&'static mut [u8]> {
        None
    }

    fn free_bytes(&self) -> u64 {
        u64::MAX
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! An arena for tests: leaked memory, stripes poisoned when taken and looked at when
    //! given back (a stripe given back holding data would reach the next disk).
    use super::*;
    use core::sync::atomic::{AtomicUsize, Ordering};

    /// What a stripe holds when it is taken: the arena may hand out anything.
    pub(crate) const POISON: u8 = 0xA5;

    #[derive(Debug)]
    pub(crate) struct Inspecting {
        pub(crate) arena: StripeArena,
        /// Stripes given back holding a byte that is not zero.
        pub(crate) dirty: AtomicUsize,
    }

    /// An arena of `stripes` units (leaked).
    pub(crate) fn arena(stripes: usize) -> &'static Inspecting {
        let fake = Box::leak(Box::new(Inspecting {
            arena: StripeArena::new(),
            dirty: AtomicUsize::new(0),
        }));
        let region = vec![0u8; (stripes + 1) * STRIPE_BYTES].leak();
        let skip = (address_of(region).next_multiple_of(STRIPE_BYTES as u64) - address_of(region))
            as usize;
        let (_, rest) = region.split_at_mut(skip);
        let (units, _) = rest.split_at_mut(stripes * STRIPE_BYTES);
        fake.arena.add(units);
        fake
    }

    impl StripeFrames for Inspecting {
        fn take(&self) -> Option<&'static mut [u8]> {
            let stripe = self.arena.take()?;
            stripe.fill(POISON);
            Some(stripe)
        }
        fn give(&self, stripe: &'static mut [u8]) {
            if stripe.iter().any(|&b| b != 0) {
                self.dirty.fetch_add(1, Ordering::Relaxed);
            }
            self.arena.give(stripe)
        }
        fn adopt(&self, address: u64) -> Option<&'static mut [u8]> {
            self.arena.adopt(address)
        }
        fn free_bytes(&self) -> u64 {
            self.arena.free_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arena_hands_out_aligned_units_once_each() {
        let fake = fake::arena(8);
        let arena = &fake.arena;
        assert_eq!(arena.total_bytes(), 8 * STRIPE_BYTES as u64);
        let mut taken: Vec<_> = (0..8).map(|_| arena.take().unwrap()).collect();
        assert!(arena.take().is_none(), "all 8 in use");
        assert_eq!(arena.free_bytes(), 0);
        let mut addresses: Vec<u64> = taken.iter().map(|s| address_of(s)).collect();
        assert!(addresses.iter().all(|a| a % STRIPE_BYTES as u64 == 0));
        addresses.dedup();
        assert_eq!(addresses.len(), 8, "lowest first, each once");
        assert!(addresses.windows(2).all(|w| w[0] < w[1]));
        let back = taken.pop().unwrap();
        let address = address_of(back);
        arena.give(back);
        assert_eq!(arena.free_bytes(), STRIPE_BYTES as u64);
        // Adopting: only a unit of the arena that is free.
        assert!(arena.adopt(address + 4096).is_none(), "not a unit's start");
        assert!(arena.adopt(addresses[0]).is_none(), "in use");
        let adopted = arena.adopt(address).unwrap();
        assert_eq!(address_of(adopted), address);
        assert!(arena.adopt(address).is_none(), "adopted twice");
        assert!(arena.take().is_none(), "the adopted unit is not free");
    }
}
