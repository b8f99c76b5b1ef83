//! How long an idle poller may block in `SCHEDOP_poll`.
//!
//! A ring's requests wake the poller through its event channel, but a device's
//! completions do not: NVMe and virtio queues are polled, with no interrupt behind them.
//! A poller whose device still holds requests must come back on its own, soon: without
//! this rule it slept its full second with a read done (BENCHMARKS.md, the emulated-NVMe
//! section).

/// Longest sleep with nothing in flight; control work (vCPU 0) may ask for less.
pub const MAX_SLEEP_NS: u64 = 1_000_000_000;
/// Longest sleep while a device holds requests: a wake-up costs one hypercall (~0.1 ms
/// under the nested rig), so 1 ms keeps that below a tenth of the vCPU and adds at most
/// 1 ms to a request that outlived the spin window (an emulated NVMe takes ~10 ms).
pub const DEVICE_WAIT_NS: u64 = 1_000_000;

/// The absolute deadline of the next sleep starting at `now`: the control path's next
/// due time if this poller runs it, else `MAX_SLEEP_NS` ahead, and never later than
/// `DEVICE_WAIT_NS` ahead while `device_busy`. Always after `now`.
pub fn sleep_deadline(now: u64, control_due: Option<u64>, device_busy: bool) -> u64 {
    let mut deadline = control_due.unwrap_or(now.saturating_add(MAX_SLEEP_NS));
    if device_busy {
        deadline = deadline.min(now.saturating_add(DEVICE_WAIT_NS));
    }
    deadline.max(now.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_sleeps_long_without_control_work() {
        assert_eq!(sleep_deadline(1_000, None, false), 1_000 + MAX_SLEEP_NS);
    }

    #[test]
    fn control_due_bounds_the_sleep() {
        assert_eq!(sleep_deadline(1_000, Some(5_000), false), 5_000);
        // Already due: the poller still passes a deadline in the future.
        assert_eq!(sleep_deadline(1_000, Some(10), false), 1_001);
    }

    #[test]
    fn requests_on_the_device_cap_the_sleep() {
        assert_eq!(sleep_deadline(1_000, None, true), 1_000 + DEVICE_WAIT_NS);
        assert_eq!(
            sleep_deadline(1_000, Some(1_000 + MAX_SLEEP_NS), true),
            1_000 + DEVICE_WAIT_NS
        );
        // An earlier control deadline still wins.
        assert_eq!(sleep_deadline(1_000, Some(2_000), true), 2_000);
    }

    #[test]
    fn never_overflows_near_the_end_of_time() {
        assert_eq!(sleep_deadline(u64::MAX - 5, None, true), u64::MAX);
        assert_eq!(sleep_deadline(u64::MAX, None, false), u64::MAX);
    }
}
