// SPDX-License-Identifier: MIT OR Apache-2.0
//! Large requests on the host: the engine in front of a RAM disk, as blkdom serves a
//! guest in PVH mode, with the ring and the guest's pages in plain memory (copies are
//! `memcpy`s, as on mapped pages). One ring of 32 slots kept full (fio's QD32), reads
//! and writes of 4 KiB (one segment), 8 KiB (two) and 1 MiB (an indirect request of
//! 256 segments on one indirect page, what Linux blkfront sends with
//! `max_indirect_segments=256`), persistent grants on and off.
//!
//! For each: ns per request (best of ten windows of lockstep polls, per poller core),
//! ns per KiB, the same bytes copied 4 KiB at a time without the engine (`copy only`,
//! the floor), what the engine and the disk add per segment beyond that copy, and grant
//! map and unmap calls (hypercalls on Xen) per request.
//!
//! `BENCH_SECONDS` sets the time per measurement (default 1). For instruction counts,
//! `BENCH_CASE=<name> BENCH_REQUESTS=<n>` serves exactly `n` requests of one case and
//! prints nothing else (run it under `valgrind --tool=cachegrind` twice with different
//! `n`: the difference over the difference of `n` is the cost per request without the
//! set-up). Case names: `read-4k`, `read-8k`, `read-1m`, `write-8k`, `write-1m`, each
//! with `-p` (persistent grants) or `-t` (transient), e.g. `read-1m-p`.

use std::time::{Duration, Instant};

use blkback::abi::{self, sring, PAGE_SIZE, REQUEST_SIZE};
use blkback::engine::{Engine, EngineConfig};
use blkback::fake::wire::{encode_direct, encode_indirect, encode_segment};
use blkback::fake::{CountingEvents, PlainGrants, PlainRing, Rng};
use blkback::parse::SegmentDesc;
use blkback::ring::RingMemory;
use blkdev::{RamDisk, RamDiskQueue};

type LargeEngine = Engine<PlainRing, PlainGrants, RamDiskQueue, CountingEvents>;

/// The RAM disk: 64 MiB, so requests land on memory the caches do not hold.
const DISK_BYTES: u64 = 64 << 20;
const ORDER: u32 = 0;

#[derive(Clone, Copy, Debug)]
struct Case {
    write: bool,
    segments: usize,
    persistent: bool,
}

impl Case {
    fn bytes(&self) -> usize {
        self.segments * PAGE_SIZE
    }

    fn indirect(&self) -> bool {
        self.segments > abi::MAX_SEGMENTS_PER_REQUEST
    }

    fn name(&self) -> String {
        let size = if self.bytes() >= 1 << 20 {
            format!("{}m", self.bytes() >> 20)
        } else {
            format!("{}k", self.bytes() >> 10)
        };
        format!(
            "{}-{size}-{}",
            if self.write { "write" } else { "read" },
            if self.persistent { "p" } else { "t" }
        )
    }
}

/// One ring kept full by a frontend in this thread, and the engine serving it.
struct Rig {
    case: Case,
    ring: PlainRing,
    engine: LargeEngine,
    slots: u32,
    req_prod: u32,
    rsp_cons: u32,
    rng: Rng,
}

impl Rig {
    fn new(case: Case) -> Self {
        let slots = abi::ring_slots(ORDER);
        let per_slot = case.segments + usize::from(case.indirect());
        // Page (= grant reference) 0 is never granted.
        let pages = 1 + slots as usize * per_slot;
        let mut grants = PlainGrants::new(pages, slots as usize * (per_slot + 1));
        for gref in 1..pages as u32 {
            grants.grant(gref, false);
        }
        if case.indirect() {
            for slot in 0..slots as usize {
                let first = 1 + slot * per_slot;
                let mut page = grants.page_mut(first + case.segments);
                for s in 0..case.segments {
                    let seg = SegmentDesc {
                        gref: (first + s) as u32,
                        first_sect: 0,
                        last_sect: 7,
                    };
                    let at = s * abi::SEGMENT_SIZE;
                    page[at..at + abi::SEGMENT_SIZE].copy_from_slice(&encode_segment(&seg));
                }
            }
        }
        let ring = PlainRing::new(ORDER);
        ring.store_u32(sring::REQ_EVENT, 1);
        ring.store_u32(sring::RSP_EVENT, u32::MAX / 2); // polls: no events wanted
        let disk = RamDisk::new(DISK_BYTES / 512);
        let engine = Engine::new(
            ring.clone(),
            grants,
            disk.queue(slots as usize),
            CountingEvents::default(),
            EngineConfig {
                max_indirect_segments: 256,
                ..EngineConfig::new(ORDER, case.persistent)
            },
        )
        .expect("engine");
        Self {
            case,
            ring,
            engine,
            slots,
            req_prod: 0,
            rsp_cons: 0,
            rng: Rng::new(7),
        }
    }

    /// Slot `slot`'s request at a random place on the disk, aligned to its size.
    fn request(&mut self, slot: u32) -> [u8; REQUEST_SIZE] {
        let case = self.case;
        let places = DISK_BYTES / case.bytes() as u64;
        let sector = self.rng.below(places) * case.bytes() as u64 / 512;
        let op = if case.write {
            abi::OP_WRITE
        } else {
            abi::OP_READ
        };
        let first = 1 + slot as usize * (case.segments + usize::from(case.indirect()));
        if case.indirect() {
            let indirect = (first + case.segments) as u32;
            encode_indirect(
                op,
                u64::from(slot),
                sector,
                case.segments as u16,
                &[indirect],
            )
        } else {
            let segs: Vec<SegmentDesc> = (0..case.segments)
                .map(|s| SegmentDesc {
                    gref: (first + s) as u32,
                    first_sect: 0,
                    last_sect: 7,
                })
                .collect();
            encode_direct(op, u64::from(slot), sector, &segs)
        }
    }

