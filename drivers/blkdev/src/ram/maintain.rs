// SPDX-License-Identifier: MIT OR Apache-2.0
//! The control path's care of a RAM disk's memory: freeing and spare stripes.

use core::sync::atomic::Ordering;

use super::discard::DISCARD_BYTES_PER_POLL;
use super::stripes::{stripe_memory, StripeMemory, SPARE_STRIPES, STRIPE_BYTES};
use super::RamDisk;

/// Work one [`RamDisk::maintain`] does at most, in bytes zeroed or scanned (as a
/// discard's poll): a guest that discards and rewrites stripes in a loop makes the
/// control path's vCPU do this much per call, whatever the disk's size.
const MAINTAIN_BUDGET: usize = DISCARD_BYTES_PER_POLL;
/// What looking at a noted stripe costs of it (a lock, a few stores): as marking one.
const VISIT_COST: usize = MAINTAIN_BUDGET / 256;
/// What reading one word of the note bitmap (64 stripes) costs of it.
const WORD_COST: usize = 64;

/// What one [`RamDisk::maintain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Bytes of memory given back to the stripe arena (the heap without a budget).
    pub freed: u64,
    /// Bytes allocated for the spare stripes (asked for by a write).
    pub allocated: u64,
    /// Stripes looked at.
    pub visited: u64,
    /// Work is left for another call (the signal, if the disk has one, was set).
    pub more: bool,
}

