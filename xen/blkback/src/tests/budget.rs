// SPDX-License-Identifier: MIT OR Apache-2.0
//! The domain's grant budget and idle release, against engines over the fake Xen: caps
//! shared between rings, eviction when a share shrinks, I/O beyond the cap, grants
//! unmapped after the idle timeout and never while a request pins them; grants of
//! requests in flight bounded for the domain, with every request answered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use blkdev::{NullDisk, RamDisk, RamDiskQueue};

use super::{page_bytes, whole_page, Rig, DISK_SECTORS};
use crate::abi::{self, RSP_OKAY};
use crate::budget::{GrantBudget, GrantLimits, GrantShare, InFlightLimits};
use crate::engine::{Engine, EngineConfig};
use crate::fake::wire::{encode_direct, encode_indirect, encode_segment};
use crate::fake::{
    null_disk, CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, ShufflingDevice,
    XenGrants,
};
use crate::parse::SegmentDesc;
use crate::ring::Response;

const SECOND: u64 = 1_000_000_000;

/// A ring with persistent grants on a RAM disk whose 4 KiB block `n` is filled with
/// byte `n`.
fn persistent_ring(disk: &RamDisk, config: EngineConfig) -> Rig<RamDiskQueue> {
    Rig::new(config, disk.queue(1024))
}

/// Persistent grants at ring order 0, unmapped after 10 s unused.
fn idle_after_10_s() -> EngineConfig {
    EngineConfig {
        idle_release_ns: 10 * SECOND,
        ..EngineConfig::new(0, true)
    }
}

fn patterned_disk() -> RamDisk {
    let disk = RamDisk::new(DISK_SECTORS);
    for block in 0..DISK_SECTORS / 8 {
        disk.write_at(block as usize * 4096, &[block as u8; 4096]);
    }
    disk
}

/// Reads of whole blocks into the pages behind `grefs` (block `i` into the page of
/// `grefs[i]`), in requests of up to 11 segments, each polled; every answer must be OK
/// and every page must hold its block after.
fn read_blocks(rig: &mut Rig<RamDiskQueue>, pages: &[(usize, u32)], id: &mut u64) {
    for (chunk_index, chunk) in pages.chunks(11).enumerate() {
        let first_block = (chunk_index * 11) as u64;
        let segments: Vec<SegmentDesc> = chunk.iter().map(|&(_, g)| whole_page(g)).collect();
        for &(page, _) in chunk {
            rig.memory.fill(page, 0xEE);
        }
        rig.send(&encode_direct(
            abi::OP_READ,
            *id,
            first_block * 8,
            &segments,
        ));
        *id += 1;
        rig.engine.poll(8);
        let responses = rig.responses();
        assert_eq!(responses.len(), 1);
        assert_eq!(responses[0].status, RSP_OKAY);
        for (i, &(page, _)) in chunk.iter().enumerate() {
            let block = first_block + i as u64;
            assert_eq!(
                page_bytes(&rig.memory, page),
                vec![block as u8; 4096],
                "block {block}"
            );
        }
    }
}

fn grant_pages(rig: &mut Rig<RamDiskQueue>, count: usize) -> Vec<(usize, u32)> {
    (0..count).map(|_| rig.data_page(0)).collect()
}

/// Ring order 4, requests of 11 segments at most: unmap batches of 256.
fn order_4_direct_only(idle_release_ns: u64) -> EngineConfig {
    EngineConfig {
        max_indirect_segments: 11,
        idle_release_ns,
        ..EngineConfig::new(4, true)
    }
}

/// Cache `count` (257..=512) grants in `rig` (ring order 4): 256 pages, then the rest
/// again under second grefs (two grefs may name one page). Oldest first.
fn cache_many(rig: &mut Rig<RamDiskQueue>, count: usize) -> Vec<(usize, u32)> {
    let mut pages = grant_pages(rig, 256);
    for i in 0..count - 256 {
        let page = pages[i].0;
        let gref = 10_000 + i as u32;
        rig.table.grant(gref, page, false);
        pages.push((page, gref));
    }
    let mut id = 0;
    // Blocks 0..255, then 0.. again through the second grefs.
    read_blocks(rig, &pages[..256], &mut id);
    read_blocks(rig, &pages[256..], &mut id);
    assert_eq!(rig.engine.cached_grants(), count);
    pages
}

