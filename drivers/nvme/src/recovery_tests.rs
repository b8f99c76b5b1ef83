// SPDX-License-Identifier: MIT OR Apache-2.0
//! A controller whose command times out recovers: the overdue command is aborted, or the
//! controller reset, and only the commands it lost fail; one that does not come back
//! is given up after its resets in a row.

use crate::fake::FakeController;
use crate::tests::{bring_up_with, one_page};
use blkdev::{BlockDevice, Completion, DeviceFault, FaultKind, IoOp, IoStatus, SubmitError};
use cmdslots::fake::{
    a_given_up_device_fails_every_queue, complete_one, data_request, drain, writes_and_reads_back,
    FaultyDevice, NoCpuAccess, MS, TIMEOUT,
};
use cmdslots::recovery::{ABORT_WAIT_NS, RESET_RETRY_NS};
use cmdslots::{RecoveryConfig, RecoveryStep};

/// When a command launched at 1 ms is found overdue: past the deadline, at a scan.
const OVERDUE: u64 = TIMEOUT + 2 * MS + 1_000 * MS;

fn error(tag: u32) -> Completion {
    Completion {
        tag,
        status: IoStatus::Error,
    }
}

fn read(tag: u32, sector: u64, page: &[blkdev::DmaSegment]) -> blkdev::IoRequest<'_> {
    data_request(tag, IoOp::Read, sector, page)
}

/// Submits a read of `sector` the controller will hold, at 1 ms; returns `at` past its
/// deadline, with the queue ticked there (the overdue command found).
fn stall<Q: BlockDevice>(
    queue: &mut Q,
    tag: u32,
    sector: u64,
    page: &[blkdev::DmaSegment],
    at: u64,
) -> u64 {
    queue.tick(at, TIMEOUT);
    queue
        .submit(&read(tag, sector, page), &NoCpuAccess)
        .unwrap();
    queue.tick(at + MS, TIMEOUT);
    let overdue = at + OVERDUE;
    queue.tick(overdue, TIMEOUT);
    overdue
}

#[test]
fn an_overdue_command_the_controller_aborts_fails_alone_without_a_reset() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    fake.honour_abort = true;
    let (hal, mut controller, mut queues) = bring_up_with(fake, 1, 8, RecoveryConfig::DEFAULT);
    let queue = &mut queues[0];
    let (stalled, fine) = (one_page(&hal), one_page(&hal));
    queue.tick(0, TIMEOUT);
    queue.submit(&read(1, 64, &stalled), &NoCpuAccess).unwrap();
    assert_eq!(complete_one(queue, &read(2, 0, &fine)), IoStatus::Ok);
    queue.tick(MS, TIMEOUT);
    assert_eq!(
        controller.recover(MS),
        RecoveryStep::Idle,
        "nothing overdue yet"
    );
    queue.tick(OVERDUE, TIMEOUT);
    // The control path sends the abort the queue asked for; the controller takes the
    // command back, which fails its request alone.
    assert_eq!(
        controller.recover(OVERDUE),
        RecoveryStep::At(OVERDUE + ABORT_WAIT_NS)
    );
    assert_eq!(hal.with(|m| m.aborts.clone()), [(1, 0)]);
    assert_eq!(drain(queue), [error(1)]);
    // Its command is back: nothing more to do, no reset, then or later.
    assert_eq!(controller.recover(OVERDUE + MS), RecoveryStep::Idle);
    assert_eq!(
        controller.recover(OVERDUE + 2 * ABORT_WAIT_NS),
        RecoveryStep::Idle
    );
    assert_eq!(hal.with(|m| m.resets), 0);
    assert_eq!(complete_one(queue, &read(3, 64 + 8, &fine)), IoStatus::Ok);
    assert_eq!(queue.fault(), None);
}

