// SPDX-License-Identifier: MIT OR Apache-2.0
//! A xenstore client over the shared ring page (`HVM_PARAM_STORE_PFN`, notified through
//! `HVM_PARAM_STORE_EVTCHN`). Control path: it allocates.
//!
//! * [`wire`]: message header, payload encoding, error names, permissions, paths.
//! * [`ring`]: the [`XenstoreRing`] byte-stream trait and its implementation over the
//!   `xenstore_domain_interface` page.
//! * [`client`]: requests, replies, watch events (queued when they arrive between
//!   replies) and transactions with retry on `EAGAIN`.

pub mod client;
pub mod ring;
pub mod wire;

#[cfg(test)]
mod fake_xenstored;

pub use client::{Transaction, XenstoreClient};
pub use ring::{RingError, RingSignal, SharedXenstoreRing, XenstoreRing};
pub use wire::{Access, Permission, WatchEvent, XsErrno, XsError};
