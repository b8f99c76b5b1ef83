// SPDX-License-Identifier: MIT OR Apache-2.0
//! Host tests: a fake NVMe/TCP target (one per connection) that checks every PDU the
//! host sends and answers like a controller with a RAM namespace, plus scripted bad
//! PDUs against a bare [`Queue`].

use std::collections::HashMap;

use crate::pdu;
use crate::queue::{Completion, DataPort, Payload, Queue, QueueKind, SubmitError};
use crate::session::{AdminSession, HostIdentity, IoSession, SessionState};
use crate::sqe::{self, Status};
use crate::{AnaPath, AnaState, ConnectRefusal, Digests, Error, ProtocolError};

use crate::fake::*;

fn identity() -> HostIdentity<'static> {
    HostIdentity {
        host_nqn: HOST_NQN,
        host_id: [0x42; 16],
        subsystem_nqn: SUBNQN,
    }
}

// ---- Moving bytes ----

/// A deterministic xorshift, for chunk sizes and fuzzing.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One end of the connection, as the pump drives it.
trait HostEnd {
    fn send(&mut self, out: &mut [u8]) -> usize;
    fn recv(&mut self, input: &[u8]) -> Result<(), Error>;
}

struct AdminEnd<'a>(&'a mut AdminSession, u64);

impl HostEnd for AdminEnd<'_> {
    fn send(&mut self, out: &mut [u8]) -> usize {
        self.0.transmit(out)
    }

    fn recv(&mut self, input: &[u8]) -> Result<(), Error> {
        self.0.receive(input, self.1)
    }
}

struct IoEnd<'a, const N: usize>(&'a mut IoSession<N>, &'a mut MemPort);

impl<const N: usize> HostEnd for IoEnd<'_, N> {
    fn send(&mut self, out: &mut [u8]) -> usize {
        self.0.transmit(out, self.1)
    }

    fn recv(&mut self, input: &[u8]) -> Result<(), Error> {
        self.0.receive(input, self.1)
    }
}

/// Shuttles bytes between a host endpoint and a target until neither moves any, in
/// pieces whose sizes `rng` picks (1 byte to a few KiB): PDUs are cut at every place.
fn pump(target: &mut Target, rng: &mut Rng, host: &mut impl HostEnd) -> Result<(), Error> {
    let mut buf = vec![0u8; 9000];
    for _ in 0..100_000 {
        let small = rng.below(4) == 0;
        let cap = 1 + rng.below(if small { 16 } else { 9000 });
        let n = host.send(&mut buf[..cap]);
        target.input(&buf[..n]);
        let out = std::mem::take(&mut target.out);
        let mut at = 0;
        while at < out.len() {
            let k = (1 + rng.below(3000)).min(out.len() - at);
            host.recv(&out[at..at + k])?;
            at += k;
        }
        if n == 0 && out.is_empty() {
            return Ok(());
        }
    }
    panic!("pump did not settle");
}

/// Brings an admin session up against `target`; time advances by 5 ms per round so
/// CSTS polling moves on.
fn bring_up(
    target: &mut Target,
    rng: &mut Rng,
    kato: u32,
) -> (AdminSession, Result<(), Error>, u64) {
    bring_up_with(target, rng, kato, Digests::NONE)
}

fn bring_up_with(
    target: &mut Target,
    rng: &mut Rng,
    kato: u32,
    digests: Digests,
) -> (AdminSession, Result<(), Error>, u64) {
    let s = AdminSession::new(&identity(), 1, kato, 1000, 10_000).with_digests(digests);
    drive(target, rng, s)
}

/// An admin session brought up against `target` (it must come up); the time it did.
fn live_admin(target: &mut Target, rng: &mut Rng, kato: u32) -> (AdminSession, u64) {
    let (s, r, now) = bring_up(target, rng, kato);
    assert_eq!(r, Ok(()));
    (s, now)
}

/// Runs `s`, made at 1000 ms, against `target` until it is live or failed (5 ms a pass).
fn drive(
    target: &mut Target,
    rng: &mut Rng,
    mut s: AdminSession,
) -> (AdminSession, Result<(), Error>, u64) {
    let mut now = 1000;
    let mut r = Ok(());
    for _ in 0..1000 {
        r = pump(target, rng, &mut AdminEnd(&mut s, now)).and_then(|()| s.poll(now));
        if r.is_err() || s.state() == SessionState::Live {
            break;
        }
        now += 5;
    }
    (s, r, now)
}

#[derive(Default)]
struct MemPort {
    bufs: HashMap<u64, Vec<u8>>,
}

impl DataPort for MemPort {
    fn fetch(&mut self, tag: u64, offset: u32, dst: &mut [u8]) {
        let b = &self.bufs[&tag];
        dst.copy_from_slice(&b[offset as usize..offset as usize + dst.len()]);
    }

    fn deliver(&mut self, tag: u64, offset: u32, src: &[u8]) {
        let b = self.bufs.get_mut(&tag).unwrap();
        b[offset as usize..offset as usize + src.len()].copy_from_slice(src);
    }
}

fn live_io<const N: usize>(
    admin_target: &mut Target,
    io_target: &mut Target,
    rng: &mut Rng,
) -> IoSession<N> {
    live_io_with(admin_target, io_target, rng, Digests::NONE)
}

fn live_io_with<const N: usize>(
    admin_target: &mut Target,
    io_target: &mut Target,
    rng: &mut Rng,
    digests: Digests,
) -> IoSession<N> {
    let (admin, r, _) = bring_up_with(admin_target, rng, 5000, digests);
    r.unwrap();
    let ctrl = admin.controller().unwrap();
    let ns = admin.namespace().unwrap();
    io_target.disk = admin_target.disk.clone();
    io_target.cntlid = ctrl.cntlid;
    io_target.maxh2cdata = admin_target.maxh2cdata;
    let mut io = IoSession::<N>::new(&identity(), &ctrl, ns, 1).with_digests(digests);
    let mut port = MemPort::default();
    pump(io_target, rng, &mut IoEnd(&mut io, &mut port)).unwrap();
    assert_eq!(io.state(), SessionState::Live);
    io
}

/// Runs the I/O session against the target until every submitted command completed.
fn run_io<const N: usize>(
    io: &mut IoSession<N>,
    target: &mut Target,
    port: &mut MemPort,
    rng: &mut Rng,
) -> Result<Vec<Completion>, Error> {
    pump(target, rng, &mut IoEnd(io, port))?;
    let mut done = Vec::new();
    while let Some(c) = io.next_completion() {
        done.push(c);
    }
    Ok(done)
}

// ---- Bring-up ----

#[test]
fn admin_bring_up_connects_enables_and_identifies() {
    for seed in 1..20 {
        let mut t = Target::new();
        let mut rng = Rng(seed);
        let (s, r, _) = bring_up(&mut t, &mut rng, 5000);
        r.unwrap();
        assert_eq!(s.state(), SessionState::Live);
        let c = s.controller().unwrap();
        assert_eq!(c.cntlid, 0x11);
        assert_eq!(c.inline_limit, 4096);
        assert_eq!(c.max_transfer, Some(4096 << 5));
        assert_eq!(c.max_queue_entries, 64, "MAXCMD below MQES + 1");
        assert!(c.volatile_write_cache && c.deallocate);
        let ns = s.namespace().unwrap();
        assert_eq!((ns.nsid, ns.blocks, ns.block_size), (1, 256, 512));
        assert_eq!(
            t.connects,
            vec![ConnectSeen {
                qid: 0,
                sqsize: 31,
                kato: 5000,
                cntlid: 0xffff,
                host_id: [0x42; 16],
                subnqn: SUBNQN.into(),
                hostnqn: HOST_NQN.into(),
            }]
        );
        assert_eq!(
            t.cc,
            1 | (6 << 16) | (4 << 20),
            "CC: EN, IOSQES 6, IOCQES 4, MPS 0, CSS NVM"
        );
        assert_eq!(t.csts_reads, 3, "CSTS read until RDY");
        assert_eq!(t.io_queues_asked, Some((0, 0)), "one I/O queue, 0's based");
        assert_eq!(s.io_queues(), 1);
    }
}