#[test]
fn a_controller_that_does_not_abort_is_reset_and_only_the_lost_commands_fail() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    let (hal, mut controller, mut queues) = bring_up_with(fake, 3, 8, RecoveryConfig::DEFAULT);
    // Another controller, which nothing here touches.
    let (other_hal, _, mut other) =
        bring_up_with(FakeController::new(1 << 20), 1, 8, RecoveryConfig::DEFAULT);
    let other_page = one_page(&other_hal);
    let (stalled, held, fine) = (one_page(&hal), one_page(&hal), one_page(&hal));
    hal.fill(&stalled[0], 0xa5);
    let overdue = {
        let (first, rest) = queues.split_at_mut(1);
        let overdue = stall(&mut first[0], 1, 64, &stalled, 0);
        assert_eq!(
            complete_one(&mut first[0], &read(2, 0, &fine)),
            IoStatus::Ok
        );
        // A command of another queue the controller has not even started.
        hal.with(|m| m.hold = true);
        rest[0].submit(&read(3, 128, &held), &NoCpuAccess).unwrap();
        hal.with(|m| m.hold = false);
        overdue
    };
    // The abort is not taken; the reset is tried and fails once (the controller never
    // gets ready): meanwhile the queues touch nothing and take no request.
    hal.with(|m| m.never_ready = true);
    let retry = overdue + RESET_RETRY_NS;
    assert_eq!(controller.recover(overdue), RecoveryStep::At(retry));
    assert_eq!(hal.with(|m| m.aborts.clone()), [(1, 0)]);
    assert!(controller.is_resetting());
    let doorbells = hal.handed();
    assert_eq!(
        queues[2].submit(&read(4, 0, &fine), &NoCpuAccess),
        Err(SubmitError::QueueFull)
    );
    for queue in &mut queues {
        queue.tick(retry - MS, TIMEOUT);
        assert!(drain(queue).is_empty());
        assert_eq!(queue.fault(), None);
    }
    assert_eq!(hal.handed(), doorbells);
    // Back: each queue fails what it held, the rest of the device is untouched.
    hal.with(|m| m.never_ready = false);
    assert_eq!(controller.recover(retry), RecoveryStep::Reset);
    assert!(!controller.is_resetting());
    assert_eq!(drain(&mut queues[0]), [error(1)]);
    assert_eq!(drain(&mut queues[1]), [error(3)]);
    assert!(drain(&mut queues[2]).is_empty());
    // The stalled read ran when the controller was disabled, bus mastering off: its
    // data reached nothing.
    assert!(hal.holds_only(&stalled[0], 0xa5));
    assert_eq!(hal.with(|m| m.resets), 2);
    // Every queue serves again, from fresh rings, data and all.
    for (n, queue) in queues.iter_mut().enumerate() {
        let what = (10 + 2 * n as u32, 256 + 8 * n as u64, 0x40 + n as u8);
        assert!(writes_and_reads_back(queue, &hal, &fine, what));
        assert_eq!(queue.fault(), None);
    }
    assert_eq!(controller.recover(retry + MS), RecoveryStep::Idle);
    assert!(
        hal.with(|m| m.violations.is_empty()),
        "{:?}",
        hal.with(|m| m.violations.clone())
    );
    assert_eq!(
        complete_one(&mut other[0], &read(1, 0, &other_page)),
        IoStatus::Ok
    );
    assert_eq!(other_hal.with(|m| m.resets), 0);
}

#[test]
fn a_controller_that_never_comes_back_is_given_up_after_its_resets() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    let recovery = RecoveryConfig {
        max_resets: 2,
        wake: None,
    };
    let (hal, mut controller, mut queues) = bring_up_with(fake, 2, 8, recovery);
    let page = one_page(&hal);
    let overdue = stall(&mut queues[0], 1, 64, &page, 0);
    hal.with(|m| m.never_ready = true);
    let mut now = overdue;
    for _ in 0..2 {
        assert_eq!(
            controller.recover(now),
            RecoveryStep::At(now + RESET_RETRY_NS)
        );
        now += RESET_RETRY_NS;
    }
    assert_eq!(
        controller.recover(now),
        RecoveryStep::GaveUp { dma_stopped: true }
    );
    assert_eq!(hal.with(|m| m.resets), 2);
    assert!(controller.is_stopped());
    let fault = DeviceFault {
        kind: FaultKind::Timeout {
            waited_ms: OVERDUE / MS,
        },
        dma_stopped: true,
    };
    let (holder, idle) = queues.split_at_mut(1);
    a_given_up_device_fails_every_queue(&mut holder[0], &mut idle[0], &hal, (fault, 1, now));
    assert_eq!(controller.recover(now + RESET_RETRY_NS), RecoveryStep::Idle);
}

