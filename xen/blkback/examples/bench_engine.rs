// SPDX-License-Identifier: MIT OR Apache-2.0
//! Engine throughput on the host: 4 KiB reads (one grant each) against a null device,
//! ring order 0 and 4, one and two queues served by one poller, persistent grants on and
//! off (off: every request maps and unmaps its grant through the fake grant table, so
//! it measures the engine's batching and bookkeeping, not Xen's hypercall cost).
//!
//! Four measurements per configuration:
//! - threaded: a frontend thread keeps the rings full while the poller thread serves
//!   them; requests per second of wall time (bounded by the slower thread and by
//!   whatever else runs on the machine);
//! - lockstep: one thread fills the rings, then times only `poll` until they are
//!   drained; requests per second of the poller's core (best of ten windows, without
//!   the polls longer than four times the window's median, in which the thread lost its
//!   core to other work), with the fake Xen's shared pages (word-by-word atomics);
//! - plain: the same with the ring in plain memory (memcpy), the engine's own cost per
//!   request;
//! - kernel: the same with the ring seen as blkdom sees it, through `xen::SharedMem`
//!   (atomic accesses only; `kernel/src/backend/adapters.rs`'s `SharedRing`), the cost
//!   per request blkdom pays.
//!
//! Then notification moderation (`EngineConfig::notify_hold_ns`), on a virtual clock in
//! one thread (so the machine's load cannot change what it counts): a frontend that
//! behaves like blkfront (it learns of responses only from events, takes them in its
//! interrupt handler 3 us after the event, re-arms `rsp_event`, and resubmits what it
//! reaped one request at a time, 1 us apart) keeps 32 requests outstanding on a
//! one-page ring, against a device that answers at once (null) or 50 us after
//! submission. Each interrupt costs the frontend 4 us in which it submits nothing. For
//! each hold window: events sent and held per request, the mean time from submission to
//! the frontend taking the response, and requests per second, all in virtual time.
//!
//! Run with `tools/bench-engine.sh` (release build). `BENCH_SECONDS` sets the time per
//! measurement (default 2); `BENCH_NOTIFY_HOLD_US` the main table's hold window
//! (default 5000, the kernel's); `BENCH_JSON=path` also writes the results as JSON there
//! (tools/bench/report.py folds it into bench.json). `BENCH_PROFILE=order,queues,on|off`
//! runs only that configuration's plain loop for a fixed number of requests, for
//! valgrind (see `profile`). `BENCH_MODE=scale` runs only the multi-queue scaling
//! measurement instead (`scale.rs`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blkback::abi::{self, sring, PAGE_SIZE, REQUEST_SIZE};
use blkback::engine::{Engine, EngineConfig};
use blkback::fake::wire::encode_direct;
use blkback::fake::{
    null_disk, CountingEvents, DelayDevice, FrontRing, GrantTable, GuestMemory, PlainRing,
    RingView, XenGrants,
};
use blkback::parse::SegmentDesc;
use blkback::ring::RingMemory;
use blkdev::NullDisk;
use xen::SharedMem;

#[path = "bench_engine/scale.rs"]
mod scale;

type BenchEngine = Engine<RingView, XenGrants, NullDisk, CountingEvents>;

/// One ring's frontend: the ring and a ready-made read request per slot.
struct Front {
    ring: FrontRing,
    requests: Vec<[u8; REQUEST_SIZE]>,
    answered: Vec<u64>,
}

impl Front {
    /// Take responses, then refill every free slot (answered ids first).
    fn cycle(&mut self) -> usize {
        self.answered.clear();
        let answered = &mut self.answered;
        let taken = self.ring.take_responses(|r| answered.push(r.id));
        let free = self.ring.free_slots() as usize;
        for i in 0..free {
            let id = self
                .answered
                .get(i)
                .map_or(i % self.requests.len(), |&id| id as usize);
            self.ring.put_request(&self.requests[id]);
        }
        if free > 0 {
            self.ring.push_requests();
        }
        taken
    }
}

