// SPDX-License-Identifier: MIT OR Apache-2.0
//! A remote namespace served through disk queues, against the fake target over a fake
//! network that can refuse, stay silent, cut connections and come back.

use super::*;
use crate::fake::{Target, HOST_NQN, SUBNQN};
use crate::sqe::Status;
use crate::{AnaState, ConnectRefusal};
use blkdev::{
    BlockDevice, BufferAccess, Completion, DmaSegment, FaultKind, IoOp, IoRequest, IoStatus,
};
use std::cell::RefCell;

const BASE: u64 = 0x1000_0000;
const PAGES: usize = 1024;
const DISK: usize = 8 << 20;

/// Connections a remote may open: the admin queue's, one per I/O queue, a probe's.
const LINKS: usize = MAX_LINKS;

/// The target's side of the network: each link a fake target connection, the
/// namespace's data kept across connections and shared by the I/O queues'.
struct FakeNet {
    /// The target listens; false: connections are refused (reset).
    up: bool,
    /// Nothing answers: connections stay opening.
    silent: bool,
    links: Vec<Option<Target>>,
    states: Vec<LinkState>,
    disk: Vec<u8>,
    knobs: fn(&mut Target),
    /// The controller behind the portal a probe reaches (`None`: as `knobs`).
    probe_knobs: Option<fn(&mut Target)>,
    /// Probes opened.
    probes: usize,
    /// Commands sent on the I/O queues vanish: the target never answers them.
    stall_io: bool,
    /// Bytes that vanished so.
    stalled: usize,
    chunk: usize,
    opens: usize,
    /// Connections the target dropped (`Target::poison_lba`).
    drops: usize,
    /// Open links the host closed, in order, each with the shutdown notifications its
    /// controller had received by then.
    closed: Vec<(Link, u32)>,
}

impl FakeNet {
    fn new(knobs: fn(&mut Target)) -> FakeNet {
        FakeNet {
            up: true,
            silent: false,
            links: (0..LINKS).map(|_| None).collect(),
            states: vec![LinkState::Closed; LINKS],
            disk: (0..DISK).map(|i| (i / 512) as u8 ^ (i as u8)).collect(),
            knobs,
            probe_knobs: None,
            probes: 0,
            stall_io: false,
            stalled: 0,
            chunk: 1,
            opens: 0,
            drops: 0,
            closed: Vec::new(),
        }
    }

    /// The target goes away: its connections close, new ones are refused.
    fn crash(&mut self) {
        for at in 0..LINKS {
            self.links[at] = None;
            if self.states[at] != LinkState::Refused {
                self.states[at] = LinkState::Closed;
            }
        }
        self.up = false;
    }

    /// The target connection of I/O queue `n`, while open.
    fn io(&self, n: u16) -> Option<&Target> {
        self.links[Link::Io(n).index()].as_ref()
    }

    fn next_chunk(&mut self) -> usize {
        self.chunk = (self.chunk * 7 + 3) % 9000 + 1;
        self.chunk
    }
}

impl Transport for FakeNet {
    fn open(&mut self, link: Link) {
        self.opens += 1;
        let at = link.index();
        self.links[at] = None;
        if self.silent {
            self.states[at] = LinkState::Opening;
            return;
        }
        if !self.up {
            self.states[at] = LinkState::Refused;
            return;
        }
        let mut t = Target::new();
        match (link, self.probe_knobs) {
            (Link::Probe, Some(knobs)) => knobs(&mut t),
            _ => (self.knobs)(&mut t),
        }
        self.probes += usize::from(link == Link::Probe);
        // The admin queue's identifies the namespace by its size; the I/O queues' get
        // the shared data while they take input.
        t.disk = match link {
            Link::Admin | Link::Probe => vec![0; DISK],
            Link::Io(_) => Vec::new(),
        };
        self.links[at] = Some(t);
        self.states[at] = LinkState::Open;
    }

    fn state(&mut self, link: Link) -> LinkState {
        self.states[link.index()]
    }

    fn recv(&mut self, link: Link, f: &mut dyn FnMut(&[u8]) -> usize) {
        let n = self.next_chunk();
        if let Some(t) = self.links[link.index()].as_mut() {
            let k = n.min(t.out.len());
            if k > 0 {
                let used = f(&t.out[..k]);
                t.out.drain(..used);
            }
        }
    }

    fn send(&mut self, link: Link, f: &mut dyn FnMut(&mut [u8]) -> usize) {
        let n = self.next_chunk();
        if let Some(t) = self.links[link.index()].as_mut() {
            let mut buf = vec![0u8; n];
            let k = f(&mut buf);
            if let (Link::Io(_), true) = (link, self.stall_io) {
                self.stalled += k;
                return;
            }
            if let Link::Io(_) = link {
                t.disk = core::mem::take(&mut self.disk);
                t.input(&buf[..k]);
                self.disk = core::mem::take(&mut t.disk);
            } else {
                t.input(&buf[..k]);
            }
            if t.dropped {
                // The target drops the connection (a poisoned command).
                self.drops += 1;
                self.links[link.index()] = None;
                self.states[link.index()] = LinkState::Closed;
            }
        }
    }

    fn close(&mut self, link: Link) {
        let at = link.index();
        if let Some(t) = self.links[at].take() {
            self.closed.push((link, t.shutdowns));
        }
        if self.states[at] == LinkState::Open {
            self.states[at] = LinkState::Closed;
        }
    }
}

/// The guests' pages: `PAGES` pages from `BASE`.
struct Mem(RefCell<Vec<u8>>);

impl Memory for Mem {
    fn read(&self, address: u64, out: &mut [u8]) {
        let at = (address - BASE) as usize;
        out.copy_from_slice(&self.0.borrow()[at..at + out.len()]);
    }
    fn write(&self, address: u64, data: &[u8]) {
        let at = (address - BASE) as usize;
        self.0.borrow_mut()[at..at + data.len()].copy_from_slice(data);
    }
}

/// Buffers are page numbers in `Mem`.
struct Pages;

impl BufferAccess for Pages {
    fn read_buffer(&self, _: u64, _: usize, _: &mut [u8]) -> bool {
        false
    }
    fn write_buffer(&self, _: u64, _: usize, _: &[u8]) -> bool {
        false
    }
    fn cpu_address(&self, buffer: u64, offset: usize, len: usize) -> Option<u64> {
        (buffer < PAGES as u64 && offset + len <= 4096)
            .then(|| BASE + buffer * 4096 + offset as u64)
    }
}

struct Rig {
    net: FakeNet,
    mem: Mem,
    remote: Remote,
    now: u64,
    events: Vec<Event>,
}

impl Rig {
    fn new(knobs: fn(&mut Target)) -> Rig {
        Rig::with_timing(knobs, Timing::DEFAULT)
    }

    fn with_timing(knobs: fn(&mut Target), timing: Timing) -> Rig {
        Rig {
            net: FakeNet::new(knobs),
            mem: Mem(RefCell::new(vec![0; PAGES * 4096])),
            remote: Remote::new(HOST_NQN, [7; 16], SUBNQN, 1, timing, 0),
            now: 0,
            events: Vec::new(),
        }
    }

    fn step(&mut self) {
        let events = &mut self.events;
        let mut moved = false;
        self.remote
            .poll(&mut self.net, &self.mem, self.now, &mut |e| {
                moved |= matches!(e, Event::Moved { .. });
                events.push(e)
            });
        // As the caller's transport does: the association's next connections go to the
        // portal the probe reached.
        if let (true, Some(knobs)) = (moved, self.net.probe_knobs) {
            self.net.knobs = knobs;
        }
        self.now += 1;
    }

    /// Closes the association now ([`Remote::close`]); what it logged at once.
    fn close(&mut self) -> Vec<Event> {
        let mut log = Vec::new();
        self.remote
            .close(&mut self.net, self.now, &mut |e| log.push(e));
        log
    }

    /// Polls until the first bring-up ends (live or failed).
    fn bring_up(&mut self) -> State {
        while self.remote.state() == State::Connecting && self.now < 60_000 {
            self.step();
        }
        self.remote.state()
    }

    /// Polls (1 ms a pass) until `queues` report `want` completions or `ms` passed.
    fn run(&mut self, queues: &mut [&mut DiskQueue], want: usize, ms: u64) -> Vec<Completion> {
        let mut done = Vec::new();
        let end = self.now + ms;
        while done.len() < want && self.now < end {
            self.step();
            for q in queues.iter_mut() {
                q.poll_completions(&mut |c| done.push(c));
            }
        }
        done
    }
}

/// `pages` consecutive whole pages from `first`.
fn segments(first: u64, pages: usize) -> Vec<DmaSegment> {
    (0..pages as u64)
        .map(|p| DmaSegment {
            buffer: first + p,
            offset: 0,
            len: 4096,
        })
        .collect()
}

fn request(tag: u32, op: IoOp, sector: u64, segs: &[DmaSegment]) -> IoRequest<'_> {
    let bytes: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
    IoRequest {
        tag,
        op,
        sector,
        nr_sectors: bytes / 512,
        preflush: false,
        segments: segs,
    }
}

fn live() -> (Rig, DiskQueue, DiskQueue) {
    let mut rig = Rig::new(|_| {});
    assert_eq!(rig.bring_up(), State::Live);
    let a = rig.remote.add_queue().unwrap();
    let b = rig.remote.add_queue().unwrap();
    (rig, a, b)
}

