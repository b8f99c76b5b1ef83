// SPDX-License-Identifier: MIT OR Apache-2.0
//! Ways to stop: orderly power-off, crash, and the test verdict for QEMU's
//! `isa-debug-exit` device.

use core::sync::atomic::{AtomicBool, Ordering};
use machine::acpi::{self, PowerControl};
use x86_64::instructions::port::Port;

/// `isa-debug-exit` at iobase 0xf4: QEMU exits with status (value << 1) | 1.
const DEBUG_EXIT_PORT: u16 = 0xf4;

/// Values written to `isa-debug-exit`: QEMU exits with 33, 35 and 37.
#[derive(Clone, Copy, Debug)]
#[repr(u32)]
pub enum Verdict {
    #[cfg(feature = "test-hooks")]
    Pass = 0x10,
    #[cfg(feature = "test-hooks")]
    Fail = 0x11,
    Crash = 0x12,
}

static POWER: spin::Once<Option<PowerControl>> = spin::Once::new();
static UNDER_XEN: AtomicBool = AtomicBool::new(false);

/// Finds the ACPI power-off register in the FADT.
pub fn init(firmware: &crate::firmware::Firmware) -> Result<PowerControl, acpi::AcpiError> {
    let found = firmware
        .table(b"FACP")
        .and_then(|fadt| acpi::parse_fadt(&crate::firmware::IdentityMemory, fadt));
    POWER.call_once(|| found.ok());
    found
}

/// Records whether we run under Xen (set before anything can crash).
pub fn set_under_xen(under_xen: bool) {
    UNDER_XEN.store(under_xen, Ordering::Relaxed);
}

/// Tells QEMU's `isa-debug-exit` the verdict (a no-op where the device is absent).
pub fn report_verdict(verdict: Verdict) {
    // SAFETY: writing the debug-exit port has no effect on memory; without the
    // device the write is discarded.
    unsafe { Port::<u32>::new(DEBUG_EXIT_PORT).write(verdict as u32) };
}

/// Orderly power-off: the log is flushed first.
pub fn power_off() -> ! {
    log::info!("powering off");
    log::logger().flush();
    if UNDER_XEN.load(Ordering::Relaxed) {
        // Xen's PVH/HVM ACPI is hardware-reduced (no PM1 ports): the way out is
        // SCHEDOP_shutdown, which `xen_domain` provides.
        crate::xen_domain::shutdown(xen::domain::ShutdownReason::Poweroff);
    }
    if let Some(Some(power)) = POWER.get() {
        let value = acpi::s5_control_value(0);
        for port in [power.pm1a_control_port, power.pm1b_control_port] {
            if port != 0 {
                // SAFETY: the FADT names this port as PM1x_CNT; writing SLP_TYP|SLP_EN
                // asks the platform to power off.
                unsafe { Port::<u16>::new(port).write(value) };
            }
        }
    }
    log::error!("power-off did not take effect; halting");
    crate::arch::cpu::halt_forever()
}

/// Stops after a fatal error, telling whoever watches why.
pub fn crash(why: &str) -> ! {
    log::error!("blkdom stopped: {why}");
    log::logger().flush();
    if UNDER_XEN.load(Ordering::Relaxed) {
        crate::xen_domain::shutdown(xen::domain::ShutdownReason::Crash);
    } else {
        // Under plain QEMU the test runners watch for this exit status.
        report_verdict(Verdict::Crash);
    }
    crate::arch::cpu::halt_forever()
}
