// SPDX-License-Identifier: MIT OR Apache-2.0
//! Large packets on send. smoltcp cuts a socket's stream into segments of one MSS, and
//! each would cost a tx slot, a page and a grant copy in netback and a packet through
//! dom0's bridge and TCP stack: 1 MiB written is over 700 of them. Netback takes a
//! TCPv4 packet of up to 64 KiB with a GSO size instead, and dom0 cuts it only where it
//! must (its own stack takes it whole). So back-to-back segments of one connection are
//! joined here into one such packet, the packet a TSO-capable NIC is handed.
//!
//! A data segment (ACK, perhaps PSH, nothing else; no IP options or fragments) joins its
//! connection's open packet when it starts at the sequence number where that packet
//! ends, is no longer than the packet's first segment (the GSO size), carries the same
//! TCP options and the same IP header bar the length, id and checksum, and fits in
//! [`MAX_TX_PACKET`]. The packet keeps its first segment's IP header and sequence number
//! and takes each joining segment's acknowledgement, window and flags (the latest are
//! the truest; PSH ends the packet, as it is the last segment's). A segment shorter than
//! the GSO size or with PSH closes the packet, which is sent at once; so does any other
//! segment of that connection, sent after it, so one connection's bytes keep their
//! order. Other frames go out as they come.
//!
//! At most [`OPEN_PACKETS`] connections have an open packet; a fifth sends the oldest.
//! [`Joiner::flush`] sends them all, and the stack calls it after each poll: a segment
//! waits only for the segments smoltcp builds in the same poll. Every TCP frame leaves
//! with the pseudo-header's sum in its checksum for netback to complete
//! ([`Offload::Checksum`]; smoltcp computes none); a joined packet also with its IPv4
//! length and header checksum set ([`Offload::Segments`]).

use crate::csum::fill_partial_tcp_checksum;
use crate::queue::{heap_buffer, Offload, ETHERNET_HEADER as ETHERNET, MAX_TX_PACKET};
use alloc::boxed::Box;
use smoltcp::wire::Ipv4Packet;

/// Connections with a packet being joined at once.
pub const OPEN_PACKETS: usize = 4;

const IPV4: usize = 20;
/// Where the TCP header starts (an IPv4 header without options).
const TCP: usize = ETHERNET + IPV4;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;

/// What the joiner counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinStats {
    /// Packets of two segments or more sent.
    pub packets: u64,
    /// The segments in them.
    pub segments: u64,
}

/// A TCP segment's fields, read from its frame.
#[derive(Clone, Copy, Debug)]
struct Segment {
    /// Ethernet, IPv4 and TCP headers.
    head: usize,
    seq: u32,
    flags: u8,
    payload: usize,
}

impl Segment {
    /// An IPv4 TCP segment without IP options or fragmentation; `None` for any other frame.
    fn parse(frame: &[u8]) -> Option<Self> {
        if frame.len() < TCP + 20
            || frame[12..14] != [0x08, 0x00]
            || frame[ETHERNET] != 0x45
            || frame[ETHERNET + 9] != 6
            || u16::from_be_bytes([frame[ETHERNET + 6], frame[ETHERNET + 7]]) & 0x3fff != 0
            || usize::from(u16::from_be_bytes([
                frame[ETHERNET + 2],
                frame[ETHERNET + 3],
            ])) != frame.len() - ETHERNET
        {
            return None;
        }
        let head = TCP + usize::from(frame[TCP + 12] >> 4) * 4;
        (head >= TCP + 20 && head <= frame.len()).then(|| Segment {
            head,
            seq: be32(frame, TCP + 4),
            flags: frame[TCP + 13],
            payload: frame.len() - head,
        })
    }

    /// Data with ACK and at most PSH besides: what may be joined.
    fn is_data(&self) -> bool {
        self.payload > 0 && self.flags & TCP_ACK != 0 && self.flags & !(TCP_ACK | TCP_PSH) == 0
    }
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Whether two frames are segments of one connection: the Ethernet header, the IPv4
/// addresses and the TCP ports.
fn same_connection(a: &[u8], b: &[u8]) -> bool {
    a[..ETHERNET] == b[..ETHERNET]
        && a[ETHERNET + 12..ETHERNET + 20] == b[ETHERNET + 12..ETHERNET + 20]
        && a[TCP..TCP + 4] == b[TCP..TCP + 4]
}

/// One connection's packet being joined.
struct Open {
    buf: Box<[u8; MAX_TX_PACKET]>,
    /// Bytes in `buf`; 0 when nothing is open.
    len: usize,
    head: usize,
    /// The first segment's payload: the GSO size.
    mss: usize,
    segments: u32,
    /// Opened after every other open packet (for choosing which to send to make room).
    age: u64,
}

impl Open {
    fn next_seq(&self) -> u32 {
        be32(&self.buf[..], TCP + 4).wrapping_add((self.len - self.head) as u32)
    }