/// The notification hold window of the main table: `BENCH_NOTIFY_HOLD_US`, by default
/// the kernel's (`notify.hold-us=` default, 5000 us). Its frontends never ask for events,
/// so nothing is held: this measures the bookkeeping.
fn bench_config(order: u32, persistent: bool) -> EngineConfig {
    let hold_us: u64 = std::env::var("BENCH_NOTIFY_HOLD_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    EngineConfig {
        notify_hold_ns: hold_us * 1000,
        ..EngineConfig::new(order, persistent)
    }
}

fn setup(order: u32, queues: usize, persistent: bool) -> (Vec<Front>, Vec<BenchEngine>) {
    let ring_pages = 1usize << order;
    let slots = abi::ring_slots(order) as usize;
    let memory = GuestMemory::new(queues * (ring_pages + slots));
    let table = GrantTable::new(memory.clone());
    let mut fronts = Vec::new();
    let mut engines = Vec::new();
    let mut gref = 1u32;
    for q in 0..queues {
        let first = q * (ring_pages + slots);
        let pages: Vec<usize> = (first..first + ring_pages).collect();
        let mut ring = FrontRing::new(RingView::new(memory.clone(), pages.clone()), order);
        ring.set_rsp_event(u32::MAX / 2); // the frontend polls: no events wanted
        let mut requests = Vec::new();
        for s in 0..slots {
            table.grant(gref, first + ring_pages + s, false);
            let seg = SegmentDesc {
                gref,
                first_sect: 0,
                last_sect: 7,
            };
            requests.push(encode_direct(abi::OP_READ, s as u64, s as u64 * 8, &[seg]));
            gref += 1;
        }
        fronts.push(Front {
            ring,
            requests,
            answered: Vec::with_capacity(slots),
        });
        let view = RingView::new(memory.clone(), pages);
        let engine = Engine::new(
            view,
            XenGrants(table.clone()),
            null_disk(slots),
            CountingEvents::default(),
            bench_config(order, persistent),
        )
        .expect("engine");
        engines.push(engine);
    }
    (fronts, engines)
}

fn total_reads(engines: &[BenchEngine]) -> u64 {
    engines.iter().map(|e| e.stats().reads).sum()
}

/// Grant map plus unmap batches (hypercalls on Xen) per request served so far.
fn grant_batches_per_request(engines: &[BenchEngine]) -> f64 {
    let batches: u64 = engines
        .iter()
        .map(|e| e.stats().map_batches + e.stats().unmap_batches)
        .sum();
    batches as f64 / total_reads(engines).max(1) as f64
}

/// Frontend thread + poller thread; requests per second of wall time.
fn threaded(order: u32, queues: usize, persistent: bool, seconds: f64) -> f64 {
    let (mut fronts, mut engines) = setup(order, queues, persistent);
    let stop = Arc::new(AtomicBool::new(false));
    let frontend = {
        let stop = stop.clone();
        thread::Builder::new()
            .name("frontend".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut taken = 0;
                    for front in &mut fronts {
                        taken += front.cycle();
                    }
                    if taken == 0 {
                        // Let the poller run if both share a core on a busy machine.
                        thread::yield_now();
                    }
                }
            })
            .expect("frontend thread")
    };
    let budget = abi::ring_slots(order) as usize;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        let mut worked = false;
        for _ in 0..256 {
            for engine in &mut engines {
                worked |= engine.poll(budget).did_work();
            }
        }
        if !worked {
            thread::yield_now();
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    frontend.join().expect("frontend");
    total_reads(&engines) as f64 / elapsed
}

/// Each poll's wall time and the responses it produced, so that the polls in which the
/// thread lost its core to other work on the machine (longer than four times the
/// window's median) can be left out of the engine's time.
struct PollTimes(Vec<(u64, u64)>);

/// A window's polls, the preempted ones left out of `ns` and `requests`.
#[derive(Clone, Copy, Default)]
struct PollSum {
    ns: u64,
    requests: u64,
    polls: u64,
    dropped: u64,
}

