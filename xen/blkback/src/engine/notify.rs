// SPDX-License-Identifier: MIT OR Apache-2.0
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
//! soon as none are left there; one held for the frontend's own queue when it has as
//! many requests outstanding as it lately kept, or a ring's worth (it sends nothing
//! more before it hears: fio at QD4 would otherwise wait a quiet gap for each batch,
//! idle). The poller passes the time in (`Engine::poll_at`) and never sleeps past
//! `Engine::notify_deadline`.

/// The hold window by default (`EngineConfig::notify_hold_ns`; the kernel command line's
/// `notify.hold-us=`), chosen from the simulated guest's table
/// (`tests/notify_guest.rs`, `notify_guest_table`).
pub const DEFAULT_NOTIFY_HOLD_NS: u64 = 5_000_000;
/// The longest hold window accepted (`notify.hold-us=`).
pub const MAX_NOTIFY_HOLD_NS: u64 = 20_000_000;

/// Windows are scored up to this; a hold needs at least `HOLD_SCORE`.
const SCORE_MAX: u8 = 7;
const HOLD_SCORE: u8 = 4;
/// A window that found another response raises the score by 1; one that found none
/// lowers it by this much. So holding goes on while about two windows in three pay, and
/// stops after two wasted ones in a row; an unheld due event is watched instead, and
/// windows that would have paid bring holding back.
const WASTED_PENALTY: u8 = 2;
/// The frontend counts as quiet (done sending, for now: fio at a fixed depth has
/// resubmitted what it reaped and waits for more) once it has sent nothing for this
/// many times the average gap between its requests.
const QUIET_GAPS: u64 = 2;
/// The longest hold for requests on the device. At a fixed queue depth a device always
/// has requests in flight, and the frontend sends no more until it hears of some: a
/// hold that waited for the device to drain would leave it idle meanwhile, so this is
/// short: enough to gather completions that come close together, little device idle
/// time otherwise. `notify.hold-us` bounds them too.
pub(super) const DEVICE_WINDOW_NS: u64 = 50_000;
/// Holds for the frontend's queue in a row that found it sending nothing, after which
/// it no longer counts as keeping several requests outstanding.
const IDLE_HOLDS: u8 = 2;

/// A held event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    /// `rsp_prod` before the responses the event was due for: the release applies the
    /// ring macro to everything published since.
    since: u32,
    /// `rsp_prod` when the event was held: more by the release means a batch.
    first: u32,
    deadline: u64,
    /// How long it was to be held (its deadline less the time it was held at).
    window: u64,
    /// Held for requests on the device (or waiting for it): released once none are.
    /// Otherwise held for the frontend's own queue: released at the deadline, when the
    /// frontend has gone quiet, or when it is back at its depth (or its ring is full).
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
    /// Requests the frontend has sent and not taken the responses of, as its
    /// `rsp_event` shows (`BackRing::frontend_outstanding`, at most the ring's size).
    pub outstanding: u32,
    /// That is the ring's size: the frontend can send nothing more before it takes
    /// responses.
    pub full: bool,
}

/// How a hold ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Release {
    /// Still held.
    No,
    /// Release now (the ring macro over everything published after `since` says
    /// whether to send); `wasted`: no other response came while it was held, and the
    /// frontend waited for nothing; `why`: what ended it (counted, so an operator
    /// tuning `notify.hold-us` sees which bound cuts the batches).
    Yes { since: u32, wasted: bool, why: Why },
}

/// What ended a hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Why {
    /// Its window ran out.
    Deadline,
    /// Held for requests on the device, and none are left there.
    Drained,
    /// Held for the frontend's queue, and the frontend sent nothing for its quiet gap.
    Quiet,
    /// Held for the frontend's queue, and the frontend is back at its depth or has
    /// filled its ring: it sends nothing more before it hears.
    Depth,
    /// The poller was about to sleep.
    Sleep,
}

