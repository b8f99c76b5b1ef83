// SPDX-License-Identifier: MIT OR Apache-2.0
//! CPUID, control registers and halting.

use core::arch::x86_64::{__cpuid_count, CpuidResult};
use machine::hypervisor::{self, Hypervisor};

pub fn cpuid(leaf: u32, subleaf: u32) -> CpuidResult {
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86_64 CPU and only reads identification registers.
    unsafe {
        __cpuid_count(leaf, subleaf)
    }
}

/// CPUID.1:ECX[31], set by hypervisors.
pub fn hypervisor_bit() -> bool {
    cpuid(1, 0).ecx & (1 << 31) != 0
}

pub fn detect_hypervisor() -> Hypervisor {
    hypervisor::detect(hypervisor_bit(), |leaf| {
        let r = cpuid(leaf, 0);
        (r.eax, r.ebx, r.ecx, r.edx)
    })
}

/// The 12-byte CPU vendor string ("GenuineIntel", "AuthenticAMD", ...).
pub fn vendor() -> [u8; 12] {
    let r = cpuid(0, 0);
    hypervisor::signature(r.ebx, r.edx, r.ecx)
}

/// The faulting address of the last page fault.
pub fn read_cr2() -> u64 {
    let value: u64;
    // SAFETY: reading CR2 has no side effects; we run at CPL 0.
    unsafe {
        core::arch::asm!("mov {}, cr2", out(reg) value, options(nomem, nostack, preserves_flags))
    };
    value
}

/// Stops this CPU for good: interrupts off, halt forever.
pub fn halt_forever() -> ! {
    x86_64::instructions::interrupts::disable();
    loop {
        x86_64::instructions::hlt();
    }
}
