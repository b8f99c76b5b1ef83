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
//! - [`xenstore::XenStore`] over the xenstore client, and [`negotiate::ConnectionHooks`]:
//!   map rings, bind event channels to the serving vCPU, create one [`engine::Engine`]
//!   per queue (queue `q` on poller `q mod n`); on disconnect call
//!   [`engine::Engine::disconnect`] until it succeeds, then unmap rings and unbind.
//! - The poller: `event_received()` for each ring whose event channel fired, then
//!   `poll_at(budget, now)` while it does work; after an idle spell call
//!   `prepare_to_sleep()` on every ring, and block only if all say so, and never past
//!   the earliest `notify_deadline()` (a notification held for a batch).
// `fake` holds host-only test doubles, which use std.
#![cfg_attr(not(any(test, feature = "fake")), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod abi;
pub mod budget;
pub mod engine;
pub mod grant;
pub mod negotiate;
pub mod parse;
pub mod ring;
pub mod stats;
pub mod watch;
pub mod xenbus_error;
pub mod xenstore;

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
