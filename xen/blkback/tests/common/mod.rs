// SPDX-License-Identifier: MIT OR Apache-2.0
//! What several of blkback's tests share.

pub mod counting_alloc;
