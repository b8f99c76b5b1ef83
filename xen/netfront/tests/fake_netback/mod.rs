// SPDX-License-Identifier: MIT OR Apache-2.0
//! A netback for tests: the back ends of a queue's rings, the queue's pages by grant
//! reference, and a switch that carries frames between queues.

#![allow(dead_code)]

use netfront::{NetQueue, Page};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use xen::abi::netif::{
    HASH_TYPE_BIT_IPV4_TCP, NETIF_RSP_NULL, NETRXF_CSUM_BLANK, NETRXF_DATA_VALIDATED,
    NETRXF_EXTRA_INFO, NETRXF_MORE_DATA, NETTXF_CSUM_BLANK, NETTXF_EXTRA_INFO, NETTXF_MORE_DATA,
    XEN_NETIF_EXTRA_FLAG_MORE, XEN_NETIF_EXTRA_TYPE_GSO, XEN_NETIF_EXTRA_TYPE_HASH,
    XEN_NETIF_GSO_TYPE_TCPV4,
};
use xen::abi::sring;
use xen::SharedMem;

pub struct BackRing {
    pub mem: SharedMem,
    slot: usize,
    pub req_cons: u32,
    pub rsp_prod_pvt: u32,
}

impl BackRing {
    fn new(mem: SharedMem, slot: usize) -> Self {
        Self {
            mem,
            slot,
            req_cons: 0,
            rsp_prod_pvt: 0,
        }
    }

    pub fn at(&self, index: u32) -> usize {
        sring::HEADER_SIZE + (index & 255) as usize * self.slot
    }

    /// The next request's slot offset, if the frontend produced one.
    pub fn take(&mut self) -> Option<usize> {
        let prod = self.mem.load_u32(sring::REQ_PROD, Ordering::Acquire);
        (prod != self.req_cons).then(|| {
            let at = self.at(self.req_cons);
            self.req_cons += 1;
            at
        })
    }

    /// Offset to write the next response at; then `publish`.
    pub fn respond_at(&mut self) -> usize {
        let at = self.at(self.rsp_prod_pvt);
        self.rsp_prod_pvt += 1;
        at
    }

    pub fn publish(&self) {
        self.mem
            .store_u32(sring::RSP_PROD, self.rsp_prod_pvt, Ordering::Release);
    }
}

pub struct Side {
    pub tx: BackRing,
    pub rx: BackRing,
    pub pages: HashMap<u32, SharedMem>,
    /// Packets taken with a GSO extra slot.
    pub tx_gso: usize,
    /// Of the packets taken with `NETTXF_csum_blank`, those whose TCP checksum, once
    /// completed from the pseudo-header's sum in it, is wrong.
    pub tx_bad_partial: usize,
}

/// A packet the frontend sent, gathered from its slots.
pub struct Sent {
    /// The first slot's id.
    pub id: u16,
    pub packet: Vec<u8>,
    pub flags: u16,
    pub gso_size: Option<u16>,
}

fn page(gref: u32) -> Page {
    Page {
        mem: SharedMem::alloc_leaked(4096),
        gref,
    }
}

/// A queue and the netback side of it; grant references from `first_gref`.
pub fn queue(first_gref: u32) -> (NetQueue, Side) {
    let tx_ring = SharedMem::alloc_leaked(4096);
    let rx_ring = SharedMem::alloc_leaked(4096);
    let tx_pages: Box<[Page; 256]> = Box::new(std::array::from_fn(|i| page(first_gref + i as u32)));
    let rx_pages: Box<[Page; 256]> =
        Box::new(std::array::from_fn(|i| page(first_gref + 256 + i as u32)));
    let pages = tx_pages
        .iter()
        .chain(rx_pages.iter())
        .map(|p| (p.gref, p.mem))
        .collect();
    let queue = NetQueue::new(tx_ring, rx_ring, tx_pages, rx_pages);
    let side = Side {
        tx: BackRing::new(tx_ring, 12),
        rx: BackRing::new(rx_ring, 8),
        pages,
        tx_gso: 0,
        tx_bad_partial: 0,
    };
    (queue, side)
}

impl Side {
    /// Takes the next tx packet: (its first id, the packet), answered OKAY.
    pub fn transmitted(&mut self) -> Option<(u16, Vec<u8>)> {
        self.transmitted_packet().map(|sent| (sent.id, sent.packet))
    }

