// SPDX-License-Identifier: MIT OR Apache-2.0
//! A vif queue against a fake netback: frames both ways, and every check of a
//! misbehaving backend's responses.

mod fake_netback;

use fake_netback::queue;
use netfront::queue::{NetFault, SendError, MAX_FRAME};
use xen::abi::netif::{NETIF_RSP_DROPPED, NETIF_RSP_NULL, NETRXF_EXTRA_INFO, NETRXF_MORE_DATA};

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
        assert_eq!(q.reap_tx(), Ok(1));
        let inbound = frame(60 + round as usize % 1400, !round as u8);
        assert!(
            back.deliver(&inbound),
            "a page is always posted (round {round})"
        );
        let mut buf = [0u8; MAX_FRAME];
        assert_eq!(q.receive(&mut buf), Ok(Some(inbound.len())));
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
    for _ in 0..256 {
        q.send(&[0; 60]).unwrap();
    }
    assert!(!q.can_send());
    assert_eq!(q.send(&[0; 60]), Err(SendError::Full));
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
    let mut buf = [0u8; MAX_FRAME];
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
    let mut buf = [0u8; MAX_FRAME];
    assert!(matches!(q.receive(&mut buf), Err(NetFault::RxOverflow(_))));
}

#[test]
fn an_rx_response_in_another_requests_slot_or_spanning_slots_stops_the_queue() {
    let mut buf = [0u8; MAX_FRAME];
    let (mut q, mut back) = queue(100);
    q.post_rx();
    back.rx.take();
    back.rx_response(3, 0, 0, 60);
    assert_eq!(
        q.receive(&mut buf),
        Err(NetFault::RxWrongId { slot: 0, id: 3 })
    );
    for flag in [NETRXF_MORE_DATA, NETRXF_EXTRA_INFO] {
        let (mut q, mut back) = queue(100);
        q.post_rx();
        back.rx.take();
        back.rx_response(0, 0, flag, 60);
        assert_eq!(
            q.receive(&mut buf),
            Err(NetFault::RxMultiSlot { flags: flag })
        );
    }
}

#[test]
fn rx_frames_outside_their_page_or_the_mtu_or_with_errors_are_dropped_and_reposted() {
    let mut buf = [0u8; MAX_FRAME];
    let (mut q, mut back) = queue(100);
    q.post_rx();
    // (offset, status): past the page's end, above the MTU, an error, empty.
    let bad = [
        (4000u16, 200i16),
        (0, 1515),
        (0, -1),
        (0, 0),
        (4095, 2),
        (u16::MAX, 1),
    ];
    for (i, &(offset, status)) in bad.iter().enumerate() {
        back.rx.take();
        back.rx_response(i as u16, offset, 0, status);
    }
    // And one good frame at the end of its page.
    back.rx.take();
    back.rx_response(bad.len() as u16, 4096 - 60, 0, 60);
    assert_eq!(q.receive(&mut buf), Ok(Some(60)));
    assert_eq!(q.stats.rx_dropped, bad.len() as u64);
    // Every page went back: netback can take 256 more.
    let posted = (0..).take_while(|_| back.rx.take().is_some()).count();
    assert_eq!(posted, 256 - bad.len() - 1 + bad.len() + 1);
}
