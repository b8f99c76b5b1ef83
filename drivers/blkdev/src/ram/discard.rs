// SPDX-License-Identifier: MIT OR Apache-2.0
//! Discards, carried out by a queue a bounded piece per poll.

use core::ops::Range;

use super::stripes::{Stripe, STRIPE_BYTES};
use super::RamDiskQueue;
use crate::{Completion, IoStatus};

/// Bytes of discards a queue zeroes per `poll_completions`, at most. Zeroing 1 MiB costs
/// about what copying the largest read or write (2 MiB) does, so a discard delays the
/// other rings of its poller no more than one large request does, and far less than the
/// 1 ms a poller with requests on its device may sleep. Smaller pieces would only add polls, larger
/// ones lengthen the stall.
pub const DISCARD_BYTES_PER_POLL: usize = 1 << 20;
/// What marking one whole stripe zero costs of that budget: a lock and a store, far less
/// than zeroing it, so 256 stripes (16 MiB of disk) per poll; a whole 4 GiB disk is
/// discarded in 256 polls.
const MARK_COST: usize = DISCARD_BYTES_PER_POLL / 256;

/// A discard accepted and not yet carried out to its end: bytes `[next, end)` of the
/// store.
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingDiscard {
    pub(super) tag: u32,
    pub(super) next: usize,
    pub(super) end: usize,
    pub(super) secure: bool,
}

impl RamDiskQueue {
    /// Works through the pending discards, at most [`DISCARD_BYTES_PER_POLL`] zeroed (a
    /// whole stripe marked costs [`MARK_COST`]), and queues the completion of each one
    /// finished.
    pub(super) fn advance_discards(&mut self) {
        let store = &*self.disk.store;
        let mut budget = DISCARD_BYTES_PER_POLL;
        let capacity = store.capacity_bytes();
        while budget > 0 {
            let Some(discard) = self.discards.front_mut() else {
                break;
            };
            let at = discard.next;
            let within = at % STRIPE_BYTES;
            let take = (STRIPE_BYTES - within).min(discard.end - at);
            let whole = within == 0 && (take == STRIPE_BYTES || at + take >= capacity);
            let secure = discard.secure;
            let mut marked = false;
            let _ = store.visit(at, take, |stripe, range, _| {
                marked = stripe.discard(range, whole, secure);
                Ok(())
            });
            if marked || !whole {
                store.note(at / STRIPE_BYTES);
            }
            discard.next += take;
            let cost = if whole && !secure { MARK_COST } else { take };
            budget = budget.saturating_sub(cost);
            if discard.next == discard.end {
                let tag = discard.tag;
                self.discards.pop_front();
                // Cannot fail: submit kept a place for it.
                let _ = self.completions.push(Completion {
                    tag,
                    status: IoStatus::Ok,
                });
            }
        }
    }
}

