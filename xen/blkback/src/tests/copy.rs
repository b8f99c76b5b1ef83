// SPDX-License-Identifier: MIT OR Apache-2.0
//! A ring that copies its guest's data (`EngineConfig::grant_copy`, a disk whose device
//! bounces): it maps no grant, data and indirect pages go through grant copies, a copy
//! that fails fails its request alone, and a poll's copies are bounded.

use super::{page_bytes, whole_page, Rig, DISK_SECTORS};
use crate::abi::{self, RSP_ERROR, RSP_OKAY};
use crate::budget::{GrantBudget, GrantLimits, InFlightLimits, RingDemand};
use crate::engine::{EngineConfig, SEGMENTS_PER_POLL};
use crate::fake::wire::{encode_direct, encode_indirect, encode_segment};
use crate::parse::SegmentDesc;
use blkdev::{RamDisk, RamDiskQueue};

/// A RAM disk behind a ring that copies (persistent grants asked for too: ignored).
fn copying_rig() -> Rig<RamDiskQueue> {
    let config = EngineConfig {
        grant_copy: true,
        ..EngineConfig::new(0, true)
    };
    Rig::new(config, RamDisk::new(DISK_SECTORS).queue(1024))
}

/// `grefs` listed in a fresh indirect page; its grant.
fn indirect_page(rig: &mut Rig<RamDiskQueue>, segments: &[SegmentDesc]) -> u32 {
    let (page, gref) = rig.data_page(0);
    for (i, segment) in segments.iter().enumerate() {
        rig.memory
            .write(page, i * abi::SEGMENT_SIZE, &encode_segment(segment));
    }
    gref
}

/// Sectors 2..=5 of `partial`'s page, then all of `full`'s.
fn middle_and_whole(partial: u32, full: u32) -> [SegmentDesc; 2] {
    let middle = SegmentDesc {
        first_sect: 2,
        last_sect: 5,
        ..whole_page(partial)
    };
    [middle, whole_page(full)]
}

fn statuses(rig: &mut Rig<RamDiskQueue>) -> Vec<(u64, i16)> {
    let mut out: Vec<_> = rig.responses().iter().map(|r| (r.id, r.status)).collect();
    out.sort();
    out
}

#[test]
fn a_ring_that_copies_maps_nothing_and_moves_the_right_bytes() {
    let mut rig = copying_rig();
    assert_eq!(
        rig.engine.grant_demand(),
        RingDemand {
            persistent: false,
            request_maps: 0,
            ring_maps: 0,
        }
    );
    // A direct write of sectors 2..=5 of one page and all of another, and an indirect
    // write of three pages.
    let (_, partial) = rig.data_page(0xa1);
    let (_, full) = rig.data_page(0xa2);
    rig.send(&encode_direct(
        abi::OP_WRITE,
        1,
        0,
        &middle_and_whole(partial, full),
    ));
    let sources: Vec<SegmentDesc> = (0..3)
        .map(|i| whole_page(rig.data_page(0xb0 + i).1))
        .collect();
    let indirect = indirect_page(&mut rig, &sources);
    rig.send(&encode_indirect(abi::OP_WRITE, 2, 64, 3, &[indirect]));
    rig.engine.poll(32);
    assert_eq!(statuses(&mut rig), [(1, RSP_OKAY), (2, RSP_OKAY)]);
    // Read both back into fresh pages: the 4 sectors of the partial page land at the
    // same offsets of the page read into, and nothing around them changes.
    let (partial_back, partial_gref) = rig.data_page(0x11);
    let (full_back, full_gref) = rig.data_page(0x12);
    let back = middle_and_whole(partial_gref, full_gref);
    rig.send(&encode_direct(abi::OP_READ, 3, 0, &back));
    let targets: Vec<(usize, u32)> = (0..3).map(|_| rig.data_page(0)).collect();
    let target_segments: Vec<SegmentDesc> = targets.iter().map(|&(_, g)| whole_page(g)).collect();
    let indirect = indirect_page(&mut rig, &target_segments);
    rig.send(&encode_indirect(abi::OP_READ, 4, 64, 3, &[indirect]));
    rig.engine.poll(32);
    assert_eq!(statuses(&mut rig), [(3, RSP_OKAY), (4, RSP_OKAY)]);
    let bytes = page_bytes(&rig.memory, partial_back);
    assert!(bytes[..1024].iter().all(|&b| b == 0x11));
    assert!(bytes[1024..3072].iter().all(|&b| b == 0xa1));
    assert!(bytes[3072..].iter().all(|&b| b == 0x11));
    assert_eq!(
        page_bytes(&rig.memory, full_back),
        vec![0xa2; abi::PAGE_SIZE]
    );
    for (i, &(page, _)) in targets.iter().enumerate() {
        assert_eq!(
            page_bytes(&rig.memory, page),
            vec![0xb0 + i as u8; abi::PAGE_SIZE]
        );
    }
    // Every byte went by grant copy: no map or unmap was ever asked of Xen.
    assert_eq!(rig.table.calls(), (0, 0));
    assert_eq!(rig.table.live_mappings(), (0, 0));
    // One per segment and per indirect page, each way.
    assert_eq!(rig.table.copies(), 2 * (2 + 3 + 1));
    let stats = rig.engine.stats();
    assert_eq!((stats.grants_mapped, stats.map_batches), (0, 0));
    assert_eq!(rig.engine.cache_capacity(), 0);
    rig.engine.disconnect().unwrap();
    assert_eq!(rig.table.calls(), (0, 0));
}

