// SPDX-License-Identifier: MIT OR Apache-2.0
use crate::fake::{FakeDevice, FakeHal};
use crate::*;
use blkdev::{BlockDevice, Completion, DmaSegment, IoOp, IoRequest, IoStatus, SubmitError};
use cmdslots::fake::{
    a_device_that_cannot_be_stopped_is_reported_so, a_stalled_command_fails_after_its_deadline,
    complete_one, data_request, drain, status_read_by_clock_not_by_polls, NoCpuAccess,
};
use cmdslots::RecoveryConfig;

fn bring_up(fake: FakeDevice, queues: usize, size: u16) -> (FakeHal, Vec<BlkQueue<FakeHal>>) {
    let (hal, _, queues) = bring_up_with(fake, queues, size, RecoveryConfig::DEFAULT);
    (hal, queues)
}

/// A device that is never recovered (`device.max-resets=0`): a queue with an overdue
/// request, or a device asking for a reset, fails for good at once.
fn bring_up_without_recovery(
    fake: FakeDevice,
    queues: usize,
    size: u16,
) -> (FakeHal, Vec<BlkQueue<FakeHal>>) {
    let (hal, _, queues) = bring_up_with(fake, queues, size, RecoveryConfig::NEVER);
    (hal, queues)
}

pub(crate) fn bring_up_with(
    fake: FakeDevice,
    queues: usize,
    size: u16,
    recovery: RecoveryConfig,
) -> (FakeHal, VirtioBlk<FakeHal>, Vec<BlkQueue<FakeHal>>) {
    let hal = FakeHal::new(fake);
    let mut device = VirtioBlk::init(hal.clone(), crate::fake::regions(), recovery).unwrap();
    let queues = (0..queues)
        .map(|_| device.create_queue(size).unwrap())
        .collect();
    device.start();
    (hal, device, queues)
}

fn no_data(tag: u32, op: IoOp, sector: u64, nr_sectors: u64) -> IoRequest<'static> {
    IoRequest {
        tag,
        op,
        sector,
        nr_sectors,
        preflush: false,
        segments: &[],
    }
}

/// `count` segments of `len` bytes, each in its own fresh page at `offset`.
fn segments(hal: &FakeHal, count: usize, offset: u32, len: u32) -> Vec<DmaSegment> {
    let pages = hal.with(|m| m.memory.allocate(count)).unwrap();
    (0..count)
        .map(|i| DmaSegment {
            buffer: pages + i as u64 * 4096,
            offset,
            len,
        })
        .collect()
}

