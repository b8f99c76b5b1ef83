// SPDX-License-Identifier: MIT OR Apache-2.0
//! A fake configuration space for tests: functions as 256-byte arrays, with BARs that
//! answer the all-ones probe like hardware (address bits below the size read as zero).

use crate::{ConfigAccess, PciAddress};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

pub struct FakeFunction {
    pub bytes: [u8; 256],
    /// Writable address bits of each BAR register (0: not implemented).
    pub bar_writable: [u32; 6],
    pub writes: Vec<(u16, u32)>,
}

impl FakeFunction {
    pub fn new(vendor: u16, device: u16, class: (u8, u8, u8)) -> Self {
        let mut f = FakeFunction {
            bytes: [0; 256],
            bar_writable: [0; 6],
            writes: Vec::new(),
        };
        f.set32(0, u32::from(vendor) | (u32::from(device) << 16));
        f.set32(
            8,
            (u32::from(class.0) << 24) | (u32::from(class.1) << 16) | (u32::from(class.2) << 8),
        );
        f
    }

    pub fn get32(&self, offset: u16) -> u32 {
        let o = usize::from(offset);
        u32::from_le_bytes(self.bytes[o..o + 4].try_into().unwrap())
    }

    pub fn set32(&mut self, offset: u16, value: u32) {
        let o = usize::from(offset);
        self.bytes[o..o + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// A 32-bit memory BAR of `size` bytes (a power of two) at `address`.
    pub fn memory_bar32(&mut self, index: usize, address: u32, size: u32) {
        self.bar_writable[index] = !(size - 1) & !0xf;
        self.set32(0x10 + index as u16 * 4, address);
    }

    /// A 64-bit memory BAR (slots `index` and `index + 1`).
    pub fn memory_bar64(&mut self, index: usize, address: u64, size: u64, prefetch: bool) {
        let mask = !(size - 1);
        self.bar_writable[index] = (mask as u32) & !0xf;
        self.bar_writable[index + 1] = (mask >> 32) as u32;
        let flags = 0b100 | if prefetch { 0b1000 } else { 0 };
        self.set32(0x10 + index as u16 * 4, (address as u32 & !0xf) | flags);
        self.set32(0x14 + index as u16 * 4, (address >> 32) as u32);
    }

    pub fn io_bar(&mut self, index: usize, port: u16, size: u16) {
        // 16 address bits implemented: the upper half reads as zero.
        self.bar_writable[index] = u32::from(!(size - 1)) & 0xfffc;
        self.set32(0x10 + index as u16 * 4, u32::from(port) | 1);
    }

    /// Appends a capability with `body` (after the id/next header) at `offset`.
    pub fn add_capability(&mut self, offset: u8, id: u8, body: &[u8]) {
        // Status bit 4: capability list present.
        self.bytes[6] |= 1 << 4;
        let mut link = 0x34usize;
        while self.bytes[link] != 0 {
            link = usize::from(self.bytes[link]) + 1;
        }
        self.bytes[link] = offset;
        let o = usize::from(offset);
        self.bytes[o] = id;
        self.bytes[o + 1] = 0;
        self.bytes[o + 2..o + 2 + body.len()].copy_from_slice(body);
    }
}

#[derive(Default)]
pub struct FakeConfig {
    pub functions: RefCell<BTreeMap<PciAddress, FakeFunction>>,
    /// Reads and writes so far (each a VM exit on a virtual machine).
    pub accesses: Cell<usize>,
}

impl FakeConfig {
    pub fn insert(&self, address: PciAddress, function: FakeFunction) {
        self.functions.borrow_mut().insert(address, function);
    }

    /// Accesses since the last call.
    pub fn take_accesses(&self) -> usize {
        self.accesses.replace(0)
    }
}

impl ConfigAccess for FakeConfig {
    fn read32(&self, address: PciAddress, offset: u16) -> u32 {
        assert_eq!(offset % 4, 0, "unaligned config read");
        self.accesses.set(self.accesses.get() + 1);
        self.functions
            .borrow()
            .get(&address)
            .map_or(u32::MAX, |f| f.get32(offset))
    }

    fn write32(&self, address: PciAddress, offset: u16, value: u32) {
        assert_eq!(offset % 4, 0, "unaligned config write");
        self.accesses.set(self.accesses.get() + 1);
        let mut functions = self.functions.borrow_mut();
        let Some(f) = functions.get_mut(&address) else {
            return;
        };
        f.writes.push((offset, value));
        match offset {
            0x04 => {
                // Only the command half is writable here; status bits stay.
                let status = f.get32(4) & 0xffff_0000;
                f.set32(4, status | (value & 0xffff));
            }
            0x10..=0x24 => {
                let index = usize::from((offset - 0x10) / 4);
                let writable = f.bar_writable[index];
                let old = f.get32(offset);
                // Flag bits of the low dword are read-only; unimplemented bits read zero.
                let flags = if index > 0 && f.bar_writable[index - 1] != 0 && {
                    let low = f.get32(offset - 4);
                    low & 1 == 0 && low & 0b110 == 0b100
                } {
                    0
                } else if old & 1 == 1 {
                    old & 0x3
                } else {
                    old & 0xf
                };
                f.set32(offset, (value & writable) | flags);
            }
            _ => f.set32(offset, value),
        }
    }
}
