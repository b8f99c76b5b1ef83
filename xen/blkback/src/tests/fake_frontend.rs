// SPDX-License-Identifier: MIT OR Apache-2.0
//! A fake Linux blkfront on its own thread, against engines polled on other threads
//! over shared guest memory, checked against a reference copy of the disk.
//!
//! Like blkfront it grants pages (persistently, or per request and revoked after the
//! response), uses indirect descriptors for large requests, reuses ids out of order and
//! spreads requests over several queues. It never has two overlapping requests in
//! flight where one writes, so the reference is exact. Every response is checked by id:
//! unknown, duplicate or missing responses, wrong status, wrong data all fail the test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blkdev::RamDisk;

use crate::abi::{self, Protocol, PAGE_SIZE, RSP_EOPNOTSUPP, RSP_ERROR, RSP_OKAY};
use crate::engine::{Engine, EngineConfig};
use crate::fake::wire::{
    encode_direct, encode_discard, encode_indirect, encode_segment, x86_32_of,
};
use crate::fake::{
    CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, Rng, ShufflingDevice, XenGrants,
};
use crate::parse::SegmentDesc;
use crate::stats::RingStats;

const SECTOR: usize = 512;
const DISK_SECTORS: u64 = 4096;

#[derive(Clone, Copy, Debug)]
struct FakeFrontendConfig {
    queues: usize,
    pollers: usize,
    ring_order: u32,
    persistent: bool,
    /// Largest request in segments (above 11 uses indirect descriptors).
    max_segments: usize,
    /// Requests one queue keeps in flight at most.
    depth: usize,
    /// Run `operations() / ops_divisor` operations (for configurations of huge requests).
    ops_divisor: usize,
    seed: u64,
    /// The frontend's ABI: an x86_32 one writes 108-byte slots and reads 12-byte
    /// responses.
    protocol: Protocol,
    /// `EngineConfig::notify_hold_ns`; the pollers pass wall-clock time.
    notify_hold_ns: u64,
    /// Take responses only after an event, as blkfront's interrupt handler does (and
    /// re-arm with `RING_FINAL_CHECK_FOR_RESPONSES`): a lost event stalls the queue.
    /// Otherwise the frontend looks at its rings all the time.
    interrupts: bool,
}

/// Operations per configuration: `BLKBACK_MODEL_OPS`, else 10^5 optimised, fewer in debug.
fn operations() -> usize {
    std::env::var("BLKBACK_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            6_000
        } else {
            100_000
        })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
    Discard,
    Invalid(i16),
}

#[derive(Debug)]
struct Pending {
    kind: Kind,
    operation: u8,
    sector: u64,
    nr_sectors: u64,
    /// (page, gref, first_sect, last_sect) per segment.
    segments: Vec<(usize, u32, u8, u8)>,
    /// Indirect descriptor pages (page, gref).
    indirect: Vec<(usize, u32)>,
    /// For writes: the bytes written, in disk order.
    data: Vec<u8>,
}

impl Pending {
    fn writes(&self) -> bool {
        matches!(self.kind, Kind::Write | Kind::Discard)
    }
    fn overlaps(&self, sector: u64, nr_sectors: u64) -> bool {
        self.nr_sectors > 0
            && nr_sectors > 0
            && sector < self.sector + self.nr_sectors
            && self.sector < sector + nr_sectors
    }
}

/// Frontend-side page and grant bookkeeping.
struct Pool {
    memory: Arc<GuestMemory>,
    table: Arc<GrantTable>,
    free_pages: Vec<usize>,
    free_grefs: Vec<u32>,
    next_gref: u32,
    /// Persistent mode: pages granted once, reused.
    persistent: Vec<(usize, u32)>,
    use_persistent: bool,
}

impl Pool {
    fn page(&mut self, readonly: bool) -> (usize, u32) {
        if self.use_persistent {
            return self
                .persistent
                .pop()
                .expect("persistent pool sized for the depth");
        }
        let page = self
            .free_pages
            .pop()
            .expect("guest memory sized for the depth");
        let gref = self.free_grefs.pop().unwrap_or_else(|| {
            self.next_gref += 1;
            self.next_gref
        });
        self.table.grant(gref, page, readonly);
        (page, gref)
    }

    fn give_back(&mut self, page: usize, gref: u32) {
        if self.use_persistent {
            self.persistent.push((page, gref));
            return;
        }
        assert!(
            self.table.end_access(gref),
            "backend still maps gref {gref} after answering"
        );
        self.free_grefs.push(gref);
        self.free_pages.push(page);
    }
}

