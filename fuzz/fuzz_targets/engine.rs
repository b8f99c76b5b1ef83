// SPDX-License-Identifier: MIT OR Apache-2.0
//! The whole engine against a hostile frontend: the input is a script of ring writes,
//! producer-index games, indirect-page and grant tampering, device stalls, polls, the
//! ring's grant cap moving while time passes (idle release), and I/O limits set,
//! changed and lifted (requests held back, never failed, answered at teardown).
//! The engine must not panic, must keep the ring invariants, must respect the grant
//! bound, and must end with nothing mapped after a disconnect.
#![no_main]

use std::sync::atomic::Ordering;

use blkback::abi::{self, sring, REQUEST_SIZE};
use blkback::budget::GrantShare;
use blkback::engine::{Engine, EngineConfig};
use blkback::fake::{
    CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, ShufflingDevice, XenGrants,
};
use blkback::limits::{IoLimits, Rates};
use blkback::ring::RingMemory;
use blkdev::RamDisk;
use libfuzzer_sys::fuzz_target;

/// Reads the script.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([
            self.byte()?,
            self.byte()?,
            self.byte()?,
            self.byte()?,
        ]))
    }
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.byte()?;
        }
        Some(out)
    }
}

const DATA_PAGES: usize = 12;

fuzz_target!(|data: &[u8]| {
    let mut script = Script(data);
    let Some(setup) = script.byte() else { return };
    let order = u32::from(setup % 3);
    let persistent = setup & 4 != 0;
    let limit = (setup & 8 != 0).then_some(6);
    // Notification moderation, on the clock that ticks and polls advance.
    let hold_ns = if setup & 16 != 0 { 2_000 } else { 0 };
    let ring_pages = 1usize << order;
    let memory = GuestMemory::new(ring_pages + DATA_PAGES);
    let table = GrantTable::new(memory.clone());
    // Grefs 1..=12 name the data pages; odd ones read-only; gref 5 always fails to map.
    for i in 0..DATA_PAGES {
        table.grant(i as u32 + 1, ring_pages + i, i % 2 == 1);
    }
    table.fail_maps_of(5);
    let disk = RamDisk::new(256);
    let device = ShufflingDevice::new(disk.queue(8), u64::from(setup), 50);
    let hold = device.hold.clone();
    let pages: Vec<usize> = (0..ring_pages).collect();
    let mut front = FrontRing::new(RingView::new(memory.clone(), pages.clone()), order);
    let config = EngineConfig {
        max_indirect_segments: 64,
        persistent_grant_limit: limit,
        idle_release_ns: 1_000_000_000,
        notify_hold_ns: hold_ns,
        ..EngineConfig::new(order, persistent)
    };
    let mut engine = Engine::new(
        RingView::new(memory.clone(), pages),
        XenGrants(table.clone()),
        device,
        CountingEvents::default(),
        config,
    )
    .expect("engine");
    let slots = abi::ring_slots(order);
    let mut now = 0u64;
    // I/O limits: `iops` requests a second (0: none) and 1 MiB/s of writes, 1 ms burst.
    let limits = |iops: u64| IoLimits {
        iops: Rates {
            total: iops,
            ..Rates::default()
        },
        bytes: Rates {
            write: if iops == 0 { 0 } else { 1 << 20 },
            ..Rates::default()
        },
        burst_ms: 1,
    };
    if setup & 32 != 0 {
        engine.set_limits(&limits(1000));
    }

    while let Some(action) = script.byte() {
        match action % 8 {
            // A raw request into the next slot, published.
            0 | 1 => {
                let Some(raw) = script.bytes::<REQUEST_SIZE>() else {
                    break;
                };
                if front.free_slots() > 0 {
                    front.put_request(&raw);
                    front.push_requests();
                }
            }
            // A raw request at any slot and any producer index.
            2 => {
                let (Some(index), Some(prod), Some(raw)) =
                    (script.u32(), script.u32(), script.bytes::<REQUEST_SIZE>())
                else {
                    break;
                };
                front.put_request_at(index, &raw);
                front.set_req_prod(prod);
            }
            // Scribble over a data page (indirect descriptors live there too).
            3 => {
                let (Some(page), Some(offset), Some(bytes)) =
                    (script.byte(), script.byte(), script.bytes::<16>())
                else {
                    break;
                };
                let page = ring_pages + usize::from(page) % DATA_PAGES;
                memory.write(page, usize::from(offset) * 16 % 4096, &bytes);
            }
            4 => hold.store(script.byte().unwrap_or(0) & 1 == 1, Ordering::SeqCst),
            5 => {
                let Some(value) = script.u32() else { break };
                front.set_rsp_event(value);
            }
            // The cap moves (as other rings come and go), time passes.
            7 => {
                let Some(step) = script.byte() else { break };
                if step & 1 == 1 {
                    engine.set_grant_share(GrantShare::fixed(u32::from(step >> 1) % 12));
                }
                if step & 0x80 != 0 {
                    engine.set_limits(&limits(u64::from(step & 0x3f) * 200));
                }
                now += u64::from(step) * 50_000_000;
                engine.tick(now);
            }
            _ => {
                let budget = usize::from(script.byte().unwrap_or(1) % 40);
                now += u64::from(script.byte().unwrap_or(0)) * 50;
                engine.poll_at(budget, now);
                front.take_responses(|_| ());
                if let Some(deadline) = engine.notify_deadline() {
                    assert!(
                        deadline > now && deadline <= now + hold_ns,
                        "a held notification outlives its window"
                    );
                }
            }
        }
        let ring = engine.ring();
        assert!(
            ring.req_cons().wrapping_sub(ring.rsp_prod_pvt()) <= slots,
            "more outstanding than slots"
        );
        let published = ring.memory().load_u32(sring::RSP_PROD);
        assert_eq!(
            published,
            ring.rsp_prod_pvt(),
            "every written response is published by the end of a poll"
        );
        if let Some(due) = engine.throttle_deadline() {
            // A held request is due when its buckets allow it: within the debt one
            // request (at most 64 segments, 256 KiB at 1 MiB/s) can run up.
            assert!(due <= now + 300_000_000, "a held request waits too long");
        }
        assert!(engine.cached_grants() <= engine.cache_capacity());
        if let Some(limit) = limit {
            assert!(engine.cached_grants() <= limit);
        }
    }
    hold.store(false, Ordering::SeqCst);
    let mut attempts = 0;
    while engine.disconnect().is_err() {
        attempts += 1;
        assert!(attempts < 64, "teardown never finishes");
    }
    assert_eq!(engine.in_flight(), 0);
    assert_eq!(
        table.live_mappings().0,
        0,
        "grants left mapped after disconnect"
    );
});
