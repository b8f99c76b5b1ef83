//! Engine throughput on the host: 4 KiB reads (one persistent grant each) against a null
//! device, ring order 0 and 4, one and two queues served by one poller.
//!
//! Two measurements per configuration:
//! - threaded: a frontend thread keeps the rings full while the poller thread serves
//!   them; requests per second of wall time (bounded by the slower thread and by
//!   whatever else runs on the machine);
//! - lockstep: one thread fills the rings, then times only `poll` until they are
//!   drained; requests per second of the poller's core (best of ten windows), and the same with the cost of
//!   the fakes' shared-memory emulation (word-by-word atomic slot copies, measured
//!   against plain memcpy) taken out.
//!
//! Run with `tools/bench-engine.sh` (release build). `BENCH_SECONDS` sets the time per
//! measurement (default 2).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blkback::abi::{self, REQUEST_SIZE, RESPONSE_SIZE};
use blkback::engine::{Engine, EngineConfig};
use blkback::fakes::wire::encode_direct;
use blkback::fakes::{CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, XenGrants};
use blkback::parse::SegmentDesc;
use blkback::ring::{Response, RingMemory};
use blkdev::{Geometry, NullDisk};

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

fn setup(order: u32, queues: usize) -> (Vec<Front>, Vec<BenchEngine>) {
    let ring_pages = 1usize << order;
    let slots = abi::ring_slots(order) as usize;
    let memory = GuestMemory::new(queues * (ring_pages + slots));
    let table = GrantTable::new(memory.clone());
    let geometry = Geometry {
        sectors: 1 << 30,
        logical_block_size: 512,
        physical_block_size: 4096,
        read_only: false,
        flush: true,
        discard: None,
    };
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
            NullDisk::new(geometry, slots),
            CountingEvents::default(),
            EngineConfig::new(order, true),
        )
        .expect("engine");
        engines.push(engine);
    }
    (fronts, engines)
}

fn total_reads(engines: &[BenchEngine]) -> u64 {
    engines.iter().map(|e| e.stats().reads).sum()
}

/// Frontend thread + poller thread; requests per second of wall time.
fn threaded(order: u32, queues: usize, seconds: f64) -> f64 {
    let (mut fronts, mut engines) = setup(order, queues);
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

/// Fill, then time only the polls that drain; requests per second of poll time. The
/// best of several windows is reported: other load on the machine only slows a window.
fn lockstep(order: u32, queues: usize, seconds: f64) -> f64 {
    let (mut fronts, mut engines) = setup(order, queues);
    let budget = abi::ring_slots(order) as usize;
    let windows = 10;
    let mut best = 0.0f64;
    for _ in 0..windows {
        let before_reads = total_reads(&engines);
        let mut in_polls = Duration::ZERO;
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds / f64::from(windows) {
            for front in &mut fronts {
                front.cycle();
            }
            let before = Instant::now();
            for engine in &mut engines {
                engine.poll(budget);
            }
            in_polls += before.elapsed();
        }
        let rate = (total_reads(&engines) - before_reads) as f64 / in_polls.as_secs_f64();
        best = best.max(rate);
    }
    best
}

/// Nanoseconds per request the fake ring memory spends beyond what plain mapped memory
/// would: copying a slot out and a response in.
fn fake_ring_cost_ns() -> f64 {
    (0..5)
        .map(|_| fake_ring_cost_once_ns())
        .fold(f64::INFINITY, f64::min)
}

fn fake_ring_cost_once_ns() -> f64 {
    let memory = GuestMemory::new(1);
    let view = RingView::new(memory, vec![0]);
    let response = Response {
        id: 1,
        operation: 0,
        status: 0,
    }
    .to_bytes();
    let rounds = 500_000u32;
    let mut slot = [0u8; REQUEST_SIZE];
    let start = Instant::now();
    for i in 0..rounds {
        let offset = abi::sring::HEADER_SIZE + (i as usize % 32) * REQUEST_SIZE;
        view.read_bytes(offset, &mut slot);
        black_box(&slot);
        view.write_bytes(offset, black_box(&response[..RESPONSE_SIZE]));
    }
    let fake = start.elapsed().as_secs_f64();
    let mut plain = vec![0u8; 4096];
    let start = Instant::now();
    for i in 0..rounds {
        let offset = abi::sring::HEADER_SIZE + (i as usize % 32) * REQUEST_SIZE;
        slot.copy_from_slice(&black_box(&plain)[offset..offset + REQUEST_SIZE]);
        black_box(&slot);
        plain[offset..offset + RESPONSE_SIZE].copy_from_slice(black_box(&response));
    }
    let real = start.elapsed().as_secs_f64();
    ((fake - real) / f64::from(rounds) * 1e9).max(0.0)
}

fn main() {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    let fake_ns = fake_ring_cost_ns();
    println!("blkback engine, 4 KiB reads, persistent grants, null device, one poller");
    println!("fake ring-memory overhead: {fake_ns:.1} ns per request");
    println!(
        "{:>5} {:>6} {:>16} {:>18} {:>18}",
        "order", "queues", "threaded req/s", "lockstep req/s/core", "minus fake cost"
    );
    for order in [0, 4] {
        for queues in [1, 2] {
            let wall = threaded(order, queues, seconds);
            let per_core = lockstep(order, queues, seconds);
            let adjusted = 1e9 / (1e9 / per_core - fake_ns).max(1.0);
            println!("{order:>5} {queues:>6} {wall:>16.0} {per_core:>18.0} {adjusted:>18.0}");
        }
    }
}
