// SPDX-License-Identifier: MIT OR Apache-2.0
//! NVMe/TCP over smoltcp over two vif queues joined by the fake netback: blkdom's
//! initiator (`nvmetcp`'s admin and I/O sessions, driven as the kernel's network test
//! drives them) against `nvmetcp`'s fake target behind the other stack. The admin queue
//! comes up, an I/O queue reads a block and writes one the target then holds; with
//! frames lost on the way too.

mod fake_netback;

use fake_netback::{leak, stack, Side};
use netfront::stack::Stack;
use nvmetcp::fake::{Target, BLOCK};
use nvmetcp::{AdminSession, DataPort, HostIdentity, IoSession, SessionState};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, Ipv4Address};

fn tcp_socket(stack: &mut Stack) -> SocketHandle {
    stack
        .add_tcp(leak([0u8; 65536]), leak([0u8; 65536]))
        .unwrap()
}

/// The world: blkdom's stack (a), the target's (b), the switch between them that
/// loses every `drop_every`-th frame, and one fake target per server socket.
struct World {
    a: Stack,
    b: Stack,
    side_a: Side,
    side_b: Side,
    targets: Vec<(SocketHandle, Target)>,
    now: u64,
    frames: usize,
    drop_every: Option<usize>,
}

impl World {
    fn step(&mut self) {
        self.now += 1;
        self.a.poll(self.now);
        self.b.poll(self.now);
        for side in [0, 1] {
            let (from, to) = if side == 0 {
                (&mut self.side_a, &mut self.side_b)
            } else {
                (&mut self.side_b, &mut self.side_a)
            };
            while let Some((_, frame)) = from.transmitted() {
                self.frames += 1;
                if self
                    .drop_every
                    .is_some_and(|n| self.frames.is_multiple_of(n))
                {
                    continue;
                }
                to.deliver(&frame);
            }
        }
        self.a.device.queue_mut().take_notify();
        self.b.device.queue_mut().take_notify();
        for (handle, target) in &mut self.targets {
            let socket = self.b.sockets.get_mut::<tcp::Socket>(*handle);
            if socket.can_recv() {
                socket
                    .recv(|data| {
                        target.input(data);
                        (data.len(), ())
                    })
                    .unwrap();
            }
            if !target.out.is_empty() && socket.can_send() {
                let sent = socket.send_slice(&target.out).unwrap();
                target.out.drain(..sent);
            }
        }
    }

    fn listen(&mut self) -> SocketHandle {
        let handle = tcp_socket(&mut self.b);
        let socket = self.b.sockets.get_mut::<tcp::Socket>(handle);
        socket.listen(4420).unwrap();
        self.targets.push((handle, Target::new()));
        handle
    }

    fn connect(&mut self, local: u16) -> SocketHandle {
        let handle = tcp_socket(&mut self.a);
        let context = self.a.iface.context();
        let socket = self.a.sockets.get_mut::<tcp::Socket>(handle);
        socket
            .connect(
                context,
                (IpAddress::Ipv4(Ipv4Address::new(10, 9, 0, 2)), 4420),
                local,
            )
            .unwrap();
        handle
    }
}

struct Blocks {
    read: Vec<u8>,
    write: Vec<u8>,
}

impl DataPort for Blocks {
    fn fetch(&mut self, _tag: u64, offset: u32, dst: &mut [u8]) {
        let at = offset as usize;
        dst.copy_from_slice(&self.write[at..at + dst.len()]);
    }
    fn deliver(&mut self, _tag: u64, offset: u32, src: &[u8]) {
        let at = offset as usize;
        self.read[at..at + src.len()].copy_from_slice(src);
    }
}

