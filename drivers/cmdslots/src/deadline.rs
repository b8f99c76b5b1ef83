// SPDX-License-Identifier: MIT OR Apache-2.0
//! Deadlines and the device's health: when a queue must fail, and failing it.

use blkdev::{DeviceFault, Dma, FaultKind};

use crate::{SlotState, Tracker};

/// A command the device has held longer than the timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overdue {
    pub slot: u16,
    /// How long it has been with the device, ns.
    pub waited_ns: u64,
}

/// How often `Tracker::tick` looks for overdue commands: an eighth of the timeout, at
/// least every second and at most every millisecond. A command is given up between
/// `timeout` and `timeout + scan_interval(timeout)` after it went to the device.
pub fn scan_interval(timeout_ns: u64) -> u64 {
    (timeout_ns / 8).clamp(1_000_000, 1_000_000_000)
}

/// How long after a queue was handed a command, ticked on every pass, the command is
/// answered at the latest: completed, or failed at its deadline (`timeout` and the scan's
/// lag). `None` without a timeout (0): a command may wait for ever. What a drain of the
/// queue's requests has to wait for at most (a clean shutdown's).
pub fn answered_within(timeout_ns: u64) -> Option<u64> {
    (timeout_ns > 0).then(|| timeout_ns.saturating_add(scan_interval(timeout_ns)))
}

/// How long commands may be in flight with none finishing before the driver reads its
/// device's status (`Tracker::health_check_due`), and then how often.
pub const HEALTH_CHECK_INTERVAL_NS: u64 = 10_000_000;

/// A DMA driver queue's `BlockDevice::fault`: its own (`own`), or its device's, stopped
/// by another queue (`device_stopped`: what `Dma::dma_stopped` says).
pub fn queue_fault(own: Option<DeviceFault>, device_stopped: Option<bool>) -> Option<DeviceFault> {
    own.or_else(|| {
        device_stopped.map(|dma_stopped| DeviceFault {
            kind: FaultKind::Stopped,
            dma_stopped,
        })
    })
}

