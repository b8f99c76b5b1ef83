// SPDX-License-Identifier: MIT OR Apache-2.0
//! Two smoltcp stacks on two vif queues, joined by the fake netback's switch: a TCP
//! connection carries data both ways, byte for byte; a lossy switch only slows it; a
//! switch that coalesces segments into 64 KiB GSO packets with a blank checksum is
//! taken whole; with GSO on send, the sender's segments go out joined into such
//! packets, their partial checksums right; a frame whose checksum is wrong is dropped
//! by the netfront, not given to TCP.

mod fake_netback;

use fake_netback::{leak, stack_at_mtu, switch, Coalescer};
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

/// What the switch does to the frames a sends.
#[derive(Clone, Copy, Default)]
struct Path {
    /// Loses every n-th.
    drop_every: Option<usize>,
    /// Flips a payload bit of every n-th TCP data frame (its checksum unchanged).
    corrupt_every: Option<usize>,
    /// Joins them into GSO packets.
    gso: bool,
    /// a joins its segments into GSO packets itself (GSO on send).
    tx_gso: bool,
    /// a's and b's MTU (0: the default).
    mtu: (usize, usize),
}

/// What a transfer saw.
struct Seen {
    ms: u64,
    b_stats: netfront::NetStats,
    b_device: netfront::phy::DeviceStats,
    coalesced: Coalescer,
    /// GSO packets a sent, those whose partial checksum was wrong, and the longest.
    a_gso: (usize, usize, usize),
    /// The largest GSO size a gave.
    a_gso_size: u16,
    a_joined: netfront::tso::JoinStats,
}