struct Queue {
    front: FrontRing,
    events: CountingEvents,
    in_flight: HashMap<u64, Pending>,
    /// Ids free for reuse; blkfront hands out shadow slots the same way.
    free_ids: Vec<u64>,
    /// Events handled so far (interrupt mode).
    events_seen: u64,
}

fn run_fake_frontend(config: FakeFrontendConfig) {
    let ops = operations() / config.ops_divisor;
    let ring_pages = 1usize << config.ring_order;
    let indirect_pages = abi::indirect_pages(config.max_segments.max(12));
    let per_queue = config.depth * (config.max_segments + indirect_pages);
    let memory = GuestMemory::new(config.queues * (ring_pages + per_queue) + 16);
    let table = GrantTable::new(memory.clone());
    let disk = RamDisk::new(DISK_SECTORS);
    let mut reference = vec![0u8; DISK_SECTORS as usize * SECTOR];
    let mut rng = Rng::new(config.seed);

    let mut pool = Pool {
        memory: memory.clone(),
        table: table.clone(),
        free_pages: (config.queues * ring_pages..memory.page_count())
            .rev()
            .collect(),
        free_grefs: Vec::new(),
        next_gref: 0,
        persistent: Vec::new(),
        use_persistent: config.persistent,
    };
    if config.persistent {
        pool.use_persistent = false;
        let pages: Vec<(usize, u32)> = (0..config.queues * per_queue)
            .map(|_| pool.page(false))
            .collect();
        pool.persistent = pages;
        pool.use_persistent = true;
    }

    let engine_config = EngineConfig {
        max_indirect_segments: config.max_segments.max(abi::MAX_SEGMENTS_PER_REQUEST) as u16,
        protocol: config.protocol,
        notify_hold_ns: config.notify_hold_ns,
        ..EngineConfig::new(config.ring_order, config.persistent)
    };
    let mut queues = Vec::new();
    let mut engines: Vec<Vec<_>> = (0..config.pollers).map(|_| Vec::new()).collect();
    for q in 0..config.queues {
        let pages: Vec<usize> = (q * ring_pages..(q + 1) * ring_pages).collect();
        let front = FrontRing::with_protocol(
            RingView::new(memory.clone(), pages.clone()),
            config.ring_order,
            config.protocol,
        );
        let events = CountingEvents::default();
        let device = ShufflingDevice::new(disk.queue(256), config.seed ^ q as u64, 60);
        let engine = Engine::new(
            RingView::new(memory.clone(), pages),
            XenGrants(table.clone()),
            device,
            events.clone(),
            engine_config,
        )
        .expect("engine");
        engines[q % config.pollers].push(engine);
        queues.push(Queue {
            front,
            events,
            in_flight: HashMap::new(),
            free_ids: (0..config.depth as u64).map(|i| i * 0x1_0001 + 3).collect(),
            events_seen: 0,
        });
    }

    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let pollers: Vec<_> = engines
        .into_iter()
        .map(|mut engines| {
            let done = done.clone();
            thread::spawn(move || {
                let mut idle = 0u32;
                while !done.load(Ordering::Acquire) {
                    let mut worked = false;
                    let now = start.elapsed().as_nanos() as u64;
                    for engine in &mut engines {
                        worked |= engine.poll_at(16, now).did_work();
                    }
                    if worked {
                        idle = 0;
                    } else {
                        idle += 1;
                        if idle > 64 && engines.iter_mut().all(|e| e.prepare_to_sleep()) {
                            thread::yield_now();
                        }
                    }
                }
                let mut stats = Vec::new();
                for engine in &mut engines {
                    while engine.disconnect().is_err() {
                        thread::yield_now();
                    }
                    stats.push(engine.stats());
                }
                stats
            })
        })
        .collect();

    let mut issued = 0usize;
    let mut answered = 0usize;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last_progress = Instant::now();
    while answered < ops {
        assert!(
            Instant::now() < deadline,
            "fake frontend stalled: {answered}/{ops} answered"
        );
        assert!(
            last_progress.elapsed() < Duration::from_secs(10),
            "no response for 10 s: a lost event? {answered}/{ops} answered"
        );
        let mut progressed = false;
        for q in 0..config.queues {
            // Collect answers: always, or (interrupt mode) after an event.
            let mut responses = Vec::new();
            let events = queues[q].events.count();
            if !config.interrupts || events > queues[q].events_seen {
                queues[q].events_seen = events;
                loop {
                    queues[q].front.take_responses(|r| responses.push(r));
                    if !config.interrupts || !queues[q].front.final_check_for_responses() {
                        break;
                    }
                }
            }
            for response in responses {
                let pending = queues[q].in_flight.remove(&response.id).unwrap_or_else(|| {
                    panic!(
                        "queue {q}: response for unknown or answered id {:#x}",
                        response.id
                    )
                });
                queues[q].free_ids.push(response.id);
                check_response(
                    &pending,
                    response.operation,
                    response.status,
                    &memory,
                    &mut reference,
                );
                for &(page, gref, _, _) in &pending.segments {
                    pool.give_back(page, gref);
                }
                for &(page, gref) in &pending.indirect {
                    pool.give_back(page, gref);
                }
                answered += 1;
                progressed = true;
            }
            // Issue new requests.
            let mut pushed = false;
            while issued < ops && queues[q].front.free_slots() > 0 && !queues[q].free_ids.is_empty()
            {
                let id_pick = rng.below(queues[q].free_ids.len() as u64) as usize;
                let id = queues[q].free_ids.swap_remove(id_pick);
                let all_in_flight: Vec<&Pending> =
                    queues.iter().flat_map(|q| q.in_flight.values()).collect();
                let Some((raw, pending)) =
                    make_request(&mut rng, &config, id, &mut pool, &all_in_flight)
                else {
                    queues[q].free_ids.push(id);
                    break;
                };
                match config.protocol {
                    Protocol::X86_64 => queues[q].front.put_request(&raw),
                    Protocol::X86_32 => queues[q].front.put_request_x86_32(&x86_32_of(&raw)),
                }
                queues[q].in_flight.insert(id, pending);
                issued += 1;
                pushed = true;
            }
            if pushed {
                queues[q].front.push_requests();
                progressed = true;
            }
            if !config.interrupts {
                queues[q].front.arm_response_event();
            }
        }
        if progressed {
            last_progress = Instant::now();
        } else {
            thread::yield_now();
        }
    }
    done.store(true, Ordering::Release);
    let stats: Vec<RingStats> = pollers
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect();

    for queue in &queues {
        assert!(queue.in_flight.is_empty());
    }
    let mut on_disk = vec![0u8; reference.len()];
    disk.read_at(0, &mut on_disk);
    assert!(
        on_disk == reference,
        "disk contents differ from the reference"
    );
    assert_eq!(
        table.live_mappings().0,
        0,
        "grants left mapped after disconnect"
    );
    let total: u64 = stats
        .iter()
        .map(|s| s.reads + s.writes + s.flushes + s.discards)
        .sum();
    let bad: u64 = stats.iter().map(|s| s.bad_requests).sum();
    assert!(total + bad >= ops as u64 - bad, "stats {stats:?}");
    let notifications: u64 = stats.iter().map(|s| s.notifications).sum();
    let seen: u64 = queues.iter().map(|q| q.events.count()).sum();
    assert_eq!(notifications, seen);
    let responses: u64 = stats.iter().map(|s| s.responses).sum();
    assert_eq!(responses, answered as u64, "one response per request");
    if config.depth == 1 {
        let held: u64 = stats.iter().map(|s| s.notifications_held).sum();
        assert_eq!(held, 0, "a frontend at QD1 waited for a held event");
    }
    if config.persistent {
        let maps: u64 = stats.iter().map(|s| s.map_batches).sum();
        assert!(
            maps < ops as u64 / 2,
            "persistent grants should mostly hit the cache ({maps} map batches)"
        );
    }
}