#[test]
fn the_budget_caps_every_ring_and_all_rings_together() {
    let disk = patterned_disk();
    let limits = GrantLimits {
        max_total: 100,
        max_per_ring: 64,
        idle_secs: 60,
    };
    let mut budget = GrantBudget::new(limits);
    let mut rings: Vec<Rig<RamDiskQueue>> = Vec::new();
    let mut pages = Vec::new();
    for _ in 0..5 {
        let mut rig = persistent_ring(&disk, EngineConfig::new(0, true));
        rig.engine
            .set_grant_share(budget.join(rig.engine.grant_demand()).unwrap());
        pages.push(grant_pages(&mut rig, 60));
        rings.push(rig);
    }
    let mut id = 0;
    for round in 0..3 {
        for (rig, pages) in rings.iter_mut().zip(&pages) {
            read_blocks(rig, pages, &mut id);
            assert!(rig.engine.cached_grants() <= 20, "round {round}");
        }
        let mapped: usize = rings.iter().map(|r| r.table.live_mappings().0).sum();
        assert!(mapped <= 100, "round {round}: {mapped} grants mapped");
    }
    for rig in &rings {
        let stats = rig.engine.stats();
        assert_eq!((stats.grant_cap, stats.persistent_grants), (20, 20));
        // The first 20 grants stay cached and hit; the other 40 are mapped per request:
        // requests 2..=6 of each round (request 1 holds grants 0..11 only).
        assert_eq!(stats.capped_requests, 3 * 5);
        // Nothing beyond the cache stays mapped once answered.
        assert_eq!(rig.table.live_mappings().0, 20);
        // A request's worth of per-request maps at most, on top of the cache.
        assert!(rig.table.live_mappings().1 <= 20 + 11);
    }
    // A sixth ring: every cap drops to 16 and each ring is down to it after a poll.
    let mut sixth = persistent_ring(&disk, EngineConfig::new(0, true));
    sixth
        .engine
        .set_grant_share(budget.join(sixth.engine.grant_demand()).unwrap());
    let sixth_pages = grant_pages(&mut sixth, 60);
    read_blocks(&mut sixth, &sixth_pages, &mut id);
    rings.push(sixth);
    for rig in &mut rings {
        rig.engine.poll(8);
        assert!(rig.engine.cached_grants() <= 16);
    }
    let mapped: usize = rings.iter().map(|r| r.table.live_mappings().0).sum();
    assert_eq!(mapped, 6 * 16);
}

#[test]
fn a_ring_whose_share_shrinks_evicts_down_to_it_in_bounded_batches() {
    let disk = patterned_disk();
    let mut rig = persistent_ring(&disk, order_4_direct_only(0));
    let mut budget = GrantBudget::new(GrantLimits {
        max_total: 400,
        ..GrantLimits::default()
    });
    let demand = rig.engine.grant_demand();
    rig.engine.set_grant_share(budget.join(demand).unwrap());
    let pages = cache_many(&mut rig, 400);
    // Three more rings join: the share drops to 100. Nothing moves before the poll.
    let others: Vec<GrantShare> = (0..3).map(|_| budget.join(demand).unwrap()).collect();
    assert_eq!(others[0].cap(), 100);
    assert_eq!(rig.engine.cached_grants(), 400);
    let unmap_calls = rig.table.calls().1;
    // One batch per poll: 256, then the last 44.
    rig.engine.poll(8);
    assert_eq!(rig.engine.cached_grants(), 400 - 256);
    rig.engine.poll(8);
    assert_eq!(rig.engine.cached_grants(), 100);
    assert_eq!(rig.table.calls().1, unmap_calls + 2);
    assert_eq!(rig.table.live_mappings().0, 100);
    let stats = rig.engine.stats();
    assert_eq!((stats.cap_evicted, stats.grant_cap), (300, 100));
    // The ones kept are the most recently used: reading them again maps nothing.
    let maps = rig.table.calls().0;
    let kept: Vec<(usize, u32)> = pages[300..400].to_vec();
    for (n, chunk) in kept.chunks(10).enumerate() {
        let segments: Vec<SegmentDesc> = chunk.iter().map(|&(_, g)| whole_page(g)).collect();
        rig.send(&encode_direct(abi::OP_READ, 9000 + n as u64, 0, &segments));
        rig.engine.poll(8);
    }
    assert!(rig.responses().iter().all(|r| r.status == RSP_OKAY));
    assert_eq!(rig.table.calls().0, maps, "the kept grants hit");
    // The others leave: everyone may grow again, nothing is mapped back unasked.
    for other in &others {
        budget.leave(other);
    }
    rig.engine.poll(8);
    assert_eq!(rig.engine.stats().grant_cap, 400);
    assert_eq!(rig.engine.cached_grants(), 100);
}

