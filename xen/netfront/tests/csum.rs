// SPDX-License-Identifier: MIT OR Apache-2.0
//! The netfront's own TCP/UDP checksum check (`netfront::csum`) on frames built with
//! smoltcp.

mod fake_netback;

use fake_netback::tcp_frame;
use netfront::csum::transport_checksum_ok;

/// blkdom's address and a target's, the frame from the first to the second.
fn frame(payload: &[u8]) -> Vec<u8> {
    tcp_frame([10, 9, 0, 2], 4420, [10, 9, 0, 1], 50000, payload)
}

#[test]
fn a_right_checksum_passes_and_any_flipped_bit_fails() {
    let frame = frame(&[7u8; 3000]);
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
    let mut arp = frame(b"x");
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    arp[40] ^= 1;
    assert!(transport_checksum_ok(&arp));
    assert!(transport_checksum_ok(&[0u8; 10]));
    let mut short = frame(b"hello");
    short.truncate(30);
    assert!(transport_checksum_ok(&short));
}