/// A copying ring asks nothing of the grant budget and allocates no grant cache or map
/// batches: what it says it needs is what it takes, and far less than a caching ring.
#[test]
fn a_ring_that_copies_allocates_no_cache_and_asks_no_grants() {
    use crate::engine::Engine;
    use crate::fake::{CountingEvents, GrantTable, GuestMemory, RingView, XenGrants};
    let caching = EngineConfig {
        max_indirect_segments: 512,
        ..EngineConfig::new(4, true)
    };
    let copying = EngineConfig {
        grant_copy: true,
        ..caching
    };
    let nothing = RingDemand {
        persistent: false,
        request_maps: 0,
        ring_maps: 0,
    };
    assert_eq!(copying.grant_demand(), nothing);
    assert!(caching.grant_demand().persistent);
    let needed = copying.memory_needed();
    assert!(
        needed < caching.memory_needed() / 2,
        "{needed} of {}",
        caching.memory_needed()
    );
    let memory = GuestMemory::new(16);
    let (ring, grants) = (
        RingView::new(memory.clone(), (0..16).collect()),
        XenGrants(GrantTable::new(memory)),
    );
    let (queue, events) = (
        RamDisk::new(DISK_SECTORS).queue(512),
        CountingEvents::default(),
    );
    let before = super::counting::held();
    super::counting::reset_peak();
    let engine = Engine::new_within(ring, grants, queue, events, copying, needed)
        .map_err(|refused| refused.error)
        .expect("fits");
    let taken = (super::counting::peak() - before) as usize;
    assert_eq!(taken, needed, "bytes taken against the bytes said");
    assert_eq!(engine.grant_demand(), nothing);
    assert_eq!(engine.cache_capacity(), 0);
}

#[test]
fn a_failed_copy_fails_its_request_alone() {
    let mut rig = copying_rig();
    let grefs: Vec<u32> = (0..6).map(|i| rig.data_page(0x40 + i).1).collect();
    // Writes 10..=12 and reads 20..=22 in one poll; the copies of the middle ones fail,
    // and so do those of a request's indirect page.
    rig.table.fail_copies_of(grefs[1]);
    rig.table.fail_copies_of(grefs[4]);
    for (n, &gref) in grefs[..3].iter().enumerate() {
        let id = 10 + n as u64;
        rig.front.put_request(&encode_direct(
            abi::OP_WRITE,
            id,
            8 * id,
            &[whole_page(gref)],
        ));
    }
    for (n, &gref) in grefs[3..].iter().enumerate() {
        let id = 20 + n as u64;
        rig.front.put_request(&encode_direct(
            abi::OP_READ,
            id,
            8 * id,
            &[whole_page(gref)],
        ));
    }
    let data = whole_page(rig.data_page(0x77).1);
    let bad_indirect = indirect_page(&mut rig, &[data]);
    rig.table.fail_copies_of(bad_indirect);
    rig.front
        .put_request(&encode_indirect(abi::OP_WRITE, 30, 0, 1, &[bad_indirect]));
    let good_indirect = indirect_page(&mut rig, &[data]);
    rig.front
        .put_request(&encode_indirect(abi::OP_WRITE, 31, 0, 1, &[good_indirect]));
    rig.front.push_requests();
    assert_eq!(rig.engine.poll(32).consumed, 8);
    assert_eq!(
        statuses(&mut rig),
        [
            (10, RSP_OKAY),
            (11, RSP_ERROR),
            (12, RSP_OKAY),
            (20, RSP_OKAY),
            (21, RSP_ERROR),
            (22, RSP_OKAY),
            (30, RSP_ERROR),
            (31, RSP_OKAY),
        ]
    );
    assert_eq!(rig.engine.stats().errors, 3);
    assert_eq!(rig.table.calls(), (0, 0));
    assert_eq!(
        rig.engine.stats().in_flight_cap,
        0,
        "no budget, still no mapping"
    );
}

