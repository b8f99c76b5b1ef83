// SPDX-License-Identifier: MIT OR Apache-2.0
//! What backs a disk, chosen by a string (the disk test's seeded write patterns are in
//! `kernel/testhooks`, beside the test).
//!
//! Pure functions, so `cargo test` covers them. A disk can be a slice of a device:
//! `extent` checks that it fits and keeps the slices of a device apart, `gpt` finds a
//! partition in a GUID partition table.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod extent;
pub mod gpt;
pub mod inline;
pub mod names;
pub mod resize;
pub mod spec;

pub use extent::{check_slice, Conflict, ConflictKind, Extent, Ranges, SliceError};
pub use names::{NameError, NvmeName, Serial, VirtioName};
pub use resize::{new_size, ResizeRefused};
pub use spec::{
    parse_backing, parse_nvme_tcp, Backing, DeviceId, DeviceName, Nqn, NvmeTcpError, NvmeTcpTarget,
    PartName, Portal, RamName, ReconnectTimes, Region, SpecError, SLICE_ALIGN,
};