    /// Take the responses, refill the ring; returns how many were answered.
    fn refill(&mut self) -> u64 {
        let rsp_prod = self.ring.load_u32(sring::RSP_PROD);
        let done = rsp_prod.wrapping_sub(self.rsp_cons);
        self.rsp_cons = rsp_prod;
        while self.req_prod.wrapping_sub(self.rsp_cons) < self.slots {
            let slot = self.req_prod & (self.slots - 1);
            let raw = self.request(slot);
            let offset = sring::HEADER_SIZE + slot as usize * REQUEST_SIZE;
            self.ring.write_bytes(offset, &raw);
            self.req_prod = self.req_prod.wrapping_add(1);
        }
        self.ring.store_u32(sring::REQ_PROD, self.req_prod);
        u64::from(done)
    }

    fn poll(&mut self) {
        self.engine.poll(self.slots as usize);
    }

    fn served(&self) -> u64 {
        let stats = self.engine.stats();
        stats.reads + stats.writes
    }
}

/// Best ns per request over ten windows of `seconds / 10`, counting poll time only.
fn measure(case: Case, seconds: f64) -> (f64, Rig) {
    let mut rig = Rig::new(case);
    // Warm up: every grant mapped once (persistent), every page touched.
    for _ in 0..4 {
        rig.refill();
        rig.poll();
    }
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let (mut done, mut in_polls) = (0u64, Duration::ZERO);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds / 10.0 {
            done += rig.refill();
            let before = Instant::now();
            rig.poll();
            in_polls += before.elapsed();
        }
        if done > 0 {
            best = best.min(in_polls.as_secs_f64() * 1e9 / done as f64);
        }
    }
    assert_eq!(rig.engine.stats().errors, 0, "{}: errors", case.name());
    (best, rig)
}

/// The floor: the same bytes copied 4 KiB at a time between a disk-sized buffer and
/// one ring's worth of pages, no engine. Best ns per request.
fn copy_only(case: Case, seconds: f64) -> f64 {
    let slots = abi::ring_slots(ORDER) as usize;
    let mut disk = vec![1u8; DISK_BYTES as usize];
    let mut pages: Vec<Box<[u8]>> = (0..slots * case.segments)
        .map(|_| vec![0u8; PAGE_SIZE].into_boxed_slice())
        .collect();
    let mut rng = Rng::new(7);
    let places = DISK_BYTES / case.bytes() as u64;
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let (mut done, mut spent) = (0u64, Duration::ZERO);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds / 10.0 {
            let offsets: Vec<usize> = (0..slots)
                .map(|_| (rng.below(places) as usize) * case.bytes())
                .collect();
            let before = Instant::now();
            for (slot, &offset) in offsets.iter().enumerate() {
                for s in 0..case.segments {
                    let page = &mut pages[slot * case.segments + s];
                    let at = offset + s * PAGE_SIZE;
                    if case.write {
                        disk[at..at + PAGE_SIZE].copy_from_slice(page);
                    } else {
                        page.copy_from_slice(&disk[at..at + PAGE_SIZE]);
                    }
                }
            }
            spent += before.elapsed();
            done += slots as u64;
        }
        best = best.min(spent.as_secs_f64() * 1e9 / done as f64);
    }
    std::hint::black_box(&pages);
    best
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (write, segments) in [(false, 1), (false, 2), (false, 256), (true, 2), (true, 256)] {
        for persistent in [true, false] {
            cases.push(Case {
                write,
                segments,
                persistent,
            });
        }
    }
    cases
}

fn main() {
    if let (Ok(name), Ok(requests)) = (std::env::var("BENCH_CASE"), std::env::var("BENCH_REQUESTS"))
    {
        let case = cases()
            .into_iter()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("no case {name}"));
        let requests: u64 = requests.parse().expect("BENCH_REQUESTS");
        let mut rig = Rig::new(case);
        while rig.served() < requests {
            rig.refill();
            rig.poll();
        }
        return;
    }
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    println!(
        "blkback engine + RAM disk (64 MiB), ring of 32 slots kept full, plain memory, one poller"
    );
    println!(
        "{:<14} {:>10} {:>8} {:>10} {:>12} {:>10} {:>9} {:>9}",
        "case",
        "ns/req",
        "ns/KiB",
        "copy ns",
        "extra ns/seg",
        "ns/KiB cp",
        "maps/req",
        "unmaps/req"
    );
    for case in cases() {
        let (ns, rig) = measure(case, seconds);
        let copy = copy_only(case, seconds);
        let kib = case.bytes() as f64 / 1024.0;
        let grants = rig.engine.grants();
        let served = rig.served() as f64;
        println!(
            "{:<14} {:>10.0} {:>8.1} {:>10.0} {:>12.1} {:>10.1} {:>9.3} {:>9.3}",
            case.name(),
            ns,
            ns / kib,
            copy,
            (ns - copy) / case.segments as f64,
            copy / kib,
            grants.map_calls.get() as f64 / served,
            grants.unmap_calls.get() as f64 / served,
        );
    }
    println!("(ns per request per poller core, best of ten windows; copy: the same bytes memcpy'd");
    println!(" 4 KiB at a time without the engine; extra: (ns/req - copy) per segment)");
}