/// One ring's moderation state; times are the poller's clock in ns.
#[derive(Clone, Debug)]
pub(super) struct Moderator {
    window_ns: u64,
    now: u64,
    held: Option<Held>,
    watch: Option<Watch>,
    score: u8,
    /// The most requests the frontend has lately had outstanding (0 or 1: one at a
    /// time, never held for). Raised by every round of requests; lowered after
    /// `IDLE_HOLDS` holds for its queue in a row during which it sent nothing.
    depth: u32,
    /// Holds for the frontend's queue in a row during which it sent nothing.
    idle_holds: u8,
    /// When the last round of requests was taken (`None`: never).
    last_request: Option<u64>,
    /// Average gap between the frontend's rounds of requests (each counted up to the
    /// window).
    gap_ns: u64,
    /// The frontend's `req_prod` at the last round.
    req_prod_seen: u32,
}

impl Moderator {
    pub fn new(window_ns: u64) -> Self {
        Self {
            window_ns,
            now: 0,
            held: None,
            watch: None,
            score: SCORE_MAX,
            depth: 0,
            idle_holds: 0,
            last_request: None,
            // Until gaps are seen, the frontend counts as quiet after a window.
            gap_ns: window_ns / QUIET_GAPS,
            req_prod_seen: 0,
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

    /// Requests are taken up to `req_prod` while the frontend has `outstanding`
    /// requests whose responses it has not taken (`BackRing::frontend_outstanding`).
    /// Those the frontend produced since the last call make a round.
    pub fn sample_outstanding(&mut self, outstanding: u32, req_prod: u32) {
        self.depth = self.depth.max(outstanding);
        if req_prod == self.req_prod_seen {
            return;
        }
        self.req_prod_seen = req_prod;
        if let Some(last) = self.last_request {
            // A pause longer than the quiet time ends a run rather than measuring the
            // pace within one: it counts as no more than that (the average can still
            // grow, by an eighth at a time).
            let gap = self
                .now
                .saturating_sub(last)
                .min(self.quiet_ns())
                .min(self.window_ns);
            self.gap_ns = (self.gap_ns * 7 + gap) / 8;
        }
        self.last_request = Some(self.now);
    }

    fn quiet_ns(&self) -> u64 {
        self.gap_ns.saturating_mul(QUIET_GAPS)
    }

    /// The frontend has sent nothing for a while: what it had to send, it sent.
    fn frontend_quiet(&self) -> bool {
        self.last_request
            .is_none_or(|last| self.now.saturating_sub(last) >= self.quiet_ns())
    }

    /// The frontend keeps several requests outstanding and has fewer than that now:
    /// more of them are on the way.
    fn frontend_behind(&self, outstanding: u32) -> bool {
        self.depth > 1 && outstanding < self.depth
    }

    fn more_expected(&self, outlook: Outlook) -> bool {
        outlook.busy || (self.frontend_behind(outlook.outstanding) && !outlook.full)
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
    /// `Some(false)`: more was expected, but recent windows did not pay, so it goes out
    /// now (and is watched: would a hold have paid?). `None`: nothing more expected.
    pub fn hold(&mut self, since: u32, rsp_prod: u32, outlook: Outlook) -> Option<bool> {
        debug_assert!(self.held.is_none());
        if !self.enabled() || !self.more_expected(outlook) {
            return None;
        }
        let window = if outlook.busy {
            self.window_ns.min(DEVICE_WINDOW_NS)
        } else {
            self.window_ns
        };
        let deadline = self.now.saturating_add(window);
        if self.score < HOLD_SCORE {
            self.watch = Some(Watch { rsp_prod, deadline });
            return Some(false);
        }
        self.held = Some(Held {
            since,
            first: rsp_prod,
            deadline,
            window,
            for_device: outlook.busy,
        });
        Some(true)
    }

    /// While holding, after each publish: release now?
    pub fn release(&mut self, rsp_prod: u32, outlook: Outlook) -> Release {
        let Some(held) = self.held else {
            return Release::No;
        };
        let why = if self.now >= held.deadline {
            Why::Deadline
        } else if held.for_device {
            if outlook.busy {
                return Release::No;
            }
            Why::Drained
        } else if self.frontend_quiet() {
            Why::Quiet
        } else if !self.more_expected(outlook) {
            // Not `quiet` alone: a frontend back at its depth sends nothing more, and
            // waiting for its quiet gap would idle it (fio at QD4).
            Why::Depth
        } else {
            return Release::No;
        };
        self.end(held, rsp_prod, outlook.outstanding, why)
    }

    /// The poller is about to block: a held event goes out now (whatever was coming
    /// did not come while it spun). `None` when nothing was held.
    pub fn release_idle(&mut self, rsp_prod: u32, outstanding: u32) -> Option<Release> {
        let held = self.held?;
        Some(self.end(held, rsp_prod, outstanding, Why::Sleep))
    }

    /// A hold ends, for `why`, with `rsp_prod` published and `outstanding` requests at
    /// the frontend.
    fn end(&mut self, held: Held, rsp_prod: u32, outstanding: u32, why: Why) -> Release {
        let batch = rsp_prod != held.first;
        // A batch that came only after twice the window did not pay: the poll that
        // brought it was long (a large request copied before its response), and the
        // frontend waited that long for the first response. Holding stops once that
        // is the rule (1 MiB reads at QD4: every hold lasted a whole request's copy).
        let overstayed = self.now > held.deadline.saturating_add(held.window);
        self.record(batch && !overstayed);
        if !held.for_device {
            if batch {
                self.idle_holds = 0;
            } else {
                self.idle_holds = self.idle_holds.saturating_add(1);
                if self.idle_holds >= IDLE_HOLDS {
                    // The frontend sent nothing while it waited, twice in a row (once
                    // can be the last request of a run): it no longer keeps several
                    // requests outstanding (fio at QD1 after QD32). Hold no more for it
                    // until it does again.
                    self.depth = outstanding;
                }
            }
        }
        self.held = None;
        Release::Yes {
            since: held.since,
            wasted: !batch,
            why,
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
        outstanding: 1,
        full: false,
    };

    fn front(outstanding: u32) -> Outlook {
        Outlook {
            busy: false,
            outstanding,
            full: false,
        }
    }

    /// A moderator fed rounds of requests, one request each.
    struct Fed {
        m: Moderator,
        req_prod: u32,
    }

    impl Fed {
        fn new(window_ns: u64) -> Self {
            Self {
                m: Moderator::new(window_ns),
                req_prod: 0,
            }
        }

        /// A round at `now` with the frontend at `outstanding`.
        fn round(&mut self, now: u64, outstanding: u32) {
            self.m.set_now(now);
            self.req_prod += 1;
            self.m.sample_outstanding(outstanding, self.req_prod);
        }

        fn holds(&mut self, since: u32, outlook: Outlook) -> bool {
            self.m.hold(since, since + 1, outlook) == Some(true)
        }
    }

    #[test]
    fn off_never_holds() {
        let mut m = Moderator::new(0);
        assert_eq!(m.hold(0, 1, BUSY), None);
        assert_eq!(m.deadline(), None);
    }

    #[test]
    fn holds_only_while_more_is_expected() {
        let mut f = Fed::new(1_000_000);
        f.m.set_now(5);
        assert_eq!(f.m.hold(0, 1, front(1)), None);
        // The frontend has kept 8 outstanding, and has all 8 outstanding now: it can
        // send nothing more, and the device has nothing.
        f.round(5, 8);
        assert_eq!(f.m.hold(0, 1, front(8)), None);
        let full = Outlook {
            full: true,
            ..front(7)
        };
        assert_eq!(f.m.hold(0, 1, full), None);
        assert!(f.holds(0, front(7)));
        assert_eq!(f.m.deadline(), Some(1_000_005));
        // The frontend fills its ring: released at once.
        assert_eq!(
            f.m.release(3, full),
            Release::Yes {
                since: 0,
                wasted: false,
                why: Why::Depth,
            }
        );
        assert!(f.holds(3, front(7)));
        assert!(matches!(f.m.release_idle(4, 7), Some(Release::Yes { .. })));
        // A hold for the device lasts at most DEVICE_WINDOW_NS.
        assert!(f.holds(4, BUSY));
        assert_eq!(f.m.deadline(), Some(5 + DEVICE_WINDOW_NS));
    }

    #[test]
    fn a_frontend_with_one_request_at_a_time_is_never_held_for() {
        let mut f = Fed::new(1_000);
        for now in 0..1_000 {
            f.round(now * 10, 1);
            assert_eq!(f.m.hold(now as u32, now as u32 + 1, front(1)), None);
        }
    }

    #[test]
    fn a_frontend_that_sends_nothing_during_two_holds_is_not_held_for_again() {
        // It kept 32 outstanding (fio at QD32), then sends one request at a time.
        let mut f = Fed::new(1_000);
        f.round(0, 32);
        let mut now = 10_000;
        for since in 0..IDLE_HOLDS as u32 {
            f.round(now, 1);
            assert!(f.holds(since, front(1)), "hold {since}");
            now += 1_000;
            f.m.set_now(now);
            assert_eq!(
                f.m.release(since + 1, front(1)),
                Release::Yes {
                    since,
                    wasted: true,
                    why: Why::Deadline,
                }
            );
        }
        for since in IDLE_HOLDS as u32..100 {
            now += 1_000;
            f.round(now, 1);
            assert_eq!(f.m.hold(since, since + 1, front(1)), None);
        }
        // Several outstanding again: more is expected again (held once holding pays
        // again: the two wasted holds lowered the score).
        f.round(now + 10, 4);
        assert_eq!(f.m.hold(100, 101, front(1)), Some(false));
    }

    #[test]
    fn a_hold_for_the_frontend_ends_when_it_goes_quiet() {
        let mut f = Fed::new(10_000);
        f.round(0, 32);
        // Rounds 100 ns apart: the average gap comes down from half the window.
        let mut now = 0;
        for outstanding in 1..=60 {
            now += 100;
            f.round(now, outstanding.min(31));
        }
        assert!(f.m.gap_ns < 150, "{}", f.m.gap_ns);
        assert!(f.holds(0, front(1)));
        for outstanding in 2..=20 {
            now += 100;
            f.round(now, outstanding);
            assert_eq!(f.m.release(outstanding, front(outstanding)), Release::No);
        }
        // Quiet: no round for twice the average gap.
        f.m.set_now(now + f.m.quiet_ns() - 1);
        assert_eq!(f.m.release(20, front(20)), Release::No);
        f.m.set_now(now + f.m.quiet_ns());
        assert_eq!(
            f.m.release(20, front(20)),
            Release::Yes {
                since: 0,
                wasted: false,
                why: Why::Quiet,
            }
        );
    }

    #[test]
    fn a_hold_for_the_frontend_ends_when_it_is_back_at_its_depth() {
        // fio at QD4: it resubmits what it reaped, one request at a time, and after the
        // fourth sends nothing more until it hears.
        let mut f = Fed::new(10_000_000);
        f.round(0, 4);
        f.round(1_000, 1);
        assert!(f.holds(0, front(1)));
        for outstanding in 2..4 {
            f.round(1_000 * u64::from(outstanding), outstanding);
            assert_eq!(f.m.release(outstanding, front(outstanding)), Release::No);
        }
        f.round(4_000, 4);
        assert_eq!(
            f.m.release(4, front(4)),
            Release::Yes {
                since: 0,
                wasted: false,
                why: Why::Depth,
            }
        );
    }

    #[test]
    fn a_pause_between_runs_moves_the_average_gap_by_an_eighth_at_most() {
        let mut f = Fed::new(10_000_000);
        let mut now = 0;
        for _ in 0..100 {
            now += 1_000;
            f.round(now, 2);
        }
        let gap = f.m.gap_ns;
        now += 5_000_000;
        f.round(now, 2);
        assert!(f.m.gap_ns <= gap + gap / 8 + 1, "{gap} -> {}", f.m.gap_ns);
        // A round that brings no new request is not a round.
        f.m.sample_outstanding(2, f.req_prod);
        assert_eq!(f.m.last_request, Some(now));
    }

    #[test]
    fn release_at_the_deadline_or_when_nothing_more_is_expected() {
        let mut f = Fed::new(1_000);
        assert!(f.holds(0, BUSY));
        f.m.set_now(999);
        assert_eq!(f.m.release(3, BUSY), Release::No);
        f.m.set_now(1_000);
        assert_eq!(
            f.m.release(3, BUSY),
            Release::Yes {
                since: 0,
                wasted: false,
                why: Why::Deadline,
            }
        );
        assert!(f.holds(3, BUSY));
        assert_eq!(
            f.m.release(5, front(1)),
            Release::Yes {
                since: 3,
                wasted: false,
                why: Why::Drained,
            }
        );
        assert!(!f.m.holding());
    }

    #[test]
    fn a_poller_going_to_sleep_releases_the_hold() {
        let mut f = Fed::new(1_000_000);
        f.round(0, 32);
        f.round(10, 1);
        assert!(f.holds(0, front(1)));
        assert_eq!(
            f.m.release_idle(1, 1),
            Some(Release::Yes {
                since: 0,
                wasted: true,
                why: Why::Sleep,
            })
        );
        assert_eq!(f.m.release_idle(1, 1), None);
        assert_eq!(f.m.deadline(), None);
    }

    /// `count` windows `gap` apart, each due at its start for a device that stays busy;
    /// with `another_response`, one more response comes by the window's end. Returns
    /// whether each was held (`Moderator::hold`); a held one must end with `wasted`
    /// as `!another_response`.
    fn windows(
        m: &mut Moderator,
        now: &mut u64,
        prod: &mut u32,
        (count, gap): (usize, u64),
        another_response: bool,
    ) -> Vec<Option<bool>> {
        let mut held = Vec::new();
        for _ in 0..count {
            m.set_now(*now);
            *prod += 1;
            let decision = m.hold(*prod - 1, *prod, BUSY);
            held.push(decision);
            *now += gap;
            m.set_now(*now);
            if another_response {
                *prod += 1;
            }
            if decision == Some(true) {
                let wasted = !another_response;
                assert!(
                    matches!(m.release(*prod, BUSY), Release::Yes { wasted: w, .. } if w == wasted)
                );
            } else {
                m.observe(another_response.then_some(*prod));
            }
        }
        held
    }

    #[test]
    fn holds_whose_batch_comes_long_after_the_deadline_stop_holding() {
        // 1 MiB reads at QD4 on a RAM disk: the response after the held one comes only
        // at the end of the next poll, which copies a whole request (2 ms here);
        // it carried a batch, but late.
        let mut m = Moderator::new(5_000_000);
        let (mut now, mut prod) = (0, 0);
        let held = windows(&mut m, &mut now, &mut prod, (6, 2_000_000), true);
        let (t, f) = (Some(true), Some(false));
        assert_eq!(held, [t, t, f, f, f, f]);
    }

    #[test]
    fn a_batch_by_twice_the_window_still_pays() {
        // Device holds last at most DEVICE_WINDOW_NS: the next response comes at twice
        // that, just in time, every window.
        let mut m = Moderator::new(5_000_000);
        let (mut now, mut prod) = (0, 0);
        let held = windows(
            &mut m,
            &mut now,
            &mut prod,
            (20, 2 * DEVICE_WINDOW_NS),
            true,
        );
        assert!(held.iter().all(|&h| h == Some(true)), "{held:?}");
    }

    #[test]
    fn wasted_windows_stop_holding_and_paying_ones_resume_it() {
        let mut m = Moderator::new(100);
        let (mut now, mut prod) = (0, 0);
        // Each window: due at `now`, nothing more before the deadline.
        let held = windows(&mut m, &mut now, &mut prod, (6, 200), false);
        let (t, f) = (Some(true), Some(false));
        assert_eq!(held, [t, t, f, f, f, f]);
        // Responses now follow within the window: watched, then held again.
        let mut held = Vec::new();
        for _ in 0..8 {
            m.set_now(now);
            prod += 1;
            let decision = m.hold(prod - 1, prod, BUSY);
            held.push(decision);
            now += 10;
            m.set_now(now);
            prod += 1;
            if decision == Some(true) {
                assert!(matches!(
                    m.release(prod, front(1)),
                    Release::Yes { wasted: false, .. }
                ));
            } else {
                m.observe(Some(prod));
            }
        }
        assert_eq!(held[..4], [f, f, f, f]);
        assert!(held[4..].iter().all(|&h| h == t), "{held:?}");
    }
}
