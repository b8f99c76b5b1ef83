// SPDX-License-Identifier: MIT OR Apache-2.0
//! Large requests: how much one poll takes in, and what the grant cache holds for a
//! ring of them.

use super::{whole_page, Rig};
use crate::abi::{self, RSP_OKAY};
use crate::engine::SEGMENTS_PER_POLL;
use crate::fake::wire::{encode_direct, encode_indirect, encode_segment};

/// `count` pages granted, filled with their number, and an indirect page listing them.
fn indirect_pages<D: blkdev::BlockDevice>(rig: &mut Rig<D>, count: usize) -> u32 {
    let grefs: Vec<u32> = (0..count).map(|i| rig.data_page(i as u8).1).collect();
    let (indirect, indirect_gref) = rig.data_page(0);
    for (i, &gref) in grefs.iter().enumerate() {
        rig.memory.write(
            indirect,
            i * abi::SEGMENT_SIZE,
            &encode_segment(&whole_page(gref)),
        );
    }
    indirect_gref
}

#[test]
fn a_poll_answers_each_one_mib_request_before_it_copies_the_next() {
    let (mut rig, _) = Rig::ram(0, true);
    let indirect = indirect_pages(&mut rig, 256);
    for id in 0..4 {
        rig.front
            .put_request(&encode_indirect(abi::OP_READ, id, 0, 256, &[indirect]));
    }
    rig.front.push_requests();
    // The request budget would take all four: the segment budget takes one per poll, and
    // each poll publishes the response of what it took.
    for id in 0..4 {
        let outcome = rig.engine.poll(64);
        assert_eq!((outcome.consumed, outcome.completed), (1, 1), "poll {id}");
        let responses = rig.responses();
        assert_eq!(responses.len(), 1);
        assert_eq!((responses[0].id, responses[0].status), (id, RSP_OKAY));
    }
    assert!(!rig.engine.poll(64).did_work());
}

#[test]
fn requests_up_to_the_segment_budget_share_one_poll() {
    let (mut rig, _) = Rig::ram(0, true);
    // 32 requests of 8 KiB: 64 segments, well inside the budget.
    let grefs = [rig.data_page(1).1, rig.data_page(2).1];
    for id in 0..32 {
        let segments = [whole_page(grefs[0]), whole_page(grefs[1])];
        rig.front
            .put_request(&encode_direct(abi::OP_READ, id, id * 16, &segments));
    }
    rig.front.push_requests();
    assert_eq!(rig.engine.poll(64).consumed, 32);
    assert_eq!(rig.responses().len(), 32);
    // Requests of 64 segments: the budget's worth in one poll, the rest in the next.
    let indirect = indirect_pages(&mut rig, 64);
    let per_poll = SEGMENTS_PER_POLL / 64;
    for id in 0..per_poll as u64 + 1 {
        rig.front
            .put_request(&encode_indirect(abi::OP_READ, id, 0, 64, &[indirect]));
    }
    rig.front.push_requests();
    assert_eq!(rig.engine.poll(64).consumed, per_poll);
    assert_eq!(rig.engine.poll(64).consumed, 1);
    assert!(rig.responses().iter().all(|r| r.status == RSP_OKAY));
}

#[test]
fn a_full_ring_of_indirect_requests_stays_in_the_grant_cache() {
    use crate::engine::EngineConfig;
    use blkdev::RamDisk;
    // 32 slots of 12 segments plus an indirect page each, every grant its own: 416
    // grants, more than the 384 data segments the ring can carry.
    let config = EngineConfig {
        max_indirect_segments: 12,
        ..EngineConfig::new(0, true)
    };
    let disk = RamDisk::new(super::DISK_SECTORS);
    let mut rig = Rig::new(config, disk.queue(1024));
    assert_eq!(rig.engine.cache_capacity(), 32 * 13);
    let indirect: Vec<u32> = (0..32).map(|_| indirect_pages(&mut rig, 12)).collect();
    for round in 0..3 {
        for (id, &gref) in indirect.iter().enumerate() {
            rig.front
                .put_request(&encode_indirect(abi::OP_READ, id as u64, 0, 12, &[gref]));
        }
        rig.front.push_requests();
        while rig.engine.poll(64).did_work() {}
        let responses = rig.responses();
        assert_eq!(responses.len(), 32, "round {round}");
        assert!(responses.iter().all(|r| r.status == RSP_OKAY));
    }
    let stats = rig.engine.stats();
    assert_eq!(
        (stats.capped_requests, stats.unmap_batches),
        (0, 0),
        "every grant cached, none mapped per request"
    );
    assert_eq!(rig.engine.cached_grants(), 32 * 13);
}
