//! Notification moderation: when the frontend asks for an event but more of its
//! requests are about to be answered, hold the event for a short window so one event
//! carries the batch.
//!
//! The ring macros already spare events the frontend did not ask for
//! (`RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`); a backend that answers each request as it
//! comes still sends about one per request, as the frontend re-arms `rsp_event` after
//! each one it takes. Here a due event is held, while the responses themselves are
//! published at once (a frontend that looks sees them), when:
//! - a window is configured (`EngineConfig::notify_hold_ns`, 0 = never hold);
//! - more is expected: other requests of the ring are on the device, waiting for it or
//!   waiting in the ring; or the frontend has lately had more than one request
//!   outstanding (`Moderator::sample_outstanding`) and has fewer than the ring's size
//!   outstanding now, so it can still send more. A device that answers during the
//!   poll that takes a request, like the RAM disk, never has anything in flight: then
//!   the frontend's own queue is what shows more to come. A frontend that waits for
//!   each answer before its next request (QD1) always shows exactly one, so it is
//!   never held for: nothing it sends can come before the event it waits for;
//! - recent windows paid: another response came within the window after most due
//!   events of late, held or not (a score, `Moderator::record`).
//!
//! A held event goes out (if the frontend still wants it, by the ring macro over every
//! response published since the hold began) at the first poll at or after its
//! deadline, or at teardown, or earlier: an event held for requests on the device as
//! soon as none are left there; one held for the frontend's own queue when it has a
//! ring's worth of requests outstanding (it can send nothing more). The poller passes
//! the time in (`Engine::poll_at`) and never sleeps past `Engine::notify_deadline`.

/// Windows are scored up to this; a hold needs at least `HOLD_SCORE`.
const SCORE_MAX: u8 = 7;
const HOLD_SCORE: u8 = 4;
/// A window that found another response raises the score by 1; one that found none
/// lowers it by this much. So holding goes on while about two windows in three pay, and
/// stops after two wasted ones in a row; an unheld due event is watched instead, and
/// windows that would have paid bring holding back.
const WASTED_PENALTY: u8 = 2;
/// The frontend counts as keeping several requests outstanding for this many request
/// rounds after one in which it had more than one.
const CONCURRENT_ROUNDS: u8 = 64;

/// A held event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    /// `rsp_prod` before the responses the event was due for: the release applies the
    /// ring macro to everything published since.
    since: u32,
    /// `rsp_prod` when the event was held: more by the release means a batch.
    first: u32,
    deadline: u64,
    /// Held for requests on the device (or waiting for it): released once none are.
    /// Otherwise held for the frontend's own queue: released at the deadline or when
    /// the frontend's ring is full.
    for_device: bool,
}

/// A due event sent at once while more was expected: would a hold have paid?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watch {
    rsp_prod: u32,
    deadline: u64,
}

/// What the engine sees of its ring when it decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Outlook {
    /// Requests of this ring are on the device, wait for it, or wait in the ring.
    pub busy: bool,
    /// The frontend has as many requests outstanding as the ring has slots: it can
    /// send nothing more before it takes responses.
    pub frontend_full: bool,
}

/// How a hold ended, for the score and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Release {
    /// Still held.
    No,
    /// Release now (the ring macro over everything published after `since` says
    /// whether to send); `wasted`: the deadline passed and no other response came.
    Yes { since: u32, wasted: bool },
}

/// One ring's moderation state; times are the poller's clock in ns.
#[derive(Clone, Debug)]
pub(super) struct Moderator {
    window_ns: u64,
    now: u64,
    held: Option<Held>,
    watch: Option<Watch>,
    score: u8,
    /// Request rounds left in which the frontend counts as keeping several requests
    /// outstanding.
    concurrent_rounds: u8,
}