fn check_response(
    pending: &Pending,
    operation: u8,
    status: i16,
    memory: &GuestMemory,
    reference: &mut [u8],
) {
    assert_eq!(
        operation, pending.operation,
        "operation echoed for {pending:?}"
    );
    let expected = match pending.kind {
        Kind::Invalid(status) => status,
        _ => RSP_OKAY,
    };
    assert_eq!(status, expected, "status for {pending:?}");
    let start = pending.sector as usize * SECTOR;
    match pending.kind {
        Kind::Read => {
            let mut cursor = start;
            for &(page, _, first, last) in &pending.segments {
                let len = (usize::from(last - first) + 1) * SECTOR;
                let mut got = vec![0u8; len];
                memory.read(page, usize::from(first) * SECTOR, &mut got);
                assert!(
                    got == reference[cursor..cursor + len],
                    "read data differ at byte {cursor}"
                );
                cursor += len;
            }
        }
        Kind::Write => reference[start..start + pending.data.len()].copy_from_slice(&pending.data),
        Kind::Discard => reference[start..start + pending.nr_sectors as usize * SECTOR].fill(0),
        Kind::Flush | Kind::Invalid(_) => {}
    }
}

/// Build one random request, or `None` if it would overlap a conflicting one in flight.
fn make_request(
    rng: &mut Rng,
    config: &FakeFrontendConfig,
    id: u64,
    pool: &mut Pool,
    in_flight: &[&Pending],
) -> Option<([u8; abi::REQUEST_SIZE], Pending)> {
    let roll = rng.below(100);
    let kind = match roll {
        0..=42 => Kind::Read,
        43..=85 => Kind::Write,
        86..=90 => Kind::Flush,
        91..=95 => Kind::Discard,
        96..=97 => Kind::Invalid(RSP_ERROR),
        _ => Kind::Invalid(RSP_EOPNOTSUPP),
    };
    let mut pending = Pending {
        kind,
        operation: 0,
        sector: 0,
        nr_sectors: 0,
        segments: Vec::new(),
        indirect: Vec::new(),
        data: Vec::new(),
    };
    match kind {
        Kind::Invalid(RSP_EOPNOTSUPP) => {
            pending.operation = 4 + 3 * rng.below(2) as u8; // 4 or 7: not blkif ops
            return Some((encode_direct(pending.operation, id, 0, &[]), pending));
        }
        Kind::Invalid(_) => {
            // A one-segment read running past the end of the disk.
            pending.operation = abi::OP_READ;
            let seg = SegmentDesc {
                gref: 1,
                first_sect: 0,
                last_sect: 7,
            };
            return Some((
                encode_direct(abi::OP_READ, id, DISK_SECTORS - 4, &[seg]),
                pending,
            ));
        }
        Kind::Flush => {
            pending.operation = if rng.chance(50) {
                abi::OP_FLUSH_DISKCACHE
            } else {
                abi::OP_WRITE_BARRIER
            };
            return Some((encode_direct(pending.operation, id, 0, &[]), pending));
        }
        Kind::Discard => {
            pending.operation = abi::OP_DISCARD;
            pending.nr_sectors = 1 + rng.below(64);
            pending.sector = rng.below(DISK_SECTORS - pending.nr_sectors);
            if in_flight
                .iter()
                .any(|p| p.overlaps(pending.sector, pending.nr_sectors))
            {
                return None;
            }
            return Some((
                encode_discard(id, pending.sector, pending.nr_sectors, rng.chance(30)),
                pending,
            ));
        }
        Kind::Read | Kind::Write => {}
    }
    // Mostly small requests, sometimes large ones that need indirect descriptors.
    let nr_segments = if rng.chance(70) {
        1 + rng.below(abi::MAX_SEGMENTS_PER_REQUEST as u64) as usize
    } else {
        1 + rng.below(config.max_segments as u64) as usize
    };
    let layout: Vec<(u8, u8)> = (0..nr_segments)
        .map(|_| {
            if rng.chance(60) {
                (0, 7)
            } else {
                let first = rng.below(8) as u8;
                (first, first + rng.below(8 - u64::from(first)) as u8)
            }
        })
        .collect();
    pending.nr_sectors = layout.iter().map(|&(f, l)| u64::from(l - f) + 1).sum();
    pending.sector = rng.below(DISK_SECTORS - pending.nr_sectors + 1);
    let writes = kind == Kind::Write;
    if in_flight
        .iter()
        .any(|p| (writes || p.writes()) && p.overlaps(pending.sector, pending.nr_sectors))
    {
        return None;
    }
    pending.operation = if writes {
        if rng.chance(5) {
            abi::OP_FLUSH_DISKCACHE
        } else {
            abi::OP_WRITE
        }
    } else {
        abi::OP_READ
    };
    let mut descs = Vec::with_capacity(nr_segments);
    for &(first, last) in &layout {
        // blkfront grants pages read-only for writes when grants are not persistent.
        let (page, gref) = pool.page(writes);
        if writes {
            let len = (usize::from(last - first) + 1) * SECTOR;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            pool.memory.write(page, usize::from(first) * SECTOR, &bytes);
            pending.data.extend_from_slice(&bytes);
        } else {
            pool.memory.write(page, 0, &[0xA5; PAGE_SIZE]);
        }
        pending.segments.push((page, gref, first, last));
        descs.push(SegmentDesc {
            gref,
            first_sect: first,
            last_sect: last,
        });
    }
    let raw = if nr_segments <= abi::MAX_SEGMENTS_PER_REQUEST && rng.chance(80) {
        encode_direct(pending.operation, id, pending.sector, &descs)
    } else {
        let mut grefs = Vec::new();
        for chunk in descs.chunks(abi::SEGMENTS_PER_INDIRECT_PAGE) {
            let (page, gref) = pool.page(true);
            for (i, desc) in chunk.iter().enumerate() {
                pool.memory.write(page, i * 8, &encode_segment(desc));
            }
            pending.indirect.push((page, gref));
            grefs.push(gref);
        }
        // Indirect requests carry only reads and writes.
        if pending.operation == abi::OP_FLUSH_DISKCACHE {
            pending.operation = abi::OP_WRITE;
        }
        encode_indirect(
            pending.operation,
            id,
            pending.sector,
            nr_segments as u16,
            &grefs,
        )
    };
    Some((raw, pending))
}