#[test]
fn bring_up_asks_for_its_io_queues_and_takes_no_more_than_allotted() {
    // (asked, the controller allots, taken)
    for (asked, allotted, taken) in [(4, 128, 4), (4, 2, 2), (1, 1, 1), (8, 8, 8)] {
        let mut t = Target::new();
        t.io_queues = Some(allotted);
        let mut rng = Rng(u64::from(asked) * 31 + u64::from(allotted));
        let mut now = 1000;
        let mut s = AdminSession::new(&identity(), 1, 5000, now, 10_000).with_io_queues(asked);
        while s.state() == SessionState::Connecting {
            pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
            s.poll(now).unwrap();
            now += 5;
        }
        assert_eq!(s.state(), SessionState::Live);
        assert_eq!(t.io_queues_asked, Some((asked - 1, asked - 1)));
        assert_eq!(s.io_queues(), taken, "asked {asked}, allotted {allotted}");
    }
    // A controller that refuses the count: bring-up fails, saying which command.
    let mut t = Target::new();
    t.io_queues = None;
    let (_, r, _) = bring_up(&mut t, &mut Rng(3), 5000);
    assert!(
        matches!(
            r,
            Err(Error::Command {
                what: "Set Features (Number of Queues)",
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn bring_up_reads_the_namespace_ana_state_where_the_controller_reports_it() {
    // No ANA reporting: no log is read, no state is known.
    let mut t = Target::new();
    let (s, r, _) = bring_up(&mut t, &mut Rng(11), 5000);
    assert_eq!(
        (r, s.state(), t.ana_log_reads, s.ana()),
        (Ok(()), SessionState::Live, 0, None)
    );

    // Usable states come up and are kept, for the log.
    for (byte, state) in [
        (0x01, AnaState::Optimized),
        (0x02, AnaState::NonOptimized),
        (0x0f, AnaState::Change),
    ] {
        let mut t = Target::new();
        (t.ana_group, t.ana_state) = (3, byte);
        let (s, r, _) = bring_up(&mut t, &mut Rng(u64::from(byte)), 5000);
        assert_eq!((r, s.state()), (Ok(()), SessionState::Live), "{state:?}");
        assert_eq!(s.ana(), Some(AnaPath { group: 3, state }));
        assert_eq!(t.ana_log_reads, 1);
    }

    // A log page the target cannot give: bring-up goes on without a state.
    let mut t = Target::new();
    (t.ana_group, t.ana_log_fails) = (3, true);
    let (s, r, _) = bring_up(&mut t, &mut Rng(12), 5000);
    assert_eq!((r, s.state(), s.ana()), (Ok(()), SessionState::Live, None));
    assert_eq!(t.ana_log_reads, 1);
}

#[test]
fn a_controller_through_which_the_namespace_is_inaccessible_fails_the_bring_up() {
    for (byte, state) in [
        (0x03, AnaState::Inaccessible),
        (0x04, AnaState::PersistentLoss),
    ] {
        let mut t = Target::new();
        (t.ana_group, t.ana_state) = (2, byte);
        let (s, r, _) = bring_up(&mut t, &mut Rng(13), 5000);
        let path = AnaPath { group: 2, state };
        assert_eq!(r, Err(Error::PathUnusable(path)));
        assert_eq!(s.state(), SessionState::Failed(Error::PathUnusable(path)));
        // Nothing after the log: no queues are asked for on a path that cannot serve.
        assert_eq!(t.io_queues_asked, None);
    }
    assert_eq!(
        Error::PathUnusable(AnaPath {
            group: 2,
            state: AnaState::Inaccessible
        })
        .to_string(),
        "the namespace's ANA group 2 is inaccessible through this controller"
    );
}

#[test]
fn ana_change_notices_while_live_have_the_log_read_again() {
    // Without ANA, only Namespace Attribute notices are asked for.
    let mut t = Target::new();
    let (s, r, _) = bring_up(&mut t, &mut Rng(21), 5000);
    assert_eq!((r, s.state()), (Ok(()), SessionState::Live));
    assert_eq!(t.async_events, Some(sqe::AEN_NAMESPACE_ATTRIBUTE));

    let mut t = Target::new();
    (t.ana_group, t.ana_state) = (5, 0x01);
    let mut rng = Rng(22);
    let (mut s, r, now) = bring_up(&mut t, &mut rng, 5000);
    assert_eq!((r, s.state()), (Ok(()), SessionState::Live));
    assert_eq!(
        t.async_events,
        Some(sqe::AEN_ANA_CHANGE | sqe::AEN_NAMESPACE_ATTRIBUTE)
    );
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!(
        t.event_requests.len(),
        1,
        "one request held for the next event"
    );
    let reads = t.ana_log_reads;

    // A usable state: kept, still live; a request is out again for the next.
    t.ana_change(0x02);
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!(s.poll(now), Ok(()));
    assert_eq!(s.ana().map(|a| a.state), Some(AnaState::NonOptimized));
    assert_eq!((s.ana_notices(), t.ana_log_reads), (1, reads + 1));
    assert_eq!(t.event_requests.len(), 1);

    // Two changes at once: the last state read is the last one sent.
    t.ana_change(0x0f);
    t.ana_change(0x01);
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!(s.ana().map(|a| a.state), Some(AnaState::Optimized));
    assert_eq!(s.ana_notices(), 3);

    // A state that cannot serve fails the session with the path.
    t.ana_change(0x03);
    let _ = pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now));
    let path = AnaPath {
        group: 5,
        state: AnaState::Inaccessible,
    };
    assert_eq!(s.poll(now), Err(Error::PathUnusable(path)));
    assert_eq!(s.state(), SessionState::Failed(Error::PathUnusable(path)));
}

/// A probe through `t`, to its end: the session and how it ended.
fn probe(t: &mut Target, rng: &mut Rng) -> (AdminSession, Result<(), Error>) {
    let (s, r, _) = drive(
        t,
        rng,
        AdminSession::new(&identity(), 1, 5000, 1000, 10_000).probing(),
    );
    (s, r)
}

#[test]
fn a_probe_reads_the_ana_state_and_asks_for_nothing_more() {
    let mut rng = Rng(31);
    let mut t = Target::new();
    (t.ana_group, t.ana_state) = (5, 0x01);
    let (mut s, r) = probe(&mut t, &mut rng);
    assert_eq!((r, s.state()), (Ok(()), SessionState::Live));
    let path = AnaPath {
        group: 5,
        state: AnaState::Optimized,
    };
    assert_eq!(s.ana(), Some(path));
    assert_eq!(t.ana_log_reads, 1);
    // No I/O queues asked for, no events configured, no event request out.
    assert_eq!(t.io_queues_asked, None);
    assert_eq!(t.async_events, None);
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, 1000)).unwrap();
    assert!(t.event_requests.is_empty());
    // Without ANA reported, or a log it cannot give: live, no state to tell, nothing
    // more asked.
    for fails in [false, true] {
        let mut t = Target::new();
        (t.ana_group, t.ana_log_fails) = (if fails { 5 } else { 0 }, fails);
        let (s, r) = probe(&mut t, &mut rng);
        assert_eq!((r, s.state(), s.ana()), (Ok(()), SessionState::Live, None));
        assert_eq!((t.io_queues_asked, t.async_events), (None, None));
    }
    // Through a controller that cannot serve the group: failed, with the path.
    let mut t = Target::new();
    (t.ana_group, t.ana_state) = (5, 0x03);
    let (_, r) = probe(&mut t, &mut rng);
    let path = AnaPath {
        group: 5,
        state: AnaState::Inaccessible,
    };
    assert_eq!(r, Err(Error::PathUnusable(path)));
}

#[test]
fn the_ana_log_is_read_again_when_asked_one_read_at_a_time() {
    // Without ANA reported there is no log to ask for.
    let mut t = Target::new();
    let mut rng = Rng(24);
    let (mut s, now) = live_admin(&mut t, &mut rng, 5000);
    assert_eq!(s.refresh_ana(), Ok(()));
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!((t.ana_log_reads, s.ana_logs_taken()), (0, 0));

    let mut t = Target::new();
    (t.ana_group, t.ana_state) = (5, 0x01);
    let (mut s, now) = live_admin(&mut t, &mut rng, 5000);
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!(
        (t.ana_log_reads, s.ana_logs_taken()),
        (1, 1),
        "the bring-up's"
    );
    // Asked for three times before the first answer: one read out, then one more (a
    // read out may predate the change that made the caller ask), never a fifth
    // command on the admin queue.
    t.ana_state = 0x0f;
    for _ in 0..3 {
        assert_eq!(s.refresh_ana(), Ok(()));
    }
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!(s.poll(now), Ok(()));
    assert_eq!(t.ana_log_reads, 3);
    assert_eq!(
        s.ana_logs_taken(),
        2,
        "the read out when asked again is not taken"
    );
    assert_eq!(s.ana().map(|a| a.state), Some(AnaState::Change));
}

#[test]
fn a_namespace_attribute_notice_has_the_namespace_identified_again() {
    let mut t = Target::new();
    let mut rng = Rng(23);
    let (mut s, now) = live_admin(&mut t, &mut rng, 5000);
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    let blocks = s.namespace().unwrap().blocks;
    t.resize_namespace(blocks + 2048);
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!(s.poll(now), Ok(()));
    assert_eq!(s.namespace().unwrap().blocks, blocks + 2048);
    assert_eq!((s.namespace_notices(), t.changed_log_reads), (1, 1));
    assert_eq!(t.event_requests.len(), 1, "a request out for the next");

    // A notice for other namespaces: the list is read (which clears it), this one is
    // not identified again.
    t.ns_blocks = Some(blocks + 4096);
    t.changed_namespaces.push(7);
    t.notify_namespace_attribute();
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!((s.namespace_notices(), t.changed_log_reads), (2, 2));
    assert_eq!(s.namespace().unwrap().blocks, blocks + 2048);

    // The namespace gone: the session fails, saying so.
    t.resize_namespace(0);
    let _ = pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now));
    assert_eq!(s.poll(now), Err(Error::NamespaceMissing(1)));
}

