// SPDX-License-Identifier: MIT OR Apache-2.0
//! `net.ip=dhcp` over two stacks joined by the fake netback's switch: blkdom's stack
//! asks smoltcp's DHCPv4 client for a lease, a small server on the other stack (a UDP
//! socket on port 67) gives it; the interface takes the address and router, keeps them
//! through a renewal, loses them when the server stops answering past the lease, and
//! takes a lease again when it answers again.

mod fake_netback;

use fake_netback::{leak, stack, stack_with, switch, Side};
use netfront::lease::LeaseEvent;
use netfront::stack::{Addressing, Ipv4Setup, Stack};
use smoltcp::socket::udp;
use smoltcp::wire::{DhcpMessageType, DhcpPacket, DhcpRepr, IpAddress, IpEndpoint, Ipv4Address};

const SERVER: Ipv4Address = Ipv4Address::new(10, 9, 0, 1);
const LEASED: Ipv4Address = Ipv4Address::new(10, 9, 0, 50);
const LEASE_S: u32 = 20;

/// The server's side: what it answers, and what it saw.
struct Server {
    stack: Stack,
    side: Side,
    socket: smoltcp::iface::SocketHandle,
    /// Answers nothing (a server away).
    silent: bool,
    /// DISCOVERs still to be lost on the way.
    drop_discovers: usize,
    /// DISCOVERs that reached the server (answered or not).
    discovers: usize,
    requests: usize,
}

impl Server {
    fn new() -> Server {
        let (mut stack, side) = stack(1000, 1, 1, 1);
        let buffer = || {
            udp::PacketBuffer::new(
                leak(vec![udp::PacketMetadata::EMPTY; 8]).as_mut_slice(),
                leak(vec![0u8; 8192]).as_mut_slice(),
            )
        };
        let socket = stack.sockets.add(udp::Socket::new(buffer(), buffer()));
        stack
            .sockets
            .get_mut::<udp::Socket>(socket)
            .bind(67)
            .unwrap();
        Server {
            stack,
            side,
            socket,
            silent: false,
            drop_discovers: 0,
            discovers: 0,
            requests: 0,
        }
    }

    /// Answers every message waiting: an OFFER to a DISCOVER, an ACK to a REQUEST.
    fn serve(&mut self) {
        let socket = self.stack.sockets.get_mut::<udp::Socket>(self.socket);
        let mut query = [0u8; 1500];
        while let Ok((len, _)) = socket.recv_slice(&mut query) {
            let packet = DhcpPacket::new_checked(&query[..len]).unwrap();
            let asked = DhcpRepr::parse(&packet).unwrap();
            if asked.message_type == DhcpMessageType::Discover {
                self.discovers += 1;
            }
            let message_type = match asked.message_type {
                DhcpMessageType::Discover if self.drop_discovers > 0 => {
                    self.drop_discovers -= 1;
                    continue;
                }
                DhcpMessageType::Discover => DhcpMessageType::Offer,
                DhcpMessageType::Request => {
                    self.requests += 1;
                    DhcpMessageType::Ack
                }
                _ => continue,
            };
            if self.silent {
                continue;
            }
            let answer = DhcpRepr {
                message_type,
                transaction_id: asked.transaction_id,
                secs: 0,
                client_hardware_address: asked.client_hardware_address,
                client_ip: Ipv4Address::UNSPECIFIED,
                your_ip: LEASED,
                server_ip: SERVER,
                router: Some(SERVER),
                subnet_mask: Some(Ipv4Address::new(255, 255, 255, 0)),
                relay_agent_ip: Ipv4Address::UNSPECIFIED,
                broadcast: false,
                requested_ip: None,
                client_identifier: None,
                server_identifier: Some(SERVER),
                parameter_request_list: None,
                dns_servers: None,
                max_size: None,
                lease_duration: Some(LEASE_S),
                renew_duration: None,
                rebind_duration: None,
                additional_options: &[],
            };
            let mut reply = vec![0u8; answer.buffer_len()];
            answer
                .emit(&mut DhcpPacket::new_unchecked(&mut reply[..]))
                .unwrap();
            // A renewal comes from the leased address; the rest before it has one.
            let to = if asked.client_ip == LEASED {
                LEASED
            } else {
                Ipv4Address::BROADCAST
            };
            socket
                .send_slice(&reply, IpEndpoint::new(IpAddress::Ipv4(to), 68))
                .unwrap();
        }
    }
}

/// blkdom's stack, by DHCP, and the server; `run` moves them on ms by ms.
struct Rig {
    client: Stack,
    side: Side,
    server: Server,
    now: u64,
    events: Vec<(u64, LeaseEvent)>,
}