    /// Takes the next tx packet as netback's `xenvif_tx_build_gops` does: the first
    /// slot (the whole length), its extra-info slot, the other data slots; then answers
    /// each data slot OKAY and the extra slot NULL, right after the first's answer.
    pub fn transmitted_packet(&mut self) -> Option<Sent> {
        let at = self.tx.take()?;
        let m = self.tx.mem;
        let slot = |at: usize| {
            (
                m.load_u32(at, Ordering::Relaxed),
                m.load_u16(at + 4, Ordering::Relaxed) as usize,
                m.load_u16(at + 6, Ordering::Relaxed),
                m.load_u16(at + 8, Ordering::Relaxed),
                m.load_u16(at + 10, Ordering::Relaxed) as usize,
            )
        };
        let (gref, offset, flags, id, total) = slot(at);
        let mut gso_size = None;
        let mut extras = 0;
        if flags & NETTXF_EXTRA_INFO != 0 {
            let extra = self
                .tx
                .take()
                .expect("the extra slot published with its packet");
            assert_eq!(
                m.load_u8(extra, Ordering::Relaxed),
                XEN_NETIF_EXTRA_TYPE_GSO
            );
            assert_eq!(m.load_u8(extra + 1, Ordering::Relaxed), 0, "one extra slot");
            assert_eq!(
                m.load_u8(extra + 4, Ordering::Relaxed),
                XEN_NETIF_GSO_TYPE_TCPV4
            );
            gso_size = Some(m.load_u16(extra + 2, Ordering::Relaxed));
            extras = 1;
        }
        let mut slots = vec![(gref, offset, id, 0)];
        let mut more = flags & NETTXF_MORE_DATA != 0;
        while more {
            let at = self.tx.take().expect("a packet's slots published together");
            let (gref, offset, next_flags, id, size) = slot(at);
            slots.push((gref, offset, id, size));
            more = next_flags & NETTXF_MORE_DATA != 0;
        }
        let rest: usize = slots.iter().map(|s| s.3).sum();
        slots[0].3 = total
            .checked_sub(rest)
            .expect("the first slot's size is the total");
        let mut packet = Vec::with_capacity(total);
        for &(gref, offset, _, size) in &slots {
            assert!(offset + size <= 4096, "no slot crosses its page");
            let mut bytes = vec![0; size];
            self.pages[&gref].read_bytes(offset, &mut bytes);
            packet.extend_from_slice(&bytes);
        }
        for (i, &(_, _, id, _)) in slots.iter().enumerate() {
            let at = self.tx.respond_at();
            m.store_u16(at, id, Ordering::Relaxed);
            m.store_u16(at + 2, 0, Ordering::Relaxed);
            if i == 0 {
                for _ in 0..extras {
                    let at = self.tx.respond_at();
                    m.store_u16(at + 2, NETIF_RSP_NULL as u16, Ordering::Relaxed);
                }
            }
        }
        self.tx.publish();
        self.tx_gso += extras;
        if flags & NETTXF_CSUM_BLANK != 0 && !partial_checksum_completes(&packet) {
            self.tx_bad_partial += 1;
        }
        Some(Sent {
            id,
            packet,
            flags,
            gso_size,
        })
    }

    pub fn tx_response(&mut self, id: u16, status: i16) {
        let at = self.tx.respond_at();
        self.tx.mem.store_u16(at, id, Ordering::Relaxed);
        self.tx
            .mem
            .store_u16(at + 2, status as u16, Ordering::Relaxed);
        self.tx.publish();
    }

    /// Copies `frame` into the next posted rx page (a jumbo frame over as many pages
    /// as it takes, [`Side::deliver_packet`]); false when too few are posted.
    pub fn deliver(&mut self, frame: &[u8]) -> bool {
        if frame.len() > 4096 {
            return self.deliver_packet(frame, 0, None);
        }
        let Some(at) = self.rx.take() else {
            return false;
        };
        let id = self.rx.mem.load_u16(at, Ordering::Relaxed);
        let gref = self.rx.mem.load_u32(at + 4, Ordering::Relaxed);
        self.pages[&gref].write_bytes(0, frame);
        self.rx_response(id, 0, 0, frame.len() as i16);
        true
    }

    /// Requests posted and not yet taken.
    pub fn rx_posted(&self) -> u32 {
        self.rx
            .mem
            .load_u32(sring::REQ_PROD, Ordering::Acquire)
            .wrapping_sub(self.rx.req_cons)
    }

