// SPDX-License-Identifier: MIT OR Apache-2.0
//! NVMe/TCP over smoltcp over two vif queues joined by the fake netback: blkdom's
//! initiator (`nvmetcp`'s admin and I/O sessions, driven as the kernel's network test
//! drives them) against `nvmetcp`'s fake target behind the other stack. The admin queue
//! comes up, an I/O queue reads a block and writes one the target then holds; with
//! frames lost on the way too. And a 1 MiB read with the target's segments coalesced
//! into 64 KiB GSO packets on the way to blkdom, as dom0's netback hands them over.

mod fake_netback;

use fake_netback::{leak, stack, Coalescer, Side};
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
    /// Joins the target's segments into GSO packets for blkdom.
    gso: Option<Coalescer>,
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
            while let Some(sent) = from.transmitted_packet() {
                self.frames += 1;
                if self
                    .drop_every
                    .is_some_and(|n| self.frames.is_multiple_of(n))
                {
                    continue;
                }
                if sent.flags & xen::abi::netif::NETTXF_CSUM_BLANK != 0 {
                    to.pass(&sent);
                    continue;
                }
                let frame = sent.packet;
                match &mut self.gso {
                    Some(coalescer) if side == 1 => coalescer.push(frame, to),
                    _ => {
                        to.deliver(&frame);
                    }
                }
            }
        }
        if let Some(coalescer) = &mut self.gso {
            coalescer.idle(&mut self.side_a);
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

fn world(drop_every: Option<usize>, gso: bool) -> World {
    let (a, side_a) = stack(1000, 1, 1, 4);
    let (b, side_b) = stack(5000, 2, 2, 4);
    World {
        a,
        b,
        side_a,
        side_b,
        targets: Vec::new(),
        now: 0,
        frames: 0,
        drop_every,
        gso: gso.then(Coalescer::default),
    }
}

const ID: HostIdentity = HostIdentity {
    host_nqn: "nqn.2014-08.org.nvmexpress:uuid:blkdom-test-host",
    host_id: [0x42; 16],
    subsystem_nqn: "nqn.2026-01.org.example:disk1",
};

/// Brings the admin queue up against a target `configure` set up: the controller and
/// the namespace.
fn admin_bring_up(
    w: &mut World,
    configure: impl FnOnce(&mut Target),
) -> (nvmetcp::ControllerInfo, nvmetcp::NamespaceInfo) {
    let id = ID;
    w.listen();
    configure(&mut w.targets.last_mut().unwrap().1);
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
    (admin.controller().unwrap(), admin.namespace().unwrap())
}

/// One step of the world with an I/O queue on `socket`: what came in goes to `io`,
/// `submit` may give it commands once it is live, and what it has to send goes out.
fn io_step(
    w: &mut World,
    socket: SocketHandle,
    io: &mut IoSession<8>,
    port: &mut Blocks,
    submit: impl FnOnce(&mut IoSession<8>),
) {
    w.step();
    let socket = w.a.sockets.get_mut::<tcp::Socket>(socket);
    if socket.can_recv() {
        socket
            .recv(|data| (data.len(), io.receive(data, port)))
            .unwrap()
            .unwrap();
    }
    if io.state() == SessionState::Live {
        submit(io);
    }
    if io.wants_to_send() && socket.can_send() {
        socket.send(|buf| (io.transmit(buf, port), ())).unwrap();
    }
}

/// Steps the world until the one command `submit` gives `io` (once it is live)
/// completes, successfully.
fn complete_one(
    w: &mut World,
    socket: SocketHandle,
    io: &mut IoSession<8>,
    port: &mut Blocks,
    what: &str,
    mut submit: impl FnMut(&mut IoSession<8>),
) {
    let mut submitted = false;
    let done = loop {
        assert!(w.now < 120_000, "{what}");
        io_step(w, socket, io, port, |io| {
            if !submitted {
                submit(io);
                submitted = true;
            }
        });
        if let Some(done) = io.next_completion() {
            break done;
        }
        assert!(
            !matches!(io.state(), SessionState::Failed(_)),
            "{:?}",
            io.state()
        );
    };
    assert!(done.status.is_success(), "{what}: {:?}", done.status);
}

fn nvme_over_vifs(drop_every: Option<usize>) {
    let mut w = world(drop_every, false);
    let id = ID;
    let (ctrl, ns) = admin_bring_up(&mut w, |_| {});
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
        io_step(&mut w, io_socket, &mut io, &mut port, |io| {
            if !in_flight && next < commands.len() {
                let (tag, lba, blocks) = commands[next];
                match tag {
                    0 | 3 => io.read(tag, lba, blocks).unwrap(),
                    _ => io.write(tag, lba, blocks).unwrap(),
                }
                next += 1;
                in_flight = true;
            }
        });
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

/// A 1 MiB read whose data comes to blkdom in 64 KiB GSO packets (the target's C2HData
/// PDUs of 128 KiB over 1460-byte segments, joined as dom0 joins them), byte for byte.
#[test]
fn nvme_tcp_reads_a_mebibyte_over_gso_packets() {
    const READ: usize = 1 << 20;
    let mut w = world(None, true);
    let id = ID;
    let disk: Vec<u8> = (0..4 * READ).map(|i| (i * 7 + i / 4096) as u8).collect();
    let (ctrl, ns) = admin_bring_up(&mut w, |target| {
        target.disk = disk.clone();
        // MDTS 8: 4 KiB << 8, a 1 MiB transfer.
        target.mdts = 8;
    });
    assert_eq!(ns.blocks, (4 * READ / BLOCK) as u64);
    w.listen();
    w.targets[1].1.disk = disk.clone();
    w.targets[1].1.c2h_chunk = 128 << 10;
    let io_socket = w.connect(50001);
    let mut io: IoSession<8> = IoSession::new(&id, &ctrl, ns, 1);
    let mut port = Blocks {
        read: vec![0; READ],
        write: Vec::new(),
    };
    let lba = 1000u64;
    complete_one(
        &mut w,
        io_socket,
        &mut io,
        &mut port,
        "the 1 MiB read",
        |io| io.read(7, lba, (READ / BLOCK) as u32).unwrap(),
    );
    let at = lba as usize * BLOCK;
    assert!(port.read[..] == disk[at..at + READ], "the 1 MiB read back");
    let coalesced = w.gso.as_ref().unwrap();
    let stats = w.a.device.queue().stats;
    // Packets of many pages: as long as what the target let out in a row.
    assert!(coalesced.longest > 40_000, "longest {}", coalesced.longest);
    assert_eq!(stats.rx_gso, coalesced.gso_packets as u64);
    assert!(
        stats.rx_gso >= (READ / 65536) as u64,
        "{} GSO packets",
        stats.rx_gso
    );
    assert_eq!((stats.rx_dropped, w.a.device.stats.rx_bad_checksum), (0, 0));
    assert_eq!(w.a.device.queue().fault(), None);
}

/// A 1 MiB write whose data leaves blkdom in GSO packets (its H2CData segments joined
/// by the netfront), byte for byte on the target's disk.
#[test]
fn nvme_tcp_writes_a_mebibyte_in_gso_packets() {
    const WRITE: usize = 1 << 20;
    let mut w = world(None, false);
    w.a.device.set_tx_gso();
    let id = ID;
    let (ctrl, ns) = admin_bring_up(&mut w, |target| {
        target.disk = vec![0; 4 * WRITE];
        target.mdts = 8;
    });
    w.listen();
    w.targets[1].1.disk = vec![0; 4 * WRITE];
    let io_socket = w.connect(50001);
    let mut io: IoSession<8> = IoSession::new(&id, &ctrl, ns, 1);
    let mut port = Blocks {
        read: Vec::new(),
        write: (0..WRITE).map(|i| (i * 11 + i / 4096) as u8).collect(),
    };
    let lba = 500u64;
    complete_one(
        &mut w,
        io_socket,
        &mut io,
        &mut port,
        "the 1 MiB write",
        |io| io.write(9, lba, (WRITE / BLOCK) as u32).unwrap(),
    );
    let at = lba as usize * BLOCK;
    assert!(
        w.targets[1].1.disk[at..at + WRITE] == port.write[..],
        "the 1 MiB written"
    );
    let joined = w.a.device.join_stats();
    assert!(
        w.side_a.tx_gso >= (WRITE / 65536),
        "{} GSO packets",
        w.side_a.tx_gso
    );
    assert_eq!(joined.packets, w.side_a.tx_gso as u64);
    assert!(joined.segments > 8 * joined.packets, "{joined:?}");
    assert_eq!(w.side_a.tx_bad_partial, 0);
    assert_eq!(w.a.device.queue().fault(), None);
}
