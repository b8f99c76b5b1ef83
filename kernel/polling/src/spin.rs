// SPDX-License-Identifier: MIT OR Apache-2.0
//! Whether an idle poller spins or sleeps, and for how long it spins.
//!
//! A wake-up from `SCHEDOP_poll` costs a hypercall (expensive where the CPU is emulated)
//! plus a cross-pCPU wake, and the request that caused it waits for both; a spin costs
//! the pCPU it runs on, which in a driver domain that shares cores is taken from the
//! guests. So the poller spins only while the load says a request is likely soon: it
//! keeps a running average (1/8 weight) of the gap between the end of one burst of work
//! and the start of the next, measured on the clock whether it spun or slept through the
//! gap (a gap counts at most [`LONG_GAP_FACTOR`] times the longest spell, so one idle
//! stretch moves the average far but not forever). While that average is at most half
//! the longest spell (the *spin window*: a request likely comes within it), an idle
//! poller spins twice the average, within `poll.spin-us=`'s bounds, then sleeps; above
//! it, it sleeps at once and the frontend's next request wakes it (`req_event`). A
//! wake-up whose first look finds nothing (the sleep's deadline, the doorbell, or an
//! upcall for a port with nothing to do) is followed by the next sleep at once, with no spell: an idle poller costs one look
//! per wake-up.
//!
//! A frontend that keeps many requests in flight (a database, fio at depth) sends them
//! again as it reaps the answers: after a burst that answered [`DEEP_BURST`] or more, the
//! next requests are coming whatever the average gap says, and an idle poller spins up
//! to [`DEEP_SPELL_FACTOR`] times the longest spell. A frontend at depth 1 (or one paced
//! by a rate) answers one request per burst and never extends the spin.
//!
//! So a poller follows its load: under a steady stream with short gaps it never sleeps;
//! at a rate whose gaps exceed the window it sleeps between requests, as an interrupt
//! driven backend would; idle it looks once per wake-up. `poll.spin-us=` overrides the
//! bounds.

/// The shortest spell by default.
pub const MIN_SPELL_NS: u64 = 200_000;
/// The longest spell by default; half of it is the spin window.
pub const MAX_SPELL_NS: u64 = 1_000_000;
/// The longest bound accepted (`poll.spin-us=`): beyond it a poller is simply a busy loop.
pub const SPELL_LIMIT_NS: u64 = 100_000_000;
/// A gap counts at most this many longest spells in the average: one idle stretch after
/// a busy one puts the average above the window (the next gap is slept through), and a
/// few short gaps bring it back.
pub const LONG_GAP_FACTOR: u64 = 8;

/// A burst of work that answered at least this many requests says its frontend keeps
/// that many in flight: more come as it reaps them.
pub const DEEP_BURST: u32 = 8;
/// After such a burst an idle poller spins up to this many longest spells.
pub const DEEP_SPELL_FACTOR: u64 = 5;

/// What an idle poller does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep spinning: work may come within the spell.
    Spin,
    /// Re-arm the rings and sleep: the spell is over, or no request is likely soon.
    Sleep,
}

/// One poller's spin-or-sleep policy. Times are Xen system time in ns.
#[derive(Clone, Debug)]
pub struct SpinPolicy {
    min_spell_ns: u64,
    max_spell_ns: u64,
    /// Running average of the gap from the end of one burst of work to the next.
    average_gap_ns: u64,
    /// When the current gap began: the first idle look after work (kept across sleeps).
    gap_since: Option<u64>,
    /// When the current spell began (`None`: not spinning, or measuring anew).
    spell_since: Option<u64>,
    /// Back from a sleep and no work found since.
    woken: bool,
    /// Requests answered in the current burst of work.
    burst_answered: u32,
    /// The last burst answered [`DEEP_BURST`] or more.
    deep: bool,
}

