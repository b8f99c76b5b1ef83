// SPDX-License-Identifier: MIT OR Apache-2.0
//! A virtio-blk device whose request times out, or that asks for a reset, is reset
//! (virtio-blk has no abort) and serves again; only the requests it lost fail. One that
//! does not come back is given up after its resets in a row.

use crate::fake::FakeDevice;
use crate::tests::bring_up_with;
use blkdev::{BlockDevice, Completion, DeviceFault, FaultKind, IoOp, IoStatus, SubmitError};
use cmdslots::fake::{
    a_given_up_device_fails_every_queue, complete_one, data_request, drain, writes_and_reads_back,
    FaultyDevice, NoCpuAccess, MS, TIMEOUT,
};
use cmdslots::recovery::RESET_RETRY_NS;
use cmdslots::{RecoveryConfig, RecoveryStep};

/// When a request launched at 0 is found overdue: past the deadline, at a scan.
const OVERDUE: u64 = TIMEOUT + 1_000 * MS;

fn error(tag: u32) -> Completion {
    Completion {
        tag,
        status: IoStatus::Error,
    }
}

#[test]
fn a_stalled_request_resets_the_device_and_only_the_lost_requests_fail() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.stall_sector = Some(64);
    let (hal, mut device, mut queues) = bring_up_with(fake, 2, 8, RecoveryConfig::DEFAULT);
    let (stalled, fine) = (hal.page(), hal.page());
    hal.fill(&stalled[0], 0xa5);
    for queue in &mut queues {
        queue.tick(0, TIMEOUT);
    }
    let read = |tag, sector, page| data_request(tag, IoOp::Read, sector, page);
    queues[0]
        .submit(&read(1, 64, &stalled), &NoCpuAccess)
        .unwrap();
    assert_eq!(
        complete_one(&mut queues[1], &read(2, 0, &fine)),
        IoStatus::Ok
    );
    queues[0].tick(MS, TIMEOUT);
    assert_eq!(device.recover(MS), RecoveryStep::Idle);
    queues[0].tick(OVERDUE, TIMEOUT);
    assert_eq!(device.recover(OVERDUE), RecoveryStep::Reset);
    assert_eq!(hal.with(|m| m.resets), 2, "init's reset and the recovery's");
    assert_eq!(drain(&mut queues[0]), [error(1)]);
    assert!(drain(&mut queues[1]).is_empty());
    // The stalled request ran at the reset, bus mastering off: nothing landed.
    assert!(hal.holds_only(&stalled[0], 0xa5));
    // From fresh rings: the device serves what is sent now, nothing left from before.
    let served = hal.with(|m| m.served.len());
    for (n, queue) in queues.iter_mut().enumerate() {
        let what = (10 + 2 * n as u32, 128 + 8 * n as u64, 0x50 + n as u8);
        assert!(writes_and_reads_back(queue, &hal, &fine, what));
        assert_eq!(queue.fault(), None);
    }
    assert_eq!(hal.with(|m| m.served.len()), served + 4);
    let violations = hal.with(|m| m.violations.clone());
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn a_device_needing_reset_is_reset_and_serves_again() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.reset_after = Some(1);
    let (hal, mut device, mut queues) = bring_up_with(fake, 1, 8, RecoveryConfig::DEFAULT);
    let queue = &mut queues[0];
    let page = hal.page();
    let read = |tag| data_request(tag, IoOp::Read, 0, &page);
    queue.tick(0, TIMEOUT);
    assert_eq!(complete_one(queue, &read(1)), IoStatus::Ok);
    queue.submit(&read(2), &NoCpuAccess).unwrap();
    queue.tick(MS, TIMEOUT);
    queue.tick(MS + cmdslots::HEALTH_CHECK_INTERVAL_NS, TIMEOUT);
    hal.with(|m| m.reset_after = None);
    assert_eq!(device.recover(20 * MS), RecoveryStep::Reset);
    assert_eq!(drain(queue), [error(2)]);
    assert_eq!(complete_one(queue, &read(3)), IoStatus::Ok);
    assert_eq!(queue.fault(), None);
}

#[test]
fn a_device_that_does_not_come_back_is_given_up_after_its_resets() {
    let mut fake = FakeDevice::new(1 << 20);
    fake.stall_sector = Some(64);
    let recovery = RecoveryConfig {
        max_resets: 2,
        wake: None,
    };
    let (hal, mut device, mut queues) = bring_up_with(fake, 2, 8, recovery);
    let page = hal.page();
    let read = |tag, sector| data_request(tag, IoOp::Read, sector, &page);
    queues[0].tick(0, TIMEOUT);
    queues[0].submit(&read(1, 64), &NoCpuAccess).unwrap();
    queues[0].tick(MS, TIMEOUT);
    queues[0].tick(OVERDUE, TIMEOUT);
    // Each reset fails (the device refuses the features it took before); meanwhile
    // requests wait.
    hal.with(|m| m.refuse_features = true);
    let mut now = OVERDUE;
    for _ in 0..2 {
        assert_eq!(device.recover(now), RecoveryStep::At(now + RESET_RETRY_NS));
        assert_eq!(
            queues[1].submit(&read(2, 0), &NoCpuAccess),
            Err(SubmitError::QueueFull)
        );
        now += RESET_RETRY_NS;
    }
    assert_eq!(
        device.recover(now),
        RecoveryStep::GaveUp { dma_stopped: true }
    );
    assert!(device.is_stopped());
    let fault = DeviceFault {
        kind: FaultKind::Timeout {
            waited_ms: OVERDUE / MS,
        },
        dma_stopped: true,
    };
    let (holder, idle) = queues.split_at_mut(1);
    a_given_up_device_fails_every_queue(&mut holder[0], &mut idle[0], &hal, (fault, 1, now));
}
