// SPDX-License-Identifier: MIT OR Apache-2.0
use crate::command::CommandStatus;
use crate::fake::{FakeController, FakeHal};
use crate::*;
use blkdev::{BlockDevice, Completion, DmaSegment, IoOp, IoRequest, IoStatus, SubmitError};
use cmdslots::fake::{
    a_device_that_cannot_be_stopped_is_reported_so, a_stalled_command_fails_after_its_deadline,
    complete_one, data_request, drain, status_read_by_clock_not_by_polls, NoCpuAccess, MS, TIMEOUT,
};
use cmdslots::RecoveryConfig;

fn bring_up(fake: FakeController, queues: u16, entries: u16) -> (FakeHal, Vec<IoQueue<FakeHal>>) {
    let (hal, _, queues) = bring_up_with(fake, queues, entries, RecoveryConfig::DEFAULT);
    (hal, queues)
}

/// A controller that is never recovered (`device.max-resets=0`): a queue with an
/// overdue command, or a fatal controller, fails for good at once.
fn bring_up_without_recovery(
    fake: FakeController,
    queues: u16,
    entries: u16,
) -> (FakeHal, Vec<IoQueue<FakeHal>>) {
    let (hal, _, queues) = bring_up_with(fake, queues, entries, RecoveryConfig::NEVER);
    (hal, queues)
}

pub(crate) fn bring_up_with(
    fake: FakeController,
    queues: u16,
    entries: u16,
    recovery: RecoveryConfig,
) -> (FakeHal, Controller<FakeHal>, Vec<IoQueue<FakeHal>>) {
    let hal = FakeHal::new(fake);
    let config = InitConfig {
        recovery,
        ..InitConfig::default()
    };
    let mut controller = Controller::init(hal.clone(), config).unwrap();
    let namespace = controller.namespace(1).unwrap();
    let granted = controller.request_io_queues(queues).unwrap();
    let queues = (0..granted)
        .map(|_| controller.create_io_queue(&namespace, entries).unwrap())
        .collect();
    (hal, controller, queues)
}