impl PollSum {
    fn ns_per_request(&self) -> f64 {
        self.ns as f64 / self.requests as f64
    }
}

impl PollTimes {
    fn new() -> Self {
        PollTimes(Vec::with_capacity(1 << 20))
    }

    /// The responses the last poll produced (the frontend took them after it).
    fn answered(&mut self, responses: u64) {
        if let Some(last) = self.0.last_mut() {
            last.1 = responses;
        }
    }

    fn time(&mut self, poll: impl FnOnce()) {
        let before = Instant::now();
        poll();
        let ns = before.elapsed().as_nanos() as u64;
        if self.0.len() < self.0.capacity() {
            self.0.push((ns, 0));
        }
    }

    /// The polls so far, without those longer than four times their median; starts a
    /// new window.
    fn fold(&mut self) -> PollSum {
        self.0.retain(|&(_, answered)| answered > 0);
        let mut sorted: Vec<u64> = self.0.iter().map(|&(ns, _)| ns).collect();
        sorted.sort_unstable();
        let limit = sorted.get(sorted.len() / 2).copied().unwrap_or(0) * 4;
        let mut sum = PollSum::default();
        for &(ns, answered) in &self.0 {
            sum.polls += 1;
            if ns <= limit {
                sum.ns += ns;
                sum.requests += answered;
            } else {
                sum.dropped += 1;
            }
        }
        self.0.clear();
        sum
    }
}

/// Fill, then time only the polls that drain; requests per second of poll time, the
/// polls in which the thread lost its core left out (`PollTimes`). The best of several
/// windows is reported: other load on the machine only slows a window.
/// Also returns the grant map/unmap batches per request.
fn lockstep(order: u32, queues: usize, persistent: bool, seconds: f64) -> (f64, f64) {
    let (mut fronts, mut engines) = setup(order, queues, persistent);
    let budget = abi::ring_slots(order) as usize;
    let windows = 10;
    let mut best = 0.0f64;
    let mut polls = PollTimes::new();
    for _ in 0..windows {
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds / f64::from(windows) {
            let mut taken = 0;
            for front in &mut fronts {
                taken += front.cycle() as u64;
            }
            polls.answered(taken);
            polls.time(|| {
                for engine in &mut engines {
                    engine.poll(budget);
                }
            });
        }
        best = best.max(1e9 / polls.fold().ns_per_request());
    }
    (best, grant_batches_per_request(&engines))
}

/// The kernel's ring memory (`kernel/src/backend/adapters.rs`'s `SharedRing`): mapped
/// pages seen through `xen::SharedMem`, whose every access is atomic.
#[derive(Clone)]
struct KernelRing(SharedMem);

impl RingMemory for KernelRing {
    fn size_bytes(&self) -> usize {
        self.0.len()
    }
    fn load_u32(&self, offset: usize) -> u32 {
        self.0.load_u32(offset, Ordering::Acquire)
    }
    fn store_u32(&self, offset: usize, value: u32) {
        self.0.store_u32(offset, value, Ordering::Release)
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        self.0.read_bytes(offset, out)
    }
    fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.0.write_bytes(offset, data)
    }
    fn full_fence(&self) {
        fence(Ordering::SeqCst);
    }
}

/// Ring memory of `bytes` zeroed bytes, for a [`PlainRig`].
trait NewRing: RingMemory + Clone {
    fn new_ring(bytes: usize) -> Self;
    /// The frontend writes a request into its slot (not through the engine's methods,
    /// so that a profile tells the two sides apart).
    fn put_request(&self, offset: usize, request: &[u8; REQUEST_SIZE]);
}

impl NewRing for PlainRing {
    fn new_ring(bytes: usize) -> Self {
        PlainRing(Rc::new(RefCell::new(vec![0u8; bytes])))
    }
    fn put_request(&self, offset: usize, request: &[u8; REQUEST_SIZE]) {
        self.0.borrow_mut()[offset..offset + REQUEST_SIZE].copy_from_slice(request);
    }
}

