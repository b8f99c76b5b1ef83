// SPDX-License-Identifier: MIT OR Apache-2.0
//! A vif queue against a fake netback: frames both ways, and every check of a
//! misbehaving backend's responses.

mod fake_netback;

use fake_netback::{queue, Side};
use netfront::queue::{
    NetFault, Offload, Received, SendError, MAX_FRAME, MAX_PACKET, MAX_RX_SLOTS, MAX_TX_PACKET,
    MAX_TX_SLOTS,
};
use std::sync::atomic::Ordering;
use xen::abi::netif::*;

fn packet_buffer() -> Box<[u8; MAX_PACKET]> {
    vec![0u8; MAX_PACKET].into_boxed_slice().try_into().unwrap()
}

fn len(received: Result<Option<Received>, NetFault>) -> Result<Option<usize>, NetFault> {
    received.map(|p| p.map(|p| p.len))
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

#[test]
fn frames_go_out_and_come_in_and_pages_are_posted_again() {
    let (mut q, mut back) = queue(100);
    q.post_rx();
    assert!(q.take_notify(), "netback waits for the first rx request");
    for round in 0..600u32 {
        let out = frame(14 + (round as usize * 37) % (MAX_FRAME - 13), round as u8);
        q.send(&out).unwrap();
        let (_, seen) = back.transmitted().unwrap();
        assert_eq!(seen, out);
        // A jumbo frame spans pages, a response each.
        assert_eq!(q.reap_tx(), Ok(out.len().div_ceil(4096) as u32));
        let inbound = frame(60 + round as usize % 1400, !round as u8);
        assert!(
            back.deliver(&inbound),
            "a page is always posted (round {round})"
        );
        let mut buf = packet_buffer();
        assert_eq!(len(q.receive(&mut buf)), Ok(Some(inbound.len())));
        assert_eq!(&buf[..inbound.len()], &inbound[..]);
        assert_eq!(q.receive(&mut buf), Ok(None));
    }
    assert_eq!(
        (q.stats.tx_frames, q.stats.rx_frames, q.stats.rx_dropped),
        (600, 600, 0)
    );
    assert_eq!(q.tx_in_flight(), 0);
}

#[test]
fn frames_outside_the_mtu_are_not_sent_and_a_full_ring_says_so() {
    let (mut q, _back) = queue(100);
    assert_eq!(q.send(&[0; 13]), Err(SendError::BadLength(13)));
    assert_eq!(
        q.send(&[0; MAX_FRAME + 1]),
        Err(SendError::BadLength(MAX_FRAME + 1))
    );
    for _ in 0..254 {
        q.send(&[0; 60]).unwrap();
    }
    // Two pages left: a frame of a page or two, not a jumbo frame of three.
    assert!(q.can_send() && q.can_send_frame(8192));
    assert!(!q.can_send_frame(MAX_FRAME));
    assert_eq!(q.send(&[0; MAX_FRAME]), Err(SendError::Full));
    q.send(&[0; 60]).unwrap();
    q.send(&[0; 60]).unwrap();
    assert!(!q.can_send() && !q.can_send_frame(60));
    assert_eq!(q.send(&[0; 60]), Err(SendError::Full));
}

#[test]
fn a_jumbo_frame_spans_pages_without_an_extra_slot() {
    let (mut q, mut back) = queue(100);
    assert_eq!(MAX_FRAME, 9014);
    let out = frame(MAX_FRAME, 3);
    q.send(&out).unwrap();
    let sent = back.transmitted_packet().unwrap();
    assert_eq!(sent.packet, out);
    assert_eq!((sent.gso_size, back.tx_gso), (None, 0));
    assert_eq!(sent.flags, xen::abi::netif::NETTXF_MORE_DATA);
    assert_eq!(q.reap_tx(), Ok(3));
    assert_eq!(q.tx_in_flight(), 0);
}

#[test]
fn a_tx_response_for_an_id_not_in_flight_stops_the_queue() {
    let (mut q, mut back) = queue(100);
    q.send(&[1; 60]).unwrap();
    back.tx_response(7, 0);
    assert_eq!(q.reap_tx(), Err(NetFault::TxUnknownId { id: 7 }));
    assert_eq!(
        q.send(&[1; 60]),
        Err(SendError::Failed(NetFault::TxUnknownId { id: 7 }))
    );
    let mut buf = packet_buffer();
    assert!(
        q.receive(&mut buf).is_err(),
        "a stopped queue takes nothing"
    );
    // Out of range, and twice the same id.
    let (mut q, mut back) = queue(100);
    q.send(&[1; 60]).unwrap();
    back.tx_response(60000, 0);
    assert_eq!(q.reap_tx(), Err(NetFault::TxUnknownId { id: 60000 }));
    let (mut q, mut back) = queue(100);
    q.send(&[1; 60]).unwrap();
    q.send(&[1; 60]).unwrap();
    let (id, _) = back.transmitted().unwrap();
    back.tx_response(id, 0);
    assert_eq!(q.reap_tx(), Err(NetFault::TxUnknownId { id }));
}

#[test]
fn a_tx_null_or_error_response() {
    let (mut q, mut back) = queue(100);
    q.send(&[1; 60]).unwrap();
    q.send(&[1; 60]).unwrap();
    back.tx.take();
    back.tx.take();
    back.tx_response(0, NETIF_RSP_DROPPED);
    assert_eq!(q.reap_tx(), Ok(1));
    assert_eq!(q.stats.tx_errors, 1);
    back.tx_response(1, NETIF_RSP_NULL);
    assert_eq!(q.reap_tx(), Err(NetFault::TxNull { id: 1 }));
}

#[test]
fn a_gso_packet_goes_out_over_pages_with_one_extra_slot_and_its_null_answer() {
    let (mut q, mut back) = queue(100);
    assert_eq!(MAX_TX_SLOTS, 16);
    for (round, len) in [MAX_TX_PACKET, 4096, 4097, 20_000, MAX_TX_PACKET]
        .into_iter()
        .enumerate()
    {
        let out = frame(len, round as u8);
        q.send_packet(&out, Offload::Segments(1448)).unwrap();
        let sent = back.transmitted_packet().unwrap();
        assert_eq!(sent.packet, out, "{len} bytes");
        assert_eq!(sent.gso_size, Some(1448));
        assert_eq!(
            sent.flags & (NETTXF_EXTRA_INFO | NETTXF_CSUM_BLANK),
            NETTXF_EXTRA_INFO | NETTXF_CSUM_BLANK
        );
        // Every data slot answered, and the NULL after the first.
        assert_eq!(q.reap_tx(), Ok(len.div_ceil(4096) as u32 + 1));
        assert_eq!(q.tx_in_flight(), 0);
    }
    assert_eq!((q.stats.tx_frames, q.stats.tx_gso), (5, 5));
    // A frame whose checksum netback completes: flagged, no extra slot.
    q.send_packet(&frame(1000, 9), Offload::Checksum).unwrap();
    let sent = back.transmitted_packet().unwrap();
    assert_eq!(
        (
            sent.flags & (NETTXF_CSUM_BLANK | NETTXF_EXTRA_INFO),
            sent.gso_size
        ),
        (NETTXF_CSUM_BLANK, None)
    );
    assert_eq!(q.reap_tx(), Ok(1));
    // A plain frame after them, and a NULL nobody owes stops the queue.
    q.send(&[1; 60]).unwrap();
    let id = back.transmitted_packet().unwrap().id;
    assert_eq!(q.reap_tx(), Ok(1));
    q.send(&[1; 60]).unwrap();
    back.tx.take();
    back.tx_response(id, NETIF_RSP_NULL);
    assert_eq!(q.reap_tx(), Err(NetFault::TxNull { id }));
}

#[test]
fn gso_packets_are_bounded_and_wait_for_room() {
    let (mut q, mut back) = queue(100);
    for (len, offload) in [
        (MAX_TX_PACKET + 1, Offload::Segments(1448)),
        (60, Offload::Segments(0)),
        (13, Offload::Segments(1448)),
        (MAX_FRAME + 1, Offload::None),
        (MAX_FRAME + 1, Offload::Checksum),
    ] {
        assert_eq!(
            q.send_packet(&vec![0; len], offload),
            Err(SendError::BadLength(len))
        );
    }
    // 256 ring slots: 15 packets of 16 pages and an extra slot leave one slot (and 16
    // ids), room for a frame but no packet.
    for _ in 0..15 {
        assert!(q.can_send_packets(1));
        q.send_packet(&vec![7; MAX_TX_PACKET], Offload::Segments(1448))
            .unwrap();
    }
    assert!(!q.can_send_packets(1));
    assert_eq!(
        q.send_packet(&[7; 4000], Offload::Segments(1448)),
        Err(SendError::Full)
    );
    q.send(&[7; 60]).unwrap();
    assert_eq!(q.send(&[7; 60]), Err(SendError::Full));
    while back.transmitted_packet().is_some() {}
    assert_eq!(q.reap_tx(), Ok(15 * 17 + 1));
    assert!(q.can_send_packets(5));
    assert_eq!(q.fault(), None);
}

#[test]
fn a_response_producer_past_the_requests_stops_the_queue() {
    let (mut q, mut back) = queue(100);
    q.send(&[1; 60]).unwrap();
    back.tx.rsp_prod_pvt = 2;
    back.tx.publish();
    assert!(matches!(q.reap_tx(), Err(NetFault::TxOverflow(_))));
    let (mut q, mut back) = queue(100);
    q.post_rx();
    back.rx.rsp_prod_pvt = 257;
    back.rx.publish();
    let mut buf = packet_buffer();
    assert!(matches!(q.receive(&mut buf), Err(NetFault::RxOverflow(_))));
}

#[test]
fn an_rx_response_in_another_requests_slot_stops_the_queue() {
    let mut buf = packet_buffer();
    let (mut q, mut back) = queue(100);
    q.post_rx();
    back.rx.take();
    back.rx_response(3, 0, 0, 60);
    assert_eq!(
        q.receive(&mut buf),
        Err(NetFault::RxWrongId { slot: 0, id: 3 })
    );
    // In a continuation slot too.
    let (mut q, mut back) = queue(100);
    q.post_rx();
    respond(&mut back, 0, NETRXF_MORE_DATA, 4096);
    back.rx.take();
    back.rx_response(7, 0, 0, 60);
    assert_eq!(
        q.receive(&mut buf),
        Err(NetFault::RxWrongId { slot: 1, id: 7 })
    );
}

#[test]
fn rx_frames_outside_their_page_or_with_errors_are_dropped_and_reposted() {
    let mut buf = packet_buffer();
    let (mut q, mut back) = queue(100);
    q.post_rx();
    // (offset, status): past the page's end, longer than a page, an error, empty.
    let bad = [
        (4000u16, 200i16),
        (0, 4097),
        (0, -1),
        (0, 0),
        (4095, 2),
        (u16::MAX, 1),
    ];
    for (i, &(offset, status)) in bad.iter().enumerate() {
        back.rx.take();
        back.rx_response(i as u16, offset, 0, status);
    }
    // And one good frame at the end of its page, one a page long.
    back.rx.take();
    back.rx_response(bad.len() as u16, 4096 - 60, 0, 60);
    back.rx.take();
    back.rx_response(bad.len() as u16 + 1, 0, 0, 4096);
    assert_eq!(len(q.receive(&mut buf)), Ok(Some(60)));
    assert_eq!(len(q.receive(&mut buf)), Ok(Some(4096)));
    assert_eq!(q.stats.rx_dropped, bad.len() as u64);
    // Every page went back: netback can take 256 more.
    assert_eq!(back.rx_posted(), 256);
}

/// Takes the next posted rx request and answers it in its own slot.
fn respond(back: &mut Side, offset: u16, flags: u16, status: i16) {
    let at = back.rx.take().expect("a request posted");
    let id = back.rx.mem.load_u16(at, Ordering::Relaxed);
    back.rx_response(id, offset, flags, status);
}

/// Answers `n` slots of `status` bytes, each saying more data follows.
fn more(back: &mut Side, n: usize, status: i16) {
    for _ in 0..n {
        respond(back, 0, NETRXF_MORE_DATA, status);
    }
}

/// Takes the next posted rx request and answers it with an extra-info slot.
fn extra(back: &mut Side, kind: u8, flags: u8, size: u16, gso_type: u8) {
    back.rx.take().expect("a request posted");
    back.rx_extra(kind, flags, size, gso_type);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + i / 4096) as u8).wrapping_add(seed))
        .collect()
}

