// SPDX-License-Identifier: MIT OR Apache-2.0
//! hostile: a blkfront in user space that attacks the backend of its guest's disks
//! (tests/xen/hostile). It runs in a Linux PV guest that loaded no blkfront, so the
//! disks the toolstack gave the guest are its own to drive: it writes the frontend's
//! xenstore keys through /dev/xen/xenbus, shares ring and data pages with
//! /dev/xen/gntalloc and makes event channels with /dev/xen/evtchn.
//!
//! Disks: the first writable one is attacked; a read-only one, if any, gets the writes
//! a read-only disk must refuse. One line per attack on stdout:
//! `rig-hostile: PASS|FAIL <attack>: <what it saw>`, then per disk what a correct
//! backend counted (`rig-hostile: counts <backend path> refused-requests=..`), then
//! `rig-hostile: attacks done: N passed, M failed`. Last, unless `--no-flood`, it keeps
//! both queues of the writable disk full of requests until the domain is destroyed
//! (`rig-hostile: flooding`).
//!
//! Usage: `hostile [--cycles N] [--flips N] [--no-flood]`.
//!
//! `hostile load --vbd xvdX ...` is something else: a lean, well-behaved load generator
//! over one disk (`load.rs`), which prints one JSON line (tests/xen/bench-backend).

mod attacks;
mod frontend;
mod load;
mod sys;

use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::thread::sleep;
use std::time::Duration;

use attacks::{BadProducer, Page, Pages, Peer, Tally};
use blkback::abi::{self, RSP_OKAY};
use blkback::fake::wire::{encode_direct, encode_indirect};
use blkback::fake::FrontRing;
use frontend::{keys, Guest, GuestPeer, Keys, Offer, Vbd, CONNECTED, INIT_WAIT};
use load::{DataPages, Kick, PageAt};
use sys::{Evtchn, Grants, SharedPages, MAX_GRANT_PAGES};

/// A grant reference beyond any guest's grant table.
const UNGRANTED: u32 = 0xFFFF_FFF0;
/// An event channel port the guest never allocated.
const UNALLOCATED_PORT: u32 = 4095;

fn option(args: &[String], name: &str) -> Option<u64> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("load") {
        return load_main(&args[2..]);
    }
    let cycles = option(&args, "--cycles").unwrap_or(20);
    let flips = option(&args, "--flips").unwrap_or(200);
    let flood = !args.iter().any(|a| a == "--no-flood");
    match run(cycles, flips, flood) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            println!("rig-hostile: FAIL setup: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cycles: u64, flips: u64, flood: bool) -> Result<usize, String> {
    let mut guest = Guest::open().map_err(|e| e.to_string())?;
    let mut writable = None;
    let mut read_only = None;
    for vbd in guest.vbds()? {
        let mode = guest.read(&format!("{}/mode", vbd.be)).unwrap_or_default();
        if !mode.contains('w') {
            read_only = Some(vbd);
        } else if writable.is_none() {
            writable = Some(vbd);
        }
    }
    let rw = writable.ok_or("no writable disk")?;
    for vbd in [Some(&rw), read_only.as_ref()].into_iter().flatten() {
        guest
            .wait_backend(vbd, &[INIT_WAIT])
            .map_err(|s| format!("{}: backend in state {s}, never InitWait", vbd.be))?;
    }
    let max_queues = guest
        .read(&format!("{}/multi-queue-max-queues", rw.be))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(1u32);
    let (pages, _held) = share_pages(&guest, rw.backend_id)?;

    let mut tally = Tally::default();
    requests(&mut guest, &rw, &pages, flips, &mut tally);
    let mut ro_tally = Tally::default();
    if let Some(ro) = &read_only {
        on_connection(
            &mut guest,
            ro,
            Offer::plain(true),
            &mut ro_tally,
            |ring, peer, t, _| {
                if attacks::baseline(ring, peer, &pages, 8, false, t) {
                    let cases = attacks::read_only_cases(pages.refs());
                    attacks::run_cases(ring, peer, &pages, &cases, t);
                }
            },
        );
    }
    // Backwards by 1: behind a discard still in flight, not behind what was answered.
    for how in [
        BadProducer::PastTheRing,
        BadProducer::Ahead(0x8000_0000),
        BadProducer::Backwards(1),
    ] {
        on_connection(
            &mut guest,
            &rw,
            Offer::plain(false),
            &mut tally,
            |ring, peer, t, sectors| {
                attacks::bad_producer(ring, peer, &pages, attacks::Disk { sectors }, how, t);
            },
        );
    }
    negotiation(&mut guest, &rw, max_queues, &mut tally)?;
    connect_cycles(&mut guest, &rw, &pages, cycles, max_queues, &mut tally);

    for (vbd, tally) in [(Some(&rw), &tally), (read_only.as_ref(), &ro_tally)] {
        if let Some(vbd) = vbd {
            println!(
                "rig-hostile: counts {} refused-requests={} error-responses={} halted-rings={} refused-connections={}",
                vbd.be,
                tally.refused_requests,
                tally.error_responses,
                tally.halted_rings,
                tally.refused_connections
            );
        }
    }
    let outcomes = tally.outcomes.len() + ro_tally.outcomes.len();
    let failed = tally.failed() + ro_tally.failed();
    println!(
        "rig-hostile: attacks done: {} passed, {failed} failed",
        outcomes - failed
    );
    if flood {
        flood_until_destroyed(&mut guest, &rw, &pages, max_queues);
    }
    Ok(failed)
}