impl NewRing for KernelRing {
    fn new_ring(bytes: usize) -> Self {
        KernelRing(SharedMem::alloc_leaked(bytes))
    }
    fn put_request(&self, offset: usize, request: &[u8; REQUEST_SIZE]) {
        for (i, word) in request.chunks_exact(8).enumerate() {
            let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            self.0.store_u64(offset + 8 * i, word, Ordering::Relaxed);
        }
    }
}

impl NewRing for RingView {
    fn new_ring(bytes: usize) -> Self {
        let pages = bytes / PAGE_SIZE;
        RingView::new(GuestMemory::new(pages), (0..pages).collect())
    }
    fn put_request(&self, offset: usize, request: &[u8; REQUEST_SIZE]) {
        self.write_bytes(offset, request);
    }
}

/// Rings served by one thread, the frontend side written out here: in plain memory
/// (`PlainRing`, memcpy), as the kernel sees them (`KernelRing`), or in the fake Xen's
/// pages (`RingView`, for a profile of the lockstep column's ring costs).
struct PlainRig<R> {
    slots: u32,
    rings: Vec<PlainQueue<R>>,
}

/// One ring of a [`PlainRig`]: its memory, its ready-made requests, its engine and the
/// frontend's indices.
struct PlainQueue<R> {
    ring: R,
    requests: Vec<[u8; REQUEST_SIZE]>,
    engine: Engine<R, XenGrants, NullDisk, CountingEvents>,
    req_prod: u32,
    rsp_cons: u32,
}

impl<R: NewRing> PlainRig<R> {
    fn new(order: u32, queues: usize, persistent: bool) -> Self {
        let slots = abi::ring_slots(order);
        let memory = GuestMemory::new(queues * slots as usize);
        let table = GrantTable::new(memory.clone());
        let mut rings = Vec::new();
        for q in 0..queues {
            let ring = R::new_ring(PAGE_SIZE << order);
            ring.store_u32(sring::REQ_EVENT, 1);
            ring.store_u32(sring::RSP_EVENT, u32::MAX / 2);
            let requests: Vec<[u8; REQUEST_SIZE]> = (0..slots)
                .map(|s| {
                    let gref = q as u32 * slots + s + 1;
                    table.grant(gref, (gref - 1) as usize, false);
                    let seg = SegmentDesc {
                        gref,
                        first_sect: 0,
                        last_sect: 7,
                    };
                    encode_direct(abi::OP_READ, u64::from(s), u64::from(s) * 8, &[seg])
                })
                .collect();
            let engine = Engine::new(
                ring.clone(),
                XenGrants(table.clone()),
                null_disk(slots as usize),
                CountingEvents::default(),
                bench_config(order, persistent),
            )
            .expect("engine");
            rings.push(PlainQueue {
                ring,
                requests,
                engine,
                req_prod: 0,
                rsp_cons: 0,
            });
        }
        Self { slots, rings }
    }

    /// The frontend's turn: take every response, fill every free slot. Returns the
    /// responses taken.
    fn front(&mut self) -> u64 {
        let slots = self.slots;
        let mut done = 0;
        for q in &mut self.rings {
            let rsp_prod = q.ring.load_u32(sring::RSP_PROD);
            done += u64::from(rsp_prod.wrapping_sub(q.rsp_cons));
            q.rsp_cons = rsp_prod;
            while q.req_prod.wrapping_sub(q.rsp_cons) < slots {
                let offset =
                    sring::HEADER_SIZE + (q.req_prod & (slots - 1)) as usize * REQUEST_SIZE;
                q.ring
                    .put_request(offset, &q.requests[(q.req_prod & (slots - 1)) as usize]);
                q.req_prod = q.req_prod.wrapping_add(1);
            }
            q.ring.store_u32(sring::REQ_PROD, q.req_prod);
        }
        done
    }

