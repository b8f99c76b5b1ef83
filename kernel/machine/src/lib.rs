// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the blkdom kernel learns about its machine: the physical frames it may use, the
//! ACPI tables and which hypervisor runs it (the boot command line is `bootconfig`'s).
//! Pure computation over bytes and numbers, kept out of the image so `cargo test`
//! covers it.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

pub mod acpi;
pub mod frames;
pub mod hypervisor;
