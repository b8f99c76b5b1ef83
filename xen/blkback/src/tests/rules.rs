// SPDX-License-Identifier: MIT OR Apache-2.0
//! One test per rule of design.md §4 (and the ring-protocol checks around them).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use blkdev::{BlockDevice, BufferAccess, Completion, Geometry, IoRequest, RamDisk, SubmitError};

use super::{page_bytes, whole_page, Rig, DISK_SECTORS};
use crate::abi::{self, sring, REQUEST_SIZE, RSP_EOPNOTSUPP, RSP_ERROR, RSP_OKAY};
use crate::engine::{Busy, EngineConfig, EngineState};
use crate::fake::wire::{encode_direct, encode_discard, encode_indirect, encode_segment};
use crate::fake::{RingView, ShufflingDevice};
use crate::parse::SegmentDesc;
use crate::ring::{Response, RingMemory};

fn ok(id: u64, operation: u8) -> Response {
    Response {
        id,
        operation,
        status: RSP_OKAY,
    }
}

fn err(id: u64, operation: u8, status: i16) -> Response {
    Response {
        id,
        operation,
        status,
    }
}

/// Ring memory that counts reads of each request slot and rewrites the slot right after
/// it has been read, as a hostile frontend racing the backend would.
struct TamperingView {
    inner: RingView,
    slot_reads: Arc<AtomicUsize>,
    replacement: [u8; REQUEST_SIZE],
}

impl RingMemory for TamperingView {
    fn size_bytes(&self) -> usize {
        self.inner.size_bytes()
    }
    fn load_u32(&self, offset: usize) -> u32 {
        self.inner.load_u32(offset)
    }
    fn store_u32(&self, offset: usize, value: u32) {
        self.inner.store_u32(offset, value)
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        self.inner.read_bytes(offset, out);
        if offset >= sring::HEADER_SIZE {
            self.slot_reads.fetch_add(1, Ordering::SeqCst);
            self.inner.write_bytes(offset, &self.replacement);
        }
    }
    fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.inner.write_bytes(offset, data)
    }
    fn full_fence(&self) {
        self.inner.full_fence()
    }
}

#[test]
fn double_fetch_each_slot_is_read_once_and_only_the_copy_is_used() {
    let disk = RamDisk::new(DISK_SECTORS);
    disk.write_at(0, &[0x5A; 4096]);
    let slot_reads = Arc::new(AtomicUsize::new(0));
    // After the first read the slot turns into a write of garbage to sector 8 with an
    // impossible segment.
    let replacement = encode_direct(
        abi::OP_WRITE,
        0xBAD,
        8,
        &[SegmentDesc {
            gref: 1,
            first_sect: 9,
            last_sect: 3,
        }; 11],
    );
    let reads = slot_reads.clone();
    let mut rig = Rig::with_view(EngineConfig::new(0, false), disk.queue(8), move |inner| {
        TamperingView {
            inner,
            slot_reads: reads,
            replacement,
        }
    });
    let (page, gref) = rig.data_page(0);
    rig.send(&encode_direct(abi::OP_READ, 41, 0, &[whole_page(gref)]));
    rig.engine.poll(8);
    assert_eq!(slot_reads.load(Ordering::SeqCst), 1);
    assert_eq!(rig.responses(), [ok(41, abi::OP_READ)]);
    assert_eq!(page_bytes(&rig.memory, page), vec![0x5A; 4096]);
    let mut sector8 = [0u8; 512];
    disk.read_at(8 * 512, &mut sector8);
    assert_eq!(sector8, [0; 512]);
}

/// Refuses submissions while `busy` is set (the engine defers them), records the
/// segments of every accepted request, and holds completions while `hold` is set.
struct HoldingRecorder {
    inner: blkdev::RamDiskQueue,
    busy: Arc<AtomicBool>,
    hold: Arc<AtomicBool>,
    held: Vec<Completion>,
    submitted: Vec<Vec<blkdev::DmaSegment>>,
}

impl HoldingRecorder {
    /// Never busy, never holding: only records what it is given.
    fn recording(inner: blkdev::RamDiskQueue) -> HoldingRecorder {
        HoldingRecorder {
            inner,
            busy: Arc::default(),
            hold: Arc::default(),
            held: Vec::new(),
            submitted: Vec::new(),
        }
    }
}

impl BlockDevice for HoldingRecorder {
    blkdev::forward_to!(inner: geometry, queue_depth);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        if self.busy.load(Ordering::SeqCst) {
            return Err(SubmitError::QueueFull);
        }
        self.submitted.push(request.segments.to_vec());
        self.inner.submit(request, buffers)
    }
    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let held = &mut self.held;
        self.inner.poll_completions(&mut |c| held.push(c));
        if self.hold.load(Ordering::SeqCst) {
            return 0;
        }
        let n = self.held.len();
        self.held.drain(..).for_each(&mut *sink);
        n
    }
}