/// However much a guest queues, one poll copies at most the segment budget's worth
/// (plus the requests' indirect pages) and answers it before it takes more, so the
/// guest sees answers while the rest is copied.
#[test]
fn a_poll_copies_at_most_the_segment_budget() {
    let mut rig = copying_rig();
    let segments: Vec<SegmentDesc> = (0..16)
        .map(|i| whole_page(rig.data_page(i as u8).1))
        .collect();
    let indirect = indirect_page(&mut rig, &segments);
    let requests = 3 * SEGMENTS_PER_POLL / 16;
    for id in 0..requests as u64 {
        rig.front
            .put_request(&encode_indirect(abi::OP_WRITE, id, 0, 16, &[indirect]));
    }
    rig.front.push_requests();
    let per_poll = SEGMENTS_PER_POLL / 16;
    for poll in 0..3 {
        let before = rig.table.copies();
        let outcome = rig.engine.poll(64);
        let copies = rig.table.copies() - before;
        assert_eq!(outcome.consumed, per_poll, "poll {poll}");
        assert_eq!(copies, (per_poll * 17) as u64, "poll {poll}");
        assert_eq!(
            rig.responses().len(),
            per_poll,
            "answered in the same poll {poll}"
        );
    }
    assert!(!rig.engine.poll(64).did_work());
}

/// A request larger than the budget still goes, one per poll: 1 MiB requests.
#[test]
fn a_request_above_the_segment_budget_goes_alone_in_its_poll() {
    let mut rig = copying_rig();
    let segments: Vec<SegmentDesc> = (0..256)
        .map(|i| whole_page(rig.data_page(i as u8).1))
        .collect();
    let indirect = indirect_page(&mut rig, &segments);
    for id in 0..4 {
        rig.front
            .put_request(&encode_indirect(abi::OP_WRITE, id, 0, 256, &[indirect]));
    }
    rig.front.push_requests();
    for poll in 0..4 {
        let before = rig.table.copies();
        let outcome = rig.engine.poll(64);
        assert_eq!(outcome.consumed, 1, "poll {poll}");
        assert_eq!(rig.table.copies() - before, 257, "poll {poll}");
    }
    assert_eq!(rig.responses().len(), 4);
    assert!(!rig.engine.poll(64).did_work());
}

/// A ring that copies holds no mapping: a share of nothing for grants in flight (what a
/// copying ring gets from the budget) stops none of its requests.
#[test]
fn a_ring_that_copies_takes_requests_without_a_share_of_grants_in_flight() {
    let mut budget = GrantBudget::with_in_flight(
        GrantLimits::DEFAULT,
        InFlightLimits {
            total: 16,
            per_ring: 16,
            reserve: 0,
        },
    );
    let mut rig = copying_rig();
    let share = budget.join(rig.engine.grant_demand()).unwrap();
    assert_eq!(share.in_flight(), 0);
    rig.engine.set_grant_share(share);
    let grefs: Vec<u32> = (0..11).map(|i| rig.data_page(i).1).collect();
    let segments: Vec<SegmentDesc> = grefs.iter().map(|&g| whole_page(g)).collect();
    for id in 0..16 {
        rig.front
            .put_request(&encode_direct(abi::OP_READ, id, 0, &segments));
    }
    rig.front.push_requests();
    let consumed: usize = (0..4).map(|_| rig.engine.poll(64).consumed).sum();
    assert_eq!(consumed, 16);
    assert_eq!(rig.responses().len(), 16);
    assert_eq!(rig.engine.stats().grant_waits, 0);
    // It maps none, so it reports a bound of none (not the unbounded credit it holds).
    assert_eq!(rig.engine.stats().in_flight_cap, 0);
}
