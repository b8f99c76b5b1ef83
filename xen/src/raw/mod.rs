// SPDX-License-Identifier: MIT OR Apache-2.0
//! The only unsafe code of the crate: issuing hypercalls (`vmcall`/`vmmcall`), CPU
//! interrupt control for the idle protocol, and atomic access to memory shared with Xen
//! or another domain.
#![allow(unsafe_code)]

pub mod cpu;
pub mod hypercall;
pub mod shm;