#[test]
fn io_beyond_the_cap_completes_with_per_request_maps_and_the_right_data() {
    let disk = RamDisk::new(DISK_SECTORS);
    let mut rig = persistent_ring(&disk, EngineConfig::new(0, true));
    rig.engine.set_grant_share(GrantShare::fixed(4));
    let sources = grant_pages(&mut rig, 44);
    for (i, &(page, _)) in sources.iter().enumerate() {
        rig.memory.fill(page, i as u8 + 1);
    }
    // Four writes of 11 pages each to blocks 0..44.
    for (n, chunk) in sources.chunks(11).enumerate() {
        let segments: Vec<SegmentDesc> = chunk.iter().map(|&(_, g)| whole_page(g)).collect();
        rig.send(&encode_direct(
            abi::OP_WRITE,
            n as u64,
            n as u64 * 88,
            &segments,
        ));
        rig.engine.poll(8);
        assert!(rig.engine.cached_grants() <= 4);
        assert!(rig.table.live_mappings().0 <= 4);
    }
    assert!(rig.responses().iter().all(|r| r.status == RSP_OKAY));
    let mut written = vec![0u8; 44 * 4096];
    disk.read_at(0, &mut written);
    for (block, bytes) in written.chunks(4096).enumerate() {
        assert_eq!(bytes, &[block as u8 + 1; 4096][..], "block {block}");
    }
    // Read everything back into fresh pages.
    let targets = grant_pages(&mut rig, 44);
    for (n, chunk) in targets.chunks(11).enumerate() {
        let segments: Vec<SegmentDesc> = chunk.iter().map(|&(_, g)| whole_page(g)).collect();
        rig.send(&encode_direct(
            abi::OP_READ,
            100 + n as u64,
            n as u64 * 88,
            &segments,
        ));
        rig.engine.poll(8);
    }
    assert!(rig.responses().iter().all(|r| r.status == RSP_OKAY));
    for (block, &(page, _)) in targets.iter().enumerate() {
        assert_eq!(page_bytes(&rig.memory, page), vec![block as u8 + 1; 4096]);
    }
    let stats = rig.engine.stats();
    assert_eq!(stats.capped_requests, 8, "every request met the cap");
    assert_eq!((stats.persistent_grants, stats.grants_mapped), (4, 4));
    // The frontend can take back every grant beyond the cached four.
    let revocable = sources
        .iter()
        .chain(&targets)
        .filter(|&&(_, gref)| rig.table.end_access(gref))
        .count();
    assert_eq!(revocable, 88 - 4);
}

