// SPDX-License-Identifier: MIT OR Apache-2.0
//! The header of every `ring.h` shared ring (blkif, netif, ...): four indices, then
//! private and padding bytes up to 64, then the slots.

pub const REQ_PROD: usize = 0;
pub const REQ_EVENT: usize = 4;
pub const RSP_PROD: usize = 8;
pub const RSP_EVENT: usize = 12;
/// Producer/event indices plus the private and padding bytes.
pub const HEADER_SIZE: usize = 64;
