// SPDX-License-Identifier: MIT OR Apache-2.0
//! What a spinning poller does between two looks at its rings (`poll.idle=`).

/// What an idle poller does between two looks at its rings while it spins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollIdle {
    /// `pause`: a PAUSE instruction, and look again (the default on hardware; see
    /// [`PollIdle::for_pause_cost`]).
    #[default]
    Pause,
    /// `yield`: `SCHEDOP_yield`, so another vCPU on this pCPU runs first (a hypercall
    /// per look).
    Yield,
    /// `spin`: nothing, look again at once. Under QEMU's TCG a PAUSE leaves the emulated
    /// CPU's execution loop, and each return to it takes QEMU's global lock, which the
    /// guests' emulated CPUs then wait for; on hardware a PAUSE is what spares a sibling
    /// hyperthread.
    Spin,
}

/// Above this a PAUSE is emulated rather than executed: on hardware it takes at most
/// ~140 cycles (under 120 ns at 1.2 GHz); under QEMU's TCG it leaves the emulated CPU's
/// loop and takes QEMU's global lock, several times longer.
pub const EMULATED_PAUSE_NS: u64 = 150;

impl PollIdle {
    /// Every choice.
    pub const ALL: [PollIdle; 3] = [PollIdle::Pause, PollIdle::Yield, PollIdle::Spin];

    /// Its name on the command line (and in the log).
    pub fn name(self) -> &'static str {
        match self {
            PollIdle::Pause => "pause",
            PollIdle::Yield => "yield",
            PollIdle::Spin => "spin",
        }
    }

    /// The choice named `name` (as [`PollIdle::name`] spells it).
    pub fn from_name(name: &str) -> Option<PollIdle> {
        PollIdle::ALL.into_iter().find(|idle| idle.name() == name)
    }

    /// The choice when `poll.idle=` is not given (or is `auto`): `spin` where a PAUSE,
    /// measured at boot, costs more than [`EMULATED_PAUSE_NS`] (an emulated CPU);
    /// `pause` where it costs less, or where its cost is unknown.
    pub fn for_pause_cost(pause_ns: Option<u64>) -> PollIdle {
        match pause_ns {
            Some(ns) if ns > EMULATED_PAUSE_NS => PollIdle::Spin,
            _ => PollIdle::Pause,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_both_ways() {
        for idle in PollIdle::ALL {
            assert_eq!(PollIdle::from_name(idle.name()), Some(idle));
        }
        for bad in ["", "auto", "Yield", "spinning"] {
            assert_eq!(PollIdle::from_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_emulated_pause_means_spin_by_default() {
        // A PAUSE as the nested rig's emulated CPU takes it, and a hardware one.
        assert_eq!(PollIdle::for_pause_cost(Some(218)), PollIdle::Spin);
        assert_eq!(
            PollIdle::for_pause_cost(Some(EMULATED_PAUSE_NS + 1)),
            PollIdle::Spin
        );
        assert_eq!(
            PollIdle::for_pause_cost(Some(EMULATED_PAUSE_NS)),
            PollIdle::Pause
        );
        assert_eq!(PollIdle::for_pause_cost(Some(40)), PollIdle::Pause);
        assert_eq!(PollIdle::for_pause_cost(Some(0)), PollIdle::Pause);
        // Not measured (no TSC rate): the instruction meant for spinning.
        assert_eq!(PollIdle::for_pause_cost(None), PollIdle::Pause);
    }
}
