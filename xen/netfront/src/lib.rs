// SPDX-License-Identifier: MIT OR Apache-2.0
//! Xen netfront, the frontend side of the netif protocol, for blkdom's storage network:
//! vif queues (each a tx and an rx ring and an event channel, MTU 1500 or up to 9000;
//! packets of up to 64 KiB over several slots both ways: scatter-gather and TCPv4 GSO),
//! the control ring that has netback steer flows to queues blkdom can predict, and
//! smoltcp's device over the queues.
//!
//! * [`ring`]: a `ring.h` front ring's indices and notification arithmetic.
//! * [`queue`]: the two rings, their pages, and every check of the backend's responses.
//! * [`phy`]: smoltcp's `Device` over a queue; [`csum`]: the TCP/UDP checksums it checks;
//!   [`tso`]: a connection's back-to-back segments joined into GSO packets on send.
//! * [`stack`]: smoltcp's interface and sockets; [`lease`]: its DHCPv4 lease.
//! * [`xenbus`]: the frontend's handshake with netback, over `xen::xenbus::XenStore`:
//!   up to [`hash::MAX_QUEUES`] queues and a control ring when netback offers both.
//! * [`ctrl`]: the control ring's client and the hash set-up; [`hash`]: Toeplitz, the
//!   queue netback picks for a flow, and the local port that lands on a queue.
//!
//! No unsafe code: the rings and pages are `xen::SharedMem` windows the kernel makes.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod csum;
pub mod ctrl;
pub mod hash;
pub mod lease;
pub mod phy;
pub mod queue;
pub mod ring;
pub mod stack;
pub mod tso;
pub mod xenbus;

pub use phy::NetDevice;
pub use queue::{
    NetFault, NetQueue, NetStats, Offload, Page, Received, SendError, DEFAULT_MTU, MAX_FRAME,
    MAX_MTU, MAX_PACKET, MAX_TX_PACKET, MIN_MTU,
};
