//! The control path's care of a RAM disk's memory: freeing and spare stripes.

use alloc::boxed::Box;
use core::sync::atomic::Ordering;
use spin::Once;

use super::stripes::{stripe_memory, SPARE_STRIPES, STRIPE_BYTES};
use super::RamDisk;

/// What one [`RamDisk::maintain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Bytes of memory given back to the heap.
    pub freed: u64,
    /// Bytes allocated for the spare stripes (asked for by a write).
    pub allocated: u64,
}

impl RamDisk {
    /// The control path's care of the disk, off the I/O path: frees the memory of
    /// stripes that read as zero (a discard covered them, or its partial pieces left
    /// them all zero) or lie beyond a shrunk end (up to `SPARE_STRIPES` of it kept spare
    /// for writes into such stripes), and when a write asked for memory, allocates spare
    /// stripes (fallibly; if none can be had, writes that need memory fail until some can).
    pub fn maintain(&self) -> Maintenance {
        let store = &*self.store;
        let _one = store.control.lock();
        let mut done = Maintenance::default();
        if store.dirty.swap(false, Ordering::AcqRel) {
            let capacity = store.capacity_bytes().div_ceil(STRIPE_BYTES);
            let chunks = store.chunks.iter().map_while(Once::get);
            for (index, stripe) in chunks.flat_map(|chunk| chunk.iter()).enumerate() {
                let mut stripe = stripe.lock();
                if core::mem::take(&mut stripe.trimmed)
                    && stripe.first_data(0..STRIPE_BYTES).is_none()
                {
                    stripe.zero = true;
                }
                if stripe.memory.is_some() && (stripe.zero || index >= capacity) {
                    if let Some(memory) = stripe.memory.take() {
                        stripe.zero = false;
                        drop(stripe);
                        done.freed += store.give_back(memory);
                    }
                }
            }
        }
        if store.wants_memory.load(Ordering::Acquire) {
            // Allocated without the spare lock held (writers take it).
            let room = {
                let spare = store.spare.lock();
                spare.capacity() - spare.len()
            };
            let mut fresh: [Option<Box<[u8]>>; SPARE_STRIPES] = Default::default();
            for slot in fresh.iter_mut().take(room) {
                *slot = stripe_memory();
                if slot.is_none() {
                    break;
                }
            }
            let mut spare = store.spare.lock();
            for memory in fresh.into_iter().flatten() {
                // Writers only take, and this runs one at a time: the room is there.
                if spare.len() < spare.capacity() {
                    spare.push(memory);
                    done.allocated += STRIPE_BYTES as u64;
                }
            }
            store.resident.fetch_add(done.allocated, Ordering::Relaxed);
            store
                .out_of_memory
                .store(spare.is_empty(), Ordering::Release);
            store.wants_memory.store(false, Ordering::Release);
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::tests::{collect, discard_now, write_page, STRIPE_SECTORS};
    use crate::{IoStatus, SubmitError};
    use core::sync::atomic::AtomicBool;

    #[test]
    fn discarded_stripes_read_as_zeroes_and_give_their_memory_back() {
        let stripes = 64;
        let disk = RamDisk::new(stripes * STRIPE_SECTORS);
        let full = stripes * STRIPE_BYTES as u64;
        assert_eq!((disk.resident_bytes(), disk.freed_bytes()), (full, 0));
        disk.write_at(0, &vec![0x77; full as usize]);
        let mut queue = disk.queue(8);
        // 40 whole stripes and half a stripe on each side: stripes 2..=41 whole.
        discard_now(&mut queue, STRIPE_SECTORS * 3 / 2, 41 * STRIPE_SECTORS);
        let mut bytes = vec![0; full as usize];
        disk.read_at(0, &mut bytes);
        let zero_from = STRIPE_BYTES * 3 / 2;
        let zero_to = zero_from + 41 * STRIPE_BYTES;
        assert!(bytes[..zero_from].iter().all(|&b| b == 0x77));
        assert!(bytes[zero_from..zero_to].iter().all(|&b| b == 0));
        assert!(bytes[zero_to..].iter().all(|&b| b == 0x77));
        // Nothing is freed on the I/O path.
        assert_eq!(disk.resident_bytes(), full);
        let done = disk.maintain();
        // 40 stripes: 16 kept spare, 24 back to the heap.
        assert_eq!(done.freed, 24 * STRIPE_BYTES as u64);
        assert_eq!(disk.freed_bytes(), done.freed);
        assert_eq!(disk.resident_bytes(), full - done.freed);
        assert_eq!(
            disk.maintain(),
            Maintenance::default(),
            "nothing left to do"
        );
        // Still zeroes, and the data around them intact.
        disk.read_at(0, &mut bytes);
        assert!(bytes[zero_from..zero_to].iter().all(|&b| b == 0));
        assert!(bytes[zero_to..].iter().all(|&b| b == 0x77));

        // Two halves discarded apart leave stripe 50 all zero: its memory goes too.
        discard_now(&mut queue, 50 * STRIPE_SECTORS, STRIPE_SECTORS / 2);
        discard_now(
            &mut queue,
            50 * STRIPE_SECTORS + STRIPE_SECTORS / 2,
            STRIPE_SECTORS / 2,
        );
        assert_eq!(disk.maintain().freed, STRIPE_BYTES as u64);
    }

    #[test]
    fn writes_into_freed_stripes_take_spare_memory_then_wait_for_more() {
        static SIGNAL: AtomicBool = AtomicBool::new(false);
        let stripes = 40;
        let disk =
            RamDisk::try_new(RamDisk::plain(stripes * STRIPE_SECTORS), 0, Some(&SIGNAL)).unwrap();
        let mut queue = disk.queue(32);
        discard_now(&mut queue, 0, stripes * STRIPE_SECTORS);
        disk.maintain();
        assert_eq!(
            disk.resident_bytes(),
            (SPARE_STRIPES * STRIPE_BYTES) as u64,
            "only the spare stripes stay"
        );
        // One write into each of the first 16 stripes: each takes a spare stripe.
        for n in 0..SPARE_STRIPES as u64 {
            write_page(&mut queue, n as u32, n * STRIPE_SECTORS + 8, 0x33).unwrap();
        }
        assert_eq!(collect(&mut queue).len(), SPARE_STRIPES);
        assert!(!disk.wants_memory() && !SIGNAL.load(Ordering::Acquire));
        // The 17th waits: the engine gets QueueFull and retries; the disk asks.
        let next = sector_in(SPARE_STRIPES);
        assert_eq!(
            write_page(&mut queue, 20, next, 0x44),
            Err(SubmitError::QueueFull)
        );
        assert!(disk.wants_memory() && SIGNAL.load(Ordering::Acquire));
        let done = disk.maintain();
        assert_eq!(done.allocated, (SPARE_STRIPES * STRIPE_BYTES) as u64);
        assert!(!disk.wants_memory());
        write_page(&mut queue, 20, next, 0x44).unwrap();
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
        // Each written stripe holds its page and zeroes around it (the spare memory
        // came from stripes that held 0x00.. and was zeroed on use).
        let mut stripe = vec![0xff; STRIPE_BYTES];
        disk.read_at(0, &mut stripe);
        assert!(stripe[..4096].iter().all(|&b| b == 0));
        assert!(stripe[4096..8192].iter().all(|&b| b == 0x33));
        assert!(stripe[8192..].iter().all(|&b| b == 0));
        disk.read_at(SPARE_STRIPES * STRIPE_BYTES, &mut stripe);
        assert!(stripe[4096..8192].iter().all(|&b| b == 0x44));
        assert!(stripe[8192..].iter().all(|&b| b == 0));
    }

    /// The second page of stripe `stripe`.
    fn sector_in(stripe: usize) -> u64 {
        stripe as u64 * STRIPE_SECTORS + 8
    }
}