fn memory_of(hal: &FakeHal, segments: &[DmaSegment]) -> Vec<u8> {
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

fn no_violations(hal: &FakeHal) {
    let violations = hal.with(|m| m.violations.clone());
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn negotiates_features_and_sets_up_queues() {
    let hal = FakeHal::new(FakeDevice::new(4 << 20));
    let mut device =
        VirtioBlk::init(hal.clone(), crate::fake::regions(), RecoveryConfig::DEFAULT).unwrap();
    let config = *device.config();
    assert_eq!(config.capacity, (4 << 20) / 512);
    assert_eq!(config.num_queues, 4);
    assert_eq!(config.seg_max, Some(126));
    assert!(config.flush && !config.read_only);
    assert_eq!(config.discard, Some((64, 8)));
    let accepted = hal.with(|m| m.accepted);
    assert_eq!(accepted & (1 << 29), 0, "EVENT_IDX left alone");
    assert_ne!(accepted & feature::BLK_MQ, 0);
    let queue = device.create_queue(100).unwrap();
    assert_eq!(queue.queue_depth(), 64, "rounded down to a power of two");
    for _ in 1..4 {
        device.create_queue(512).unwrap();
    }
    assert!(matches!(
        device.create_queue(8),
        Err(VirtioError::NoQueueLeft)
    ));
    device.start();
    assert_eq!(hal.with(|m| m.status), 1 | 2 | 8 | 4);
    let g = queue.geometry();
    assert!(g.flush && g.discard.is_some());
    assert_eq!(g.discard.unwrap().granularity, 4096);
    no_violations(&hal);
}

#[test]
fn devices_without_what_the_driver_needs_are_refused() {
    // A legacy-only device (no VERSION_1).
    let mut fake = FakeDevice::new(1 << 20);
    fake.offered &= !feature::VERSION_1;
    let hal = FakeHal::new(fake);
    assert_eq!(
        VirtioBlk::init(hal.clone(), crate::fake::regions(), RecoveryConfig::DEFAULT).err(),
        Some(VirtioError::MissingFeature("VIRTIO_F_VERSION_1"))
    );
    assert_ne!(hal.with(|m| m.status) & 0x80, 0, "FAILED set");
    let mut fake = FakeDevice::new(1 << 20);
    fake.refuse_features = true;
    let hal = FakeHal::new(fake);
    assert_eq!(
        VirtioBlk::init(hal, crate::fake::regions(), RecoveryConfig::DEFAULT).err(),
        Some(VirtioError::FeaturesRefused)
    );
}

#[test]
fn long_requests_split_at_seg_max_and_round_trip() {
    let mut fake = FakeDevice::new(8 << 20);
    fake.seg_max = 5;
    let (hal, mut queues) = bring_up(fake, 1, 16);
    let queue = &mut queues[0];
    let mut seed = 0x1234_5678u32;
    for round in 0..30u32 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let count = 1 + (seed >> 8) as usize % 23;
        let offset = ((seed >> 4) % 8) * 512;
        let len = 512 * (1 + (seed >> 12) % (8 - offset / 512));
        let write = segments(&hal, count, offset, len);
        hal.with(|m| {
            for (i, s) in write.iter().enumerate() {
                let at = (s.buffer + u64::from(s.offset)) as usize;
                for (j, b) in m.memory[at..at + s.len as usize].iter_mut().enumerate() {
                    *b = (round as usize * 31 + i * 7 + j) as u8;
                }
            }
        });
        let expected = memory_of(&hal, &write);
        let sector = u64::from(seed % 8000);
        assert_eq!(
            complete_one(queue, &data_request(round, IoOp::Write, sector, &write)),
            IoStatus::Ok
        );
        let disk = hal.with(|m| m.disk[sector as usize * 512..][..expected.len()].to_vec());
        assert_eq!(disk, expected, "round {round}");
        let mut read = segments(&hal, expected.len().div_ceil(4096), 0, 4096);
        let tail = expected.len() - (read.len() - 1) * 4096;
        read.last_mut().unwrap().len = tail as u32;
        assert_eq!(
            complete_one(queue, &data_request(round + 500, IoOp::Read, sector, &read)),
            IoStatus::Ok
        );
        assert_eq!(memory_of(&hal, &read), expected);
    }
    hal.with(|m| {
        assert!(m.served.iter().all(|s| s.segments <= 5));
        assert!(
            m.served.len() > 60,
            "requests were split: {}",
            m.served.len()
        );
    });
    no_violations(&hal);
}

#[test]
fn ring_indices_wrap_past_u16() {
    let (hal, mut queues) = bring_up(FakeDevice::new(1 << 20), 1, 4);
    let queue = &mut queues[0];
    for tag in 0..70_000u32 {
        assert_eq!(
            complete_one(queue, &no_data(tag, IoOp::Flush, 0, 0)),
            IoStatus::Ok,
            "request {tag}"
        );
    }
    assert_eq!(hal.with(|m| m.served.len()), 70_000);
    no_violations(&hal);
}

#[test]
fn a_full_queue_refuses_until_completions_are_polled() {
    let (hal, mut queues) = bring_up(FakeDevice::new(1 << 20), 1, 8);
    hal.with(|m| m.hold = true);
    let queue = &mut queues[0];
    let one = segments(&hal, 1, 0, 4096);
    let mut accepted = 0;
    let refused = loop {
        match queue.submit(&data_request(accepted, IoOp::Read, 0, &one), &NoCpuAccess) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
    };
    assert_eq!((refused, accepted), (SubmitError::QueueFull, 8));
    assert!(drain(queue).is_empty());
    hal.with(|m| m.process());
    let mut tags: Vec<_> = drain(queue).iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, (0..8).collect::<Vec<_>>());
    // More parts than the whole queue can ever hold: invalid, not "full".
    let mut fake = FakeDevice::new(1 << 20);
    fake.seg_max = 1;
    let (hal, mut queues) = bring_up(fake, 1, 4);
    let many = segments(&hal, 5, 0, 512);
    assert_eq!(
        queues[0].submit(&data_request(1, IoOp::Write, 0, &many), &NoCpuAccess),
        Err(SubmitError::Invalid)
    );
}

