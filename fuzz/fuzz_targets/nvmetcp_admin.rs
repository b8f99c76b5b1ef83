// SPDX-License-Identifier: MIT OR Apache-2.0
//! The NVMe/TCP admin session (`nvmetcp::AdminSession`) against a hostile controller:
//! bring-up, the ANA log, keep-alive and asynchronous events.
//!
//! The target is the crate's fake controller with fuzzed answers: its configuration
//! (CAP, CSTS, MDTS, MAXCMD, IOCCSZ, SGLS, the LBA format, the queues it allots, the
//! ANA group, its state and whether the log can be read, a Connect refusal), bytes of
//! its Identify data and of its ANA log overwritten, then a script: shuttle bytes in
//! windows and pieces of fuzzed size, change the ANA state or resize the namespace (a
//! notice each), complete a
//! command in flight with a fuzzed status and result, feed raw bytes, let time pass,
//! mute keep-alives, ask for the ANA log again (`refresh_ana`), tell the controller of
//! the host's shutdown (`shut_down`; the controller takes a fuzzed number of CSTS reads
//! to complete it). Some sessions only probe the path (`AdminSession::probing`).
//! Properties: no panic; the session never runs out of admin slots (`Error::Internal`);
//! once failed it stays failed with the same error; live, it knows its controller and
//! namespace, has 1 to the asked I/O queues, and any ANA state it holds can serve; a
//! probe never asks for I/O queues or events; notices counted never go down; after a
//! shutdown notification the host sends nothing but CSTS reads, sends it once, and
//! calls it complete only once the controller said so.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmetcp::fake::{Target, HOST_NQN, SUBNQN};
use nvmetcp::sqe::Status;
use nvmetcp::{AdminSession, Error, HostIdentity, SessionState};

#[path = "../common/input.rs"]
mod input;
use input::Input;

fn configure(t: &mut Target, input: &mut Input) {
    let knobs = input.byte();
    if knobs & 1 != 0 {
        t.cap = input.uint(8);
    }
    if knobs & 2 != 0 {
        t.mdts = input.byte();
        t.maxcmd = input.uint(2) as u16;
        t.ioccsz = input.uint(4) as u32;
        t.sgls = input.uint(4) as u32;
    }
    if knobs & 4 != 0 {
        t.nlbaf = input.byte();
        t.flbas = input.byte();
        t.lbaf0 = (input.uint(2) as u16, input.byte());
        t.ns_blocks = Some(input.uint(8));
    }
    if knobs & 8 != 0 {
        t.io_queues = match input.uint(2) as u16 {
            0 => None,
            n => Some(n),
        };
    }
    if knobs & 16 != 0 {
        t.ana_group = input.uint(4) as u32;
        t.ana_state = input.byte();
        t.ana_log_fails = input.byte() & 1 != 0;
    }
    if knobs & 32 != 0 {
        t.connect_status = Some((Status(input.uint(2) as u16), input.uint(8)));
    }
    if knobs & 64 != 0 {
        t.csts_polls_before_ready = u32::from(input.byte() % 8);
        t.csts_fatal = input.byte() & 1 != 0;
    }
    if knobs & 128 != 0 {
        t.shutdown_polls = match input.byte() {
            255 => u32::MAX,
            n => u32::from(n % 16),
        };
    }
    for _ in 0..input.byte() % 8 {
        let (at, value) = (input.uint(2) as usize % 4096, input.byte());
        t.identify_patch.push((at, value));
    }
    for _ in 0..input.byte() % 8 {
        let (at, value) = (input.uint(2) as usize % 512, input.byte());
        t.log_patch.push((at, value));
    }
}

fn check(
    s: &AdminSession,
    t: &Target,
    probe: bool,
    asked: u16,
    failed: &mut Option<Error>,
    notices: &mut u32,
) {
    if probe {
        assert_eq!((t.io_queues_asked, t.async_events), (None, None));
    }
    match s.state() {
        SessionState::Failed(e) => {
            assert!(!matches!(e, Error::Internal(_)), "{e:?}");
            assert!(failed.is_none_or(|f| f == e), "{failed:?} then {e:?}");
            *failed = Some(e);
        }
        state => assert!(failed.is_none(), "{failed:?} then {state:?}"),
    }
    if s.state() == SessionState::Live {
        assert!(s.controller().is_some() && s.namespace().is_some());
        assert!((1..=asked).contains(&s.io_queues()), "{}", s.io_queues());
        if let Some(path) = s.ana() {
            assert!(path.state.usable(), "live through {path:?}");
        }
    }
    let seen = s.ana_notices() + s.namespace_notices();
    assert!(seen >= *notices);
    *notices = seen;
    assert_eq!(
        t.after_shutdown, 0,
        "a command after the shutdown notification"
    );
    assert!(t.shutdowns <= 1, "told {} times", t.shutdowns);
    if s.shut_down_complete() {
        assert_eq!(s.state(), SessionState::Live);
        assert!(t.shutdowns == 1 && t.shutdown_reads > t.shutdown_polls);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mut t = Target::new();
    configure(&mut t, &mut input);
    let id = HostIdentity {
        host_nqn: HOST_NQN,
        host_id: [7; 16],
        subsystem_nqn: SUBNQN,
    };
    let asked = u16::from(input.byte() % 8) + 1;
    let kato = [0, 1_000, 15_000][usize::from(input.byte() % 3)];
    let mut now = 1_000u64;
    let probe = input.byte() & 1 != 0;
    let mut s = AdminSession::new(&id, 1, kato, now, 10_000).with_io_queues(asked);
    if probe {
        s = s.probing();
    }
    let (mut failed, mut notices) = (None, 0);
    let mut buf = vec![0u8; 9000];
    for _ in 0..200 {
        if input.0.is_empty() {
            break;
        }
        match input.byte() % 8 {
            0 => {
                // Shuttle: the host's bytes in a window, the target's back in pieces.
                let window = 1 + input.uint(2) as usize % buf.len();
                let n = s.transmit(&mut buf[..window]);
                t.input(&buf[..n]);
                let out = std::mem::take(&mut t.out);
                let piece = 1 + usize::from(input.byte()) * 16;
                for chunk in out.chunks(piece) {
                    let _ = s.receive(chunk, now);
                }
            }
            1 => t.ana_change(input.byte()),
            2 => {
                if !t.cids_in_flight.is_empty() {
                    let cid = t.cids_in_flight[usize::from(input.byte()) % t.cids_in_flight.len()];
                    t.event_requests.retain(|&c| c != cid);
                    t.respond(cid, Status(input.uint(2) as u16), input.uint(8));
                }
            }
            3 => {
                let n = usize::from(input.byte());
                let _ = s.receive(input.take(n), now);
            }
            4 => now += input.uint(2) * 8,
            5 => t.resize_namespace(input.uint(4)),
            // The remote asks for the ANA log again (an I/O command said ANA Transition),
            // or closes the association.
            6 => {
                if input.byte() & 3 == 0 {
                    let _ = s.shut_down(now, input.uint(2));
                } else {
                    let _ = s.refresh_ana();
                }
            }
            _ => t.mute_keep_alive = !t.mute_keep_alive,
        }
        let _ = s.poll(now);
        check(&s, &t, probe, asked, &mut failed, &mut notices);
    }
});