impl Moderator {
    pub fn new(window_ns: u64) -> Self {
        Self {
            window_ns,
            now: 0,
            held: None,
            watch: None,
            score: SCORE_MAX,
            concurrent_rounds: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.window_ns > 0
    }

    pub fn set_now(&mut self, now: u64) {
        self.now = now;
    }

    pub fn deadline(&self) -> Option<u64> {
        self.held.map(|held| held.deadline)
    }

    pub fn holding(&self) -> bool {
        self.held.is_some()
    }

    /// A round of requests was taken while the frontend had `outstanding` requests
    /// whose responses it had not taken (`BackRing::frontend_outstanding`).
    pub fn sample_outstanding(&mut self, outstanding: u32) {
        self.concurrent_rounds = if outstanding > 1 {
            CONCURRENT_ROUNDS
        } else {
            self.concurrent_rounds.saturating_sub(1)
        };
    }

    /// The frontend lately had more than one request outstanding.
    fn frontend_concurrent(&self) -> bool {
        self.concurrent_rounds > 0
    }

    fn more_expected(&self, outlook: Outlook) -> bool {
        outlook.busy || (self.frontend_concurrent() && !outlook.frontend_full)
    }

    fn record(&mut self, paid: bool) {
        self.score = if paid {
            (self.score + 1).min(SCORE_MAX)
        } else {
            self.score.saturating_sub(WASTED_PENALTY)
        };
    }

    /// Responses were published (`rsp_prod` is the new producer index) or not
    /// (`None`): settle an open watch.
    pub fn observe(&mut self, rsp_prod: Option<u32>) {
        let Some(watch) = self.watch else { return };
        let late = self.now > watch.deadline;
        match rsp_prod {
            Some(prod) if prod != watch.rsp_prod => self.record(!late),
            _ if late => self.record(false),
            _ => return,
        }
        self.watch = None;
    }

    /// An event is due for the responses after `since` (up to `rsp_prod`): hold it?
    /// If not, and more was expected, watch whether a hold would have paid.
    pub fn hold(&mut self, since: u32, rsp_prod: u32, outlook: Outlook) -> bool {
        debug_assert!(self.held.is_none());
        if !self.enabled() || !self.more_expected(outlook) {
            return false;
        }
        let deadline = self.now.saturating_add(self.window_ns);
        if self.score < HOLD_SCORE {
            self.watch = Some(Watch { rsp_prod, deadline });
            return false;
        }
        self.held = Some(Held {
            since,
            first: rsp_prod,
            deadline,
            for_device: outlook.busy,
        });
        true
    }

    /// While holding, after each publish: release now?
    pub fn release(&mut self, rsp_prod: u32, outlook: Outlook) -> Release {
        let Some(held) = self.held else {
            return Release::No;
        };
        let batch = rsp_prod != held.first;
        let due = self.now >= held.deadline;
        let more = if held.for_device {
            outlook.busy
        } else {
            self.more_expected(outlook)
        };
        if !due && more {
            return Release::No;
        }
        if batch {
            self.record(true);
        } else if due {
            self.record(false);
        }
        self.held = None;
        Release::Yes {
            since: held.since,
            wasted: due && !batch,
        }
    }

    /// Release unconditionally (teardown). The score is left alone.
    pub fn release_now(&mut self) -> Option<u32> {
        self.held.take().map(|held| held.since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUSY: Outlook = Outlook {
        busy: true,
        frontend_full: false,
    };
    const IDLE: Outlook = Outlook {
        busy: false,
        frontend_full: false,
    };

    #[test]
    fn off_never_holds() {
        let mut m = Moderator::new(0);
        assert!(!m.hold(0, 1, BUSY));
        assert_eq!(m.deadline(), None);
    }

    #[test]
    fn holds_only_while_more_is_expected() {
        let mut m = Moderator::new(1_000);
        m.set_now(5);
        assert!(!m.hold(0, 1, IDLE));
        // The frontend lately had several requests outstanding, but now has its whole
        // ring: it can send nothing more, and the device has nothing.
        m.sample_outstanding(2);
        let full = Outlook {
            busy: false,
            frontend_full: true,
        };
        assert!(!m.hold(0, 1, full));
        assert!(m.hold(0, 1, BUSY));
        assert_eq!(m.deadline(), Some(1_005));
    }

    #[test]
    fn a_frontend_with_one_request_at_a_time_never_counts_as_concurrent() {
        let mut m = Moderator::new(1_000);
        for _ in 0..1_000 {
            m.sample_outstanding(1);
        }
        assert!(!m.hold(0, 1, IDLE));
        // Once two: for the next rounds it may have more on the way.
        m.sample_outstanding(2);
        for _ in 0..CONCURRENT_ROUNDS - 1 {
            m.sample_outstanding(1);
        }
        assert!(m.hold(0, 1, IDLE));
        m.set_now(1_000);
        assert!(matches!(m.release(1, IDLE), Release::Yes { .. }));
        m.sample_outstanding(1);
        assert!(!m.hold(1, 2, IDLE));
    }

    #[test]
    fn release_at_the_deadline_or_when_nothing_more_is_expected() {
        let mut m = Moderator::new(1_000);
        assert!(m.hold(0, 1, BUSY));
        m.set_now(999);
        assert_eq!(m.release(3, BUSY), Release::No);
        m.set_now(1_000);
        assert_eq!(
            m.release(3, BUSY),
            Release::Yes {
                since: 0,
                wasted: false
            }
        );
        assert!(m.hold(3, 4, BUSY));
        assert_eq!(
            m.release(4, IDLE),
            Release::Yes {
                since: 3,
                wasted: false
            }
        );
        assert!(!m.holding());
    }

    #[test]
    fn wasted_windows_stop_holding_and_paying_ones_resume_it() {
        let mut m = Moderator::new(100);
        let mut now = 0;
        let mut prod = 0;
        // Each window: due at `now`, nothing more before the deadline.
        let mut held = Vec::new();
        for _ in 0..6 {
            m.set_now(now);
            prod += 1;
            let h = m.hold(prod - 1, prod, BUSY);
            held.push(h);
            now += 200;
            m.set_now(now);
            if h {
                assert!(matches!(
                    m.release(prod, BUSY),
                    Release::Yes { wasted: true, .. }
                ));
            } else {
                m.observe(None);
            }
        }
        assert_eq!(held, [true, true, false, false, false, false]);
        // Responses now follow within the window: watched, then held again.
        let mut held = Vec::new();
        for _ in 0..8 {
            m.set_now(now);
            prod += 1;
            let h = m.hold(prod - 1, prod, BUSY);
            held.push(h);
            now += 10;
            m.set_now(now);
            prod += 1;
            if h {
                assert!(matches!(
                    m.release(prod, IDLE),
                    Release::Yes { wasted: false, .. }
                ));
            } else {
                m.observe(Some(prod));
            }
        }
        assert_eq!(held[..4], [false, false, false, false]);
        assert!(held[4..].iter().all(|&h| h), "{held:?}");
    }
}