#[test]
fn bring_up_failures_are_typed() {
    let mut rng = Rng(7);
    let mut t = Target::new();
    t.nsid = 2;
    assert_eq!(
        bring_up(&mut t, &mut rng, 5000).1,
        Err(Error::NamespaceMissing(1))
    );

    // As Linux nvmet answers: DNR set, IATTR (bit 16) and IPO (the offset in Connect's
    // data) in dword 0.
    let refusals = [
        ((1, 0x84), (1 << 16) | 512, ConnectRefusal::HostNotAllowed),
        ((1, 0x82), (1 << 16) | 256, ConnectRefusal::UnknownSubsystem),
        ((1, 0x82), (1 << 16) | 16, ConnectRefusal::UnknownController),
        (
            (1, 0x82),
            256,
            ConnectRefusal::InvalidParameter {
                data: false,
                offset: 256,
            },
        ),
        (
            (1, 0x82),
            (1 << 16) | 512,
            ConnectRefusal::InvalidParameter {
                data: true,
                offset: 512,
            },
        ),
        (
            (1, 0x82),
            16,
            ConnectRefusal::InvalidParameter {
                data: false,
                offset: 16,
            },
        ),
        ((1, 0x81), 0, ConnectRefusal::Busy),
        ((0, 0x06), 0, ConnectRefusal::Other(Status::new(0, 0x06))),
    ];
    for ((sct, sc), result, want) in refusals {
        let mut t = Target::new();
        let status = Status::new(sct, sc);
        t.connect_status = Some((Status(status.0 | 1 << 14), result));
        let (s, r, _) = bring_up(&mut t, &mut rng, 5000);
        let want = match want {
            ConnectRefusal::Other(_) => ConnectRefusal::Other(Status(status.0 | 1 << 14)),
            w => w,
        };
        assert_eq!(r, Err(Error::ConnectRefused(want)));
        assert_eq!(s.state(), SessionState::Failed(r.unwrap_err()));
    }
    let unknown = Error::ConnectRefused(ConnectRefusal::UnknownSubsystem);
    assert!(unknown.to_string().contains("no subsystem"));
    // An I/O queue's Connect refused the same way.
    let (mut at, mut it) = (Target::new(), Target::new());
    let (admin, r, _) = bring_up(&mut at, &mut rng, 5000);
    r.unwrap();
    it.connect_status = Some((Status::new(1, 0x82), (1 << 16) | 16));
    let (ctrl, ns) = (admin.controller().unwrap(), admin.namespace().unwrap());
    let mut io = IoSession::<4>::new(&identity(), &ctrl, ns, 1);
    let mut port = MemPort::default();
    let r = pump(&mut it, &mut rng, &mut IoEnd(&mut io, &mut port));
    let e = Error::ConnectRefused(ConnectRefusal::UnknownController);
    assert_eq!((r, io.state()), (Err(e), SessionState::Failed(e)));

    let mut t = Target::new();
    t.csts_polls_before_ready = u32::MAX;
    let (_, r, now) = bring_up(&mut t, &mut rng, 5000);
    assert_eq!(r, Err(Error::Timeout("CSTS.RDY after CC.EN")));
    assert!(
        (1000 + 1000..1000 + 1100).contains(&now),
        "CAP.TO 2 x 500 ms, gave up at {now}"
    );

    let mut t = Target::new();
    t.csts_fatal = true;
    assert_eq!(
        bring_up(&mut t, &mut rng, 5000).1,
        Err(Error::ControllerFatal)
    );

    let mut t = Target::new();
    t.maxh2cdata = 4094;
    assert_eq!(
        bring_up(&mut t, &mut rng, 5000).1,
        Err(Error::Protocol(ProtocolError::BadMaxH2cData(4094)))
    );

    let mut t = Target::new();
    t.cap |= 1 << 48;
    assert!(matches!(
        bring_up(&mut t, &mut rng, 5000).1,
        Err(Error::Unsupported(_))
    ));
}

#[test]
fn bring_up_gives_up_at_its_deadline() {
    let mut s = AdminSession::new(&identity(), 1, 5000, 100, 3000);
    let mut buf = [0u8; 256];
    assert_eq!(s.transmit(&mut buf), 128, "ICReq");
    assert_eq!(s.poll(3099), Ok(()));
    assert_eq!(s.next_timer(), Some(3100));
    assert_eq!(s.poll(3100), Err(Error::Timeout("controller bring-up")));
    assert_eq!(s.transmit(&mut buf), 0, "a failed session sends nothing");
}

#[test]
fn keep_alive_every_half_kato_and_fails_when_unanswered() {
    let mut t = Target::new();
    let mut rng = Rng(3);
    let (mut s, r, mut now) = bring_up(&mut t, &mut rng, 4000);
    r.unwrap();
    for round in 1..=3 {
        assert_eq!(s.next_timer(), Some(now + 2000));
        s.poll(now + 1999).unwrap();
        pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
        assert_eq!(t.keep_alives, round - 1, "not before KATO/2");
        now += 2000;
        s.poll(now).unwrap();
        pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
        assert_eq!(t.keep_alives, round);
    }
    t.mute_keep_alive = true;
    now += 2000;
    s.poll(now).unwrap();
    pump(&mut t, &mut rng, &mut AdminEnd(&mut s, now)).unwrap();
    assert_eq!(s.next_timer(), Some(now + 4000));
    assert_eq!(s.poll(now + 3999), Ok(()));
    assert_eq!(
        s.poll(now + 4000),
        Err(Error::Timeout("keep-alive response"))
    );
}

/// Pumps `s` against `t` from `now`, 5 ms a pass, until the shutdown it was told of
/// completes or fails, or `ms` pass; the time it ended.
fn run_shutdown(
    t: &mut Target,
    rng: &mut Rng,
    s: &mut AdminSession,
    mut now: u64,
    ms: u64,
) -> (Result<(), Error>, u64) {
    let end = now + ms;
    while now < end {
        let r = pump(t, rng, &mut AdminEnd(s, now)).and_then(|()| s.poll(now));
        if r.is_err() || s.shut_down_complete() {
            return (r, now);
        }
        now += 5;
    }
    (Ok(()), now)
}

#[test]
fn a_shutdown_notification_waits_for_the_controller_to_say_complete() {
    let mut t = Target::new();
    t.ana_group = 1;
    t.shutdown_polls = 3;
    let mut rng = Rng(21);
    let (mut s, now) = live_admin(&mut t, &mut rng, 4000);
    let cc_live = t.cc;
    assert!(!t.event_requests.is_empty(), "an event request is out");
    s.shut_down(now, 5000).unwrap();
    let (r, done) = run_shutdown(&mut t, &mut rng, &mut s, now, 10_000);
    r.unwrap();
    assert!(s.shut_down_complete());
    assert_eq!(t.shutdowns, 1);
    assert_eq!(
        t.cc,
        cc_live | (0b01 << 14),
        "CC.EN and the rest kept, SHN 01b"
    );
    assert_eq!(t.shutdown_reads, 4, "CSTS read until SHST said complete");
    assert!(done >= now + 30, "a read every 10 ms");
    assert_eq!(t.after_shutdown, 0, "nothing else sent after CC.SHN");
    assert_eq!(s.state(), SessionState::Live);
    assert_eq!(s.next_timer(), None);
    // Done: no keep-alive, nothing more, however long it stays.
    let keep_alives = t.keep_alives;
    for later in [done + 2000, done + 10_000] {
        s.poll(later).unwrap();
        pump(&mut t, &mut rng, &mut AdminEnd(&mut s, later)).unwrap();
    }
    assert_eq!((t.keep_alives, t.after_shutdown), (keep_alives, 0));
}

#[test]
fn a_shutdown_the_controller_never_completes_fails_at_its_bound() {
    let mut t = Target::new();
    t.shutdown_polls = u32::MAX;
    let mut rng = Rng(22);
    let (mut s, now) = live_admin(&mut t, &mut rng, 4000);
    let keep_alives = t.keep_alives;
    s.shut_down(now, 3000).unwrap();
    assert_eq!(s.next_timer(), Some(now + 3000));
    let (r, _) = run_shutdown(&mut t, &mut rng, &mut s, now, 2995);
    r.unwrap();
    assert!(!s.shut_down_complete());
    assert!(
        t.shutdown_reads > 100,
        "read every 10 ms: {}",
        t.shutdown_reads
    );
    assert_eq!(
        t.keep_alives, keep_alives,
        "no keep-alive while shutting down (KATO/2 is 2 s)"
    );
    assert_eq!(
        s.poll(now + 3000),
        Err(Error::Timeout("CSTS.SHST after CC.SHN"))
    );
    assert!(!s.shut_down_complete());
}

#[test]
fn a_controller_that_fails_during_its_shutdown_says_so() {
    let mut t = Target::new();
    t.shutdown_polls = 2;
    let mut rng = Rng(23);
    let (mut s, now) = live_admin(&mut t, &mut rng, 0);
    s.shut_down(now, 5000).unwrap();
    t.csts_fatal = true;
    let (r, _) = run_shutdown(&mut t, &mut rng, &mut s, now, 5000);
    assert_eq!(r, Err(Error::ControllerFatal));
    assert!(!s.shut_down_complete());
}

#[test]
fn only_a_live_session_is_shut_down() {
    // Mid bring-up: nothing to shut down, nothing sent.
    let mut t = Target::new();
    t.csts_polls_before_ready = u32::MAX;
    let mut rng = Rng(24);
    let (mut s, r, now) = bring_up(&mut t, &mut rng, 0);
    assert_eq!(r, Err(Error::Timeout("CSTS.RDY after CC.EN")));
    s.shut_down(now, 5000).unwrap();
    let mut fresh = AdminSession::new(&identity(), 1, 0, 0, 10_000);
    fresh.shut_down(0, 5000).unwrap();
    let mut buf = [0u8; 256];
    assert_eq!(fresh.transmit(&mut buf), 8 + 120, "only the ICReq goes");
    assert_eq!(t.shutdowns, 0);
    assert!(!s.shut_down_complete() && !fresh.shut_down_complete());
    // Told twice: one notification.
    let mut t = Target::new();
    let (mut s, now) = live_admin(&mut t, &mut rng, 0);
    s.shut_down(now, 5000).unwrap();
    s.shut_down(now, 5000).unwrap();
    run_shutdown(&mut t, &mut rng, &mut s, now, 5000).0.unwrap();
    assert_eq!(t.shutdowns, 1);
}

