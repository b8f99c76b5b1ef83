// SPDX-License-Identifier: MIT OR Apache-2.0
//! One vif queue: a tx and an rx ring, one granted page per slot, nothing allocated
//! after [`NetQueue::new`].
//!
//! - **tx**: a frame is copied into the page of a free tx id (id = page index) and sent as
//!   one request at offset 0, no flags (the stack computed every checksum); a jumbo
//!   frame longer than a page spans pages as a GSO packet does, without its extra slot.
//!   The id is given back by its response. A TCP frame may leave its checksum to netback
//!   ([`Offload::Checksum`]: `NETTXF_csum_blank`). A TCPv4 packet of up to 64 KiB for
//!   netback to cut into segments ([`Offload::Segments`]) spans pages, one slot each, as
//!   netback's `xenvif_tx_build_gops` reads them: the first slot (the packet's whole
//!   length, `NETTXF_more_data`, `NETTXF_extra_info`, and `NETTXF_csum_blank` with the
//!   TCP checksum holding only the pseudo-header's sum, as for Linux's
//!   `CHECKSUM_PARTIAL`), one GSO extra-info slot, then the other pages. Netback answers
//!   the first slot and then the extra slot with `NETIF_RSP_NULL`.
//! - **rx**: every rx slot carries a posted page; request `i` has id `i mod 256`, as
//!   Linux netfront posts them, and netback answers in the same slot (netif.h requires it
//!   of backends). With `feature-sg` and `feature-gso-tcpv4` a packet spans slots, as
//!   netback's `rx.c` lays it out: a first data slot (`NETRXF_more_data` when more
//!   follow, `NETRXF_extra_info` when extra-info slots follow it, the checksum flags),
//!   the extra-info slots, then the other data slots, each with its offset and length.
//!   The packet is gathered into the caller's buffer of [`MAX_PACKET`] bytes, and every
//!   slot it took is posted again.
//!
//! **The backend is not trusted.** Each response is read once into a copy and checked.
//! A response producer past the requests, a tx id that is not in flight, a tx `NULL`
//! beyond the extra-info slots sent, an rx data slot whose id is not its slot's stop the
//! queue with a [`NetFault`]. A packet is dropped, counted, and its slots posted again,
//! as Linux netfront drops it, for: a data slot with an error status or an offset and
//! length outside its page; no data at all; more than [`MAX_RX_SLOTS`] data slots or
//! more bytes than [`MAX_PACKET`]; a chain whose next slot (data or extra) the backend
//! has not published; an extra-info slot other than one GSO TCPv4 slot with a segment
//! size and (once hashing is set up) one IPv4/TCP Toeplitz hash slot.

use crate::ring::{le16, le32, FrontRing, Overflow};
use alloc::boxed::Box;
use core::sync::atomic::Ordering;
use xen::abi::grant_table::GrantRef;
use xen::abi::netif::*;
use xen::abi::PAGE_SIZE;
use xen::SharedMem;

/// An Ethernet header (no VLAN tag): what a frame carries besides its IP packet.
pub const ETHERNET_HEADER: usize = 14;
/// A vif's MTU when the toolstack sets none (netif.h).
pub const DEFAULT_MTU: usize = 1500;
/// The largest MTU a vif uses: a jumbo frame's. With more, a GSO packet would hold
/// fewer than 8 segments for little gain, and every non-GSO frame takes a buffer.
pub const MAX_MTU: usize = 9000;
/// The smallest: the IPv4 datagram every host must take (RFC 791).
pub const MIN_MTU: usize = 576;
/// The largest Ethernet frame sent without GSO ([`MAX_MTU`] and its header; no FCS);
/// past a page it spans slots, as a GSO packet does.
pub const MAX_FRAME: usize = ETHERNET_HEADER + MAX_MTU;
/// The smallest frame the queue sends (an Ethernet header).
pub const MIN_FRAME: usize = ETHERNET_HEADER;
/// The largest packet the queue takes in: an IPv4 packet as long as its length field
/// allows (a GSO packet is at most that) behind its Ethernet header.
pub const MAX_PACKET: usize = ETHERNET_HEADER + 65535;
/// The largest packet the queue sends with a GSO size: what the first tx slot's 16-bit
/// size field holds.
pub const MAX_TX_PACKET: usize = u16::MAX as usize;
/// Data slots one sent packet may span: [`MAX_TX_PACKET`] in whole pages (netback
/// takes up to `XEN_NETBK_LEGACY_SLOTS_MAX`, 18).
pub const MAX_TX_SLOTS: usize = MAX_TX_PACKET.div_ceil(PAGE_SIZE);
/// Data slots one received packet may span: `XEN_NETIF_NR_SLOTS_MIN`, Linux
/// netfront's limit (a [`MAX_PACKET`] packet in whole pages takes 17).
pub const MAX_RX_SLOTS: usize = XEN_NETIF_NR_SLOTS_MIN;

