// SPDX-License-Identifier: MIT OR Apache-2.0
//! The hot path allocates nothing: after set-up, polling a busy ring (persistent and
//! transient grants, direct and indirect requests, errors, completions, notifications,
//! a cap that moves, credit for grants in flight taken and given back, idle grants
//! released, I/O limits holding requests back and changing) makes no heap allocation
//! on the polling thread.

use blkback::abi;
use blkback::budget::{GrantBudget, GrantLimits, InFlightLimits};
use blkback::engine::{Engine, EngineConfig};
use blkback::fake::wire::{encode_direct, encode_indirect, encode_segment};
use blkback::fake::{CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, XenGrants};
use blkback::limits::{IoLimits, Rates};
use blkback::parse::SegmentDesc;
use blkdev::RamDisk;

mod common;
use common::counting_alloc::{allocations, ALLOCATIONS};

#[test]
fn polling_allocates_nothing() {
    // Persistent grants, grants mapped per request, and a ring that copies.
    for (persistent, grant_copy) in [(true, false), (false, false), (false, true)] {
        let order = 1;
        let memory = GuestMemory::new(2 + 64);
        let table = GrantTable::new(memory.clone());
        for gref in 1..=60u32 {
            table.grant(gref, 1 + gref as usize, false);
        }
        table.fail_maps_of(60);
        table.fail_copies_of(60);
        let disk = RamDisk::new(4096);
        let mut front = FrontRing::new(RingView::new(memory.clone(), vec![0, 1]), order);
        let config = EngineConfig {
            persistent_grant_limit: Some(24),
            idle_release_ns: 1_000,
            grant_copy,
            ..EngineConfig::new(order, persistent)
        };
        let mut engine = Engine::new(
            RingView::new(memory.clone(), vec![0, 1]),
            XenGrants(table.clone()),
            disk.queue(64),
            CountingEvents::default(),
            config,
        )
        .unwrap();
        // Room in flight for two requests of 512 segments alone, one with another ring
        // (which comes and goes below): the ring's credit moves both ways.
        let mut budget = GrantBudget::with_in_flight(
            GrantLimits {
                max_total: 40,
                ..GrantLimits::default()
            },
            InFlightLimits {
                total: 2560,
                per_ring: 2048,
                reserve: 512,
            },
        );
        let demand = engine.grant_demand();
        engine.set_grant_share(budget.join(demand).unwrap());
        // 100,000 requests and 200 MiB a second with a 1 ms burst: after the first
        // hundred, a request every 10 us (16 loops below), and limits that change.
        let limits = |iops| IoLimits {
            iops: Rates {
                total: iops,
                ..Rates::default()
            },
            bytes: Rates {
                total: 200 << 20,
                ..Rates::default()
            },
            burst_ms: 1,
        };
        engine.set_limits(&limits(100_000));
        // Descriptors of an indirect request in the page of gref 50.
        for i in 0..20u32 {
            let seg = SegmentDesc {
                gref: 1 + i % 40,
                first_sect: 0,
                last_sect: 7,
            };
            memory.write(51, i as usize * 8, &encode_segment(&seg));
        }
        let mut requests = Vec::new();
        for id in 0..400u64 {
            let gref = 1 + (id as u32 * 7) % 40;
            let raw = match id % 8 {
                0 => encode_indirect(abi::OP_WRITE, id, 64, 20, &[50]),
                1 => encode_direct(
                    abi::OP_READ,
                    id,
                    0,
                    &[SegmentDesc {
                        gref: 60,
                        first_sect: 0,
                        last_sect: 7,
                    }],
                ),
                2 => encode_direct(9, id, 0, &[]),
                3 => encode_direct(abi::OP_FLUSH_DISKCACHE, id, 0, &[]),
                _ => encode_direct(
                    abi::OP_READ,
                    id,
                    id % 256 * 8,
                    &[SegmentDesc {
                        gref,
                        first_sect: 0,
                        last_sect: 7,
                    }],
                ),
            };
            requests.push(raw);
        }
        let mut answered = 0;
        let mut next = 0;
        let mut now = 0;
        let mut other = None;
        let mut loops = 0u32;
        let before = allocations();
        while answered < requests.len() {
            // Another ring joins and leaves now and then (on the test thread: the
            // control path's allocation is not the poller's, but counted here).
            loops += 1;
            if loops.is_multiple_of(5) {
                let after_control = allocations();
                match other.take() {
                    None => other = Some(budget.join(demand).unwrap()),
                    Some(share) => budget.leave(&share),
                }
                ALLOCATIONS.with(|count| count.set(after_control));
            }
            now += 600;
            engine.tick(now);
            match loops % 1000 {
                0 => engine.set_limits(&limits(50_000)),
                500 => engine.set_limits(&limits(100_000)),
                _ => {}
            }
            while next < requests.len() && front.free_slots() > 0 {
                front.put_request(&requests[next]);
                next += 1;
            }
            front.push_requests();
            front.arm_response_event();
            engine.poll(13);
            answered += front.take_responses(|_| ());
        }
        let during = allocations() - before;
        assert_eq!(
            during, 0,
            "persistent={persistent} copy={grant_copy}: {during} allocations while polling"
        );
        let stats = engine.stats();
        assert!(stats.errors > 0);
        assert_eq!(stats.map_batches > 0, !grant_copy, "{stats:?}");
        if grant_copy {
            assert!(table.copies() > 0);
        }
        assert!(stats.throttle_waits > 200, "{stats:?}");
        if persistent {
            assert!(
                stats.idle_released > 0 && stats.cap_evicted > 0,
                "{stats:?}"
            );
        }
    }
}
