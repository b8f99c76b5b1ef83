// SPDX-License-Identifier: MIT OR Apache-2.0
//! How long an idle poller spins before it sleeps.
//!
//! A wake-up from `SCHEDOP_poll` costs a hypercall (expensive where the CPU is emulated)
//! plus a cross-pCPU wake; a spin costs the pCPU it runs on. So the spell a poller keeps
//! spinning after its last work adapts to the gaps it sees between bursts of work: twice
//! their running average (1/8 weight), within bounds. Work found right after a sleep
//! counts as a gap of the longest spell: a longer spell might have caught it. Only work
//! moves the average: an idle poller spins the spell it had per wake-up (about one a
//! second), a fresh one twice the shortest bound.
//!
//! The default bounds come from tests/xen/spin-sweep (results in BENCHMARKS.md): shorter
//! spells put the poller to sleep in the gaps of a steady workload, so requests wait for
//! wake-ups; longer ones spin for little more work. `poll.spin-us=` overrides them.

/// The shortest spell by default.
pub const MIN_SPELL_NS: u64 = 200_000;
/// The longest spell by default.
pub const MAX_SPELL_NS: u64 = 5_000_000;
/// The longest bound accepted (`poll.spin-us=`): beyond it a poller is simply a busy loop.
pub const SPELL_LIMIT_NS: u64 = 100_000_000;

/// What an idle poller does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep spinning: work may come within the spell.
    Spin,
    /// The spell is over: re-arm the rings and sleep.
    Sleep,
}

/// One poller's adaptive spin spell. Times are Xen system time in ns.
#[derive(Clone, Debug)]
pub struct SpinPolicy {
    min_spell_ns: u64,
    max_spell_ns: u64,
    /// Running average of the gap from the end of one burst of work to the next.
    average_gap_ns: u64,
    /// When the current idle stretch began (`None`: not idle, or measuring anew).
    idle_since: Option<u64>,
    /// How the last sleep ended, until the poller finds work.
    wake: Wake,
}

/// How a poller's last sleep ended, as long as it has found no work since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    /// Work found since (or no sleep yet).
    Settled,
    /// Woken for this poller: work found next counts as a miss of the spell.
    ForUs,
    /// Woken for another vCPU: it looks once and sleeps again.
    Stray,
}

impl SpinPolicy {
    /// A policy whose spell stays within `min_spell_ns..=max_spell_ns` (a `max` below
    /// `min` is taken as `min`); the average gap starts at the shortest bound.
    pub const fn new(min_spell_ns: u64, max_spell_ns: u64) -> SpinPolicy {
        let max_spell_ns = if max_spell_ns < min_spell_ns {
            min_spell_ns
        } else {
            max_spell_ns
        };
        SpinPolicy {
            min_spell_ns,
            max_spell_ns,
            average_gap_ns: min_spell_ns,
            idle_since: None,
            wake: Wake::Settled,
        }
    }

    /// The poller found work at `now`: the gap since it went idle (or, right after a
    /// sleep, the longest spell) joins the average.
    pub fn on_work(&mut self, now: u64) {
        if let Some(since) = self.idle_since.take() {
            let gap = now.saturating_sub(since).min(self.max_spell_ns);
            self.average_gap_ns = (self.average_gap_ns * 7 + gap) / 8;
        } else if self.wake == Wake::ForUs {
            // Work right after a sleep: a longer spell might have caught it.
            self.average_gap_ns = (self.average_gap_ns * 7 + self.max_spell_ns) / 8;
        }
        self.wake = Wake::Settled;
    }

    /// The poller found nothing at `now`: spin on while the spell lasts, then sleep.
    /// After a stray wake-up there is no spell: it sleeps again at once.
    pub fn on_idle(&mut self, now: u64) -> Decision {
        if self.wake == Wake::Stray {
            return Decision::Sleep;
        }
        let since = *self.idle_since.get_or_insert(now);
        if now.saturating_sub(since) < self.spell_ns() {
            Decision::Spin
        } else {
            Decision::Sleep
        }
    }

