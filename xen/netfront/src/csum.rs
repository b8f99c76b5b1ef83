// SPDX-License-Identifier: MIT OR Apache-2.0
//! The TCP/UDP checksum of a received frame, checked here rather than by smoltcp: its
//! checksum settings are per device, and with checksum offload on (GSO needs it) dom0
//! hands over some packets with the checksum blank, flagged, and others with the
//! sender's. The device has smoltcp skip TCP and UDP on receive; a frame without the
//! flags comes here first.
//!
//! The frame is taken apart with smoltcp's own `wire` checks, so the bytes checked are
//! exactly those smoltcp will read as the segment or datagram.

use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};

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