#[test]
fn idle_grants_are_unmapped_after_the_timeout_and_not_before() {
    let disk = patterned_disk();
    let config = idle_after_10_s();
    let mut rig = persistent_ring(&disk, config);
    let pages = grant_pages(&mut rig, 22);
    let t0 = 1_000 * SECOND;
    let mut id = 0;
    assert_eq!(rig.engine.tick(t0), 0);
    read_blocks(&mut rig, &pages, &mut id);
    assert_eq!(rig.engine.cached_grants(), 22);
    // Eleven of them are used again 5 s later.
    assert_eq!(rig.engine.tick(t0 + 5 * SECOND), 0);
    read_blocks(&mut rig, &pages[..11], &mut id);
    // One nanosecond short of the timeout: nothing goes.
    assert_eq!(rig.engine.tick(t0 + 10 * SECOND - 1), 0);
    assert_eq!(rig.table.live_mappings().0, 22);
    // At the timeout the eleven unused since t0 go, the others stay.
    assert_eq!(rig.engine.tick(t0 + 10 * SECOND), 11);
    assert_eq!(rig.table.live_mappings().0, 11);
    assert!(pages[11..].iter().all(|&(_, g)| rig.table.maps_of(g) == 0));
    assert_eq!(rig.engine.tick(t0 + 15 * SECOND - 1), 0);
    assert_eq!(rig.engine.tick(t0 + 15 * SECOND), 11);
    assert_eq!(rig.table.live_mappings().0, 0);
    let stats = rig.engine.stats();
    assert_eq!((stats.idle_released, stats.persistent_grants), (22, 0));
    // The frontend's grants all come back; using them again maps them again.
    read_blocks(&mut rig, &pages[..11], &mut id);
    assert_eq!(rig.engine.cached_grants(), 11);

    // Many idle at once: one unmap batch per tick.
    let mut rig = persistent_ring(&disk, order_4_direct_only(10 * SECOND));
    rig.engine.tick(t0);
    cache_many(&mut rig, 300);
    let unmap_calls = rig.table.calls().1;
    assert_eq!(rig.engine.tick(t0 + 10 * SECOND), 256);
    assert_eq!(rig.engine.tick(t0 + 10 * SECOND), 44);
    assert_eq!(rig.table.calls().1, unmap_calls + 2);
    assert_eq!(rig.table.live_mappings().0, 0);

    // With the timeout 0 nothing is ever released.
    let config = EngineConfig {
        idle_release_ns: 0,
        ..EngineConfig::new(0, true)
    };
    let mut rig = persistent_ring(&disk, config);
    let pages = grant_pages(&mut rig, 11);
    rig.engine.tick(t0);
    read_blocks(&mut rig, &pages, &mut id);
    assert_eq!(rig.engine.tick(u64::MAX), 0);
    assert_eq!(rig.table.live_mappings().0, 11);
}

#[test]
fn a_grant_pinned_by_a_request_in_flight_is_never_released() {
    let disk = patterned_disk();
    let config = idle_after_10_s();
    let device = ShufflingDevice::new(disk.queue(64), 7, 100);
    let hold = device.hold.clone();
    let mut rig = Rig::new(config, device);
    let (page_a, a) = rig.data_page(0);
    let (page_b, b) = rig.data_page(0);
    let t0 = 50 * SECOND;
    rig.engine.tick(t0);
    // a is used and left idle at t0.
    rig.send(&encode_direct(abi::OP_READ, 1, 0, &[whole_page(a)]));
    rig.engine.poll(8);
    assert_eq!(rig.responses().len(), 1);
    // 9 s later a request pins a again, with b; the device holds it.
    rig.engine.tick(t0 + 9 * SECOND);
    hold.store(true, Ordering::SeqCst);
    rig.send(&encode_direct(
        abi::OP_READ,
        2,
        8,
        &[whole_page(a), whole_page(b)],
    ));
    rig.engine.poll(8);
    assert_eq!(rig.engine.in_flight(), 1);
    // Long past the timeout of a's last use, and of b's insertion: both stay mapped.
    for later in [10, 60, 3600] {
        assert_eq!(rig.engine.tick(t0 + later * SECOND), 0, "{later} s");
        assert_eq!((rig.table.maps_of(a), rig.table.maps_of(b)), (1, 1));
    }
    // Nor does a cap of 0 take them.
    rig.engine.set_grant_share(GrantShare::fixed(0));
    rig.engine.poll(8);
    assert_eq!((rig.table.maps_of(a), rig.table.maps_of(b)), (1, 1));
    assert_eq!(rig.engine.stats().cap_evicted, 0);
    // The request completes with the right data; then the cap takes them.
    hold.store(false, Ordering::SeqCst);
    rig.engine.set_grant_share(GrantShare::fixed(2));
    while rig.engine.in_flight() > 0 {
        rig.engine.poll(8);
    }
    assert_eq!(rig.responses()[0].status, RSP_OKAY);
    assert_eq!(page_bytes(&rig.memory, page_a), vec![1; 4096]);
    assert_eq!(page_bytes(&rig.memory, page_b), vec![2; 4096]);
    // Unpinned at t0 + 3600 s: idle from then.
    assert_eq!(rig.engine.tick(t0 + 3609 * SECOND), 0);
    assert_eq!(rig.engine.tick(t0 + 3610 * SECOND), 2);
    assert_eq!(rig.table.live_mappings().0, 0);
}

