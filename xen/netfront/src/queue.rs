// SPDX-License-Identifier: MIT OR Apache-2.0
//! One vif queue: a tx and an rx ring, one granted page per slot, nothing allocated
//! after [`NetQueue::new`].
//!
//! - **tx**: a frame is copied into the page of a free tx id (id = page index) and sent as
//!   one request at offset 0, no flags (the stack computed every checksum). The id is
//!   given back by its response.
//! - **rx**: every rx slot carries a posted page; request `i` has id `i mod 256`, as
//!   Linux netfront posts them, and netback answers in the same slot (netif.h requires it
//!   of backends). A frame is copied out of its page, and the page is posted again.
//!
//! **The backend is not trusted.** Each response is read once into a copy and checked:
//! a response producer past the requests, a tx id that is not in flight, a tx `NULL`
//! (we send no extra-info slots), an rx id that is not its slot's, a multi-slot or
//! extra-info rx (we offered neither `feature-sg` nor GSO) stop the queue with a
//! [`NetFault`]; a frame whose offset and length leave the page or exceed the MTU is
//! dropped and counted, as Linux netfront drops it.

use crate::ring::{FrontRing, Overflow};
use alloc::boxed::Box;
use core::sync::atomic::Ordering;
use xen::abi::grant_table::GrantRef;
use xen::abi::netif::*;
use xen::abi::PAGE_SIZE;
use xen::SharedMem;

/// The largest Ethernet frame (MTU 1500 + the 14-byte header; no FCS).
pub const MAX_FRAME: usize = 1514;
/// The smallest frame the queue sends (an Ethernet header).
pub const MIN_FRAME: usize = 14;

/// A page of ours, granted to the backend.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    pub mem: SharedMem,
    pub gref: GrantRef,
}

/// Why a queue stopped: the backend broke the protocol. Nothing more is sent or
/// taken from its rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetFault {
    TxOverflow(Overflow),
    RxOverflow(Overflow),
    /// A tx response names an id we have not sent (or answered twice).
    TxUnknownId {
        id: u16,
    },
    /// A tx response with `NETIF_RSP_NULL`: answers an extra-info slot we never sent.
    TxNull {
        id: u16,
    },
    /// An rx response is not in the slot of its request.
    RxWrongId {
        slot: u16,
        id: u16,
    },
    /// An rx response spans slots (`NETRXF_more_data`/`extra_info`), not negotiated.
    RxMultiSlot {
        flags: u16,
    },
}

impl core::fmt::Display for NetFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NetFault::TxOverflow(o) | NetFault::RxOverflow(o) => write!(
                f,
                "{} ring: response producer {} with {} consumed and {} requested",
                if matches!(self, NetFault::TxOverflow(_)) {
                    "tx"
                } else {
                    "rx"
                },
                o.rsp_prod,
                o.rsp_cons,
                o.req_prod
            ),
            NetFault::TxUnknownId { id } => write!(f, "tx response for id {id}, not in flight"),
            NetFault::TxNull { id } => {
                write!(f, "tx response NULL for id {id} (no extra slot sent)")
            }
            NetFault::RxWrongId { slot, id } => {
                write!(f, "rx response id {id} in the slot of request {slot}")
            }
            NetFault::RxMultiSlot { flags } => {
                write!(
                    f,
                    "rx response flags {flags:#x}: more data or extra info, not negotiated"
                )
            }
        }
    }
}

/// Why a frame was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// Every tx slot is in flight: try after [`NetQueue::reap_tx`].
    Full,
    /// Shorter than an Ethernet header or longer than [`MAX_FRAME`].
    BadLength(usize),
    Failed(NetFault),
}

/// Counters, for the statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub tx_frames: u64,
    /// tx responses other than OKAY (the backend dropped or refused the frame).
    pub tx_errors: u64,
    pub rx_frames: u64,
    /// rx responses with an error status, or a frame outside its page or the MTU.
    pub rx_dropped: u64,
    pub notifications: u64,
}

const TX_IDS: usize = TX_RING_SIZE as usize;
const RX_IDS: usize = RX_RING_SIZE as usize;