#[test]
fn errors_unsupported_and_refused_requests() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.fail_sector = Some(40);
    fake.offered &= !feature::BLK_FLUSH;
    let (hal, mut queues) = bring_up(fake, 1, 8);
    let queue = &mut queues[0];
    let one = segments(&hal, 1, 0, 4096);
    assert_eq!(
        complete_one(queue, &data_request(1, IoOp::Read, 36, &one)),
        IoStatus::Error
    );
    assert_eq!(
        complete_one(queue, &data_request(2, IoOp::Read, 41, &one)),
        IoStatus::Ok
    );
    let served = hal.with(|m| m.served.len());
    assert_eq!(
        complete_one(queue, &no_data(3, IoOp::Flush, 0, 0)),
        IoStatus::Unsupported
    );
    assert_eq!(
        complete_one(queue, &no_data(4, IoOp::Discard { secure: true }, 0, 8)),
        IoStatus::Unsupported
    );
    assert_eq!(
        hal.with(|m| m.served.len()),
        served,
        "answered without the device"
    );
    hal.with(|m| m.unsupported_kinds = vec![11]);
    assert_eq!(
        complete_one(queue, &no_data(5, IoOp::Discard { secure: false }, 0, 8)),
        IoStatus::Unsupported
    );
    let sectors = queue.geometry().sectors;
    for bad in [
        data_request(6, IoOp::Read, sectors - 1, &one),
        IoRequest {
            nr_sectors: 7,
            ..data_request(7, IoOp::Read, 0, &one)
        },
        data_request(8, IoOp::Read, 0, &[]),
    ] {
        assert_eq!(queue.submit(&bad, &NoCpuAccess), Err(SubmitError::Invalid));
    }
    let crossing = segments(&hal, 1, 3584, 1024);
    assert_eq!(
        queue.submit(&data_request(9, IoOp::Read, 0, &crossing), &NoCpuAccess),
        Err(SubmitError::Invalid)
    );

    let mut fake = FakeDevice::new(1 << 20);
    fake.offered |= feature::BLK_RO;
    let (hal, mut queues) = bring_up(fake, 1, 8);
    assert!(queues[0].geometry().read_only);
    let one = segments(&hal, 1, 0, 4096);
    assert_eq!(
        queues[0].submit(&data_request(1, IoOp::Write, 0, &one), &NoCpuAccess),
        Err(SubmitError::Invalid)
    );
}

#[test]
fn discard_splits_at_the_device_limit_and_zeroes() {
    let (hal, mut queues) = bring_up(FakeDevice::new(1 << 20), 1, 8);
    hal.with(|m| m.disk.fill(0xaa));
    let queue = &mut queues[0];
    assert_eq!(
        complete_one(queue, &no_data(1, IoOp::Discard { secure: false }, 96, 150)),
        IoStatus::Ok
    );
    hal.with(|m| {
        assert!(m.disk[96 * 512..246 * 512].iter().all(|&b| b == 0));
        assert_eq!((m.disk[96 * 512 - 1], m.disk[246 * 512]), (0xaa, 0xaa));
        let ranges: Vec<_> = m.served.iter().map(|s| (s.sector, s.bytes / 512)).collect();
        assert_eq!(ranges, [(96, 64), (160, 64), (224, 22)]);
    });
    no_violations(&hal);
}

#[test]
fn discard_pieces_start_on_the_devices_alignment() {
    // At most 60 sectors a range, aligned to 8: pieces of 56, each on the alignment.
    let mut fake = FakeDevice::new(1 << 20);
    fake.max_discard_sectors = 60;
    let (hal, mut queues) = bring_up(fake, 1, 8);
    hal.with(|m| m.disk.fill(0xaa));
    assert_eq!(
        complete_one(
            &mut queues[0],
            &no_data(1, IoOp::Discard { secure: false }, 96, 150)
        ),
        IoStatus::Ok
    );
    hal.with(|m| {
        let ranges: Vec<_> = m.served.iter().map(|s| (s.sector, s.bytes / 512)).collect();
        assert_eq!(ranges, [(96, 56), (152, 56), (208, 38)]);
        assert!(m.disk[96 * 512..246 * 512].iter().all(|&b| b == 0));
        assert_eq!((m.disk[96 * 512 - 1], m.disk[246 * 512]), (0xaa, 0xaa));
    });
    no_violations(&hal);
}