fn nvme_over_vifs(drop_every: Option<usize>) {
    let (a, side_a) = stack(1000, 1, 1, 4);
    let (b, side_b) = stack(5000, 2, 2, 4);
    let mut w = World {
        a,
        b,
        side_a,
        side_b,
        targets: Vec::new(),
        now: 0,
        frames: 0,
        drop_every,
    };
    let id = HostIdentity {
        host_nqn: "nqn.2014-08.org.nvmexpress:uuid:blkdom-test-host",
        host_id: [0x42; 16],
        subsystem_nqn: "nqn.2026-01.org.example:disk1",
    };
    // Admin queue.
    w.listen();
    let admin_socket = w.connect(50000);
    let mut admin = AdminSession::new(&id, 1, 0, 0, 60_000);
    while admin.state() == SessionState::Connecting {
        assert!(w.now < 60_000, "admin bring-up");
        w.step();
        let now = w.now;
        let socket = w.a.sockets.get_mut::<tcp::Socket>(admin_socket);
        if socket.can_recv() {
            socket
                .recv(|data| (data.len(), admin.receive(data, now)))
                .unwrap()
                .unwrap();
        }
        if admin.wants_to_send() && socket.can_send() {
            socket.send(|buf| (admin.transmit(buf), ())).unwrap();
        }
        admin.poll(now).unwrap();
    }
    assert_eq!(admin.state(), SessionState::Live);
    let ctrl = admin.controller().unwrap();
    let ns = admin.namespace().unwrap();
    assert_eq!(
        (ctrl.cntlid, ns.blocks, ns.block_size),
        (0x11, 256, BLOCK as u32)
    );
    // One I/O queue on its own connection: read block 3, write block 5 (in the capsule
    // and, at 16 blocks, by R2T), read block 5 back.
    w.listen();
    let io_socket = w.connect(50001);
    let mut io: IoSession<8> = IoSession::new(&id, &ctrl, ns, 1);
    let mut port = Blocks {
        read: vec![0; 16 * BLOCK],
        write: (0..16 * BLOCK).map(|i| (i * 13 + 1) as u8).collect(),
    };
    let commands = [(0u64, 3u64, 1u32), (1, 5, 1), (2, 20, 16), (3, 20, 16)];
    let mut next = 0;
    let mut in_flight = false;
    while next < commands.len() || in_flight {
        assert!(w.now < 120_000, "I/O: command {next}");
        w.step();
        let socket = w.a.sockets.get_mut::<tcp::Socket>(io_socket);
        if socket.can_recv() {
            socket
                .recv(|data| (data.len(), io.receive(data, &mut port)))
                .unwrap()
                .unwrap();
        }
        if io.state() == SessionState::Live && !in_flight && next < commands.len() {
            let (tag, lba, blocks) = commands[next];
            match tag {
                0 | 3 => io.read(tag, lba, blocks).unwrap(),
                _ => io.write(tag, lba, blocks).unwrap(),
            }
            next += 1;
            in_flight = true;
        }
        if io.wants_to_send() && socket.can_send() {
            socket
                .send(|buf| (io.transmit(buf, &mut port), ()))
                .unwrap();
        }
        if let Some(done) = io.next_completion() {
            assert!(
                done.status.is_success(),
                "command {}: {:?}",
                done.tag,
                done.status
            );
            if done.tag == 0 {
                let disk = &w.targets[1].1.disk;
                assert_eq!(&port.read[..BLOCK], &disk[3 * BLOCK..4 * BLOCK], "block 3");
            }
            in_flight = false;
        }
        assert!(
            !matches!(io.state(), SessionState::Failed(_)),
            "{:?}",
            io.state()
        );
    }
    let disk = &w.targets[1].1.disk;
    assert_eq!(
        &disk[5 * BLOCK..6 * BLOCK],
        &port.write[..BLOCK],
        "block 5 written"
    );
    assert_eq!(
        &disk[20 * BLOCK..36 * BLOCK],
        &port.write[..],
        "blocks 20-35 written"
    );
    assert_eq!(port.read, port.write, "blocks 20-35 read back");
    assert!(w.targets[1].1.r2ts > 0, "the 8 KiB write went by R2T");
    assert_eq!(w.a.device.queue().fault(), None);
}

#[test]
fn nvme_tcp_admin_and_io_over_two_vifs() {
    nvme_over_vifs(None);
}

#[test]
fn nvme_tcp_survives_lost_frames() {
    nvme_over_vifs(Some(13));
}
