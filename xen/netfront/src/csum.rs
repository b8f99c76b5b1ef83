// SPDX-License-Identifier: MIT OR Apache-2.0
//! The TCP/UDP checksum of a received frame, checked here rather than by smoltcp: its
//! checksum settings are per device, and with checksum offload on (GSO needs it) dom0
//! hands over some packets with the checksum blank, flagged, and others with the
//! sender's. The device has smoltcp skip TCP and UDP on receive; a frame without the
//! flags comes here first.
//!
//! The frame is taken apart with smoltcp's own `wire` checks, so the bytes checked are
//! exactly those smoltcp will read as the segment or datagram.
//!
//! On send smoltcp leaves the TCP checksum to the device too: when netback takes GSO
//! packets a TCP frame goes with the pseudo-header's sum only and `csum_blank`
//! ([`fill_partial_tcp_checksum`]; the checksum over the data is done once, by dom0 or
//! a NIC, or never when dom0's own stack takes it), and otherwise it is filled in here
//! ([`fill_tcp_checksum`]).

use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};

/// The one's-complement sum of `bytes` as 16-bit big-endian words (an odd last byte
/// padded with zero), added to `sum`, not folded.
fn add_words(mut sum: u32, bytes: &[u8]) -> u32 {
    for pair in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    sum
}

/// `sum` folded to 16 bits.
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The IPv4 TCP segment in `frame` as (its IPv4 header's offset and length, the TCP
/// segment's length); `None` for any other frame.
fn ipv4_tcp(frame: &[u8]) -> Option<(usize, usize, usize)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let header = usize::from(ip.header_len());
    let segment = ip.payload().len();
    TcpPacket::new_checked(ip.payload()).ok()?;
    Some((EthernetFrame::<&[u8]>::header_len(), header, segment))
}

/// Writes the pseudo-header's sum (not complemented) into an IPv4 TCP frame's
/// checksum, as a `CHECKSUM_PARTIAL` packet has it for whoever completes it. False,
/// and nothing written, for any other frame.
pub fn fill_partial_tcp_checksum(frame: &mut [u8]) -> bool {
    let Some((ip, header, segment)) = ipv4_tcp(frame) else {
        return false;
    };
    // Source and destination addresses, the protocol, the segment's length.
    let sum = add_words(6 + segment as u32, &frame[ip + 12..ip + 20]);
    let at = ip + header + 16;
    frame[at..at + 2].copy_from_slice(&fold(sum).to_be_bytes());
    true
}

/// Fills in an IPv4 TCP frame's checksum; other frames are left as they are.
pub fn fill_tcp_checksum(frame: &mut [u8]) {
    let Some((ip, header, segment)) = ipv4_tcp(frame) else {
        return;
    };
    let (head, segment) = frame[ip..ip + header + segment].split_at_mut(header);
    let ip = Ipv4Packet::new_unchecked(&*head);
    let (src, dst) = (ip.src_addr().into(), ip.dst_addr().into());
    TcpPacket::new_unchecked(segment).fill_checksum(&src, &dst);
}

/// False when `frame` is an IPv4 TCP segment or UDP datagram whose checksum is wrong.
/// Anything else (not IPv4, not TCP or UDP, or too short to be what it says, which
/// smoltcp drops) is left to smoltcp.
pub fn transport_checksum_ok(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return true;
    };
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return true;
    }
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
        return true;
    };
    let (src, dst) = (ip.src_addr().into(), ip.dst_addr().into());
    match ip.next_header() {
        IpProtocol::Tcp => {
            TcpPacket::new_checked(ip.payload()).map_or(true, |tcp| tcp.verify_checksum(&src, &dst))
        }
        IpProtocol::Udp => {
            UdpPacket::new_checked(ip.payload()).map_or(true, |udp| udp.verify_checksum(&src, &dst))
        }
        _ => true,
    }
}