/// One whole fresh page as the only segment.
pub(crate) fn one_page(hal: &FakeHal) -> [DmaSegment; 1] {
    [DmaSegment {
        buffer: hal.with(|m| m.memory.allocate(1)).unwrap(),
        offset: 0,
        len: 4096,
    }]
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Segments of random shapes: the first may start mid-page, a short one may sit in the
/// middle (forcing a split), all sector multiples within their page.
fn random_segments(rng: &mut Rng, hal: &FakeHal, count: usize) -> Vec<DmaSegment> {
    let pages = hal.with(|m| m.memory.allocate(count)).unwrap();
    (0..count)
        .map(|i| {
            let buffer = pages + i as u64 * 4096;
            let (offset, len) = match rng.below(4) {
                0 => {
                    let first = rng.below(8) as u32;
                    let last = first + rng.below(8 - u64::from(first)) as u32;
                    (first * 512, (last - first + 1) * 512)
                }
                _ => (0, 4096),
            };
            DmaSegment {
                buffer,
                offset,
                len,
            }
        })
        .collect()
}

fn fill(hal: &FakeHal, segments: &[DmaSegment], seed: u8) -> Vec<u8> {
    let mut expected = Vec::new();
    hal.with(|m| {
        for (i, s) in segments.iter().enumerate() {
            let at = (s.buffer + u64::from(s.offset)) as usize;
            for (j, byte) in m.memory[at..at + s.len as usize].iter_mut().enumerate() {
                *byte = seed.wrapping_add((i * 7 + j * 13) as u8);
            }
            expected.extend_from_slice(&m.memory[at..at + s.len as usize]);
        }
    });
    expected
}

fn gather(hal: &FakeHal, segments: &[DmaSegment]) -> Vec<u8> {
    hal.with(|m| {
        segments
            .iter()
            .flat_map(|s| {
                let at = (s.buffer + u64::from(s.offset)) as usize;
                m.memory[at..at + s.len as usize].to_vec()
            })
            .collect()
    })
}

#[test]
fn bring_up_identifies_controller_and_namespace() {
    let hal = FakeHal::new(FakeController::new(8 << 20));
    let mut controller = Controller::init(hal.clone(), InitConfig::default()).unwrap();
    assert_eq!(controller.identity().model_str(), "Fake NVMe");
    assert_eq!(controller.identity().serial_str(), "fake-serial");
    assert_eq!(controller.version(), Version { major: 1, minor: 4 });
    assert_eq!(controller.max_queue_entries(), 64);
    let ns = controller.namespace(1).unwrap();
    assert_eq!(ns.blocks, (8 << 20) / 512);
    assert_eq!(ns.block_size, 512);
    assert!(ns.discard && ns.volatile_write_cache);
    assert_eq!(ns.max_pages_per_command, 32);
    assert_eq!(controller.namespace(2), Err(NvmeError::NoSuchNamespace(2)));
    assert_eq!(controller.request_io_queues(16).unwrap(), 8);
    assert_eq!(controller.io_queues_left(), 8);
    let queue = controller.create_io_queue(&ns, 1000).unwrap();
    assert_eq!(controller.io_queues_left(), 7);
    assert_eq!(queue.queue_depth(), 63, "clamped to MQES + 1 entries");
    let g = queue.geometry();
    assert_eq!(g.sectors, (8 << 20) / 512);
    assert!(g.flush && g.discard.is_some());
    assert!(hal.with(|m| m.violations.is_empty()));
}

/// What names a device stably: the serial (Identify Controller bytes 4..23), each active
/// namespace's NGUID (Identify Namespace 104..119) and EUI-64 (120..127), read at
/// bring-up from the list of active namespaces.
#[test]
fn bring_up_reads_the_serial_and_each_namespace_s_ids() {
    let mut fake = FakeController::new(8 << 20);
    fake.serial = *b"  S3EVNX0K-77       ";
    fake.nguid = core::array::from_fn(|i| 0x10 + i as u8);
    fake.eui64 = core::array::from_fn(|i| 0xe0 + i as u8);
    fake.namespace_count = 4;
    // An id beyond NN in the list is not asked about.
    fake.active_ids = vec![1, 9];
    let hal = FakeHal::new(fake);
    let mut controller = Controller::init(hal.clone(), InitConfig::default()).unwrap();
    assert_eq!(&controller.identity().serial[..], b"  S3EVNX0K-77       ");
    assert_eq!(
        backing_serial(&controller.identity().serial),
        Some("S3EVNX0K-77")
    );
    let namespaces = controller.identify_namespaces().unwrap();
    assert_eq!(
        namespaces,
        [NamespaceIdentity {
            nsid: 1,
            blocks: (8 << 20) / 512,
            block_size: 512,
            nguid: core::array::from_fn(|i| 0x10 + i as u8),
            eui64: core::array::from_fn(|i| 0xe0 + i as u8),
        }]
    );
    // One list page, then one Identify Namespace per active namespace only (not 4).
    let identifies = |hal: &FakeHal| hal.with(|m| m.admin_identifies.clone());
    assert_eq!(identifies(&hal)[2..], [(2, 0), (0, 1)]);
    assert!(hal.with(|m| m.violations.is_empty()));

    // Without the active list (before NVMe 1.1) every id up to NN is asked; inactive
    // ones (all zeros) are left out, and so are absent ids (zeros).
    let mut fake = FakeController::new(1 << 20);
    fake.active_list = false;
    fake.namespace_count = 3;
    let hal = FakeHal::new(fake);
    let mut controller = Controller::init(hal.clone(), InitConfig::default()).unwrap();
    let namespaces = controller.identify_namespaces().unwrap();
    assert_eq!(namespaces.len(), 1);
    assert_eq!(
        (namespaces[0].nguid, namespaces[0].eui64),
        ([0; 16], [0; 8])
    );
    assert_eq!(identifies(&hal)[2..], [(2, 0), (0, 1), (0, 2), (0, 3)]);
}

/// The serial as a `target=` compares it (the backing crate's rule, restated so the
/// driver's test does not depend on it): padding trimmed at both ends.
fn backing_serial(raw: &[u8; 20]) -> Option<&str> {
    let text = core::str::from_utf8(raw).ok()?.trim_matches([' ', '\0']);
    (!text.is_empty()).then_some(text)
}

#[test]
fn namespace_identity_parses_ids_and_unserved_formats() {
    let mut page = [0u8; 4096];
    assert_eq!(
        NamespaceIdentity::parse(5, &page),
        None,
        "no blocks: inactive"
    );
    page[0..8].copy_from_slice(&1000u64.to_le_bytes());
    page[26] = 1;
    page[132..136].copy_from_slice(&[0, 0, 12, 0]);
    page[104..120].copy_from_slice(&[0xab; 16]);
    page[120..128].copy_from_slice(&[0xcd; 8]);
    let ns = NamespaceIdentity::parse(5, &page).unwrap();
    assert_eq!((ns.nsid, ns.blocks, ns.block_size), (5, 1000, 4096));
    assert_eq!((ns.nguid, ns.eui64), ([0xab; 16], [0xcd; 8]));
    // Metadata, or a block size outside 512..4096: listed, with block size 0.
    page[132..136].copy_from_slice(&[8, 0, 12, 0]);
    assert_eq!(NamespaceIdentity::parse(5, &page).unwrap().block_size, 0);
    page[132..136].copy_from_slice(&[0, 0, 13, 0]);
    assert_eq!(NamespaceIdentity::parse(5, &page).unwrap().block_size, 0);
}

#[test]
fn a_controller_that_never_gets_ready_times_out() {
    let mut fake = FakeController::new(1 << 20);
    fake.never_ready = true;
    fake.cap_to = 2; // 1 s
    let hal = FakeHal::new(fake);
    let result = Controller::init(hal.clone(), InitConfig::default());
    assert!(matches!(
        result,
        Err(NvmeError::ReadyTimeout { enabling: true })
    ));
    let waited = hal.with(|m| m.delays_us);
    assert!((1_000_000..1_100_000).contains(&waited), "{waited}");
}

#[test]
fn inactive_namespace_and_bad_formats_are_refused() {
    let mut fake = FakeController::new(1 << 20);
    fake.namespace_count = 2;
    let hal = FakeHal::new(fake);
    let mut controller = Controller::init(hal.clone(), InitConfig::default()).unwrap();
    assert_eq!(controller.namespace(2), Err(NvmeError::NoSuchNamespace(2)));
    assert_eq!(controller.namespace(0), Err(NvmeError::NoSuchNamespace(0)));
    let mut controller = Controller::init(hal.clone(), InitConfig::default()).unwrap();
    let ns = controller.namespace(1).unwrap();
    // No queues asked for yet: none to create.
    assert!(matches!(
        controller.create_io_queue(&ns, 8),
        Err(NvmeError::NoQueueLeft)
    ));
}

#[test]
fn random_requests_round_trip_with_prp_lists_and_splits() {
    let mut fake = FakeController::new(16 << 20);
    fake.mdts = 3; // 8 pages per command: long requests split
    let (hal, mut queues) = bring_up(fake, 1, 32);
    let queue = &mut queues[0];
    let mut rng = Rng(0x5eed);
    let capacity = queue.geometry().sectors;
    for round in 0..60u32 {
        let count = 1 + rng.below(40) as usize;
        let segments = random_segments(&mut rng, &hal, count);
        let expected = fill(&hal, &segments, round as u8);
        let sectors = expected.len() as u64 / 512;
        let sector = rng.below(capacity - sectors);
        let write = data_request(round, IoOp::Write, sector, &segments);
        assert_eq!(complete_one(queue, &write), IoStatus::Ok);
        let on_disk = hal.with(|m| m.disk[sector as usize * 512..][..expected.len()].to_vec());
        assert_eq!(on_disk, expected, "round {round}");

        // Other shapes, same total length.
        let mut back = Vec::new();
        let mut left = expected.len() as u64;
        while left > 0 {
            let mut shape = random_segments(&mut rng, &hal, 1)[0];
            shape.len = shape.len.min(left as u32);
            left -= u64::from(shape.len);
            back.push(shape);
        }
        let read = data_request(round + 1000, IoOp::Read, sector, &back);
        assert_eq!(complete_one(queue, &read), IoStatus::Ok);
        assert_eq!(gather(&hal, &back), expected, "round {round} read back");
    }
    let stats = queue.stats();
    assert!(stats.split_requests > 10, "{stats:?}");
    assert!(stats.commands > stats.requests);
    assert!(
        hal.with(|m| m.violations.is_empty()),
        "{:?}",
        hal.with(|m| m.violations.clone())
    );
}

#[test]
fn phase_bit_wraps_many_times_on_a_tiny_queue() {
    let (hal, mut queues) = bring_up(FakeController::new(1 << 20), 1, 4);
    let queue = &mut queues[0];
    assert_eq!(queue.queue_depth(), 3);
    let segment = one_page(&hal);
    let mut completed = 0;
    for round in 0..50u32 {
        // Three at once, then drain: entries cycle through every CQ slot.
        for k in 0..3 {
            let tag = round * 3 + k;
            queue
                .submit(
                    &data_request(tag, IoOp::Write, u64::from(tag % 200) * 8, &segment),
                    &NoCpuAccess,
                )
                .unwrap();
        }
        let done = drain(queue);
        assert_eq!(done.len(), 3, "round {round}");
        assert!(done.iter().all(|c| c.status == IoStatus::Ok));
        completed += done.len();
    }
    assert_eq!(completed, 150);
    assert!(hal.with(|m| m.violations.is_empty()));
}

#[test]
fn a_full_queue_refuses_until_completions_are_polled() {
    let mut fake = FakeController::new(1 << 20);
    let (hal, mut queues) = {
        fake.hold = false;
        bring_up(fake, 1, 8)
    };
    hal.with(|m| m.hold = true);
    let queue = &mut queues[0];
    let segment = one_page(&hal);
    let mut accepted = 0;
    let refused = loop {
        match queue.submit(
            &data_request(accepted, IoOp::Read, 0, &segment),
            &NoCpuAccess,
        ) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(refused, SubmitError::QueueFull);
    assert_eq!(accepted, 7);
    assert_eq!(drain(queue).len(), 0, "nothing done before the device runs");
    hal.with(|m| m.process());
    let done = drain(queue);
    let mut tags: Vec<_> = done.iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, (0..7).collect::<Vec<_>>());
    queue
        .submit(&data_request(99, IoOp::Read, 0, &segment), &NoCpuAccess)
        .unwrap();
    // A request needing more commands than free slots is refused as a whole.
    let two_pages = hal.with(|m| m.memory.allocate(2)).unwrap();
    let split = [
        DmaSegment {
            buffer: two_pages,
            offset: 0,
            len: 512,
        },
        DmaSegment {
            buffer: two_pages + 4096,
            offset: 0,
            len: 512,
        },
    ];
    for tag in 100..105 {
        queue
            .submit(&data_request(tag, IoOp::Read, 0, &segment), &NoCpuAccess)
            .unwrap();
    }
    assert_eq!(
        queue.submit(&data_request(200, IoOp::Read, 0, &split), &NoCpuAccess),
        Err(SubmitError::QueueFull)
    );
    hal.with(|m| m.process());
    assert_eq!(drain(queue).len(), 6);
    assert!(hal.with(|m| m.violations.is_empty()));
}

#[test]
fn device_errors_map_to_error_and_unsupported() {
    let mut fake = FakeController::new(1 << 20);
    fake.fail_lba = Some((100, CommandStatus::new(2, 0x81))); // media: unrecovered read
    let (hal, mut queues) = bring_up(fake, 1, 8);
    let queue = &mut queues[0];
    let segment = one_page(&hal);
    assert_eq!(
        complete_one(queue, &data_request(1, IoOp::Read, 96, &segment)),
        IoStatus::Error
    );
    assert_eq!(
        complete_one(queue, &data_request(2, IoOp::Read, 104, &segment)),
        IoStatus::Ok
    );
    // Past the end, misaligned and empty-segment requests never reach the device.
    let capacity = queue.geometry().sectors;
    assert_eq!(
        queue.submit(
            &data_request(3, IoOp::Read, capacity - 4, &segment),
            &NoCpuAccess
        ),
        Err(SubmitError::Invalid)
    );
    let empty = [DmaSegment {
        buffer: segment[0].buffer,
        offset: 0,
        len: 0,
    }];
    assert_eq!(
        queue.submit(&data_request(4, IoOp::Read, 0, &empty), &NoCpuAccess),
        Err(SubmitError::Invalid)
    );
    let crossing = [DmaSegment {
        buffer: segment[0].buffer,
        offset: 3584,
        len: 1024,
    }];
    assert_eq!(
        queue.submit(&data_request(5, IoOp::Read, 0, &crossing), &NoCpuAccess),
        Err(SubmitError::Invalid)
    );

    hal.with(|m| m.unsupported_opcodes = vec![0x00, 0x09]);
    let flush = IoRequest {
        tag: 6,
        op: IoOp::Flush,
        sector: 0,
        nr_sectors: 0,
        preflush: false,
        segments: &[],
    };
    assert_eq!(complete_one(queue, &flush), IoStatus::Unsupported);
    let discard = IoRequest {
        tag: 7,
        op: IoOp::Discard { secure: false },
        sector: 8,
        nr_sectors: 8,
        ..flush
    };
    assert_eq!(complete_one(queue, &discard), IoStatus::Unsupported);
    let executed_before = hal.with(|m| m.executed.len());
    let secure = IoRequest {
        tag: 8,
        op: IoOp::Discard { secure: true },
        ..discard
    };
    assert_eq!(complete_one(queue, &secure), IoStatus::Unsupported);
    assert_eq!(
        hal.with(|m| m.executed.len()),
        executed_before,
        "answered locally"
    );
}

#[test]
fn discard_deallocates_and_flush_reaches_the_device() {
    let (hal, mut queues) = bring_up(FakeController::new(1 << 20), 1, 8);
    let queue = &mut queues[0];
    hal.with(|m| m.disk.fill(0xee));
    let discard = IoRequest {
        tag: 1,
        op: IoOp::Discard { secure: false },
        sector: 16,
        nr_sectors: 24,
        preflush: false,
        segments: &[],
    };
    assert_eq!(complete_one(queue, &discard), IoStatus::Ok);
    hal.with(|m| {
        assert!(m.disk[16 * 512..40 * 512].iter().all(|&b| b == 0));
        assert_eq!(m.disk[16 * 512 - 1], 0xee);
        assert_eq!(m.disk[40 * 512], 0xee);
        let last = m.executed.last().unwrap();
        assert_eq!((last.opcode, last.slba, last.blocks), (0x09, 16, 24));
    });
    let flush = IoRequest {
        tag: 2,
        op: IoOp::Flush,
        ..discard
    };
    assert_eq!(complete_one(queue, &flush), IoStatus::Ok);
    assert_eq!(hal.with(|m| m.executed.last().unwrap().opcode), 0x00);

    let no_dsm = {
        let mut fake = FakeController::new(1 << 20);
        fake.dsm = false;
        fake
    };
    let (hal, mut queues) = bring_up(no_dsm, 1, 8);
    assert!(queues[0].geometry().discard.is_none());
    assert_eq!(
        complete_one(&mut queues[0], &discard),
        IoStatus::Unsupported
    );
    assert!(hal.with(|m| m.executed.is_empty()));
}

#[test]
fn discards_are_split_at_the_controllers_range_size_limit() {
    // DMRSL 16 blocks: a range above it would be skipped with success (as QEMU does),
    // so 40 blocks go out as three deallocates of 16, 16 and 8.
    let mut fake = FakeController::new(1 << 20);
    fake.dmrsl = 16;
    let (hal, mut queues) = bring_up(fake, 1, 8);
    let queue = &mut queues[0];
    hal.with(|m| m.disk.fill(0xee));
    let discard = IoRequest {
        tag: 1,
        op: IoOp::Discard { secure: false },
        sector: 100,
        nr_sectors: 40,
        preflush: false,
        segments: &[],
    };
    assert_eq!(complete_one(queue, &discard), IoStatus::Ok);
    hal.with(|m| {
        assert!(m.violations.is_empty(), "{:?}", m.violations);
        let ranges: Vec<_> = m
            .executed
            .iter()
            .map(|e| (e.opcode, e.slba, e.blocks))
            .collect();
        assert_eq!(ranges, [(0x09, 100, 16), (0x09, 116, 16), (0x09, 132, 8)]);
        assert!(m.disk[100 * 512..140 * 512].iter().all(|&b| b == 0));
        assert_eq!((m.disk[100 * 512 - 1], m.disk[140 * 512]), (0xee, 0xee));
    });
    assert_eq!(queue.stats().split_requests, 1);
    // More deallocates than the queue has slots: refused; more than are free: later.
    let huge = IoRequest {
        nr_sectors: 16 * 9,
        ..discard
    };
    assert_eq!(queue.submit(&huge, &NoCpuAccess), Err(SubmitError::Invalid));

    // No command set page (an older controller): no limit, one range.
    let mut fake = FakeController::new(1 << 20);
    fake.no_cs_identify = true;
    fake.dmrsl = 16;
    let (hal, mut queues) = bring_up(fake, 1, 8);
    assert_eq!(complete_one(&mut queues[0], &discard), IoStatus::Ok);
    hal.with(|m| {
        assert_eq!(m.executed.last().map(|e| e.blocks), Some(40));
        assert_eq!(m.violations, ["DSM range of 40 blocks above DMRSL"]);
    });
}

#[test]
fn preflush_write_waits_for_its_flush() {
    let (hal, mut queues) = bring_up(FakeController::new(1 << 20), 1, 8);
    hal.with(|m| m.hold = true);
    let queue = &mut queues[0];
    let pages = hal.with(|m| m.memory.allocate(3)).unwrap();
    let segments: Vec<_> = (0..3)
        .map(|i| DmaSegment {
            buffer: pages + i * 4096,
            offset: if i == 1 { 512 } else { 0 }, // forces three commands
            len: if i == 1 { 1024 } else { 4096 },
        })
        .collect();
    let expected = fill(&hal, &segments, 9);
    let write = IoRequest {
        preflush: true,
        ..data_request(5, IoOp::Write, 64, &segments)
    };
    queue.submit(&write, &NoCpuAccess).unwrap();
    hal.with(|m| m.process());
    let ops: Vec<_> = hal.with(|m| m.executed.iter().map(|e| e.opcode).collect());
    assert_eq!(ops, [0x00], "only the flush is visible before it completes");
    assert!(drain(queue).is_empty());
    hal.with(|m| m.process());
    let done = drain(queue);
    assert_eq!(
        done,
        [Completion {
            tag: 5,
            status: IoStatus::Ok
        }]
    );
    let ops: Vec<_> = hal.with(|m| m.executed.iter().map(|e| e.opcode).collect());
    assert_eq!(ops, [0x00, 0x01, 0x01, 0x01]);
    assert_eq!(
        hal.with(|m| m.disk[64 * 512..][..expected.len()].to_vec()),
        expected
    );

    // A failed pre-flush fails the request without writing.
    hal.with(|m| m.unsupported_opcodes = vec![0x00]);
    let write = IoRequest { tag: 6, ..write };
    queue.submit(&write, &NoCpuAccess).unwrap();
    hal.with(|m| m.process());
    assert_eq!(
        drain(queue),
        [Completion {
            tag: 6,
            status: IoStatus::Unsupported
        }]
    );
    assert_eq!(hal.with(|m| m.executed.len()), 5);
    assert_eq!(queue.queue_depth(), 7);
    for tag in 10..17 {
        queue
            .submit(
                &data_request(tag, IoOp::Read, 0, &segments[..1]),
                &NoCpuAccess,
            )
            .unwrap();
    }
}

#[test]
fn without_recovery_a_fatal_controller_fails_outstanding_requests_and_later_ones_at_its_status_check(
) {
    let mut fake = FakeController::new(1 << 20);
    fake.fatal_after = Some(2);
    let (hal, mut queues) = bring_up_without_recovery(fake, 1, 8);
    let segment = one_page(&hal);
    status_read_by_clock_not_by_polls(&mut queues[0], &segment);
    assert!(queues[0].is_dead());
}

#[test]
fn two_threads_drive_their_own_queues_at_once() {
    let (hal, queues) = bring_up(FakeController::new(8 << 20), 2, 16);
    assert_eq!(queues.len(), 2);
    let threads: Vec<_> = queues
        .into_iter()
        .enumerate()
        .map(|(index, mut queue)| {
            let hal = hal.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(index as u64 + 77);
                let region = index as u64 * 8192; // sectors: 4 MiB each
                let pages = hal.with(|m| m.memory.allocate(8)).unwrap();
                for round in 0..300u32 {
                    let count = 1 + rng.below(8) as usize;
                    let segments: Vec<_> = (0..count)
                        .map(|i| DmaSegment {
                            buffer: pages + i as u64 * 4096,
                            offset: 0,
                            len: 4096,
                        })
                        .collect();
                    let expected = fill(&hal, &segments, round as u8 ^ index as u8);
                    let sector = region + rng.below(8192 - 64);
                    let tag = round;
                    queue
                        .submit(
                            &data_request(tag, IoOp::Write, sector, &segments),
                            &NoCpuAccess,
                        )
                        .unwrap();
                    let mut done = Vec::new();
                    while done.is_empty() {
                        queue.poll_completions(&mut |c| done.push(c));
                    }
                    assert_eq!(
                        done,
                        [Completion {
                            tag,
                            status: IoStatus::Ok
                        }]
                    );
                    let disk =
                        hal.with(|m| m.disk[sector as usize * 512..][..expected.len()].to_vec());
                    assert_eq!(disk, expected);
                }
                queue.stats().completions
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 300);
    }
    hal.with(|m| {
        assert!(m.violations.is_empty());
        assert!(m.executed.iter().any(|e| e.qid == 1) && m.executed.iter().any(|e| e.qid == 2));
    });
}

fn seg(buffer: u64, offset: u32, len: u32) -> DmaSegment {
    DmaSegment {
        buffer,
        offset,
        len,
    }
}

fn plans(
    segments: &[DmaSegment],
    max_pages: usize,
    block: u32,
) -> Result<Vec<CommandPlan>, PlanError> {
    let mut out = Vec::new();
    let n = plan_commands(segments, max_pages, block, &mut |p| out.push(p))?;
    assert_eq!(n, out.len());
    Ok(out)
}

#[test]
fn plans_split_at_prp_breaks_and_at_the_page_limit() {
    let page = |n: u64| n * 4096;
    // Offset first segment to its page end, then whole pages, short last: one command.
    let joined = [
        seg(page(1), 1024, 3072),
        seg(page(5), 0, 4096),
        seg(page(9), 0, 512),
    ];
    assert_eq!(
        plans(&joined, 32, 512).unwrap(),
        [CommandPlan {
            first_segment: 0,
            segment_count: 3,
            byte_offset: 0,
            bytes: 7680
        }]
    );
    // A short middle segment ends a command; an offset segment starts one.
    let broken = [
        seg(page(1), 0, 4096),
        seg(page(2), 0, 512),
        seg(page(3), 0, 4096),
        seg(page(4), 512, 512),
    ];
    let p = plans(&broken, 32, 512).unwrap();
    assert_eq!(p.len(), 3);
    assert_eq!(
        (p[1].first_segment, p[1].segment_count, p[1].byte_offset),
        (2, 1, 4608)
    );
    assert_eq!(
        (p[2].first_segment, p[2].byte_offset, p[2].bytes),
        (3, 8704, 512)
    );
    // Page limit.
    let long: Vec<_> = (0..10).map(|i| seg(page(i + 1), 0, 4096)).collect();
    let p = plans(&long, 4, 512).unwrap();
    assert_eq!(
        p.iter().map(|c| c.segment_count).collect::<Vec<_>>(),
        [4, 4, 2]
    );
    // 4 KiB blocks: a 512-byte command cannot be expressed.
    assert_eq!(plans(&broken, 32, 4096), Err(PlanError::NotBlockMultiple));
    assert_eq!(plans(&[], 32, 512), Err(PlanError::NoSegments));
    // SGL plans ignore page rules; they split at 256 descriptors and at the byte limit.
    let mut sgl = Vec::new();
    plan_sgl_commands(&broken, 8192, 512, &mut |p| sgl.push(p)).unwrap();
    assert_eq!(
        sgl.iter().map(|p| p.segment_count).collect::<Vec<_>>(),
        [2, 2]
    );
    assert_eq!(sgl[1].byte_offset, 4608);
    assert_eq!(
        plans(&[seg(page(1), 2, 512)], 32, 512),
        Err(PlanError::BadSegment(0))
    );
    assert_eq!(
        plans(&[seg(page(1), 0, 4096), seg(page(2), 0, 100)], 32, 512),
        Err(PlanError::BadSegment(1))
    );
    assert_eq!(
        plans(&[seg(u64::MAX - 10, 8, 512)], 32, 512),
        Err(PlanError::BadSegment(0))
    );
}

#[test]
fn with_sgl_support_prp_breaks_become_one_sgl_command() {
    let mut fake = FakeController::new(16 << 20);
    fake.sgl = true;
    fake.mdts = 9; // 2 MiB: no MDTS splits here
    let (hal, mut queues) = bring_up(fake, 1, 8);
    let queue = &mut queues[0];
    // 300 second halves of pages: 300 PRP commands, more than the queue's 7 slots, but
    // two SGL commands (256 descriptors per list page).
    let pages = hal.with(|m| m.memory.allocate(300)).unwrap();
    let halves: Vec<_> = (0..300u64)
        .map(|i| DmaSegment {
            buffer: pages + i * 4096,
            offset: 2048,
            len: 2048,
        })
        .collect();
    let expected = fill(&hal, &halves, 3);
    let write = IoRequest {
        preflush: true,
        ..data_request(1, IoOp::Write, 100, &halves)
    };
    assert_eq!(complete_one(queue, &write), IoStatus::Ok);
    assert_eq!(
        hal.with(|m| m.disk[100 * 512..][..expected.len()].to_vec()),
        expected
    );
    let ops: Vec<_> = hal.with(|m| {
        m.executed
            .iter()
            .map(|e| (e.opcode, e.slba, e.blocks))
            .collect()
    });
    assert_eq!(ops, [(0x00, 0, 0), (0x01, 100, 1024), (0x01, 1124, 176)]);
    // Reading back in one piece per segment, single-segment commands use a data block.
    let back = hal.with(|m| m.memory.allocate(150)).unwrap();
    let whole: Vec<_> = (0..150u64)
        .map(|i| DmaSegment {
            buffer: back + i * 4096,
            offset: 0,
            len: 4096,
        })
        .collect();
    assert_eq!(
        complete_one(queue, &data_request(2, IoOp::Read, 100, &whole)),
        IoStatus::Ok
    );
    assert_eq!(gather(&hal, &whole), expected);
    let broken = [
        DmaSegment {
            buffer: back,
            offset: 512,
            len: 512,
        },
        DmaSegment {
            buffer: back + 4096,
            offset: 1024,
            len: 1024,
        },
    ];
    assert_eq!(
        complete_one(queue, &data_request(3, IoOp::Read, 100, &broken)),
        IoStatus::Ok
    );
    assert_eq!(gather(&hal, &broken), expected[..1536]);
    assert!(
        hal.with(|m| m.violations.is_empty()),
        "{:?}",
        hal.with(|m| m.violations.clone())
    );
}

#[test]
fn a_write_protected_namespace_refuses_writes_and_discards() {
    let mut fake = FakeController::new(1 << 20);
    fake.write_protected = true;
    let (hal, mut queues) = bring_up(fake, 1, 8);
    let queue = &mut queues[0];
    assert!(queue.geometry().read_only);
    let segment = one_page(&hal);
    assert_eq!(
        queue.submit(&data_request(1, IoOp::Write, 0, &segment), &NoCpuAccess),
        Err(SubmitError::Invalid)
    );
    let discard = IoRequest {
        op: IoOp::Discard { secure: false },
        segments: &[],
        ..data_request(2, IoOp::Write, 0, &segment)
    };
    assert_eq!(
        queue.submit(&discard, &NoCpuAccess),
        Err(SubmitError::Invalid)
    );
    assert_eq!(
        complete_one(queue, &data_request(3, IoOp::Read, 0, &segment)),
        IoStatus::Ok
    );
    assert_eq!(hal.with(|m| m.executed.len()), 1);
}

#[test]
fn errors_display_their_cause() {
    let text = |e: &dyn core::error::Error| e.to_string();
    assert_eq!(
        text(&NvmeError::NoSuchNamespace(9)),
        "no active namespace 9"
    );
    assert_eq!(
        text(&PlanError::BadSegment(3)),
        "segment 3 cannot be described"
    );
    assert_eq!(text(&PlanError::NoSegments), "no segments");
}

#[test]
fn without_recovery_a_stalled_command_fails_after_its_deadline_and_the_controller_is_stopped_first()
{
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    let (hal, mut queues) = bring_up_without_recovery(fake, 2, 8);
    let (first, rest) = queues.split_at_mut(1);
    a_stalled_command_fails_after_its_deadline(&mut first[0], &mut rest[0], &hal, 64);
    assert!(hal.with(|m| m.violations.is_empty()));
}

#[test]
fn without_recovery_a_controller_that_cannot_be_stopped_is_reported_so() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(8);
    fake.bus.stop_confirms = false;
    let (hal, mut queues) = bring_up_without_recovery(fake, 1, 8);
    a_device_that_cannot_be_stopped_is_reported_so(&mut queues[0], &hal, 8);
}

