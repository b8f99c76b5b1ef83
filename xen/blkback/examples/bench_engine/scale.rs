// SPDX-License-Identifier: MIT OR Apache-2.0
//! Multi-queue scaling (`BENCH_MODE=scale`): 1, 2, 4 and 8 pollers, each a thread of its
//! own with one ring seen as blkdom sees it (`KernelRing`), its engine, its fake grant
//! table and null device, and its frontend in the same thread (lockstep: fill the ring,
//! poll it, take the responses). What the pollers share is what blkdom's pollers share
//! across vCPUs on the I/O path: the domain's grant budget (`budget::GrantBudget`: each
//! ring's `GrantShare` word, read at every poll, and the credit pool, touched only when
//! a ring's target moves). Three ways to share:
//! - `shared`: one budget for all rings, as blkdom has;
//! - `private`: a budget per ring (bench only), so whatever `shared` costs more is the
//!   budget's;
//! - `line`: `shared`, plus one counter every poller increments per request inside its
//!   timed poll (a domain-wide statistic: what blkdom's per-ring `RingStats` and
//!   per-vCPU `PollerSlot`s avoid), to show what one written shared line costs.
//!
//! Per window, each thread's CPU time (`/proc/thread-self/schedstat`, the kernel's
//! `sum_exec_runtime` that `CLOCK_THREAD_CPUTIME_ID` reads, refreshed by a yield just
//! before) over the requests it served: frontend and engine together, and time the
//! thread waited for a core does not count. The engine alone: the polls' wall time
//! (`Instant`) over the requests they answered, without the polls longer than four
//! times the window's median (the thread lost its core in them; how many is reported).
//! Aggregate requests per second of wall time from per-thread progress counters on
//! lines of their own. With more pollers than cores the threads share cores: the
//! aggregate cannot grow past the cores, the per-request CPU still should not grow.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use blkback::budget::{GrantBudget, GrantLimits, GrantShare};
use blkback::CacheAligned;

use super::{bench_config, KernelRing, PlainRig, PollSum, PollTimes};

const POLLERS: [usize; 4] = [1, 2, 4, 8];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sharing {
    Shared,
    Private,
    Line,
}

impl Sharing {
    fn name(self) -> &'static str {
        match self {
            Sharing::Shared => "shared",
            Sharing::Private => "private",
            Sharing::Line => "line",
        }
    }
}

/// One thread's window.
#[derive(Clone, Copy, Default)]
struct ThreadWindow {
    requests: u64,
    cpu_ns: u64,
    engine: PollSum,
}

/// The calling thread's CPU time in ns. The yield first has the kernel bring the
/// running thread's account up to date (it is otherwise updated at ticks and switches).
fn thread_cpu_ns() -> u64 {
    thread::yield_now();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat")
}

/// What the threads of one run share with each other and with the timekeeper.
struct Run {
    /// Window number, raised by the timekeeper; a thread reads it every loop (one line
    /// written once per window).
    epoch: AtomicU32,
    start: Barrier,
    progress: Vec<CacheAligned<AtomicU64>>,
    /// `Sharing::Line`'s counter.
    line: CacheAligned<AtomicU64>,
}

