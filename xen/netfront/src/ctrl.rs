// SPDX-License-Identifier: MIT OR Apache-2.0
//! The vif's control ring (`feature-ctrl-ring`, netif.h's "Control ring"): a one-page
//! ring of 16-byte requests and 12-byte responses, one response per request. blkdom uses
//! it once, after netback is Connected (its `xenvif_set_hash_mapping` checks entries
//! against the queues connected), to set up the hash that steers packets to queues
//! ([`set_up_hash`]).
//!
//! **The backend is not trusted.** One request is out at a time and each wait is
//! bounded ([`CTRL_WAIT_MS`]). A response producer past the request, a response whose
//! id or type is not the request's, or no response in time breaks the ring for good
//! ([`CtrlError::Broken`] after): its state is unknown. A status other than success
//! fails that request, named.

use crate::hash::{Steering, HASH_FLAGS, KEY, MAPPING_SIZE, MAX_QUEUES};
use crate::queue::Page;
use crate::ring::{le16, le32, FrontRing, Overflow};
use core::sync::atomic::Ordering;
use xen::abi::netif::*;
use xen::SharedMem;

/// How long netback gets to answer one request (it answers from an interrupt thread).
pub const CTRL_WAIT_MS: u64 = 2_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlError {
    /// No response to a request of `kind` in [`CTRL_WAIT_MS`].
    Timeout {
        kind: u16,
    },
    /// netback answered a request of `kind` with this status.
    Status {
        kind: u16,
        status: u32,
    },
    /// A response that is not the request's (`kind`, id `sent`): its id and type.
    Garbage {
        kind: u16,
        sent: u16,
        id: u16,
        got: u16,
    },
    Overflow(Overflow),
    /// An earlier request broke the ring.
    Broken,
    /// netback does not hash IPv4/TCP (its hash types, from GET_HASH_FLAGS).
    NoTcpHash {
        flags: u32,
    },
}

/// The name of a control message type, for the console.
pub fn kind_name(kind: u16) -> &'static str {
    match kind {
        XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS => "GET_HASH_FLAGS",
        XEN_NETIF_CTRL_TYPE_SET_HASH_FLAGS => "SET_HASH_FLAGS",
        XEN_NETIF_CTRL_TYPE_SET_HASH_KEY => "SET_HASH_KEY",
        XEN_NETIF_CTRL_TYPE_GET_HASH_MAPPING_SIZE => "GET_HASH_MAPPING_SIZE",
        XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING_SIZE => "SET_HASH_MAPPING_SIZE",
        XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING => "SET_HASH_MAPPING",
        XEN_NETIF_CTRL_TYPE_SET_HASH_ALGORITHM => "SET_HASH_ALGORITHM",
        _ => "unknown",
    }
}

fn status_name(status: u32) -> &'static str {
    match status {
        XEN_NETIF_CTRL_STATUS_NOT_SUPPORTED => "not supported",
        XEN_NETIF_CTRL_STATUS_INVALID_PARAMETER => "invalid parameter",
        XEN_NETIF_CTRL_STATUS_BUFFER_OVERFLOW => "buffer overflow",
        _ => "unknown status",
    }
}

impl core::fmt::Display for CtrlError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            CtrlError::Timeout { kind } => {
                write!(f, "no answer to {} in {CTRL_WAIT_MS} ms", kind_name(kind))
            }
            CtrlError::Status { kind, status } => write!(
                f,
                "{} refused: status {status} ({})",
                kind_name(kind),
                status_name(status)
            ),
            CtrlError::Garbage {
                kind,
                sent,
                id,
                got,
            } => write!(
                f,
                "{} (id {sent}) answered by a response of id {id}, type {got}",
                kind_name(kind)
            ),
            CtrlError::Overflow(o) => write!(
                f,
                "response producer {} with {} consumed and {} requested",
                o.rsp_prod, o.rsp_cons, o.req_prod
            ),
            CtrlError::Broken => f.write_str("the control ring broke earlier"),
            CtrlError::NoTcpHash { flags } => {
                write!(f, "netback does not hash IPv4/TCP (hash types {flags:#x})")
            }
        }
    }
}

/// The clock, the wait between looks, and the event to netback.
pub struct Waits<'a> {
    pub now_ms: &'a mut dyn FnMut() -> u64,
    pub pause: &'a mut dyn FnMut(),
    pub kick: &'a mut dyn FnMut(),
}

pub struct CtrlRing {
    ring: FrontRing,
    next_id: u16,
    broken: bool,
}

impl CtrlRing {
    /// Initialises the ring in `mem` (one page, granted to netback).
    pub fn new(mem: SharedMem) -> Self {
        Self {
            ring: FrontRing::init(mem, CTRL_SLOT, CTRL_RING_SIZE),
            next_id: 0,
            broken: false,
        }
    }

