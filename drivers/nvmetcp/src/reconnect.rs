// SPDX-License-Identifier: MIT OR Apache-2.0
//! When to reconnect to a target that went away, and when to stop trying.
//!
//! While the link is down, I/O is held (not failed). The first attempt goes at once (a
//! reset connection often comes straight back), then one every `delay_ms`; once
//! `give_up_ms` have passed since the link was lost without a connection, the caller
//! fails what it holds and everything after, until [`Reconnect::connected`] (an
//! operator re-attaching, say). Linux's host does the same with `reconnect_delay` 10 s
//! and `ctrl_loss_tmo` 600 s, though it waits one delay before its first attempt.

/// Delays in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReconnectPolicy {
    pub delay_ms: u64,
    pub give_up_ms: u64,
}

impl ReconnectPolicy {
    /// Linux's host defaults.
    pub const DEFAULT: ReconnectPolicy = ReconnectPolicy {
        delay_ms: 10_000,
        give_up_ms: 600_000,
    };
}

/// What a disk that asks for its own reconnect times does with an association its
/// namespace already has, which other disks may be served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// The same times: nothing changes.
    Same,
    /// No disk is served from it: it takes the disk's times.
    Change,
    /// Other disks are served from it with other times: the disk is refused (a guest
    /// would wait on a target gone longer, or shorter, than its own times say).
    Refuse,
}

impl ReconnectPolicy {
    /// See [`Share`]: `self` is the association's, `others_served` whether any disk is
    /// served from it now.
    pub fn share(self, wanted: ReconnectPolicy, others_served: bool) -> Share {
        if self == wanted {
            Share::Same
        } else if others_served {
            Share::Refuse
        } else {
            Share::Change
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Up,
    /// Lost at `since`; the next attempt is due at `next` (none while one runs).
    Down {
        since: u64,
        next: Option<u64>,
    },
    GaveUp,
}

/// What the caller does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Start a connection attempt (then report `connected` or `attempt_failed`).
    Attempt,
    /// Stop holding: fail what is held and what comes, until `connected`.
    GiveUp,
}

#[derive(Clone, Copy, Debug)]
pub struct Reconnect {
    policy: ReconnectPolicy,
    state: State,
}

impl Reconnect {
    /// A link that is up.
    pub fn new(policy: ReconnectPolicy) -> Self {
        Reconnect {
            policy,
            state: State::Up,
        }
    }

    pub fn policy(&self) -> ReconnectPolicy {
        self.policy
    }

    /// Other times from now on: a loss being ridden out keeps its start, and gives up
    /// at its start plus the new give-up time.
    pub fn set_policy(&mut self, policy: ReconnectPolicy) {
        self.policy = policy;
    }

    /// I/O waits for a connection (the link is down and not given up).
    pub fn holding(&self) -> bool {
        matches!(self.state, State::Down { .. })
    }

    pub fn gave_up(&self) -> bool {
        self.state == State::GaveUp
    }

    /// The connection broke at `now`. Again while down changes nothing: the give-up
    /// clock runs from the first loss.
    pub fn lost(&mut self, now: u64) {
        if self.state == State::Up {
            self.state = State::Down {
                since: now,
                next: Some(now),
            };
        }
    }

    /// An attempt started by [`Action::Attempt`] failed at `now`.
    pub fn attempt_failed(&mut self, now: u64) {
        if let State::Down { since, .. } = self.state {
            self.state = State::Down {
                since,
                next: Some(now.saturating_add(self.policy.delay_ms)),
            };
        }
    }

    pub fn connected(&mut self) {
        self.state = State::Up;
    }

    /// What to do at `now`. An attempt is started at most once per call that returns
    /// `Attempt`; none is started after the give-up time.
    pub fn poll(&mut self, now: u64) -> Action {
        let State::Down { since, next } = self.state else {
            return Action::Nothing;
        };
        if now >= since.saturating_add(self.policy.give_up_ms) {
            self.state = State::GaveUp;
            return Action::GiveUp;
        }
        match next {
            Some(at) if now >= at => {
                self.state = State::Down { since, next: None };
                Action::Attempt
            }
            _ => Action::Nothing,
        }
    }