#[test]
fn preflush_write_waits_for_its_flush() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.seg_max = 2;
    let (hal, mut queues) = bring_up(fake, 1, 8);
    hal.with(|m| m.hold = true);
    let queue = &mut queues[0];
    let write = segments(&hal, 3, 0, 4096);
    let request = IoRequest {
        preflush: true,
        ..data_request(5, IoOp::Write, 16, &write)
    };
    queue.submit(&request, &NoCpuAccess).unwrap();
    hal.with(|m| m.process());
    assert_eq!(
        hal.with(|m| m.served.iter().map(|s| s.kind).collect::<Vec<_>>()),
        [4]
    );
    assert!(drain(queue).is_empty());
    hal.with(|m| m.process());
    assert_eq!(
        drain(queue),
        [Completion {
            tag: 5,
            status: IoStatus::Ok
        }]
    );
    let served = hal.with(|m| m.served.clone());
    let kinds: Vec<_> = served
        .iter()
        .map(|s| (s.kind, s.sector, s.segments))
        .collect();
    assert_eq!(kinds, [(4, 0, 0), (1, 16, 2), (1, 32, 1)]);
    no_violations(&hal);
}

#[test]
fn without_recovery_a_device_needing_reset_fails_outstanding_and_later_requests_at_its_status_check(
) {
    let mut fake = FakeDevice::new(1 << 20);
    fake.reset_after = Some(2);
    let (hal, mut queues) = bring_up_without_recovery(fake, 1, 8);
    let one = segments(&hal, 1, 0, 4096);
    status_read_by_clock_not_by_polls(&mut queues[0], &one);
    assert!(queues[0].is_dead());
}