#[test]
fn fake_blkfront_direct_requests_persistent_one_queue() {
    run_fake_frontend(FakeFrontendConfig {
        queues: 1,
        pollers: 1,
        ring_order: 0,
        persistent: true,
        max_segments: 11,
        depth: 32,
        ops_divisor: 1,
        seed: 1,
        protocol: Protocol::X86_64,
        notify_hold_ns: 0,
        interrupts: false,
    });
}

#[test]
fn fake_blkfront_direct_requests_transient_grants_one_queue() {
    run_fake_frontend(FakeFrontendConfig {
        queues: 1,
        pollers: 1,
        ring_order: 0,
        persistent: false,
        max_segments: 11,
        depth: 32,
        ops_divisor: 1,
        seed: 2,
        protocol: Protocol::X86_64,
        notify_hold_ns: 0,
        interrupts: false,
    });
}

/// Indirect requests and persistent grants on three queues of two-page rings.
fn indirect_persistent_three_queues() -> FakeFrontendConfig {
    FakeFrontendConfig {
        queues: 3,
        pollers: 2,
        ring_order: 1,
        persistent: true,
        max_segments: 32,
        depth: 24,
        ops_divisor: 1,
        seed: 3,
        protocol: Protocol::X86_64,
        notify_hold_ns: 0,
        interrupts: false,
    }
}