    /// Whether `frame`, of `segment`, may join this packet.
    fn takes(&self, frame: &[u8], segment: &Segment) -> bool {
        let buf = &self.buf[..];
        segment.head == self.head
            && segment.seq == self.next_seq()
            && segment.payload <= self.mss
            && self.len + segment.payload <= MAX_TX_PACKET
            // The IPv4 header bar its length, id and checksum.
            && buf[ETHERNET..ETHERNET + 2] == frame[ETHERNET..ETHERNET + 2]
            && buf[ETHERNET + 6..ETHERNET + 10] == frame[ETHERNET + 6..ETHERNET + 10]
            && buf[TCP + 20..self.head] == frame[TCP + 20..segment.head]
    }

    /// What netback is to finish of the packet: its checksum (one segment, as it came
    /// with its partial checksum), or that and the cutting.
    fn finish(&mut self) -> Offload {
        if self.segments < 2 {
            return Offload::Checksum;
        }
        let packet = &mut self.buf[..self.len];
        let mut ip = Ipv4Packet::new_unchecked(&mut packet[ETHERNET..]);
        ip.set_total_len((self.len - ETHERNET) as u16);
        ip.fill_checksum();
        // The pseudo-header's sum over the new length, as its first segment had it.
        fill_partial_tcp_checksum(packet);
        Offload::Segments(self.mss as u16)
    }
}

/// The open packets, and where they go: `send(packet, gso_size)`.
pub struct Joiner {
    open: [Open; OPEN_PACKETS],
    opened: u64,
    pub stats: JoinStats,
}

impl Default for Joiner {
    fn default() -> Self {
        Self::new()
    }
}

impl Joiner {
    /// Takes [`OPEN_PACKETS`] buffers of [`MAX_TX_PACKET`] bytes, and nothing after.
    pub fn new() -> Self {
        Self {
            open: core::array::from_fn(|_| Open {
                buf: heap_buffer(),
                len: 0,
                head: 0,
                mss: 0,
                segments: 0,
                age: 0,
            }),
            opened: 0,
            stats: JoinStats::default(),
        }
    }

    /// Packets open now: each may still grow to [`MAX_TX_PACKET`] before it is sent.
    pub fn open_count(&self) -> usize {
        self.open.iter().filter(|o| o.len > 0).count()
    }

    /// Takes one frame smoltcp built, a TCP one without its checksum: joins it, or
    /// sends it (after its connection's open packet) with its partial checksum.
    pub fn take(&mut self, frame: &mut [u8], send: &mut dyn FnMut(&[u8], Offload)) {
        let offload = if fill_partial_tcp_checksum(frame) {
            Offload::Checksum
        } else {
            Offload::None
        };
        let frame = &*frame;
        let Some(segment) = Segment::parse(frame) else {
            return send(frame, offload);
        };
        let mine = self
            .open
            .iter()
            .position(|o| o.len > 0 && same_connection(&o.buf[..], frame));
        if let Some(i) = mine {
            if segment.is_data() && self.open[i].takes(frame, &segment) {
                let open = &mut self.open[i];
                open.buf[open.len..open.len + segment.payload]
                    .copy_from_slice(&frame[segment.head..]);
                open.len += segment.payload;
                open.segments += 1;
                // Acknowledgement, data offset and flags, window.
                open.buf[TCP + 8..TCP + 16].copy_from_slice(&frame[TCP + 8..TCP + 16]);
                if segment.payload < open.mss || segment.flags & TCP_PSH != 0 {
                    self.send_open(i, send);
                }
                return;
            }
            self.send_open(i, send);
        }
        // Only a full-looking data segment without PSH starts a packet: anything else
        // would close it at once.
        if !segment.is_data() || segment.flags & TCP_PSH != 0 {
            return send(frame, offload);
        }
        let i = match self.open.iter().position(|o| o.len == 0) {
            Some(free) => free,
            None => {
                let oldest = (0..OPEN_PACKETS)
                    .min_by_key(|&i| self.open[i].age)
                    .unwrap_or(0);
                self.send_open(oldest, send);
                oldest
            }
        };
        self.opened += 1;
        let open = &mut self.open[i];
        open.buf[..frame.len()].copy_from_slice(frame);
        open.len = frame.len();
        open.head = segment.head;
        open.mss = segment.payload;
        open.segments = 1;
        open.age = self.opened;
    }

    /// Sends every open packet.
    pub fn flush(&mut self, send: &mut dyn FnMut(&[u8], Offload)) {
        for i in 0..OPEN_PACKETS {
            if self.open[i].len > 0 {
                self.send_open(i, send);
            }
        }
    }

    fn send_open(&mut self, i: usize, send: &mut dyn FnMut(&[u8], Offload)) {
        let open = &mut self.open[i];
        let offload = open.finish();
        if open.segments > 1 {
            self.stats.packets += 1;
            self.stats.segments += u64::from(open.segments);
        }
        send(&open.buf[..open.len], offload);
        open.len = 0;
    }
}