#[test]
fn a_remote_namespace_serves_reads_writes_flushes_and_discards() {
    let (mut rig, mut a, mut b) = live();
    let g = a.geometry();
    assert_eq!(
        (g.sectors, g.logical_block_size),
        ((DISK / 512) as u64, 512)
    );
    assert!(g.flush && g.discard.is_some());
    assert!(matches!(
        rig.events[..],
        [Event::Live {
            reconnect: false,
            ..
        }]
    ));
    // A 1 MiB write (8 commands at the fake's MDTS of 128 KiB) from pages 0..256 with a
    // pattern, through queue a; read back through queue b into pages 256..512.
    for (i, byte) in rig.mem.0.borrow_mut()[..1 << 20].iter_mut().enumerate() {
        *byte = (i * 13 + i / 4096) as u8;
    }
    let w = segments(0, 256);
    a.submit(&request(1, IoOp::Write, 2048, &w), &Pages)
        .unwrap();
    let done = rig.run(&mut [&mut a], 1, 10_000);
    assert_eq!(
        done,
        [Completion {
            tag: 1,
            status: IoStatus::Ok
        }]
    );
    let r = segments(256, 256);
    b.submit(&request(2, IoOp::Read, 2048, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut b], 1, 10_000);
    assert_eq!(
        done,
        [Completion {
            tag: 2,
            status: IoStatus::Ok
        }]
    );
    {
        let mem = rig.mem.0.borrow();
        assert!(
            mem[..1 << 20] == mem[1 << 20..2 << 20],
            "read back what was written"
        );
    }
    // Partial pages (a segment inside a page), many requests at once on both queues.
    let mut tags = 0;
    for i in 0..40u64 {
        let seg = [DmaSegment {
            buffer: 600 + i,
            offset: 512,
            len: 1024,
        }];
        let q = if i % 2 == 0 { &mut a } else { &mut b };
        q.submit(&request(100 + i as u32, IoOp::Read, i * 2, &seg), &Pages)
            .unwrap();
        tags += 1;
    }
    let done = rig.run(&mut [&mut a, &mut b], tags, 10_000);
    assert_eq!(done.len(), tags);
    assert!(done.iter().all(|c| c.status == IoStatus::Ok));
    for i in 0..40usize {
        let at = (600 + i) * 4096 + 512;
        let disk_at = i * 1024;
        let want: Vec<u8> = (disk_at..disk_at + 1024)
            .map(|j| (j / 512) as u8 ^ (j as u8))
            .collect();
        assert_eq!(rig.mem.0.borrow()[at..at + 1024], want[..], "read {i}");
    }
    // A flush, a write with a pre-flush, and a discard.
    a.submit(&request(7, IoOp::Flush, u64::MAX, &[]), &Pages)
        .unwrap();
    let mut pre = request(8, IoOp::Write, 0, &w[..1]);
    pre.preflush = true;
    a.submit(&pre, &Pages).unwrap();
    let discard = IoRequest {
        tag: 9,
        op: IoOp::Discard { secure: false },
        sector: 4096,
        nr_sectors: 64,
        preflush: false,
        segments: &[],
    };
    b.submit(&discard, &Pages).unwrap();
    let done = rig.run(&mut [&mut a, &mut b], 3, 10_000);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|c| c.status == IoStatus::Ok));
    let disk = &rig.net.disk;
    assert!(
        disk[4096 * 512..4160 * 512].iter().all(|&b| b == 0),
        "discarded"
    );
    assert_eq!(
        disk[..4096],
        rig.mem.0.borrow()[..4096],
        "written after its flush"
    );
    assert_eq!(a.in_flight() + b.in_flight(), 0);
}

#[test]
fn requests_the_queue_cannot_take_are_refused_before_they_go() {
    let (_rig, mut a, _) = live();
    let sectors = a.geometry().sectors;
    let w = segments(0, 2);
    // Past the end.
    let past = request(1, IoOp::Write, sectors - 8, &w);
    assert_eq!(a.submit(&past, &Pages), Err(blkdev::SubmitError::Invalid));
    // A buffer with no CPU address.
    let bad = [DmaSegment {
        buffer: PAGES as u64,
        offset: 0,
        len: 4096,
    }];
    assert_eq!(
        a.submit(&request(2, IoOp::Read, 0, &bad), &Pages),
        Err(blkdev::SubmitError::Invalid)
    );
    // Full after SLOTS requests.
    for tag in 0..SLOTS as u32 {
        a.submit(&request(tag, IoOp::Read, 0, &w), &Pages).unwrap();
    }
    assert_eq!(
        a.submit(&request(99, IoOp::Read, 0, &w), &Pages),
        Err(blkdev::SubmitError::QueueFull)
    );
}

fn failure(knobs: fn(&mut Target), net: impl FnOnce(&mut FakeNet)) -> (Failure, u64) {
    let mut rig = Rig::new(knobs);
    net(&mut rig.net);
    match rig.bring_up() {
        State::Failed(f) => (f, rig.now),
        other => panic!("bring-up ended {other:?}"),
    }
}

#[test]
fn a_failed_first_bring_up_starts_again_on_request() {
    let mut rig = Rig::new(|_| {});
    rig.net.up = false;
    assert_eq!(rig.bring_up(), State::Failed(Failure::Refused));
    // The caller's transport now leads to a portal that answers.
    rig.net.up = true;
    assert!(rig.remote.retry_first_bring_up());
    assert_eq!(rig.bring_up(), State::Live);
    assert_eq!(rig.remote.counters().associations, 1);
    // Only a failed first bring-up starts again.
    assert!(!rig.remote.retry_first_bring_up());
    assert_eq!(rig.remote.state(), State::Live);
}

#[test]
fn each_way_a_first_bring_up_fails_is_named() {
    let (f, _) = failure(|_| {}, |n| n.up = false);
    assert_eq!(f, Failure::Refused);
    assert_eq!(
        (f.to_string().as_str(), f.errno()),
        ("connection refused (reset)", 111)
    );

    let (f, at) = failure(|_| {}, |n| n.silent = true);
    assert_eq!(f, Failure::NoAnswer);
    assert!(
        (5_000..5_010).contains(&at),
        "given up at the connect timeout, {at} ms"
    );
    assert!(f.to_string().contains("no route, no ARP reply"));
    assert_eq!(f.errno(), 110);

    let (f, _) = failure(
        |t| t.connect_status = Some((Status(Status::new(1, 0x82).0 | 1 << 14), (1 << 16) | 256)),
        |_| {},
    );
    assert_eq!(
        f,
        Failure::Session(Error::ConnectRefused(ConnectRefusal::UnknownSubsystem))
    );
    assert!(f.to_string().contains("no subsystem of that NQN"));
    assert_eq!(f.errno(), 19);

    let (f, _) = failure(
        |t| t.connect_status = Some((Status(Status::new(1, 0x84).0 | 1 << 14), (1 << 16) | 512)),
        |_| {},
    );
    assert_eq!(
        f,
        Failure::Session(Error::ConnectRefused(ConnectRefusal::HostNotAllowed))
    );
    assert_eq!(f.errno(), 13);

    let (f, _) = failure(|t| t.nsid = 2, |_| {});
    assert_eq!(f, Failure::Session(Error::NamespaceMissing(1)));
    assert_eq!(f.to_string(), "namespace 1 does not exist");
    assert_eq!(f.errno(), 19);
}

#[test]
fn requests_are_held_while_the_target_is_away_and_served_when_it_is_back() {
    let (mut rig, mut a, mut b) = live();
    for (i, byte) in rig.mem.0.borrow_mut()[..64 << 12].iter_mut().enumerate() {
        *byte = (i * 31 + 5) as u8;
    }
    let w = segments(0, 64);
    // In flight when the target goes: a 256 KiB write and reads.
    a.submit(&request(1, IoOp::Write, 8192, &w), &Pages)
        .unwrap();
    let r = segments(100, 8);
    b.submit(&request(2, IoOp::Read, 0, &r), &Pages).unwrap();
    rig.step();
    rig.step();
    rig.net.crash();
    // 20 s away: nothing completes, and requests submitted meanwhile wait too.
    let done = rig.run(&mut [&mut a, &mut b], 1, 10_000);
    assert!(done.is_empty(), "held, not failed: {done:?}");
    b.submit(&request(3, IoOp::Read, 64, &segments(200, 8)), &Pages)
        .unwrap();
    let done = rig.run(&mut [&mut a, &mut b], 1, 10_000);
    assert!(done.is_empty(), "held, not failed: {done:?}");
    assert!(rig.remote.busy() && a.fault().is_none());
    let attempts = rig
        .events
        .iter()
        .filter(|e| matches!(e, Event::AttemptFailed(Failure::Refused)))
        .count();
    assert!(
        (4..=5).contains(&attempts),
        "at once, then every 5 s: {attempts}"
    );
    assert!(matches!(rig.events[1], Event::Lost(_)));
    let counters = rig.remote.counters();
    assert_eq!((counters.associations, counters.losses), (1, 1));
    assert_eq!(counters.failed_attempts as usize, attempts);
    assert_eq!(rig.remote.in_flight(), 3, "the write and both reads held");
    rig.net.up = true;
    let done = rig.run(&mut [&mut a, &mut b], 3, 20_000);
    assert_eq!(done.len(), 3, "{:?}", rig.events);
    assert!(done.iter().all(|c| c.status == IoStatus::Ok), "{done:?}");
    assert!(rig.events.iter().any(|e| matches!(
        e,
        Event::Live {
            reconnect: true,
            ..
        }
    )));
    let counters = rig.remote.counters();
    assert_eq!((counters.associations, counters.losses), (2, 1));
    assert_eq!(rig.remote.in_flight(), 0);
    let mem = rig.mem.0.borrow();
    let disk = &rig.net.disk;
    assert!(
        disk[8192 * 512..8192 * 512 + (64 << 12)] == mem[..64 << 12],
        "the held write landed"
    );
    let want: Vec<u8> = (0..16 << 12).map(|j| (j / 512) as u8 ^ (j as u8)).collect();
    assert!(
        mem[100 << 12..108 << 12] == want[..8 << 12],
        "the held read was served"
    );
    assert!(
        mem[200 << 12..208 << 12] == want[8 << 12..],
        "the read sent while away too"
    );
}

