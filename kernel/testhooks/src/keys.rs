// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore keys the test image's self-tests use, in blkdom's own directory. README.md's
//! "Xenstore keys" lists them apart from the keys of the production image
//! (`xen/blkback/tests/xenstore_keys.rs` checks it).

/// Written, read back and watched by blkdom.
pub const SELFTEST: &str = "data/blkdom-selftest";
/// Written `seen` by the rig in dom0 once it read [`SELFTEST`]; watched by blkdom.
pub const ACK: &str = "data/blkdom-ack";

/// Every key of the self-tests.
pub const ALL: &[&str] = &[SELFTEST, ACK];