pub struct NetQueue {
    tx: FrontRing,
    rx: FrontRing,
    /// Boxed, as are the device's buffers: the whole vif stays small enough to move
    /// around a 64 KiB boot stack.
    tx_pages: Box<[Page; TX_IDS]>,
    rx_pages: Box<[Page; RX_IDS]>,
    /// Free tx ids, a stack; `tx_in_flight[id]` says which are out.
    tx_free: [u16; TX_IDS],
    tx_free_count: usize,
    tx_in_flight: [bool; TX_IDS],
    fault: Option<NetFault>,
    /// A push crossed the backend's event threshold: send it an event.
    notify: bool,
    pub stats: NetStats,
}

impl core::fmt::Debug for NetQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NetQueue")
            .field("tx_in_flight", &(TX_IDS - self.tx_free_count))
            .field("fault", &self.fault)
            .field("stats", &self.stats)
            .finish()
    }
}

impl NetQueue {
    /// Initialises both rings (one page each) and takes one granted page per slot.
    pub fn new(
        tx_ring: SharedMem,
        rx_ring: SharedMem,
        tx_pages: Box<[Page; TX_IDS]>,
        rx_pages: Box<[Page; RX_IDS]>,
    ) -> Self {
        assert!(tx_pages
            .iter()
            .chain(rx_pages.iter())
            .all(|p| p.mem.len() >= PAGE_SIZE));
        let mut tx_free = [0u16; TX_IDS];
        for (i, id) in tx_free.iter_mut().enumerate() {
            *id = (TX_IDS - 1 - i) as u16;
        }
        Self {
            tx: FrontRing::init(tx_ring, TX_SLOT, TX_RING_SIZE),
            rx: FrontRing::init(rx_ring, RX_SLOT, RX_RING_SIZE),
            tx_pages,
            rx_pages,
            tx_free,
            tx_free_count: TX_IDS,
            tx_in_flight: [false; TX_IDS],
            fault: None,
            notify: false,
            stats: NetStats::default(),
        }
    }

    pub fn fault(&self) -> Option<NetFault> {
        self.fault
    }

    fn fail(&mut self, fault: NetFault) -> NetFault {
        self.fault.get_or_insert(fault);
        fault
    }

    /// Whether the backend wants an event for what was pushed since the last call
    /// (one event covers every push before it).
    pub fn take_notify(&mut self) -> bool {
        let notify = core::mem::take(&mut self.notify);
        if notify {
            self.stats.notifications += 1;
        }
        notify
    }

    /// Posts a page in every free rx slot.
    pub fn post_rx(&mut self) {
        if self.fault.is_some() {
            return;
        }
        while let Some(at) = self.rx.next_request_offset() {
            let id = (self.rx.req_prod_pvt() % RX_RING_SIZE) as u16;
            let mem = *self.rx.memory();
            mem.store_u16(at, id, Ordering::Relaxed);
            mem.store_u16(at + 2, 0, Ordering::Relaxed);
            mem.store_u32(
                at + 4,
                self.rx_pages[usize::from(id)].gref,
                Ordering::Relaxed,
            );
            self.rx.produce();
        }
        self.notify |= self.rx.push_requests();
    }

    /// Whether a frame can be sent now.
    pub fn can_send(&self) -> bool {
        self.fault.is_none() && self.tx_free_count > 0 && self.tx.free_requests() > 0
    }