/// A remote asking for `asked` I/O queues of a target that allots `allotted`, live,
/// with `channels` disk queues.
fn live_with_io_queues(asked: u16, allotted: u16, channels: usize) -> (Rig, Vec<DiskQueue>) {
    let mut rig = Rig::new(match allotted {
        2 => |t: &mut Target| t.io_queues = Some(2),
        _ => |t: &mut Target| t.io_queues = Some(128),
    });
    rig.remote =
        Remote::new(HOST_NQN, [7; 16], SUBNQN, 1, Timing::DEFAULT, 0).with_io_queues(asked);
    assert_eq!(rig.bring_up(), State::Live);
    let queues = (0..channels)
        .map(|c| {
            let queue = rig.remote.add_queue().unwrap();
            // Submitted from vCPU c.
            queue
                .shared()
                .producer_cpu
                .store(c as u32, core::sync::atomic::Ordering::Relaxed);
            queue
        })
        .collect();
    (rig, queues)
}

/// Reads 4 KiB from every queue (channel `c`: sector `8 c`, into page `c`) and checks
/// the data.
fn read_on_every_queue(rig: &mut Rig, queues: &mut [DiskQueue]) {
    let segs: Vec<_> = (0..queues.len()).map(|c| segments(c as u64, 1)).collect();
    for (c, q) in queues.iter_mut().enumerate() {
        q.submit(
            &request(c as u32, IoOp::Read, 8 * c as u64, &segs[c]),
            &Pages,
        )
        .unwrap();
    }
    let mut all: Vec<&mut DiskQueue> = queues.iter_mut().collect();
    let done = rig.run(&mut all, segs.len(), 10_000);
    assert_eq!(done.len(), segs.len(), "{:?}", rig.events);
    assert!(done.iter().all(|c| c.status == IoStatus::Ok), "{done:?}");
    let mem = rig.mem.0.borrow();
    for c in 0..segs.len() {
        let want: Vec<u8> = (c * 4096..(c + 1) * 4096)
            .map(|j| (j / 512) as u8 ^ (j as u8))
            .collect();
        assert!(
            mem[c << 12..(c + 1) << 12] == want[..],
            "channel {c}'s read"
        );
    }
}

#[test]
fn each_io_queue_has_its_own_connection_and_serves_its_channels() {
    let (mut rig, mut queues) = live_with_io_queues(3, 128, 6);
    assert_eq!(rig.remote.io_queues(), 3);
    assert!(matches!(
        rig.events[..],
        [Event::Live {
            io_queues: 3,
            reconnect: false,
            ..
        }]
    ));
    for n in 0..3u16 {
        let t = rig.net.io(n).expect("its connection is open");
        assert_eq!(
            t.connects
                .iter()
                .map(|c| (c.qid, c.cntlid))
                .collect::<Vec<_>>(),
            [(n + 1, 0x11)],
            "I/O queue {n} connects as queue {} of the admin's controller",
            n + 1
        );
    }
    assert!(rig.net.io(3).is_none(), "no fourth connection");
    read_on_every_queue(&mut rig, &mut queues);
    // The request of vCPU c goes on queue c mod 3: two reads each.
    for n in 0..3u16 {
        assert_eq!(rig.net.io(n).unwrap().io_commands, 2, "queue {n}");
    }
}

#[test]
fn a_controller_that_allots_fewer_io_queues_gets_the_vcpus_spread_over_those() {
    let (mut rig, mut queues) = live_with_io_queues(4, 2, 4);
    assert_eq!(rig.remote.io_queues(), 2);
    assert!(matches!(rig.events[..], [Event::Live { io_queues: 2, .. }]));
    assert!(rig.net.io(2).is_none() && rig.net.io(3).is_none());
    read_on_every_queue(&mut rig, &mut queues);
    assert_eq!(rig.net.io(0).unwrap().io_commands, 2);
    assert_eq!(rig.net.io(1).unwrap().io_commands, 2);
}

#[test]
fn a_request_goes_on_the_io_queue_of_the_vcpu_that_submitted_it() {
    let (mut rig, mut queues) = live_with_io_queues(2, 128, 2);
    // Both disk queues served from vCPU 3 (the ring moved there): queue 3 mod 2.
    for q in &queues {
        q.shared()
            .producer_cpu
            .store(3, core::sync::atomic::Ordering::Relaxed);
    }
    read_on_every_queue(&mut rig, &mut queues);
    assert_eq!(rig.net.io(0).unwrap().io_commands, 0);
    assert_eq!(rig.net.io(1).unwrap().io_commands, 2);
}

#[test]
fn one_io_connection_lost_holds_every_queue_and_the_association_comes_back_whole() {
    let (mut rig, mut queues) = live_with_io_queues(2, 128, 2);
    // Requests on both queues, then only queue 1's connection breaks.
    let segs: Vec<_> = (0..2).map(|c| segments(c as u64, 1)).collect();
    for (c, q) in queues.iter_mut().enumerate() {
        q.submit(
            &request(c as u32, IoOp::Read, 8 * c as u64, &segs[c]),
            &Pages,
        )
        .unwrap();
    }
    rig.step();
    rig.net.close(Link::Io(1));
    let mut all: Vec<&mut DiskQueue> = queues.iter_mut().collect();
    let done = rig.run(&mut all, 2, 10_000);
    assert!(done.iter().all(|c| c.status == IoStatus::Ok), "{done:?}");
    assert_eq!(done.len(), 2, "{:?}", rig.events);
    // A read may have been served before the connection broke: the reconnect may still
    // be under way.
    let until = rig.now + 10_000;
    while rig.events.len() < 3 && rig.now < until {
        rig.step();
    }
    assert!(matches!(rig.events[1], Event::Lost(Failure::Closed)));
    assert!(matches!(
        rig.events[2],
        Event::Live {
            io_queues: 2,
            reconnect: true,
            ..
        }
    ));
    // The new association connected both queues again, each once.
    for n in 0..2u16 {
        let t = rig.net.io(n).unwrap();
        assert_eq!(t.connects.len(), 1, "queue {n} on its new connection");
    }
    read_on_every_queue(&mut rig, &mut queues);
}

/// Submits a read (tag 1) on `a` and takes the target away for good: when.
fn lose_with_a_read(rig: &mut Rig, a: &mut DiskQueue) -> u64 {
    a.submit(&request(1, IoOp::Read, 0, &segments(0, 1)), &Pages)
        .unwrap();
    rig.net.crash();
    rig.now
}

/// Polls until the read of `lose_with_a_read` fails: how long after the loss (`lost`).
fn failed_after(rig: &mut Rig, a: &mut DiskQueue, lost: u64) -> u64 {
    let done = rig.run(&mut [&mut *a], 1, 700_000);
    assert_eq!(
        done,
        [Completion {
            tag: 1,
            status: IoStatus::Error
        }]
    );
    rig.now - lost
}

fn failed_attempts(rig: &Rig) -> usize {
    rig.events
        .iter()
        .filter(|e| matches!(e, Event::AttemptFailed(_)))
        .count()
}

#[test]
fn a_target_that_never_comes_back_fails_the_disk_after_the_give_up_time() {
    let (mut rig, mut a, _b) = live();
    let lost = lose_with_a_read(&mut rig, &mut a);
    let waited = failed_after(&mut rig, &mut a, lost);
    assert!(
        (600_000..600_010).contains(&waited),
        "failed {waited} ms after the loss"
    );
    let fault = a.fault().expect("the queue reports the fault");
    assert!(matches!(fault.kind, FaultKind::TargetGone { waited_ms } if waited_ms >= 600_000));
    assert!(fault.to_string().contains("unreachable for 600 s"));
    assert!(matches!(rig.events.last(), Some(Event::GaveUp { .. })));
    // Later requests fail at once, and a new queue is born failed.
    let r = segments(0, 1);
    a.submit(&request(2, IoOp::Read, 0, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut a], 1, 10);
    assert_eq!(
        done,
        [Completion {
            tag: 2,
            status: IoStatus::Error
        }]
    );
    assert!(rig.remote.add_queue().unwrap().fault().is_some());
}

/// A remote that gave up, the target away for good (`up` false), its request failed.
fn given_up() -> (Rig, DiskQueue) {
    let (mut rig, mut a, _b) = live();
    let r = segments(0, 1);
    a.submit(&request(1, IoOp::Read, 0, &r), &Pages).unwrap();
    rig.net.crash();
    assert_eq!(rig.run(&mut [&mut a], 1, 700_000).len(), 1);
    assert_eq!(rig.remote.state(), State::GaveUp);
    (rig, a)
}

