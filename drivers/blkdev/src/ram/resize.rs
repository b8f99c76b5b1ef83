// SPDX-License-Identifier: MIT OR Apache-2.0
//! Growing and shrinking a RAM disk while its queues serve it.

use core::ops::Range;
use core::sync::atomic::Ordering;

use super::stripes::{chunk, stripe_memory, LockedStripe, Stop, CHUNK_STRIPES, STRIPE_BYTES};
use super::RamDisk;
use crate::SECTOR_SIZE;

/// Why a RAM disk keeps its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeError {
    /// No sectors.
    Empty,
    /// Beyond what the disk was made able to grow to.
    TooLarge { max_sectors: u64 },
    /// The memory for the new part could not be had (`bytes` more were needed).
    OutOfMemory { bytes: u64 },
    /// A byte at or beyond the new end holds data (is not zero): the first such sector.
    InUse { sector: u64 },
}

impl core::fmt::Display for ResizeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ResizeError::Empty => f.write_str("a RAM disk of no sectors"),
            ResizeError::TooLarge { max_sectors } => write!(
                f,
                "a RAM disk here grows to {max_sectors} sectors ({} MiB) at most",
                max_sectors >> 11
            ),
            ResizeError::OutOfMemory { bytes } => {
                write!(f, "not enough memory: {bytes} more bytes are needed")
            }
            ResizeError::InUse { sector } => write!(
                f,
                "sector {sector} holds data (a byte that is not zero) beyond the new end; \
                 discard or zero what lies beyond it first"
            ),
        }
    }
}

impl core::error::Error for ResizeError {}

impl RamDisk {
    /// Grows or shrinks the disk to `sectors` while queues serve it (the control path's;
    /// one resize or maintenance at a time). Growing backs the new part with zeroed
    /// memory first (allocated fallibly) and only then publishes the capacity. Shrinking
    /// is refused while any byte at or beyond the new end is not zero ("in use"): data
    /// there would be lost. A guest writing beyond the new end while the disk shrinks
    /// loses those writes, as with any disk cut short under it.
    pub fn resize(&self, sectors: u64) -> Result<(), ResizeError> {
        let _one = self.store.control.lock();
        let old = self.sectors();
        if sectors == 0 {
            return Err(ResizeError::Empty);
        }
        if sectors > self.store.max_sectors {
            return Err(ResizeError::TooLarge {
                max_sectors: self.store.max_sectors,
            });
        }
        if sectors > old {
            let grown = self.grow(old, sectors);
            self.store.settle();
            return grown;
        }
        if sectors < old {
            let data = |disk: &RamDisk| {
                disk.first_data(sectors, old)
                    .map(|sector| ResizeError::InUse { sector })
            };
            if let Some(refusal) = data(self) {
                return Err(refusal);
            }
            self.store.sectors.store(sectors, Ordering::Release);
            // A write that passed the old capacity just before: look once more.
            if let Some(refusal) = data(self) {
                self.store.sectors.store(old, Ordering::Release);
                return Err(refusal);
            }
            // Memory beyond the new end goes back at the next maintenance.
            for index in Self::stripes_between(sectors, old) {
                self.store.note(index);
            }
            // What lies beyond the new end is not wanted again.
            self.store.settle();
        }
        Ok(())
    }

    /// Bytes of memory growing to `new` sectors would allocate now (stripes without
    /// memory on the way, and table chunks not made yet); 0 for no growth.
    pub fn memory_to_grow(&self, new: u64) -> u64 {
        let (stripes, tables) = self.memory_to_grow_apart(new);
        stripes + tables
    }

    /// [`RamDisk::memory_to_grow`] apart: stripes (from the arena) and table chunks
    /// (from the heap).
    pub(super) fn memory_to_grow_apart(&self, new: u64) -> (u64, u64) {
        let old = self.sectors();
        if new <= old || new > self.store.max_sectors {
            return (0, 0);
        }
        let stripes = Self::stripes_between(old, new);
        let table = (CHUNK_STRIPES * core::mem::size_of::<LockedStripe>()) as u64;
        let (mut memory, mut tables) = (0, 0);
        for index in stripes.clone() {
            match self.store.chunks[index / CHUNK_STRIPES].get() {
                Some(chunk) if chunk[index % CHUNK_STRIPES].lock().memory.is_some() => {}
                Some(_) => memory += STRIPE_BYTES as u64,
                None if index.is_multiple_of(CHUNK_STRIPES) || index == stripes.start => {
                    memory += STRIPE_BYTES as u64;
                    tables += table;
                }
                None => memory += STRIPE_BYTES as u64,
            }
        }
        (memory, tables)
    }