    /// The last look before sleeping found work after all (a ring's final check, a new
    /// ring): the poller goes on, and its idle time is measured anew.
    pub fn on_sleep_abandoned(&mut self) {
        self.idle_since = None;
        if self.wake == Wake::Stray {
            self.wake = Wake::Settled;
        }
    }

    /// Back from a sleep. The time asleep is no gap a spin could have bridged: the idle
    /// time is measured anew, and work found next counts as a miss of the spell.
    pub fn on_wake(&mut self) {
        self.idle_since = None;
        self.wake = Wake::ForUs;
    }

    /// Back from a sleep that was not for this poller: none of its ports was pending and
    /// its deadline had not come. Xen wakes every vCPU that polls more than one port at
    /// any event of the domain (`evtchn_check_pollers`), so each frontend's kick to one
    /// poller wakes every other sleeping one. Spinning a spell after such a wake-up would
    /// turn that herd into busy pCPUs; the poller looks once and sleeps again, and its
    /// average is left as it was (work found now is no miss of its spell).
    pub fn on_stray_wake(&mut self) {
        self.idle_since = None;
        self.wake = Wake::Stray;
    }

    /// How long the poller spins now after its last work.
    pub fn spell_ns(&self) -> u64 {
        (self.average_gap_ns * 2).clamp(self.min_spell_ns, self.max_spell_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    fn default_policy() -> SpinPolicy {
        SpinPolicy::new(MIN_SPELL_NS, MAX_SPELL_NS)
    }

    /// Idle from `start` on: the first time `on_idle` says sleep, `step` ns apart.
    fn sleeps_after(policy: &mut SpinPolicy, start: u64, step: u64) -> u64 {
        let mut now = start;
        while policy.on_idle(now) == Decision::Spin {
            now += step;
        }
        now - start
    }

    /// Bursts of work `gap` apart, `rounds` times, from `start`; returns the end time.
    fn work_with_gaps(policy: &mut SpinPolicy, start: u64, gap: u64, rounds: usize) -> u64 {
        let mut now = start;
        for _ in 0..rounds {
            policy.on_work(now);
            assert_eq!(policy.on_idle(now + 1), Decision::Spin);
            now += gap;
        }
        policy.on_work(now);
        now
    }

    #[test]
    fn a_fresh_poller_spins_twice_the_shortest_bound() {
        let mut policy = default_policy();
        assert_eq!(policy.spell_ns(), 2 * MIN_SPELL_NS);
        assert_eq!(policy.on_idle(1_000), Decision::Spin);
        assert_eq!(policy.on_idle(1_000 + 2 * MIN_SPELL_NS - 1), Decision::Spin);
        assert_eq!(policy.on_idle(1_000 + 2 * MIN_SPELL_NS), Decision::Sleep);
        // Sleeping and waking with no work between leaves it as it was.
        policy.on_wake();
        assert_eq!(sleeps_after(&mut policy, 10 * MS, US), 2 * MIN_SPELL_NS);
    }

    #[test]
    fn gaps_bridged_by_spinning_lengthen_the_spell_to_twice_their_average() {
        let mut policy = default_policy();
        // Work every 1 ms, each gap bridged by spinning (the spell grows as it goes).
        let now = work_with_gaps(&mut policy, 0, MS, 60);
        let spell = policy.spell_ns();
        assert!((1_900 * US..=2 * MS).contains(&spell), "spell {spell}");
        // An idle poller now spins ~2 ms before it sleeps, not the 200 us it began with.
        let slept_after = sleeps_after(&mut policy, now + 1, 10 * US);
        assert!(slept_after >= 1_900 * US, "slept after {slept_after} ns");
    }

    #[test]
    fn work_right_after_each_sleep_grows_the_spell_to_the_longest() {
        let mut policy = default_policy();
        let mut now = 0;
        let mut spells = Vec::new();
        for _ in 0..30 {
            now += sleeps_after(&mut policy, now, 10 * US);
            policy.on_wake();
            now += 50 * MS;
            policy.on_work(now);
            spells.push(policy.spell_ns());
        }
        assert!(spells.windows(2).all(|w| w[0] <= w[1]), "{spells:?}");
        assert_eq!(policy.spell_ns(), MAX_SPELL_NS);
    }

    #[test]
    fn short_gaps_shrink_the_spell_back_to_the_shortest() {
        let mut policy = default_policy();
        let now = work_with_gaps(&mut policy, 0, 4 * MS, 60);
        assert_eq!(policy.spell_ns(), MAX_SPELL_NS);
        work_with_gaps(&mut policy, now, 10 * US, 60);
        assert_eq!(policy.spell_ns(), MIN_SPELL_NS);
    }

    #[test]
    fn one_long_gap_counts_as_the_longest_spell_at_most() {
        let mut policy = default_policy();
        policy.on_idle(0);
        policy.on_work(60_000 * MS);
        // The average moved an eighth of the way to the longest spell, no further.
        let average = (MIN_SPELL_NS * 7 + MAX_SPELL_NS) / 8;
        assert_eq!(policy.spell_ns(), 2 * average);
    }

    #[test]
    fn work_after_a_wake_that_found_none_first_is_an_ordinary_gap() {
        let mut policy = default_policy();
        policy.on_wake();
        // Idle for 100 us after the wake, then work: a 100 us gap, not a missed spell.
        policy.on_idle(1_000);
        policy.on_work(1_000 + 100 * US);
        let spell = 2 * ((MIN_SPELL_NS * 7 + 100 * US) / 8);
        assert_eq!(policy.spell_ns(), spell);
        // And the wake is forgotten: work again at once changes nothing.
        policy.on_work(2_000 * US);
        assert_eq!(policy.spell_ns(), spell);
    }

    #[test]
    fn an_abandoned_sleep_measures_idle_time_anew() {
        let mut policy = default_policy();
        let spell = policy.spell_ns();
        assert_eq!(policy.on_idle(0), Decision::Spin);
        assert_eq!(policy.on_idle(spell), Decision::Sleep);
        policy.on_sleep_abandoned();
        assert_eq!(policy.on_idle(spell + 1), Decision::Spin);
        assert_eq!(policy.on_idle(2 * spell), Decision::Spin);
        assert_eq!(policy.on_idle(2 * spell + 1), Decision::Sleep);
        // Work then counts the gap from where idle time began anew.
        policy.on_work(2 * spell + 1 + 100 * US);
        assert_eq!(
            policy.spell_ns(),
            2 * ((MIN_SPELL_NS * 7 + spell + 100 * US) / 8)
        );
    }

    #[test]
    fn a_stray_wake_sleeps_again_at_once_and_moves_no_average() {
        let mut policy = default_policy();
        let spell = policy.spell_ns();
        policy.on_stray_wake();
        assert_eq!(policy.on_idle(1_000), Decision::Sleep);
        // The final check found work after all: the poller spins its spell again.
        policy.on_sleep_abandoned();
        assert_eq!(policy.on_idle(2_000), Decision::Spin);
        assert_eq!(policy.spell_ns(), spell);
        // Work right after a stray wake-up is no miss of the spell.
        policy.on_stray_wake();
        policy.on_work(3_000);
        assert_eq!(policy.spell_ns(), spell);
        assert_eq!(policy.on_idle(3_001), Decision::Spin);
        // A wake-up that was for the poller spins as before.
        policy.on_stray_wake();
        policy.on_wake();
        assert_eq!(policy.on_idle(10_000), Decision::Spin);
        assert_eq!(policy.on_idle(10_000 + spell), Decision::Sleep);
    }

    #[test]
    fn bounds_hold_whatever_the_window() {
        let mut policy = SpinPolicy::new(50 * US, 50 * US);
        work_with_gaps(&mut policy, 0, 10 * MS, 20);
        assert_eq!(policy.spell_ns(), 50 * US);
        let inverted = SpinPolicy::new(300 * US, 100 * US);
        assert_eq!(inverted.spell_ns(), 300 * US);
    }
}