#[test]
fn a_remote_that_gave_up_serves_again_once_revived_with_the_target_back() {
    let (mut rig, mut a) = given_up();
    assert!(a.fault().is_some());
    rig.net.up = true;
    assert!(rig.remote.revive(rig.now));
    assert!(a.fault().is_none(), "the queue takes requests again");
    assert!(rig.remote.add_queue().unwrap().fault().is_none());
    let r = segments(0, 1);
    a.submit(&request(3, IoOp::Read, 8, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut a], 1, 10_000);
    assert_eq!(
        done,
        [Completion {
            tag: 3,
            status: IoStatus::Ok
        }]
    );
    assert_eq!(rig.remote.state(), State::Live);
    assert!(matches!(
        rig.events.last(),
        Some(Event::Live {
            reconnect: true,
            ..
        })
    ));
    // Only a remote that gave up is revived.
    assert!(!rig.remote.revive(rig.now));
}

#[test]
fn a_revival_with_the_target_still_away_says_why_and_can_give_up_at_once() {
    let (mut rig, mut a) = given_up();
    assert!(rig.remote.revive(rig.now));
    let r = segments(0, 1);
    a.submit(&request(4, IoOp::Read, 8, &r), &Pages).unwrap();
    // Held while it tries (refused: nothing listens).
    assert!(rig.run(&mut [&mut a], 1, 8_000).is_empty());
    assert_eq!(rig.remote.last_failure(), Some(Failure::Refused));
    let events = &mut Vec::new();
    rig.remote.give_up(rig.now, &mut |e| events.push(e));
    assert!(matches!(events[..], [Event::GaveUp { .. }]));
    let done = rig.run(&mut [&mut a], 1, 10);
    assert_eq!(
        done,
        [Completion {
            tag: 4,
            status: IoStatus::Error
        }]
    );
    assert!(a.fault().is_some());
    assert_eq!(rig.remote.state(), State::GaveUp);
}

#[test]
fn a_remote_with_a_ctrl_loss_tmo_of_30_s_fails_its_held_requests_at_30_s() {
    let timing = Timing {
        reconnect: ReconnectPolicy {
            delay_ms: 5_000,
            give_up_ms: 30_000,
        },
        ..Timing::DEFAULT
    };
    let mut rig = Rig::with_timing(|_| {}, timing);
    assert_eq!(rig.bring_up(), State::Live);
    let mut a = rig.remote.add_queue().unwrap();
    let lost = lose_with_a_read(&mut rig, &mut a);
    // Not before: held through 29.99 s.
    let done = rig.run(&mut [&mut a], 1, 29_990);
    assert!(done.is_empty(), "held, not failed: {done:?}");
    assert!(a.fault().is_none() && rig.remote.state() == State::Down);
    let waited = failed_after(&mut rig, &mut a, lost);
    assert!(
        (30_000..30_010).contains(&waited),
        "failed {waited} ms after the loss"
    );
    assert!(a
        .fault()
        .unwrap()
        .to_string()
        .contains("unreachable for 30 s"));
    assert_eq!(
        rig.events.last(),
        Some(&Event::GaveUp { waited_ms: 30_000 })
    );
    assert_eq!(
        failed_attempts(&rig),
        6,
        "at once, then every 5 s: at 0, 5, 10, 15, 20 and 25 s"
    );
}

#[test]
fn new_reconnect_times_count_from_the_next_loss() {
    let (mut rig, mut a, _b) = live();
    assert_eq!(rig.remote.reconnect_policy(), Timing::DEFAULT.reconnect);
    let policy = ReconnectPolicy {
        delay_ms: 2_000,
        give_up_ms: 20_000,
    };
    rig.remote.set_reconnect_policy(policy);
    assert_eq!(rig.remote.reconnect_policy(), policy);
    let lost = lose_with_a_read(&mut rig, &mut a);
    let waited = failed_after(&mut rig, &mut a, lost);
    assert!(
        (20_000..20_010).contains(&waited),
        "failed {waited} ms after the loss"
    );
    assert!(a
        .fault()
        .unwrap()
        .to_string()
        .contains("unreachable for 20 s"));
    assert_eq!(failed_attempts(&rig), 10, "every 2 s");
}

#[test]
fn a_reconnect_that_finds_another_namespace_is_not_taken() {
    let (mut rig, mut a, _b) = live();
    lose_with_a_read(&mut rig, &mut a);
    rig.step();
    // Back, but the namespace shrank: every attempt fails, the request stays held.
    rig.net.knobs = |t| t.ns_blocks = Some(1024);
    rig.net.up = true;
    let done = rig.run(&mut [&mut a], 1, 12_000);
    assert!(done.is_empty(), "held: {done:?}");
    let changed = rig
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::AttemptFailed(Failure::NamespaceChanged { blocks: 1024, .. })
            )
        })
        .count();
    assert!(changed >= 2, "{:?}", rig.events);
    // The namespace as it was: served.
    rig.net.knobs = |_| {};
    served_alone(&mut rig, &mut a);
}

/// Polls until the read of `lose_with_a_read` is served, and nothing else completes.
fn served_alone(rig: &mut Rig, a: &mut DiskQueue) {
    let done = rig.run(&mut [&mut *a], 1, 12_000);
    let read = Completion {
        tag: 1,
        status: IoStatus::Ok,
    };
    assert_eq!(done, [read], "{:?}", rig.events);
}

#[test]
fn a_reconnect_that_finds_the_namespace_grown_serves_on_at_the_first_size() {
    let (mut rig, mut a, _b) = live();
    let served = rig.remote.geometry().unwrap();
    lose_with_a_read(&mut rig, &mut a);
    rig.step();
    // An operator grew the volume while the target was away (DISK is 512-byte blocks).
    let grown = (DISK / 512) as u64 + 4096;
    rig.net.knobs = |t| t.ns_blocks = Some((DISK / 512) as u64 + 4096);
    rig.net.up = true;
    served_alone(&mut rig, &mut a);
    assert!(rig.events.contains(&Event::NamespaceGrew {
        blocks: grown,
        serving: (DISK / 512) as u64
    }));
    // Its disks keep the size they were given.
    assert_eq!(rig.remote.geometry(), Some(served));
    assert_eq!(a.geometry(), served);
}

#[test]
fn the_time_a_remote_held_each_request_is_counted() {
    let (mut rig, mut a, _b) = live();
    assert_eq!(rig.remote.held_times(), HeldTimes::default());
    let segs = segments(0, 1);
    a.submit(&request(1, IoOp::Read, 0, &segs), &Pages).unwrap();
    let taken = rig.now;
    let done = rig.run(&mut [&mut a], 1, 1_000);
    assert_eq!(done.len(), 1);
    let held = rig.remote.held_times();
    assert_eq!(held.completed, 1);
    // Taken at the first pass after the submit, completed at the pass before the last.
    assert!(
        held.total_ms >= 1 && held.total_ms < rig.now - taken,
        "{held:?}"
    );
    assert_eq!(held.max_ms, held.total_ms);
    a.submit(&request(2, IoOp::Read, 8, &segs), &Pages).unwrap();
    assert_eq!(rig.run(&mut [&mut a], 1, 1_000).len(), 1);
    assert_eq!(rig.remote.held_times().completed, 2);
}

// ---- Digests ----

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

/// A live remote with both digests on every connection, and one disk queue.
fn live_with_digests() -> (Rig, DiskQueue) {
    let mut rig = Rig::new(|_| {});
    rig.remote = Remote::new(HOST_NQN, [7; 16], SUBNQN, 1, Timing::DEFAULT, 0)
        .with_io_queues(2)
        .with_digests(BOTH);
    assert_eq!(rig.bring_up(), State::Live);
    let queue = rig.remote.add_queue().unwrap();
    (rig, queue)
}

#[test]
fn every_connection_of_an_association_runs_the_digests_asked_for() {
    let (mut rig, mut q) = live_with_digests();
    assert_eq!(rig.remote.digests(), BOTH);
    let admin = rig.net.links[Link::Admin.index()].as_ref().unwrap();
    assert_eq!(admin.digests, BOTH);
    for n in 0..2 {
        assert_eq!(rig.net.io(n).unwrap().digests, BOTH, "I/O queue {n}");
    }
    // Data both ways, checked by the target's digests and the host's.
    for (i, byte) in rig.mem.0.borrow_mut()[..64 << 10].iter_mut().enumerate() {
        *byte = (i * 7 + i / 4096) as u8;
    }
    let w = segments(0, 16);
    q.submit(&request(1, IoOp::Write, 64, &w), &Pages).unwrap();
    assert_eq!(rig.run(&mut [&mut q], 1, 10_000)[0].status, IoStatus::Ok);
    let r = segments(16, 16);
    q.submit(&request(2, IoOp::Read, 64, &r), &Pages).unwrap();
    assert_eq!(rig.run(&mut [&mut q], 1, 10_000)[0].status, IoStatus::Ok);
    let mem = rig.mem.0.borrow();
    assert!(mem[..64 << 10] == mem[64 << 10..128 << 10]);
    let io = rig.net.io(0).unwrap();
    assert!(io.header_digests_checked > 0 && io.data_digests_checked > 0);
}