/// The indirect page is mapped and copied out once, when the request is taken; the
/// frontend rewriting it afterwards changes nothing. The device first refuses the
/// request (the engine defers it to the next poll), then holds it: an engine that
/// fetched the descriptors again at submission or completion would see the rewritten
/// page, and the device would receive other pages.
#[test]
fn double_fetch_indirect_pages_are_copied_once() {
    let disk = RamDisk::new(DISK_SECTORS);
    let busy = Arc::new(AtomicBool::new(true));
    let hold = Arc::new(AtomicBool::new(true));
    let device = HoldingRecorder {
        inner: disk.queue(64),
        busy: busy.clone(),
        hold: hold.clone(),
        held: Vec::new(),
        submitted: Vec::new(),
    };
    let mut rig = Rig::new(EngineConfig::new(0, false), device);
    let data: Vec<(usize, u32)> = (0..20).map(|i| rig.data_page(i as u8 + 1)).collect();
    // Other granted pages the rewritten descriptors point at.
    let decoys: Vec<(usize, u32)> = (0..20).map(|_| rig.data_page(0xEE)).collect();
    let (indirect_page, _) = rig.data_page(0);
    for (i, &(_, gref)) in data.iter().enumerate() {
        rig.memory
            .write(indirect_page, i * 8, &encode_segment(&whole_page(gref)));
    }
    rig.table.grant(1000, indirect_page, true);
    rig.send(&encode_indirect(abi::OP_WRITE, 77, 16, 20, &[1000]));
    let tamper = |memory: &crate::fake::GuestMemory| {
        for (i, &(_, gref)) in decoys.iter().enumerate() {
            memory.write(indirect_page, i * 8, &encode_segment(&whole_page(gref)));
        }
    };
    // Taken and copied, but the device is busy: the request waits in the engine.
    assert_eq!(rig.engine.poll(1).consumed, 1);
    assert_eq!(rig.engine.in_flight(), 0);
    // Copied out: the indirect page is already let go.
    assert_eq!(rig.table.maps_of(1000), 0);
    tamper(&rig.memory);
    busy.store(false, Ordering::SeqCst);
    rig.engine.poll(1);
    assert_eq!(rig.engine.in_flight(), 1);
    // The device got the pages first described, each mapped for this request.
    let seen = rig.engine.device().submitted.clone();
    assert_eq!(seen.len(), 1);
    let pages: Vec<Option<usize>> = seen[0]
        .iter()
        .map(|s| {
            rig.table.page_of_mapping(&crate::grant::MappedGrant {
                handle: s.buffer as u32,
                buffer: s.buffer,
            })
        })
        .collect();
    assert_eq!(
        pages,
        data.iter().map(|&(page, _)| Some(page)).collect::<Vec<_>>()
    );
    assert!(decoys.iter().all(|&(_, gref)| rig.table.maps_of(gref) == 0));
    // Rewritten again while the device holds the request: completion must give back
    // exactly what was mapped.
    tamper(&rig.memory);
    hold.store(false, Ordering::SeqCst);
    rig.engine.poll(1);
    assert_eq!(rig.responses(), [ok(77, abi::OP_WRITE)]);
    for i in 0..20u64 {
        let mut sector = [0u8; 4096];
        disk.read_at(((16 + i * 8) * 512) as usize, &mut sector);
        assert_eq!(sector, [i as u8 + 1; 4096], "segment {i}");
    }
    assert_eq!(rig.table.live_mappings().0, 0);
    assert!(data.iter().all(|&(_, gref)| rig.table.end_access(gref)));
    assert_eq!(rig.engine.stats().indirect, 1);
}

impl Rig<blkdev::RamDiskQueue> {
    fn ram_on(disk: &RamDisk, config: EngineConfig) -> Self {
        Rig::new(config, disk.queue(1024))
    }
}

#[test]
fn producer_overflow_halts_only_that_ring() {
    let disk = RamDisk::new(DISK_SECTORS);
    let mut bad = Rig::ram_on(&disk, EngineConfig::new(0, true));
    let mut good = Rig::ram_on(&disk, EngineConfig::new(0, true));
    let (_, gref) = bad.data_page(1);
    bad.front
        .put_request(&encode_direct(abi::OP_READ, 1, 0, &[whole_page(gref)]));
    bad.front.set_req_prod(33); // 33 outstanding on a 32-slot ring
    let outcome = bad.engine.poll(64);
    assert_eq!(outcome.consumed, 0);
    assert_eq!(bad.engine.state(), EngineState::Halted);
    assert_eq!(bad.engine.stats().ring_overflows, 1);
    assert!(bad.responses().is_empty());
    // It stays halted even once the index looks sane again.
    bad.front.set_req_prod(1);
    assert_eq!(bad.engine.poll(64).consumed, 0);

    let (_, gref) = good.data_page(2);
    good.send(&encode_direct(abi::OP_READ, 5, 0, &[whole_page(gref)]));
    assert_eq!(good.engine.poll(64).consumed, 1);
    assert_eq!(good.responses(), [ok(5, abi::OP_READ)]);
}

/// A producer index moving backwards (behind what the backend already consumed, yet not
/// behind its responses, so the overflow check alone does not see it) is a protocol
/// error: without its check the backend would run on from its consumer index over the
/// stale slots until the ring is full.
#[test]
fn producer_index_moving_backwards_halts_the_ring() {
    let disk = RamDisk::new(DISK_SECTORS);
    let device = ShufflingDevice::new(disk.queue(64), 3, 100);
    device.hold.store(true, Ordering::SeqCst);
    let hold = device.hold.clone();
    let mut rig = Rig::new(EngineConfig::new(0, true), device);
    let (_, gref) = rig.data_page(0);
    for id in 0..32 {
        rig.front.put_request_at(
            id,
            &encode_direct(abi::OP_READ, id.into(), 0, &[whole_page(gref)]),
        );
    }
    rig.front.set_req_prod(10);
    assert_eq!(rig.engine.poll(100).consumed, 10);
    assert_eq!(rig.engine.in_flight(), 10);
    // 10 consumed and unanswered; the frontend now claims only 5 were ever produced.
    rig.front.set_req_prod(5);
    assert_eq!(rig.engine.poll(100).consumed, 0);
    assert_eq!(rig.engine.state(), EngineState::Halted);
    assert_eq!(rig.engine.stats().ring_overflows, 1);
    hold.store(false, Ordering::SeqCst);
    rig.engine.poll(100);
    let mut ids: Vec<u64> = rig.responses().iter().map(|r| r.id).collect();
    ids.sort();
    assert_eq!(
        ids,
        (0..10).collect::<Vec<_>>(),
        "only the 10 taken are answered"
    );
}

