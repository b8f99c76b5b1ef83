// SPDX-License-Identifier: MIT OR Apache-2.0
//! A RAM disk across a live upgrade: its table of resident stripes for the handover, and
//! the disk rebuilt from such a table by the next image.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

use super::stripes::{adopted_memory, chunk, CHUNK_STRIPES, STRIPE_BYTES};
use super::{OutOfMemory, RamDisk};
use crate::{Geometry, HeapBudget, SECTOR_SIZE};

/// One resident stripe of a handed-over disk: its place in the disk (byte offset /
/// `STRIPE_BYTES`) and the address of its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandedStripe {
    pub index: u64,
    pub address: u64,
}

/// Why a handed-over stripe table is refused (the disk is not rebuilt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdoptError {
    /// The tables (or the disk's own structures) could not be had.
    OutOfMemory(OutOfMemory),
    /// A stripe beyond the capacity (`stripes` of them).
    Beyond { index: u64, stripes: u64 },
    /// Two entries for one stripe.
    Twice { index: u64 },
    /// An address not on a stripe boundary.
    Misaligned { address: u64 },
    /// Two stripes on the same memory.
    Shared { address: u64 },
    /// Memory the stripe source does not hold free to be adopted.
    NotAdoptable { address: u64 },
}

impl core::fmt::Display for AdoptError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AdoptError::OutOfMemory(e) => e.fmt(f),
            AdoptError::Beyond { index, stripes } => {
                write!(f, "stripe {index} beyond the disk's {stripes} stripes")
            }
            AdoptError::Twice { index } => write!(f, "stripe {index} handed over twice"),
            AdoptError::Misaligned { address } => {
                write!(f, "stripe memory at {address:#x} is not 64 KiB-aligned")
            }
            AdoptError::Shared { address } => {
                write!(f, "two stripes on the memory at {address:#x}")
            }
            AdoptError::NotAdoptable { address } => {
                write!(
                    f,
                    "stripe memory at {address:#x} is not free stripe memory here"
                )
            }
        }
    }
}

impl core::error::Error for AdoptError {}

/// Checks a handed-over table against a disk of `capacity_bytes`: every index inside it
/// and named once, every address stripe-aligned and used once (aligned, equal-sized
/// stripes at different addresses are disjoint).
pub fn check_table(capacity_bytes: u64, table: &[HandedStripe]) -> Result<(), AdoptError> {
    let stripes = capacity_bytes.div_ceil(STRIPE_BYTES as u64);
    let mut by_index: Vec<u64> = Vec::new();
    let mut by_address: Vec<u64> = Vec::new();
    let short = OutOfMemory {
        bytes: capacity_bytes,
    };
    by_index
        .try_reserve_exact(table.len())
        .map_err(|_| AdoptError::OutOfMemory(short))?;
    by_address
        .try_reserve_exact(table.len())
        .map_err(|_| AdoptError::OutOfMemory(short))?;
    for stripe in table {
        if stripe.index >= stripes {
            return Err(AdoptError::Beyond {
                index: stripe.index,
                stripes,
            });
        }
        if !stripe.address.is_multiple_of(STRIPE_BYTES as u64) {
            return Err(AdoptError::Misaligned {
                address: stripe.address,
            });
        }
        by_index.push(stripe.index);
        by_address.push(stripe.address);
    }
    by_index.sort_unstable();
    if let Some(pair) = by_index.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(AdoptError::Twice { index: pair[0] });
    }
    by_address.sort_unstable();
    if let Some(pair) = by_address.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(AdoptError::Shared { address: pair[0] });
    }
    Ok(())
}

impl RamDisk {
    /// The stripes holding data, for a handover (in index order): each with the
    /// address of its memory. Stripes that read as zero (never written, or discarded
    /// whole) are not named, nor the spare ones: their memory is the next image's to
    /// reuse. Called once every queue has stopped.
    pub fn stripe_table(&self) -> Vec<HandedStripe> {
        let store = &*self.store;
        let stripes = store.capacity_bytes().div_ceil(STRIPE_BYTES);
        let mut table = Vec::new();
        for index in 0..stripes {
            let Some(stripe) = store.stripe(index) else {
                continue;
            };
            let stripe = stripe.lock();
            if let (Some(memory), false) = (&stripe.memory, stripe.zero) {
                table.push(HandedStripe {
                    index: index as u64,
                    address: memory.address(),
                });
            }
        }
        table
    }