impl Stripe {
    /// Discards `range`: the whole stripe (`whole`) is marked zero, a part is zeroed (a
    /// secure discard zeroes the whole stripe's bytes too: none of the old data stays in
    /// memory). True if the stripe now has memory to give back.
    pub(super) fn discard(&mut self, range: Range<usize>, whole: bool, secure: bool) -> bool {
        if self.zero || self.memory.is_none() {
            return false;
        }
        if let Some(memory) = self.memory.as_deref_mut() {
            if !whole || secure {
                memory[range].fill(0);
            }
        }
        if whole {
            self.zero = true;
            return true;
        }
        self.trimmed = true;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::tests::{collect, Pages, STRIPE_SECTORS};
    use crate::ram::RamDisk;
    use crate::{BlockDevice, DmaSegment, Geometry, IoOp, IoRequest, SubmitError};

    /// Zero bytes on the whole disk.
    fn zero_bytes(disk: &RamDisk) -> usize {
        let mut bytes = vec![0; disk.geometry().sectors as usize * 512];
        disk.read_at(0, &mut bytes);
        bytes.iter().filter(|&&b| b == 0).count()
    }

    #[test]
    fn a_whole_disk_discard_is_carried_out_a_bounded_piece_per_poll() {
        // 768 stripes and one page: 256 whole stripes marked per poll, so 4 polls.
        let bytes = 768 * STRIPE_BYTES + 4096;
        let disk = RamDisk::new((bytes / 512) as u64);
        disk.write_at(0, &vec![0xA5; bytes]);
        let (mut first, mut second) = (disk.queue(4), disk.queue(4));
        let pages = Pages::default();
        let discard = IoRequest {
            tag: 1,
            op: IoOp::Discard { secure: false },
            sector: 0,
            nr_sectors: (bytes / 512) as u64,
            preflush: false,
            segments: &[],
        };
        first.submit(&discard, &pages).unwrap();
        assert_eq!(zero_bytes(&disk), 0, "submit discards nothing");
        let mut polls = 0;
        let mut zeroed = 0;
        loop {
            let completions = collect(&mut first);
            polls += 1;
            let now = zero_bytes(&disk);
            assert!(
                now > zeroed && now - zeroed <= 256 * STRIPE_BYTES,
                "poll {polls} discarded {} bytes",
                now - zeroed
            );
            zeroed = now;
            if polls == 1 {
                // A read on another queue of the disk, submitted meanwhile, completes
                // while the discard is still going.
                pages.0.borrow_mut().insert(9, vec![0; 4096]);
                let segments = [DmaSegment {
                    buffer: 9,
                    offset: 0,
                    len: 4096,
                }];
                let read = IoRequest {
                    tag: 2,
                    op: IoOp::Read,
                    sector: (bytes / 512 - 8) as u64,
                    nr_sectors: 8,
                    preflush: false,
                    segments: &segments,
                };
                second.submit(&read, &pages).unwrap();
                assert_eq!(
                    collect(&mut second),
                    [Completion {
                        tag: 2,
                        status: IoStatus::Ok
                    }]
                );
                assert!(completions.is_empty(), "the discard is not done yet");
                assert_eq!(pages.0.borrow()[&9], vec![0xA5; 4096]);
            }
            if !completions.is_empty() {
                assert_eq!(
                    completions,
                    [Completion {
                        tag: 1,
                        status: IoStatus::Ok
                    }]
                );
                break;
            }
        }
        assert_eq!(polls, 4);
        assert_eq!(zeroed, bytes);
    }

    #[test]
    fn partial_discards_are_zeroed_within_the_byte_budget() {
        // Pieces of stripes: each costs what it zeroes, 1 MiB per poll at most.
        let disk = RamDisk::new((64 * STRIPE_BYTES / 512) as u64);
        disk.write_at(0, &vec![0x5A; 64 * STRIPE_BYTES]);
        let mut queue = disk.queue(64);
        let pages = Pages::default();
        // 40 discards of 60 KiB, each inside one stripe (4 KiB in).
        for n in 0..40u64 {
            let discard = IoRequest {
                tag: n as u32,
                op: IoOp::Discard { secure: false },
                sector: n * (STRIPE_BYTES as u64 / 512) + 8,
                nr_sectors: 120,
                preflush: false,
                segments: &[],
            };
            queue.submit(&discard, &pages).unwrap();
        }
        let mut finished = 0;
        let mut polls = 0;
        while finished < 40 {
            finished += collect(&mut queue).len();
            polls += 1;
        }
        // 40 x 60 KiB = 2.3 MiB: three polls.
        assert_eq!(polls, 3);
        assert_eq!(zero_bytes(&disk), 40 * 60 * 1024);
    }

    impl RamDisk {
        /// What stripe `index`'s memory holds, whatever the stripe reads as.
        fn raw_stripe(&self, index: usize) -> Option<Vec<u8>> {
            let stripe = self.store.stripe(index)?.lock();
            stripe.memory.as_deref().map(<[u8]>::to_vec)
        }
    }

    #[test]
    fn a_secure_discard_leaves_none_of_the_data_in_memory() {
        let disk = RamDisk::new(8 * STRIPE_SECTORS);
        disk.write_at(0, &vec![0x77; 8 * STRIPE_BYTES]);
        let mut queue = disk.queue(4);
        let discard = |sector, secure| IoRequest {
            tag: 1,
            op: IoOp::Discard { secure },
            sector,
            nr_sectors: STRIPE_SECTORS,
            preflush: false,
            segments: &[],
        };
        queue
            .submit(&discard(3 * STRIPE_SECTORS, true), &Pages::default())
            .unwrap();
        queue
            .submit(&discard(4 * STRIPE_SECTORS, false), &Pages::default())
            .unwrap();
        while collect(&mut queue).len() < 2 {}
        let mut bytes = vec![0xff; 2 * STRIPE_BYTES];
        disk.read_at(3 * STRIPE_BYTES, &mut bytes);
        assert!(bytes.iter().all(|&b| b == 0), "both read as zeroes");
        assert!(
            disk.raw_stripe(3).unwrap().iter().all(|&b| b == 0),
            "secure: wiped"
        );
        assert!(
            disk.raw_stripe(4).unwrap().iter().all(|&b| b == 0x77),
            "plain: only marked (freed by maintain)"
        );
    }

    #[test]
    fn pending_discards_hold_their_place_in_the_queue() {
        // Each discard is 256 whole stripes and one sector: more than one poll does.
        let disk = RamDisk::new(4 * 256 * STRIPE_SECTORS);
        let mut queue = disk.queue(2);
        let pages = Pages::default();
        let discard = |tag, sector| IoRequest {
            tag,
            op: IoOp::Discard { secure: false },
            sector,
            nr_sectors: 256 * STRIPE_SECTORS + 1,
            preflush: false,
            segments: &[],
        };
        queue.submit(&discard(1, 0), &pages).unwrap();
        let second = 2 * 256 * STRIPE_SECTORS;
        queue.submit(&discard(2, second), &pages).unwrap();
        assert_eq!(
            queue.submit(&flush_at(3), &pages),
            Err(SubmitError::QueueFull)
        );
        // One piece per poll across both, oldest first.
        assert!(collect(&mut queue).is_empty());
        let tags = |c: Vec<Completion>| c.iter().map(|c| c.tag).collect::<Vec<_>>();
        assert_eq!(tags(collect(&mut queue)), [1]);
        // The place discard 1 held is free again; the flush finishes at once.
        queue.submit(&flush_at(3), &pages).unwrap();
        assert_eq!(tags(collect(&mut queue)), [3, 2]);
        // Unsupported and empty discards answer at once.
        let plain = RamDisk::with_geometry(Geometry {
            discard: None,
            ..disk.geometry()
        });
        let mut queue = plain.queue(2);
        queue.submit(&discard(4, 0), &pages).unwrap();
        let statuses: Vec<_> = collect(&mut queue).iter().map(|c| c.status).collect();
        assert_eq!(statuses, [IoStatus::Unsupported]);
        let mut queue = disk.queue(2);
        let empty = IoRequest {
            nr_sectors: 0,
            ..discard(5, 0)
        };
        queue.submit(&empty, &pages).unwrap();
        let statuses: Vec<_> = collect(&mut queue).iter().map(|c| c.status).collect();
        assert_eq!(statuses, [IoStatus::Ok]);
    }

    fn flush_at(tag: u32) -> IoRequest<'static> {
        IoRequest {
            tag,
            op: IoOp::Flush,
            sector: 0,
            nr_sectors: 0,
            preflush: false,
            segments: &[],
        }
    }
}