    /// Lays `packet` over posted rx pages as netback's `rx.c` does: whole pages from
    /// offset 0, `more_data` on all but the last, `flags` (the checksum flags) and
    /// `extra_info` on the first, the GSO extra slot right after the first when
    /// `gso_size` is given. False (nothing taken) when too few pages are posted.
    pub fn deliver_packet(&mut self, packet: &[u8], flags: u16, gso_size: Option<u16>) -> bool {
        self.deliver_hashed(packet, flags, gso_size, None)
    }

    /// [`Side::deliver_packet`], with a hash extra slot (IPv4/TCP, Toeplitz) after the
    /// GSO one when `hash` is given, as netback orders its extras.
    pub fn deliver_hashed(
        &mut self,
        packet: &[u8],
        flags: u16,
        gso_size: Option<u16>,
        hash: Option<u32>,
    ) -> bool {
        let chunks: Vec<&[u8]> = packet.chunks(4096).collect();
        let extras = usize::from(gso_size.is_some()) + usize::from(hash.is_some());
        let needed = chunks.len() + extras;
        if (self.rx_posted() as usize) < needed || chunks.is_empty() {
            return false;
        }
        for (i, chunk) in chunks.iter().enumerate() {
            let at = self.rx.take().unwrap();
            let id = self.rx.mem.load_u16(at, Ordering::Relaxed);
            let gref = self.rx.mem.load_u32(at + 4, Ordering::Relaxed);
            self.pages[&gref].write_bytes(0, chunk);
            let mut f = if i + 1 < chunks.len() {
                NETRXF_MORE_DATA
            } else {
                0
            };
            if i == 0 {
                f |= flags;
                if extras > 0 {
                    f |= NETRXF_EXTRA_INFO;
                }
            }
            self.rx_response_unpublished(id, 0, f, chunk.len() as i16);
            if i == 0 {
                if let Some(size) = gso_size {
                    self.rx.take().unwrap();
                    let more = if hash.is_some() {
                        XEN_NETIF_EXTRA_FLAG_MORE
                    } else {
                        0
                    };
                    self.rx_extra_unpublished(
                        XEN_NETIF_EXTRA_TYPE_GSO,
                        more,
                        size,
                        XEN_NETIF_GSO_TYPE_TCPV4,
                    );
                }
                if let Some(value) = hash {
                    self.rx.take().unwrap();
                    self.rx_hash_unpublished(0, HASH_TYPE_BIT_IPV4_TCP, 1, value);
                }
            }
        }
        // netback publishes a packet whole.
        self.rx.publish();
        true
    }

    /// A hash extra slot in the next slot (its request taken by the caller).
    pub fn rx_hash(&mut self, flags: u8, kind: u8, alg: u8, value: u32) {
        self.rx_hash_unpublished(flags, kind, alg, value);
        self.rx.publish();
    }

    fn rx_hash_unpublished(&mut self, flags: u8, kind: u8, alg: u8, value: u32) {
        let at = self.rx.respond_at();
        let m = self.rx.mem;
        m.store_u8(at, XEN_NETIF_EXTRA_TYPE_HASH, Ordering::Relaxed);
        m.store_u8(at + 1, flags, Ordering::Relaxed);
        m.store_u8(at + 2, kind, Ordering::Relaxed);
        m.store_u8(at + 3, alg, Ordering::Relaxed);
        m.store_u32(at + 4, value, Ordering::Relaxed);
    }

    /// An extra-info response in the next slot (its request taken by the caller).
    pub fn rx_extra(&mut self, kind: u8, flags: u8, gso_size: u16, gso_type: u8) {
        self.rx_extra_unpublished(kind, flags, gso_size, gso_type);
        self.rx.publish();
    }

    fn rx_extra_unpublished(&mut self, kind: u8, flags: u8, gso_size: u16, gso_type: u8) {
        let at = self.rx.respond_at();
        let m = self.rx.mem;
        m.store_u8(at, kind, Ordering::Relaxed);
        m.store_u8(at + 1, flags, Ordering::Relaxed);
        m.store_u16(at + 2, gso_size, Ordering::Relaxed);
        m.store_u8(at + 4, gso_type, Ordering::Relaxed);
        m.store_u8(at + 5, 0, Ordering::Relaxed);
        m.store_u16(at + 6, 0, Ordering::Relaxed);
    }

