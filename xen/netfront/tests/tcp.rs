// SPDX-License-Identifier: MIT OR Apache-2.0
//! Two smoltcp stacks on two vif queues, joined by the fake netback's switch: a TCP
//! connection carries data both ways, byte for byte, and a lossy switch only slows it.

mod fake_netback;

use fake_netback::{leak, stack, switch};
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, Ipv4Address};

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Sends `len` bytes from a to b and `len / 2` back; `drop_every` loses every n-th
/// frame a sends. Returns the ms it took.
fn transfer(len: usize, drop_every: Option<usize>) -> u64 {
    let (mut a, mut side_a) = stack(1000, 1, 1, 2);
    let (mut b, mut side_b) = stack(5000, 2, 2, 2);
    let client = a.add_tcp(leak([0u8; 65536]), leak([0u8; 65536])).unwrap();
    let server = b.add_tcp(leak([0u8; 65536]), leak([0u8; 65536])).unwrap();
    assert!(b.add_tcp(leak([0u8; 16]), leak([0u8; 16])).is_some());
    assert!(
        b.add_tcp(leak([0u8; 16]), leak([0u8; 16])).is_none(),
        "bounded"
    );
    b.sockets
        .get_mut::<tcp::Socket>(server)
        .listen(4420)
        .unwrap();
    a.sockets
        .get_mut::<tcp::Socket>(client)
        .connect(
            a.iface.context(),
            (IpAddress::Ipv4(Ipv4Address::new(10, 9, 0, 2)), 4420),
            49152,
        )
        .unwrap();
    let up = pattern(len, 7);
    let down = pattern(len / 2, 9);
    let (mut sent_up, mut got_up, mut sent_down, mut got_down) = (0, Vec::new(), 0, Vec::new());
    let mut frames = 0usize;
    for now in 0..200_000u64 {
        a.poll(now);
        b.poll(now);
        // The switch, with losses from a.
        while let Some((_, frame)) = side_a.transmitted() {
            frames += 1;
            if drop_every.is_some_and(|n| frames.is_multiple_of(n)) {
                continue;
            }
            side_b.deliver(&frame);
        }
        switch(&mut side_b, &mut side_a);
        a.device.queue_mut().take_notify();
        b.device.queue_mut().take_notify();
        let c = a.sockets.get_mut::<tcp::Socket>(client);
        if c.can_send() && sent_up < up.len() {
            sent_up += c.send_slice(&up[sent_up..]).unwrap();
        }
        if c.can_recv() {
            c.recv(|data| {
                got_down.extend_from_slice(data);
                (data.len(), ())
            })
            .unwrap();
        }
        let s = b.sockets.get_mut::<tcp::Socket>(server);
        if s.can_recv() {
            s.recv(|data| {
                got_up.extend_from_slice(data);
                (data.len(), ())
            })
            .unwrap();
        }
        if s.can_send() && sent_down < down.len() {
            sent_down += s.send_slice(&down[sent_down..]).unwrap();
        }
        if got_up.len() == up.len() && got_down.len() == down.len() {
            assert!(got_up == up, "a to b");
            assert!(got_down == down, "b to a");
            assert_eq!(a.device.queue().fault(), None);
            assert_eq!(b.device.queue().stats.rx_dropped, 0);
            return now;
        }
    }
    panic!(
        "not done: up {}/{}, down {}/{}",
        got_up.len(),
        up.len(),
        got_down.len(),
        down.len()
    );
}

#[test]
fn tcp_carries_a_mebibyte_each_way_over_two_vifs() {
    transfer(1 << 20, None);
}

#[test]
fn tcp_recovers_from_lost_frames() {
    transfer(256 << 10, Some(17));
}