// ---- I/O ----

#[test]
fn io_queue_connects_to_the_admin_controller() {
    let (mut at, mut it) = (Target::new(), Target::new());
    let mut rng = Rng(11);
    let _io = live_io::<16>(&mut at, &mut it, &mut rng);
    assert_eq!(it.connects.len(), 1);
    let c = &it.connects[0];
    assert_eq!((c.qid, c.sqsize, c.kato, c.cntlid), (1, 15, 0, 0x11));
    assert_eq!((c.subnqn.as_str(), c.hostnqn.as_str()), (SUBNQN, HOST_NQN));
}

#[test]
fn reads_arrive_whole_in_several_c2h_pdus_with_or_without_success_flag() {
    for success_flag in [false, true] {
        for seed in 1..10 {
            let (mut at, mut it) = (Target::new(), Target::new());
            let mut rng = Rng(seed);
            let mut io = live_io::<8>(&mut at, &mut it, &mut rng);
            it.success_flag = success_flag;
            it.c2h_chunk = 1000 + seed as usize * 100;
            let mut port = MemPort::default();
            for (tag, (lba, blocks)) in [(0u64, 1u32), (3, 8), (100, 64), (255, 1)]
                .into_iter()
                .enumerate()
            {
                port.bufs
                    .insert(tag as u64, vec![0xee; blocks as usize * BLOCK]);
                io.read(tag as u64, lba, blocks).unwrap();
            }
            let done = run_io(&mut io, &mut it, &mut port, &mut rng).unwrap();
            assert_eq!(done.len(), 4);
            for (tag, (lba, blocks)) in [(0u64, 1usize), (3, 8), (100, 64), (255, 1)]
                .into_iter()
                .enumerate()
            {
                assert_eq!(
                    port.bufs[&(tag as u64)],
                    it.disk[lba as usize * BLOCK..(lba as usize + blocks) * BLOCK]
                );
                assert!(done
                    .iter()
                    .any(|c| c.tag == tag as u64 && c.status.is_success()));
            }
        }
    }
}

#[test]
fn writes_go_in_capsule_up_to_ioccsz_and_by_r2t_beyond() {
    for seed in 1..10 {
        let (mut at, mut it) = (Target::new(), Target::new());
        at.maxh2cdata = 4096;
        let mut rng = Rng(seed);
        let mut io = live_io::<8>(&mut at, &mut it, &mut rng);
        it.r2t_chunk = 12 * 1024;
        let mut port = MemPort::default();
        // 8 blocks = 4 KiB: in the capsule; 40 blocks = 20 KiB: two R2Ts (12 + 8 KiB),
        // H2CData PDUs of at most 4 KiB.
        let writes = [(0u64, 10u64, 8u32), (1, 50, 40), (2, 200, 1)];
        for (tag, lba, blocks) in writes {
            let data: Vec<u8> = (0..blocks as usize * BLOCK)
                .map(|i| (i as u64 * 31 + tag * 7 + seed) as u8)
                .collect();
            port.bufs.insert(tag, data);
            io.write(tag, lba, blocks).unwrap();
        }
        let done = run_io(&mut io, &mut it, &mut port, &mut rng).unwrap();
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|c| c.status.is_success()));
        for (tag, lba, blocks) in writes {
            assert_eq!(
                it.disk[lba as usize * BLOCK..(lba as usize + blocks as usize) * BLOCK],
                port.bufs[&tag]
            );
        }
        assert_eq!(it.inline_writes, 2, "4 KiB and 512 B fit IOCCSZ");
        assert_eq!(it.r2ts, 2);
        assert_eq!(it.h2c_pdus, 5, "12 KiB as 3 x 4 KiB, 8 KiB as 2 x 4 KiB");
        assert_eq!(it.h2c_max, 4096);
    }
}

#[test]
fn flush_and_discard() {
    let (mut at, mut it) = (Target::new(), Target::new());
    let mut rng = Rng(5);
    let mut io = live_io::<4>(&mut at, &mut it, &mut rng);
    let mut port = MemPort::default();
    io.flush(1).unwrap();
    io.discard(2, 16, 4).unwrap();
    let done = run_io(&mut io, &mut it, &mut port, &mut rng).unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!(it.flushes, 1);
    assert!(it.disk[16 * BLOCK..20 * BLOCK].iter().all(|&b| b == 0));
    assert!(it.disk[15 * BLOCK..16 * BLOCK].iter().any(|&b| b != 0));
    assert!(it.disk[20 * BLOCK..21 * BLOCK].iter().any(|&b| b != 0));
    // Discard data goes by R2T when the capsule has no room.
    let (mut at, mut it) = (Target::new(), Target::new());
    at.ioccsz = 4;
    let mut io = live_io::<4>(&mut at, &mut it, &mut rng);
    io.discard(3, 0, 1).unwrap();
    let done = run_io(&mut io, &mut it, &mut port, &mut rng).unwrap();
    assert_eq!((done.len(), it.r2ts, it.inline_writes), (1, 1, 0));
    assert!(it.disk[..BLOCK].iter().all(|&b| b == 0));
}

#[test]
fn full_queue_of_mixed_commands_in_random_cuts() {
    for seed in 1..30 {
        let (mut at, mut it) = (Target::new(), Target::new());
        at.maxh2cdata = 4096 + 4 * (seed as u32 % 7);
        at.ioccsz = 4 + (seed as u32 % 3) * 100;
        let mut rng = Rng(seed);
        let mut io = live_io::<16>(&mut at, &mut it, &mut rng);
        it.c2h_chunk = 500 + rng.below(5000);
        it.r2t_chunk = 4096 * (1 + rng.below(4) as u32);
        it.success_flag = seed % 2 == 0;
        let mut port = MemPort::default();
        let mut model = it.disk.clone();
        let expect_reads = submit_mixed(&mut io, &mut port, &mut rng, &mut model, 16, |rng, _| {
            rng.below(2) == 0
        });
        assert_eq!(io.read(99, 0, 1), Err(SubmitError::Full));
        let done = run_io(&mut io, &mut it, &mut port, &mut rng).unwrap();
        assert_eq!(done.len(), 16);
        assert!(done.iter().all(|c| c.status.is_success()));
        assert_eq!(it.disk, model);
        for (tag, want) in expect_reads {
            assert_eq!(port.bufs[&tag], want, "seed {seed} tag {tag}");
        }
        // Slots are free again.
        port.bufs.insert(100, vec![0; BLOCK]);
        io.read(100, 0, 1).unwrap();
        assert_eq!(
            run_io(&mut io, &mut it, &mut port, &mut rng).unwrap().len(),
            1
        );
    }
}

/// Submits a read or a write (`writes` picks) of 1 to 16 blocks for each of the tags
/// 0..`tags`, on ranges 16 blocks apart so the order between commands does not matter;
/// writes go into `model` too. Returns what each read must find.
fn submit_mixed<const N: usize>(
    io: &mut IoSession<N>,
    port: &mut MemPort,
    rng: &mut Rng,
    model: &mut [u8],
    tags: u64,
    writes: impl Fn(&mut Rng, u64) -> bool,
) -> HashMap<u64, Vec<u8>> {
    let mut expect_reads = HashMap::new();
    for tag in 0..tags {
        let blocks = (1 + rng.below(48) as u32).min(16);
        let lba = tag * 16;
        let range = lba as usize * BLOCK..(lba as usize + blocks as usize) * BLOCK;
        if writes(rng, tag) {
            let data: Vec<u8> = (0..range.len()).map(|_| rng.next() as u8).collect();
            model[range].copy_from_slice(&data);
            port.bufs.insert(tag, data);
            io.write(tag, lba, blocks).unwrap();
        } else {
            port.bufs.insert(tag, vec![0; range.len()]);
            expect_reads.insert(tag, model[range].to_vec());
            io.read(tag, lba, blocks).unwrap();
        }
    }
    expect_reads
}

#[test]
fn io_requests_are_checked_before_they_go() {
    let (mut at, mut it) = (Target::new(), Target::new());
    let mut rng = Rng(9);
    let mut io = live_io::<4>(&mut at, &mut it, &mut rng);
    assert_eq!(io.read(1, 0, 0), Err(SubmitError::BadLength));
    // MDTS 5: 128 KiB = 256 blocks; one more is too many.
    assert_eq!(io.read(1, 0, 257), Err(SubmitError::BadLength));
    assert_eq!(io.write(1, 0, 70000), Err(SubmitError::BadLength));
    assert_eq!(io.discard(1, 0, 0), Err(SubmitError::BadLength));
    assert!(io.read(1, 0, 256).is_ok());
    let ctrl = crate::ControllerInfo {
        cntlid: 1,
        max_queue_entries: 4,
        inline_limit: 0,
        max_transfer: None,
        volatile_write_cache: false,
        deallocate: false,
        keep_alive_ms: 0,
        ana_transition_s: 0,
    };
    let ns = crate::NamespaceInfo {
        nsid: 1,
        blocks: 8,
        block_size: 512,
    };
    let mut fresh = IoSession::<4>::new(&identity(), &ctrl, ns, 1);
    assert_eq!(fresh.read(1, 0, 1), Err(SubmitError::NotReady));
}

// ---- Bad PDUs against a bare queue ----

