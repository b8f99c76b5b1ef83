//! The one Xen service the kernel needs before the platform layer exists: telling Xen
//! we stopped (`SCHEDOP_shutdown`), so `xl list` shows the right reason.
//! Hypercalls go through `vmcall` (Intel) or `vmmcall` (AMD), chosen once from CPUID.

use blkdom_support::hypervisor::Hypervisor;
use core::sync::atomic::{AtomicU8, Ordering};

const HYPERVISOR_SCHED_OP: u64 = 29;
const SCHEDOP_SHUTDOWN: u64 = 2;

#[derive(Clone, Copy, Debug)]
#[repr(u32)]
pub enum ShutdownReason {
    Poweroff = 0,
    Crash = 3,
}

/// 0: not under Xen, 1: vmcall, 2: vmmcall.
static HYPERCALL_KIND: AtomicU8 = AtomicU8::new(0);

pub fn init(hypervisor: &Hypervisor) {
    if !hypervisor.is_xen() {
        return;
    }
    let vendor = crate::arch::cpu::vendor();
    let amd_like = &vendor == b"AuthenticAMD" || &vendor == b"HygonGenuine";
    HYPERCALL_KIND.store(if amd_like { 2 } else { 1 }, Ordering::Relaxed);
}

fn hypercall2(op: u64, a1: u64, a2: u64) -> i64 {
    let result: i64;
    match HYPERCALL_KIND.load(Ordering::Relaxed) {
        // SAFETY: a Xen hypercall with its number in RAX and arguments in RDI, RSI;
        // Xen clobbers only the argument registers it documents and RAX.
        1 => unsafe {
            core::arch::asm!("vmcall", inlateout("rax") op as i64 => result,
                inlateout("rdi") a1 => _, inlateout("rsi") a2 => _, options(nostack))
        },
        // SAFETY: as above, for AMD's instruction.
        2 => unsafe {
            core::arch::asm!("vmmcall", inlateout("rax") op as i64 => result,
                inlateout("rdi") a1 => _, inlateout("rsi") a2 => _, options(nostack))
        },
        _ => return -38, // -ENOSYS: not running under Xen
    }
    result
}

/// Asks Xen to shut the domain down; returns only if Xen refuses (or we are not on Xen).
pub fn shutdown(reason: ShutdownReason) {
    let reason_word: u32 = reason as u32;
    let rc = hypercall2(
        HYPERVISOR_SCHED_OP,
        SCHEDOP_SHUTDOWN,
        &raw const reason_word as u64,
    );
    log::error!("SCHEDOP_shutdown({reason:?}) returned {rc}");
}