impl<P: Copy + Default> Tracker<P> {
    /// The driver's clock (ns, monotonic). Returns the oldest command in flight if it
    /// has been with the device longer than `timeout_ns` (0: no deadline). Looks at the
    /// slots at most every `scan_interval(timeout_ns)`, otherwise costs a comparison.
    /// Commands launched before the first tick count from it, and so do those launched
    /// after a quiet spell longer than a scan interval without a tick (a queue parked
    /// idle, then given work before its next tick): their stamp is that old tick's.
    pub fn tick(&mut self, now: u64, timeout_ns: u64) -> Option<Overdue> {
        let stale = self.now;
        if !self.clock_started {
            self.clock_started = true;
            for s in &mut self.slots {
                s.since = now;
            }
        } else if self.launched_since_tick && now.saturating_sub(stale) > scan_interval(timeout_ns)
        {
            for s in &mut self.slots {
                if s.state == SlotState::InFlight && s.since == stale {
                    s.since = now;
                }
            }
        }
        self.launched_since_tick = false;
        self.now = now;
        if timeout_ns == 0 || self.in_flight == 0 || now < self.next_scan {
            return None;
        }
        self.next_scan = now.saturating_add(scan_interval(timeout_ns));
        let (slot, oldest) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SlotState::InFlight)
            .min_by_key(|(_, s)| s.since)?;
        let waited_ns = now.saturating_sub(oldest.since);
        (waited_ns > timeout_ns).then_some(Overdue {
            slot: slot as u16,
            waited_ns,
        })
    }

    /// Whether the driver should read its device's status register now (a fatal or
    /// needs-reset bit): commands have been in flight for `HEALTH_CHECK_INTERVAL_NS`
    /// without one finishing, and no status was read in that time. Timed, not counted
    /// in polls: a register read is a VM exit under Xen's HVM, and a poll count makes
    /// their rate follow the poller's speed (and a control-path read's register count
    /// follow the machine's load).
    pub fn health_check_due(&mut self, now: u64) -> bool {
        let finished = core::mem::take(&mut self.finished_since_check);
        let quiet_since = match self.last_sign_of_life {
            Some(last) if self.in_flight > 0 && !finished => last,
            _ => {
                self.last_sign_of_life = Some(now);
                return false;
            }
        };
        if now.saturating_sub(quiet_since) < HEALTH_CHECK_INTERVAL_NS {
            return false;
        }
        self.last_sign_of_life = Some(now);
        true
    }

    /// A DMA driver's `BlockDevice::tick`: why its queue must fail now, if it must.
    /// Nothing if it has failed already (`own`, its fault); else its device was stopped
    /// by another queue (`device`'s `Dma::dma_stopped` says so), or a command has been
    /// with it longer than `timeout_ns` (logged).
    pub fn due(
        &mut self,
        own: Option<DeviceFault>,
        now: u64,
        timeout_ns: u64,
        device: &impl Dma,
    ) -> Option<FaultKind> {
        if own.is_some() {
            return None;
        }
        if device.dma_stopped().is_some() {
            return Some(FaultKind::Stopped);
        }
        let overdue = self.tick(now, timeout_ns)?;
        let waited_ms = overdue.waited_ns / 1_000_000;
        log::error!(
            "command slot {} got no completion in {waited_ms} ms",
            overdue.slot
        );
        Some(FaultKind::Timeout { waited_ms })
    }

    /// Fails the queue for `kind`: `stop_dma` first (the device's DMA off: what it holds
    /// can no longer land anywhere), then every request outstanding (`fail_all`).
    /// Returns the fault and how many requests failed.
    pub fn fail_queue(
        &mut self,
        kind: FaultKind,
        stop_dma: impl FnOnce() -> bool,
    ) -> (DeviceFault, usize) {
        let dma_stopped = stop_dma();
        let failed = self.fail_all();
        (DeviceFault { kind, dma_stopped }, failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::launch_all;
    use crate::Finished;
    use blkdev::IoStatus;

    #[test]
    fn a_command_is_given_up_within_answered_within() {
        const MS: u64 = 1_000_000;
        assert_eq!(answered_within(0), None);
        for timeout in [5 * MS, 100 * MS, 30_000 * MS] {
            let bound = answered_within(timeout).unwrap();
            let mut t: Tracker<u8> = Tracker::new(2);
            t.tick(0, timeout);
            let slot = t.begin(1, 1);
            t.launched(slot);
            let given_up = (1..)
                .map(|ms| ms * MS)
                .find(|&now| t.tick(now, timeout).is_some())
                .unwrap();
            assert!(
                given_up > timeout && given_up <= bound,
                "{given_up} for {timeout}"
            );
        }
    }

    #[test]
    fn a_command_is_overdue_only_past_its_deadline() {
        const MS: u64 = 1_000_000;
        let mut t: Tracker<u8> = Tracker::new(4);
        // Launched before the clock started: counts from the first tick.
        let early = t.begin(1, 1);
        t.launched(early);
        assert_eq!(t.tick(1_000 * MS, 100 * MS), None);
        let late = t.begin(2, 1);
        assert_eq!(t.tick(1_050 * MS, 100 * MS), None);
        t.launched(late);
        assert_eq!(t.tick(1_055 * MS, 100 * MS), None);
        // Exactly at the deadline is not past it (the scan interval is 12.5 ms).
        assert_eq!(t.tick(1_100 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(1_113 * MS, 100 * MS),
            Some(Overdue {
                slot: early,
                waited_ns: 113 * MS
            })
        );
        // Between scans nothing is looked at.
        assert_eq!(t.tick(1_114 * MS, 100 * MS), None);
        // The early one done, the later one is judged on its own stamp.
        assert!(matches!(
            t.finish(early, IoStatus::Ok, &mut launch_all),
            Finished::Request(_)
        ));
        assert_eq!(t.tick(1_140 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(1_151 * MS, 100 * MS),
            None,
            "the next scan is due at 1152.5 ms"
        );
        assert_eq!(
            t.tick(1_153 * MS, 100 * MS),
            Some(Overdue {
                slot: late,
                waited_ns: 103 * MS
            })
        );
        // No deadline, or nothing in flight: nothing is ever overdue.
        assert_eq!(t.tick(9_000 * MS, 0), None);
        t.fail_all();
        assert_eq!(t.tick(10_000 * MS, 100 * MS), None);
    }

    #[test]
    fn a_command_launched_after_a_quiet_spell_counts_from_the_next_tick() {
        const MS: u64 = 1_000_000;
        let mut t: Tracker<u8> = Tracker::new(4);
        let busy = t.begin(1, 1);
        t.launched(busy);
        assert_eq!(t.tick(0, 100 * MS), None);
        assert!(matches!(
            t.finish(busy, IoStatus::Ok, &mut launch_all),
            Finished::Request(_)
        ));
        // Parked for an hour without ticks, then given a command before the next tick.
        let fresh = t.begin(2, 1);
        t.launched(fresh);
        let hour = 3_600_000 * MS;
        assert_eq!(t.tick(hour, 100 * MS), None, "not an hour old");
        assert_eq!(t.tick(hour + 100 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(hour + 113 * MS, 100 * MS),
            Some(Overdue {
                slot: fresh,
                waited_ns: 113 * MS
            })
        );
    }

    #[test]
    fn the_status_is_read_only_after_a_quiet_interval_with_commands_out() {
        const MS: u64 = 1_000_000;
        let interval = HEALTH_CHECK_INTERVAL_NS;
        let mut t: Tracker<u8> = Tracker::new(4);
        // Nothing in flight: never, however long.
        assert!(!t.health_check_due(0));
        assert!(!t.health_check_due(interval * 10));
        let first = t.begin(1, 1);
        t.launched(first);
        let second = t.begin(2, 1);
        t.launched(second);
        let start = interval * 10;
        assert!(!t.health_check_due(start + interval - 1));
        // A command finished: the device is alive, and the quiet interval starts again.
        t.finish(first, IoStatus::Ok, &mut launch_all);
        assert!(!t.health_check_due(start + interval + MS));
        assert!(!t.health_check_due(start + 2 * interval));
        assert!(t.health_check_due(start + 2 * interval + MS));
        // Then once per interval, not at every call.
        assert!(!t.health_check_due(start + 2 * interval + 2 * MS));
        assert!(t.health_check_due(start + 3 * interval + MS));
    }
}