#[test]
fn two_threads_drive_their_own_queues_at_once() {
    let (hal, queues) = bring_up(FakeDevice::new(8 << 20), 2, 32);
    let threads: Vec<_> = queues
        .into_iter()
        .enumerate()
        .map(|(index, mut queue)| {
            let hal = hal.clone();
            std::thread::spawn(move || {
                let buffer = segments(&hal, 4, 0, 4096);
                for round in 0..300u32 {
                    let fill = (round as u8) ^ (index as u8 * 0x55);
                    hal.with(|m| {
                        let at = buffer[0].buffer as usize;
                        m.memory[at..at + 4 * 4096].fill(fill);
                    });
                    let sector = index as u64 * 8192 + u64::from(round % 200) * 32;
                    queue
                        .submit(
                            &data_request(round, IoOp::Write, sector, &buffer),
                            &NoCpuAccess,
                        )
                        .unwrap();
                    let mut done = Vec::new();
                    while done.is_empty() {
                        queue.poll_completions(&mut |c| done.push(c));
                    }
                    assert_eq!(done[0].status, IoStatus::Ok);
                    let disk = hal.with(|m| m.disk[sector as usize * 512..][..4 * 4096].to_vec());
                    assert!(disk.iter().all(|&b| b == fill));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    hal.with(|m| {
        assert!(m.served.iter().any(|s| s.queue == 0) && m.served.iter().any(|s| s.queue == 1));
    });
    no_violations(&hal);
}

#[test]
fn without_indirect_descriptors_each_slot_owns_a_fixed_chain() {
    let mut fake = FakeDevice::new(4 << 20);
    fake.offered &= !feature::RING_INDIRECT_DESC;
    let (hal, mut queues) = bring_up(fake, 1, 64);
    assert_eq!(hal.with(|m| m.accepted) & feature::RING_INDIRECT_DESC, 0);
    let queue = &mut queues[0];
    // 64 descriptors, 18 per slot (header, 16 data, status): 3 slots.
    assert_eq!(queue.queue_depth(), 3);
    let write = segments(&hal, 40, 512, 2048);
    hal.with(|m| {
        for (i, s) in write.iter().enumerate() {
            let at = (s.buffer + u64::from(s.offset)) as usize;
            m.memory[at..at + 2048].fill(i as u8 + 1);
        }
    });
    let expected = memory_of(&hal, &write);
    // 40 segments: parts of 16, 16 and 8, behind a pre-flush: more than 3 slots.
    let request = IoRequest {
        preflush: true,
        ..data_request(1, IoOp::Write, 8, &write)
    };
    assert_eq!(
        queue.submit(&request, &NoCpuAccess),
        Err(SubmitError::Invalid)
    );
    assert_eq!(
        complete_one(queue, &data_request(2, IoOp::Write, 8, &write)),
        IoStatus::Ok
    );
    assert_eq!(
        hal.with(|m| m.disk[8 * 512..][..expected.len()].to_vec()),
        expected
    );
    let parts: Vec<_> = hal.with(|m| m.served.iter().map(|s| (s.sector, s.segments)).collect());
    assert_eq!(parts, [(8, 16), (72, 16), (136, 8)]);
    // Many rounds: the avail and used indices wrap the ring several times.
    let read = segments(&hal, 20, 0, 4096);
    for round in 0..100u32 {
        assert_eq!(
            complete_one(queue, &data_request(10 + round, IoOp::Read, 8, &read)),
            IoStatus::Ok
        );
    }
    assert_eq!(memory_of(&hal, &read), expected);
    no_violations(&hal);
}

#[test]
fn errors_display_their_cause() {
    let text = |e: &dyn core::error::Error| e.to_string();
    assert_eq!(
        text(&VirtioError::QueueUnavailable(2)),
        "queue 2 is not available"
    );
}

#[test]
fn without_recovery_a_stalled_request_fails_after_its_deadline_and_the_device_is_stopped_first() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.stall_sector = Some(64);
    let (hal, mut queues) = bring_up_without_recovery(fake, 2, 8);
    let (first, rest) = queues.split_at_mut(1);
    a_stalled_command_fails_after_its_deadline(&mut first[0], &mut rest[0], &hal, 64);
    no_violations(&hal);
}

#[test]
fn without_recovery_a_virtio_device_that_cannot_be_stopped_is_reported_so() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.stall_sector = Some(8);
    fake.bus.stop_confirms = false;
    let (hal, mut queues) = bring_up_without_recovery(fake, 1, 8);
    a_device_that_cannot_be_stopped_is_reported_so(&mut queues[0], &hal, 8);
}

/// The shutdown's clock in these tests: 1 ms per look.
struct Steps(u64);

impl blkdev::shutdown::Clock for Steps {
    fn now_ns(&mut self) -> u64 {
        self.0
    }
    fn relax(&mut self) {
        self.0 += 1_000_000;
    }
}

fn device_and_queue(fake: FakeDevice) -> (FakeHal, VirtioBlk<FakeHal>, BlkQueue<FakeHal>) {
    let hal = FakeHal::new(fake);
    let mut device =
        VirtioBlk::init(hal.clone(), crate::fake::regions(), RecoveryConfig::DEFAULT).unwrap();
    let queue = device.create_queue(16).unwrap();
    device.start();
    (hal, device, queue)
}

#[test]
fn a_shutdown_flushes_the_cache_then_resets_the_device() {
    use blkdev::shutdown::{flush_all, stop_all, Outcome};
    let (hal, mut device, mut queue) = device_and_queue(FakeDevice::new(1 << 20));
    let data = segments(&hal, 1, 0, 4096);
    assert_eq!(
        complete_one(&mut queue, &data_request(1, IoOp::Write, 8, &data)),
        IoStatus::Ok
    );
    assert_eq!(
        flush_all(&mut [&mut queue], 1_000_000_000, &mut Steps(0)),
        [Outcome::Done { ns: 0 }]
    );
    hal.with(|m| {
        assert_eq!(m.served.last().unwrap().kind, 4, "VIRTIO_BLK_T_FLUSH");
        assert_eq!(m.resets, 1, "only init's reset before the flush");
    });
    assert_eq!(
        stop_all(&mut [&mut device], &mut Steps(0)),
        [Outcome::Done { ns: 0 }]
    );
    hal.with(|m| {
        assert_eq!(m.resets, 2);
        assert_eq!(m.status, 0);
    });
    no_violations(&hal);
}

#[test]
fn without_the_flush_feature_nothing_is_flushed() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.offered &= !feature::BLK_FLUSH;
    let (hal, _device, mut queue) = device_and_queue(fake);
    assert_eq!(
        blkdev::shutdown::flush_all(&mut [&mut queue], 1_000_000_000, &mut Steps(0)),
        [blkdev::shutdown::Outcome::NotNeeded]
    );
    assert!(hal.with(|m| m.served.is_empty()));
}

#[test]
fn a_reset_that_does_not_finish_is_given_up_after_its_deadline() {
    use blkdev::shutdown::{stop_all, Outcome};
    let (hal, mut device, _queue) = device_and_queue(FakeDevice::new(1 << 20));
    hal.with(|m| m.reset_after_reads = None);
    assert_eq!(
        stop_all(&mut [&mut device], &mut Steps(0)),
        [Outcome::GivenUp {
            ns: RESET_TIMEOUT_MS * 1_000_000
        }]
    );
    assert_ne!(hal.with(|m| m.status), 0);
    hal.with(|m| m.reset_after_reads = Some(20));
    assert_eq!(
        stop_all(&mut [&mut device], &mut Steps(0)),
        [Outcome::Done { ns: 20_000_000 }]
    );
    assert_eq!(hal.with(|m| (m.resets, m.status)), (3, 0));
}
