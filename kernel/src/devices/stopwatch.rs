// SPDX-License-Identifier: MIT OR Apache-2.0
//! Where the time of opening a disk goes: the control path starts a stopwatch when a vbd
//! is attached, the code on the way marks the end of each phase (`lap`), and the attach
//! logs the summary: time per phase, and the configuration-space and device-register
//! accesses made meanwhile (each a VM exit; under Xen's HVM a round trip to the device
//! model in dom0, slow on a loaded or emulated host; registers are counted on
//! vCPU 0 only, where the control path runs). Control path only: nothing here is reached
//! from a poller, and `lap` without a running stopwatch does nothing.

use super::hal;
use alloc::vec::Vec;
use core::fmt;

struct Running {
    start_ns: u64,
    last_ns: u64,
    config: u64,
    registers: u64,
    /// Each phase's time, in the order first seen (a phase seen again adds to its time).
    phases: Vec<(&'static str, u64)>,
}

static RUNNING: spin::Mutex<Option<Running>> = spin::Mutex::new(None);

/// Starts the stopwatch (a running one starts over).
pub fn start() {
    let now = hal::now_ns();
    hal::count_registers(true);
    *RUNNING.lock() = Some(Running {
        start_ns: now,
        last_ns: now,
        config: hal::config_accesses(),
        registers: hal::register_accesses(),
        phases: Vec::new(),
    });
}

/// The time since the last lap (or the start) was spent in `phase`.
pub fn lap(phase: &'static str) {
    let mut running = RUNNING.lock();
    let Some(running) = running.as_mut() else {
        return;
    };
    let now = hal::now_ns();
    let spent = now.saturating_sub(running.last_ns);
    running.last_ns = now;
    match running.phases.iter_mut().find(|(name, _)| *name == phase) {
        Some((_, ns)) => *ns += spent,
        None => running.phases.push((phase, spent)),
    }
}

/// Stops the stopwatch; what it measured (None if it was not running).
pub fn finish() -> Option<Summary> {
    lap("other");
    let running = RUNNING.lock().take()?;
    hal::count_registers(false);
    Some(Summary {
        total_ns: running.last_ns.saturating_sub(running.start_ns),
        config: hal::config_accesses().wrapping_sub(running.config),
        registers: hal::register_accesses().wrapping_sub(running.registers),
        phases: running.phases,
    })
}

/// What one attach cost. Shown as `812.0 ms (scan 300.1, bring-up 200.0, ...); 146
/// config and 67 register accesses` (phases under 0.1 ms are left out).
pub struct Summary {
    pub total_ns: u64,
    pub config: u64,
    pub registers: u64,
    pub phases: Vec<(&'static str, u64)>,
}

fn ms(ns: u64) -> impl fmt::Display {
    struct Ms(u64);
    impl fmt::Display for Ms {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let tenths = self.0 / 100_000;
            write!(f, "{}.{}", tenths / 10, tenths % 10)
        }
    }
    Ms(ns)
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", ms(self.total_ns))?;
        let shown = self.phases.iter().filter(|(_, ns)| *ns >= 100_000);
        for (at, (name, ns)) in shown.enumerate() {
            write!(f, "{}{name} {}", if at == 0 { " (" } else { ", " }, ms(*ns))?;
        }
        if self.phases.iter().any(|(_, ns)| *ns >= 100_000) {
            f.write_str(")")?;
        }
        write!(
            f,
            "; {} config and {} register accesses",
            self.config, self.registers
        )
    }
}