#[test]
fn fake_blkfront_indirect_persistent_three_queues_two_pollers() {
    run_fake_frontend(indirect_persistent_three_queues());
}

#[test]
fn fake_blkfront_indirect_transient_two_queues_large_rings() {
    run_fake_frontend(FakeFrontendConfig {
        queues: 2,
        pollers: 1,
        ring_order: 4,
        persistent: false,
        max_segments: 64,
        depth: 48,
        ops_divisor: 1,
        seed: 4,
        protocol: Protocol::X86_64,
        notify_hold_ns: 0,
        interrupts: false,
    });
}

#[test]
fn fake_blkfront_maximal_indirect_requests() {
    run_fake_frontend(FakeFrontendConfig {
        queues: 1,
        pollers: 1,
        ring_order: 2,
        persistent: true,
        max_segments: 512,
        depth: 6,
        ops_divisor: 5,
        seed: 5,
        protocol: Protocol::X86_64,
        notify_hold_ns: 0,
        interrupts: false,
    });
}

/// A frontend that takes responses only when told, against engines that hold events:
/// a held event that never went out would stall a queue.
#[test]
fn fake_blkfront_waiting_for_events_that_are_held_three_queues_two_pollers() {
    run_fake_frontend(FakeFrontendConfig {
        queues: 3,
        pollers: 2,
        ring_order: 0,
        persistent: true,
        max_segments: 32,
        depth: 32,
        ops_divisor: 1,
        seed: 6,
        protocol: Protocol::X86_64,
        notify_hold_ns: 20_000,
        interrupts: true,
    });
}

#[test]
fn fake_blkfront_waiting_for_events_one_queue_at_qd1() {
    run_fake_frontend(FakeFrontendConfig {
        queues: 1,
        pollers: 1,
        ring_order: 0,
        persistent: false,
        max_segments: 11,
        depth: 1,
        ops_divisor: 10,
        seed: 7,
        protocol: Protocol::X86_64,
        notify_hold_ns: 20_000,
        interrupts: true,
    });
}

#[test]
fn fake_32_bit_blkfront_direct_and_indirect_two_queues() {
    // A 32-bit x86 guest's blkfront: every slot in the x86_32 layout, translated on the
    // copy; data, ids and statuses checked as for the others.
    run_fake_frontend(FakeFrontendConfig {
        queues: 2,
        seed: 6,
        protocol: Protocol::X86_32,
        ..indirect_persistent_three_queues()
    });
}