#[test]
fn without_recovery_requests_in_flight_when_the_queue_fails_all_fail_and_their_slots_come_back() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(0);
    let (hal, mut queues) = bring_up_without_recovery(fake, 1, 8);
    let queue = &mut queues[0];
    queue.tick(5 * MS, TIMEOUT);
    let page = one_page(&hal);
    // Every slot taken by a stalled read; then the queue is full.
    for tag in 0..7 {
        queue
            .submit(&data_request(tag, IoOp::Read, 0, &page), &NoCpuAccess)
            .unwrap();
    }
    assert_eq!(
        queue.submit(&data_request(7, IoOp::Read, 0, &page), &NoCpuAccess),
        Err(SubmitError::QueueFull)
    );
    queue.tick(6 * MS, TIMEOUT);
    queue.tick(5 * MS + TIMEOUT + cmdslots::scan_interval(TIMEOUT), TIMEOUT);
    let done = drain(queue);
    assert_eq!(done.len(), 7);
    assert!(done.iter().all(|c| c.status == IoStatus::Error));
    // Every slot is free for local answers again.
    for tag in 0..7 {
        queue
            .submit(&data_request(tag, IoOp::Read, 0, &page), &NoCpuAccess)
            .unwrap();
    }
    assert_eq!(drain(queue).len(), 7);
}