impl Offer {
    /// One queue, one ring page.
    fn plain(persistent: bool) -> Self {
        Offer {
            order: 0,
            queues: 1,
            persistent,
        }
    }
}

/// What keeps the attacks' grants alive: every grant, and the foreign page's mapping.
type Held = (Vec<Grants>, SharedPages);

/// The attacks' pages, granted to `backend` (one to dom0 instead: the foreign grant).
fn share_pages(guest: &Guest, backend: u16) -> Result<(Pages<SharedPages>, Held), String> {
    let mut grants = Vec::new();
    let mut page = |domid, writable| -> Result<Page<SharedPages>, String> {
        let (granted, mem) = guest
            .gntalloc
            .share(domid, 1, writable)
            .map_err(|e| format!("gntalloc: {e}"))?;
        let gref = granted.refs[0];
        grants.push(granted);
        Ok(Page { gref, mem })
    };
    let data = [page(backend, true)?, page(backend, true)?];
    let read_only = page(backend, false)?;
    let indirect = page(backend, true)?;
    let foreign = page(0, true)?;
    let pages = Pages {
        data,
        read_only,
        indirect,
        foreign: foreign.gref,
        ungranted: UNGRANTED,
    };
    Ok((pages, (grants, foreign.mem)))
}

/// Connects, runs `attack` on queue 0, disconnects; a failure to connect or close is an
/// outcome of its own.
fn on_connection(
    guest: &mut Guest,
    vbd: &Vbd,
    offer: Offer,
    tally: &mut Tally,
    attack: impl FnOnce(&mut FrontRing<SharedPages>, &mut GuestPeer<'_>, &mut Tally, u64),
) {
    match guest.connect(vbd, offer) {
        Err(e) => tally.record(format!("connect {}", vbd.fe), false, e),
        Ok(mut session) => {
            let sectors = session.sectors;
            let queue = &mut session.queues[0];
            attack(&mut queue.ring, &mut guest.peer(queue.port), tally, sectors);
            if let Err(e) = guest.disconnect(vbd, session) {
                tally.record(format!("disconnect {}", vbd.fe), false, e);
            }
        }
    }
}

/// The request attacks on one connection with persistent grants.
fn requests(
    guest: &mut Guest,
    vbd: &Vbd,
    pages: &Pages<SharedPages>,
    flips: u64,
    tally: &mut Tally,
) {
    on_connection(
        guest,
        vbd,
        Offer::plain(true),
        tally,
        |ring, peer, t, sectors| {
            if attacks::baseline(ring, peer, pages, 8, true, t) {
                let cases = attacks::cases(pages.refs(), attacks::Disk { sectors });
                attacks::run_cases(ring, peer, pages, &cases, t);
                attacks::reused_ids(ring, peer, pages, t);
                attacks::flipped_indirect_page(ring, peer, pages, flips, t);
            }
        },
    );
}

/// Offers with one absurd or broken key each: every one refused, with its reason in the
/// backend's `error` node; then frontend states flapping without waiting for the backend.
fn negotiation(
    guest: &mut Guest,
    vbd: &Vbd,
    max_queues: u32,
    tally: &mut Tally,
) -> Result<(), String> {
    let share = |guest: &Guest, domid, writable| {
        guest
            .gntalloc
            .share(domid, 1, writable)
            .map_err(|e| format!("gntalloc: {e}"))
    };
    let ring = share(guest, vbd.backend_id, true)?;
    let read_only = share(guest, vbd.backend_id, false)?;
    let foreign = share(guest, 0, true)?;
    let bind = |guest: &Guest, domid| {
        guest
            .evtchn
            .bind_unbound(domid)
            .map_err(|e| format!("evtchn: {e}"))
    };
    let port = bind(guest, vbd.backend_id)?;
    let other_port = bind(guest, 0)?;
    let (gref, ro_gref, foreign_gref) = (ring.0.refs[0], read_only.0.refs[0], foreign.0.refs[0]);

    let base = keys(Offer::plain(false), &[vec![gref]], &[port]);
    let with = |changes: &[(&str, String)]| {
        let mut keys = base.clone();
        for (key, value) in changes {
            keys.retain(|(k, _)| k != key);
            keys.push((key.to_string(), value.clone()));
        }
        keys
    };
    let order2_missing_ref2 = {
        let mut keys = with(&[("ring-page-order", "2".into())]);
        keys.retain(|(k, _)| k != "ring-ref");
        for i in [0, 1, 3] {
            keys.push((format!("ring-ref{i}"), gref.to_string()));
        }
        keys
    };
    let second_queue_missing = {
        let mut keys = vec![
            ("multi-queue-num-queues".to_string(), "2".to_string()),
            ("queue-0/ring-ref".into(), gref.to_string()),
            ("queue-0/event-channel".into(), port.to_string()),
        ];
        keys.push(("protocol".into(), "x86_64-abi".into()));
        keys
    };
    let cases: Vec<(&str, Keys, String)> = vec![
        (
            "ring-page-order-30",
            with(&[("ring-page-order", "30".into())]),
            "ring-page-order 30 > max".into(),
        ),
        (
            "ring-page-order-not-a-number",
            with(&[("ring-page-order", "99999999999".into())]),
            "not a number".into(),
        ),
        (
            "num-queues-1000",
            with(&[("multi-queue-num-queues", "1000".into())]),
            "multi-queue-num-queues 1000".into(),
        ),
        (
            "num-queues-0",
            with(&[("multi-queue-num-queues", "0".into())]),
            "multi-queue-num-queues 0".into(),
        ),
        (
            "second-queue-missing",
            second_queue_missing,
            if max_queues >= 2 {
                "queue-1/event-channel missing".into()
            } else {
                "multi-queue-num-queues 2".into()
            },
        ),
        (
            "ring-ref2-of-4-missing",
            order2_missing_ref2,
            "ring-ref2 missing".into(),
        ),
        (
            "protocol-unknown",
            with(&[("protocol", "x86_16-abi".into())]),
            "unknown protocol \"x86_16-abi\"".into(),
        ),
        (
            "event-channel-0",
            with(&[("event-channel", "0".into())]),
            "binding event channel 0:".into(),
        ),
        (
            "event-channel-never-allocated",
            with(&[("event-channel", UNALLOCATED_PORT.to_string())]),
            format!("binding event channel {UNALLOCATED_PORT}:"),
        ),
        (
            "event-channel-for-another-domain",
            with(&[("event-channel", other_port.to_string())]),
            format!("binding event channel {other_port}:"),
        ),
        (
            "ring-ref-ungranted",
            with(&[("ring-ref", UNGRANTED.to_string())]),
            format!("mapping ring grants [{UNGRANTED}]"),
        ),
        (
            "ring-ref-granted-to-another-domain",
            with(&[("ring-ref", foreign_gref.to_string())]),
            format!("mapping ring grants [{foreign_gref}]"),
        ),
        (
            "ring-ref-read-only",
            with(&[("ring-ref", ro_gref.to_string())]),
            format!("mapping ring grants [{ro_gref}]"),
        ),
    ];
    for (name, keys, expect) in cases {
        if let Err(e) = guest.reset(vbd) {
            tally.record(name, false, format!("could not start: {e}"));
            continue;
        }
        match guest.offer(vbd, &keys) {
            Ok(()) => tally.record(name, false, "the backend connected"),
            Err(reason) => {
                let refused = reason.starts_with("state 5:");
                tally.refused_connections += u64::from(refused);
                tally.record(
                    name,
                    refused && reason.contains(&expect),
                    format!("refused, {reason} (expected \"{expect}\")"),
                );
            }
        }
    }
    // Valid keys, frontend states written back to back without waiting.
    let flaps = [3, 6, 1, 3, 5, 6, 1, 3, 4, 6, 1];
    let _ = guest.reset(vbd);
    guest.clear_keys(vbd);
    let mut written = base
        .iter()
        .try_for_each(|(key, value)| guest.write(&format!("{}/{key}", vbd.fe), value));
    for _ in 0..10 {
        for &state in &flaps {
            written = written.and_then(|()| guest.set_state(vbd, state));
        }
    }
    let settled = written
        .and_then(|()| guest.reset(vbd))
        .and_then(|()| guest.connect(vbd, Offer::plain(false)))
        .and_then(|session| guest.disconnect(vbd, session));
    tally.record(
        "state-flapping",
        settled.is_ok(),
        match settled {
            Ok(()) => format!(
                "{} state writes back to back; the backend settled and connected again",
                flaps.len() * 10
            ),
            Err(e) => format!("after flapping: {e}"),
        },
    );
    guest.evtchn.unbind(port);
    guest.evtchn.unbind(other_port);
    Ok(())
}

/// Connects and disconnects `cycles` times with ring orders 0-4, one or two queues,
/// persistent grants on and off; each time a read on every queue must be answered.
fn connect_cycles(
    guest: &mut Guest,
    vbd: &Vbd,
    pages: &Pages<SharedPages>,
    cycles: u64,
    max_queues: u32,
    tally: &mut Tally,
) {
    let mut done = 0;
    let mut first_failure = None;
    for i in 0..cycles {
        let offer = Offer {
            order: (i % 5) as u32,
            queues: if i % 3 == 2 { max_queues.min(2) } else { 1 },
            persistent: i % 2 == 0,
        };
        let cycle = guest.connect(vbd, offer).and_then(|mut session| {
            let mut answered = Ok(());
            for queue in &mut session.queues {
                let read = encode_direct(
                    abi::OP_READ,
                    0xC000 + i,
                    8 * i,
                    &[attacks::whole(pages.data[1].gref)],
                );
                let got = attacks::exchange(&mut queue.ring, &mut guest.peer(queue.port), &[read]);
                if !matches!(got.as_slice(), [r] if r.status == RSP_OKAY) {
                    answered = Err(format!("a read got {got:?}"));
                }
            }
            guest.disconnect(vbd, session).and(answered)
        });
        match cycle {
            Ok(()) => done += 1,
            Err(e) => {
                first_failure.get_or_insert(format!("; cycle {i} ({offer:?}): {e}"));
                let _ = guest.reset(vbd);
            }
        }
    }
    tally.record(
        "connect-disconnect-cycles",
        done == cycles,
        format!(
            "{done} of {cycles} cycles connected (ring orders 0-4, 1-{} queues, persistent grants on and off), answered a read on every queue and closed{}",
            max_queues.min(2),
            first_failure.unwrap_or_default()
        ),
    );
}

/// Keeps every queue of a fresh connection full of reads, writes and indirect reads,
/// and never stops: the scenario destroys the domain with requests in flight. Returns
/// only if it cannot connect.
fn flood_until_destroyed(
    guest: &mut Guest,
    vbd: &Vbd,
    pages: &Pages<SharedPages>,
    max_queues: u32,
) {
    let offer = Offer {
        order: 2,
        queues: max_queues.min(2),
        persistent: true,
    };
    let mut session = match guest.connect(vbd, offer) {
        Ok(session) => session,
        Err(e) => return println!("rig-hostile: FAIL flood: {e}"),
    };
    let segments = 64u16;
    attacks::put_descriptors(
        &pages.indirect.mem,
        &vec![attacks::whole(pages.data[1].gref); usize::from(segments)],
    );
    let span = session.sectors.saturating_sub(1024).max(1);
    let (mut sent, mut answered, mut announced) = (0u64, 0u64, false);
    loop {
        for queue in &mut session.queues {
            queue.ring.take_responses(|_| answered += 1);
            while queue.ring.free_slots() > 0 {
                let sector = (sent * 88) % span;
                let raw = match sent % 4 {
                    0 => encode_indirect(
                        abi::OP_READ,
                        sent,
                        sector,
                        segments,
                        &[pages.indirect.gref],
                    ),
                    1 => encode_direct(
                        abi::OP_WRITE,
                        sent,
                        sector,
                        &[attacks::whole(pages.data[0].gref); 11],
                    ),
                    _ => encode_direct(
                        abi::OP_READ,
                        sent,
                        sector,
                        &[attacks::whole(pages.data[1].gref); 11],
                    ),
                };
                queue.ring.put_request(&raw);
                sent += 1;
            }
            queue.ring.push_requests();
            guest.peer(queue.port).notify();
        }
        if !announced && answered >= 256 {
            announced = true;
            println!(
                "rig-hostile: flooding {} rings until destroyed ({answered} answered so far)",
                session.queues.len()
            );
        }
        sleep(Duration::from_millis(1));
    }
}

/// `hostile load`: exit 0 when every request was answered OKAY (and verified), 1 when
/// the run went wrong (the JSON line says how), 2 when it could not start.
fn load_main(args: &[String]) -> ExitCode {
    let (name, spec) = match load::parse_args(args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("hostile load: {e}");
            return ExitCode::from(2);
        }
    };
    match run_load(&name, &spec) {
        Ok((line, ok)) => {
            println!("{line}");
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("hostile load: {e}");
            ExitCode::from(2)
        }
    }
}