/// Sends `len` bytes from a to b and `len / 2` back, a's frames on `path`.
fn transfer(len: usize, path: Path) -> Seen {
    let mtu = |m: usize| if m == 0 { netfront::DEFAULT_MTU } else { m };
    let (mut a, mut side_a) = stack_at_mtu(1000, 1, 1, 2, mtu(path.mtu.0));
    let (mut b, mut side_b) = stack_at_mtu(5000, 2, 2, 2, mtu(path.mtu.1));
    if path.tx_gso {
        a.device.set_tx_gso();
    }
    let mut longest_sent = 0;
    let mut largest_gso_size = 0;
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
    let mut data_frames = 0usize;
    let mut coalesced = Coalescer::default();
    for now in 0..200_000u64 {
        a.poll(now);
        b.poll(now);
        // The switch, with what `path` does to a's frames.
        while let Some(mut sent) = side_a.transmitted_packet() {
            frames += 1;
            longest_sent = longest_sent.max(sent.packet.len());
            largest_gso_size = largest_gso_size.max(sent.gso_size.unwrap_or(0));
            if path.drop_every.is_some_and(|n| frames.is_multiple_of(n)) {
                continue;
            }
            if sent.flags & xen::abi::netif::NETTXF_CSUM_BLANK != 0 {
                side_b.pass(&sent);
                continue;
            }
            let frame = &mut sent.packet;
            if frame.len() > 54 + 100 {
                data_frames += 1;
                if path
                    .corrupt_every
                    .is_some_and(|n| data_frames.is_multiple_of(n))
                {
                    frame[54 + 77] ^= 0x04;
                }
            }
            if path.gso {
                coalesced.push(sent.packet, &mut side_b);
            } else {
                side_b.deliver(frame);
            }
        }
        coalesced.idle(&mut side_b);
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
            assert_eq!(b.device.queue().fault(), None);
            assert_eq!(b.device.queue().stats.rx_dropped, 0);
            return Seen {
                ms: now,
                b_stats: b.device.queue().stats,
                b_device: b.device.stats,
                coalesced,
                a_gso: (side_a.tx_gso, side_a.tx_bad_partial, longest_sent),
                a_gso_size: largest_gso_size,
                a_joined: a.device.join_stats(),
            };
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
    let seen = transfer(1 << 20, Path::default());
    assert_eq!((seen.b_stats.rx_gso, seen.b_device.rx_bad_checksum), (0, 0));
}

#[test]
fn tcp_recovers_from_lost_frames() {
    transfer(
        256 << 10,
        Path {
            drop_every: Some(17),
            ..Path::default()
        },
    );
}

#[test]
fn gso_packets_of_up_to_64_kib_with_a_blank_checksum_reach_tcp_whole() {
    let seen = transfer(
        4 << 20,
        Path {
            gso: true,
            ..Path::default()
        },
    );
    assert!(seen.coalesced.gso_packets > 0);
    assert_eq!(seen.b_stats.rx_gso, seen.coalesced.gso_packets as u64);
    assert!(
        seen.coalesced.longest > 60_000,
        "64 KiB packets: {}",
        seen.coalesced.longest
    );
    assert_eq!(seen.b_device.rx_bad_checksum, 0, "blank checksums flagged");
    // And with frames lost, so that segments retransmitted are joined too.
    let lossy = transfer(
        1 << 20,
        Path {
            gso: true,
            drop_every: Some(23),
            ..Path::default()
        },
    );
    assert!(lossy.b_stats.rx_gso > 0);
}

#[test]
fn with_gso_on_send_a_connections_segments_go_out_as_large_packets() {
    let seen = transfer(
        4 << 20,
        Path {
            tx_gso: true,
            ..Path::default()
        },
    );
    let (packets, bad_partial, longest) = seen.a_gso;
    assert_eq!(bad_partial, 0, "every partial checksum completes");
    assert_eq!(seen.b_stats.rx_gso, packets as u64, "taken whole");
    assert_eq!(seen.a_joined.packets, packets as u64);
    assert!(
        seen.a_joined.segments >= 10 * seen.a_joined.packets,
        "{:?}",
        seen.a_joined
    );
    // As large as the 64 KiB window lets a poll's segments be (the cap: tso's tests).
    assert!(longest > 16 * 1460, "large packets: {longest}");
    // A packet lost costs its segments, which TCP sends again (and they are joined).
    let lossy = transfer(
        1 << 20,
        Path {
            tx_gso: true,
            drop_every: Some(7),
            ..Path::default()
        },
    );
    assert!(lossy.a_gso.0 > 0);
    assert_eq!(lossy.a_gso.1, 0);
    // Without it, one frame per segment.
    let plain = transfer(1 << 20, Path::default());
    assert_eq!((plain.a_gso.0, plain.a_joined.packets), (0, 0));
    assert!(plain.a_gso.2 <= 1514);
}

#[test]
fn jumbo_frames_carry_segments_of_the_mtu_and_only_when_both_ends_have_it() {
    // Both at 9000: the MSS each announces is 8960, every full segment a 9014-byte frame
    // over three pages.
    let jumbo = Path {
        mtu: (9000, 9000),
        ..Path::default()
    };
    let seen = transfer(1 << 20, jumbo);
    assert_eq!(seen.a_gso.2, 9014, "the longest frame a sent");
    assert_eq!(seen.b_device.rx_bad_checksum, 0);
    // Joined: GSO packets of 8960-byte segments.
    let joined = transfer(
        4 << 20,
        Path {
            tx_gso: true,
            ..jumbo
        },
    );
    assert_eq!(joined.a_gso_size, 8960);
    assert_eq!(joined.a_gso.1, 0, "every partial checksum completes");
    assert!(
        joined.a_gso.2 > 6 * 8960,
        "large packets: {}",
        joined.a_gso.2
    );
    // With frames lost: sent again whole.
    transfer(
        512 << 10,
        Path {
            drop_every: Some(13),
            ..jumbo
        },
    );
    // a at 9000, b at 1500: a keeps to b's MSS.
    let mixed = transfer(
        1 << 20,
        Path {
            mtu: (9000, 1500),
            ..Path::default()
        },
    );
    assert_eq!(mixed.a_gso.2, 1514);
}

#[test]
fn a_frame_with_a_wrong_checksum_is_dropped_before_tcp() {
    let seen = transfer(
        512 << 10,
        Path {
            corrupt_every: Some(11),
            ..Path::default()
        },
    );
    assert!(seen.b_device.rx_bad_checksum > 0);
    assert!(seen.ms > 0);
}