    /// The poller's turn: one poll of every ring.
    fn poll(&mut self) {
        for q in &mut self.rings {
            q.engine.poll(self.slots as usize);
        }
    }
}

/// Lockstep over plain memory (`PlainRing`) or the kernel's (`KernelRing`).
fn lockstep_plain<R: NewRing>(order: u32, queues: usize, persistent: bool, seconds: f64) -> f64 {
    let mut rig = PlainRig::<R>::new(order, queues, persistent);
    let mut best = 0.0f64;
    let mut polls = PollTimes::new();
    for _ in 0..10 {
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds / 10.0 {
            polls.answered(rig.front());
            polls.time(|| rig.poll());
        }
        best = best.max(1e9 / polls.fold().ns_per_request());
    }
    best
}

/// `BENCH_PROFILE=order,queues,on|off[,requests[,kernel|fake]]`: only the plain loop of
/// that configuration (`kernel`: the kernel ring's; `fake`: the fake Xen's), untimed, for a fixed number of requests
/// (default 1,000,000), for
/// instruction counts under valgrind (two runs with different counts: the difference
/// over the difference in requests is the cost per request, set-up excluded).
fn profile(spec: &str) {
    let fields: Vec<&str> = spec.split(',').collect();
    let parse = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let (Some(order), Some(queues), Some(persistent)) =
        (parse(0), parse(1), fields.get(2).map(|f| *f == "on"))
    else {
        panic!("BENCH_PROFILE=order,queues,on|off[,requests[,kernel|fake]], not {spec:?}");
    };
    let requests = parse(3).unwrap_or(1_000_000);
    let (order, queues) = (order as u32, queues as usize);
    let done = match fields.get(4).copied() {
        Some("kernel") => run_requests(
            PlainRig::<KernelRing>::new(order, queues, persistent),
            requests,
        ),
        Some("fake") => run_requests(
            PlainRig::<RingView>::new(order, queues, persistent),
            requests,
        ),
        _ => run_requests(
            PlainRig::<PlainRing>::new(order, queues, persistent),
            requests,
        ),
    };
    println!("profile: order {order}, {queues} queues, persistent {persistent}: {done} requests");
}

fn run_requests<R: NewRing>(mut rig: PlainRig<R>, requests: u64) -> u64 {
    let mut done = 0;
    while done < requests {
        done += rig.front();
        rig.poll();
    }
    done
}

/// One configuration's results.
struct Measurement {
    order: u32,
    queues: usize,
    persistent: bool,
    threaded: f64,
    lockstep: f64,
    plain: f64,
    kernel: f64,
    grant_batches_per_request: f64,
}

fn ns_per_request(rate: f64) -> f64 {
    if rate > 0.0 {
        1e9 / rate
    } else {
        f64::NAN
    }
}

/// The results as JSON (hand-written: the example has no serde).
/// One moderation measurement.
struct Moderation {
    latency_ns: u64,
    hold_ns: u64,
    notifications_per_request: f64,
    held_per_request: f64,
    mean_latency_us: f64,
    /// Requests per second of virtual time.
    req_per_s: f64,
}