/// A ready I/O queue (MAXH2CDATA 4096, 4 KiB in-capsule) with a read of 8 KiB (tag 1), a
/// write of 16 KiB by R2T (tag 2), an in-capsule write of 1 KiB (tag 3) sent; returns
/// the command IDs in that order.
fn scripted() -> (Queue<8>, MemPort, [u16; 3]) {
    let mut q = Queue::<8>::new(QueueKind::Io { inline_limit: 4096 });
    let mut port = MemPort::default();
    let mut out = vec![0u8; 1 << 16];
    assert_eq!(
        q.submit(1, sqe::rw(false, 1, 0, 16), Payload::ToHost(8192)),
        Err(SubmitError::NotReady)
    );
    assert_eq!(q.transmit(&mut out, &mut port), 128);
    q.receive(&icresp_pdu(4096), &mut port).unwrap();
    port.bufs.insert(1, vec![0; 8192]);
    port.bufs.insert(2, vec![0x22; 16384]);
    port.bufs.insert(3, vec![0x33; 1024]);
    q.submit(1, sqe::rw(false, 1, 0, 16), Payload::ToHost(8192))
        .unwrap();
    q.submit(2, sqe::rw(true, 1, 0, 32), Payload::ToTarget(16384))
        .unwrap();
    q.submit(3, sqe::rw(true, 1, 0, 2), Payload::ToTarget(1024))
        .unwrap();
    let n = q.transmit(&mut out, &mut port);
    assert_eq!(n, 72 + 72 + 72 + 1024);
    let cid = |i: usize| le16(&out, i * 72 + 8 + 2);
    (q, port, [cid(0), cid(1), cid(2)])
}

fn feed(q: &mut Queue<8>, port: &mut MemPort, bytes: &[u8]) -> Result<(), ProtocolError> {
    q.receive(bytes, port)
}

#[test]
fn scripted_happy_path_then_every_bad_pdu_fails_the_connection() {
    let (mut q, mut port, [rd, wr, _]) = scripted();
    feed(&mut q, &mut port, &c2h_pdu(rd, 0, &[5; 4096], 0)).unwrap();
    feed(
        &mut q,
        &mut port,
        &c2h_pdu(
            rd,
            4096,
            &[6; 4096],
            pdu::FLAG_DATA_LAST | pdu::FLAG_DATA_SUCCESS,
        ),
    )
    .unwrap();
    let c = q.next_completion().unwrap();
    assert_eq!((c.tag, c.status), (1, Status::SUCCESS));
    assert_eq!(&port.bufs[&1][4090..4100], &[5, 5, 5, 5, 5, 5, 6, 6, 6, 6]);
    feed(&mut q, &mut port, &r2t_pdu(wr, 9, 0, 16384)).unwrap();
    let mut out = vec![0u8; 1 << 16];
    let n = q.transmit(&mut out, &mut port);
    assert_eq!(n, 4 * (24 + 4096), "16 KiB as four H2CData of MAXH2CDATA");
    assert_eq!(out[24 + 4096 + 1], 0, "not LAST");
    assert_eq!(out[3 * (24 + 4096) + 1], pdu::FLAG_DATA_LAST);
    assert_eq!(le16(&out, 10), 9, "transfer tag echoed");
    feed(&mut q, &mut port, &resp_pdu(wr, Status::SUCCESS, 0)).unwrap();
    assert_eq!(q.next_completion().unwrap().tag, 2);
}

/// A bad PDU: its name, how to build it from the command IDs of [`scripted`], the
/// error it must give.
type BadCase = (
    &'static str,
    Box<dyn Fn([u16; 3]) -> Vec<u8>>,
    ProtocolError,
);