#[test]
fn a_gso_packet_over_many_slots_is_gathered_whole() {
    let mut buf = packet_buffer();
    let (mut q, mut back) = queue(100);
    q.post_rx();
    for (round, size) in [MAX_PACKET, 4097, 9000, 60_000, MAX_PACKET - 1]
        .into_iter()
        .enumerate()
    {
        let packet = pattern(size, round as u8);
        let flags = NETRXF_CSUM_BLANK | NETRXF_DATA_VALIDATED;
        assert!(back.deliver_packet(&packet, flags, Some(1448)));
        assert_eq!(
            q.receive(&mut buf),
            Ok(Some(Received {
                len: size,
                checksum_checked: true,
                gso_size: Some(1448),
                hash: None,
            }))
        );
        assert!(buf[..size] == packet[..], "round {round}");
        assert_eq!(back.rx_posted(), 256, "every slot posted again");
    }
    // Scatter-gather without GSO, and the checksum flags as they come.
    let packet = pattern(9000, 9);
    assert!(back.deliver_packet(&packet, 0, None));
    assert_eq!(
        q.receive(&mut buf),
        Ok(Some(Received {
            len: 9000,
            checksum_checked: false,
            gso_size: None,
            hash: None,
        }))
    );
    assert!(buf[..9000] == packet[..]);
    for flags in [NETRXF_CSUM_BLANK, NETRXF_DATA_VALIDATED] {
        assert!(back.deliver_packet(&packet[..60], flags, None));
        assert!(q.receive(&mut buf).unwrap().unwrap().checksum_checked);
    }
    assert_eq!(
        (q.stats.rx_frames, q.stats.rx_gso, q.stats.rx_dropped),
        (8, 5, 0)
    );
    assert_eq!(q.receive(&mut buf), Ok(None));
}

