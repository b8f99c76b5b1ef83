// SPDX-License-Identifier: MIT OR Apache-2.0
//! Notification moderation (`engine/notify.rs`) against a simulated blkfront on a
//! virtual clock: the frontend takes responses only when an event arrives (its
//! interrupt), re-arms `rsp_event` as Linux's `RING_FINAL_CHECK_FOR_RESPONSES` does, and
//! resubmits what it reaped one request at a time; the device completes each request a
//! set time after it was submitted; the poller polls every step. Everything is
//! deterministic: times are virtual nanoseconds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use blkdev::{BlockDevice, RamDisk};

use super::{whole_page, Rig, DISK_SECTORS};
use crate::abi::{self, RSP_OKAY};
use crate::engine::{Busy, EngineConfig};
use crate::fake::wire::encode_direct;
use crate::fake::DelayDevice;
use crate::stats::RingStats;

const US: u64 = 1_000;
/// The simulation's time step: the poller polls once per step.
const STEP: u64 = 250;

/// A blkfront-like frontend and its workload.
#[derive(Clone, Copy, Debug)]
struct Workload {
    /// Requests the frontend keeps outstanding (fio's iodepth).
    depth: usize,
    /// Time the frontend takes to submit one request.
    submit_cost: u64,
    /// From an event to the frontend's interrupt handler (it goes on submitting
    /// meanwhile).
    irq_delay: u64,
    /// Requests to complete in all.
    requests: usize,
}

/// What a simulation saw.
#[derive(Debug, Default)]
struct Seen {
    stats: RingStats,
    /// Per request: submitted by the frontend to taken by it (after its event).
    latencies: Vec<u64>,
}

impl Seen {
    fn mean_latency(&self) -> u64 {
        self.latencies.iter().sum::<u64>() / self.latencies.len() as u64
    }

    fn notifications_per_request(&self) -> f64 {
        self.stats.notifications as f64 / self.latencies.len() as f64
    }
}

/// The holds that ended, by what ended them: deadline, device drained, frontend quiet,
/// frontend at its depth, poller going to sleep.
fn holds_ended(stats: &RingStats) -> [u64; 5] {
    [
        stats.notify_holds_deadline,
        stats.notify_holds_drained,
        stats.notify_holds_quiet,
        stats.notify_holds_depth,
        stats.notify_holds_sleep,
    ]
}

fn config(window_ns: u64) -> EngineConfig {
    EngineConfig {
        notify_hold_ns: window_ns,
        ..EngineConfig::new(0, true)
    }
}

/// Runs `workload` against `rig`; `clock` is the device's clock.
fn simulate<D: BlockDevice>(mut rig: Rig<D>, clock: &AtomicU64, workload: Workload) -> Seen {
    let pages: Vec<u32> = (0..workload.depth)
        .map(|i| rig.data_page(i as u8).1)
        .collect();
    let mut submitted_at: HashMap<u64, u64> = HashMap::new();
    let mut free: Vec<u64> = (0..workload.depth as u64).rev().collect();
    let mut to_submit = workload.depth;
    let mut next_submit = 0u64;
    let mut issued = 0usize;
    let mut events_seen = 0u64;
    let mut irq_at = None;
    let mut seen = Seen::default();
    let mut now = 0u64;
    while seen.latencies.len() < workload.requests {
        assert!(now < 10_000_000_000, "simulation stalled: {seen:?}");
        clock.store(now, Ordering::SeqCst);
        // The frontend's interrupt: take every response, re-arm, look again.
        if rig.events.count() > events_seen && irq_at.is_none() {
            irq_at = Some(now + workload.irq_delay);
        }
        if irq_at.is_some_and(|at| now >= at) {
            irq_at = None;
            events_seen = rig.events.count();
            loop {
                for response in rig.responses() {
                    assert_eq!(response.status, RSP_OKAY);
                    let at = submitted_at.remove(&response.id).expect("known id");
                    seen.latencies.push(now - at);
                    free.push(response.id);
                    to_submit += 1;
                }
                if !rig.front.final_check_for_responses() {
                    break;
                }
            }
        }
        // fio resubmits what it reaped, one request at a time.
        if to_submit > 0 && now >= next_submit && issued < workload.requests {
            let id = free.pop().expect("a free id");
            let gref = pages[id as usize];
            let sector = (id * 8) % (DISK_SECTORS - 8);
            rig.send(&encode_direct(
                abi::OP_READ,
                id,
                sector,
                &[whole_page(gref)],
            ));
            submitted_at.insert(id, now);
            to_submit -= 1;
            issued += 1;
            next_submit = now + workload.submit_cost;
        }
        rig.engine.poll_at(64, now);
        if let Some(deadline) = rig.engine.notify_deadline() {
            assert!(deadline > now, "a held notification outlived its deadline");
        }
        now += STEP;
    }
    seen.stats = rig.engine.stats();
    seen
}