impl RamDisk {
    /// The control path's care of the disk, off the I/O path: frees the memory of
    /// stripes that read as zero (a discard covered them, or its partial pieces left
    /// them all zero) or lie beyond a shrunk end (up to `SPARE_STRIPES` of it kept spare
    /// for writes into such stripes), and when a write asked for memory, allocates spare
    /// stripes (fallibly, and with a heap budget only from its room: not the reserve, nor
    /// what other disks were promised; if none can be had, writes that need memory fail
    /// until some can). Memory it gives back stays promised to the disk in the budget.
    ///
    /// Only stripes a discard or a shrink noted are looked at, from where the last call
    /// stopped, and no more than a bounded amount of work per call: with work left,
    /// `more` is set (and the disk's signal, so whoever runs this comes back soon).
    pub fn maintain(&self) -> Maintenance {
        let store = &*self.store;
        let mut cursor = store.control.lock();
        let mut done = Maintenance::default();
        let mut budget = MAINTAIN_BUDGET;
        let stripes = store.noted.len() * 64;
        let capacity = store.capacity_bytes().div_ceil(STRIPE_BYTES);
        while budget > 0 && stripes > 0 && store.noted_count.load(Ordering::Acquire) > 0 {
            let at = *cursor % stripes;
            let word = store.noted[at / 64].load(Ordering::Acquire) & (!0u64 << (at % 64));
            if word == 0 {
                *cursor = (at / 64 + 1) * 64 % stripes;
                budget = budget.saturating_sub(WORD_COST);
                continue;
            }
            let index = at - at % 64 + word.trailing_zeros() as usize;
            *cursor = (index + 1) % stripes;
            if !store.take_note(index) {
                continue;
            }
            let Some(stripe) = store.stripe(index) else {
                continue;
            };
            done.visited += 1;
            let mut cost = VISIT_COST;
            let mut stripe = stripe.lock();
            if core::mem::take(&mut stripe.trimmed) {
                cost += STRIPE_BYTES;
                if stripe.first_data(0..STRIPE_BYTES).is_none() {
                    stripe.zero = true;
                }
            }
            if stripe.memory.is_some() && (stripe.zero || index >= capacity) {
                if let Some(memory) = stripe.memory.take() {
                    stripe.zero = false;
                    drop(stripe);
                    let freed = store.give_back(memory);
                    // Zeroed on its way back.
                    cost += freed as usize;
                    done.freed += freed;
                }
            }
            budget = budget.saturating_sub(cost);
        }
        // What was freed is promised to the disk before it takes any back.
        store.settle();
        if store.wants_memory.load(Ordering::Acquire) {
            // Allocated without the spare lock held (writers take it); never from what
            // other disks were promised.
            let room = store.stripes_to_take({
                let spare = store.spare.lock();
                spare.capacity() - spare.len()
            });
            let mut fresh: [Option<StripeMemory>; SPARE_STRIPES] = Default::default();
            for slot in fresh.iter_mut().take(room) {
                *slot = stripe_memory(store.frames);
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
            store.settle();
        }
        done.more = store.noted_count.load(Ordering::Acquire) > 0;
        if done.more {
            if let Some(signal) = store.signal {
                signal.store(true, Ordering::Release);
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::tests::{collect, discard_now, maintain_all, write_page, STRIPE_SECTORS};
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
        let done = maintain_all(&disk);
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
        assert_eq!(maintain_all(&disk).freed, STRIPE_BYTES as u64);
    }

    #[test]
    fn writes_into_freed_stripes_take_spare_memory_then_wait_for_more() {
        static SIGNAL: AtomicBool = AtomicBool::new(false);
        let stripes = 40;
        let disk = RamDisk::try_new(
            RamDisk::plain(stripes * STRIPE_SECTORS),
            0,
            Some(&SIGNAL),
            None,
        )
        .unwrap();
        let mut queue = disk.queue(32);
        discard_now(&mut queue, 0, stripes * STRIPE_SECTORS);
        maintain_all(&disk);
        // Set while maintenance had work left.
        SIGNAL.store(false, Ordering::Release);
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

    #[test]
    fn maintenance_looks_only_at_stripes_a_discard_touched() {
        // A large disk, one sector discarded: one stripe to look at, not the disk.
        let stripes = 1024;
        let disk = RamDisk::new(stripes * STRIPE_SECTORS);
        disk.write_at(0, &vec![0x66; stripes as usize * STRIPE_BYTES]);
        let mut queue = disk.queue(8);
        discard_now(&mut queue, 700 * STRIPE_SECTORS + 3, 1);
        let done = disk.maintain();
        assert_eq!((done.visited, done.freed, done.more), (1, 0, false));
        assert_eq!(disk.maintain(), Maintenance::default(), "nothing left");
        // Once its other sectors are gone too, the stripe is all zero: freed (spare).
        discard_now(&mut queue, 700 * STRIPE_SECTORS, 3);
        discard_now(&mut queue, 700 * STRIPE_SECTORS + 4, STRIPE_SECTORS - 4);
        let done = disk.maintain();
        assert_eq!((done.visited, done.more), (1, false));
        let mut stripe = vec![0xff; STRIPE_BYTES];
        disk.read_at(700 * STRIPE_BYTES, &mut stripe);
        assert!(stripe.iter().all(|&b| b == 0));
        disk.read_at(699 * STRIPE_BYTES, &mut stripe);
        assert!(stripe.iter().all(|&b| b == 0x66));
    }

    #[test]
    fn maintenance_is_a_bounded_piece_per_call_and_resumes() {
        static SIGNAL: AtomicBool = AtomicBool::new(false);
        let stripes = 256u64;
        let disk = RamDisk::try_new(
            RamDisk::plain(stripes * STRIPE_SECTORS),
            0,
            Some(&SIGNAL),
            None,
        )
        .unwrap();
        disk.write_at(0, &vec![0x66; stripes as usize * STRIPE_BYTES]);
        let mut queue = disk.queue(8);
        // The second half of every stripe discarded: each must be scanned (64 KiB),
        // and each still holds data.
        let half = STRIPE_SECTORS / 2;
        for n in 0..stripes {
            discard_now(&mut queue, n * STRIPE_SECTORS + half, half);
        }
        // 1 MiB of scanning per call: 16 stripes at most.
        let done = disk.maintain();
        assert_eq!((done.visited, done.freed, done.more), (16, 0, true));
        assert!(SIGNAL.swap(false, Ordering::AcqRel), "asks to be run again");
        // The first half of stripe 3, behind where the last call stopped: the stripe is
        // all zero now, and found when maintenance comes round again.
        discard_now(&mut queue, 3 * STRIPE_SECTORS, half);
        let mut calls = 1;
        let mut visited = done.visited;
        loop {
            let done = disk.maintain();
            calls += 1;
            assert!(done.visited <= 16, "{} stripes in one call", done.visited);
            visited += done.visited;
            if !done.more {
                break;
            }
        }
        assert_eq!(calls, 17, "257 visits, 16 a call");
        assert_eq!(visited, stripes + 1, "each once, stripe 3 twice");
        assert_eq!(
            disk.resident_bytes(),
            (stripes as usize * STRIPE_BYTES) as u64
        );
        let mut stripe = vec![0xff; STRIPE_BYTES];
        disk.read_at(3 * STRIPE_BYTES, &mut stripe);
        assert!(stripe.iter().all(|&b| b == 0));
        disk.read_at(4 * STRIPE_BYTES, &mut stripe);
        assert!(stripe[..STRIPE_BYTES / 2].iter().all(|&b| b == 0x66));
        assert_eq!(disk.maintain(), Maintenance::default(), "nothing left");
    }

    #[test]
    fn spare_stripes_are_taken_only_from_the_arenas_room() {
        use crate::ram::memory::StripeFrames;
        let stripes = 40;
        let (heap, arena) = crate::heap::fake::budget(4 << 20, 1 << 30, stripes as usize);
        let disk = RamDisk::try_new(
            RamDisk::plain(stripes * STRIPE_SECTORS),
            0,
            None,
            Some(heap),
        )
        .unwrap();
        let mut queue = disk.queue(32);
        discard_now(&mut queue, 0, stripes * STRIPE_SECTORS);
        maintain_all(&disk);
        for n in 0..SPARE_STRIPES as u64 {
            write_page(&mut queue, n as u32, n * STRIPE_SECTORS + 8, 0x33).unwrap();
        }
        collect(&mut queue);
        let next = sector_in(SPARE_STRIPES);
        assert_eq!(
            write_page(&mut queue, 20, next, 0x44),
            Err(SubmitError::QueueFull)
        );
        // 24 stripes went back to the arena; someone else holds 21 of them: three are
        // left to take.
        assert_eq!(arena.free_bytes(), 24 * STRIPE_BYTES as u64);
        let held: Vec<_> = (0..21).map(|_| arena.arena.take().unwrap()).collect();
        let done = disk.maintain();
        assert_eq!(done.allocated, 3 * STRIPE_BYTES as u64);
        write_page(&mut queue, 20, next, 0x44).unwrap();
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
        // None beyond it: the next writes into empty stripes after the last spare one
        // fail rather than wait for memory that cannot come.
        for n in 1..3 {
            write_page(&mut queue, 20, sector_in(SPARE_STRIPES + n), 0x44).unwrap();
        }
        assert_eq!(
            write_page(&mut queue, 21, sector_in(SPARE_STRIPES + 3), 0x44),
            Err(SubmitError::QueueFull)
        );
        assert_eq!(disk.maintain().allocated, 0);
        write_page(&mut queue, 21, sector_in(SPARE_STRIPES + 3), 0x44).unwrap();
        assert_eq!(collect(&mut queue)[2].status, IoStatus::Error);
        for stripe in held {
            stripe.fill(0);
            arena.arena.give(stripe);
        }
    }

    /// The second page of stripe `stripe`.
    fn sector_in(stripe: usize) -> u64 {
        stripe as u64 * STRIPE_SECTORS + 8
    }
}
