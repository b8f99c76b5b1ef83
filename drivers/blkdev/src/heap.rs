// SPDX-License-Identifier: MIT OR Apache-2.0
//! The memory disks and rings may use: the heap and the RAM disks' stripe arena.
//!
//! The control path allocates as any Rust program does (xenstore paths and replies, the
//! vectors and maps of its vbds), and such an allocation that fails aborts the domain.
//! Bulk memory on the heap (a ring's engine, a device's queues and bounce pages, a RAM
//! disk's stripe table) is taken fallibly and only from [`HeapBudget::room`]: the free
//! heap less a fixed reserve no disk or ring may take. A RAM disk's stripes live apart,
//! in the arena ([`crate::StripeFrames`]: a live upgrade hands them over by address),
//! and are taken only from [`HeapBudget::stripe_room`]: the arena's free memory less
//! what RAM disks gave back (discarded stripes) and will want again when their guest
//! writes there. So no disk or ring can leave the control path short, and no new disk
//! takes the memory a RAM disk was given when it was made.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::ram::StripeFrames;

/// The heap's budget for disks and rings (one for the domain).
#[derive(Debug)]
pub struct HeapBudget {
    /// Bytes kept for the control path.
    reserve: u64,
    /// The heap's free bytes now.
    free: fn() -> usize,
    /// Bytes RAM disks gave back and will want again (each disk's share is kept
    /// up to date by the disk itself: made, maintained, resized, dropped).
    promised: AtomicU64,
    /// Where RAM disks' stripes come from.
    stripes: &'static dyn StripeFrames,
}

/// `needed` bytes are more than a disk or ring may take (`room`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoRoom {
    pub needed: u64,
    pub room: u64,
}

impl core::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} bytes needed, {} bytes of memory free for disks and rings",
            self.needed, self.room
        )
    }
}

impl core::error::Error for NoRoom {}

impl HeapBudget {
    /// A budget keeping `reserve` bytes of a heap whose free bytes `free` tells, with
    /// RAM disks' stripes from `stripes`.
    pub const fn new(
        reserve: u64,
        free: fn() -> usize,
        stripes: &'static dyn StripeFrames,
    ) -> Self {
        HeapBudget {
            reserve,
            free,
            promised: AtomicU64::new(0),
            stripes,
        }
    }

    /// Where RAM disks' stripes come from.
    pub fn stripes(&self) -> &'static dyn StripeFrames {
        self.stripes
    }

    /// Bytes kept for the control path.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Bytes RAM disks gave back and will want again.
    pub fn promised(&self) -> u64 {
        self.promised.load(Ordering::Acquire)
    }

    /// Heap a new disk or ring may take now: the free heap less the reserve.
    pub fn room(&self) -> u64 {
        ((self.free)() as u64).saturating_sub(self.reserve)
    }

    /// Stripe memory a new RAM disk (or one growing) may take now: the arena's free
    /// memory less what RAM disks were promised.
    pub fn stripe_room(&self) -> u64 {
        self.room_besides(0)
    }

    /// `needed` bytes of stripes fit [`HeapBudget::stripe_room`].
    pub fn fits_stripes(&self, needed: u64) -> Result<(), NoRoom> {
        let room = self.stripe_room();
        if needed > room {
            return Err(NoRoom { needed, room });
        }
        Ok(())
    }

    /// `needed` bytes fit [`HeapBudget::room`].
    pub fn fits(&self, needed: u64) -> Result<(), NoRoom> {
        let room = self.room();
        if needed > room {
            return Err(NoRoom { needed, room });
        }
        Ok(())
    }

    /// The stripe room of a RAM disk taking back the memory it was promised (`own`,
    /// part of [`HeapBudget::promised`]): other disks' promises stay out of it, its own
    /// does not.
    pub(crate) fn room_besides(&self, own: u64) -> u64 {
        let others = self.promised().saturating_sub(own);
        self.stripes.free_bytes().saturating_sub(others)
    }

    /// A disk that was promised `before` bytes is promised `now`.
    pub(crate) fn repromise(&self, before: u64, now: u64) {
        if now > before {
            self.promised.fetch_add(now - before, Ordering::AcqRel);
        } else if before > now {
            self.promised.fetch_sub(before - now, Ordering::AcqRel);
        }
    }
}

/// A heap for tests: its free bytes are whatever the test's thread last set.
#[cfg(test)]
pub(crate) mod fake {
    use super::HeapBudget;
    use std::cell::Cell;

    thread_local! {
        static FREE: Cell<usize> = const { Cell::new(0) };
    }

    fn free() -> usize {
        FREE.with(Cell::get)
    }

    /// The free heap this thread's budgets see from now on.
    pub(crate) fn set_free(bytes: usize) {
        FREE.with(|free| free.set(bytes));
    }

    /// A budget keeping `reserve` bytes of this thread's heap (which has `free` free),
    /// with an arena of `stripes` stripes.
    pub(crate) fn budget(
        reserve: u64,
        free_bytes: usize,
        stripes: usize,
    ) -> (&'static HeapBudget, &'static crate::ram::fake::Inspecting) {
        set_free(free_bytes);
        let arena = crate::ram::fake::arena(stripes);
        (
            Box::leak(Box::new(HeapBudget::new(reserve, free, arena))),
            arena,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_or_ring_that_would_leave_less_than_the_reserve_is_refused() {
        let (heap, _) = fake::budget(4 << 20, 10 << 20, 0);
        assert_eq!(heap.room(), 6 << 20);
        assert_eq!(heap.fits(6 << 20), Ok(()));
        assert_eq!(
            heap.fits((6 << 20) + 1),
            Err(NoRoom {
                needed: (6 << 20) + 1,
                room: 6 << 20
            })
        );
        // Less free than the reserve: nothing at all.
        fake::set_free(3 << 20);
        assert_eq!(heap.room(), 0);
        assert!(heap.fits(1).is_err());
    }

    #[test]
    fn memory_promised_to_ram_disks_is_not_room_for_others() {
        // 160 stripes: 10 MiB.
        let (heap, _) = fake::budget(1 << 20, 10 << 20, 160);
        heap.repromise(0, 3 << 20);
        heap.repromise(0, 2 << 20);
        assert_eq!(heap.promised(), 5 << 20);
        assert_eq!(heap.stripe_room(), 5 << 20);
        assert!(heap.fits_stripes(5 << 20).is_ok());
        assert!(heap.fits_stripes((5 << 20) + 1).is_err());
        // Promises are stripes: the heap's room does not see them.
        assert_eq!(heap.room(), 9 << 20);
        // A disk promised 3 MiB may take it back, not the other's 2 MiB.
        assert_eq!(heap.room_besides(3 << 20), 8 << 20);
        heap.repromise(3 << 20, 1 << 20);
        assert_eq!(heap.promised(), 3 << 20);
        heap.repromise(1 << 20, 0);
        heap.repromise(2 << 20, 0);
        assert_eq!((heap.promised(), heap.stripe_room()), (0, 10 << 20));
    }
}