/// Each bad PDU, after the three commands of [`scripted`], and the error it must give.
fn bad_cases() -> Vec<BadCase> {
    use ProtocolError as P;
    vec![
        (
            "unknown type",
            Box::new(|_| {
                let mut p = resp_pdu(0, Status::SUCCESS, 0);
                p[0] = 8;
                p
            }),
            P::UnexpectedPduType(8),
        ),
        (
            "H2C type from the target",
            Box::new(|_| {
                let mut p = resp_pdu(0, Status::SUCCESS, 0);
                p[0] = pdu::H2C_DATA;
                p
            }),
            P::UnexpectedPduType(pdu::H2C_DATA),
        ),
        (
            "second ICResp",
            Box::new(|_| icresp_pdu(4096)),
            P::UnexpectedPduType(pdu::ICRESP),
        ),
        (
            "header digest flag",
            Box::new(|[r, ..]| {
                let mut p = resp_pdu(r, Status::SUCCESS, 0);
                p[1] = pdu::FLAG_HDGST;
                p
            }),
            P::BadFlags {
                pdu_type: pdu::CAPSULE_RESP,
                flags: 1,
            },
        ),
        (
            "data digest on C2HData",
            Box::new(|[r, ..]| c2h_pdu(r, 0, &[0; 8], pdu::FLAG_DDGST)),
            P::BadFlags {
                pdu_type: pdu::C2H_DATA,
                flags: 2,
            },
        ),
        (
            "resp hlen",
            Box::new(|[r, ..]| {
                let mut p = resp_pdu(r, Status::SUCCESS, 0);
                p[2] = 16;
                p
            }),
            P::BadHeaderLength {
                pdu_type: pdu::CAPSULE_RESP,
                hlen: 16,
            },
        ),
        (
            "resp plen",
            Box::new(|[r, ..]| {
                let mut p = resp_pdu(r, Status::SUCCESS, 0);
                p[4] = 28;
                p.extend([0; 4]);
                p
            }),
            P::BadPduLength {
                pdu_type: pdu::CAPSULE_RESP,
                plen: 28,
            },
        ),
        (
            "resp pdo",
            Box::new(|[r, ..]| {
                let mut p = resp_pdu(r, Status::SUCCESS, 0);
                p[3] = 24;
                p
            }),
            P::BadDataOffset {
                pdu_type: pdu::CAPSULE_RESP,
                pdo: 24,
            },
        ),
        (
            "r2t plen",
            Box::new(|[_, w, _]| {
                let mut p = r2t_pdu(w, 1, 0, 4096);
                p[4] = 200;
                p
            }),
            P::BadPduLength {
                pdu_type: pdu::R2T,
                plen: 200,
            },
        ),
        (
            "c2h pdo inside header",
            Box::new(|[r, ..]| {
                let mut p = c2h_pdu(r, 0, &[0; 8], 0);
                p[3] = 20;
                p
            }),
            P::BadDataOffset {
                pdu_type: pdu::C2H_DATA,
                pdo: 20,
            },
        ),
        (
            "c2h without data",
            Box::new(|[r, ..]| c2h_pdu(r, 0, &[], 0)),
            P::BadDataOffset {
                pdu_type: pdu::C2H_DATA,
                pdo: 24,
            },
        ),
        (
            "c2h unknown cid",
            Box::new(|[r, ..]| c2h_pdu(r ^ 0x4, 0, &[0; 8], 0)),
            P::UnknownCommand(0),
        ),
        (
            "c2h stale generation",
            Box::new(|[r, ..]| c2h_pdu(r.wrapping_add(0x100), 0, &[0; 8], 0)),
            P::UnknownCommand(0),
        ),
        (
            "c2h cid past the slots",
            Box::new(|_| c2h_pdu(0x0150, 0, &[0; 8], 0)),
            P::UnknownCommand(0x0150),
        ),
        (
            "c2h for a write",
            Box::new(|[_, w, _]| c2h_pdu(w, 0, &[0; 8], 0)),
            P::WrongDirection(0),
        ),
        (
            "c2h out of order",
            Box::new(|[r, ..]| c2h_pdu(r, 8, &[0; 8], 0)),
            P::DataOutOfOrder {
                cid: 0,
                expected: 0,
                offset: 8,
                len: 8,
            },
        ),
        (
            "c2h past the buffer",
            Box::new(|[r, ..]| c2h_pdu(r, 0, &[0; 8200], 0)),
            P::DataOutOfOrder {
                cid: 0,
                expected: 0,
                offset: 0,
                len: 8200,
            },
        ),
        (
            "c2h datal lies",
            Box::new(|[r, ..]| {
                let mut p = c2h_pdu(r, 0, &[0; 64], 0);
                p[16] = 32;
                p
            }),
            P::DataOutOfOrder {
                cid: 0,
                expected: 0,
                offset: 0,
                len: 32,
            },
        ),
        (
            "c2h offset wraps",
            Box::new(|[r, ..]| {
                let mut p = c2h_pdu(r, 0, &[0; 64], 0);
                p[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
                p
            }),
            P::DataOutOfOrder {
                cid: 0,
                expected: 0,
                offset: u32::MAX,
                len: 64,
            },
        ),
        (
            "success without last",
            Box::new(|[r, ..]| c2h_pdu(r, 0, &[0; 8192], pdu::FLAG_DATA_SUCCESS)),
            P::SuccessWithoutLast(0),
        ),
        (
            "success on short data",
            Box::new(|[r, ..]| {
                c2h_pdu(
                    r,
                    0,
                    &[7; 4096],
                    pdu::FLAG_DATA_SUCCESS | pdu::FLAG_DATA_LAST,
                )
            }),
            P::ShortRead {
                cid: 0,
                received: 4096,
                expected: 8192,
            },
        ),
        (
            "c2h last before the end",
            Box::new(|[r, ..]| c2h_pdu(r, 0, &[0; 4096], pdu::FLAG_DATA_LAST)),
            P::BadLastFlag(0),
        ),
        (
            "c2h end without last",
            Box::new(|[r, ..]| c2h_pdu(r, 0, &[0; 8192], 0)),
            P::BadLastFlag(0),
        ),
        (
            "response before read data",
            Box::new(|[r, ..]| resp_pdu(r, Status::SUCCESS, 0)),
            P::ShortRead {
                cid: 0,
                received: 0,
                expected: 8192,
            },
        ),
        (
            "response before write data",
            Box::new(|[_, w, _]| resp_pdu(w, Status::SUCCESS, 0)),
            P::ResponseDuringTransfer(0),
        ),
        (
            "r2t for a read",
            Box::new(|[r, ..]| r2t_pdu(r, 1, 0, 4096)),
            P::WrongDirection(0),
        ),
        (
            "r2t of nothing",
            Box::new(|[_, w, _]| r2t_pdu(w, 1, 0, 0)),
            P::BadR2t {
                cid: 0,
                offset: 0,
                len: 0,
            },
        ),
        (
            "r2t past the end",
            Box::new(|[_, w, _]| r2t_pdu(w, 1, 0, 16385)),
            P::BadR2t {
                cid: 0,
                offset: 0,
                len: 16385,
            },
        ),
        (
            "r2t out of order",
            Box::new(|[_, w, _]| r2t_pdu(w, 1, 4096, 4096)),
            P::BadR2t {
                cid: 0,
                offset: 4096,
                len: 4096,
            },
        ),
        (
            "r2t wraps",
            Box::new(|[_, w, _]| r2t_pdu(w, 1, 0, u32::MAX)),
            P::BadR2t {
                cid: 0,
                offset: 0,
                len: u32::MAX,
            },
        ),
        (
            "r2t for in-capsule data",
            Box::new(|[_, _, i]| r2t_pdu(i, 1, 0, 1024)),
            P::BadR2t {
                cid: 0,
                offset: 0,
                len: 1024,
            },
        ),
        (
            "two r2ts at once",
            Box::new(|[_, w, _]| [r2t_pdu(w, 1, 0, 4096), r2t_pdu(w, 2, 0, 4096)].concat()),
            P::BadR2t {
                cid: 0,
                offset: 0,
                len: 4096,
            },
        ),
        (
            "termination",
            Box::new(|_| term_pdu(5)),
            P::Terminated { fes: 5 },
        ),
        (
            "termination with a data offset",
            Box::new(|_| {
                let mut p = term_pdu(1);
                p[3] = 24;
                p
            }),
            P::BadDataOffset {
                pdu_type: pdu::C2H_TERM,
                pdo: 24,
            },
        ),
        (
            "termination too long",
            Box::new(|_| {
                let mut p = term_pdu(1);
                p[4] = 153;
                p
            }),
            P::BadPduLength {
                pdu_type: pdu::C2H_TERM,
                plen: 153,
            },
        ),
    ]
}

/// Replaces command IDs in an expected error by the ones the case used (the table
/// writes 0).
fn with_cid(e: ProtocolError, cid: u16) -> ProtocolError {
    use ProtocolError as P;
    match e {
        P::UnknownCommand(0) => P::UnknownCommand(cid),
        P::WrongDirection(0) => P::WrongDirection(cid),
        P::DataOutOfOrder {
            cid: 0,
            expected,
            offset,
            len,
        } => P::DataOutOfOrder {
            cid,
            expected,
            offset,
            len,
        },
        P::SuccessWithoutLast(0) => P::SuccessWithoutLast(cid),
        P::BadLastFlag(0) => P::BadLastFlag(cid),
        P::ShortRead {
            cid: 0,
            received,
            expected,
        } => P::ShortRead {
            cid,
            received,
            expected,
        },
        P::ResponseDuringTransfer(0) => P::ResponseDuringTransfer(cid),
        P::BadR2t {
            cid: 0,
            offset,
            len,
        } => P::BadR2t { cid, offset, len },
        e => e,
    }
}

#[test]
fn bad_pdus_fail_with_their_error_and_stay_failed() {
    for (name, make, want) in bad_cases() {
        for cut in [usize::MAX, 1, 5, 23] {
            let (mut q, mut port, cids) = scripted();
            let bytes = make(cids);
            let cid = if bytes[0] == pdu::CAPSULE_RESP {
                le16(&bytes, 20)
            } else {
                le16(&bytes, 8)
            };
            let mut r = Ok(());
            for piece in bytes.chunks(cut.min(bytes.len())) {
                r = feed(&mut q, &mut port, piece);
                if r.is_err() {
                    break;
                }
            }
            assert_eq!(r, Err(with_cid(want, cid)), "{name}, in pieces of {cut}");
            assert_eq!(q.error(), Some(with_cid(want, cid)), "{name}");
            assert!(
                port.bufs[&1].iter().all(|&b| b == 0),
                "{name}: no data lands from a bad PDU"
            );
            // Failed for good: nothing goes out, nothing more is taken in.
            assert_eq!(
                feed(&mut q, &mut port, &resp_pdu(cids[0], Status::SUCCESS, 0)),
                Err(with_cid(want, cid))
            );
            assert_eq!(q.transmit(&mut [0u8; 4096], &mut port), 0);
            assert_eq!(
                q.submit(9, sqe::flush(1), Payload::None),
                Err(SubmitError::Failed)
            );
            let mut held = Vec::new();
            q.drain(|t| held.push(t));
            held.sort();
            assert_eq!(held, vec![1, 2, 3], "{name}: every command is handed back");
        }
    }
}

#[test]
fn bad_icresp_fields_are_refused() {
    use ProtocolError as P;
    type Mutation = fn(&mut Vec<u8>);
    let cases: Vec<(Mutation, ProtocolError)> = vec![
        (|p| p[8] = 1, P::BadVersion(1)),
        (|p| p[10] = 1, P::UnsupportedAlignment(1)),
        (|p| p[11] = 1, P::DigestMismatch(1)),
        (|p| p[11] = 2, P::DigestMismatch(2)),
        (
            |p| p[12..16].copy_from_slice(&4092u32.to_le_bytes()),
            P::BadMaxH2cData(4092),
        ),
        (
            |p| p[12..16].copy_from_slice(&4098u32.to_le_bytes()),
            P::BadMaxH2cData(4098),
        ),
        (
            |p| p[2] = 24,
            P::BadHeaderLength {
                pdu_type: pdu::ICRESP,
                hlen: 24,
            },
        ),
        (
            |p| p[4] = 129,
            P::BadPduLength {
                pdu_type: pdu::ICRESP,
                plen: 129,
            },
        ),
        (
            |p| p[1] = 4,
            P::BadFlags {
                pdu_type: pdu::ICRESP,
                flags: 4,
            },
        ),
        (
            |p| p[0] = pdu::CAPSULE_RESP,
            P::UnexpectedPduType(pdu::CAPSULE_RESP),
        ),
    ];
    for (mutate, want) in cases {
        let mut q = Queue::<2>::new(QueueKind::Admin);
        let mut port = MemPort::default();
        let mut p = icresp_pdu(8192);
        mutate(&mut p);
        assert_eq!(q.receive(&p, &mut port), Err(want));
        assert!(!q.is_ready());
    }
}

#[test]
fn an_error_response_during_r2t_data_completes_after_the_pdu_on_the_wire() {
    let (mut q, mut port, [_, wr, _]) = scripted();
    feed(&mut q, &mut port, &r2t_pdu(wr, 9, 0, 16384)).unwrap();
    let mut out = [0u8; 100];
    // Part of the first H2CData PDU is out.
    assert_eq!(q.transmit(&mut out, &mut port), 100);
    let failed = Status::new(0, 0x80);
    feed(&mut q, &mut port, &resp_pdu(wr, failed, 0)).unwrap();
    assert_eq!(
        q.next_completion(),
        None,
        "buffer still in use by the PDU on the wire"
    );
    let mut rest = vec![0u8; 1 << 16];
    let n = q.transmit(&mut rest, &mut port);
    assert_eq!(
        n,
        24 + 4096 - 100,
        "the PDU is finished, the R2T's other PDUs dropped"
    );
    let c = q.next_completion().unwrap();
    assert_eq!((c.tag, c.status), (2, failed));
    assert_eq!(q.in_flight(), 2);
    // An error before the R2T completes at once.
    let (mut q, mut port, [_, wr, _]) = scripted();
    feed(&mut q, &mut port, &resp_pdu(wr, failed, 0)).unwrap();
    assert_eq!(q.next_completion().map(|c| c.status), Some(failed));
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x5eed);
    for round in 0..3000 {
        let (mut q, mut port, cids) = scripted();
        // Start from a valid PDU and flip a few bytes, or send noise.
        let mut bytes = match round % 4 {
            0 => c2h_pdu(cids[0], 0, &[1; 300], pdu::FLAG_DATA_LAST),
            1 => r2t_pdu(cids[1], 3, 0, 8192),
            2 => resp_pdu(cids[2], Status::SUCCESS, 0),
            _ => (0..64).map(|_| rng.next() as u8).collect(),
        };
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(bytes.len());
            bytes[i] = rng.next() as u8;
        }
        let _ = feed(&mut q, &mut port, &bytes);
        let _ = q.transmit(&mut [0u8; 9000], &mut port);
        while q.next_completion().is_some() {}
    }
}

