// SPDX-License-Identifier: MIT OR Apache-2.0
//! Interrupt-flag control for the idle protocol (`crate::evtchn::idle_wait`).

use crate::evtchn::CpuIdle;

/// The executing CPU, at CPL 0.
#[derive(Clone, Copy, Debug)]
pub struct NativeCpu {
    _private: (),
}

impl NativeCpu {
    /// # Safety
    /// Must only be used at CPL 0 by a kernel whose IDT handles every interrupt that may
    /// arrive once interrupts are enabled.
    pub unsafe fn new() -> Self {
        Self { _private: () }
    }
}

#[cfg(target_arch = "x86_64")]
impl CpuIdle for NativeCpu {
    fn disable_interrupts(&self) {
        // SAFETY: CPL 0 (constructor contract); `cli` only changes RFLAGS.IF. No
        // `nomem`: it orders memory accesses like a compiler barrier.
        unsafe { core::arch::asm!("cli", options(nostack)) }
    }

    fn enable_interrupts(&self) {
        // SAFETY: CPL 0 and an IDT ready for any interrupt (constructor contract).
        unsafe { core::arch::asm!("sti", options(nostack)) }
    }

    fn enable_interrupts_and_halt(&self) {
        // SAFETY: as above; `sti` makes the following `hlt` run before any interrupt is
        // taken (interrupt shadow), which is what makes the wait race-free.
        unsafe { core::arch::asm!("sti", "hlt", options(nostack)) }
    }
}

/// The time-stamp counter, for converting to Xen system time with `vcpu_time_info`.
#[cfg(target_arch = "x86_64")]
pub fn read_tsc() -> u64 {
    // SAFETY: RDTSC has no memory effects; it faults only if CR4.TSD is set and we are
    // not at CPL 0, which blkdom never configures.
    unsafe { core::arch::x86_64::_rdtsc() }
}