    pub fn rx_response(&mut self, id: u16, offset: u16, flags: u16, status: i16) {
        self.rx_response_unpublished(id, offset, flags, status);
        self.rx.publish();
    }

    fn rx_response_unpublished(&mut self, id: u16, offset: u16, flags: u16, status: i16) {
        let at = self.rx.respond_at();
        let m = self.rx.mem;
        m.store_u16(at, id, Ordering::Relaxed);
        m.store_u16(at + 2, offset, Ordering::Relaxed);
        m.store_u16(at + 4, flags, Ordering::Relaxed);
        m.store_u16(at + 6, status as u16, Ordering::Relaxed);
    }
}

/// Carries every waiting packet from each side to the other (a two-port switch), a
/// GSO packet whole, as netback carries one between guests. Returns how many moved.
pub fn switch(a: &mut Side, b: &mut Side) -> usize {
    let mut moved = 0;
    while let Some(sent) = a.transmitted_packet() {
        moved += usize::from(b.pass(&sent));
    }
    while let Some(sent) = b.transmitted_packet() {
        moved += usize::from(a.pass(&sent));
    }
    moved
}

impl Side {
    /// Delivers what the other side sent, as netback passes a packet between guests: a
    /// GSO packet whole with its GSO size, a checksum left blank (the pseudo-header's
    /// sum, which the receiver does not check) flagged so, a jumbo frame over pages.
    pub fn pass(&mut self, sent: &Sent) -> bool {
        if sent.flags & NETTXF_CSUM_BLANK != 0 {
            self.deliver_packet(
                &sent.packet,
                NETRXF_CSUM_BLANK | NETRXF_DATA_VALIDATED,
                sent.gso_size,
            )
        } else {
            self.deliver(&sent.packet)
        }
    }
}

/// Completes the TCP checksum of an IPv4 packet sent with `NETTXF_csum_blank` (the
/// field holds the pseudo-header's sum; the sum of the segment from the TCP header on
/// is what goes there, complemented), then checks it as a receiver would.
pub fn partial_checksum_completes(packet: &[u8]) -> bool {
    use smoltcp::wire::{EthernetFrame, Ipv4Packet, TcpPacket};
    let Some((ihl, _)) = tcp_offsets(packet) else {
        return false;
    };
    let mut packet = packet.to_vec();
    let start = 14 + ihl;
    let mut sum = 0u32;
    for pair in packet[start..].chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    packet[start + 16..start + 18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let eth = EthernetFrame::new_checked(&packet[..]).unwrap();
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    let (src, dst) = (ip.src_addr().into(), ip.dst_addr().into());
    ip.verify_checksum()
        && TcpPacket::new_checked(ip.payload())
            .unwrap()
            .verify_checksum(&src, &dst)
}

/// An Ethernet + IPv4 + TCP frame from `src`:`src_port` to `dst`:`dst_port` carrying
/// `payload`, checksums filled in; each end's MAC is 00:16:3e:00:00 and its address's
/// last byte (as [`stack`] gives them).
pub fn tcp_frame(
    src: [u8; 4],
    src_port: u16,
    dst: [u8; 4],
    dst_port: u16,
    payload: &[u8],
) -> Vec<u8> {
    tcp_segment((src, src_port), (dst, dst_port), Fields::default(), payload)
}

/// A TCP segment's fields other than its ends and payload.
#[derive(Clone, Copy)]
pub struct Fields {
    pub seq: u32,
    pub ack: u32,
    pub psh: bool,
    /// A timestamp option with this value.
    pub tsval: Option<u32>,
}

impl Default for Fields {
    fn default() -> Self {
        Self {
            seq: 1000,
            ack: 2000,
            psh: false,
            tsval: None,
        }
    }
}

/// [`tcp_frame`] from `from` to `to` (address, port) with `fields`.
pub fn tcp_segment(
    from: ([u8; 4], u16),
    to: ([u8; 4], u16),
    fields: Fields,
    payload: &[u8],
) -> Vec<u8> {
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpProtocol, Ipv4Address,
        Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber, TcpTimestampRepr,
    };
    let ((src, src_port), (dst, dst_port)) = (from, to);
    let tcp = TcpRepr {
        src_port,
        dst_port,
        control: if fields.psh {
            TcpControl::Psh
        } else {
            TcpControl::None
        },
        seq_number: TcpSeqNumber(fields.seq as i32),
        ack_number: Some(TcpSeqNumber(fields.ack as i32)),
        window_len: 1000,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: fields.tsval.map(|v| TcpTimestampRepr::new(v, 0)),
        payload,
    };
    let (src_ip, dst_ip) = (Ipv4Address::from(src), Ipv4Address::from(dst));
    let ip = Ipv4Repr {
        src_addr: src_ip,
        dst_addr: dst_ip,
        next_header: IpProtocol::Tcp,
        payload_len: tcp.buffer_len(),
        hop_limit: 64,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress([0, 0x16, 0x3e, 0, 0, src[3]]),
        dst_addr: EthernetAddress([0, 0x16, 0x3e, 0, 0, dst[3]]),
        ethertype: EthernetProtocol::Ipv4,
    };
    let mut frame = vec![0u8; eth.buffer_len() + ip.buffer_len() + tcp.buffer_len()];
    let caps = ChecksumCapabilities::default();
    let mut e = EthernetFrame::new_unchecked(&mut frame[..]);
    eth.emit(&mut e);
    let mut i = Ipv4Packet::new_unchecked(e.payload_mut());
    ip.emit(&mut i, &caps);
    let mut t = TcpPacket::new_unchecked(i.payload_mut());
    tcp.emit(&mut t, &src_ip.into(), &dst_ip.into(), &caps);
    frame
}

