// SPDX-License-Identifier: MIT OR Apache-2.0
//! The pollers' timing policy: how long an idle poller spins before it sleeps, what it
//! does between looks while it spins, and how long it may block before it must look at
//! its ring and device again, and the event sends it holds for its sleep. Kept out of
//! the image so `cargo test` covers it.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

pub mod idle;
pub mod owed;
pub mod sleep;
pub mod spin;
pub mod wake;