#[test]
fn consumer_never_runs_more_than_a_ring_ahead_of_responses() {
    // The device holds every completion: the backend may consume 32 requests, then must
    // stop even though the frontend claims more. The producer check does it (a frontend
    // claiming more than a ring ahead of the responses halts the ring): the consumer
    // stops at the producer index it checked, so it cannot run further ahead.
    let disk = RamDisk::new(DISK_SECTORS);
    let device = ShufflingDevice::new(disk.queue(64), 1, 100);
    device.hold.store(true, Ordering::SeqCst);
    let hold = device.hold.clone();
    let mut rig = Rig::new(EngineConfig::new(0, true), device);
    let (_, gref) = rig.data_page(0);
    for id in 0..32 {
        rig.front
            .put_request(&encode_direct(abi::OP_READ, id, 0, &[whole_page(gref)]));
    }
    rig.front.push_requests();
    assert_eq!(rig.engine.poll(100).consumed, 32);
    // A frontend publishing a 33rd while 32 are unanswered overflows the producer index.
    rig.front
        .put_request_at(32, &encode_direct(abi::OP_READ, 32, 0, &[whole_page(gref)]));
    rig.front.set_req_prod(33);
    assert_eq!(rig.engine.poll(100).consumed, 0);
    assert_eq!(rig.engine.state(), EngineState::Halted);
    assert_eq!(rig.engine.in_flight(), 32);
    assert_eq!(rig.engine.stats().ring_overflows, 1);
    hold.store(false, Ordering::SeqCst);
    rig.engine.poll(100);
    assert_eq!(
        rig.responses().len(),
        32,
        "in-flight requests still finish on a halted ring"
    );
}

#[test]
fn bad_segment_counts_answer_error_with_the_id() {
    let (mut rig, _) = Rig::ram(0, false);
    let (_, gref) = rig.data_page(0);
    rig.send(&encode_direct(abi::OP_READ, 1, 0, &[]));
    rig.send(&encode_direct(abi::OP_WRITE, 2, 0, &[whole_page(gref); 12]));
    rig.send(&encode_indirect(abi::OP_READ, 3, 0, 0, &[gref]));
    rig.send(&encode_indirect(
        abi::OP_READ,
        4,
        0,
        abi::MAX_INDIRECT_SEGMENTS + 1,
        &[gref, gref],
    ));
    rig.engine.poll(16);
    assert_eq!(
        rig.responses(),
        [
            err(1, 0, RSP_ERROR),
            err(2, 1, RSP_ERROR),
            err(3, 0, RSP_ERROR),
            err(4, 0, RSP_ERROR)
        ]
    );
    let stats = rig.engine.stats();
    assert_eq!(
        (stats.bad_requests, stats.errors, stats.map_batches),
        (4, 4, 0)
    );
}

/// Write descriptors for an indirect write of 612 segments whose 601st (on the second
/// page) has `last_sect` 9; returns the two indirect grefs.
fn bad_indirect_pages<D: BlockDevice>(rig: &mut Rig<D>) -> [u32; 2] {
    let (_, gref) = rig.data_page(0);
    let (page_a, gref_a) = rig.data_page(0);
    let (page_b, gref_b) = rig.data_page(0);
    for i in 0..612 {
        let last_sect = if i == 600 { 9 } else { 7 };
        let desc = SegmentDesc {
            gref,
            first_sect: 0,
            last_sect,
        };
        let (page, slot) = if i < 512 {
            (page_a, i)
        } else {
            (page_b, i - 512)
        };
        rig.memory.write(page, slot * 8, &encode_segment(&desc));
    }
    [gref_a, gref_b]
}

#[test]
fn bad_first_or_last_sect_answers_error_and_unmaps_indirect_pages() {
    let (mut rig, disk) = Rig::ram(0, false);
    let (_, gref) = rig.data_page(0);
    rig.send(&encode_direct(
        abi::OP_WRITE,
        1,
        0,
        &[SegmentDesc {
            gref,
            first_sect: 4,
            last_sect: 3,
        }],
    ));
    rig.send(&encode_direct(
        abi::OP_WRITE,
        2,
        0,
        &[SegmentDesc {
            gref,
            first_sect: 0,
            last_sect: 8,
        }],
    ));
    let grefs = bad_indirect_pages(&mut rig);
    rig.send(&encode_indirect(abi::OP_WRITE, 3, 0, 612, &grefs));
    rig.engine.poll(16);
    // 612 segments are more than the advertised 512: refused before mapping anything.
    assert_eq!(
        rig.responses(),
        [
            err(1, 1, RSP_ERROR),
            err(2, 1, RSP_ERROR),
            err(3, 1, RSP_ERROR)
        ]
    );
    assert_eq!(rig.engine.stats().map_batches, 0);

    let config = EngineConfig {
        max_indirect_segments: 1024,
        ..EngineConfig::new(0, false)
    };
    let mut wide = Rig::new(config, disk.queue(64));
    let grefs = bad_indirect_pages(&mut wide);
    wide.send(&encode_indirect(abi::OP_WRITE, 3, 0, 612, &grefs));
    wide.engine.poll(16);
    assert_eq!(wide.responses(), [err(3, 1, RSP_ERROR)]);
    assert_eq!(
        wide.engine.stats().map_batches,
        1,
        "only the indirect pages were mapped"
    );
    assert_eq!(wide.table.live_mappings().0, 0, "indirect pages unmapped");
    assert_eq!(wide.engine.stats().bad_requests, 1);
}

