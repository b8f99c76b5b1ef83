// SPDX-License-Identifier: MIT OR Apache-2.0
//! smoltcp's device over two queues: packets taken from both, frames sent on queue 0,
//! and each packet counted against the steering (netback's hash against ours, the
//! queue it came on against the one predicted).

mod fake_netback;

use netfront::hash::{hash_of_frame, Steering, MAPPING_SIZE};
use netfront::NetDevice;
use smoltcp::phy::{Device, RxToken, TxToken};
use smoltcp::time::Instant;
use xen::abi::netif::NETRXF_DATA_VALIDATED;

const TARGET: [u8; 4] = [10, 9, 0, 1];
const US: [u8; 4] = [10, 9, 0, 2];

/// A TCP segment from the target's port 4420 to our `port`, as an Ethernet frame.
fn segment(port: u16) -> Vec<u8> {
    fake_netback::tcp_frame(TARGET, 4420, US, port, b"data")
}

#[test]
fn packets_of_every_queue_are_taken_frames_go_out_on_queue_0_and_steering_is_checked() {
    let (mut q0, mut side0) = fake_netback::queue(100);
    let (mut q1, mut side1) = fake_netback::queue(1000);
    for q in [&mut q0, &mut q1] {
        q.accept_hash();
        q.post_rx();
    }
    let steering = Steering::new(2, MAPPING_SIZE);
    let mut device = NetDevice::with_queues(vec![q0, q1]);
    device.set_steering(Some(steering));
    let port_for = |queue| {
        steering
            .local_port_for_queue(queue, TARGET, 4420, US, 50000, &mut |_| false)
            .unwrap()
    };
    let (p0, p1) = (port_for(0), port_for(1));
    let (f0, f1) = (segment(p0), segment(p1));
    let flags = NETRXF_DATA_VALIDATED;
    // As netback steers them, with its hash; then queue 1's flow on queue 0 with a hash
    // that is not ours; then an ARP-like frame (no hash) on queue 1: off its queue 0.
    for _ in 0..3 {
        assert!(side1.deliver_hashed(&f1, flags, None, Some(hash_of_frame(&f1))));
    }
    assert!(side0.deliver_hashed(&f0, flags, None, Some(hash_of_frame(&f0))));
    assert!(side0.deliver_hashed(&f1, flags, None, Some(hash_of_frame(&f1) ^ 1)));
    let arp = {
        let mut f = f0.clone();
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f
    };
    assert!(side1.deliver_packet(&arp, 0, None));
    let mut got = Vec::new();
    while let Some((rx, tx)) = device.receive(Instant::ZERO) {
        got.push(rx.consume(|frame| frame.to_vec()));
        // Answer each on the token's tx side: it goes out on queue 0.
        tx.consume(60, |buf| buf.fill(0xab));
    }
    assert_eq!(got.len(), 6, "both queues drained");
    // Taken in turn: queue 0's first, then queue 1's, and so on.
    assert_eq!(got[0], f0);
    assert_eq!(got[1], f1);
    let steer = device.steer;
    let counts = |s: netfront::phy::SteerStats| {
        (
            s.tcp,
            s.hash_agreed,
            s.hash_mismatch,
            s.off_queue,
            s.other_off_queue,
        )
    };
    assert_eq!(counts(steer[0]), (2, 1, 1, 1, 0));
    assert_eq!(
        counts(steer[1]),
        (3, 3, 0, 0, 1),
        "the frame without a hash belongs on queue 0"
    );
    let mut sent = 0;
    while side0.transmitted().is_some() {
        sent += 1;
    }
    assert_eq!(sent, 6);
    assert!(side1.transmitted().is_none(), "nothing goes out on queue 1");
    let (rx0, rx1) = (device.queues()[0].stats, device.queues()[1].stats);
    assert_eq!((rx0.rx_frames, rx0.rx_hashed), (2, 2));
    assert_eq!((rx1.rx_frames, rx1.rx_hashed), (4, 3));
}

#[test]
fn without_steering_nothing_is_counted_against_it() {
    let (mut q0, _side0) = fake_netback::queue(100);
    let (mut q1, mut side1) = fake_netback::queue(1000);
    q0.post_rx();
    q1.post_rx();
    let mut device = NetDevice::with_queues(vec![q0, q1]);
    let f = segment(50000);
    assert!(side1.deliver_packet(&f, NETRXF_DATA_VALIDATED, None));
    let (rx, _) = device.receive(Instant::ZERO).expect("queue 1's packet");
    assert_eq!(rx.consume(|frame| frame.to_vec()), f);
    assert_eq!(device.steer[1], Default::default());
}
