// SPDX-License-Identifier: MIT OR Apache-2.0
//! Timing with the raw TSC, converted to nanoseconds without reading Xen's clock.
//!
//! Right after boot Xen's `vcpu_time_info` may not give a moving clock yet, but the rate
//! the domain's TSC counts at is known from the start: Xen's CPUID time leaf (base+3,
//! subleaf 0, ECX) reports it in kHz. Where that says 0, the multiplier of a
//! `vcpu_time_info` Xen has filled in gives the same rate; without either, a duration is
//! unknown, never 0.

use crate::shared_info::XenClock;
use core::fmt;

/// How TSC ticks become nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TscRate {
    /// The domain's TSC frequency from Xen's CPUID time leaf, never 0.
    Khz(u32),
    /// The scale of a `vcpu_time_info` with a nonzero multiplier.
    Clock(XenClock),
}

impl TscRate {
    /// The CPUID rate if Xen gave one (`cpuid_khz` > 0), else `clock`'s if Xen has
    /// filled it in, else none.
    pub fn choose(cpuid_khz: u32, clock: Option<XenClock>) -> Option<Self> {
        if cpuid_khz != 0 {
            return Some(Self::Khz(cpuid_khz));
        }
        clock.filter(XenClock::has_rate).map(Self::Clock)
    }

    pub fn ticks_to_ns(self, ticks: u64) -> u64 {
        match self {
            Self::Khz(khz) => (u128::from(ticks) * 1_000_000 / u128::from(khz)) as u64,
            Self::Clock(clock) => clock.ticks_to_ns(ticks),
        }
    }
}

impl fmt::Display for TscRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Khz(khz) => write!(f, "TSC {khz} kHz from Xen's CPUID"),
            Self::Clock(_) => write!(f, "TSC rate from vcpu_time_info"),
        }
    }
}

/// The mean cost of one operation of a timed burst, as a log line shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// At least 1 ns.
    Ns(u64),
    /// The burst took time, but less than 1 ns per operation.
    BelowOneNs,
    /// No rate to convert with, or a burst the TSC did not see (0 ticks, or the TSC
    /// went backwards): nothing was measured.
    Unknown,
}

impl Cost {
    /// `ticks` over `ops` operations, rounded to the nearest ns.
    pub fn per_op(ticks: u64, ops: u64, rate: Option<TscRate>) -> Self {
        let Some(rate) = rate else {
            return Self::Unknown;
        };
        if ticks == 0 || ops == 0 {
            return Self::Unknown;
        }
        match (rate.ticks_to_ns(ticks) + ops / 2) / ops {
            0 => Self::BelowOneNs,
            ns => Self::Ns(ns),
        }
    }

    /// The cost in whole ns (0 below one), `None` when unknown.
    pub fn ns(self) -> Option<u64> {
        match self {
            Self::Ns(ns) => Some(ns),
            Self::BelowOneNs => Some(0),
            Self::Unknown => None,
        }
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ns(ns) => write!(f, "{ns} ns"),
            Self::BelowOneNs => write!(f, "<1 ns"),
            Self::Unknown => write!(f, "unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 GHz as `vcpu_time_info` says it: 0.5 ns per tick.
    const TWO_GHZ: XenClock = XenClock {
        tsc_timestamp: 0,
        system_time: 0,
        tsc_to_system_mul: 1 << 31,
        tsc_shift: 0,
    };

    #[test]
    fn cpuid_khz_converts_ticks() {
        let rate = TscRate::choose(2_918_400, None).unwrap();
        assert_eq!(rate, TscRate::Khz(2_918_400));
        // 200 RDTSCs of 211 ns at 2.9184 GHz.
        assert_eq!(rate.ticks_to_ns(123_157), 42_200);
        assert_eq!(Cost::per_op(123_157, 200, Some(rate)), Cost::Ns(211));
        assert_eq!(Cost::per_op(123_157, 200, Some(rate)).to_string(), "211 ns");
        // No overflow for a long burst (an hour at 3 GHz).
        assert_eq!(
            TscRate::Khz(3_000_000).ticks_to_ns(10_800_000_000_000),
            3_600_000_000_000
        );
        assert!(rate.to_string().contains("2918400 kHz"));
    }

    #[test]
    fn cpuid_rate_comes_before_the_clock() {
        assert_eq!(
            TscRate::choose(1_000_000, Some(TWO_GHZ)),
            Some(TscRate::Khz(1_000_000))
        );
    }

    #[test]
    fn no_cpuid_rate_falls_back_to_a_filled_in_clock() {
        let rate = TscRate::choose(0, Some(TWO_GHZ)).unwrap();
        assert_eq!(rate, TscRate::Clock(TWO_GHZ));
        assert_eq!(Cost::per_op(400, 2, Some(rate)), Cost::Ns(100));
    }

    #[test]
    fn no_rate_anywhere_is_unknown_not_zero() {
        // CPUID says 0 kHz and Xen has not filled in our time info (multiplier 0).
        assert_eq!(TscRate::choose(0, Some(XenClock::default())), None);
        assert_eq!(TscRate::choose(0, None), None);
        let rate = TscRate::choose(0, Some(XenClock::default()));
        assert_eq!(Cost::per_op(123_157, 200, rate), Cost::Unknown);
        assert_eq!(Cost::Unknown.to_string(), "unknown");
    }

    #[test]
    fn a_burst_the_tsc_did_not_see_is_unknown() {
        let rate = Some(TscRate::Khz(2_000_000));
        assert_eq!(Cost::per_op(0, 200, rate), Cost::Unknown);
        assert_eq!(Cost::per_op(100, 0, rate), Cost::Unknown);
    }

    #[test]
    fn under_a_nanosecond_is_said_so() {
        let rate = Some(TscRate::Khz(3_000_000));
        // 200 operations in 300 ticks at 3 GHz: 100 ns, 0.5 ns each, rounds up to 1.
        assert_eq!(Cost::per_op(300, 200, rate), Cost::Ns(1));
        // 200 in 3 ticks: 1 ns in all.
        assert_eq!(Cost::per_op(3, 200, rate), Cost::BelowOneNs);
        assert_eq!(Cost::BelowOneNs.to_string(), "<1 ns");
    }

    #[test]
    fn a_cost_in_whole_ns_is_none_only_when_unknown() {
        assert_eq!(Cost::Ns(322).ns(), Some(322));
        assert_eq!(Cost::BelowOneNs.ns(), Some(0));
        assert_eq!(Cost::Unknown.ns(), None);
    }
}
