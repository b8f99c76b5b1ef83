// SPDX-License-Identifier: MIT OR Apache-2.0
//! How long an idle poller may block in `SCHEDOP_poll`.
//!
//! A ring's requests wake the poller through its event channel, but a device's
//! completions do not: NVMe and virtio queues are polled, with no interrupt behind them.
//! A poller whose device still holds requests must come back on its own, soon: else it
//! could sleep its full second with a read done.

/// Longest sleep with nothing in flight; control work (vCPU 0) may ask for less.
pub const MAX_SLEEP_NS: u64 = 1_000_000_000;
/// Longest sleep while a device holds requests: a wake-up costs a hypercall, expensive
/// where the CPU is emulated, so waking every 1 ms keeps that a small share of the vCPU
/// while adding at most 1 ms to a request that outlived the spin window (little next to
/// an emulated device's latency).
pub const DEVICE_WAIT_NS: u64 = 1_000_000;

/// The absolute deadline of the next sleep starting at `now`: the control path's next
/// due time if this poller runs it, else `MAX_SLEEP_NS` ahead, never later than
/// `DEVICE_WAIT_NS` ahead while `device_busy`, and never later than `notify_due`, the
/// earliest deadline of a notification one of its rings holds. Always after `now`.
pub fn sleep_deadline(
    now: u64,
    control_due: Option<u64>,
    device_busy: bool,
    notify_due: Option<u64>,
) -> u64 {
    let mut deadline = control_due.unwrap_or(now.saturating_add(MAX_SLEEP_NS));
    if device_busy {
        deadline = deadline.min(now.saturating_add(DEVICE_WAIT_NS));
    }
    if let Some(due) = notify_due {
        deadline = deadline.min(due);
    }
    deadline.max(now.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_sleeps_long_without_control_work() {
        assert_eq!(
            sleep_deadline(1_000, None, false, None),
            1_000 + MAX_SLEEP_NS
        );
    }

    #[test]
    fn control_due_bounds_the_sleep() {
        assert_eq!(sleep_deadline(1_000, Some(5_000), false, None), 5_000);
        // Already due: the poller still passes a deadline in the future.
        assert_eq!(sleep_deadline(1_000, Some(10), false, None), 1_001);
    }

    #[test]
    fn requests_on_the_device_cap_the_sleep() {
        assert_eq!(
            sleep_deadline(1_000, None, true, None),
            1_000 + DEVICE_WAIT_NS
        );
        assert_eq!(
            sleep_deadline(1_000, Some(1_000 + MAX_SLEEP_NS), true, None),
            1_000 + DEVICE_WAIT_NS
        );
        // An earlier control deadline still wins.
        assert_eq!(sleep_deadline(1_000, Some(2_000), true, None), 2_000);
    }

    #[test]
    fn a_held_notification_bounds_the_sleep() {
        // Sooner than every other bound: the poller wakes when the event must go out.
        assert_eq!(sleep_deadline(1_000, Some(9_000), true, Some(1_050)), 1_050);
        assert_eq!(sleep_deadline(1_000, None, false, Some(61_000)), 61_000);
        // Later ones change nothing.
        assert_eq!(
            sleep_deadline(1_000, Some(2_000), false, Some(5_000)),
            2_000
        );
        // Already due: still a deadline in the future (the next poll sends it).
        assert_eq!(sleep_deadline(1_000, None, false, Some(900)), 1_001);
    }

    #[test]
    fn never_overflows_near_the_end_of_time() {
        assert_eq!(sleep_deadline(u64::MAX - 5, None, true, None), u64::MAX);
        assert_eq!(sleep_deadline(u64::MAX, None, false, Some(3)), u64::MAX);
    }
}