type Delayed = DelayDevice<blkdev::RamDiskQueue>;

fn delay_rig(window_ns: u64, latency: u64, jitter: u64) -> (Rig<Delayed>, Arc<AtomicU64>) {
    let disk = RamDisk::new(DISK_SECTORS);
    let clock = Arc::new(AtomicU64::new(0));
    let device = DelayDevice::new(disk.queue(256), clock.clone(), latency, jitter);
    (Rig::new(config(window_ns), device), clock)
}

fn ram_rig(window_ns: u64) -> Rig<blkdev::RamDiskQueue> {
    let disk = RamDisk::new(DISK_SECTORS);
    Rig::new(config(window_ns), disk.queue(256))
}

#[test]
fn qd1_never_holds_a_notification() {
    let qd1 = Workload {
        depth: 1,
        submit_cost: US,
        irq_delay: 3 * US,
        requests: 300,
    };
    // On a device that answers at once and on one that takes 20 us.
    let ram = simulate(ram_rig(50 * US), &AtomicU64::new(0), qd1);
    let (rig, clock) = delay_rig(50 * US, 20 * US, 0);
    let slow = simulate(rig, &clock, qd1);
    for (seen, latency) in [(&ram, 0), (&slow, 20 * US)] {
        assert_eq!(seen.stats.notifications_held, 0, "{:?}", seen.stats);
        assert_eq!(seen.stats.notifications, 300);
        // Every request answered in its device time plus a poll or two, never a window.
        let worst = *seen.latencies.iter().max().unwrap();
        assert!(worst <= latency + 3 * US + STEP, "worst latency {worst} ns");
    }
}

/// Two requests; the device finishes the first at 10 us and keeps the second. The
/// frontend waits for its event on the first response alone.
fn one_held_response(window_ns: u64) -> (Rig<Delayed>, Arc<AtomicU64>, Arc<AtomicBool>, u64) {
    let (mut rig, clock) = delay_rig(window_ns, 10 * US, 0);
    let stall = rig.engine.device().stall.clone();
    let grefs: Vec<u32> = (0..2).map(|i| rig.data_page(i).1).collect();
    rig.send(&encode_direct(abi::OP_READ, 1, 0, &[whole_page(grefs[0])]));
    rig.engine.poll_at(64, 0);
    clock.store(5 * US, Ordering::SeqCst);
    rig.send(&encode_direct(abi::OP_READ, 2, 8, &[whole_page(grefs[1])]));
    rig.engine.poll_at(64, 5 * US);
    // The first completes at 10 us; the second would at 15 us, but the device stalls.
    let mut now = 10 * US;
    clock.store(now, Ordering::SeqCst);
    stall.store(false, Ordering::SeqCst);
    rig.engine.poll_at(64, now);
    assert_eq!(rig.engine.in_flight(), 1);
    stall.store(true, Ordering::SeqCst);
    now += STEP;
    (rig, clock, stall, now)
}

#[test]
fn a_frontend_waiting_on_one_held_response_gets_it_at_the_deadline() {
    let window = 40 * US;
    let (mut rig, clock, _stall, mut now) = one_held_response(window);
    assert_eq!(rig.engine.stats().notifications_held, 1);
    assert_eq!(rig.engine.notify_deadline(), Some(10 * US + window));
    assert_eq!(rig.events.count(), 0);
    // The response is visible at once to a frontend that looks.
    assert_eq!(rig.engine.ring().rsp_prod(), 1);
    // No other completion comes: the event goes out at the first poll at the deadline.
    while rig.events.count() == 0 {
        assert!(
            now <= 10 * US + window,
            "no event by the deadline ({now} ns)"
        );
        clock.store(now, Ordering::SeqCst);
        rig.engine.poll_at(64, now);
        now += STEP;
    }
    assert_eq!(now - STEP, 10 * US + window);
    assert_eq!(rig.engine.notify_deadline(), None);
    let stats = rig.engine.stats();
    assert_eq!((stats.notifications, stats.notify_holds_wasted), (1, 1));
    assert_eq!(holds_ended(&stats), [1, 0, 0, 0, 0]);
    assert_eq!(rig.responses().len(), 1);
}