/// A zeroed buffer of `N` bytes made on the heap, never on the stack (the stack these
/// are made on holds no 64 KiB one).
pub(crate) fn heap_buffer<const N: usize>() -> Box<[u8; N]> {
    alloc::vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| unreachable!("a slice of N bytes"))
}

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
    /// A tx response with `NETIF_RSP_NULL` beyond the extra-info slots sent.
    TxNull {
        id: u16,
    },
    /// An rx data response is not in the slot of its request.
    RxWrongId {
        slot: u16,
        id: u16,
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
                write!(
                    f,
                    "tx response NULL (id field {id}) with no extra slot unanswered"
                )
            }
            NetFault::RxWrongId { slot, id } => {
                write!(f, "rx response id {id} in the slot of request {slot}")
            }
        }
    }
}

/// What netback is asked to finish of a packet sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    /// Nothing: every checksum is filled in.
    None,
    /// An IPv4 TCP frame whose checksum holds only the pseudo-header's sum
    /// (`NETTXF_csum_blank`, as Linux netfront sends a `CHECKSUM_PARTIAL` packet).
    Checksum,
    /// That, for an IPv4 TCP packet of up to [`MAX_TX_PACKET`] bytes to cut into
    /// segments of this many payload bytes (a GSO extra slot).
    Segments(u16),
}

/// Why a frame was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// Every tx slot is in flight: try after [`NetQueue::reap_tx`].
    Full,
    /// Shorter than an Ethernet header or longer than [`MAX_FRAME`] ([`MAX_TX_PACKET`]
    /// to cut into segments, whose size may not be 0).
    BadLength(usize),
    Failed(NetFault),
}

/// A packet taken in by [`NetQueue::receive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Its length, Ethernet header included.
    pub len: usize,
    /// dom0 checked its TCP/UDP checksum or never filled it in (`NETRXF_data_validated`
    /// or `NETRXF_csum_blank`): not to be checked again. Otherwise the checksum is the
    /// sender's, to check.
    pub checksum_checked: bool,
    /// The segment size of the GSO extra slot: a TCPv4 packet netback coalesced.
    pub gso_size: Option<u16>,
    /// The IPv4/TCP Toeplitz hash netback computed for it (a hash extra slot, sent once
    /// the control ring set hashing up; see [`NetQueue::accept_hash`]).
    pub hash: Option<u32>,
}

/// Why a received packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxDrop {
    /// A data slot with an error status or outside its page.
    BadSlot,
    Empty,
    BadExtra,
    BadChain,
}

/// Counters, for the statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Packets sent (a GSO packet counts once).
    pub tx_frames: u64,
    /// Of them, packets with a GSO extra slot, for netback to cut into segments.
    pub tx_gso: u64,
    /// tx responses other than OKAY (the backend dropped or refused the frame).
    pub tx_errors: u64,
    /// Packets received (a GSO packet counts once).
    pub rx_frames: u64,
    /// Of them, packets netback coalesced (with a GSO extra slot).
    pub rx_gso: u64,
    /// Of them, packets with netback's hash (a hash extra slot).
    pub rx_hashed: u64,
    /// Packets dropped, for any of the reasons below or a data slot with an error status
    /// or outside its page, or no data.
    pub rx_dropped: u64,
    /// Of them: an extra-info slot missing, or not one GSO TCPv4 slot and (with
    /// hashing) one IPv4/TCP Toeplitz hash slot.
    pub rx_bad_extra: u64,
    /// Of them: too many slots or bytes, or a continuation not published.
    pub rx_bad_chain: u64,
    pub notifications: u64,
}

