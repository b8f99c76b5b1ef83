// SPDX-License-Identifier: MIT OR Apache-2.0
//! The vif's data path allocates nothing: after set-up, a TCP transfer both ways over
//! two smoltcp stacks on vif queues (frames lost too; and with one direction's segments
//! coalesced into GSO packets over many slots) makes no heap allocation inside the
//! stacks' polls or the sockets' sends and receives. (The fake netback between them
//! allocates; it is left out of the count.)

mod fake_netback;

use fake_netback::{leak, stack, Coalescer};
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, Ipv4Address};

#[path = "../../blkback/tests/common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

/// Runs `f`, adding what it allocated to `counted`.
fn counting<R>(counted: &mut u64, f: impl FnOnce() -> R) -> R {
    let before = allocations();
    let result = f();
    *counted += allocations() - before;
    result
}

#[test]
fn the_data_path_allocates_nothing() {
    echo(false, false);
}

#[test]
fn the_data_path_allocates_nothing_with_gso_packets() {
    echo(true, false);
}

#[test]
fn the_data_path_allocates_nothing_joining_segments_on_send() {
    echo(false, true);
}

/// A 1 MiB echo; `gso`: a's segments reach b as GSO packets joined by the switch;
/// `tx_gso`: both stacks join their own segments.
fn echo(gso: bool, tx_gso: bool) {
    let (mut a, mut side_a) = stack(1000, 1, 1, 2);
    let (mut b, mut side_b) = stack(5000, 2, 2, 2);
    if tx_gso {
        a.device.set_tx_gso();
        b.device.set_tx_gso();
    }
    let client = a.add_tcp(leak([0u8; 65536]), leak([0u8; 65536])).unwrap();
    let server = b.add_tcp(leak([0u8; 65536]), leak([0u8; 65536])).unwrap();
    b.sockets
        .get_mut::<tcp::Socket>(server)
        .listen(4420)
        .unwrap();
    let context = a.iface.context();
    a.sockets
        .get_mut::<tcp::Socket>(client)
        .connect(
            context,
            (IpAddress::Ipv4(Ipv4Address::new(10, 9, 0, 2)), 4420),
            49152,
        )
        .unwrap();
    let data = vec![0x5au8; 1 << 20];
    let mut sink = [0u8; 4096];
    let (mut sent, mut received, mut echoed, mut back) = (0, 0, 0, 0);
    let mut counted = 0u64;
    let mut frames = 0usize;
    let mut coalescer = Coalescer::default();
    for now in 1..200_000u64 {
        counting(&mut counted, || {
            a.poll(now);
            b.poll(now);
            a.device.queue_mut().take_notify();
            b.device.queue_mut().take_notify();
        });
        while let Some(sent) = side_a.transmitted_packet() {
            frames += 1;
            if frames.is_multiple_of(29) {
                continue;
            }
            if gso {
                coalescer.push(sent.packet, &mut side_b);
            } else {
                side_b.pass(&sent);
            }
        }
        coalescer.idle(&mut side_b);
        while let Some(sent) = side_b.transmitted_packet() {
            side_a.pass(&sent);
        }
        counting(&mut counted, || {
            let c = a.sockets.get_mut::<tcp::Socket>(client);
            if c.can_send() && sent < data.len() {
                sent += c.send_slice(&data[sent..]).unwrap();
            }
            if c.can_recv() {
                back += c.recv_slice(&mut sink).unwrap();
            }
            let s = b.sockets.get_mut::<tcp::Socket>(server);
            if s.can_recv() {
                let n = s.recv_slice(&mut sink).unwrap();
                received += n;
            }
            if s.can_send() && echoed < received {
                echoed += s
                    .send_slice(&sink[..(received - echoed).min(4096)])
                    .unwrap();
            }
        });
        if back == data.len() {
            break;
        }
    }
    assert_eq!(
        (received, back),
        (data.len(), data.len()),
        "the transfer finished"
    );
    assert_eq!(counted, 0, "allocations on the data path");
    assert_eq!(b.device.queue().stats.rx_gso > 0, gso || tx_gso);
    assert_eq!(a.device.queue().stats.tx_gso > 0, tx_gso);
    assert_eq!((side_a.tx_bad_partial, side_b.tx_bad_partial), (0, 0));
}
