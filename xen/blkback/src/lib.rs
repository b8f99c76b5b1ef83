//! The blkif backend engine: everything between a frontend's shared ring and a block
//! device, as pure logic over small traits (ring memory, grants, event channel,
//! xenstore, block device) so that it is tested on the host with fakes.
//!
//! Rules from Xen's advisories that shape the code (see `shared/design.md` §4): each
//! request and indirect page is copied out of shared memory once and only the copy is
//! used; responses are written whole with zeroed padding; every grant gets its own DMA
//! segment; work per poll is bounded; every grant status is checked and failures unwind;
//! teardown is idempotent and waits for in-flight requests; the number of grants a
//! frontend can keep mapped is bounded.
// The fakes are host-only test doubles and use std.
#![cfg_attr(not(any(test, feature = "fakes")), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod abi;
pub mod engine;
pub mod grant;
pub mod negotiate;
pub mod parse;
pub mod ring;
pub mod stats;
pub mod xenstore;

#[cfg(any(test, feature = "fakes"))]
pub mod fakes;

#[cfg(test)]
mod tests;