/// One poller: serve its ring until the last window is over; its windows (the first,
/// the warm-up, included).
fn poller(
    run: &Run,
    me: usize,
    order: u32,
    persistent: bool,
    share: GrantShare,
    line: bool,
    windows: u32,
) -> Vec<ThreadWindow> {
    let mut rig = PlainRig::<KernelRing>::new(order, 1, persistent);
    rig.rings[0].engine.set_grant_share(share);
    let mut polls = PollTimes::new();
    let mut out = Vec::new();
    let mut seen = 0;
    let mut total = 0u64;
    let mut window = ThreadWindow::default();
    run.start.wait();
    let mut cpu_at = thread_cpu_ns();
    loop {
        let epoch = run.epoch.load(Ordering::Relaxed);
        if epoch != seen {
            let cpu = thread_cpu_ns();
            window.cpu_ns = cpu - cpu_at;
            window.engine = polls.fold();
            out.push(std::mem::take(&mut window));
            if epoch > windows {
                return out;
            }
            seen = epoch;
            cpu_at = thread_cpu_ns();
        }
        let taken = rig.front();
        polls.answered(taken);
        window.requests += taken;
        total += taken;
        run.progress[me].store(total, Ordering::Relaxed);
        polls.time(|| {
            rig.poll();
            if line {
                for _ in 0..taken {
                    run.line.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}

/// Median, minimum and maximum.
#[derive(Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(mut values: Vec<f64>) -> Spread {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return Spread {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
        };
    }
    Spread {
        median: values[values.len() / 2],
        min: values[0],
        max: values[values.len() - 1],
    }
}

/// Raw samples of one configuration, over rounds.
#[derive(Default)]
struct Samples {
    /// Aggregate requests per second of wall time, per window.
    rates: Vec<f64>,
    /// The pollers' CPU time over the wall time, per run.
    cores: Vec<f64>,
    /// Thread CPU ns per request, per thread and window.
    cpu_ns: Vec<f64>,
    /// Engine ns per request, per thread and window.
    engine_ns: Vec<f64>,
    polls: u64,
    dropped: u64,
    /// Runs in which the budget's pool of credit changed during the timed windows (a
    /// ring's credit moved: a write every poller of the budget may see).
    pool_moved: u64,
}

impl Samples {
    fn extend(&mut self, other: Samples) {
        self.rates.extend(other.rates);
        self.cores.extend(other.cores);
        self.cpu_ns.extend(other.cpu_ns);
        self.engine_ns.extend(other.engine_ns);
        self.polls += other.polls;
        self.dropped += other.dropped;
        self.pool_moved += other.pool_moved;
    }
}

struct Measurement {
    order: u32,
    persistent: bool,
    sharing: Sharing,
    pollers: usize,
    /// Aggregate requests per second of wall time, per window.
    aggregate: Spread,
    /// The pollers' CPU time over the wall time: the cores they got (median of runs).
    cores_used: f64,
    /// Thread CPU ns per request (frontend and engine), per thread and window.
    cpu_ns: Spread,
    /// Engine ns per request (the polls), per thread and window.
    engine_ns: Spread,
    dropped_polls: f64,
}

fn measure(
    order: u32,
    persistent: bool,
    sharing: Sharing,
    pollers: usize,
    windows: u32,
    window: Duration,
) -> Samples {
    let run = Arc::new(Run {
        epoch: AtomicU32::new(0),
        start: Barrier::new(pollers + 1),
        progress: (0..pollers)
            .map(|_| CacheAligned(AtomicU64::new(0)))
            .collect(),
        line: CacheAligned(AtomicU64::new(0)),
    });
    // The control path's part: every ring joins the domain's budget (or its own).
    let demand = bench_config(order, persistent).grant_demand();
    let mut domain = GrantBudget::new(GrantLimits::DEFAULT);
    let mut budgets = Vec::new();
    let shares: Vec<GrantShare> = (0..pollers)
        .map(|_| {
            let budget = if sharing == Sharing::Private {
                budgets.push(GrantBudget::new(GrantLimits::DEFAULT));
                budgets.last_mut().expect("just pushed")
            } else {
                &mut domain
            };
            budget.join(demand).expect("a share")
        })
        .collect();
    let threads: Vec<_> = shares
        .into_iter()
        .enumerate()
        .map(|(me, share)| {
            let run = run.clone();
            thread::Builder::new()
                .name(format!("poller{me}"))
                .spawn(move || {
                    poller(
                        &run,
                        me,
                        order,
                        persistent,
                        share,
                        sharing == Sharing::Line,
                        windows,
                    )
                })
                .expect("poller thread")
        })
        .collect();
    run.start.wait();
    let served = || -> u64 { run.progress.iter().map(|p| p.load(Ordering::Relaxed)).sum() };
    let pools = |domain: &GrantBudget, budgets: &[GrantBudget]| -> Vec<u32> {
        let mut free: Vec<u32> = budgets.iter().map(GrantBudget::in_flight_free).collect();
        free.push(domain.in_flight_free());
        free
    };
    // Window 0 is the warm-up.
    thread::sleep(window);
    let settled = pools(&domain, &budgets);
    let mut rates = Vec::new();
    for epoch in 1..=windows {
        let (at, before) = (Instant::now(), served());
        run.epoch.store(epoch, Ordering::Relaxed);
        thread::sleep(window);
        rates.push((served() - before) as f64 / at.elapsed().as_secs_f64());
    }
    let pool_moved = u64::from(pools(&domain, &budgets) != settled);
    run.epoch.store(windows + 1, Ordering::Relaxed);
    let per_thread: Vec<Vec<ThreadWindow>> = threads
        .into_iter()
        .map(|t| t.join().expect("poller"))
        .collect();
    // A thread's window k (k >= 1) is the timekeeper's epoch k.
    let counted = || {
        per_thread
            .iter()
            .flat_map(|w| w.iter().skip(1))
            .filter(|w| w.requests > 0)
    };
    let (polls, dropped) = counted().fold((0, 0), |(p, d), w| {
        (p + w.engine.polls, d + w.engine.dropped)
    });
    let cpu: u64 = counted().map(|w| w.cpu_ns).sum();
    Samples {
        rates,
        cores: vec![cpu as f64 / (window.as_nanos() as f64 * f64::from(windows))],
        cpu_ns: counted()
            .map(|w| w.cpu_ns as f64 / w.requests as f64)
            .collect(),
        engine_ns: counted().map(|w| w.engine.ns_per_request()).collect(),
        polls,
        dropped,
        pool_moved,
    }
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn main() {
    let windows: u32 = env("BENCH_SCALE_WINDOWS", 5);
    let rounds: u32 = env("BENCH_SCALE_ROUNDS", 3);
    let window = Duration::from_millis(env("BENCH_SCALE_WINDOW_MS", 100));
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "blkback engine, multi-queue scaling: one poller thread per ring (frontend in the same \
         thread), 4 KiB reads, null device, ring through xen::SharedMem; {cores} host cores, \
         {rounds} rounds of {windows} windows of {} ms",
        window.as_millis()
    );
    println!(
        "{:>5} {:>4} {:>7} {:>7} {:>27} {:>5} {:>9} {:>22} {:>6} {:>22} {:>7}",
        "order",
        "pers",
        "sharing",
        "pollers",
        "aggregate req/s (min-max M)",
        "cores",
        "wall eff.",
        "CPU ns/req (min-max)",
        "CPU eff",
        "engine ns/req (min-max)",
        "dropped"
    );
    let mut configs = Vec::new();
    for (order, persistent) in [(0, true), (0, false), (4, true)] {
        for pollers in POLLERS {
            for sharing in [Sharing::Shared, Sharing::Private, Sharing::Line] {
                configs.push((order, persistent, sharing, pollers, Samples::default()));
            }
        }
    }
    // Rounds over the whole matrix, so that a spell of load elsewhere on the machine
    // falls on every configuration alike.
    for _ in 0..rounds {
        for (order, persistent, sharing, pollers, samples) in &mut configs {
            samples.extend(measure(
                *order,
                *persistent,
                *sharing,
                *pollers,
                windows,
                window,
            ));
        }
    }
    let runs = configs.len() as u64 * u64::from(rounds);
    let pool_moved: u64 = configs.iter().map(|c| c.4.pool_moved).sum();
    let mut results = Vec::new();
    let mut single: Vec<(u32, bool, Sharing, f64, f64)> = Vec::new();
    for (order, persistent, sharing, pollers, samples) in configs {
        let m = Measurement {
            order,
            persistent,
            sharing,
            pollers,
            aggregate: spread(samples.rates),
            cores_used: spread(samples.cores).median,
            cpu_ns: spread(samples.cpu_ns),
            engine_ns: spread(samples.engine_ns),
            dropped_polls: samples.dropped as f64 / samples.polls.max(1) as f64,
        };
        if pollers == 1 {
            single.push((order, persistent, sharing, m.aggregate.max, m.cpu_ns.median));
        }
        let &(.., rate, cpu) = single
            .iter()
            .find(|s| (s.0, s.1, s.2) == (order, persistent, sharing))
            .expect("1 poller first");
        let efficiency = Efficiency {
            // Best windows (those in which the machine left the pollers its cores)
            // against linear growth up to the cores.
            wall: m.aggregate.max / (rate * pollers.min(cores) as f64),
            cpu: cpu / m.cpu_ns.median,
        };
        println!(
            "{order:>5} {:>4} {:>7} {pollers:>7} {:>11.0} ({:>5.1}-{:>5.1}) {:>5.2} \
             {:>8.0}% {:>8.1} ({:>5.1}-{:>5.1}) {:>6.0}% {:>8.1} ({:>5.1}-{:>5.1}) \
             {:>6.2}%",
            if persistent { "on" } else { "off" },
            sharing.name(),
            m.aggregate.median,
            m.aggregate.min / 1e6,
            m.aggregate.max / 1e6,
            m.cores_used,
            efficiency.wall * 100.0,
            m.cpu_ns.median,
            m.cpu_ns.min,
            m.cpu_ns.max,
            efficiency.cpu * 100.0,
            m.engine_ns.median,
            m.engine_ns.min,
            m.engine_ns.max,
            m.dropped_polls * 100.0
        );
        results.push((m, efficiency));
    }
    println!(
        "(medians of windows x threads, min-max; cores: the pollers' CPU time over wall time; \
         wall eff.: best window's aggregate over the same sharing's 1-poller best times \
         min(pollers, cores); CPU: the thread's, frontend and engine, CPU eff.: 1 poller's over this; \
         engine: its polls, preempted ones dropped; line: plus one shared counter written per \
         request; more pollers than cores share them)"
    );
    println!(
        "budget: its pool of credit moved during the timed windows in {pool_moved} of {runs} runs"
    );
    if let Some(path) = std::env::var("BENCH_JSON").ok().filter(|p| !p.is_empty()) {
        std::fs::write(&path, to_json(cores, rounds, windows, window, &results))
            .expect("write BENCH_JSON");
        println!("json: {path}");
    }
}

/// Against 1 poller of the same sharing: `wall`, the best window's aggregate requests
/// per second over linear growth up to the cores; `cpu`, thread CPU per request.
struct Efficiency {
    wall: f64,
    cpu: f64,
}

fn spread_json(s: Spread, digits: usize) -> String {
    format!(
        "{{\"median\": {:.digits$}, \"min\": {:.digits$}, \"max\": {:.digits$}}}",
        s.median, s.min, s.max
    )
}

fn to_json(
    cores: usize,
    rounds: u32,
    windows: u32,
    window: Duration,
    results: &[(Measurement, Efficiency)],
) -> String {
    let rows: Vec<String> = results
        .iter()
        .map(|(m, efficiency)| {
            format!(
                "    {{\"ring_order\": {}, \"persistent_grants\": {}, \"sharing\": \"{}\", \
                 \"pollers\": {}, \"aggregate_req_per_s\": {}, \"cores_used\": {:.2}, \
                 \"wall_efficiency\": {:.3}, \"thread_cpu_ns_per_req\": {}, \
                 \"cpu_efficiency\": {:.3}, \"engine_ns_per_req\": {}, \
                 \"dropped_polls\": {:.4}}}",
                m.order,
                m.persistent,
                m.sharing.name(),
                m.pollers,
                spread_json(m.aggregate, 0),
                m.cores_used,
                efficiency.wall,
                spread_json(m.cpu_ns, 1),
                efficiency.cpu,
                spread_json(m.engine_ns, 1),
                m.dropped_polls
            )
        })
        .collect();
    format!(
        "{{\n  \"benchmark\": \"blkback-engine-scale\",\n  \"request\": \"4 KiB read, null \
         device\",\n  \"host_cores\": {cores},\n  \"rounds\": {rounds},\n  \"windows\": {windows},\n  \"window_ms\": \
         {},\n  \"results\": [\n{}\n  ]\n}}\n",
        window.as_millis(),
        rows.join(",\n")
    )
}
