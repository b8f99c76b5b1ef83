// SPDX-License-Identifier: MIT OR Apache-2.0
//! The joiner of segments on send (`netfront::tso`), on frames as smoltcp builds them:
//! what is joined and what is not, the order a connection's bytes keep, the 64 KiB cap,
//! and each packet's partial checksum completed and checked as dom0 would.

mod fake_netback;

use fake_netback::{partial_checksum_completes, tcp_segment, Fields};
use netfront::csum::fill_partial_tcp_checksum;
use netfront::tso::{JoinStats, Joiner, OPEN_PACKETS};
use netfront::{Offload, MAX_TX_PACKET};
use smoltcp::wire::Ipv4Packet;

const MSS: usize = 1460;
const ETHERNET: usize = 14;
const TCP: usize = 34;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;

/// A segment of connection `port` (its source port) at `seq`, checksums filled in.
fn segment(port: u16, seq: u32, payload: &[u8], psh: bool, tsval: Option<u32>) -> Vec<u8> {
    let fields = Fields {
        seq,
        ack: 77 + seq,
        psh,
        tsval,
    };
    tcp_segment(
        ([10, 9, 0, 1], port),
        ([10, 9, 0, 2], 4420),
        fields,
        payload,
    )
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// What a joiner sent: (packet, what netback is to finish).
fn run(frames: &[Vec<u8>]) -> (Vec<(Vec<u8>, Offload)>, JoinStats) {
    let mut joiner = Joiner::new();
    let mut sent = Vec::new();
    let mut send = |p: &[u8], offload| sent.push((p.to_vec(), offload));
    for f in frames {
        joiner.take(&mut f.clone(), &mut send);
    }
    joiner.flush(&mut send);
    (sent, joiner.stats)
}

/// `frame` as it goes out alone: the pseudo-header's sum in its TCP checksum.
fn partial(frame: &[u8]) -> (Vec<u8>, Offload) {
    let mut frame = frame.to_vec();
    assert!(fill_partial_tcp_checksum(&mut frame));
    assert!(partial_checksum_completes(&frame));
    (frame, Offload::Checksum)
}

#[test]
fn back_to_back_segments_become_one_packet_with_a_partial_checksum() {
    let data = bytes(3 * MSS + 100, 5);
    let frames: Vec<_> = data
        .chunks(MSS)
        .enumerate()
        .map(|(i, chunk)| segment(5000, 1000 + (i * MSS) as u32, chunk, false, None))
        .collect();
    let (sent, stats) = run(&frames);
    assert_eq!(sent.len(), 1);
    let (packet, gso) = &sent[0];
    assert_eq!(*gso, Offload::Segments(MSS as u16));
    assert_eq!(
        stats,
        JoinStats {
            packets: 1,
            segments: 4
        }
    );
    assert_eq!(packet.len(), 54 + data.len());
    assert_eq!(&packet[54..], &data[..]);
    assert_eq!(
        be32(packet, TCP + 4),
        1000,
        "the first segment's sequence number"
    );
    assert_eq!(
        be32(packet, TCP + 8),
        77 + 1000 + 3 * MSS as u32,
        "the last one's ack"
    );
    assert!(partial_checksum_completes(packet));
}

#[test]
fn a_lone_segment_goes_out_with_its_partial_checksum_only() {
    let frame = segment(5000, 1, &bytes(MSS, 1), false, None);
    let (sent, stats) = run(std::slice::from_ref(&frame));
    assert_eq!(sent, vec![partial(&frame)]);
    assert_ne!(sent[0].0, frame, "smoltcp's checksum replaced");
    assert_eq!(stats, JoinStats::default());
}

#[test]
fn a_gap_a_longer_segment_or_other_options_start_a_new_packet() {
    let a = segment(5000, 0, &bytes(MSS, 1), false, None);
    let gap = segment(5000, MSS as u32 + 1, &bytes(MSS, 2), false, None);
    let longer = segment(5000, 0, &bytes(100, 1), false, None);
    let after_longer = segment(5000, 100, &bytes(MSS, 2), false, None);
    let stamped = segment(5000, MSS as u32, &bytes(MSS, 2), false, Some(9));
    for (first, second) in [(&a, &gap), (&longer, &after_longer), (&a, &stamped)] {
        let (sent, stats) = run(&[first.clone(), second.clone()]);
        assert_eq!(sent, vec![partial(first), partial(second)]);
        assert_eq!(stats.packets, 0);
    }
}

#[test]
fn psh_or_a_short_segment_sends_the_packet_at_once_and_order_is_kept() {
    let first = segment(5000, 0, &bytes(MSS, 1), false, None);
    let last = segment(5000, MSS as u32, &bytes(10, 2), true, None);
    let ack = segment(5000, MSS as u32 + 10, &[], false, None);
    let mut joiner = Joiner::new();
    let mut sent = Vec::new();
    let mut send = |p: &[u8], offload| sent.push((p.len(), offload));
    joiner.take(&mut first.clone(), &mut send);
    joiner.take(&mut last.clone(), &mut send);
    assert_eq!(joiner.open_count(), 0, "sent before the flush");
    joiner.take(&mut first.clone(), &mut send);
    joiner.take(&mut ack.clone(), &mut send);
    assert_eq!(
        sent,
        vec![
            (54 + MSS + 10, Offload::Segments(MSS as u16)),
            (54 + MSS, Offload::Checksum),
            (54, Offload::Checksum)
        ],
        "the open segment before its connection's pure ACK"
    );
    // PSH on the last segment, as GSO puts it on the last of the cut segments.
    let (sent, _) = run(&[first.clone(), last.clone()]);
    assert_eq!(sent[0].0[TCP + 13], TCP_ACK | TCP_PSH);
}

#[test]
fn connections_join_apart_and_a_fifth_sends_the_oldest() {
    let mut frames = Vec::new();
    for round in 0..2u32 {
        for port in 0..OPEN_PACKETS as u16 {
            frames.push(segment(
                5000 + port,
                round * MSS as u32,
                &bytes(MSS, 3),
                false,
                None,
            ));
        }
    }
    frames.push(segment(6000, 0, &bytes(MSS, 4), false, None));
    let mut joiner = Joiner::new();
    let mut sent = Vec::new();
    for f in &frames {
        joiner.take(&mut f.clone(), &mut |p, o| {
            sent.push((p[TCP..TCP + 2].to_vec(), o))
        });
    }
    let first = (
        5000u16.to_be_bytes().to_vec(),
        Offload::Segments(MSS as u16),
    );
    assert_eq!(sent, vec![first]);
    assert_eq!(joiner.open_count(), OPEN_PACKETS);
    joiner.flush(&mut |p, o| sent.push((p[TCP..TCP + 2].to_vec(), o)));
    assert_eq!(sent.len(), 1 + OPEN_PACKETS);
    assert_eq!(
        joiner.stats,
        JoinStats {
            packets: 4,
            segments: 8
        }
    );
}

#[test]
fn a_packet_stops_at_64_kib() {
    let data = bytes(50 * MSS, 7);
    let frames: Vec<_> = data
        .chunks(MSS)
        .enumerate()
        .map(|(i, chunk)| segment(5000, (i * MSS) as u32, chunk, false, None))
        .collect();
    let (sent, _) = run(&frames);
    let per_packet = (MAX_TX_PACKET - 54) / MSS;
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].0.len(), 54 + per_packet * MSS);
    assert_eq!(sent[1].0.len(), 54 + (50 - per_packet) * MSS);
    let joined: Vec<u8> = sent.iter().flat_map(|(p, _)| p[54..].to_vec()).collect();
    assert_eq!(joined, data);
    assert!(sent.iter().all(|(p, _)| partial_checksum_completes(p)));
}

#[test]
fn other_frames_pass_as_they_come() {
    let mut arp = vec![0xffu8; 42];
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let mut syn = segment(5000, 0, &[], false, None);
    syn[TCP + 13] = 0x02;
    let mut fragment = segment(5000, 0, &bytes(MSS, 1), false, None);
    fragment[ETHERNET + 6] |= 0x20;
    Ipv4Packet::new_unchecked(&mut fragment[ETHERNET..]).fill_checksum();
    let (sent, _) = run(&[arp.clone(), syn.clone(), fragment.clone()]);
    assert_eq!(
        sent,
        vec![(arp, Offload::None), partial(&syn), partial(&fragment)]
    );
}