/// A device queue that counts the requests it is given.
struct CountingDevice {
    queue: blkdev::RamDiskQueue,
    submitted: Arc<AtomicUsize>,
}

impl BlockDevice for CountingDevice {
    blkdev::forward_to!(queue: geometry, queue_depth, poll_completions);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        self.queue.submit(request, buffers)
    }
}

#[test]
fn out_of_range_and_overflowing_sectors_answer_error() {
    // The engine refuses them itself: the device (whose own check would refuse them
    // too) never sees one, and nothing is mapped for them.
    let disk = RamDisk::new(DISK_SECTORS);
    let submitted = Arc::new(AtomicUsize::new(0));
    let device = CountingDevice {
        queue: disk.queue(64),
        submitted: submitted.clone(),
    };
    let mut rig = Rig::new(EngineConfig::new(0, true), device);
    let (_, gref) = rig.data_page(0);
    rig.send(&encode_direct(
        abi::OP_READ,
        1,
        DISK_SECTORS - 8,
        &[whole_page(gref)],
    ));
    rig.send(&encode_direct(
        abi::OP_READ,
        2,
        DISK_SECTORS - 7,
        &[whole_page(gref)],
    ));
    rig.send(&encode_direct(
        abi::OP_WRITE,
        3,
        u64::MAX - 3,
        &[whole_page(gref)],
    ));
    rig.send(&encode_discard(4, 8, u64::MAX, false));
    rig.send(&encode_discard(5, DISK_SECTORS, 1, false));
    rig.engine.poll(16);
    // Refusals are answered at once, before the valid read completes.
    let mut responses = rig.responses();
    responses.sort_by_key(|r| r.id);
    assert_eq!(
        responses,
        [
            ok(1, abi::OP_READ),
            err(2, abi::OP_READ, RSP_ERROR),
            err(3, abi::OP_WRITE, RSP_ERROR),
            err(4, abi::OP_DISCARD, RSP_ERROR),
            err(5, abi::OP_DISCARD, RSP_ERROR),
        ]
    );
    let stats = rig.engine.stats();
    assert_eq!(
        (stats.bad_requests, stats.device_errors, stats.map_batches),
        (4, 0, 1),
        "refused by the engine; only the valid read mapped"
    );
    assert_eq!(submitted.load(Ordering::SeqCst), 1, "the valid read alone");
}

#[test]
fn empty_flush_with_no_position_succeeds() {
    // Linux's empty flush carries sector -1 (blk_rq_init): it has no range to check.
    let disk = RamDisk::new(64);
    let mut rig = Rig::ram_on(&disk, EngineConfig::new(0, false));
    rig.send(&encode_direct(abi::OP_FLUSH_DISKCACHE, 1, u64::MAX, &[]));
    rig.send(&encode_direct(abi::OP_FLUSH_DISKCACHE, 2, 0, &[]));
    rig.engine.poll(16);
    assert_eq!(
        rig.responses(),
        [
            ok(1, abi::OP_FLUSH_DISKCACHE),
            ok(2, abi::OP_FLUSH_DISKCACHE)
        ]
    );
}

#[test]
fn writes_to_read_only_devices_answer_error() {
    let disk = RamDisk::with_geometry(Geometry {
        read_only: true,
        ..RamDisk::new(64).geometry()
    });
    let mut rig = Rig::ram_on(&disk, EngineConfig::new(0, false));
    let (_, gref) = rig.data_page(0xEE);
    rig.send(&encode_direct(abi::OP_WRITE, 1, 0, &[whole_page(gref)]));
    rig.send(&encode_direct(
        abi::OP_FLUSH_DISKCACHE,
        2,
        0,
        &[whole_page(gref)],
    ));
    rig.send(&encode_discard(3, 0, 8, false));
    rig.send(&encode_direct(abi::OP_READ, 4, 0, &[whole_page(gref)]));
    rig.engine.poll(16);
    assert_eq!(
        rig.responses(),
        [
            err(1, abi::OP_WRITE, RSP_ERROR),
            err(2, abi::OP_FLUSH_DISKCACHE, RSP_ERROR),
            err(3, abi::OP_DISCARD, RSP_ERROR),
            ok(4, abi::OP_READ),
        ]
    );
    let mut first = [0u8; 4096];
    disk.read_at(0, &mut first);
    assert_eq!(first, [0; 4096]);
}

