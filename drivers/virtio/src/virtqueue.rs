// SPDX-License-Identifier: MIT OR Apache-2.0
//! A split virtqueue: descriptor table, available ring, used ring (virtio 1.x §2.7).
//! The indices are free-running 16-bit counters; a ring position is the index modulo
//! the queue size (a power of two).

use crate::Hal;
use blkdev::DmaRegion;
use core::sync::atomic::{fence, Ordering};

pub(crate) const DESC_F_NEXT: u16 = 1;
pub(crate) const DESC_F_WRITE: u16 = 2;
pub(crate) const DESC_F_INDIRECT: u16 = 4;
pub(crate) const DESC_LEN: u64 = 16;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const USED_F_NO_NOTIFY: u16 = 1;
const PAGE: usize = 4096;

/// One descriptor as the device reads it.
pub(crate) fn descriptor(address: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0..8].copy_from_slice(&address.to_le_bytes());
    bytes[8..12].copy_from_slice(&len.to_le_bytes());
    bytes[12..14].copy_from_slice(&flags.to_le_bytes());
    bytes[14..16].copy_from_slice(&next.to_le_bytes());
    bytes
}

pub(crate) struct SplitRing {
    pub desc: DmaRegion,
    pub avail: DmaRegion,
    pub used: DmaRegion,
    pub size: u16,
    /// Next free available-ring position (not yet visible to the device).
    avail_idx: u16,
    last_used: u16,
}

impl SplitRing {
    pub fn new<H: Hal>(hal: &H, size: u16) -> Option<Self> {
        let n = usize::from(size);
        let desc = hal.allocate_dma((n * DESC_LEN as usize).div_ceil(PAGE))?;
        let avail = hal.allocate_dma((6 + 2 * n).div_ceil(PAGE))?;
        let used = hal.allocate_dma((6 + 8 * n).div_ceil(PAGE))?;
        // Polled: ask the device not to interrupt.
        hal.write_dma(avail, 0, &AVAIL_F_NO_INTERRUPT.to_le_bytes());
        Some(SplitRing {
            desc,
            avail,
            used,
            size,
            avail_idx: 0,
            last_used: 0,
        })
    }

    /// The device was reset, and the ring set up again empty (`clear`): both indices
    /// start over.
    pub fn restart(&mut self) {
        self.avail_idx = 0;
        self.last_used = 0;
    }

    /// Empties the available and used rings of a ring (before the device is given it
    /// again after a reset), asking again not to be interrupted.
    pub fn clear<H: Hal>(hal: &H, avail: DmaRegion, used: DmaRegion) {
        hal.zero_dma(avail);
        hal.zero_dma(used);
        hal.write_dma(avail, 0, &AVAIL_F_NO_INTERRUPT.to_le_bytes());
    }

    /// Puts descriptor `index`, naming the first `entries` descriptors of the indirect
    /// `table`, on the available ring (visible after `publish`).
    pub fn post_indirect<H: Hal>(&mut self, hal: &H, index: u16, table: DmaRegion, entries: u16) {
        let len = u64::from(entries) * DESC_LEN;
        hal.write_dma(
            self.desc,
            u64::from(index) * DESC_LEN,
            &descriptor(table.span(0, len), len as u32, DESC_F_INDIRECT, 0),
        );
        self.post_chain(hal, index);
    }

    /// Puts the chain starting at descriptor `index` on the available ring.
    pub fn post_chain<H: Hal>(&mut self, hal: &H, index: u16) {
        let position = u64::from(self.avail_idx % self.size);
        hal.write_dma(self.avail, 4 + 2 * position, &index.to_le_bytes());
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Makes everything posted visible; true when the device wants a notification.
    pub fn publish<H: Hal>(&self, hal: &H) -> bool {
        // Ring entries before the index that exposes them.
        fence(Ordering::SeqCst);
        hal.write_dma(self.avail, 2, &self.avail_idx.to_le_bytes());
        // The index before looking at the device's wish not to be notified.
        fence(Ordering::SeqCst);
        let mut flags = [0u8; 2];
        hal.read_dma(self.used, 0, &mut flags);
        u16::from_le_bytes(flags) & USED_F_NO_NOTIFY == 0
    }

    /// The next used element: (descriptor index, bytes written).
    pub fn next_used<H: Hal>(&mut self, hal: &H) -> Option<(u32, u32)> {
        let used_idx = hal.read_dma_u16(self.used, 2);
        if used_idx == self.last_used {
            return None;
        }
        // The element is read only after its index was seen.
        fence(Ordering::Acquire);
        let position = u64::from(self.last_used % self.size);
        let mut element = [0u8; 8];
        hal.read_dma(self.used, 4 + 8 * position, &mut element);
        self.last_used = self.last_used.wrapping_add(1);
        Some((
            u32::from_le_bytes(element[0..4].try_into().expect("4")),
            u32::from_le_bytes(element[4..8].try_into().expect("4")),
        ))
    }
}