#[test]
fn without_a_deadline_a_stalled_command_waits() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(8);
    let (hal, mut queues) = bring_up(fake, 1, 8);
    let queue = &mut queues[0];
    let page = one_page(&hal);
    queue
        .submit(&data_request(1, IoOp::Read, 8, &page), &NoCpuAccess)
        .unwrap();
    for second in 0..100 {
        queue.tick(second * 1000 * MS, 0);
    }
    assert_eq!(queue.fault(), None);
    hal.with(|m| m.finish_stalled());
    assert_eq!(
        drain(queue),
        [Completion {
            tag: 1,
            status: IoStatus::Ok
        }]
    );
}

/// The shutdown's clock in these tests: 1 ms per look.
struct Steps(u64);

impl blkdev::shutdown::Clock for Steps {
    fn now_ns(&mut self) -> u64 {
        self.0
    }
    fn relax(&mut self) {
        self.0 += MS;
    }
}

fn controller_and_queue(fake: FakeController) -> (FakeHal, Controller<FakeHal>, IoQueue<FakeHal>) {
    let hal = FakeHal::new(fake);
    let mut controller = Controller::init(hal.clone(), InitConfig::default()).unwrap();
    let namespace = controller.namespace(1).unwrap();
    controller.request_io_queues(1).unwrap();
    let queue = controller.create_io_queue(&namespace, 8).unwrap();
    (hal, controller, queue)
}