/// After a dropped packet the queue takes the next one, and every slot is posted again.
fn still_works(q: &mut netfront::NetQueue, back: &mut Side) {
    let mut buf = packet_buffer();
    assert_eq!(q.fault(), None);
    let packet = pattern(10_000, 3);
    assert!(back.deliver_packet(&packet, NETRXF_CSUM_BLANK, Some(1448)));
    assert_eq!(len(q.receive(&mut buf)), Ok(Some(10_000)));
    assert!(buf[..10_000] == packet[..]);
    assert_eq!(q.receive(&mut buf), Ok(None));
    assert_eq!(back.rx_posted(), 256);
}

/// Runs `script` as a misbehaving netback over a fresh queue: one packet, dropped and
/// counted as `counter` says; then the queue keeps working.
fn dropped(what: &str, script: impl FnOnce(&mut Side), counter: fn(&netfront::NetStats) -> u64) {
    let mut buf = packet_buffer();
    let (mut q, mut back) = queue(100);
    q.post_rx();
    script(&mut back);
    assert_eq!(q.receive(&mut buf), Ok(None), "{what}");
    assert_eq!(q.stats.rx_dropped, 1, "{what}");
    assert_eq!(counter(&q.stats), 1, "{what}: its counter");
    assert_eq!(q.stats.rx_frames, 0, "{what}");
    still_works(&mut q, &mut back);
}