impl SpinPolicy {
    /// A policy whose spell stays within `min_spell_ns..=max_spell_ns` (a `max` below
    /// `min` is taken as `min`). It starts as after an idle stretch: it sleeps until the
    /// gaps it sees say a request is likely within the window.
    pub const fn new(min_spell_ns: u64, max_spell_ns: u64) -> SpinPolicy {
        let max_spell_ns = if max_spell_ns < min_spell_ns {
            min_spell_ns
        } else {
            max_spell_ns
        };
        SpinPolicy {
            min_spell_ns,
            max_spell_ns,
            average_gap_ns: max_spell_ns.saturating_mul(LONG_GAP_FACTOR),
            gap_since: None,
            spell_since: None,
            woken: false,
            burst_answered: 0,
            deep: false,
        }
    }

    /// The poller found work at `now`, answering `answered` requests: the gap since the
    /// last work (spun or slept through) joins the average.
    pub fn on_work(&mut self, now: u64, answered: u32) {
        if let Some(since) = self.gap_since.take() {
            let gap = now
                .saturating_sub(since)
                .min(self.max_spell_ns.saturating_mul(LONG_GAP_FACTOR));
            self.average_gap_ns = (self.average_gap_ns.saturating_mul(7) + gap) / 8;
            self.burst_answered = 0;
        }
        self.burst_answered = self.burst_answered.saturating_add(answered);
        self.spell_since = None;
        self.woken = false;
    }

    /// The poller found nothing at `now`: spin on while a request is likely and the
    /// spell lasts, else sleep.
    pub fn on_idle(&mut self, now: u64) -> Decision {
        if self.gap_since.is_none() {
            self.gap_since = Some(now);
            self.deep = self.burst_answered >= DEEP_BURST;
        }
        if self.woken || !(self.deep || self.expects_work()) {
            return Decision::Sleep;
        }
        let since = *self.spell_since.get_or_insert(now);
        if now.saturating_sub(since) < self.current_spell_ns() {
            Decision::Spin
        } else {
            Decision::Sleep
        }
    }

    /// The last look before sleeping found work after all (a ring's final check, a new
    /// ring): the poller goes on, its spell measured anew.
    pub fn on_sleep_abandoned(&mut self) {
        self.spell_since = None;
        self.woken = false;
    }

    /// Back from a sleep, whatever woke it. If its first look finds nothing it sleeps
    /// again at once; the gap goes on (its time asleep is part of it).
    pub fn on_wake(&mut self) {
        self.spell_since = None;
        self.woken = true;
    }

    /// Whether the recent gaps say a request is likely within the spin window (half the
    /// longest spell): then an idle poller spins.
    pub fn expects_work(&self) -> bool {
        self.average_gap_ns <= self.max_spell_ns / 2
    }

    /// How long the poller spins after its last work while it expects more.
    pub fn spell_ns(&self) -> u64 {
        self.average_gap_ns
            .saturating_mul(2)
            .clamp(self.min_spell_ns, self.max_spell_ns)
    }

    /// The spell of this gap: extended after a deep burst.
    fn current_spell_ns(&self) -> u64 {
        if self.deep {
            self.max_spell_ns.saturating_mul(DEEP_SPELL_FACTOR)
        } else {
            self.spell_ns()
        }
    }