#[test]
fn a_held_notification_goes_out_with_the_next_completion_when_nothing_else_is_in_flight() {
    let window = 40 * US;
    let (mut rig, clock, stall, now) = one_held_response(window);
    // The second request completes 5 us later, inside the window: one event for both,
    // sent as soon as nothing else is in flight.
    stall.store(false, Ordering::SeqCst);
    clock.store(now + 5 * US, Ordering::SeqCst);
    rig.engine.poll_at(64, now + 5 * US);
    assert_eq!(rig.events.count(), 1);
    assert_eq!(rig.responses().len(), 2);
    let stats = rig.engine.stats();
    assert_eq!(
        (stats.notifications_held, stats.notify_holds_wasted),
        (1, 0)
    );
    assert_eq!(holds_ended(&stats), [0, 1, 0, 0, 0]);
}

#[test]
fn teardown_sends_a_held_notification() {
    let (mut rig, clock, stall, _) = one_held_response(1_000 * US);
    assert_eq!(rig.events.count(), 0);
    // The second request is still on the device: teardown must wait, but the frontend
    // hears of the first response now.
    assert_eq!(rig.engine.disconnect(), Err(Busy { in_flight: 1 }));
    assert_eq!(rig.events.count(), 1);
    assert_eq!(rig.engine.notify_deadline(), None);
    assert_eq!(rig.responses().len(), 1);
    rig.front.arm_response_event();
    // The device finishes the second.
    stall.store(false, Ordering::SeqCst);
    clock.store(20 * US, Ordering::SeqCst);
    assert_eq!(rig.engine.disconnect(), Ok(()));
    assert_eq!(rig.events.count(), 2, "the last response is notified too");
}

#[test]
fn many_requests_on_a_slow_device_take_under_a_quarter_notification_each() {
    let qd32 = Workload {
        depth: 32,
        submit_cost: US,
        irq_delay: 3 * US,
        requests: 4_000,
    };
    let run = |window| {
        let (rig, clock) = delay_rig(window, 200 * US, 100 * US);
        simulate(rig, &clock, qd32)
    };
    let off = run(0);
    let on = run(50 * US);
    let (before, after) = (
        off.notifications_per_request(),
        on.notifications_per_request(),
    );
    assert!(before > 0.5, "without holding: {before} per request");
    assert!(
        after < 0.25,
        "holding: {after} per request ({:?})",
        on.stats
    );
    // No request waited more than a window longer on average.
    let (mean_off, mean_on) = (off.mean_latency(), on.mean_latency());
    assert!(
        mean_on <= mean_off + 50 * US,
        "{mean_on} ns against {mean_off} ns"
    );
    assert_eq!(on.stats.responses, on.latencies.len() as u64);
}

#[test]
fn a_frontend_trickling_requests_to_an_instant_device_gets_batches() {
    // The RAM disk answers during the poll that takes a request: nothing is ever in
    // flight on it. What shows more to come is the frontend submitting another request
    // before its interrupt handler took the last response.
    let qd32 = Workload {
        depth: 32,
        submit_cost: 2 * US,
        irq_delay: 3 * US,
        requests: 4_000,
    };
    let off = simulate(ram_rig(0), &AtomicU64::new(0), qd32);
    let on = simulate(ram_rig(20 * US), &AtomicU64::new(0), qd32);
    assert!(off.notifications_per_request() >= 0.5, "{:?}", off.stats);
    assert!(
        on.notifications_per_request() < 0.25,
        "{} per request ({:?})",
        on.notifications_per_request(),
        on.stats
    );
    // Every hold ended for a reason counted (the last may still be open).
    let ended: u64 = holds_ended(&on.stats).iter().sum();
    assert!(
        on.stats.notifications_held - ended <= 1,
        "{ended} ended of {}",
        on.stats.notifications_held
    );
}

