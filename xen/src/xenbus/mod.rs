// SPDX-License-Identifier: MIT OR Apache-2.0
//! The device-class independent side of xenbus, for a backend (or frontend) of any
//! device class: the `state` values, the few xenstore operations a handshake needs (the
//! [`XenStore`] trait, which the kernel implements over [`crate::xenstore`]'s client),
//! and, with the `fake` feature, an in-memory store for tests.
//!
//! * [`state`]: the values of a `state` node ([`XenbusState`]).
//! * [`error`]: the error node Linux's `xenbus_dev_error` writes, and errnos.
//! * [`keys`]: the keys of a device's and a domain's directories blkdom uses, by name.
//! * [`store`]: [`XenStore`], [`StoreError`], transactions.
//! * [`watch`]: which devices a batch of watch events concerns.
//! * [`retry`]: when a device is stepped again without a watch event.

pub mod error;
pub mod keys;
pub mod retry;
pub mod state;
pub mod store;
pub mod watch;

#[cfg(any(test, feature = "fake"))]
pub mod fake;

pub use state::XenbusState;
pub use store::{write_in_transaction, StoreError, TxId, XenStore, NO_TRANSACTION};
