// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the image's test hooks compute, apart from the devices they drive: the disk
//! test's seeded writes (`pattern`, which the tier-2 runner recomputes in Python,
//! `tests/qemu/disk_pattern.py`), the registry test's steps (`registry`) and the
//! self-tests' xenstore keys (`keys`). Pure functions and constants, so `cargo test`
//! covers them; only the test image (the kernel built with the `test-hooks` feature)
//! links this crate.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

pub mod keys;
pub mod pattern;
pub mod registry;
