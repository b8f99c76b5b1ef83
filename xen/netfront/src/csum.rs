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

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetRepr, IpAddress, Ipv4Address, Ipv4Repr, TcpRepr, TcpSeqNumber,
    };

    /// An Ethernet + IPv4 + TCP frame carrying `payload`, checksums filled in.
    fn tcp_frame(payload: &[u8]) -> Vec<u8> {
        let (src, dst) = (Ipv4Address::new(10, 9, 0, 2), Ipv4Address::new(10, 9, 0, 1));
        let tcp = TcpRepr {
            src_port: 4420,
            dst_port: 50000,
            control: smoltcp::wire::TcpControl::None,
            seq_number: TcpSeqNumber(1000),
            ack_number: Some(TcpSeqNumber(2000)),
            window_len: 1000,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let ip = Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let eth = EthernetRepr {
            src_addr: EthernetAddress([0, 0x16, 0x3e, 0, 0, 2]),
            dst_addr: EthernetAddress([0, 0x16, 0x3e, 0, 0, 1]),
            ethertype: EthernetProtocol::Ipv4,
        };
        let mut frame = vec![0u8; 14 + ip.buffer_len() + tcp.buffer_len()];
        let caps = ChecksumCapabilities::default();
        let mut e = EthernetFrame::new_unchecked(&mut frame[..]);
        eth.emit(&mut e);
        let mut i = Ipv4Packet::new_unchecked(e.payload_mut());
        ip.emit(&mut i, &caps);
        let mut t = TcpPacket::new_unchecked(i.payload_mut());
        tcp.emit(&mut t, &IpAddress::Ipv4(src), &IpAddress::Ipv4(dst), &caps);
        frame
    }

    #[test]
    fn a_right_checksum_passes_and_any_flipped_bit_fails() {
        let frame = tcp_frame(&[7u8; 3000]);
        assert!(transport_checksum_ok(&frame));
        // Any byte of the TCP header or payload (past the IP header).
        for at in [34, 40, 50, 54, 1000, frame.len() - 1] {
            let mut bad = frame.clone();
            bad[at] ^= 0x10;
            assert!(!transport_checksum_ok(&bad), "byte {at}");
        }
    }

    #[test]
    fn frames_that_are_not_tcp_or_udp_over_ipv4_are_left_to_smoltcp() {
        let mut arp = tcp_frame(b"x");
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        arp[40] ^= 1;
        assert!(transport_checksum_ok(&arp));
        assert!(transport_checksum_ok(&[0u8; 10]));
        let mut short = tcp_frame(b"hello");
        short.truncate(30);
        assert!(transport_checksum_ok(&short));
    }
}