/// A blkfront-like frontend against one engine on a virtual clock (one thread, so the
/// machine's load cannot change what it counts); see the module doc.
fn moderation(latency_ns: u64, hold_ns: u64, requests: u64) -> Moderation {
    const DEPTH: usize = 32;
    /// Virtual time per step; the engine is polled once a step.
    const STEP_NS: u64 = 250;
    const SUBMIT_NS: u64 = 1_000;
    /// From an event to the frontend's interrupt handler.
    const IRQ_DELAY_NS: u64 = 3_000;
    /// What an interrupt costs the frontend: it submits nothing meanwhile.
    const IRQ_COST_NS: u64 = 4_000;
    let order = 0;
    let memory = GuestMemory::new(1 + DEPTH);
    let table = GrantTable::new(memory.clone());
    let mut ring = FrontRing::new(RingView::new(memory.clone(), vec![0]), order);
    let requests_raw: Vec<[u8; REQUEST_SIZE]> = (0..DEPTH)
        .map(|s| {
            let gref = s as u32 + 1;
            table.grant(gref, 1 + s, false);
            let seg = SegmentDesc {
                gref,
                first_sect: 0,
                last_sect: 7,
            };
            encode_direct(abi::OP_READ, s as u64, s as u64 * 8, &[seg])
        })
        .collect();
    let clock = Arc::new(AtomicU64::new(0));
    let events = CountingEvents::default();
    let mut engine = Engine::new(
        RingView::new(memory.clone(), vec![0]),
        XenGrants(table.clone()),
        DelayDevice::new(null_disk(DEPTH), clock.clone(), latency_ns, 0),
        events.clone(),
        EngineConfig {
            notify_hold_ns: hold_ns,
            ..EngineConfig::new(order, true)
        },
    )
    .expect("engine");
    let mut submitted_at = [0u64; DEPTH];
    let mut reaped: Vec<u64> = (0..DEPTH as u64).collect();
    let (mut seen, mut irq_at, mut next_submit) = (0, None, 0);
    let (mut taken, mut latency_sum) = (0u64, 0u64);
    let mut now = 0u64;
    while taken < requests {
        clock.store(now, Ordering::Release);
        if events.count() != seen && irq_at.is_none() {
            irq_at = Some(now + IRQ_DELAY_NS);
        }
        if irq_at.is_some_and(|at| now >= at) {
            // The interrupt: take everything, re-arm, look again.
            irq_at = None;
            seen = events.count();
            loop {
                ring.take_responses(|r| {
                    latency_sum += now - submitted_at[r.id as usize];
                    taken += 1;
                    reaped.push(r.id);
                });
                if !ring.final_check_for_responses() {
                    break;
                }
            }
            next_submit = next_submit.max(now + IRQ_COST_NS);
        }
        if now >= next_submit {
            if let Some(id) = reaped.pop() {
                submitted_at[id as usize] = now;
                ring.put_request(&requests_raw[id as usize]);
                ring.push_requests();
                next_submit = now + SUBMIT_NS;
            }
        }
        engine.poll_at(DEPTH, now);
        now += STEP_NS;
    }
    let stats = engine.stats();
    let answered = taken as f64;
    Moderation {
        latency_ns,
        hold_ns,
        notifications_per_request: stats.notifications as f64 / answered,
        held_per_request: stats.notifications_held as f64 / answered,
        mean_latency_us: latency_sum as f64 / answered / 1e3,
        req_per_s: answered / (now as f64 / 1e9),
    }
}

fn to_json(seconds: f64, results: &[Measurement], moderation: &[Moderation]) -> String {
    let rows: Vec<String> = results
        .iter()
        .map(|m| {
            format!(
                "    {{\"ring_order\": {}, \"queues\": {}, \"persistent_grants\": {}, \
                 \"threaded_req_per_s\": {:.0}, \"lockstep_req_per_s_per_core\": {:.0}, \
                 \"plain_req_per_s_per_core\": {:.0}, \"lockstep_ns_per_req\": {:.1}, \
                 \"plain_ns_per_req\": {:.1}, \"kernel_req_per_s_per_core\": {:.0}, \
                 \"kernel_ns_per_req\": {:.1}, \"grant_batches_per_req\": {:.3}}}",
                m.order,
                m.queues,
                m.persistent,
                m.threaded,
                m.lockstep,
                m.plain,
                ns_per_request(m.lockstep),
                ns_per_request(m.plain),
                m.kernel,
                ns_per_request(m.kernel),
                m.grant_batches_per_request
            )
        })
        .collect();
    let moderation: Vec<String> = moderation
        .iter()
        .map(|m| {
            format!(
                "    {{\"device_latency_us\": {}, \"notify_hold_us\": {}, \
                 \"notifications_per_req\": {:.3}, \"held_per_req\": {:.3}, \
                 \"mean_latency_us\": {:.1}, \"virtual_req_per_s\": {:.0}}}",
                m.latency_ns / 1000,
                m.hold_ns / 1000,
                m.notifications_per_request,
                m.held_per_request,
                m.mean_latency_us,
                m.req_per_s
            )
        })
        .collect();
    format!(
        "{{\n  \"benchmark\": \"blkback-engine\",\n  \"request\": \"4 KiB read, null device\",\n  \
         \"seconds_per_measurement\": {seconds},\n  \"results\": [\n{}\n  ],\n  \
         \"moderation\": [\n{}\n  ]\n}}\n",
        rows.join(",\n"),
        moderation.join(",\n")
    )
}