/// What a test leaks to get the `'static` buffers smoltcp's sockets and stack borrow.
pub fn leak<T>(value: T) -> &'static mut T {
    Box::leak(Box::new(value))
}

/// A stack at 10.9.0.`ip_last`/24 (MAC 00:16:3e:00:00:`mac_last`) over a fresh vif queue
/// with its rx pages posted, room for `sockets` sockets, and the netback side of it.
pub fn stack(
    first_gref: u32,
    mac_last: u8,
    ip_last: u8,
    sockets: usize,
) -> (netfront::stack::Stack, Side) {
    stack_at_mtu(
        first_gref,
        mac_last,
        ip_last,
        sockets,
        netfront::DEFAULT_MTU,
    )
}

/// [`stack`] at an MTU of `mtu` bytes.
pub fn stack_at_mtu(
    first_gref: u32,
    mac_last: u8,
    ip_last: u8,
    sockets: usize,
    mtu: usize,
) -> (netfront::stack::Stack, Side) {
    let ip = netfront::stack::Addressing::Static(netfront::stack::Ipv4Setup {
        address: [10, 9, 0, ip_last],
        prefix: 24,
        gateway: None,
    });
    stack_configured(first_gref, mac_last, ip, sockets, mtu)
}

/// [`stack`] with its address from `addressing`.
pub fn stack_with(
    first_gref: u32,
    mac_last: u8,
    addressing: netfront::stack::Addressing,
    sockets: usize,
) -> (netfront::stack::Stack, Side) {
    stack_configured(
        first_gref,
        mac_last,
        addressing,
        sockets,
        netfront::DEFAULT_MTU,
    )
}

fn stack_configured(
    first_gref: u32,
    mac_last: u8,
    addressing: netfront::stack::Addressing,
    sockets: usize,
    mtu: usize,
) -> (netfront::stack::Stack, Side) {
    use smoltcp::iface::SocketStorage;
    let (mut q, side) = queue(first_gref);
    q.post_rx();
    let storage: Vec<SocketStorage<'static>> = (0..sockets).map(|_| SocketStorage::EMPTY).collect();
    let mac = [0x00, 0x16, 0x3e, 0, 0, mac_last];
    let mut device = netfront::NetDevice::new(q);
    device.set_mtu(mtu);
    let stack = netfront::stack::Stack::new(
        device,
        mac,
        addressing,
        u64::from(mac_last),
        0,
        Box::leak(storage.into_boxed_slice()),
    );
    (stack, side)
}

/// dom0's side of GSO, for tests: joins back-to-back TCP segments of one flow into one
/// IPv4 packet of up to 64 KiB, as GRO and TSO hand netback, and delivers it as a GSO
/// packet (`csum_blank | data_validated`, the TCP checksum left blank, as for a
/// `CHECKSUM_PARTIAL` packet). Anything else, and a segment nothing joined, goes as it
/// came (no flags, its own checksum).
#[derive(Default)]
pub struct Coalescer {
    /// The packet being built and its largest segment's payload (the GSO size).
    pending: Option<(Vec<u8>, u16)>,
    segments: usize,
    /// A segment was joined since the last [`Coalescer::idle`].
    grew: bool,
    /// GSO packets delivered, and the longest.
    pub gso_packets: usize,
    pub longest: usize,
}

