// SPDX-License-Identifier: MIT OR Apache-2.0
//! The blkif backend engine: everything between a frontend's shared ring and a block
//! device, as pure logic over small traits (ring memory, grants, event channel,
//! xenstore, block device) so that it is tested on the host against a fake Xen (`fake`).
//!
//! Rules from Xen's advisories that shape the code (see docs/design.md §6): each
//! request and indirect page is copied out of shared memory once and only the copy is
//! used; responses are written whole with zeroed padding; every grant gets its own DMA
//! segment; work per poll is bounded; every grant status is checked and failures unwind;
//! teardown is idempotent and waits for in-flight requests; the number of grants a
//! frontend can keep mapped is bounded.
//!
//! What the kernel provides to run it:
//! - [`ring::RingMemory`] over the ring's `2^order` granted pages, mapped read-write and
//!   virtually contiguous: volatile copies, acquire/release index accesses, `mfence`.
//! - [`grant::GrantOps`] over batched `GNTTABOP_map_grant_ref`/`unmap_grant_ref` for the
//!   frontend's domain; `MappedGrant::buffer` is what the device gets as DMA address, and
//!   `BufferAccess` reads/writes a mapped page by that id (indirect pages, RAM disk).
//! - [`engine::EventChannel`]: `EVTCHNOP_send` on the ring's bound port.
//! - `blkdev::BlockDevice`: one handle per device queue, owned by the vCPU's poller.
//! - [`xen::xenbus::XenStore`] over the xenstore client, and [`negotiate::ConnectionHooks`]:
//!   map rings, bind event channels to the serving vCPU, create one [`engine::Engine`]
//!   per queue (queue `q` on poller `q mod n`); on disconnect call
//!   [`engine::Engine::disconnect`] until it succeeds, then unmap rings and unbind.
//! - A heap that gives every allocation cache lines of its own ([`line_layout`]): each
//!   queue's engine writes, on the I/O path, only its own allocations, ring, grants and
//!   device queue, so two queues on two pollers then never write the same line
//!   (`tests/queues_share_no_line.rs`).
//! - The poller: `event_received()` for each ring whose event channel fired, then
//!   `poll_at(budget, now)` while it does work; after an idle spell call
//!   `prepare_to_sleep()` on every ring, and block only if all say so, and never past
//!   the earliest `notify_deadline()` (a notification held for a batch) or
//!   `throttle_deadline()` (a request held by the ring's I/O limits, [`limits`]).
// `fake` holds host-only test doubles, which use std.
#![cfg_attr(not(any(test, feature = "fake")), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod abi;
pub mod budget;
pub mod engine;
pub mod grant;
pub mod keys;
pub mod limits;
pub mod negotiate;
pub mod parse;
pub mod ring;
pub mod stats;

/// Bytes of a cache line (x86-64): the unit two CPUs writing near each other contend for.
pub const CACHE_LINE: usize = 64;

/// The layout a heap must use for an allocation of `layout` so that no two allocations
/// share a cache line: its start on a line boundary, its size whole lines. `None` when
/// the rounded size overflows.
pub fn line_layout(layout: core::alloc::Layout) -> Option<core::alloc::Layout> {
    Some(layout.align_to(CACHE_LINE).ok()?.pad_to_align())
}

/// `T` on cache lines of its own: aligned to a line and padded to whole lines, so a
/// neighbour written by another CPU never shares a line with it (a queue's counters,
/// which its poller writes and vCPU 0 reads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(align(64))]
pub struct CacheAligned<T>(pub T);

impl<T> core::ops::Deref for CacheAligned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> core::ops::DerefMut for CacheAligned<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// Allocation that reports failure instead of aborting (per-ring memory is taken at
/// connect time, where a frontend chooses how much).
pub(crate) mod fallible {
    use alloc::collections::TryReserveError;
    use alloc::vec::Vec;

    /// `vec![value; len]`.
    pub fn vec<T: Clone>(value: T, len: usize) -> Result<Vec<T>, TryReserveError> {
        let mut v = Vec::new();
        v.try_reserve_exact(len)?;
        v.resize(len, value);
        Ok(v)
    }

    /// An empty vector with room for exactly `capacity` items.
    pub fn with_capacity<T>(capacity: usize) -> Result<Vec<T>, TryReserveError> {
        let mut v = Vec::new();
        v.try_reserve_exact(capacity)?;
        Ok(v)
    }
}

#[cfg(any(test, feature = "fake"))]
pub mod fake;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod line_tests {
    use super::*;
    use core::alloc::Layout;

    #[test]
    fn line_layouts_start_on_a_line_and_cover_whole_lines() {
        for (size, align) in [(1, 1), (2, 2), (63, 8), (64, 8), (65, 16), (4096, 4096)] {
            let layout = line_layout(Layout::from_size_align(size, align).unwrap()).unwrap();
            assert_eq!(layout.align() % CACHE_LINE, 0, "{size}/{align}");
            assert!(layout.align() >= align);
            assert_eq!(layout.size() % CACHE_LINE, 0, "{size}/{align}");
            assert!(layout.size() >= size);
            assert!(layout.size() < size + CACHE_LINE, "{size}/{align}");
        }
        assert_eq!(
            line_layout(Layout::from_size_align(isize::MAX as usize - 30, 1).unwrap()),
            None
        );
    }

    #[test]
    fn cache_aligned_values_have_lines_of_their_own() {
        assert_eq!(core::mem::align_of::<CacheAligned<u8>>(), CACHE_LINE);
        assert_eq!(core::mem::size_of::<CacheAligned<u8>>(), CACHE_LINE);
        assert_eq!(
            core::mem::size_of::<CacheAligned<crate::stats::RingStats>>() % CACHE_LINE,
            0
        );
        let pair = [CacheAligned(1u64), CacheAligned(2u64)];
        let gap = &pair[1] as *const _ as usize - &pair[0] as *const _ as usize;
        assert_eq!(gap, CACHE_LINE);
    }
}