/// Reads 8 KiB at sector 0 into pages 100 and 101 after the target's I/O connection is
/// set to corrupt the next `corrupt` C2HData PDUs (1500 bytes each: six per read).
fn read_through_corruption(rig: &mut Rig, q: &mut DiskQueue, corrupt: u32) -> IoStatus {
    for n in 0..2 {
        let at = Link::Io(n).index();
        rig.net.links[at].as_mut().unwrap().corrupt_c2h = corrupt;
    }
    rig.mem.0.borrow_mut()[100 * 4096..102 * 4096].fill(0);
    let r = segments(100, 2);
    q.submit(&request(9, IoOp::Read, 0, &r), &Pages).unwrap();
    let done = rig.run(&mut [q], 1, 10_000);
    assert_eq!(done.len(), 1);
    done[0].status
}

#[test]
fn a_read_whose_data_fails_its_digest_is_sent_again() {
    let (mut rig, mut q) = live_with_digests();
    // Two attempts corrupted (six PDUs, then one), the third whole.
    assert_eq!(read_through_corruption(&mut rig, &mut q, 7), IoStatus::Ok);
    let mem = rig.mem.0.borrow();
    assert!(
        mem[100 * 4096..102 * 4096] == rig.net.disk[..8192],
        "the data as stored"
    );
    drop(mem);
    let retries: Vec<_> = rig
        .events
        .iter()
        .filter_map(|e| match e {
            Event::TransferError { retry } => Some(*retry),
            _ => None,
        })
        .collect();
    assert_eq!(retries, [Some(1), Some(2)]);
    let c = rig.remote.counters();
    assert_eq!((c.transfer_errors, c.associations, c.losses), (2, 1, 0));
}

#[test]
fn a_read_that_keeps_failing_its_digest_fails_alone() {
    let (mut rig, mut q) = live_with_digests();
    let status = read_through_corruption(&mut rig, &mut q, u32::MAX);
    assert_ne!(status, IoStatus::Ok);
    let tries = 1 + u64::from(RETRIES);
    let c = rig.remote.counters();
    assert_eq!((c.transfer_errors, c.losses), (tries, 0), "no reconnect");
    assert!(matches!(
        rig.events.last(),
        Some(Event::TransferError { retry: None })
    ));
    // The connection serves on: the next read, on a clean path, is whole.
    assert_eq!(rig.remote.state(), State::Live);
    assert_eq!(read_through_corruption(&mut rig, &mut q, 0), IoStatus::Ok);
    let mem = rig.mem.0.borrow();
    assert!(mem[100 * 4096..102 * 4096] == rig.net.disk[..8192]);
}

// ---- Retries ----

#[test]
fn a_request_the_target_drops_the_connection_over_fails_alone_after_its_retries() {
    // Every connection's target drops it at a command touching LBA 4096 (sector 4096,
    // 512-byte blocks).
    let mut rig = Rig::with_timing(|t| t.poison_lba = Some(4096), Timing::DEFAULT);
    assert_eq!(rig.bring_up(), State::Live);
    let (mut a, mut b) = (
        rig.remote.add_queue().unwrap(),
        rig.remote.add_queue().unwrap(),
    );
    let poison = segments(0, 1);
    a.submit(&request(1, IoOp::Read, 4096, &poison), &Pages)
        .unwrap();
    let done = rig.run(&mut [&mut a], 1, 60_000);
    assert_eq!(done.len(), 1, "the request ends");
    assert_ne!(done[0].status, IoStatus::Ok);
    let tries = 1 + usize::from(RETRIES);
    assert_eq!(
        rig.net.drops, tries,
        "sent once and retried {RETRIES} times"
    );
    assert!(rig
        .events
        .iter()
        .any(|e| matches!(e, Event::OutOfRetries { requests: 1 })));
    // The association came back after the last loss and serves the other disks.
    while rig.remote.state() != State::Live && rig.now < 120_000 {
        rig.step();
    }
    assert_eq!(rig.remote.state(), State::Live);
    let c = rig.remote.counters();
    assert_eq!(c.losses, tries as u64);
    let r = segments(1, 2);
    b.submit(&request(2, IoOp::Read, 0, &r), &Pages).unwrap();
    assert_eq!(
        rig.run(&mut [&mut b], 1, 10_000)[0].status,
        IoStatus::Ok,
        "a good request after it"
    );
}

#[test]
fn only_requests_that_went_out_are_charged_for_a_loss() {
    // Two commands out at a time: the poisoned read and the read after it go out at
    // every association and are lost with it (nothing tells which one the target choked
    // on: both use their retries, as on Linux's host); the third waits its turn each
    // time, so no loss is charged to it, and it completes once the two have failed.
    let mut rig = Rig::new(|t| {
        t.poison_lba = Some(4096);
        t.maxcmd = 2;
    });
    assert_eq!(rig.bring_up(), State::Live);
    let mut q = rig.remote.add_queue().unwrap();
    for (tag, page) in [(1u32, 0u64), (2, 1), (3, 2)] {
        let segs = segments(page, 1);
        let sector = if tag == 1 { 4096 } else { 8 * u64::from(tag) };
        q.submit(&request(tag, IoOp::Read, sector, &segs), &Pages)
            .unwrap();
    }
    let mut done = rig.run(&mut [&mut q], 3, 120_000);
    done.sort_by_key(|c| c.tag);
    let status: Vec<_> = done
        .iter()
        .map(|c| (c.tag, c.status == IoStatus::Ok))
        .collect();
    assert_eq!(status, [(1, false), (2, false), (3, true)]);
    assert_eq!(rig.net.drops, 1 + usize::from(RETRIES));
}

// ---- Path errors ----

/// ANA inaccessible: the namespace cannot be reached through this controller.
const INACCESSIBLE: Status = Status((3 << 8) | 0x02);

#[test]
fn a_path_error_sends_the_request_again_on_the_next_association() {
    let mut rig = Rig::new(|_| {});
    assert_eq!(rig.bring_up(), State::Live);
    let mut q = rig.remote.add_queue().unwrap();
    // Only this association's controller answers with the path error (the next one is
    // reached through another portal, as the caller's transport does).
    rig.net.links[Link::Io(0).index()]
        .as_mut()
        .unwrap()
        .path_status = Some(INACCESSIBLE);
    let r = segments(3, 2);
    q.submit(&request(1, IoOp::Read, 16, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut q], 1, 30_000);
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].status,
        IoStatus::Ok,
        "served on the next association"
    );
    assert!(
        rig.now >= Timing::DEFAULT.reconnect.delay_ms,
        "the next association waited a reconnect delay ({} ms)",
        rig.now
    );
    let mem = rig.mem.0.borrow();
    assert!(mem[3 * 4096..5 * 4096] == rig.net.disk[16 * 512..16 * 512 + 8192]);
    let c = rig.remote.counters();
    assert_eq!((c.path_errors, c.losses, c.associations), (1, 1, 2));
    assert!(rig
        .events
        .contains(&Event::Lost(Failure::PathError(INACCESSIBLE))));
    assert!(Failure::PathError(INACCESSIBLE)
        .to_string()
        .contains("ANA inaccessible"));
}

#[test]
fn a_path_error_the_target_says_not_to_retry_fails_its_request() {
    let mut rig = Rig::new(|t| t.path_status = Some(Status(INACCESSIBLE.0 | 1 << 14)));
    assert_eq!(rig.bring_up(), State::Live);
    let mut q = rig.remote.add_queue().unwrap();
    let r = segments(0, 1);
    q.submit(&request(1, IoOp::Read, 0, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut q], 1, 10_000);
    assert_ne!(done[0].status, IoStatus::Ok);
    let c = rig.remote.counters();
    assert_eq!((c.path_errors, c.losses), (0, 0), "the association stays");
}

#[test]
fn a_request_no_path_serves_fails_after_its_retries() {
    // Every association's controller answers with the path error.
    let mut rig = Rig::new(|t| t.path_status = Some(INACCESSIBLE));
    assert_eq!(rig.bring_up(), State::Live);
    let mut q = rig.remote.add_queue().unwrap();
    let r = segments(0, 1);
    q.submit(&request(1, IoOp::Write, 0, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut q], 1, 120_000);
    assert_eq!(done.len(), 1, "the request ends");
    assert_ne!(done[0].status, IoStatus::Ok);
    let tries = 1 + u64::from(RETRIES);
    assert_eq!(rig.remote.counters().path_errors, tries);
    assert!(rig
        .events
        .iter()
        .any(|e| matches!(e, Event::OutOfRetries { requests: 1 })));
}

/// A read of 8 KiB from sector 16 into pages 3 and 4, on `q`.
fn submit_read(q: &mut DiskQueue) {
    let r = segments(3, 2);
    q.submit(&request(1, IoOp::Read, 16, &r), &Pages).unwrap();
}

/// `q`'s read (`submit_read`) completes within `ms`, with the namespace's data.
fn read_served(rig: &mut Rig, q: &mut DiskQueue, ms: u64) {
    let done = rig.run(&mut [&mut *q], 1, ms);
    assert_eq!(done.len(), 1, "{:?}", rig.events);
    assert_eq!(done[0].status, IoStatus::Ok, "{:?}", rig.events);
    let mem = rig.mem.0.borrow();
    assert!(mem[3 * 4096..5 * 4096] == rig.net.disk[16 * 512..16 * 512 + 8192]);
}

fn ana_inaccessible(t: &mut Target) {
    (t.ana_group, t.ana_state) = (4, 0x03);
}