#[test]
fn unknown_op_answers_eopnotsupp_with_the_id() {
    let (mut rig, _) = Rig::ram(0, false);
    for (id, op) in [(0xFFFF_FFFF_FFFF_FFF0u64, 4u8), (7, 7), (8, 200)] {
        rig.send(&encode_direct(op, id, 0, &[]));
    }
    rig.send(&encode_discard(9, 0, 8, true)); // the RAM disk offers secure discard
    rig.engine.poll(16);
    let responses = rig.responses();
    assert_eq!(
        responses[..3],
        [
            err(0xFFFF_FFFF_FFFF_FFF0, 4, RSP_EOPNOTSUPP),
            err(7, 7, RSP_EOPNOTSUPP),
            err(8, 200, RSP_EOPNOTSUPP)
        ]
    );
    assert_eq!(responses[3], ok(9, abi::OP_DISCARD));
    let disk = RamDisk::with_geometry(Geometry {
        discard: None,
        ..RamDisk::new(64).geometry()
    });
    let mut plain = Rig::ram_on(&disk, EngineConfig::new(0, false));
    plain.send(&encode_discard(10, 0, 8, false));
    plain.engine.poll(16);
    assert_eq!(
        plain.responses(),
        [err(10, abi::OP_DISCARD, RSP_EOPNOTSUPP)]
    );
}

#[test]
fn grant_map_partial_failure_unwinds_and_answers_error() {
    for persistent in [false, true] {
        let (mut rig, disk) = Rig::ram(0, persistent);
        let pages: Vec<(usize, u32)> = (0..3).map(|i| rig.data_page(0x10 + i)).collect();
        let (_, good) = rig.data_page(0x77);
        rig.table.fail_maps_of(pages[1].1);
        let segments: Vec<SegmentDesc> = pages.iter().map(|&(_, g)| whole_page(g)).collect();
        rig.send(&encode_direct(abi::OP_WRITE, 1, 0, &segments));
        rig.send(&encode_direct(abi::OP_WRITE, 2, 64, &[whole_page(good)]));
        rig.engine.poll(16);
        assert_eq!(
            rig.responses(),
            [err(1, abi::OP_WRITE, RSP_ERROR), ok(2, abi::OP_WRITE)],
            "persistent={persistent}"
        );
        // Nothing of request 1 reached the disk, nothing of it stays pinned or mapped
        // (except, with persistent grants, the good pages now in the cache, unpinned).
        let mut first = [0u8; 3 * 4096];
        disk.read_at(0, &mut first);
        assert!(first.iter().all(|&b| b == 0));
        let (live, _) = rig.table.live_mappings();
        if persistent {
            assert_eq!(
                live, 3,
                "pages 0 and 2 of request 1 and the good page are cached"
            );
            assert_eq!(rig.engine.cached_grants(), 3);
            assert_eq!(rig.table.maps_of(pages[1].1), 0);
        } else {
            assert_eq!(live, 0);
        }
        assert_eq!(rig.engine.stats().grant_failures, 1);
        assert_eq!(rig.engine.in_flight(), 0);
    }
}

#[test]
fn teardown_with_requests_in_flight_waits_and_is_idempotent() {
    let disk = RamDisk::new(DISK_SECTORS);
    let device = ShufflingDevice::new(disk.queue(64), 7, 100);
    device.hold.store(true, Ordering::SeqCst);
    let hold = device.hold.clone();
    let mut rig = Rig::new(EngineConfig::new(0, true), device);
    let grefs: Vec<u32> = (0..3).map(|i| rig.data_page(i).1).collect();
    for (id, &gref) in grefs.iter().enumerate() {
        rig.send(&encode_direct(
            abi::OP_READ,
            id as u64,
            0,
            &[whole_page(gref)],
        ));
    }
    rig.engine.poll(16);
    assert_eq!(rig.engine.in_flight(), 3);
    assert_eq!(rig.engine.disconnect(), Err(Busy { in_flight: 3 }));
    assert_eq!(rig.engine.state(), EngineState::Draining);
    // The frontend cannot take its pages back while the backend maps them.
    assert!(!rig.table.end_access(grefs[0]));
    // New requests are no longer taken.
    rig.send(&encode_direct(abi::OP_READ, 9, 0, &[whole_page(grefs[0])]));
    assert_eq!(rig.engine.poll(16).consumed, 0);
    hold.store(false, Ordering::SeqCst);
    assert_eq!(rig.engine.disconnect(), Ok(()));
    assert_eq!(rig.engine.state(), EngineState::Disconnected);
    let mut ids: Vec<u64> = rig.responses().iter().map(|r| r.id).collect();
    ids.sort();
    assert_eq!(ids, [0, 1, 2]);
    assert_eq!(rig.table.live_mappings().0, 0);
    assert!(grefs.iter().all(|&g| rig.table.end_access(g)));
    assert_eq!(rig.engine.disconnect(), Ok(()));
    assert_eq!(rig.engine.poll(16).consumed, 0);
}

#[test]
fn bounded_work_per_poll_and_spurious_polls_are_counted() {
    let (mut rig, _) = Rig::ram(0, true);
    let (_, gref) = rig.data_page(0);
    for id in 0..30 {
        rig.front
            .put_request(&encode_direct(abi::OP_READ, id, 0, &[whole_page(gref)]));
    }
    rig.front.push_requests();
    let consumed: Vec<usize> = (0..7).map(|_| rig.engine.poll(8).consumed).collect();
    assert_eq!(consumed, [8, 8, 8, 6, 0, 0, 0]);
    assert_eq!(rig.responses().len(), 30);
    for _ in 0..100 {
        assert!(!rig.engine.poll(8).did_work());
    }
    let stats = rig.engine.stats();
    assert_eq!(
        (stats.polls, stats.empty_polls, stats.reads),
        (107, 103, 30)
    );
    // An event storm without requests is counted, and costs one empty poll per event.
    for _ in 0..50 {
        rig.engine.event_received();
        assert!(!rig.engine.poll(8).did_work());
    }
    rig.send(&encode_direct(abi::OP_READ, 99, 0, &[whole_page(gref)]));
    rig.engine.event_received();
    assert!(rig.engine.poll(8).did_work());
    assert_eq!(rig.engine.stats().spurious_events, 50);
}