fn main() {
    if let Ok(spec) = std::env::var("BENCH_PROFILE") {
        return profile(&spec);
    }
    if std::env::var("BENCH_MODE").as_deref() == Ok("scale") {
        return scale::main();
    }
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    println!("blkback engine, 4 KiB reads, null device, one poller");
    println!(
        "{:>5} {:>6} {:>10} {:>14} {:>16} {:>8} {:>16} {:>8} {:>16} {:>8} {:>13}",
        "order",
        "queues",
        "persistent",
        "threaded req/s",
        "lockstep req/s",
        "ns/req",
        "plain req/s",
        "ns/req",
        "kernel req/s",
        "ns/req",
        "map+unmap/req"
    );
    let mut results = Vec::new();
    for order in [0, 4] {
        for queues in [1, 2] {
            for persistent in [true, false] {
                let threaded = threaded(order, queues, persistent, seconds);
                let (lockstep, grant_batches_per_request) =
                    lockstep(order, queues, persistent, seconds);
                let plain = lockstep_plain::<PlainRing>(order, queues, persistent, seconds);
                let kernel = lockstep_plain::<KernelRing>(order, queues, persistent, seconds);
                println!(
                    "{order:>5} {queues:>6} {:>10} {threaded:>14.0} {lockstep:>16.0} {:>8.1} \
                     {plain:>16.0} {:>8.1} {kernel:>16.0} {:>8.1} \
                     {grant_batches_per_request:>13.3}",
                    if persistent { "on" } else { "off" },
                    ns_per_request(lockstep),
                    ns_per_request(plain),
                    ns_per_request(kernel)
                );
                results.push(Measurement {
                    order,
                    queues,
                    persistent,
                    threaded,
                    lockstep,
                    plain,
                    kernel,
                    grant_batches_per_request,
                });
            }
        }
    }
    println!(
        "(lockstep, plain and kernel: per poller core; ns/req = 1e9 / that rate; kernel: the \
         ring through xen::SharedMem, as blkdom maps it)"
    );
    println!();
    println!(
        "notification moderation: blkfront-like frontend on a virtual clock, QD32, one-page \
         ring, 1 us per submission, interrupt 3 us after the event costing 4 us"
    );
    println!(
        "{:>9} {:>7} {:>10} {:>8} {:>15} {:>11}",
        "device us", "hold us", "events/req", "held/req", "mean latency us", "virt. req/s"
    );
    let mut moderated = Vec::new();
    let requests = (seconds * 100_000.0) as u64;
    for latency_ns in [0, 50_000] {
        for hold_ns in [0, 50_000, 5_000_000] {
            let m = moderation(latency_ns, hold_ns, requests.max(1_000));
            println!(
                "{:>9} {:>7} {:>10.3} {:>8.3} {:>15.1} {:>11.0}",
                latency_ns / 1000,
                hold_ns / 1000,
                m.notifications_per_request,
                m.held_per_request,
                m.mean_latency_us,
                m.req_per_s
            );
            moderated.push(m);
        }
    }
    if let Ok(path) = std::env::var("BENCH_JSON") {
        std::fs::write(&path, to_json(seconds, &results, &moderated)).expect("write BENCH_JSON");
        println!("json: {path}");
    }
}