    /// When `poll` next has something to do (none while up, given up, or while an
    /// attempt runs: its own timeout drives it).
    pub fn next_timer(&self) -> Option<u64> {
        match self.state {
            State::Down {
                since,
                next: Some(at),
            } => Some(at.min(since.saturating_add(self.policy.give_up_ms))),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: ReconnectPolicy = ReconnectPolicy {
        delay_ms: 10_000,
        give_up_ms: 60_000,
    };

    #[test]
    fn attempts_at_once_then_every_delay_then_gives_up() {
        let mut r = Reconnect::new(P);
        assert_eq!(r.poll(0), Action::Nothing);
        assert!(!r.holding());
        r.lost(1_000);
        assert!(r.holding());
        assert_eq!(r.next_timer(), Some(1_000));
        assert_eq!(r.poll(1_000), Action::Attempt);
        assert_eq!(r.poll(1_001), Action::Nothing, "one attempt at a time");
        assert_eq!(r.next_timer(), None);
        r.attempt_failed(3_000);
        assert_eq!(r.next_timer(), Some(13_000));
        assert_eq!(r.poll(12_999), Action::Nothing);
        let mut attempts = 1;
        let mut now = 13_000;
        loop {
            match r.poll(now) {
                Action::Attempt => {
                    attempts += 1;
                    r.attempt_failed(now);
                }
                Action::GiveUp => break,
                Action::Nothing => {}
            }
            now += 500;
        }
        assert_eq!(now, 61_000, "gave up 60 s after the loss");
        assert_eq!(attempts, 6, "at 1, 13, 23, 33, 43, 53 s");
        assert!(r.gave_up() && !r.holding());
        assert_eq!(r.poll(70_000), Action::Nothing);
        r.connected();
        assert!(!r.gave_up() && !r.holding());
    }

    #[test]
    fn success_ends_holding_and_a_new_loss_starts_a_new_clock() {
        let mut r = Reconnect::new(P);
        r.lost(0);
        assert_eq!(r.poll(0), Action::Attempt);
        r.connected();
        assert_eq!(r.poll(100_000), Action::Nothing);
        r.lost(100_000);
        r.lost(120_000);
        assert_eq!(r.poll(100_000), Action::Attempt);
        r.attempt_failed(100_000);
        assert_eq!(r.poll(110_000), Action::Attempt);
        r.attempt_failed(155_000);
        assert_eq!(
            r.next_timer(),
            Some(160_000),
            "the clock runs from the first loss"
        );
        assert_eq!(r.poll(159_999), Action::Nothing);
        assert_eq!(r.poll(160_000), Action::GiveUp);
    }

    #[test]
    fn a_disk_with_other_times_takes_over_an_association_only_no_disk_uses() {
        let other = ReconnectPolicy {
            delay_ms: 5_000,
            give_up_ms: 30_000,
        };
        assert_eq!(P.share(P, true), Share::Same);
        assert_eq!(P.share(P, false), Share::Same);
        assert_eq!(P.share(other, false), Share::Change);
        assert_eq!(P.share(other, true), Share::Refuse);
        let delay = ReconnectPolicy {
            delay_ms: 1_000,
            ..P
        };
        assert_eq!(P.share(delay, true), Share::Refuse, "the delay counts too");
    }

    #[test]
    fn a_long_attempt_does_not_outlive_the_give_up_time() {
        let mut r = Reconnect::new(P);
        r.lost(0);
        assert_eq!(r.poll(0), Action::Attempt);
        r.attempt_failed(59_000);
        assert_eq!(
            r.next_timer(),
            Some(60_000),
            "the give-up time, not the next delay"
        );
        assert_eq!(r.poll(60_000), Action::GiveUp);
        r.attempt_failed(61_000);
        assert!(r.gave_up(), "a late failure report changes nothing");
    }
}