fn chain(s: &netfront::NetStats) -> u64 {
    s.rx_bad_chain
}
fn extras(s: &netfront::NetStats) -> u64 {
    s.rx_bad_extra
}
fn only_dropped(s: &netfront::NetStats) -> u64 {
    s.rx_dropped
}

#[test]
fn hostile_chains_are_dropped_and_the_queue_goes_on() {
    dropped(
        "one data slot more than the limit",
        |b| {
            more(b, MAX_RX_SLOTS, 100);
            respond(b, 0, 0, 100);
        },
        chain,
    );
    dropped(
        "more bytes than a packet holds",
        |b| {
            more(b, 16, 4096);
            respond(b, 0, 0, (MAX_PACKET - 16 * 4096 + 1) as i16);
        },
        chain,
    );
    dropped(
        "more data announced, none published",
        |b| more(b, 2, 4096),
        chain,
    );
    dropped(
        "more data on the last slot posted",
        |b| more(b, 256, 10),
        chain,
    );
    dropped(
        "a continuation outside its page",
        |b| {
            respond(b, 0, NETRXF_MORE_DATA, 4096);
            respond(b, 4000, 0, 200);
        },
        only_dropped,
    );
    dropped(
        "a continuation with an error status",
        |b| {
            respond(b, 0, NETRXF_MORE_DATA, 4096);
            respond(b, 0, NETRXF_MORE_DATA, NETIF_RSP_ERROR);
            respond(b, 0, 0, 100);
        },
        only_dropped,
    );
    dropped(
        "extra info announced, none published",
        |b| respond(b, 0, NETRXF_EXTRA_INFO, 100),
        extras,
    );
    dropped(
        "extra info announced, and its chain's next one not published",
        |b| {
            respond(b, 0, NETRXF_EXTRA_INFO | NETRXF_MORE_DATA, 100);
            extra(
                b,
                XEN_NETIF_EXTRA_TYPE_GSO,
                XEN_NETIF_EXTRA_FLAG_MORE,
                1448,
                XEN_NETIF_GSO_TYPE_TCPV4,
            );
        },
        extras,
    );
    for (what, kind, size, gso_type) in [
        (
            "an extra of type NONE",
            XEN_NETIF_EXTRA_TYPE_NONE,
            1448,
            XEN_NETIF_GSO_TYPE_TCPV4,
        ),
        (
            "a hash extra (never asked for)",
            4,
            1448,
            XEN_NETIF_GSO_TYPE_TCPV4,
        ),
        (
            "an extra type past the last",
            XEN_NETIF_EXTRA_TYPE_MAX,
            1448,
            XEN_NETIF_GSO_TYPE_TCPV4,
        ),
        (
            "GSO TCPv6 (not offered)",
            XEN_NETIF_EXTRA_TYPE_GSO,
            1448,
            XEN_NETIF_GSO_TYPE_TCPV6,
        ),
        (
            "GSO of no type",
            XEN_NETIF_EXTRA_TYPE_GSO,
            1448,
            XEN_NETIF_GSO_TYPE_NONE,
        ),
        (
            "GSO with segments of 0 bytes",
            XEN_NETIF_EXTRA_TYPE_GSO,
            0,
            XEN_NETIF_GSO_TYPE_TCPV4,
        ),
    ] {
        dropped(
            what,
            |b| {
                respond(b, 0, NETRXF_EXTRA_INFO | NETRXF_MORE_DATA, 4096);
                extra(b, kind, 0, size, gso_type);
                respond(b, 0, 0, 100);
            },
            extras,
        );
    }
    dropped(
        "two GSO extras",
        |b| {
            respond(b, 0, NETRXF_EXTRA_INFO | NETRXF_MORE_DATA, 4096);
            extra(
                b,
                XEN_NETIF_EXTRA_TYPE_GSO,
                XEN_NETIF_EXTRA_FLAG_MORE,
                1448,
                XEN_NETIF_GSO_TYPE_TCPV4,
            );
            extra(
                b,
                XEN_NETIF_EXTRA_TYPE_GSO,
                0,
                1448,
                XEN_NETIF_GSO_TYPE_TCPV4,
            );
            respond(b, 0, 0, 100);
        },
        extras,
    );
}

