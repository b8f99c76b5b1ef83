// SPDX-License-Identifier: MIT OR Apache-2.0
//! Live upgrade's logic (docs/design.md §4.12): the request dom0 writes and who may
//! write it (`request`), receiving the image it grants (`receive`), the checks a new
//! image passes before anything stops (`image`), and the handover block the old image
//! leaves the new one (`block`), encoded and checked field by field (`wire`), with a
//! vbd's record made from and turned back into what `blkback` negotiated (`vbd`). The
//! kernel does the hypercalls, the copies and the jump; nothing here touches memory but
//! the slices it is given.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod block;
pub mod image;
pub mod park;
pub mod ranges;
pub mod receive;
pub mod request;
pub mod vbd;
pub mod wire;

#[cfg(test)]
mod park_tests;
#[cfg(test)]
mod tests;