#[test]
fn a_shutdown_flushes_the_cache_then_sends_the_normal_shutdown_notification() {
    use blkdev::shutdown::{flush_all, stop_all, Outcome};
    let (hal, mut controller, mut queue) = controller_and_queue(FakeController::new(1 << 20));
    let page = one_page(&hal);
    assert_eq!(
        complete_one(&mut queue, &data_request(1, IoOp::Write, 8, &page)),
        IoStatus::Ok
    );
    let flushed = flush_all(&mut [&mut queue], 1000 * MS, &mut Steps(0));
    assert_eq!(flushed, [Outcome::Done { ns: 0 }]);
    hal.with(|m| {
        let last = m.executed.last().unwrap();
        assert_eq!(
            (last.qid, last.opcode),
            (1, 0x00),
            "a Flush on the I/O queue"
        );
        assert_eq!(m.shutdowns, 0, "not before the flush");
    });
    let stopped = stop_all(&mut [&mut controller], &mut Steps(0));
    assert_eq!(stopped, [Outcome::Done { ns: 0 }]);
    hal.with(|m| {
        assert_eq!(m.shutdowns, 1);
        assert_eq!((m.cc >> 14) & 0b11, 0b01, "CC.SHN = normal shutdown");
        assert_eq!(m.cc & 1, 1, "CC.EN stays set");
        assert_eq!((m.csts >> 2) & 0b11, 0b10, "CSTS.SHST = complete");
        assert!(m.violations.is_empty(), "{:?}", m.violations);
    });
}

