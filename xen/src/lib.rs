//! blkdom's Xen guest interface: the vendored ABI, hypercalls through a swappable
//! [`Hypervisor`] trait, event channels, grant tables, a xenstore client and the PV
//! console ring.
//!
//! Everything except [`raw`] is safe code over two small abstractions: the
//! [`Hypervisor`] trait (hypercalls) and [`SharedMem`] (memory shared with Xen or
//! another domain, accessed only through atomics). Host tests replace the first with a
//! fake and back the second with ordinary heap memory.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod abi;
mod byte_ring;
pub mod console;
pub mod error;
pub mod evtchn;
pub mod grant;
pub mod hypercall;
pub mod platform;
pub mod raw;
pub mod shared_info;
pub mod xenstore;

#[cfg(test)]
mod fake;

pub use error::XenError;
pub use hypercall::{Hypercall, Hypervisor};
pub use raw::shm::SharedMem;
