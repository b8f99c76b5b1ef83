// SPDX-License-Identifier: MIT OR Apache-2.0
//! When the control path steps a device again without a watch event, from what its last
//! step answered: soon ([`RETRY_NS`]) after a `Retry` (requests draining, a refused
//! connection's rings still held, a resize the pollers have not taken in yet), at its
//! time after a `RetryAt` (a detached device waiting out its grace: one step at the
//! grace's end, not one every few milliseconds of it), never after anything else. A watch
//! event steps its device whenever it comes, and that step's answer replaces the
//! device's due time.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::string::String;

/// How soon a negotiation that waits for in-flight requests is stepped again.
pub const RETRY_NS: u64 = 5_000_000;

/// The earlier of two due times (`None` is never).
pub fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a.into_iter().chain(b).min()
}

/// The devices (by backend path) to step again without a watch event, and when.
#[derive(Clone, Debug, Default)]
pub struct RetrySchedule {
    due: BTreeMap<String, u64>,
}

impl RetrySchedule {
    pub fn new() -> RetrySchedule {
        RetrySchedule::default()
    }

    /// The device at `path` is next stepped at `due` (`None`: only at a watch event, or
    /// never once it is gone).
    pub fn set(&mut self, path: &str, due: Option<u64>) {
        match (due, self.due.get_mut(path)) {
            (Some(due), Some(slot)) => *slot = due,
            (Some(due), None) => {
                self.due.insert(String::from(path), due);
            }
            (None, _) => {
                self.due.remove(path);
            }
        }
    }

    /// The device at `path` was stepped at `now` and answered `due`: from now on it is
    /// due then, unless a due time it already had is still to come and sooner (a step
    /// never postpones another: a watch event's step answering the grace's end keeps a
    /// `Retry` due in 5 ms). `None`: only at a watch event (or gone).
    pub fn stepped(&mut self, path: &str, due: Option<u64>, now: u64) {
        let pending = self.due.get(path).copied().filter(|&at| at > now);
        self.set(path, due.map(|due| pending.map_or(due, |at| at.min(due))));
    }

    /// The devices a round at `now` steps, each once: those its watch events named, then
    /// those due.
    pub fn round<'a>(
        &'a self,
        named: impl IntoIterator<Item = &'a str>,
        now: u64,
    ) -> BTreeSet<&'a str> {
        named.into_iter().chain(self.due(now)).collect()
    }

    /// How long the control path sleeps after a round that ended at `now`: not at all
    /// when watch events are queued in the xenstore client already (they came with the
    /// replies of the round's own requests, and the wait for those replies consumed
    /// their kick: nothing else would wake it for them); else until the first device is
    /// due, at most `idle_ns`.
    pub fn next_wait(&self, now: u64, events_queued: bool, idle_ns: u64) -> u64 {
        if events_queued {
            return 0;
        }
        self.next_in(now).map_or(idle_ns, |wait| wait.min(idle_ns))
    }

    /// The devices due at `now`.
    pub fn due(&self, now: u64) -> impl Iterator<Item = &str> {
        self.due
            .iter()
            .filter(move |(_, due)| **due <= now)
            .map(|(path, _)| path.as_str())
    }

    /// How long from `now` until the first device is due (0 when one already is);
    /// `None` with nothing scheduled.
    pub fn next_in(&self, now: u64) -> Option<u64> {
        self.due.values().min().map(|due| due.saturating_sub(now))
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const BE: &str = "/local/domain/1/backend/vbd/5/51712";
    /// How long the control path sleeps with nothing due (its statistics period).
    const IDLE_NS: u64 = 5_000_000_000;

    #[test]
    fn a_step_never_postpones_a_sooner_due_time_and_a_due_one_is_replaced() {
        let mut schedule = RetrySchedule::new();
        schedule.stepped(BE, Some(1_000 + RETRY_NS), 1_000);
        // A watch event's step within those 5 ms answers the grace's end: still due soon.
        schedule.stepped(BE, Some(9_000_000_000), 2_000);
        assert_eq!(schedule.next_in(2_000), Some(1_000 + RETRY_NS - 2_000));
        // Stepped when due, it answers the grace's end: due then, not again at once.
        schedule.stepped(BE, Some(9_000_000_000), 1_000 + RETRY_NS);
        assert_eq!(
            schedule.next_in(1_000 + RETRY_NS),
            Some(9_000_000_000 - 1_000 - RETRY_NS)
        );
        // A sooner answer wins; nothing pending (Idle) clears it.
        schedule.stepped(BE, Some(3_000_000_000), 2_000_000_000);
        assert_eq!(schedule.next_in(0), Some(3_000_000_000));
        schedule.stepped(BE, None, 2_500_000_000);
        assert!(schedule.is_empty());
        // A round steps each device once, named or due; queued events mean no sleep.
        schedule.stepped("other", Some(10), 0);
        assert_eq!(
            schedule
                .round([BE, "other", BE], 10)
                .into_iter()
                .collect::<Vec<_>>(),
            [BE, "other"]
        );
        assert_eq!(schedule.next_wait(5, true, IDLE_NS), 0);
        assert_eq!(schedule.next_wait(5, false, IDLE_NS), 5);
        schedule.set("other", None);
        assert_eq!(schedule.next_wait(5, false, IDLE_NS), IDLE_NS);
    }
}