#[test]
fn notify_only_when_the_ring_macros_say_so() {
    let (mut rig, _) = Rig::ram(0, true);
    let (_, gref) = rig.data_page(0);
    let read = |id| encode_direct(abi::OP_READ, id, 0, &[whole_page(gref)]);
    // The frontend does not want events yet (rsp_event far ahead).
    rig.front.set_rsp_event(1000);
    for id in 0..4 {
        rig.send(&read(id));
    }
    assert!(!rig.engine.poll(16).notified);
    assert_eq!(rig.responses().len(), 4);
    assert_eq!(rig.events.count(), 0);
    // Now it asks for one: one event for a batch of four.
    rig.front.arm_response_event();
    for id in 4..8 {
        rig.front.put_request(&read(id));
    }
    rig.front.push_requests();
    assert!(rig.engine.poll(16).notified);
    assert_eq!(rig.events.count(), 1);
    // Its event is consumed; more responses do not notify until it re-arms.
    rig.responses();
    rig.send(&read(8));
    assert!(!rig.engine.poll(16).notified);
    assert_eq!(rig.engine.stats().notifications, 1);
}

#[test]
fn req_event_stays_behind_while_busy_and_is_rearmed_before_sleep() {
    let (mut rig, _) = Rig::ram(0, true);
    let (_, gref) = rig.data_page(0);
    let read = |id| encode_direct(abi::OP_READ, id, 0, &[whole_page(gref)]);
    assert!(
        rig.send_and_notify(&read(0)),
        "initial req_event = 1 asks for the first event"
    );
    rig.engine.poll(16);
    for id in 1..5 {
        assert!(
            !rig.send_and_notify(&read(id)),
            "no events while the backend polls"
        );
        rig.engine.poll(16);
    }
    assert!(rig.engine.prepare_to_sleep());
    assert!(
        rig.send_and_notify(&read(5)),
        "re-armed: the next request wakes the backend"
    );
    // Work that arrives between the last poll and the re-arm is caught by the final check.
    rig.engine.poll(16);
    rig.front.put_request(&read(6));
    rig.front.push_requests();
    assert!(!rig.engine.prepare_to_sleep());
}

impl<D: BlockDevice> Rig<D> {
    fn send_and_notify(&mut self, raw: &[u8; REQUEST_SIZE]) -> bool {
        self.front.put_request(raw);
        self.front.push_requests()
    }
}

#[test]
fn response_padding_is_zeroed() {
    let (mut rig, _) = Rig::ram(0, false);
    let mut raw = encode_direct(7, u64::MAX, u64::MAX, &[]);
    raw[2..8].fill(0xFF);
    raw[16..].fill(0xFF);
    rig.send(&raw);
    rig.engine.poll(1);
    let mut slot = [0u8; 16];
    rig.front.view().read_bytes(sring::HEADER_SIZE, &mut slot);
    assert_eq!(&slot[..8], &[0xFF; 8]);
    assert_eq!(slot[8], 7);
    assert_eq!(slot[9], 0, "padding after operation");
    assert_eq!(i16::from_le_bytes([slot[10], slot[11]]), RSP_EOPNOTSUPP);
    assert_eq!(&slot[12..], &[0; 4], "tail padding");
}

#[test]
fn one_dma_segment_per_grant_never_merged() {
    let disk = RamDisk::new(DISK_SECTORS);
    let device = HoldingRecorder::recording(disk.queue(8));
    let mut rig = Rig::new(EngineConfig::new(0, false), device);
    // Eleven consecutive pages, each fully used: contiguous in the guest, still eleven
    // segments for the device.
    let grefs: Vec<u32> = (0..11).map(|i| rig.data_page(i).1).collect();
    let segments: Vec<SegmentDesc> = grefs.iter().map(|&g| whole_page(g)).collect();
    rig.send(&encode_direct(abi::OP_WRITE, 1, 0, &segments));
    rig.engine.poll(4);
    assert_eq!(rig.responses(), [ok(1, abi::OP_WRITE)]);
    let seen = &rig.engine.device().submitted;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].len(), 11);
    assert!(seen[0].iter().all(|s| s.offset == 0 && s.len == 4096));
}

#[test]
fn persistent_grant_bound_is_never_exceeded() {
    let disk = RamDisk::new(DISK_SECTORS);
    let config = EngineConfig {
        persistent_grant_limit: Some(16),
        ..EngineConfig::new(0, true)
    };
    let mut rig = Rig::ram_on(&disk, config);
    let grefs: Vec<u32> = (0..64).map(|i| rig.data_page(i).1).collect();
    let mut id = 0;
    let mut answered = Vec::new();
    for round in 0..40 {
        for k in 0..4 {
            let segs: Vec<SegmentDesc> = (0..3)
                .map(|s| whole_page(grefs[(round * 7 + k * 3 + s) % 64]))
                .collect();
            rig.front
                .put_request(&encode_direct(abi::OP_READ, id, 0, &segs));
            id += 1;
        }
        rig.front.push_requests();
        rig.engine.poll(32);
        assert!(rig.engine.cached_grants() <= 16);
        // Cached grants plus the transient ones of at most 4 in-flight requests.
        assert!(rig.table.live_mappings().0 <= 16);
        answered.extend(rig.responses());
    }
    assert_eq!(answered.len(), 160);
    assert!(answered.iter().all(|r| r.status == RSP_OKAY));
    let (_, peak) = rig.table.live_mappings();
    assert!(peak <= 16 + 4 * 3, "peak {peak}");
    // The default bound is what the ring can reference at once: data and indirect
    // pages.
    let (default, _) = Rig::ram(2, true);
    assert_eq!(
        default.engine.cache_capacity(),
        128 * (usize::from(abi::MAX_INDIRECT_SEGMENTS) + 1)
    );
}

