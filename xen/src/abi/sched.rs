// SPDX-License-Identifier: MIT OR Apache-2.0
//! `sched_op` (`public/sched.h`).

pub const SCHEDOP_YIELD: u64 = 0;
/// Block until an event is deliverable (see `crate::evtchn::wait` for the wake-up rule
/// on HVM/PVH vCPUs).
pub const SCHEDOP_BLOCK: u64 = 1;
pub const SCHEDOP_SHUTDOWN: u64 = 2;
pub const SCHEDOP_POLL: u64 = 3;

/// `struct sched_shutdown`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedShutdown {
    pub reason: u32,
}

/// `struct sched_poll`: `ports` is a guest pointer to `nr_ports` ports (at most 128).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedPoll {
    pub ports: u64,
    pub nr_ports: u32,
    /// Absolute Xen system time in ns; 0 = no timeout.
    pub timeout: u64,
}

/// Xen's limit on `sched_poll.nr_ports`.
pub const SCHED_POLL_MAX_PORTS: usize = 128;

/// `struct multicall_entry` (`public/xen.h`): one sub-call of `multicall`; Xen writes
/// its return value into `result`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MulticallEntry {
    pub op: u64,
    pub result: u64,
    pub args: [u64; 6],
}

pub const SHUTDOWN_POWEROFF: u32 = 0;
pub const SHUTDOWN_REBOOT: u32 = 1;
pub const SHUTDOWN_SUSPEND: u32 = 2;
pub const SHUTDOWN_CRASH: u32 = 3;
pub const SHUTDOWN_WATCHDOG: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn sched_layouts() {
        assert_eq!(size_of::<SchedShutdown>(), 4);
        assert_eq!(size_of::<SchedPoll>(), 24);
        assert_eq!(offset_of!(SchedPoll, nr_ports), 8);
        assert_eq!(offset_of!(SchedPoll, timeout), 16);
        assert_eq!(size_of::<MulticallEntry>(), 64);
        assert_eq!(offset_of!(MulticallEntry, result), 8);
        assert_eq!(offset_of!(MulticallEntry, args), 16);
    }
}