#[test]
fn an_upgrade_disables_the_controller_without_the_shutdown_notification() {
    use blkdev::shutdown::{stop_all, Outcome};
    let (hal, mut controller, _queue) = controller_and_queue(FakeController::new(1 << 20));
    let stopped = stop_all(&mut [&mut crate::Disable(&mut controller)], &mut Steps(0));
    assert_eq!(stopped, [Outcome::Done { ns: 0 }]);
    hal.with(|m| {
        assert_eq!(m.cc & 1, 0, "CC.EN clear");
        assert_eq!(m.csts & 1, 0, "CSTS.RDY clear");
        assert_eq!(m.shutdowns, 0, "no shutdown notification");
        assert_eq!((m.cc >> 14) & 0b11, 0, "CC.SHN untouched");
        assert!(m.violations.is_empty(), "{:?}", m.violations);
    });
}

#[test]
fn without_a_volatile_write_cache_nothing_is_flushed() {
    let mut fake = FakeController::new(1 << 20);
    fake.vwc = false;
    let (hal, _controller, mut queue) = controller_and_queue(fake);
    let outcomes = blkdev::shutdown::flush_all(&mut [&mut queue], 1000 * MS, &mut Steps(0));
    assert_eq!(outcomes, [blkdev::shutdown::Outcome::NotNeeded]);
    assert!(hal.with(|m| m.executed.is_empty()));
}