    /// The stripes holding sectors `[old, new)`.
    fn stripes_between(old: u64, new: u64) -> Range<usize> {
        let first = (old * SECTOR_SIZE) as usize / STRIPE_BYTES;
        let end = ((new * SECTOR_SIZE) as usize).div_ceil(STRIPE_BYTES);
        first..end
    }

    /// Backs sectors `[old, new)` with zeroed memory, then publishes `new` (`old` is
    /// the capacity now). With a budget, refused unless all of it fits: the stripes the
    /// arena's room (not what RAM disks were promised, this one's too: a growth is new
    /// memory, not memory the disk gave back), the table chunks the heap's.
    pub(super) fn grow(&self, old: u64, new: u64) -> Result<(), ResizeError> {
        let store = &*self.store;
        if let Some(heap) = store.heap {
            let (stripes, tables) = self.memory_to_grow_apart(new);
            let out_of_memory = |_| ResizeError::OutOfMemory {
                bytes: stripes + tables,
            };
            heap.fits_stripes(stripes).map_err(out_of_memory)?;
            heap.fits(tables).map_err(out_of_memory)?;
        }
        let old_bytes = (old * SECTOR_SIZE) as usize;
        let new_bytes = (new * SECTOR_SIZE) as usize;
        let stripes = Self::stripes_between(old, new);
        for index in stripes.clone() {
            let out_of_memory = || ResizeError::OutOfMemory {
                bytes: ((stripes.end - index) * STRIPE_BYTES) as u64,
            };
            let chunk = store.chunks[index / CHUNK_STRIPES]
                .try_call_once(|| chunk().ok_or(()))
                .map_err(|()| out_of_memory())?;
            let mut stripe = chunk[index % CHUNK_STRIPES].lock();
            let zero = stripe.zero;
            match stripe.memory.as_deref_mut() {
                None => {
                    stripe.memory = Some(stripe_memory(store.frames).ok_or_else(out_of_memory)?);
                    store
                        .resident
                        .fetch_add(STRIPE_BYTES as u64, Ordering::Relaxed);
                }
                Some(memory) if zero => memory.fill(0),
                // Memory kept from before a shrink: what lies beyond the old end goes.
                Some(memory) => {
                    let start = index * STRIPE_BYTES;
                    memory[old_bytes.max(start) - start..].fill(0);
                }
            }
            stripe.zero = false;
            stripe.trimmed = false;
        }
        debug_assert!(new_bytes <= stripes.end * STRIPE_BYTES);
        store.sectors.store(new, Ordering::Release);
        Ok(())
    }