/// The target's end of the admin queue's connection.
fn admin(rig: &mut Rig) -> &mut Target {
    rig.net.links[Link::Admin.index()].as_mut().unwrap()
}

fn ana_optimized(t: &mut Target) {
    (t.ana_group, t.ana_state) = (4, 0x01);
}

#[test]
fn a_first_bring_up_through_a_controller_that_cannot_reach_the_namespace_fails() {
    let (f, _) = failure(ana_inaccessible, |_| {});
    let path = AnaPath {
        group: 4,
        state: AnaState::Inaccessible,
    };
    assert_eq!(f, Failure::Session(Error::PathUnusable(path)));
    assert_eq!(
        f.to_string(),
        "the namespace's ANA group 4 is inaccessible through this controller"
    );
    // The caller's transport leads to a portal where the group is optimized.
    let mut rig = Rig::new(ana_inaccessible);
    assert!(matches!(rig.bring_up(), State::Failed(_)));
    rig.net.knobs = ana_optimized;
    assert!(rig.remote.retry_first_bring_up());
    assert_eq!(rig.bring_up(), State::Live);
    let ana = Some(AnaPath {
        group: 4,
        state: AnaState::Optimized,
    });
    assert!(matches!(
        rig.events[..],
        [Event::Live { ana: a, .. }] if a == ana
    ));
}

#[test]
fn a_reconnect_through_an_inaccessible_path_holds_requests_until_one_serves() {
    let mut rig = Rig::new(ana_optimized);
    assert_eq!(rig.bring_up(), State::Live);
    let mut q = rig.remote.add_queue().unwrap();
    // The association breaks; every controller the next attempts reach reports the
    // namespace inaccessible (a gateway that lost the group, say).
    rig.net.crash();
    rig.net.up = true;
    rig.net.knobs = ana_inaccessible;
    let r = segments(3, 2);
    q.submit(&request(1, IoOp::Read, 16, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut q], 1, 12_000);
    assert!(done.is_empty(), "held, not failed: {done:?}");
    let unusable = Failure::Session(Error::PathUnusable(AnaPath {
        group: 4,
        state: AnaState::Inaccessible,
    }));
    assert!(rig.events.contains(&Event::AttemptFailed(unusable)));
    // Found at the bring-up: no I/O went there, so no path error and no retry charged.
    let c = rig.remote.counters();
    assert_eq!((c.path_errors, c.associations), (0, 1));
    rig.net.knobs = ana_optimized;
    read_served(&mut rig, &mut q, 12_000);
}

#[test]
fn an_ana_change_notice_that_the_path_cannot_serve_leaves_the_association_at_once() {
    let mut rig = Rig::new(ana_optimized);
    assert_eq!(rig.bring_up(), State::Live);
    let mut q = rig.remote.add_queue().unwrap();
    rig.run(&mut [&mut q], 1, 50);
    assert_eq!(admin(&mut rig).event_requests.len(), 1);

    // Non-optimized: said, and the association serves on.
    admin(&mut rig).ana_change(0x02);
    rig.run(&mut [&mut q], 1, 50);
    let non_optimized = AnaPath {
        group: 4,
        state: AnaState::NonOptimized,
    };
    assert!(rig.events.contains(&Event::AnaChanged(non_optimized)));
    assert_eq!(rig.remote.ana(), Some(non_optimized));
    assert_eq!(rig.remote.state(), State::Live);

    // Inaccessible, with no I/O going: the association is left on the notice, not on a
    // command's path error, and the next attempt (another portal, in the caller's
    // transport) goes at once.
    let lost_at = rig.now;
    admin(&mut rig).ana_change(0x03);
    let r = segments(3, 2);
    for _ in 0..20 {
        rig.step();
    }
    let inaccessible = AnaPath {
        group: 4,
        state: AnaState::Inaccessible,
    };
    assert!(rig.events.contains(&Event::AnaChanged(inaccessible)));
    assert!(rig
        .events
        .contains(&Event::Lost(Failure::Session(Error::PathUnusable(
            inaccessible
        )))));
    q.submit(&request(1, IoOp::Read, 16, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut q], 1, 10_000);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].status, IoStatus::Ok);
    assert!(
        rig.now - lost_at < Timing::DEFAULT.reconnect.delay_ms,
        "served again {} ms after the notice, within a reconnect delay",
        rig.now - lost_at
    );
    let c = rig.remote.counters();
    assert_eq!((c.path_errors, c.losses, c.associations), (0, 1, 2));
}

// ---- ANA transitions ----

const TRANSITION: Status = Status::ANA_TRANSITION;
const CHANGING: AnaPath = AnaPath {
    group: 4,
    state: AnaState::Change,
};

fn ana_changing(t: &mut Target) {
    (t.ana_group, t.ana_state, t.ana_transition_s) = (4, 0x0f, 1);
}

/// Optimized, and a short ANATT.
fn ana_optimized_anatt_2s(t: &mut Target) {
    ana_optimized(t);
    t.ana_transition_s = 2;
}

/// Changing, and a long ANATT.
fn ana_changing_anatt_30s(t: &mut Target) {
    ana_changing(t);
    t.ana_transition_s = 30;
}

/// Live on a target with `knobs`, one disk queue; `other_paths`: the caller's transport
/// has other portals to go to.
fn live_on(knobs: fn(&mut Target), other_paths: bool) -> (Rig, DiskQueue) {
    let mut rig = Rig::new(knobs);
    rig.remote.other_paths = other_paths;
    assert_eq!(rig.bring_up(), State::Live);
    let q = rig.remote.add_queue().unwrap();
    (rig, q)
}

/// The target's end of I/O queue 0's connection.
fn io0(rig: &mut Rig) -> &mut Target {
    rig.net.links[Link::Io(0).index()].as_mut().unwrap()
}

/// Live on an optimized path, then the gateway moves the group: a command meets the
/// change first (ANA Transition, the usual order under load), then the notice (the log
/// says changing); a read is submitted.
fn in_transition(other_paths: bool) -> (Rig, DiskQueue) {
    let (mut rig, mut q) = live_on(ana_optimized, other_paths);
    rig.run(&mut [&mut q], 1, 50);
    io0(&mut rig).path_status = Some(TRANSITION);
    admin(&mut rig).ana_change(0x0f);
    submit_read(&mut q);
    (rig, q)
}

#[test]
fn an_ana_transition_holds_requests_on_the_association_until_the_path_serves() {
    let (mut rig, mut q) = in_transition(false);
    let done = rig.run(&mut [&mut q], 1, 5_000);
    assert!(
        done.is_empty(),
        "held through the transition: {done:?} {:?}",
        rig.events
    );
    assert_eq!(rig.remote.state(), State::Live);
    assert!(rig
        .events
        .contains(&Event::TransitionWait { limit_ms: 10_000 }));
    let sent = io0(&mut rig).io_commands;
    assert!(sent <= 1, "nothing sent while it waits ({sent} commands)");
    // Read again every second meanwhile, should the notice of the end not come.
    assert!(
        admin(&mut rig).ana_log_reads >= 5,
        "{}",
        admin(&mut rig).ana_log_reads
    );
    // The group serves again through this controller.
    io0(&mut rig).path_status = None;
    admin(&mut rig).ana_change(0x01);
    read_served(&mut rig, &mut q, 1_000);
    assert!(rig
        .events
        .iter()
        .any(|e| matches!(e, Event::TransitionOver { waited_ms } if *waited_ms >= 5_000)));
    let c = rig.remote.counters();
    assert_eq!((c.losses, c.associations, c.path_errors), (0, 1, 0));
    assert_eq!(c.ana_transitions, 1);
}

#[test]
fn with_other_portals_a_path_that_starts_a_transition_is_left_for_them() {
    let (mut rig, mut q) = in_transition(true);
    let lost_at = rig.now;
    for _ in 0..50 {
        rig.step();
    }
    let changing = Failure::Session(Error::PathUnusable(CHANGING));
    assert!(
        rig.events.contains(&Event::Lost(changing)),
        "{:?}",
        rig.events
    );
    assert_eq!(
        changing.to_string(),
        "the namespace's ANA group 4 is changing through this controller"
    );
    assert!(!rig
        .events
        .iter()
        .any(|e| matches!(e, Event::TransitionWait { .. })));
    // The next portal (the caller's transport) serves, at once: the log said the group
    // was changing here, so no reconnect delay.
    read_served(&mut rig, &mut q, 10_000);
    assert!(
        rig.now - lost_at < Timing::DEFAULT.reconnect.delay_ms,
        "served {} ms after the change",
        rig.now - lost_at
    );
    let c = rig.remote.counters();
    assert_eq!((c.associations, c.ana_transitions), (2, 1));
}

#[test]
fn with_other_portals_a_transition_the_log_denies_is_left_at_anatt() {
    let (mut rig, mut q) = live_on(ana_optimized_anatt_2s, true);
    io0(&mut rig).path_status = Some(TRANSITION);
    submit_read(&mut q);
    let sent_at = rig.now;
    let lost = Event::Lost(Failure::PathError(TRANSITION));
    while !rig.events.contains(&lost) && rig.now < sent_at + 30_000 {
        rig.step();
    }
    assert!(
        rig.now - sent_at >= 2_000,
        "left at ANATT, not before ({} ms)",
        rig.now - sent_at
    );
    read_served(&mut rig, &mut q, 30_000);
}