#[test]
fn a_bad_packet_between_good_ones_costs_only_itself() {
    let mut buf = packet_buffer();
    let (mut q, mut back) = queue(100);
    q.post_rx();
    let first = pattern(20_000, 1);
    let last = pattern(30_000, 2);
    assert!(back.deliver_packet(&first, NETRXF_CSUM_BLANK, Some(1448)));
    respond(&mut back, 0, NETRXF_EXTRA_INFO | NETRXF_MORE_DATA, 4096);
    extra(&mut back, 4, 0, 0, 0);
    respond(&mut back, 0, 0, 100);
    assert!(back.deliver_packet(&last, NETRXF_CSUM_BLANK, Some(1448)));
    assert_eq!(len(q.receive(&mut buf)), Ok(Some(20_000)));
    assert!(buf[..20_000] == first[..]);
    assert_eq!(len(q.receive(&mut buf)), Ok(Some(30_000)));
    assert!(buf[..30_000] == last[..]);
    assert_eq!(
        (q.stats.rx_frames, q.stats.rx_dropped, q.stats.rx_bad_extra),
        (2, 1, 1)
    );
    assert_eq!(back.rx_posted(), 256);
}

/// [`dropped`] over a queue that takes hash extra slots (the control ring set hashing up).
fn dropped_hashed(what: &str, script: impl FnOnce(&mut Side)) {
    let mut buf = packet_buffer();
    let (mut q, mut back) = queue(100);
    q.accept_hash();
    q.post_rx();
    script(&mut back);
    assert_eq!(q.receive(&mut buf), Ok(None), "{what}");
    assert_eq!(q.stats.rx_dropped, 1, "{what}");
    assert_eq!(q.stats.rx_bad_extra, 1, "{what}: its counter");
    assert_eq!(q.stats.rx_frames, 0, "{what}");
    still_works(&mut q, &mut back);
}