#[test]
fn io_depth_follows_the_controller_queue_size() {
    let (mut at, mut it) = (Target::new(), Target::new());
    at.maxcmd = 4;
    let mut rng = Rng(13);
    let mut io = live_io::<16>(&mut at, &mut it, &mut rng);
    assert_eq!(it.connects[0].sqsize, 3, "four entries, 0's based");
    for tag in 0..4 {
        io.read(tag, 0, 1).unwrap();
    }
    assert_eq!(io.read(4, 0, 1), Err(SubmitError::Full));
}

#[test]
fn answers_to_a_capsule_not_yet_sent_whole_are_refused() {
    let mut q = Queue::<4>::new(QueueKind::Io { inline_limit: 0 });
    let mut port = MemPort::default();
    port.bufs.insert(1, vec![0; 512]);
    q.transmit(&mut [0u8; 128], &mut port);
    q.receive(&icresp_pdu(4096), &mut port).unwrap();
    q.submit(1, sqe::rw(false, 1, 0, 1), Payload::ToHost(512))
        .unwrap();
    assert_eq!(q.transmit(&mut [0u8; 30], &mut port), 30);
    // Slot 0, generation 1.
    let e = ProtocolError::UnknownCommand(0x0100);
    assert_eq!(
        q.receive(
            &c2h_pdu(0x0100, 0, &[0; 512], pdu::FLAG_DATA_LAST),
            &mut port
        ),
        Err(e)
    );
    let mut q = Queue::<4>::new(QueueKind::Io { inline_limit: 0 });
    q.transmit(&mut [0u8; 128], &mut port);
    q.receive(&icresp_pdu(4096), &mut port).unwrap();
    q.submit(1, sqe::rw(false, 1, 0, 1), Payload::ToHost(512))
        .unwrap();
    assert_eq!(q.transmit(&mut [0u8; 71], &mut port), 71);
    assert_eq!(
        q.receive(&resp_pdu(0x0100, Status::new(0, 6), 0), &mut port),
        Err(e)
    );
    assert_eq!(
        Queue::<4>::new(QueueKind::Admin).submit(1, sqe::flush(1), Payload::None),
        Err(SubmitError::NotReady)
    );
}

#[test]
fn oversized_payloads_are_refused() {
    let mut q = Queue::<4>::new(QueueKind::Io { inline_limit: 0 });
    let mut port = MemPort::default();
    q.transmit(&mut [0u8; 128], &mut port);
    q.receive(&icresp_pdu(4096), &mut port).unwrap();
    let big = crate::MAX_DATA_LEN + 1;
    assert_eq!(
        q.submit(1, sqe::rw(false, 1, 0, 1), Payload::ToHost(big)),
        Err(SubmitError::BadLength)
    );
    assert_eq!(
        q.submit(1, sqe::rw(true, 1, 0, 1), Payload::ToTarget(0)),
        Err(SubmitError::BadLength)
    );
    let owned = Payload::Owned {
        bytes: [0; 16],
        len: 17,
    };
    assert_eq!(
        q.submit(1, sqe::deallocate(1), owned),
        Err(SubmitError::BadLength)
    );
    assert!(q
        .submit(
            1,
            sqe::rw(false, 1, 0, 1),
            Payload::ToHost(crate::MAX_DATA_LEN)
        )
        .is_ok());
}

#[test]
fn answers_for_finished_commands_are_refused() {
    let last = pdu::FLAG_DATA_LAST | pdu::FLAG_DATA_SUCCESS;
    // Completed, not yet taken: its slot still holds it.
    let (mut q, mut port, [rd, ..]) = scripted();
    feed(&mut q, &mut port, &c2h_pdu(rd, 0, &[5; 8192], last)).unwrap();
    assert_eq!(
        feed(&mut q, &mut port, &resp_pdu(rd, Status::SUCCESS, 0)),
        Err(ProtocolError::UnknownCommand(rd))
    );
    // Taken: the slot is free, with the same generation until it is used again.
    let (mut q, mut port, [rd, ..]) = scripted();
    feed(&mut q, &mut port, &c2h_pdu(rd, 0, &[5; 8192], last)).unwrap();
    assert_eq!(q.next_completion().map(|c| c.tag), Some(1));
    assert_eq!(
        feed(&mut q, &mut port, &c2h_pdu(rd, 0, &[5; 8], 0)),
        Err(ProtocolError::UnknownCommand(rd))
    );
}

#[test]
fn controllers_and_namespaces_this_host_cannot_use_are_refused() {
    let unsupported = |mutate: fn(&mut Target)| {
        let mut t = Target::new();
        mutate(&mut t);
        bring_up(&mut t, &mut Rng(17), 5000).1
    };
    assert_eq!(
        unsupported(|t| t.sgls = 0),
        Err(Error::Unsupported("SGLs (SGLS)"))
    );
    assert_eq!(
        unsupported(|t| t.cap &= !(1 << 37)),
        Err(Error::Unsupported("the NVM command set (CAP.CSS)"))
    );
    assert!(
        matches!(unsupported(|t| t.cap &= !0xffff), Err(Error::Unsupported(m)) if m.contains("MQES"))
    );
    assert_eq!(
        unsupported(|t| t.lbaf0 = (8, 9)),
        Err(Error::Unsupported("namespaces with metadata"))
    );
    let lbads = Err(Error::Unsupported("the namespace's block size (LBADS)"));
    assert_eq!(unsupported(|t| t.lbaf0 = (0, 8)), lbads);
    assert_eq!(unsupported(|t| t.lbaf0 = (0, 17)), lbads);
    assert!(
        matches!(unsupported(|t| t.flbas = 1), Err(Error::Unsupported(m)) if m.contains("FLBAS"))
    );
    assert_eq!(
        unsupported(|t| t.ns_blocks = Some(0)),
        Err(Error::NamespaceMissing(1))
    );
    // Format 1 (4 KiB blocks) chosen by FLBAS when the namespace lists it.
    let mut t = Target::new();
    t.nlbaf = 1;
    t.flbas = 1;
    let (s, r, _) = bring_up(&mut t, &mut Rng(17), 5000);
    r.unwrap();
    assert_eq!(s.namespace().unwrap().block_size, 4096);
}

#[test]
fn without_mdts_requests_are_bounded_by_the_command_format() {
    let (mut at, mut it) = (Target::new(), Target::new());
    at.mdts = 0;
    let mut rng = Rng(19);
    let mut io = live_io::<4>(&mut at, &mut it, &mut rng);
    assert_eq!(
        io.read(1, 0, 65537),
        Err(SubmitError::BadLength),
        "NLB is 16 bits"
    );
    assert!(io.read(1, 0, 65536).is_ok());
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read(u64, u32),
    Write(u64, u32),
}

fn submit_op<const N: usize>(io: &mut IoSession<N>, tag: u64, op: Op) {
    match op {
        Op::Read(lba, blocks) => io.read(tag, lba, blocks).unwrap(),
        Op::Write(lba, blocks) => io.write(tag, lba, blocks).unwrap(),
    }
}

#[test]
fn requests_held_across_a_lost_connection_are_replayed_on_a_new_association() {
    // Seeds where the loss fell between the first and the last completion.
    let mut split = 0;
    for seed in 1..15 {
        let mut rng = Rng(seed);
        let (mut at, mut it) = (Target::new(), Target::new());
        at.maxh2cdata = 4096;
        let mut io = live_io::<8>(&mut at, &mut it, &mut rng);
        it.r2t_chunk = 8192;
        let mut port = MemPort::default();
        let mut model = it.disk.clone();
        let mut ops = HashMap::new();
        for tag in 0..8u64 {
            let (lba, blocks) = (tag * 32, 1 + rng.below(31) as u32);
            let range = lba as usize * BLOCK..(lba as usize + blocks as usize) * BLOCK;
            let op = if rng.below(2) == 0 {
                let data: Vec<u8> = (0..range.len()).map(|_| rng.next() as u8).collect();
                model[range].copy_from_slice(&data);
                port.bufs.insert(tag, data);
                Op::Write(lba, blocks)
            } else {
                port.bufs.insert(tag, vec![0; range.len()]);
                Op::Read(lba, blocks)
            };
            ops.insert(tag, op);
            submit_op(&mut io, tag, op);
        }
        // Part of the traffic gets through, then the connection drops: some commands are
        // done, some half sent, some not started.
        let mut done = Vec::new();
        let mut out = vec![0u8; 3000];
        // What the target sent that has not reached the host yet (lost with the link).
        let mut in_flight = Vec::new();
        for _ in 0..rng.below(12) {
            let n = io.transmit(&mut out[..1 + rng.below(3000)], &mut port);
            it.input(&out[..n]);
            in_flight.append(&mut it.out);
            let k = rng.below(in_flight.len() + 1);
            let arrived: Vec<u8> = in_flight.drain(..k).collect();
            io.receive(&arrived, &mut port).unwrap();
            while let Some(c) = io.next_completion() {
                done.push(c.tag);
            }
        }
        io.connection_lost();
        let lost = Error::Protocol(ProtocolError::ConnectionLost);
        assert_eq!(io.state(), SessionState::Failed(lost));
        assert!(lost
            .to_string()
            .contains("connection to the target was lost"));
        assert_eq!(io.read(99, 0, 1), Err(SubmitError::Failed));
        let mut held = Vec::new();
        io.drain(|tag| held.push(tag));
        held.sort_unstable();
        split += usize::from(!done.is_empty() && !held.is_empty());
        let mut expect: Vec<u64> = (0..8).filter(|t| !done.contains(t)).collect();
        expect.sort_unstable();
        assert_eq!(held, expect, "seed {seed}: held = not completed");

        // The target comes back with its disk; a new association, the held requests
        // sent again (a write twice is harmless, a read reads again).
        let (mut at2, mut it2) = (Target::new(), Target::new());
        at2.disk = it.disk.clone();
        let mut io2 = live_io::<8>(&mut at2, &mut it2, &mut rng);
        for &tag in &held {
            submit_op(&mut io2, tag, ops[&tag]);
        }
        let replayed = run_io(&mut io2, &mut it2, &mut port, &mut rng).unwrap();
        assert_eq!(replayed.len(), held.len());
        assert!(replayed.iter().all(|c| c.status.is_success()));
        assert_eq!(it2.disk, model, "seed {seed}");
        for (tag, op) in &ops {
            if let Op::Read(lba, blocks) = *op {
                let range = lba as usize * BLOCK..(lba as usize + blocks as usize) * BLOCK;
                assert_eq!(port.bufs[tag], model[range], "seed {seed} read {tag}");
            }
        }
    }
    assert!(split >= 3, "only {split} seeds lost the link mid-way");
}