    /// The disk a previous image handed over: `geometry` (its capacity as it was), able
    /// to grow to `max_sectors`, its data in the stripes `table` names (taken from the
    /// budget's stripe source as they are, not zeroed); every other stripe reads as
    /// zero and gets memory when written, as a discarded one does. The table is checked
    /// first ([`check_table`]) and every stripe must be adoptable: otherwise nothing is
    /// kept and the reason is returned.
    pub fn adopt(
        geometry: Geometry,
        max_sectors: u64,
        signal: Option<&'static AtomicBool>,
        heap: Option<&'static HeapBudget>,
        table: &[HandedStripe],
    ) -> Result<Self, AdoptError> {
        let capacity = geometry.sectors * SECTOR_SIZE;
        check_table(capacity, table)?;
        let short = AdoptError::OutOfMemory(OutOfMemory { bytes: capacity });
        let disk = RamDisk::empty(geometry, max_sectors, signal, heap).map_err(|_| short)?;
        let store = &*disk.store;
        let stripes = (capacity as usize).div_ceil(STRIPE_BYTES);
        if let Some(heap) = heap {
            let tables = stripes.div_ceil(CHUNK_STRIPES) * CHUNK_STRIPES * 64;
            heap.fits(tables as u64).map_err(|_| short)?;
        }
        for n in 0..stripes.div_ceil(CHUNK_STRIPES) {
            store.chunks[n]
                .try_call_once(|| chunk().ok_or(()))
                .map_err(|()| short)?;
        }
        for handed in table {
            let memory =
                adopted_memory(store.frames, handed.address).ok_or(AdoptError::NotAdoptable {
                    address: handed.address,
                })?;
            let Some(stripe) = store.stripe(handed.index as usize) else {
                return Err(short);
            };
            stripe.lock().memory = Some(memory);
            store
                .resident
                .fetch_add(STRIPE_BYTES as u64, Ordering::Relaxed);
        }
        store.sectors.store(geometry.sectors, Ordering::Release);
        // What it does not hold it will want when its guest writes there.
        store.settle();
        Ok(disk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::memory::{address_of, StripeFrames};
    use crate::ram::tests::{collect, discard_now, maintain_all, write_page, STRIPE_SECTORS};
    use crate::IoStatus;

    fn stripe(index: u64, address: u64) -> HandedStripe {
        HandedStripe { index, address }
    }

    #[test]
    fn a_disk_rebuilt_from_its_stripe_table_holds_its_data() {
        let (heap, arena) = crate::heap::fake::budget(4 << 20, 1 << 30, 64);
        let sectors = 32 * STRIPE_SECTORS;
        let old = RamDisk::try_new(RamDisk::plain(sectors), 0, None, Some(heap)).unwrap();
        let mut queue = old.queue(8);
        for n in 0..32u64 {
            write_page(&mut queue, n as u32, n * STRIPE_SECTORS + 8, n as u8 + 1).unwrap();
            collect(&mut queue);
        }
        // 20 stripes discarded whole: not named (they read as zero).
        discard_now(&mut queue, 4 * STRIPE_SECTORS, 20 * STRIPE_SECTORS);
        let table = old.stripe_table();
        assert_eq!(table.len(), 12);
        assert!(table.iter().all(|s| !(4..24).contains(&s.index)));
        let mut before = vec![0; sectors as usize * 512];
        old.read_at(0, &mut before);
        // The old image stops: its stripes stay where they are (an arena of the next
        // image holding them free, here: given back without being zeroed is not
        // possible, so the test lends them by forgetting the old disk).
        drop(queue);
        core::mem::forget(old);
        for handed in &table {
            arena.arena.give(leaked_at(handed.address));
        }
        let new = RamDisk::adopt(RamDisk::plain(sectors), 0, None, Some(heap), &table).unwrap();
        let mut after = vec![0; sectors as usize * 512];
        new.read_at(0, &mut after);
        assert!(before == after, "the same bytes");
        assert_eq!(new.resident_bytes(), 12 * STRIPE_BYTES as u64);
        assert_eq!(
            heap.promised(),
            20 * STRIPE_BYTES as u64,
            "wants the rest back"
        );
        // Writes into stripes it holds no memory for wait for `maintain`, then land.
        let mut queue = new.queue(8);
        let at = 10 * STRIPE_SECTORS;
        while write_page(&mut queue, 1, at, 0x77).is_err() {
            maintain_all(&new);
        }
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
        let mut page = [0; 4096];
        new.read_at(at as usize * 512, &mut page);
        assert!(page.iter().all(|&b| b == 0x77));
        drop(queue);
        drop(new);
        assert_eq!(heap.promised(), 0);
        assert_eq!(
            arena.dirty.load(Ordering::Relaxed),
            0,
            "all given back zeroed"
        );
    }

    /// The stripe at `address` of a disk the test forgot: what the next image's arena
    /// would hold (the test's memory is leaked, so it lives for ever).
    fn leaked_at(address: u64) -> &'static mut [u8] {
        #[allow(
            unsafe_code,
            reason = "stands in for the kernel's physical-memory layer"
        )]
        // SAFETY: the forgotten disk's stripe: leaked memory of STRIPE_BYTES that nothing
        // else refers to any more (the disk and its queues were forgotten or dropped).
        unsafe {
            core::slice::from_raw_parts_mut(address as usize as *mut u8, STRIPE_BYTES)
        }
    }

    #[test]
    fn bad_stripe_tables_are_refused() {
        let (heap, arena) = crate::heap::fake::budget(4 << 20, 1 << 30, 8);
        let s = STRIPE_BYTES as u64;
        let taken: Vec<u64> = (0..3)
            .map(|_| address_of(arena.arena.take().unwrap()))
            .collect();
        let free = {
            let unit = arena.arena.take().unwrap();
            let address = address_of(unit);
            arena.arena.give(unit);
            address
        };
        let plain = RamDisk::plain(4 * STRIPE_SECTORS);
        let adopt =
            |table: &[HandedStripe]| RamDisk::adopt(plain, 0, None, Some(heap), table).map(|_| ());
        assert_eq!(
            adopt(&[stripe(4, free)]),
            Err(AdoptError::Beyond {
                index: 4,
                stripes: 4
            })
        );
        assert_eq!(
            adopt(&[stripe(1, free), stripe(1, free + s)]),
            Err(AdoptError::Twice { index: 1 })
        );
        assert_eq!(
            adopt(&[stripe(0, free + 4096)]),
            Err(AdoptError::Misaligned {
                address: free + 4096
            })
        );
        assert_eq!(
            adopt(&[stripe(0, free), stripe(2, free)]),
            Err(AdoptError::Shared { address: free })
        );
        // Memory the arena hands out to someone else, or not its at all.
        assert_eq!(
            adopt(&[stripe(0, taken[1])]),
            Err(AdoptError::NotAdoptable { address: taken[1] })
        );
        assert_eq!(
            adopt(&[stripe(0, 1 << 40)]),
            Err(AdoptError::NotAdoptable { address: 1 << 40 })
        );
        // A refused table keeps nothing: the free stripe is still free.
        let before = arena.arena.free_bytes();
        assert!(adopt(&[stripe(0, free), stripe(1, taken[0])]).is_err());
        assert_eq!(arena.arena.free_bytes(), before);
        assert!(adopt(&[stripe(3, free)]).is_ok());
        // The table chunks come from the heap's room: none left, nothing adopted.
        crate::heap::fake::set_free(4 << 20);
        assert_eq!(
            adopt(&[stripe(3, free)]),
            Err(AdoptError::OutOfMemory(OutOfMemory {
                bytes: 4 * STRIPE_BYTES as u64
            }))
        );
        assert_eq!(arena.arena.free_bytes(), before);
    }
}