/// Adds up queues' counters (a device's totals).
impl core::ops::AddAssign for NetStats {
    fn add_assign(&mut self, other: Self) {
        self.tx_frames += other.tx_frames;
        self.tx_gso += other.tx_gso;
        self.tx_errors += other.tx_errors;
        self.rx_frames += other.rx_frames;
        self.rx_gso += other.rx_gso;
        self.rx_hashed += other.rx_hashed;
        self.rx_dropped += other.rx_dropped;
        self.rx_bad_extra += other.rx_bad_extra;
        self.rx_bad_chain += other.rx_bad_chain;
        self.notifications += other.notifications;
    }
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
    /// The ids that went out as a packet's first slot with an extra-info slot after it:
    /// their response is followed by a `NULL` one.
    tx_extra: [bool; TX_IDS],
    /// `NULL` responses owed: extra-info slots whose first slot was answered.
    tx_nulls_owed: u32,
    fault: Option<NetFault>,
    /// A push crossed the backend's event threshold: send it an event.
    notify: bool,
    /// Hash extra slots are taken (IPv4/TCP Toeplitz ones), not dropped.
    accept_hash: bool,
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
            tx_extra: [false; TX_IDS],
            tx_nulls_owed: 0,
            fault: None,
            notify: false,
            accept_hash: false,
            stats: NetStats::default(),
        }
    }

    pub fn fault(&self) -> Option<NetFault> {
        self.fault
    }

    /// From now on a packet may carry a hash extra slot (netif.h: a frontend that sets
    /// a hash up takes them): call before the control ring's set-up starts.
    pub fn accept_hash(&mut self) {
        self.accept_hash = true;
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

    /// Whether a frame of up to a page can be sent now.
    pub fn can_send(&self) -> bool {
        self.has_room(1, 1)
    }

    /// Whether a frame of `len` bytes (its pages, no extra slot) can be sent now.
    pub fn can_send_frame(&self, len: usize) -> bool {
        let pages = len.div_ceil(PAGE_SIZE).max(1);
        self.has_room(pages, pages)
    }

    /// Whether `packets` packets of [`MAX_TX_SLOTS`] pages and an extra-info slot each
    /// can be sent now.
    pub fn can_send_packets(&self, packets: usize) -> bool {
        self.has_room(packets * MAX_TX_SLOTS, packets * (MAX_TX_SLOTS + 1))
    }

    fn has_room(&self, ids: usize, slots: usize) -> bool {
        self.fault.is_none()
            && self.tx_free_count >= ids
            && self.tx.free_requests() as usize >= slots
    }

    /// Sends one frame, as it is.
    pub fn send(&mut self, frame: &[u8]) -> Result<(), SendError> {
        self.send_packet(frame, Offload::None)
    }

    /// Sends `packet` with what `offload` leaves to netback: a frame of up to
    /// [`MAX_FRAME`] bytes, or an IPv4 TCP packet of up to [`MAX_TX_PACKET`] to cut
    /// into segments (the module doc).
    pub fn send_packet(&mut self, packet: &[u8], offload: Offload) -> Result<(), SendError> {
        if let Some(fault) = self.fault {
            return Err(SendError::Failed(fault));
        }
        let (max, gso_size) = match offload {
            Offload::Segments(size) => (MAX_TX_PACKET, Some(size)),
            Offload::None | Offload::Checksum => (MAX_FRAME, None),
        };
        if !(MIN_FRAME..=max).contains(&packet.len()) || gso_size == Some(0) {
            return Err(SendError::BadLength(packet.len()));
        }
        let pages = packet.len().div_ceil(PAGE_SIZE);
        let extra = usize::from(gso_size.is_some());
        if !self.has_room(pages, pages + extra) {
            return Err(SendError::Full);
        }
        let mut ids = [0u16; MAX_TX_SLOTS];
        for (chunk, id) in packet.chunks(PAGE_SIZE).zip(ids.iter_mut()) {
            self.tx_free_count -= 1;
            *id = self.tx_free[self.tx_free_count];
            self.tx_in_flight[usize::from(*id)] = true;
            self.tx_pages[usize::from(*id)].mem.write_bytes(0, chunk);
        }
        let more = if pages > 1 { NETTXF_MORE_DATA } else { 0 };
        let first_flags = match offload {
            Offload::None => more,
            Offload::Checksum => more | NETTXF_CSUM_BLANK | NETTXF_DATA_VALIDATED,
            Offload::Segments(_) => {
                more | NETTXF_EXTRA_INFO | NETTXF_CSUM_BLANK | NETTXF_DATA_VALIDATED
            }
        };
        self.tx_extra[usize::from(ids[0])] = gso_size.is_some();
        // The first slot carries the whole length; netback takes the others' off it.
        self.tx_request(ids[0], first_flags, packet.len() as u16);
        if let Some(size) = gso_size {
            let at = self.tx.next_request_offset().expect("room checked");
            let mem = *self.tx.memory();
            let mut extra = [0u8; TX_SLOT];
            extra[EXTRA_TYPE] = XEN_NETIF_EXTRA_TYPE_GSO;
            extra[EXTRA_GSO_SIZE..EXTRA_GSO_SIZE + 2].copy_from_slice(&size.to_le_bytes());
            extra[EXTRA_GSO_TYPE] = XEN_NETIF_GSO_TYPE_TCPV4;
            mem.write_bytes(at, &extra);
            self.tx.produce();
        }
        for (i, chunk) in packet.chunks(PAGE_SIZE).enumerate().skip(1) {
            let flags = if i + 1 < pages { NETTXF_MORE_DATA } else { 0 };
            self.tx_request(ids[i], flags, chunk.len() as u16);
        }
        self.stats.tx_frames += 1;
        self.stats.tx_gso += extra as u64;
        self.notify |= self.tx.push_requests();
        Ok(())
    }

    /// Writes a data request for page `id` (offset 0) in the next tx slot.
    fn tx_request(&mut self, id: u16, flags: u16, size: u16) {
        let at = self.tx.next_request_offset().expect("room checked");
        let mem = *self.tx.memory();
        mem.store_u32(at, self.tx_pages[usize::from(id)].gref, Ordering::Relaxed);
        mem.store_u16(at + 4, 0, Ordering::Relaxed);
        mem.store_u16(at + 6, flags, Ordering::Relaxed);
        mem.store_u16(at + 8, id, Ordering::Relaxed);
        mem.store_u16(at + 10, size, Ordering::Relaxed);
        self.tx.produce();
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
            // An extra slot's answer: its id field is whatever the slot held.
            if status == NETIF_RSP_NULL && self.tx_nulls_owed > 0 {
                self.tx_nulls_owed -= 1;
                self.tx.consume();
                continue;
            }
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
            self.tx_nulls_owed += u32::from(core::mem::take(&mut self.tx_extra[usize::from(id)]));
            self.tx_free[self.tx_free_count] = id;
            self.tx_free_count += 1;
            self.tx.consume();
        }
        Ok(ready)
    }

    /// Gathers the next received packet into `out` and posts its slots again:
    /// `Ok(Some(packet))`, or `Ok(None)` when no packet is waiting. Dropped packets are
    /// counted and skipped.
    pub fn receive(&mut self, out: &mut [u8; MAX_PACKET]) -> Result<Option<Received>, NetFault> {
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
            let (slots, gathered) = self.gather(ready, out).map_err(|f| self.fail(f))?;
            for _ in 0..slots {
                self.rx.consume();
            }
            // The pages go back at once, good packet or bad: the ring keeps its full
            // count posted.
            self.post_rx();
            match gathered {
                Ok(packet) => {
                    self.stats.rx_frames += 1;
                    self.stats.rx_gso += u64::from(packet.gso_size.is_some());
                    self.stats.rx_hashed += u64::from(packet.hash.is_some());
                    return Ok(Some(packet));
                }
                Err(drop) => {
                    self.stats.rx_dropped += 1;
                    match drop {
                        RxDrop::BadSlot | RxDrop::Empty => {}
                        RxDrop::BadExtra => self.stats.rx_bad_extra += 1,
                        RxDrop::BadChain => self.stats.rx_bad_chain += 1,
                    }
                }
            }
        }
    }

    /// One response slot, read once.
    fn response(&self, index: u32) -> [u8; RX_SLOT] {
        let mut copy = [0u8; RX_SLOT];
        self.rx
            .memory()
            .read_bytes(self.rx.slot_offset(index), &mut copy);
        copy
    }

    /// Walks the packet that starts at the next response, over at most `ready`
    /// responses, copying its data into `out`: how many slots it took, and the packet
    /// or why it is dropped. A bad packet is walked to the end of its chain (or of what
    /// was published), so its slots all go back and the next packet starts clean.
    fn gather(
        &self,
        ready: u32,
        out: &mut [u8; MAX_PACKET],
    ) -> Result<(u32, Result<Received, RxDrop>), NetFault> {
        let cons = self.rx.rsp_cons();
        let mut used = 0u32;
        let mut data_slots = 0usize;
        let mut len = 0usize;
        let mut first_flags = 0u16;
        let mut gso_size = None;
        let mut hash = None;
        let mut drop = None;
        'chain: loop {
            if used == ready {
                // More data was announced, and the backend published no more.
                drop.get_or_insert(RxDrop::BadChain);
                break;
            }
            let index = cons.wrapping_add(used);
            let rsp = self.response(index);
            used += 1;
            let (id, offset, flags) = (le16(&rsp, 0), le16(&rsp, 2), le16(&rsp, 4));
            let status = le16(&rsp, 6) as i16;
            let slot = (index % RX_RING_SIZE) as u16;
            if id != slot {
                return Err(NetFault::RxWrongId { slot, id });
            }
            data_slots += 1;
            if data_slots > MAX_RX_SLOTS {
                drop.get_or_insert(RxDrop::BadChain);
            }
            let offset = usize::from(offset);
            match usize::try_from(status) {
                Ok(size) if offset + size <= PAGE_SIZE => {
                    if len + size > MAX_PACKET {
                        drop.get_or_insert(RxDrop::BadChain);
                    } else if drop.is_none() {
                        self.rx_pages[usize::from(id)]
                            .mem
                            .read_bytes(offset, &mut out[len..len + size]);
                    }
                    len += size;
                }
                _ => {
                    drop.get_or_insert(RxDrop::BadSlot);
                }
            }
            if data_slots == 1 {
                first_flags = flags;
                if flags & NETRXF_EXTRA_INFO != 0 {
                    // netback puts the extra-info slots right after the first data slot.
                    loop {
                        if used == ready {
                            drop.get_or_insert(RxDrop::BadExtra);
                            break 'chain;
                        }
                        let extra = self.response(cons.wrapping_add(used));
                        used += 1;
                        let size = le16(&extra, EXTRA_GSO_SIZE);
                        let gso = extra[EXTRA_TYPE] == XEN_NETIF_EXTRA_TYPE_GSO
                            && extra[EXTRA_GSO_TYPE] == XEN_NETIF_GSO_TYPE_TCPV4
                            && size > 0
                            && gso_size.is_none();
                        // Only what the control ring asked for: Toeplitz, IPv4/TCP.
                        let hashed = self.accept_hash
                            && extra[EXTRA_TYPE] == XEN_NETIF_EXTRA_TYPE_HASH
                            && extra[EXTRA_HASH_TYPE] == HASH_TYPE_BIT_IPV4_TCP
                            && u32::from(extra[EXTRA_HASH_ALG])
                                == XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ
                            && hash.is_none();
                        if gso {
                            gso_size = Some(size);
                        } else if hashed {
                            hash = Some(le32(&extra, EXTRA_HASH_VALUE));
                        } else {
                            drop.get_or_insert(RxDrop::BadExtra);
                        }
                        if extra[EXTRA_FLAGS] & XEN_NETIF_EXTRA_FLAG_MORE == 0 {
                            break;
                        }
                    }
                }
            }
            if flags & NETRXF_MORE_DATA == 0 {
                break;
            }
        }
        if len == 0 {
            drop.get_or_insert(RxDrop::Empty);
        }
        let packet = match drop {
            Some(drop) => Err(drop),
            None => Ok(Received {
                len,
                checksum_checked: first_flags & (NETRXF_CSUM_BLANK | NETRXF_DATA_VALIDATED) != 0,
                gso_size,
                hash,
            }),
        };
        Ok((used, packet))
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