impl Rig {
    fn new() -> Rig {
        let (client, side) = stack_with(2000, 2, Addressing::Dhcp, 2);
        Rig {
            client,
            side,
            server: Server::new(),
            now: 0,
            events: Vec::new(),
        }
    }

    fn run(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now += 1;
            self.client.poll(self.now);
            if let Some(event) = self.client.poll_lease(self.now) {
                self.events.push((self.now, event));
            }
            self.server.stack.poll(self.now);
            self.server.serve();
            self.server.stack.poll(self.now);
            switch(&mut self.side, &mut self.server.side);
            self.client.device.queue_mut().take_notify();
            self.server.stack.device.queue_mut().take_notify();
        }
    }

    fn address(&self) -> Option<Ipv4Address> {
        self.client.iface.ipv4_addr()
    }

    /// What an attach on a remote is refused with now.
    fn refusal(&self) -> &'static str {
        self.client.lease().unwrap().refusal().unwrap_or("")
    }
}

const LEASE: Ipv4Setup = Ipv4Setup {
    address: [10, 9, 0, 50],
    prefix: 24,
    gateway: Some([10, 9, 0, 1]),
};

#[test]
fn a_lease_is_taken_renewed_lost_and_taken_again() {
    let mut rig = Rig::new();
    assert_eq!(rig.address(), None);
    assert!(rig.refusal().contains("no DHCP lease yet"));
    rig.run(500);
    assert!(
        matches!(
            rig.events[..],
            [(_, LeaseEvent::Acquired { ip: LEASE, .. })]
        ),
        "{:?}",
        rig.events
    );
    assert_eq!(rig.address(), Some(LEASED));
    assert_eq!(rig.client.iface.ip_addrs().len(), 1);
    assert_eq!(rig.refusal(), "");
    let router = rig
        .client
        .iface
        .routes_mut()
        .remove_default_ipv4_route()
        .map(|r| r.via_router);
    assert_eq!(router, Some(IpAddress::Ipv4(SERVER)), "the lease's router");
    rig.client
        .iface
        .routes_mut()
        .add_default_ipv4_route(SERVER)
        .unwrap();

    // Past T1 (half the lease): renewed from the leased address, nothing changes.
    let requests = rig.server.requests;
    rig.run(u64::from(LEASE_S) * 1000);
    assert!(rig.server.requests > requests, "renewed");
    assert_eq!(rig.events.len(), 1, "{:?}", rig.events);
    assert_eq!(rig.address(), Some(LEASED));

    // The server goes away: the lease ends unrenewed and the address with it.
    rig.server.silent = true;
    rig.run(u64::from(LEASE_S) * 1000 + 1000);
    assert!(
        matches!(rig.events[1], (_, LeaseEvent::Lost { ip: LEASE })),
        "{:?}",
        rig.events
    );
    assert_eq!(rig.address(), None);
    assert!(rig.client.iface.ip_addrs().is_empty());
    assert!(rig.refusal().contains("lost"));
    assert!(
        rig.client
            .iface
            .routes_mut()
            .remove_default_ipv4_route()
            .is_none(),
        "no router without a lease"
    );

    // Back: a lease again within a few DISCOVERs.
    rig.server.silent = false;
    rig.run(3000);
    assert!(
        matches!(
            rig.events[2..],
            [(_, LeaseEvent::Acquired { ip: LEASE, .. })]
        ),
        "{:?}",
        rig.events
    );
    assert_eq!(rig.address(), Some(LEASED));
}

#[test]
fn a_lost_discover_is_sent_again_within_a_boot_wait() {
    let mut rig = Rig::new();
    rig.server.drop_discovers = 2;
    rig.run(4000);
    match rig.events[..] {
        [(
            at,
            LeaseEvent::Acquired {
                ip: LEASE,
                waited_ms,
            },
        )] => {
            assert!(at < 3000 && waited_ms < 3000, "{at} ms");
        }
        _ => panic!("{:?}", rig.events),
    }
}

#[test]
fn with_no_server_discovers_slow_down_after_the_first_30_s_and_a_late_server_still_leases() {
    let mut rig = Rig::new();
    rig.server.silent = true;
    rig.run(30_000);
    let fast = rig.server.discovers;
    assert!(
        (25..=31).contains(&fast),
        "{fast} DISCOVERs in the first 30 s"
    );
    rig.run(60_000);
    let slow = rig.server.discovers - fast;
    assert!((5..=7).contains(&slow), "{slow} DISCOVERs in the next 60 s");
    assert!(rig.events.is_empty(), "{:?}", rig.events);
    // A server that comes up late is heard within one slow interval.
    rig.server.silent = false;
    rig.run(12_000);
    assert_eq!(rig.address(), Some(LEASED), "{:?}", rig.events);
}