#[test]
fn persistent_indirect_pages_are_cached_like_data_pages() {
    let (mut rig, disk) = Rig::ram(0, true);
    let data: Vec<(usize, u32)> = (0..16).map(|i| rig.data_page(i as u8 + 1)).collect();
    let (indirect_page, indirect_gref) = rig.data_page(0);
    for (i, &(_, gref)) in data.iter().enumerate() {
        rig.memory
            .write(indirect_page, i * 8, &encode_segment(&whole_page(gref)));
    }
    for id in 0..5 {
        rig.send(&encode_indirect(abi::OP_WRITE, id, 0, 16, &[indirect_gref]));
        rig.engine.poll(4);
    }
    assert!(rig.responses().iter().all(|r| r.status == RSP_OKAY));
    let stats = rig.engine.stats();
    assert_eq!(
        stats.map_batches, 2,
        "indirect page, then data pages, mapped once"
    );
    assert_eq!(stats.unmap_batches, 0);
    assert_eq!(rig.engine.cached_grants(), 17);
    let mut last = [0u8; 4096];
    disk.read_at(15 * 4096, &mut last);
    assert_eq!(last, [16; 4096]);
    assert_eq!(rig.engine.disconnect(), Ok(()));
    assert_eq!(rig.table.live_mappings().0, 0);
}

#[test]
fn barrier_waits_for_earlier_requests_and_holds_back_later_ones() {
    let disk = RamDisk::new(DISK_SECTORS);
    let device = ShufflingDevice::new(disk.queue(64), 3, 100);
    device.hold.store(true, Ordering::SeqCst);
    let hold = device.hold.clone();
    let mut rig = Rig::new(EngineConfig::new(0, true), device);
    let (_, gref) = rig.data_page(0);
    rig.send(&encode_direct(abi::OP_READ, 1, 0, &[whole_page(gref)]));
    rig.send(&encode_direct(abi::OP_READ, 2, 8, &[whole_page(gref)]));
    rig.send(&encode_direct(
        abi::OP_WRITE_BARRIER,
        3,
        16,
        &[whole_page(gref)],
    ));
    rig.send(&encode_direct(abi::OP_READ, 4, 24, &[whole_page(gref)]));
    // All four are taken in one round, but only the two reads reach the device: the
    // barrier waits for them and the read behind it waits for the barrier.
    assert_eq!(rig.engine.poll(8).consumed, 4);
    assert_eq!(rig.engine.in_flight(), 2);
    hold.store(false, Ordering::SeqCst);
    rig.engine.poll(8);
    let first: Vec<u64> = rig.responses().iter().map(|r| r.id).collect();
    assert_eq!(first.len(), 2);
    assert!(first.contains(&1) && first.contains(&2));
    rig.engine.poll(8);
    rig.engine.poll(8);
    let rest: Vec<Response> = rig.responses();
    assert_eq!(rest.len(), 2);
    assert!(rest.contains(&ok(3, abi::OP_WRITE_BARRIER)) && rest.contains(&ok(4, abi::OP_READ)));
}

/// Holds completions until told, then reports `spurious` completions of tags the engine
/// never gave it before the real ones, all in one poll: more than the ring has slots.
struct FloodingDevice {
    inner: blkdev::RamDiskQueue,
    held: Vec<Completion>,
    release: Arc<std::sync::atomic::AtomicBool>,
    spurious: u32,
}

impl BlockDevice for FloodingDevice {
    blkdev::forward_to!(inner: geometry, queue_depth, submit);

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let held = &mut self.held;
        self.inner.poll_completions(&mut |c| held.push(c));
        if !self.release.load(Ordering::SeqCst) {
            return 0;
        }
        for n in 0..self.spurious {
            sink(Completion {
                tag: 0x8000_0000 + n,
                status: blkdev::IoStatus::Ok,
            });
        }
        let real = self.held.len();
        for c in self.held.drain(..) {
            sink(c);
        }
        self.spurious as usize + real
    }
}

#[test]
fn no_completion_is_lost_when_a_device_reports_more_than_the_ring_holds() {
    let disk = RamDisk::new(DISK_SECTORS);
    let device = FloodingDevice {
        inner: disk.queue(64),
        held: Vec::new(),
        release: Arc::default(),
        spurious: 100,
    };
    let release = device.release.clone();
    let mut rig = Rig::new(EngineConfig::new(0, false), device);
    let slots = u64::from(rig.engine.ring().slots());
    let (_, gref) = rig.data_page(1);
    for id in 0..slots {
        rig.front
            .put_request(&encode_direct(abi::OP_READ, id, 0, &[whole_page(gref)]));
    }
    rig.front.push_requests();
    rig.engine.poll(usize::MAX);
    assert_eq!(rig.engine.in_flight(), slots as usize);
    // One poll brings 100 unknown tags, then every real completion.
    release.store(true, Ordering::SeqCst);
    let outcome = rig.engine.poll(usize::MAX);
    assert_eq!(outcome.completed, slots as usize);
    assert_eq!(rig.engine.in_flight(), 0);
    let mut answered: Vec<u64> = rig.responses().iter().map(|r| r.id).collect();
    answered.sort();
    assert_eq!(answered, (0..slots).collect::<Vec<_>>());
    assert_eq!(rig.engine.disconnect(), Ok(()));
}