/// A TCP segment's offsets in its frame: (IP header length, TCP header length).
fn tcp_offsets(frame: &[u8]) -> Option<(usize, usize)> {
    if frame.len() < 54 || frame[12..14] != [0x08, 0x00] || frame[23] != 6 {
        return None;
    }
    let ihl = usize::from(frame[14] & 0xf) * 4;
    let thl = usize::from(frame[14 + ihl + 12] >> 4) * 4;
    let total = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    (14 + total == frame.len() && 14 + ihl + thl <= frame.len()).then_some((ihl, thl))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A data segment with only ACK (and PSH): one that may be joined.
fn joinable(frame: &[u8]) -> Option<(usize, usize)> {
    let (ihl, thl) = tcp_offsets(frame)?;
    let flags = frame[14 + ihl + 13];
    (flags & !0x18 == 0 && frame.len() > 14 + ihl + thl).then_some((ihl, thl))
}

fn ipv4_header_checksum(header: &mut [u8]) {
    header[10..12].fill(0);
    let mut sum = 0u32;
    for pair in header.chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    header[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

impl Coalescer {
    /// Takes one frame bound for `to`.
    pub fn push(&mut self, frame: Vec<u8>, to: &mut Side) {
        let Some((ihl, thl)) = joinable(&frame) else {
            self.flush(to);
            to.deliver(&frame);
            return;
        };
        let head = 14 + ihl + thl;
        let payload = frame.len() - head;
        if let Some((pending, mss)) = &mut self.pending {
            let same_flow = tcp_offsets(pending) == Some((ihl, thl))
                && pending[26..34] == frame[26..34]
                && pending[14 + ihl..14 + ihl + 4] == frame[14 + ihl..14 + ihl + 4];
            let next = be32(pending, 14 + ihl + 4).wrapping_add((pending.len() - head) as u32)
                == be32(&frame, 14 + ihl + 4);
            if same_flow && next && pending.len() + payload <= 14 + 65535 {
                // The later segment's header (its ack, window, options), the first's
                // sequence number, both payloads.
                let seq = be32(pending, 14 + ihl + 4);
                let mut joined = frame[..head].to_vec();
                joined[14 + ihl + 4..14 + ihl + 8].copy_from_slice(&seq.to_be_bytes());
                joined.extend_from_slice(&pending[head..]);
                joined.extend_from_slice(&frame[head..]);
                let total = (joined.len() - 14) as u16;
                joined[16..18].copy_from_slice(&total.to_be_bytes());
                *pending = joined;
                *mss = (*mss).max(payload as u16);
                self.segments += 1;
                self.grew = true;
                return;
            }
        }
        self.flush(to);
        self.pending = Some((frame, payload as u16));
        self.segments = 1;
        self.grew = true;
    }

    /// Called once per step: delivers what is being built unless it grew meanwhile (as
    /// GRO holds a flow's segments while more keep coming).
    pub fn idle(&mut self, to: &mut Side) {
        if !std::mem::take(&mut self.grew) {
            self.flush(to);
        }
    }

    /// Delivers what is being built.
    pub fn flush(&mut self, to: &mut Side) {
        let Some((mut packet, mss)) = self.pending.take() else {
            return;
        };
        if self.segments == 1 {
            to.deliver(&packet);
            return;
        }
        let (ihl, _) = tcp_offsets(&packet).expect("built from TCP segments");
        let total = (packet.len() - 14) as u16;
        packet[16..18].copy_from_slice(&total.to_be_bytes());
        ipv4_header_checksum(&mut packet[14..14 + ihl]);
        // Blank, as a CHECKSUM_PARTIAL packet's is (not the sum of what it carries).
        packet[14 + ihl + 16..14 + ihl + 18].fill(0);
        let flags = NETRXF_CSUM_BLANK | NETRXF_DATA_VALIDATED;
        if to.deliver_packet(&packet, flags, Some(mss)) {
            self.gso_packets += 1;
            self.longest = self.longest.max(packet.len());
        }
    }
}