    /// The running average of the gaps between bursts of work.
    pub fn average_gap_ns(&self) -> u64 {
        self.average_gap_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn default_policy() -> SpinPolicy {
        SpinPolicy::new(MIN_SPELL_NS, MAX_SPELL_NS)
    }

    /// What a poller did over a simulated stretch.
    #[derive(Debug, Default)]
    struct Run {
        /// Time spent spinning with nothing to do.
        spun_ns: u64,
        sleeps: u64,
        /// Requests found while spinning (no wake-up on their path).
        caught: u64,
        /// Requests that had to wake the poller.
        woke_for: u64,
        /// Wake-ups that found nothing (the sleep's 1 s deadline).
        empty_wakes: u64,
    }

    /// A poller on a deterministic clock: requests arrive at `arrivals` (sorted, ns); a
    /// look at the ring costs `look_ns`, serving a request `serve_ns`, a wake-up
    /// `wake_ns` after its event; a sleep lasts at most 1 s. Runs until `end`.
    fn simulate(
        policy: &mut SpinPolicy,
        arrivals: &[u64],
        start: u64,
        end: u64,
        look_ns: u64,
        serve_ns: u64,
        wake_ns: u64,
    ) -> Run {
        let mut run = Run::default();
        let mut now = start;
        let mut next = arrivals.iter().copied().filter(|&a| a >= start).peekable();
        let mut spinning = false;
        while now < end {
            if next.peek().is_some_and(|&a| a <= now) {
                next.next();
                if spinning {
                    run.caught += 1;
                }
                policy.on_work(now, 1);
                now += serve_ns;
                spinning = false;
                continue;
            }
            match policy.on_idle(now) {
                Decision::Spin => {
                    spinning = true;
                    now += look_ns;
                    run.spun_ns += look_ns;
                }
                Decision::Sleep => {
                    run.sleeps += 1;
                    spinning = false;
                    let deadline = now + S;
                    match next.peek() {
                        Some(&a) if a < deadline => {
                            run.woke_for += 1;
                            now = a + wake_ns;
                        }
                        _ => {
                            run.empty_wakes += 1;
                            now = deadline;
                        }
                    }
                    policy.on_wake();
                }
            }
        }
        run
    }

    /// Work `gap` apart, `count` times from `start`, each gap spun through; returns the
    /// time of the last work.
    fn busy(policy: &mut SpinPolicy, start: u64, gap: u64, count: u64) -> u64 {
        let mut now = start;
        for _ in 0..count {
            policy.on_work(now, 1);
            policy.on_idle(now + 1);
            now += gap;
        }
        policy.on_work(now, 1);
        now
    }

    /// `count` requests `gap` apart from `start`.
    fn steady(start: u64, gap: u64, count: u64) -> Vec<u64> {
        (0..count).map(|i| start + i * gap).collect()
    }

    /// A frontend that keeps `depth` requests in flight: it sends all of them again
    /// `reap_ns` after the poller answered the last of a burst (serving one takes
    /// `serve_ns`); a wake-up costs `wake_ns`. Runs `bursts` bursts; returns what the
    /// poller did and when it ended.
    fn closed_loop(
        policy: &mut SpinPolicy,
        depth: u32,
        reap_ns: u64,
        serve_ns: u64,
        wake_ns: u64,
        bursts: u32,
    ) -> (Run, u64) {
        let mut run = Run::default();
        let mut now = 0;
        for _ in 0..bursts {
            policy.on_work(now, depth);
            now += u64::from(depth) * serve_ns;
            let next = now + reap_ns;
            loop {
                if now >= next {
                    run.caught += 1;
                    break;
                }
                match policy.on_idle(now) {
                    Decision::Spin => {
                        run.spun_ns += US;
                        now += US;
                    }
                    Decision::Sleep => {
                        run.sleeps += 1;
                        run.woke_for += 1;
                        now = next + wake_ns;
                        policy.on_wake();
                        break;
                    }
                }
            }
        }
        (run, now)
    }

    #[test]
    fn at_depth_it_spins_through_the_frontends_reap() {
        // 16 in flight, sent again 1.5 ms after each answer: longer than the spin
        // window, so the average alone would sleep through every gap.
        let mut policy = default_policy();
        let (run, _) = closed_loop(&mut policy, 16, 1_500 * US, 10 * US, 200 * US, 1_000);
        assert_eq!(run.sleeps, 0, "{run:?}");
        assert_eq!(run.caught, 1_000, "{run:?}");
        assert!(!policy.expects_work(), "the gaps alone say sleep");
        // One at a time with the same gaps: it sleeps through each.
        let mut shallow = default_policy();
        let (run, _) = closed_loop(&mut shallow, 1, 1_500 * US, 10 * US, 200 * US, 1_000);
        assert_eq!(run.sleeps, 1_000, "{run:?}");
        assert_eq!(run.spun_ns, 0, "{run:?}");
        // Just below the depth that extends it: the same.
        let mut below = default_policy();
        let (run, _) = closed_loop(
            &mut below,
            DEEP_BURST - 1,
            1_500 * US,
            10 * US,
            200 * US,
            100,
        );
        assert_eq!(run.sleeps, 100, "{run:?}");
    }

    #[test]
    fn after_a_deep_burst_it_spins_a_bounded_spell_then_sleeps() {
        let mut policy = default_policy();
        policy.on_work(0, 32);
        let mut now = 1;
        while policy.on_idle(now) == Decision::Spin {
            now += US;
        }
        assert!(
            (now - 1).abs_diff(DEEP_SPELL_FACTOR * MAX_SPELL_NS) <= US,
            "spun {} ns",
            now - 1
        );
        // Woken with nothing to do: asleep again at once, no second spell.
        policy.on_wake();
        assert_eq!(policy.on_idle(now + S), Decision::Sleep);
        // A bound of zero stays zero.
        let mut never = SpinPolicy::new(0, 0);
        never.on_work(0, 32);
        assert_eq!(never.on_idle(1), Decision::Sleep);
    }

    #[test]
    fn a_fresh_poller_sleeps_at_once() {
        let mut policy = default_policy();
        assert!(!policy.expects_work());
        assert_eq!(policy.on_idle(1_000), Decision::Sleep);
    }

    #[test]
    fn at_a_low_rate_it_sleeps_between_requests() {
        // 100 and 1,000 requests a second at QD1: no spin between them at all.
        for gap in [10 * MS, MS] {
            let mut policy = default_policy();
            let count = 2 * S / gap;
            let arrivals = steady(0, gap, count);
            let run = simulate(&mut policy, &arrivals, 0, 2 * S, US, 20 * US, 50 * US);
            assert_eq!(run.spun_ns, 0, "gap {gap}: {run:?}");
            // The first is there at the start; every other one wakes the poller.
            assert_eq!(run.woke_for, count - 1, "gap {gap}: {run:?}");
            assert!(!policy.expects_work());
        }
    }

    #[test]
    fn at_a_high_rate_it_spins_through_the_gaps() {
        // 10,000 requests a second: after the first few (its average starts as after an
        // idle stretch) every request is found spinning, none waits for a wake-up.
        let mut policy = default_policy();
        let arrivals = steady(0, 100 * US, 10_000);
        let run = simulate(&mut policy, &arrivals, 0, S, US, 20 * US, 50 * US);
        assert!(run.woke_for <= 30, "{run:?}");
        assert!(run.caught >= 9_960, "{run:?}");
        assert!(policy.expects_work());
        assert_eq!(policy.spell_ns(), MIN_SPELL_NS);
    }

    #[test]
    fn it_follows_the_load_down_and_up_again() {
        let mut policy = default_policy();
        // Busy (gaps of 50 us), then 100 a second, then busy again.
        let mut arrivals = steady(0, 50 * US, 2_000);
        arrivals.extend(steady(200 * MS, 10 * MS, 100));
        arrivals.extend(steady(1_300 * MS, 50 * US, 2_000));
        let busy = simulate(&mut policy, &arrivals, 0, 200 * MS, US, 10 * US, 50 * US);
        assert!(busy.woke_for <= 30, "{busy:?}");
        assert!(busy.caught >= 1_950, "{busy:?}");
        // One long gap is enough to stop spinning through the next.
        let slow = simulate(
            &mut policy,
            &arrivals,
            200 * MS,
            1_300 * MS,
            US,
            10 * US,
            50 * US,
        );
        assert!(slow.woke_for >= 99, "{slow:?}");
        assert!(slow.spun_ns <= 2 * MAX_SPELL_NS, "{slow:?}");
        let again = simulate(
            &mut policy,
            &arrivals,
            1_300 * MS,
            1_500 * MS,
            US,
            10 * US,
            50 * US,
        );
        assert!(again.woke_for <= 30, "{again:?}");
        assert!(again.caught >= 1_950, "{again:?}");
    }

    #[test]
    fn idle_it_looks_once_per_wake_up_and_spins_not_at_all() {
        let mut policy = default_policy();
        // A busy stretch, then 10 s without a request.
        let arrivals = steady(0, 50 * US, 2_000);
        simulate(&mut policy, &arrivals, 0, 100 * MS, US, 10 * US, 50 * US);
        let idle = simulate(
            &mut policy,
            &[],
            100 * MS,
            10_100 * MS,
            US,
            10 * US,
            50 * US,
        );
        // One spell at most right after the last request, then one look per wake-up.
        assert!(idle.spun_ns <= MAX_SPELL_NS, "{idle:?}");
        assert_eq!(idle.empty_wakes, 10, "{idle:?}");
        assert_eq!(idle.sleeps, 10, "{idle:?}");
        // The first request after it is slept for, and so is the next gap.
        policy.on_work(10_200 * MS, 1);
        assert_eq!(policy.on_idle(10_200 * MS + 1), Decision::Sleep);
    }

    #[test]
    fn a_wake_up_that_finds_nothing_sleeps_again_at_once() {
        let mut policy = default_policy();
        // Expecting work (short gaps), it spins after work...
        let now = busy(&mut policy, 0, 50 * US, 200);
        assert!(policy.expects_work());
        assert_eq!(policy.on_idle(now + 1), Decision::Spin);
        // ...but not after a wake-up (a deadline, the doorbell, another vCPU's event)
        // whose first look found nothing.
        policy.on_wake();
        assert_eq!(policy.on_idle(now + 100 * US), Decision::Sleep);
        // The final check found a request after all: it spins its spell again.
        policy.on_sleep_abandoned();
        assert_eq!(policy.on_idle(now + 101 * US), Decision::Spin);
    }

    #[test]
    fn the_gap_includes_the_time_asleep() {
        let mut policy = default_policy();
        let now = busy(&mut policy, 0, 50 * US, 200);
        let before = policy.average_gap_ns();
        // Idle just after the last work, asleep, woken 20 ms later with work: a 20 ms
        // gap, counted as the cap.
        policy.on_idle(now + 1);
        policy.on_wake();
        policy.on_work(now + 1 + 20 * MS, 1);
        let cap = LONG_GAP_FACTOR * MAX_SPELL_NS;
        assert_eq!(policy.average_gap_ns(), (before * 7 + cap) / 8);
        assert!(!policy.expects_work());
    }

    #[test]
    fn the_spell_is_twice_the_average_gap_within_bounds() {
        let mut policy = default_policy();
        for i in 0..100 {
            policy.on_work(i * 200 * US, 1);
            policy.on_idle(i * 200 * US + 1);
        }
        // Gaps of ~200 us: the spell ~400 us, inside the bounds.
        let spell = policy.spell_ns();
        assert!((390 * US..=410 * US).contains(&spell), "spell {spell}");
        policy.on_work(100 * 200 * US, 1);
        let mut now = 100 * 200 * US + 1;
        let start = now;
        while policy.on_idle(now) == Decision::Spin {
            now += US;
        }
        assert!((now - start).abs_diff(spell) <= US, "spun {}", now - start);
    }

    #[test]
    fn bounds_hold_whatever_the_window() {
        let mut policy = SpinPolicy::new(50 * US, 50 * US);
        for i in 0..100 {
            policy.on_work(i * US, 1);
            policy.on_idle(i * US);
        }
        assert_eq!(policy.spell_ns(), 50 * US);
        let inverted = SpinPolicy::new(300 * US, 100 * US);
        assert_eq!(inverted.spell_ns(), 300 * US);
        // The longest bound accepted does not overflow.
        let widest = SpinPolicy::new(1, SPELL_LIMIT_NS);
        assert_eq!(widest.average_gap_ns(), SPELL_LIMIT_NS * LONG_GAP_FACTOR);
    }
}