#[test]
fn an_association_made_while_its_group_changes_waits_even_with_other_portals() {
    let (mut rig, mut q) = live_on(ana_changing_anatt_30s, true);
    submit_read(&mut q);
    assert!(rig.run(&mut [&mut q], 1, 2_000).is_empty());
    assert_eq!(rig.remote.counters().losses, 0, "waited, not left");
    admin(&mut rig).ana_change(0x01);
    read_served(&mut rig, &mut q, 1_000);
    // Serving now: a later transition is left for the other portals.
    admin(&mut rig).ana_change(0x0f);
    for _ in 0..20 {
        rig.step();
    }
    assert_eq!(rig.remote.counters().losses, 1);
}

#[test]
fn an_ana_transition_longer_than_anatt_leaves_the_association() {
    let (mut rig, mut q) = live_on(ana_optimized_anatt_2s, false);
    // Only this association's I/O says ANA Transition, and its log never says so (each
    // read again finds the group optimized, and the request goes and comes back again).
    io0(&mut rig).path_status = Some(TRANSITION);
    submit_read(&mut q);
    // Served on the next association.
    read_served(&mut rig, &mut q, 30_000);
    assert!(rig
        .events
        .contains(&Event::Lost(Failure::PathError(TRANSITION))));
    let lost_at = rig
        .events
        .iter()
        .position(|e| matches!(e, Event::Lost(_)))
        .unwrap();
    assert!(rig.events[..lost_at]
        .iter()
        .any(|e| matches!(e, Event::TransitionOver { .. })));
    let c = rig.remote.counters();
    assert_eq!((c.losses, c.associations), (1, 2));
    assert_eq!(
        c.ana_transitions, 1,
        "one transition, however often its I/O said so"
    );
    assert!(rig.now >= 2_000 + Timing::DEFAULT.reconnect.delay_ms);
}

#[test]
fn a_bring_up_into_a_changing_group_sends_nothing_until_it_serves() {
    let (mut rig, mut q) = live_on(ana_changing_anatt_30s, false);
    assert!(matches!(rig.events[..], [Event::Live { ana: Some(a), .. }, ..] if a == CHANGING));
    submit_read(&mut q);
    let done = rig.run(&mut [&mut q], 1, 3_000);
    assert!(done.is_empty());
    assert_eq!(
        io0(&mut rig).io_commands,
        0,
        "nothing sent through a changing group"
    );
    admin(&mut rig).ana_change(0x01);
    read_served(&mut rig, &mut q, 1_000);
    assert_eq!(rig.remote.counters().losses, 0);
}

#[test]
fn a_path_that_never_ends_its_transition_fails_its_requests_after_their_retries() {
    // Every controller reached says the group is changing, for good.
    let (mut rig, mut q) = live_on(ana_changing, false);
    submit_read(&mut q);
    let done = rig.run(&mut [&mut q], 1, 120_000);
    assert_eq!(done.len(), 1, "the request ends");
    assert_ne!(done[0].status, IoStatus::Ok);
    assert_eq!(rig.remote.counters().losses, 1 + u64::from(RETRIES));
    assert!(rig
        .events
        .iter()
        .any(|e| matches!(e, Event::OutOfRetries { requests: 1 })));
}

#[test]
fn a_namespace_grown_while_live_is_served_once_the_caller_says_and_one_shrunk_is_left() {
    let (mut rig, mut a, _b) = live();
    let served = rig.remote.geometry().unwrap();
    let first = (DISK / 512) as u64;
    rig.net.disk.resize(DISK + 2048 * 512, 0);
    admin(&mut rig).resize_namespace(first + 2048);
    for _ in 0..50 {
        rig.step();
    }
    assert!(rig.events.contains(&Event::NamespaceGrew {
        blocks: first + 2048,
        serving: first
    }));
    assert_eq!(rig.remote.state(), State::Live);
    assert_eq!(
        (rig.remote.geometry(), a.geometry()),
        (Some(served), served)
    );
    // A read past the old end is refused until the caller serves the new size.
    let beyond = segments(10, 1);
    let past_end = request(9, IoOp::Read, first, &beyond);
    assert_eq!(
        a.submit(&past_end, &Pages),
        Err(blkdev::SubmitError::Invalid)
    );
    assert_eq!(rig.remote.serve_grown(), Some(first + 2048));
    assert_eq!(rig.remote.serve_grown(), None, "once");
    assert_eq!(a.geometry().sectors, first + 2048, "the disk queue follows");
    assert_eq!(rig.remote.geometry().unwrap().sectors, first + 2048);
    a.submit(&past_end, &Pages).unwrap();
    let done = rig.run(&mut [&mut a], 1, 1_000);
    assert_eq!(done[0].status, IoStatus::Ok);

    // Shrunk below what its disks are given: their last blocks are gone; the
    // association is left (and a reconnect refused) rather than served short.
    admin(&mut rig).resize_namespace(first);
    for _ in 0..50 {
        rig.step();
    }
    let shrunk = Failure::NamespaceChanged {
        blocks: first,
        block_size: 512,
    };
    assert!(
        rig.events.contains(&Event::Lost(shrunk)),
        "{:?}",
        rig.events
    );
    lose_with_a_read(&mut rig, &mut a);
    rig.net.up = true;
    rig.net.knobs = |t| t.ns_blocks = Some((DISK / 512) as u64 + 2048);
    served_alone(&mut rig, &mut a);
}

// ---- A better path elsewhere ----

const NON_OPTIMIZED: AnaPath = AnaPath {
    group: 4,
    state: AnaState::NonOptimized,
};
const OPTIMIZED: AnaPath = AnaPath {
    group: 4,
    state: AnaState::Optimized,
};

fn ana_non_optimized(t: &mut Target) {
    (t.ana_group, t.ana_state) = (4, 0x02);
}

/// Reads of 8 KiB at `sector` on `q` until `ms` passed, each checked against the
/// target's data; how many completed.
fn reads_verified(rig: &mut Rig, q: &mut DiskQueue, ms: u64) -> usize {
    let end = rig.now + ms;
    let mut served = 0;
    while rig.now < end {
        let sector = (served as u64 * 16) % 8000;
        let r = segments(3, 2);
        q.submit(&request(1, IoOp::Read, sector, &r), &Pages)
            .unwrap();
        let done = rig.run(&mut [&mut *q], 1, 30_000);
        assert_eq!(done.len(), 1, "a read held past 30 s at {} ms", rig.now);
        assert_eq!(done[0].status, IoStatus::Ok);
        let at = (sector * 512) as usize;
        let want: Vec<u8> = (at..at + 8192)
            .map(|i| (i / 512) as u8 ^ (i as u8))
            .collect();
        let got = rig.mem.0.borrow()[3 * 4096..5 * 4096].to_vec();
        assert!(got == want, "read at sector {sector} came back wrong");
        served += 1;
    }
    served
}

fn moved(rig: &Rig) -> Option<(u64, bool)> {
    rig.events.iter().find_map(|e| match *e {
        Event::Moved { waited_ms, drained } => Some((waited_ms, drained)),
        _ => None,
    })
}

#[test]
fn a_non_optimized_path_moves_to_a_portal_found_optimized() {
    let (mut rig, mut q) = live_on(ana_non_optimized, true);
    assert_eq!(rig.remote.ana(), Some(NON_OPTIMIZED));
    // The other portal's controller serves the group optimized.
    rig.net.probe_knobs = Some(ana_optimized);
    let delay = Timing::DEFAULT.reconnect.delay_ms;
    // Reads go on while blkdom looks: none fails, none is held past its time.
    reads_verified(&mut rig, &mut q, delay + 500);
    assert!(rig.net.probes >= 1, "no look at the other portal");
    assert!(rig.events.contains(&Event::OptimizedElsewhere(OPTIMIZED)));
    let (waited_ms, drained) = moved(&rig).expect("the association moved");
    assert!(
        drained && waited_ms < MOVE_DRAIN_MS,
        "{waited_ms} ms, drained {drained}"
    );
    reads_verified(&mut rig, &mut q, 2_000);
    assert_eq!(rig.remote.ana(), Some(OPTIMIZED));
    assert!(rig.events.iter().any(
        |e| matches!(e, Event::Live { reconnect: true, ana: Some(a), .. } if *a == OPTIMIZED)
    ));
    let c = rig.remote.counters();
    assert_eq!((c.moves, c.losses, c.associations), (1, 0, 2));
    // Optimized: no more looks.
    let probes = rig.net.probes;
    reads_verified(&mut rig, &mut q, 3 * delay);
    assert_eq!(rig.net.probes, probes);
    assert_eq!(rig.remote.counters().moves, 1);
}

#[test]
fn a_look_that_finds_no_better_path_keeps_the_association() {
    let (mut rig, mut q) = live_on(ana_non_optimized, true);
    let delay = Timing::DEFAULT.reconnect.delay_ms;
    // The other portal: the group non-optimized there too, then refusing, then
    // optimized for another group.
    rig.net.probe_knobs = Some(ana_non_optimized);
    reads_verified(&mut rig, &mut q, 2 * delay + 500);
    assert_eq!(rig.net.probes, 2, "one look per reconnect delay");
    rig.net.probe_knobs = Some(|t| {
        (t.ana_group, t.ana_state) = (5, 0x01);
    });
    reads_verified(&mut rig, &mut q, delay);
    assert_eq!(rig.net.probes, 3);
    assert!(moved(&rig).is_none(), "{:?}", rig.events);
    let c = rig.remote.counters();
    assert_eq!((c.moves, c.losses, c.associations), (0, 0, 1));
    // Nor without other portals, whatever they would say.
    let (mut rig, mut q) = live_on(ana_non_optimized, false);
    rig.net.probe_knobs = Some(ana_optimized);
    reads_verified(&mut rig, &mut q, 3 * delay);
    assert_eq!(rig.net.probes, 0);
    // Nor from an optimized path.
    let (mut rig, mut q) = live_on(ana_optimized, true);
    reads_verified(&mut rig, &mut q, 3 * delay);
    assert_eq!(rig.net.probes, 0);
}