#[test]
fn with_hashing_set_up_a_hash_slot_after_the_gso_one_gives_netbacks_hash() {
    let mut buf = packet_buffer();
    let (mut q, mut back) = queue(100);
    q.accept_hash();
    q.post_rx();
    for (round, (size, gso)) in [(60_000, Some(1448)), (1000, None), (MAX_PACKET, Some(1448))]
        .into_iter()
        .enumerate()
    {
        let packet = pattern(size, round as u8);
        let hash = 0x8765_4321 ^ round as u32;
        assert!(back.deliver_hashed(&packet, NETRXF_DATA_VALIDATED, gso, Some(hash)));
        assert_eq!(
            q.receive(&mut buf),
            Ok(Some(Received {
                len: size,
                checksum_checked: true,
                gso_size: gso,
                hash: Some(hash),
            }))
        );
        assert!(buf[..size] == packet[..], "round {round}");
        assert_eq!(back.rx_posted(), 256);
    }
    assert_eq!(
        (q.stats.rx_frames, q.stats.rx_hashed, q.stats.rx_gso),
        (3, 3, 2)
    );
    // A packet without one (ARP: netback hashes IPv4/TCP only).
    assert!(back.deliver_packet(&pattern(60, 7), 0, None));
    assert_eq!(q.receive(&mut buf).unwrap().unwrap().hash, None);
}

#[test]
fn hash_slots_not_asked_for_are_dropped() {
    let hash_packet = |kind: u8, alg: u8| {
        move |b: &mut Side| {
            respond(b, 0, NETRXF_EXTRA_INFO | NETRXF_MORE_DATA, 4096);
            b.rx.take().expect("a request posted");
            b.rx_hash(0, kind, alg, 1234);
            respond(b, 0, 0, 100);
        }
    };
    dropped_hashed(
        "an IPv4 (not TCP) hash",
        hash_packet(0, XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ as u8),
    );
    dropped_hashed(
        "an IPv6/TCP hash",
        hash_packet(3, XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ as u8),
    );
    dropped_hashed(
        "a hash of no algorithm",
        hash_packet(HASH_TYPE_BIT_IPV4_TCP, 0),
    );
    dropped_hashed("two hash slots", |b| {
        respond(b, 0, NETRXF_EXTRA_INFO | NETRXF_MORE_DATA, 4096);
        b.rx.take().expect("a request posted");
        b.rx_hash(XEN_NETIF_EXTRA_FLAG_MORE, HASH_TYPE_BIT_IPV4_TCP, 1, 1);
        b.rx.take().expect("a request posted");
        b.rx_hash(0, HASH_TYPE_BIT_IPV4_TCP, 1, 2);
        respond(b, 0, 0, 100);
    });
    // Before the control ring set hashing up, even a good one is not taken.
    dropped(
        "a hash slot before hashing was set up",
        hash_packet(HASH_TYPE_BIT_IPV4_TCP, 1),
        extras,
    );
}

#[test]
fn a_device_gives_a_token_only_with_room_for_a_frame_of_its_mtu() {
    use smoltcp::phy::Device;
    use smoltcp::time::Instant;
    let (q, _back) = queue(100);
    let mut device = netfront::NetDevice::new(q);
    assert_eq!(device.capabilities().max_transmission_unit, 1514);
    device.set_mtu(9000);
    assert_eq!(device.capabilities().max_transmission_unit, 9014);
    for _ in 0..254 {
        device.queue_mut().send(&[0; 60]).unwrap();
    }
    assert!(
        device.transmit(Instant::ZERO).is_none(),
        "3 pages wanted, 2 free"
    );
    device.set_mtu(1500);
    assert!(device.transmit(Instant::ZERO).is_some());
    device.set_mtu(100_000);
    assert_eq!(device.mtu(), netfront::MAX_MTU);
    device.set_mtu(0);
    assert_eq!(device.mtu(), netfront::MIN_MTU);
}