#[test]
fn a_flush_the_controller_never_answers_is_given_up_at_the_deadline() {
    let (hal, _controller, mut queue) = controller_and_queue(FakeController::new(1 << 20));
    hal.with(|m| m.hold = true);
    let outcomes = blkdev::shutdown::flush_all(&mut [&mut queue], 250 * MS, &mut Steps(0));
    assert_eq!(
        outcomes,
        [blkdev::shutdown::Outcome::GivenUp { ns: 250 * MS }]
    );
}

#[test]
fn the_shutdown_is_waited_for_as_long_as_rtd3e_says_within_5_to_60_s() {
    use blkdev::shutdown::{stop_all, Outcome, Stop};
    for (rtd3e_us, deadline_ms) in [
        (0, 5_000),
        (1_000_000, 5_000),
        (12_500_000, 13_000),
        (100_000_000, 60_000),
    ] {
        let mut fake = FakeController::new(1 << 20);
        fake.rtd3e_us = rtd3e_us;
        fake.shutdown_after_reads = None;
        let (hal, mut controller, _queue) = controller_and_queue(fake);
        assert_eq!(controller.identity().rtd3e_us, rtd3e_us);
        assert_eq!(controller.stop_deadline_ns(), deadline_ms * MS);
        let outcomes = stop_all(&mut [&mut controller], &mut Steps(0));
        assert_eq!(
            outcomes,
            [Outcome::GivenUp {
                ns: deadline_ms * MS
            }],
            "RTD3E {rtd3e_us} us"
        );
        assert_eq!(hal.with(|m| (m.shutdowns, (m.csts >> 2) & 0b11)), (1, 0b01));
    }
    // One that takes a while, within its deadline.
    let mut fake = FakeController::new(1 << 20);
    fake.shutdown_after_reads = Some(30);
    let (_hal, mut controller, _queue) = controller_and_queue(fake);
    assert_eq!(
        stop_all(&mut [&mut controller], &mut Steps(0)),
        [Outcome::Done { ns: 30 * MS }]
    );
}

#[test]
fn a_controller_that_fails_during_its_shutdown_is_reported() {
    let mut fake = FakeController::new(1 << 20);
    fake.shutdown_after_reads = None;
    let (hal, mut controller, _queue) = controller_and_queue(fake);
    hal.with(|m| m.csts |= 2);
    let outcomes = blkdev::shutdown::stop_all(&mut [&mut controller], &mut Steps(0));
    assert_eq!(
        outcomes,
        [blkdev::shutdown::Outcome::Failed(
            "controller fatal status (CSTS.CFS)".into()
        )]
    );
}
