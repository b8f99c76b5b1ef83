//! Host-testable logic of the blkdom kernel: everything the image needs that is pure
//! computation over bytes and numbers, kept here so `cargo test` covers it.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

pub mod acpi;
pub mod cmdline;
pub mod frames;
pub mod hypervisor;
pub mod sleep;