#[test]
fn a_frontend_with_its_whole_ring_answered_is_told_at_once() {
    // 32 requests on a 32-slot ring, submitted 1 us apart against a 1 ms window: once
    // the last is answered the frontend can send nothing more, so waiting for the
    // deadline would only stall it.
    let window = 1_000 * US;
    let mut rig = ram_rig(window);
    let grefs: Vec<u32> = (0..32).map(|i| rig.data_page(i).1).collect();
    let mut now = 0;
    // Earlier rounds showed the frontend keeping many requests outstanding.
    for round in 0..3u64 {
        for (i, &gref) in grefs.iter().enumerate() {
            let id = round * 32 + i as u64;
            rig.send(&encode_direct(abi::OP_READ, id, 0, &[whole_page(gref)]));
            rig.engine.poll_at(64, now);
            now += US;
        }
        assert_eq!(rig.events.count(), round + 1, "round {round}");
        assert_eq!(rig.engine.notify_deadline(), None);
        assert_eq!(rig.responses().len(), 32);
        rig.front.arm_response_event();
    }
    // The first round was not held: nothing showed more to come yet.
    assert_eq!(rig.engine.stats().notifications_held, 2);
    assert_eq!(rig.engine.stats().notify_holds_wasted, 0);
    // Both ended as the frontend reached its depth (its whole ring), not at the window.
    assert_eq!(holds_ended(&rig.engine.stats()), [0, 0, 0, 2, 0]);
}

#[test]
fn holding_stops_when_no_completion_comes_within_the_window() {
    // Four requests outstanding, each taking 1 ms, spread evenly: completions come
    // 250 us apart, so a 20 us window never catches a second one.
    let spread = Workload {
        depth: 4,
        submit_cost: 250 * US,
        irq_delay: 3 * US,
        requests: 400,
    };
    let (rig, clock) = delay_rig(20 * US, 1_000 * US, 0);
    let seen = simulate(rig, &clock, spread);
    let stats = seen.stats;
    assert!(
        stats.notifications_held <= 3,
        "holds went on although none paid: {stats:?}"
    );
    assert_eq!(stats.notify_holds_wasted, stats.notifications_held);
    assert!(stats.notifications >= 399);
}

#[test]
fn a_held_notification_the_frontend_no_longer_needs_is_not_sent() {
    let (mut rig, clock, _stall, now) = one_held_response(40 * US);
    // The frontend looked on its own, took the response and re-armed past it.
    assert_eq!(rig.responses().len(), 1);
    rig.front.arm_response_event();
    let deadline = rig.engine.notify_deadline().expect("held");
    assert!(deadline > now);
    clock.store(deadline, Ordering::SeqCst);
    rig.engine.poll_at(64, deadline);
    assert_eq!(rig.engine.notify_deadline(), None);
    assert_eq!(rig.events.count(), 0);
    assert_eq!(rig.engine.stats().notifications, 0);
}

#[test]
fn a_poller_going_to_sleep_sends_the_held_notification_first() {
    // A frontend that kept 4 requests outstanding sends one more and waits for it: the
    // event is held (more may come), but the poller spins its spell, finds nothing and
    // goes to sleep. The event goes out before it blocks: no hold waits on its timer.
    let window = 20_000 * US;
    let mut rig = ram_rig(window);
    let grefs: Vec<u32> = (0..5).map(|i| rig.data_page(i).1).collect();
    for (id, &gref) in grefs[..4].iter().enumerate() {
        rig.send(&encode_direct(
            abi::OP_READ,
            id as u64,
            0,
            &[whole_page(gref)],
        ));
    }
    rig.engine.poll_at(64, 0);
    assert_eq!(rig.events.count(), 1);
    assert_eq!(rig.responses().len(), 4);
    rig.front.arm_response_event();
    rig.send(&encode_direct(abi::OP_READ, 4, 0, &[whole_page(grefs[4])]));
    rig.engine.poll_at(64, 10 * US);
    assert_eq!(rig.engine.notify_deadline(), Some(10 * US + window));
    assert_eq!(rig.events.count(), 1);
    assert!(rig.engine.prepare_to_sleep());
    assert_eq!(rig.events.count(), 2);
    assert_eq!(rig.engine.notify_deadline(), None);
    let stats = rig.engine.stats();
    assert_eq!(
        (stats.notifications_held, stats.notify_holds_wasted),
        (1, 1)
    );
    assert_eq!(holds_ended(&stats), [0, 0, 0, 0, 1]);
}