// ---- Digests ----

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

#[test]
fn digests_asked_for_go_on_every_pdu_both_ways() {
    let choices = [
        Digests::NONE,
        Digests {
            header: true,
            data: false,
        },
        Digests {
            header: false,
            data: true,
        },
        BOTH,
    ];
    for digests in choices {
        for seed in 1..8 {
            let (mut at, mut it) = (Target::new(), Target::new());
            at.maxh2cdata = 4096;
            let mut rng = Rng(seed);
            let mut io = live_io_with::<16>(&mut at, &mut it, &mut rng, digests);
            assert_eq!((at.digests, it.digests), (digests, digests));
            it.c2h_chunk = 700 + rng.below(3000);
            it.r2t_chunk = 8192;
            it.success_flag = seed % 2 == 0;
            let mut port = MemPort::default();
            let mut model = it.disk.clone();
            // Reads, writes in the capsule and by R2T, a flush and a discard.
            let expect_reads =
                submit_mixed(&mut io, &mut port, &mut rng, &mut model, 14, |_, tag| {
                    tag % 2 == 0
                });
            io.flush(20).unwrap();
            io.discard(21, 250, 2).unwrap();
            model[250 * BLOCK..252 * BLOCK].fill(0);
            let done = run_io(&mut io, &mut it, &mut port, &mut rng).unwrap();
            assert_eq!(done.len(), 16);
            assert!(done.iter().all(|c| c.status.is_success()), "{digests:?}");
            assert_eq!(it.disk, model, "{digests:?} seed {seed}");
            for (tag, want) in expect_reads {
                assert_eq!(port.bufs[&tag], want, "{digests:?} seed {seed} tag {tag}");
            }
            // The fake checked each digest the host sent (and refuses a missing one).
            assert_eq!(it.header_digests_checked > 0, digests.header);
            assert_eq!(it.data_digests_checked > 0, digests.data);
            assert_eq!(at.header_digests_checked > 0, digests.header, "admin");
            assert_eq!(at.data_digests_checked > 0, digests.data, "Connect's data");
        }
    }
}

#[test]
fn a_target_that_does_not_turn_on_the_digests_asked_for_is_refused() {
    // (asked, ICResp's DGST)
    let cases = [(BOTH, 0u8), (BOTH, 1), (BOTH, 2), (Digests::NONE, 3)];
    for (asked, answered) in cases {
        let mut t = Target::new();
        t.icresp_dgst = Some(answered);
        let (s, r, _) = bring_up_with(&mut t, &mut Rng(3), 5000, asked);
        let want = Error::Protocol(ProtocolError::DigestMismatch(answered));
        assert_eq!(r, Err(want), "asked {asked:?}, answered {answered}");
        assert_eq!(s.state(), SessionState::Failed(want));
        assert!(t.connects.is_empty(), "nothing after ICResp");
    }
}

#[test]
fn a_header_that_fails_its_digest_fails_the_connection() {
    for (pdu_type, read) in [(pdu::C2H_DATA, true), (pdu::CAPSULE_RESP, false)] {
        let (mut at, mut it) = (Target::new(), Target::new());
        let mut rng = Rng(11);
        let mut io = live_io_with::<4>(&mut at, &mut it, &mut rng, BOTH);
        it.corrupt_header = true;
        let mut port = MemPort::default();
        port.bufs.insert(1, vec![0; 4 * BLOCK]);
        if read {
            io.read(1, 0, 4).unwrap();
        } else {
            io.flush(1).unwrap();
        }
        let r = run_io(&mut io, &mut it, &mut port, &mut rng);
        let want = Error::Protocol(ProtocolError::HeaderDigest { pdu_type });
        assert_eq!(r.err(), Some(want));
        assert_eq!(io.state(), SessionState::Failed(want));
        assert!(port.bufs[&1].iter().all(|&b| b == 0), "no data taken");
        let mut held = Vec::new();
        io.drain(|t| held.push(t));
        assert_eq!(held, [1], "the command is handed back to be sent again");
    }
}

#[test]
fn data_that_fails_its_digest_fails_its_command_not_the_connection() {
    for success_flag in [false, true] {
        let (mut at, mut it) = (Target::new(), Target::new());
        let mut rng = Rng(13);
        let mut io = live_io_with::<4>(&mut at, &mut it, &mut rng, BOTH);
        it.success_flag = success_flag;
        it.c2h_chunk = 1024;
        // The second of four PDUs arrives changed.
        let want = it.disk[8 * BLOCK..16 * BLOCK].to_vec();
        let mut port = MemPort::default();
        port.bufs.insert(1, vec![0; 8 * BLOCK]);
        port.bufs.insert(2, vec![0; 8 * BLOCK]);
        io.read(1, 8, 8).unwrap();
        let mut out = vec![0u8; 4096];
        let n = io.transmit(&mut out, &mut port);
        it.input(&out[..n]);
        let mut sent = std::mem::take(&mut it.out);
        let second_data = {
            let first_plen = le32(&sent, 4) as usize;
            first_plen + usize::from(sent[first_plen + 3])
        };
        sent[second_data] ^= 1;
        io.receive(&sent, &mut port).unwrap();
        let c = io.next_completion().unwrap();
        assert_eq!((c.tag, c.status), (1, Status::DATA_TRANSFER_ERROR));
        assert_eq!(
            io.state(),
            SessionState::Live,
            "success flag {success_flag}"
        );
        // The same read again, on the same connection, is whole.
        io.read(2, 8, 8).unwrap();
        let done = run_io(&mut io, &mut it, &mut port, &mut rng).unwrap();
        assert_eq!(done.len(), 1);
        assert!(done[0].status.is_success());
        assert_eq!(port.bufs[&2], want);
    }
}

#[test]
fn digest_flags_must_match_the_digests_in_force() {
    use ProtocolError as P;
    let read = |cid: u16| c2h_pdu(cid, 0, &[1; BLOCK], pdu::FLAG_DATA_LAST);
    let header_only = Digests {
        header: true,
        data: false,
    };
    type Case = (&'static str, Box<dyn Fn(u16) -> Vec<u8>>, ProtocolError);
    let cases: Vec<Case> = vec![
        (
            "a response without its header digest",
            Box::new(|cid| resp_pdu(cid, Status::SUCCESS, 0)),
            P::BadFlags {
                pdu_type: pdu::CAPSULE_RESP,
                flags: 0,
            },
        ),
        (
            "data without its data digest",
            Box::new(move |cid| with_digests(&read(cid), header_only)),
            P::BadFlags {
                pdu_type: pdu::C2H_DATA,
                flags: pdu::FLAG_HDGST | pdu::FLAG_DATA_LAST,
            },
        ),
        (
            "data starting inside the header digest",
            Box::new(move |cid| {
                let mut p = with_digests(&read(cid), BOTH);
                p[3] = 26;
                p
            }),
            P::BadDataOffset {
                pdu_type: pdu::C2H_DATA,
                pdo: 26,
            },
        ),
        (
            "a data digest and no data",
            Box::new(move |cid| {
                let mut p = with_digests(&read(cid), BOTH);
                p[4..8].copy_from_slice(&32u32.to_le_bytes());
                p
            }),
            P::BadPduLength {
                pdu_type: pdu::C2H_DATA,
                plen: 32,
            },
        ),
    ];
    for (name, make, want) in cases {
        let mut port = MemPort::default();
        port.bufs.insert(1, vec![0; BLOCK]);
        let mut out = vec![0u8; 4096];
        let mut q = Queue::<8>::new(QueueKind::Io { inline_limit: 4096 }).with_digests(BOTH);
        assert_eq!(q.transmit(&mut out, &mut port), 128);
        assert_eq!(out[11], 3, "ICReq asks for both digests");
        let mut icresp = icresp_pdu(4096);
        icresp[11] = 3;
        q.receive(&icresp, &mut port).unwrap();
        assert_eq!(q.digests(), BOTH);
        q.submit(1, sqe::rw(false, 1, 0, 1), Payload::ToHost(BLOCK as u32))
            .unwrap();
        let n = q.transmit(&mut out, &mut port);
        assert_eq!(n, 72 + 4, "a capsule and its header digest");
        let cid = le16(&out, 10);
        assert_eq!(q.receive(&make(cid), &mut port), Err(want), "{name}");
        assert!(
            port.bufs[&1].iter().all(|&b| b == 0),
            "{name}: no data taken"
        );
    }
}