    /// The first sector in `[from, to)` holding a byte that is not zero.
    fn first_data(&self, from: u64, to: u64) -> Option<u64> {
        let (from, to) = ((from * SECTOR_SIZE) as usize, (to * SECTOR_SIZE) as usize);
        let mut found = None;
        let _ = self.store.visit(from, to - from, |stripe, range, done| {
            let start = range.start;
            match stripe.first_data(range) {
                Some(at) => {
                    found = Some(((from + done + at - start) as u64) / SECTOR_SIZE);
                    Err(Stop::Buffer)
                }
                None => Ok(()),
            }
        });
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::tests::{collect, discard_now, maintain_all, write_page, STRIPE_SECTORS};
    use crate::{BlockDevice, IoStatus, SubmitError};

    #[test]
    fn a_disk_grows_under_its_queues_and_the_new_part_reads_zero() {
        let disk = RamDisk::try_new(
            RamDisk::plain(16 * STRIPE_SECTORS),
            300 * STRIPE_SECTORS,
            None,
            None,
        )
        .unwrap();
        let mut queue = disk.queue(8);
        let end = 8 * STRIPE_SECTORS;
        disk.resize(end).unwrap();
        assert_eq!(write_page(&mut queue, 1, end, 1), Err(SubmitError::Invalid));
        // Bytes beyond the end, still backed (a write racing the shrink could leave them)
        // must not show when the disk grows again.
        disk.write_at((end * 512) as usize + 4096, &[0x99; 4096]);
        maintain_all(&disk);
        disk.write_at((end * 512) as usize + 4096, &[0x99; 4096]);
        assert_eq!(disk.memory_to_grow(end), 0);
        // Stripe 8 holds the stale page, 291 more need memory, and a table chunk.
        let needed = disk.memory_to_grow(300 * STRIPE_SECTORS);
        let stripes = 291 * STRIPE_BYTES as u64;
        let table = (CHUNK_STRIPES * core::mem::size_of::<LockedStripe>()) as u64;
        assert_eq!(table, 16384, "a line per stripe");
        assert_eq!(needed, stripes + table, "{needed}");
        disk.resize(300 * STRIPE_SECTORS).unwrap();
        assert_eq!(queue.geometry().sectors, 300 * STRIPE_SECTORS);
        // 300 stripes, and 7 spare (the shrink's 8 kept, one taken by the stale page).
        assert_eq!(disk.resident_bytes(), 307 * STRIPE_BYTES as u64);
        let mut grown = vec![0xff; 292 * STRIPE_BYTES];
        disk.read_at((end * 512) as usize, &mut grown);
        assert!(grown.iter().all(|&b| b == 0));
        // The queue made before writes there now, and its neighbour's data is intact.
        write_page(&mut queue, 2, 299 * STRIPE_SECTORS, 2).unwrap();
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
        assert_eq!(
            disk.resize(301 * STRIPE_SECTORS),
            Err(ResizeError::TooLarge {
                max_sectors: 300 * STRIPE_SECTORS
            })
        );
        assert_eq!(disk.resize(0), Err(ResizeError::Empty));
    }

    #[test]
    fn a_disk_shrinks_only_over_bytes_that_are_zero() {
        let disk = RamDisk::new(64 * STRIPE_SECTORS);
        let mut queue = disk.queue(8);
        let data = 40 * STRIPE_SECTORS + 16;
        write_page(&mut queue, 1, data, 7).unwrap();
        collect(&mut queue);
        // Data at `data`: shrinking to or below it is refused, naming it.
        let refused = disk.resize(32 * STRIPE_SECTORS).unwrap_err();
        assert_eq!(refused, ResizeError::InUse { sector: data });
        assert!(refused.to_string().contains("holds data"), "{refused}");
        assert_eq!(disk.sectors(), 64 * STRIPE_SECTORS, "unchanged");
        assert_eq!(
            disk.resize(data + 7),
            Err(ResizeError::InUse { sector: data + 7 })
        );
        // Just past the data: allowed; beyond the new end is refused from then on.
        disk.resize(data + 8).unwrap();
        assert_eq!(queue.geometry().sectors, data + 8);
        assert_eq!(
            write_page(&mut queue, 2, data + 8, 1),
            Err(SubmitError::Invalid)
        );
        // Once discarded, the data is not in use: the disk shrinks, memory goes back.
        discard_now(&mut queue, data, 8);
        disk.resize(16 * STRIPE_SECTORS).unwrap();
        assert_eq!(disk.resident_bytes(), 64 * STRIPE_BYTES as u64);
        let done = maintain_all(&disk);
        // 48 stripes beyond the end: 16 kept spare, 32 freed.
        assert_eq!(done.freed, 32 * STRIPE_BYTES as u64);
        assert_eq!(disk.resident_bytes(), 32 * STRIPE_BYTES as u64);
        // Grown again: zeroes where the data was, backed by memory again.
        disk.resize(64 * STRIPE_SECTORS).unwrap();
        assert_eq!(
            disk.resident_bytes(),
            64 * STRIPE_BYTES as u64 + 16 * STRIPE_BYTES as u64
        );
        let mut page = vec![0xff; 4096];
        disk.read_at(data as usize * 512, &mut page);
        assert!(page.iter().all(|&b| b == 0));
    }
}