#[test]
fn a_reset_after_which_the_controller_serves_starts_the_count_again() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    let recovery = RecoveryConfig {
        max_resets: 1,
        wake: None,
    };
    let (hal, mut controller, mut queues) = bring_up_with(fake, 1, 8, recovery);
    let queue = &mut queues[0];
    let (stalled, fine) = (one_page(&hal), one_page(&hal));
    // Stalls, is reset, then serves: its one reset is not spent.
    let overdue = stall(queue, 1, 64, &stalled, 0);
    assert_eq!(controller.recover(overdue), RecoveryStep::Reset);
    assert_eq!(drain(queue), [error(1)]);
    assert_eq!(complete_one(queue, &read(2, 0, &fine)), IoStatus::Ok);
    let overdue = stall(queue, 3, 64, &stalled, overdue);
    assert_eq!(controller.recover(overdue), RecoveryStep::Reset);
    assert_eq!(drain(queue), [error(3)]);
    // Stalls again before it completed anything: that reset was spent.
    let overdue = stall(queue, 4, 64, &stalled, overdue);
    assert_eq!(
        controller.recover(overdue),
        RecoveryStep::GaveUp { dma_stopped: true }
    );
    queue.tick(overdue, TIMEOUT);
    assert_eq!(drain(queue), [error(4)]);
    assert_eq!(hal.with(|m| m.resets), 2);
}

#[test]
fn a_fatal_controller_is_reset_and_serves_again() {
    let mut fake = FakeController::new(1 << 20);
    fake.fatal_after = Some(1);
    let (hal, mut controller, mut queues) = bring_up_with(fake, 1, 8, RecoveryConfig::DEFAULT);
    let queue = &mut queues[0];
    let page = one_page(&hal);
    queue.tick(0, TIMEOUT);
    assert_eq!(complete_one(queue, &read(1, 0, &page)), IoStatus::Ok);
    queue.submit(&read(2, 0, &page), &NoCpuAccess).unwrap();
    queue.tick(MS, TIMEOUT);
    queue.tick(MS + cmdslots::HEALTH_CHECK_INTERVAL_NS, TIMEOUT);
    // Its status read: a reset asked, no abort.
    hal.with(|m| m.fatal_after = None);
    assert_eq!(controller.recover(20 * MS), RecoveryStep::Reset);
    assert!(hal.with(|m| m.aborts.is_empty()));
    assert_eq!(drain(queue), [error(2)]);
    assert_eq!(complete_one(queue, &read(3, 0, &page)), IoStatus::Ok);
    assert_eq!(queue.fault(), None);
}

#[test]
fn an_abort_that_goes_unanswered_leads_to_a_reset() {
    let mut fake = FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    fake.ignore_abort = true;
    let (hal, mut controller, mut queues) = bring_up_with(fake, 1, 8, RecoveryConfig::DEFAULT);
    let page = one_page(&hal);
    let overdue = stall(&mut queues[0], 1, 64, &page, 0);
    assert_eq!(controller.recover(overdue), RecoveryStep::Reset);
    assert_eq!(hal.with(|m| m.aborts.clone()), [(1, 0)]);
    assert_eq!(drain(&mut queues[0]), [error(1)]);
    assert_eq!(
        complete_one(&mut queues[0], &read(2, 0, &page)),
        IoStatus::Ok
    );
}