/// `xvdX` (or a device number): the vbd's id under device/vbd (Xen's vdev numbering:
/// major 202, 16 minors per disk).
fn vdev_id(name: &str) -> Result<u32, String> {
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    match name.strip_prefix("xvd").map(str::as_bytes) {
        Some([c @ b'a'..=b'z']) => Ok(202 << 8 | u32::from(c - b'a') << 4),
        _ => Err(format!("--vbd {name}: xvda..xvdz or a device number")),
    }
}

/// The real backend: event sends through /dev/xen/evtchn, cues on the console.
struct GuestKick<'a> {
    evtchn: &'a Evtchn,
    ports: Vec<u32>,
    console: Option<File>,
}

impl Kick for GuestKick<'_> {
    fn notify(&mut self, queue: usize) {
        self.evtchn.notify(self.ports[queue]);
    }
    fn idle(&mut self) {
        std::hint::spin_loop();
    }
    fn cpu_seconds(&mut self) -> f64 {
        sys::cpu_seconds()
    }
    fn cue(&mut self, line: &str) {
        match &mut self.console {
            Some(console) => {
                let _ = writeln!(console, "{line}");
            }
            None => eprintln!("{line}"),
        }
    }
}

/// Connects the vbd as `spec` needs (checking that the backend offers it), runs the load
/// and disconnects; the JSON line and whether the run was clean.
fn run_load(name: &str, spec: &load::Spec) -> Result<(String, bool), String> {
    let id = vdev_id(name)?;
    let mut guest = Guest::open().map_err(|e| e.to_string())?;
    let fe = format!("device/vbd/{id}");
    let vbd = guest
        .vbds()?
        .into_iter()
        .find(|v| v.fe == fe)
        .ok_or(format!("no disk {name} ({fe})"))?;
    // The backend reaches InitWait after the toolstack's hotplug script, which can take
    // long under emulation; Connected: a run before this one did not close.
    let mut tries = 0;
    while let Err(state) = guest.wait_backend(&vbd, &[INIT_WAIT, CONNECTED]) {
        tries += 1;
        if tries == 4 {
            return Err(format!(
                "{}: backend in state {state}, never InitWait",
                vbd.be
            ));
        }
    }
    let mut key = |key: &str| {
        guest
            .read(&format!("{}/{key}", vbd.be))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    let max_order = key("max-ring-page-order").unwrap_or(0);
    let max_queues = key("multi-queue-max-queues").unwrap_or(1).max(1);
    let max_segments = key("feature-max-indirect-segments").unwrap_or(0);
    let backend_persistent = key("feature-persistent") == Some(1);
    let order = spec.ring_order();
    if order > max_order {
        return Err(format!(
            "--qd {} needs a ring of order {order}; {} offers max-ring-page-order {max_order}",
            spec.qd, vbd.be
        ));
    }
    if spec.queues > max_queues {
        return Err(format!(
            "--queues {}: {} offers multi-queue-max-queues {max_queues}",
            spec.queues, vbd.be
        ));
    }
    if spec.indirect() && spec.segments() as u32 > max_segments {
        return Err(format!(
            "--bs {} needs {} indirect segments; {} offers feature-max-indirect-segments {max_segments}",
            spec.bs,
            spec.segments(),
            vbd.be
        ));
    }
    // Every page the run uses, granted once, in allocations of up to 16 pages.
    let (data_pages, indirect_pages) = spec.pages();
    let total = data_pages + indirect_pages;
    let (mut chunks, mut grants, mut all) = (Vec::new(), Vec::new(), Vec::new());
    while all.len() < total {
        let n = (total - all.len()).min(MAX_GRANT_PAGES);
        let (granted, mem) = guest
            .gntalloc
            .share(vbd.backend_id, n, true)
            .map_err(|e| format!("granting {total} pages (xen-gntalloc's limit=?): {e}"))?;
        all.extend(granted.refs.iter().enumerate().map(|(i, &gref)| PageAt {
            gref,
            chunk: chunks.len(),
            offset: i * abi::PAGE_SIZE,
        }));
        chunks.push(mem);
        grants.push(granted);
    }
    let indirect = all.split_off(data_pages);
    let pages = DataPages {
        chunks,
        data: all,
        indirect,
    };
    let offer = Offer {
        order,
        queues: spec.queues,
        persistent: spec.persistent,
    };
    let mut session = guest.connect(&vbd, offer)?;
    let disk_sectors = session.sectors;
    let outcome = {
        let mut kick = GuestKick {
            evtchn: &guest.evtchn,
            ports: session.queues.iter().map(|q| q.port).collect(),
            console: File::options().write(true).open("/dev/console").ok(),
        };
        let mut rings: Vec<&mut FrontRing<SharedPages>> =
            session.queues.iter_mut().map(|q| &mut q.ring).collect();
        load::drive(spec, &mut rings, &pages, disk_sectors, &mut kick)
    };
    let closed = guest.disconnect(&vbd, session);
    // Ended only now: the backend let go of them when it closed.
    drop(pages);
    drop(grants);
    let conn = load::Connection {
        vbd: name,
        backend: &vbd.be,
        backend_id: vbd.backend_id,
        ring_order: order,
        disk_sectors,
        backend_persistent,
    };
    let line = load::json(spec, &conn, &outcome);
    if let Err(e) = &closed {
        eprintln!("hostile load: closing {}: {e}", vbd.fe);
    }
    Ok((line, outcome.ok(spec.idle) && closed.is_ok()))
}