/// Guests' rings over one fake grant table, so its live mappings are all the domain
/// has mapped: each a ring of 32 slots without persistent grants, on a device that
/// holds its completions while told to, sending reads of 512 segments (2 MiB) through
/// one indirect page.
struct Domain {
    table: Arc<GrantTable>,
    memory: Arc<GuestMemory>,
    budget: GrantBudget,
    guests: Vec<Guest>,
}

struct Guest {
    front: FrontRing,
    engine: Engine<RingView, XenGrants, ShufflingDevice<NullDisk>, CountingEvents>,
    share: GrantShare,
    hold: Arc<AtomicBool>,
    sent: u64,
    answers: Vec<Response>,
}

/// The indirect page's grant: it lists grants 1000..1512 (writable data pages).
const INDIRECT_GREF: u32 = 999;
const GUESTS_MAX: usize = 8;

impl Domain {
    fn new(in_flight: InFlightLimits) -> Self {
        let data = GUESTS_MAX;
        let memory = GuestMemory::new(GUESTS_MAX + abi::MAX_INDIRECT_SEGMENTS as usize + 1);
        let table = GrantTable::new(memory.clone());
        let indirect = data + abi::MAX_INDIRECT_SEGMENTS as usize;
        table.grant(INDIRECT_GREF, indirect, true);
        for i in 0..abi::MAX_INDIRECT_SEGMENTS as usize {
            let gref = 1000 + i as u32;
            table.grant(gref, data + i, false);
            let segment = encode_segment(&whole_page(gref));
            memory.write(indirect, i * abi::SEGMENT_SIZE, &segment);
        }
        Domain {
            table,
            memory,
            budget: GrantBudget::with_in_flight(GrantLimits::DEFAULT, in_flight),
            guests: Vec::new(),
        }
    }

    /// A guest connects (its ring joins the budget); returns its index.
    fn connect(&mut self) -> usize {
        let page = self.guests.len();
        let ring = || RingView::new(self.memory.clone(), vec![page]);
        let front = FrontRing::new(ring(), 0);
        let device = ShufflingDevice::new(null_disk(64), page as u64, 50);
        let hold = device.hold.clone();
        hold.store(true, Ordering::SeqCst);
        let mut engine = Engine::new(
            ring(),
            XenGrants(self.table.clone()),
            device,
            CountingEvents::default(),
            EngineConfig::new(0, false),
        )
        .unwrap();
        let share = self.budget.join(engine.grant_demand()).unwrap();
        engine.set_grant_share(share.clone());
        self.guests.push(Guest {
            front,
            engine,
            share,
            hold,
            sent: 0,
            answers: Vec::new(),
        });
        page
    }

    /// Guest `g` sends `count` reads of 512 segments.
    fn send(&mut self, g: usize, count: usize) {
        let guest = &mut self.guests[g];
        for _ in 0..count {
            let raw = encode_indirect(abi::OP_READ, guest.sent, 0, 512, &[INDIRECT_GREF]);
            guest.front.put_request(&raw);
            guest.sent += 1;
        }
        guest.front.push_requests();
    }

    /// Poll guest `g`'s ring once, take its answers, and check that the domain never
    /// had more mapped than its budget for grants in flight.
    fn poll(&mut self, g: usize) {
        let guest = &mut self.guests[g];
        guest.engine.poll(64);
        let answers = &mut guest.answers;
        guest.front.take_responses(|r| answers.push(r));
        let (live, peak) = self.table.live_mappings();
        let total = self.budget.in_flight_limits().total as usize;
        assert!(peak <= total, "{peak} grants mapped at once (now {live})");
    }

    fn poll_all(&mut self, rounds: usize) {
        for _ in 0..rounds {
            for g in 0..self.guests.len() {
                self.poll(g);
            }
        }
    }

    fn release(&mut self, g: usize) {
        self.guests[g].hold.store(false, Ordering::SeqCst);
    }