#[test]
fn a_path_that_turns_non_optimized_is_looked_past_and_a_probe_that_fails_is_tried_again() {
    let (mut rig, mut q) = live_on(ana_optimized, true);
    let delay = Timing::DEFAULT.reconnect.delay_ms;
    rig.run(&mut [&mut q], 1, 50);
    admin(&mut rig).ana_change(0x02);
    // The other portal is down at first.
    rig.net.probe_knobs = Some(|t| t.ana_log_fails = true);
    reads_verified(&mut rig, &mut q, delay + 500);
    assert!(rig.events.contains(&Event::AnaChanged(NON_OPTIMIZED)));
    assert_eq!(rig.net.probes, 1);
    assert!(moved(&rig).is_none());
    rig.net.probe_knobs = Some(ana_optimized);
    reads_verified(&mut rig, &mut q, delay + 500);
    assert!(moved(&rig).is_some(), "{:?}", rig.events);
}

#[test]
fn a_move_waits_for_the_commands_out_at_most_its_drain_time() {
    let (mut rig, mut q) = live_on(ana_non_optimized, true);
    rig.net.probe_knobs = Some(ana_optimized);
    let delay = Timing::DEFAULT.reconnect.delay_ms;
    // Just before the look is due, the target stops answering I/O: a read stays out.
    reads_verified(&mut rig, &mut q, delay - 100);
    rig.net.stall_io = true;
    let r = segments(3, 2);
    q.submit(&request(7, IoOp::Read, 64, &r), &Pages).unwrap();
    let done = rig.run(&mut [&mut q], 1, 1_000);
    assert!(done.is_empty());
    let found_at = rig.now;
    while !rig.events.contains(&Event::OptimizedElsewhere(OPTIMIZED)) && rig.now < found_at + 10_000
    {
        rig.step();
    }
    // Found: a new request waits for the move, nothing more goes out here.
    let stalled = rig.net.stalled;
    let r2 = segments(5, 2);
    q.submit(&request(8, IoOp::Read, 128, &r2), &Pages).unwrap();
    while moved(&rig).is_none() && rig.now < found_at + 10_000 {
        rig.step();
    }
    assert_eq!(rig.net.stalled, stalled, "sent while waiting to move");
    let (waited_ms, drained) = moved(&rig).expect("moved");
    assert!(!drained);
    assert!(
        (MOVE_DRAIN_MS..MOVE_DRAIN_MS + 100).contains(&waited_ms),
        "left {waited_ms} ms after it was found"
    );
    // Live again: the read that was out is charged a retry, the one that waited not.
    rig.net.stall_io = false;
    while !rig.events.iter().any(|e| {
        matches!(
            e,
            Event::Live {
                reconnect: true,
                ..
            }
        )
    }) {
        rig.step();
    }
    let mut retries: Vec<(u64, u8)> = rig.remote.held[0]
        .iter()
        .filter(|h| h.active)
        .map(|h| (h.request.sector, h.retries))
        .collect();
    retries.sort();
    assert_eq!(retries, [(64, 1), (128, 0)]);
    // Both are served there.
    let done = rig.run(&mut [&mut q], 2, 10_000);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|c| c.status == IoStatus::Ok));
}

// ---- Closing an association ----

#[test]
fn a_live_association_closes_its_io_queues_then_shuts_the_controller_down() {
    let (mut rig, mut queues) = live_with_io_queues(2, 128, 2);
    rig.net.links[Link::Admin.index()]
        .as_mut()
        .unwrap()
        .shutdown_polls = 3;
    read_on_every_queue(&mut rig, &mut queues);
    drop(queues);
    rig.net.closed.clear();
    let events = rig.events.len();
    let at = rig.now;
    assert_eq!(rig.close(), []);
    assert_eq!(rig.remote.state(), State::Closing);
    assert!(rig.remote.busy(), "polled until closed");
    assert!(
        rig.remote.add_queue().is_none(),
        "no new disk queue once closing"
    );
    assert_eq!(
        rig.net.closed,
        [(Link::Io(0), 0), (Link::Io(1), 0)],
        "the I/O queues' connections go first"
    );
    let admin = rig.net.links[Link::Admin.index()].as_ref().unwrap();
    assert_eq!(admin.shutdowns, 1, "told at once, on the admin queue");
    while rig.remote.state() == State::Closing && rig.now < at + 10_000 {
        rig.step();
    }
    assert_eq!(rig.remote.state(), State::Closed);
    assert_eq!(
        rig.net.closed[2..],
        [(Link::Admin, 1)],
        "then the admin queue's, once the controller confirmed"
    );
    match rig.events[events..] {
        [Event::Closed {
            shutdown: Some(Ok(ms)),
        }] => assert!(
            (30..100).contains(&ms),
            "three CSTS reads 10 ms apart: {ms}"
        ),
        ref other => panic!("{other:?}"),
    }
    // Closed: nothing more is opened or sent, however long.
    let opens = rig.net.opens;
    for _ in 0..20_000 {
        rig.step();
    }
    assert_eq!(rig.net.opens, opens);
    assert!(!rig.remote.busy());
    assert_eq!(rig.events.len(), events + 1);
    // Told again: nothing.
    assert_eq!(rig.close(), []);
}

#[test]
fn a_controller_that_does_not_confirm_its_shutdown_is_left_at_the_bound() {
    let (mut rig, a, _) = live();
    rig.net.links[Link::Admin.index()]
        .as_mut()
        .unwrap()
        .shutdown_polls = u32::MAX;
    drop(a);
    let at = rig.now;
    assert_eq!(rig.close(), []);
    while rig.remote.state() == State::Closing && rig.now < at + 60_000 {
        rig.step();
    }
    assert_eq!(rig.remote.state(), State::Closed);
    let took = rig.now - at;
    assert!(
        (SHUTDOWN_MS..SHUTDOWN_MS + 10).contains(&took),
        "closed at the bound: {took} ms"
    );
    assert!(matches!(
        rig.events.last(),
        Some(Event::Closed {
            shutdown: Some(Err(Failure::Session(Error::Timeout(_))))
        })
    ));
    assert!(
        rig.net.links.iter().all(Option::is_none),
        "every connection closed"
    );
    // The connection breaking while it waits ends the wait too.
    let (mut rig, _, _) = live();
    rig.net.knobs = |t| t.shutdown_polls = u32::MAX;
    assert_eq!(rig.close(), []);
    rig.step();
    rig.net.crash();
    rig.step();
    assert_eq!(rig.remote.state(), State::Closed);
    assert!(matches!(
        rig.events.last(),
        Some(Event::Closed {
            shutdown: Some(Err(_))
        })
    ));
}

#[test]
fn an_association_that_is_not_live_closes_at_once() {
    let (mut rig, mut a, _) = live();
    rig.net.crash();
    let end = rig.now + 2_000;
    while rig.now < end {
        rig.step();
    }
    assert_eq!(rig.remote.state(), State::Down);
    // A request held while reconnecting (there should be none: it fails, not waits).
    a.submit(&request(1, IoOp::Read, 0, &segments(0, 1)), &Pages)
        .unwrap();
    rig.step();
    rig.net.up = true;
    assert_eq!(rig.close(), [Event::Closed { shutdown: None }]);
    assert_eq!(rig.remote.state(), State::Closed);
    let mut done = Vec::new();
    a.poll_completions(&mut |c| done.push(c));
    assert_eq!(
        done,
        [Completion {
            tag: 1,
            status: IoStatus::Error
        }]
    );
    // No attempt after it, though the target is back.
    let opens = rig.net.opens;
    for _ in 0..20_000 {
        rig.step();
    }
    assert_eq!(rig.net.opens, opens);
    assert!(rig.net.links.iter().all(Option::is_none));
    assert_eq!(
        rig.net.closed.iter().map(|(_, n)| n).sum::<u32>(),
        0,
        "no shutdown told"
    );
}

#[test]
fn a_bring_up_under_way_is_not_told_of_a_shutdown() {
    // The controller never gets ready: the first bring-up waits for CSTS.RDY.
    let mut rig = Rig::new(|t| t.csts_polls_before_ready = u32::MAX);
    for _ in 0..200 {
        rig.step();
    }
    assert_eq!(rig.remote.state(), State::Connecting);
    assert_eq!(rig.close(), [Event::Closed { shutdown: None }]);
    assert_eq!(rig.remote.state(), State::Closed);
    assert_eq!(rig.net.closed, [(Link::Admin, 0)]);
}

#[test]
fn a_controller_whose_connection_just_broke_is_not_told_of_a_shutdown() {
    let (mut rig, _, _) = live();
    // Broken before the remote's next pass noticed.
    rig.net.crash();
    assert_eq!(rig.close(), [Event::Closed { shutdown: None }]);
    assert_eq!(rig.remote.state(), State::Closed);
}