/// A frontend chooses how big a ring is (order 4, 512 indirect segments, persistent
/// grants: several MiB of engine memory). The engine says what it needs and refuses,
/// with an error, when that is more than there is; it never aborts the domain.
#[test]
fn ring_memory_is_checked_before_it_is_taken() {
    use crate::engine::{Engine, EngineError};
    use crate::fake::{CountingEvents, GrantTable, GuestMemory, XenGrants};
    let config = EngineConfig {
        max_indirect_segments: 512,
        ..EngineConfig::new(4, true)
    };
    let needed = config.memory_needed();
    assert_eq!(
        needed,
        Engine::<RingView, XenGrants, blkdev::RamDiskQueue, CountingEvents>::memory_needed(&config)
    );
    assert!(
        needed > 4 << 20,
        "order 4 with 512 segments needs {needed} bytes"
    );
    let disk = RamDisk::new(DISK_SECTORS);
    let build = |budget: usize| {
        let memory = GuestMemory::new(16);
        let table = GrantTable::new(memory.clone());
        let (ring, grants, queue, events) = (
            RingView::new(memory, (0..16).collect()),
            XenGrants(table),
            disk.queue(512),
            CountingEvents::default(),
        );
        // What the engine itself allocates, from here (its inputs are made).
        let before = super::counting::held();
        super::counting::reset_peak();
        let built = Engine::new_within(ring, grants, queue, events, config, budget)
            .map_err(|refused| refused.error);
        let taken = (super::counting::peak() - before) as usize;
        let held = (super::counting::held() - before) as usize;
        (built, taken, held)
    };
    let (Err(error), taken, _) = build(needed - 1) else {
        panic!("an engine beyond its budget was built")
    };
    assert!(
        taken < 4096,
        "refused before taking its memory ({taken} bytes)"
    );
    assert_eq!(error, EngineError::OutOfMemory { slots: 512, needed });
    assert_eq!(
        error.to_string(),
        format!(
            "not enough memory for a ring of 512 slots: needs {} KiB",
            needed.div_ceil(1024)
        )
    );
    let (engine, taken, held) = build(needed);
    let engine = engine.expect("fits its budget");
    assert_eq!(engine.cache_capacity(), 512 * (512 + 1));
    // What it says it needs is what it takes, at its peak too: the budget check above
    // holds for the memory really allocated.
    assert_eq!(
        (taken, held),
        (needed, needed),
        "bytes taken at the peak and held, against the bytes said"
    );
}

/// A device queue lent to an engine (by the kernel, from its disk's pool), marked so the
/// test sees which one comes back and whether it was dropped.
struct LentQueue {
    queue: blkdev::RamDiskQueue,
    tag: u32,
    dropped: Arc<AtomicBool>,
}

impl BlockDevice for LentQueue {
    blkdev::forward_to!(queue: geometry, queue_depth, submit, poll_completions);
}

impl Drop for LentQueue {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

/// An engine that does not start (its memory refused, or a ring it cannot take) hands
/// back the device queue it was given, whole: the kernel puts it back in its disk's
/// pool, or the disk would serve one queue fewer for good.
#[test]
fn an_engine_that_does_not_start_gives_its_device_queue_back() {
    use crate::engine::{Engine, EngineError};
    use crate::fake::{CountingEvents, GrantTable, GuestMemory, XenGrants};
    use crate::ring::RingError;
    let disk = RamDisk::new(DISK_SECTORS);
    let config = EngineConfig::new(2, true);
    let needed = config.memory_needed();
    // (ring pages mapped, ring order asked for, memory budget, why it does not start)
    let cases = [
        (
            4,
            2,
            needed - 1,
            EngineError::OutOfMemory { slots: 128, needed },
        ),
        (
            2,
            2,
            usize::MAX,
            EngineError::Ring(RingError::TooSmall {
                needed: 4 * abi::PAGE_SIZE,
                mapped: 2 * abi::PAGE_SIZE,
            }),
        ),
        (
            4,
            abi::MAX_RING_PAGE_ORDER + 1,
            usize::MAX,
            EngineError::Ring(RingError::BadOrder(abi::MAX_RING_PAGE_ORDER + 1)),
        ),
    ];
    for (tag, (pages, ring_order, budget, why)) in (1..).zip(cases) {
        let memory = GuestMemory::new(pages);
        let dropped = Arc::new(AtomicBool::new(false));
        let queue = LentQueue {
            queue: disk.queue(32),
            tag,
            dropped: dropped.clone(),
        };
        let built = Engine::new_within(
            RingView::new(memory.clone(), (0..pages).collect()),
            XenGrants(GrantTable::new(memory)),
            queue,
            CountingEvents::default(),
            EngineConfig {
                ring_order,
                ..config
            },
            budget,
        );
        let Err(refused) = built else {
            panic!("case {tag}: an engine was built")
        };
        assert_eq!(refused.error, why, "case {tag}");
        assert!(
            !dropped.load(Ordering::SeqCst),
            "case {tag}: the queue was dropped"
        );
        assert_eq!(
            refused.device.tag, tag,
            "case {tag}: another queue came back"
        );
        drop(refused);
        assert!(dropped.load(Ordering::SeqCst));
    }
}