    /// Poll every ring until each guest but `except` has all its answers, all OK.
    fn answer_all_but(&mut self, except: usize) {
        let mut rounds = 0;
        while self
            .guests
            .iter()
            .enumerate()
            .any(|(g, guest)| g != except && guest.answers.len() < guest.sent as usize)
        {
            self.poll_all(1);
            rounds += 1;
            assert!(rounds < 10_000, "requests left unanswered");
        }
        for guest in &self.guests {
            assert!(guest.answers.iter().all(|r| r.status == RSP_OKAY));
        }
    }

    fn in_flight(&self, g: usize) -> usize {
        self.guests[g].engine.in_flight()
    }
}

#[test]
fn rings_full_of_large_requests_never_map_more_than_the_domains_budget_and_all_are_answered() {
    // Four guests' rings, 32 requests of 512 segments each (16,384 grants per ring),
    // under a budget of 4,608 grants in flight (512 kept in reserve): each ring gets
    // 1,024, two requests at a time.
    let mut domain = Domain::new(InFlightLimits {
        total: 4608,
        per_ring: 2048,
        reserve: 512,
    });
    for _ in 0..4 {
        let g = domain.connect();
        domain.send(g, 32);
    }
    domain.poll_all(40);
    for g in 0..4 {
        let guest = &domain.guests[g];
        assert_eq!(domain.in_flight(g), 2, "guest {g}");
        assert_eq!(guest.share.in_flight(), 1024);
        assert!(guest.engine.waits_for_grants());
        let stats = guest.engine.stats();
        assert_eq!((stats.in_flight_cap, stats.grant_waits), (1024, 1));
        assert!(guest.answers.is_empty());
    }
    assert_eq!(domain.table.live_mappings(), (4096, 4096));
    // The devices answer, out of order: every request is taken in turn and answered.
    for g in 0..4 {
        domain.release(g);
    }
    domain.answer_all_but(usize::MAX);
    for guest in &domain.guests {
        let mut ids: Vec<u64> = guest.answers.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..32).collect::<Vec<u64>>());
        let stats = guest.engine.stats();
        assert_eq!((stats.errors, stats.reads), (0, 32));
    }
    assert_eq!(domain.table.live_mappings(), (0, 4096));
    // The credit the rings hold and the pool's add up to the budget.
    let held: u32 = domain
        .guests
        .iter()
        .map(|g| g.engine.stats().in_flight_cap as u32)
        .sum();
    assert_eq!(held + domain.budget.in_flight_free(), 4608);
}

#[test]
fn another_guest_connects_and_is_served_while_the_first_holds_its_share() {
    let mut domain = Domain::new(InFlightLimits {
        total: 2560,
        per_ring: 1024,
        reserve: 512,
    });
    // The first guest's ring is full, its device holds what it took: two requests,
    // all of its share. It may sleep: its own requests on the device give back.
    let first = domain.connect();
    domain.send(first, 32);
    domain.poll_all(10);
    assert_eq!(domain.in_flight(first), 2);
    assert!(domain.guests[first].engine.waits_for_grants());
    assert!(domain.guests[first].engine.prepare_to_sleep());
    // A second guest connects and is served at once, from the pool.
    let second = domain.connect();
    domain.release(second);
    domain.send(second, 4);
    domain.answer_all_but(first);
    // A third: every share drops to 682, the first still has 1,024 on its device. The
    // second gives back what it does not use, and the third, holding less than a
    // request's worth, may take from the reserve: it is served too.
    let third = domain.connect();
    domain.release(third);
    domain.send(third, 4);
    domain.answer_all_but(first);
    // A fourth, with the reserve taken: it takes what the pool has, not a request's
    // worth, so it waits with nothing in flight and keeps its poller polling (no
    // sleep, no error) until the others give back.
    let fourth = domain.connect();
    domain.release(fourth);
    domain.send(fourth, 4);
    domain.poll(fourth);
    let waiting = &mut domain.guests[fourth];
    assert!(waiting.engine.waits_for_grants());
    assert_eq!(waiting.engine.in_flight(), 0);
    assert!(!waiting.engine.prepare_to_sleep());
    domain.answer_all_but(first);
    // The first guest's device answers: it is served to the end.
    assert!(domain.guests[first].answers.is_empty());
    domain.release(first);
    domain.answer_all_but(usize::MAX);
    assert_eq!(domain.table.live_mappings().0, 0);
}