    /// Sends one frame, built by `fill` into a page of ours (`len` bytes).
    pub fn send_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&SharedMem),
    ) -> Result<(), SendError> {
        if let Some(fault) = self.fault {
            return Err(SendError::Failed(fault));
        }
        if !(MIN_FRAME..=MAX_FRAME).contains(&len) {
            return Err(SendError::BadLength(len));
        }
        let Some(at) = self
            .tx
            .next_request_offset()
            .filter(|_| self.tx_free_count > 0)
        else {
            return Err(SendError::Full);
        };
        self.tx_free_count -= 1;
        let id = self.tx_free[self.tx_free_count];
        self.tx_in_flight[usize::from(id)] = true;
        let page = self.tx_pages[usize::from(id)];
        fill(&page.mem);
        let mem = *self.tx.memory();
        mem.store_u32(at, page.gref, Ordering::Relaxed);
        mem.store_u16(at + 4, 0, Ordering::Relaxed);
        mem.store_u16(at + 6, 0, Ordering::Relaxed);
        mem.store_u16(at + 8, id, Ordering::Relaxed);
        mem.store_u16(at + 10, len as u16, Ordering::Relaxed);
        self.tx.produce();
        self.stats.tx_frames += 1;
        self.notify |= self.tx.push_requests();
        Ok(())
    }

    /// Sends `frame`.
    pub fn send(&mut self, frame: &[u8]) -> Result<(), SendError> {
        self.send_with(frame.len(), |page| page.write_bytes(0, frame))
    }

    /// Takes every tx response: frees their ids. Returns how many.
    pub fn reap_tx(&mut self) -> Result<u32, NetFault> {
        if let Some(fault) = self.fault {
            return Err(fault);
        }
        let ready = self
            .tx
            .unconsumed_responses()
            .map_err(|o| self.fail(NetFault::TxOverflow(o)))?;
        for _ in 0..ready {
            let at = self.tx.next_response_offset();
            let mem = *self.tx.memory();
            let id = mem.load_u16(at, Ordering::Relaxed);
            let status = mem.load_u16(at + 2, Ordering::Relaxed) as i16;
            let known = self
                .tx_in_flight
                .get(usize::from(id))
                .copied()
                .unwrap_or(false);
            if !known {
                return Err(self.fail(NetFault::TxUnknownId { id }));
            }
            if status == NETIF_RSP_NULL {
                return Err(self.fail(NetFault::TxNull { id }));
            }
            if status != NETIF_RSP_OKAY {
                self.stats.tx_errors += 1;
            }
            self.tx_in_flight[usize::from(id)] = false;
            self.tx_free[self.tx_free_count] = id;
            self.tx_free_count += 1;
            self.tx.consume();
        }
        Ok(ready)
    }

    /// Copies the next received frame into `out` and posts its page again:
    /// `Ok(Some(len))`, or `Ok(None)` when no frame is waiting. Dropped frames are
    /// counted and skipped.
    pub fn receive(&mut self, out: &mut [u8; MAX_FRAME]) -> Result<Option<usize>, NetFault> {
        loop {
            if let Some(fault) = self.fault {
                return Err(fault);
            }
            let ready = self
                .rx
                .unconsumed_responses()
                .map_err(|o| self.fail(NetFault::RxOverflow(o)))?;
            if ready == 0 {
                return Ok(None);
            }
            let at = self.rx.next_response_offset();
            let mem = *self.rx.memory();
            let id = mem.load_u16(at, Ordering::Relaxed);
            let offset = usize::from(mem.load_u16(at + 2, Ordering::Relaxed));
            let flags = mem.load_u16(at + 4, Ordering::Relaxed);
            let status = mem.load_u16(at + 6, Ordering::Relaxed) as i16;
            let slot = (self.rx.rsp_cons() % RX_RING_SIZE) as u16;
            if id != slot {
                return Err(self.fail(NetFault::RxWrongId { slot, id }));
            }
            if flags & (NETRXF_MORE_DATA | NETRXF_EXTRA_INFO) != 0 {
                return Err(self.fail(NetFault::RxMultiSlot { flags }));
            }
            self.rx.consume();
            let len = usize::try_from(status).unwrap_or(0);
            let fits = len > 0 && len <= MAX_FRAME && offset + len <= PAGE_SIZE;
            if fits {
                self.rx_pages[usize::from(id)]
                    .mem
                    .read_bytes(offset, &mut out[..len]);
                self.stats.rx_frames += 1;
            } else {
                self.stats.rx_dropped += 1;
            }
            // The page goes back at once: the ring keeps its full count posted.
            self.post_rx();
            if fits {
                return Ok(Some(len));
            }
        }
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES` on both rings before sleeping: true when
    /// something arrived meanwhile.
    pub fn final_check(&self) -> bool {
        let rx = self.rx.final_check_for_responses();
        let tx = self.tx.final_check_for_responses();
        rx || tx
    }

    /// tx ids out with the backend.
    pub fn tx_in_flight(&self) -> usize {
        TX_IDS - self.tx_free_count
    }
}
