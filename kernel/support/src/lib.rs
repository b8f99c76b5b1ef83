//! Host-testable logic of the blkdom kernel.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]