    /// Sends one request and waits (bounded) for its response: its `data` on success.
    pub fn request(
        &mut self,
        kind: u16,
        data: [u32; 3],
        waits: &mut Waits<'_>,
    ) -> Result<u32, CtrlError> {
        if self.broken {
            return Err(CtrlError::Broken);
        }
        let result = self.exchange(kind, data, waits);
        if matches!(
            result,
            Err(CtrlError::Timeout { .. } | CtrlError::Garbage { .. } | CtrlError::Overflow(_))
        ) {
            self.broken = true;
        }
        result
    }

    fn exchange(
        &mut self,
        kind: u16,
        data: [u32; 3],
        waits: &mut Waits<'_>,
    ) -> Result<u32, CtrlError> {
        // One request out at a time: a slot is always free here.
        let Some(at) = self.ring.next_request_offset() else {
            return Err(CtrlError::Broken);
        };
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let mem = *self.ring.memory();
        mem.store_u16(at, id, Ordering::Relaxed);
        mem.store_u16(at + 2, kind, Ordering::Relaxed);
        for (i, word) in data.iter().enumerate() {
            mem.store_u32(at + 4 + 4 * i, *word, Ordering::Relaxed);
        }
        self.ring.produce();
        if self.ring.push_requests() {
            (waits.kick)();
        }
        let start = (waits.now_ms)();
        loop {
            if self
                .ring
                .unconsumed_responses()
                .map_err(CtrlError::Overflow)?
                > 0
            {
                let mut rsp = [0u8; 12];
                mem.read_bytes(self.ring.next_response_offset(), &mut rsp);
                self.ring.consume();
                let (got_id, got_kind) = (le16(&rsp, 0), le16(&rsp, 2));
                let (status, value) = (le32(&rsp, 4), le32(&rsp, 8));
                if got_id != id || got_kind != kind {
                    return Err(CtrlError::Garbage {
                        kind,
                        sent: id,
                        id: got_id,
                        got: got_kind,
                    });
                }
                if status != XEN_NETIF_CTRL_STATUS_SUCCESS {
                    return Err(CtrlError::Status { kind, status });
                }
                return Ok(value);
            }
            if (waits.now_ms)().saturating_sub(start) >= CTRL_WAIT_MS {
                return Err(CtrlError::Timeout { kind });
            }
            (waits.pause)();
        }
    }
}

/// Sets Toeplitz up for `queues` queues: the algorithm, IPv4/TCP hashing, our
/// [`KEY`], and a mapping table of [`MAPPING_SIZE`] entries (fewer if netback takes
/// fewer; none if it takes fewer than the queues: netback then takes `hash % queues`).
/// `page` is a page of ours granted to netback, for the key and the table (netback
/// copies each before it answers). The [`Steering`] netback now applies, or the first
/// failure; after a failure packets still arrive, on queues blkdom cannot predict.
pub fn set_up_hash(
    ctrl: &mut CtrlRing,
    queues: u16,
    page: &Page,
    waits: &mut Waits<'_>,
) -> Result<Steering, CtrlError> {
    let queues = queues.clamp(1, MAX_QUEUES as u16);
    ctrl.request(
        XEN_NETIF_CTRL_TYPE_SET_HASH_ALGORITHM,
        [XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ, 0, 0],
        waits,
    )?;
    let flags = ctrl.request(XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS, [0; 3], waits)?;
    if flags & HASH_FLAGS != HASH_FLAGS {
        return Err(CtrlError::NoTcpHash { flags });
    }
    ctrl.request(
        XEN_NETIF_CTRL_TYPE_SET_HASH_FLAGS,
        [HASH_FLAGS, 0, 0],
        waits,
    )?;
    page.mem.write_bytes(0, &KEY);
    ctrl.request(
        XEN_NETIF_CTRL_TYPE_SET_HASH_KEY,
        [page.gref, KEY.len() as u32, 0],
        waits,
    )?;
    let most = ctrl.request(XEN_NETIF_CTRL_TYPE_GET_HASH_MAPPING_SIZE, [0; 3], waits)?;
    let size = match MAPPING_SIZE.min(most) {
        size if size < u32::from(queues) => 0,
        size => size,
    };
    ctrl.request(
        XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING_SIZE,
        [size, 0, 0],
        waits,
    )?;
    let steering = Steering::new(queues, size);
    if size > 0 {
        for i in 0..size {
            let entry = steering.entry(i).to_le_bytes();
            page.mem.write_bytes(4 * i as usize, &entry);
        }
        ctrl.request(
            XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING,
            [page.gref, size, 0],
            waits,
        )?;
    }
    Ok(steering)
}
