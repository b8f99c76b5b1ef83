// SPDX-License-Identifier: MIT OR Apache-2.0
//! The test hooks: `crashtest=`, `disktest=`, `faulttest=`, `registrytest=` and
//! `selftest` (README's test-hook table; `bootconfig::keys`). A hook named on the command
//! line runs instead of the service, reports and powers off. Only the image built with
//! the `test-hooks` feature has them (tier 2's, and the nested rig's self-test step);
//! the production image says that a named hook is not there, and serves.

use crate::devices::open::PciBus;
use bootconfig::{Cmdline, Config};

/// Runs the test hook the command line names, if any (it powers off); else gives the bus
/// back for the service.
#[cfg(feature = "test-hooks")]
pub fn run(cmdline: &Cmdline<'_>, config: &Config, under_xen: bool, bus: PciBus) -> PciBus {
    use crate::{backend, devices, power, selftest};
    use bootconfig::Key;

    if let Some(what) = cmdline.value(Key::Crashtest) {
        crash_test(what);
    }
    if let Some(kib) = cmdline.value(Key::FaulttestHeapLeftKib) {
        match kib.parse::<u64>() {
            Ok(kib) => {
                let taken = crate::mm::leave_for_disks(kib);
                log::warn!(
                    "faulttest: took {taken} KiB of heap for good: {} KiB left for disks and rings",
                    crate::mm::DISK_MEMORY.room() >> 10
                );
            }
            Err(_) => log::warn!("faulttest.heap-left-kib={kib}: not a number of KiB; ignored"),
        }
    }
    if cmdline.has(Key::UpgradetestFailSwitch) {
        backend::FAIL_SWITCH.store(true, core::sync::atomic::Ordering::Relaxed);
    }
    if let Some(upgrades) = cmdline.value(Key::Upgradetest) {
        crate::handoff::upgrade_test(
            upgrades,
            cmdline.has(Key::UpgradetestCorrupt),
            cmdline.has(Key::UpgradetestDevices),
            bus,
        );
    }
    if let Some(spec) = cmdline.value(Key::Disktest) {
        devices::disk_test(spec, cmdline, config.device_timeout_ns, bus);
    }
    if let Some(spec) = cmdline.value(Key::Faulttest) {
        devices::fault_test(spec, cmdline, config, bus);
    }
    if let Some(steps) = cmdline.value(Key::Registrytest) {
        backend::registry_test(steps, bus);
    }
    if cmdline.has(Key::Selftest) {
        let expected_cpus = cmdline
            .value(Key::SelftestExpectCpus)
            .and_then(|n| n.parse().ok());
        let (_, failed) = selftest::run(
            cmdline.has(Key::SelftestInjectFailure),
            expected_cpus,
            under_xen,
            cmdline.has(Key::SelftestAwaitDom0),
        );
        power::report_verdict(if failed == 0 {
            power::Verdict::Pass
        } else {
            power::Verdict::Fail
        });
        power::power_off();
    }
    bus
}

/// Says that each test hook the command line names is not in this image; gives the bus
/// back for the service.
#[cfg(not(feature = "test-hooks"))]
pub fn run(cmdline: &Cmdline<'_>, _config: &Config, _under_xen: bool, bus: PciBus) -> PciBus {
    use bootconfig::{Key, Role};

    for hook in Key::ALL
        .iter()
        .filter(|key| key.role() == Role::TestHook && cmdline.has(**key))
    {
        log::warn!(
            "test hook {} not in this image (built without the test-hooks feature); ignored",
            hook.name()
        );
    }
    bus
}

/// `crashtest=page-fault|panic|hang`: fail on purpose, so the runners can check that a
/// fault is reported and stops the kernel, and that a hang is cut off by the timeout.
#[cfg(feature = "test-hooks")]
fn crash_test(what: &str) {
    use log::{error, warn};

    warn!("crashtest={what}: failing on purpose");
    match what {
        "page-fault" => {
            // SAFETY: deliberately reads an address no page table maps; the page-fault
            // handler reports it and stops the kernel, so the read never returns.
            let value = unsafe { core::ptr::read_volatile(0x0000_7fff_0bad_0000 as *const u64) };
            error!("read of an unmapped address returned {value:#x}");
        }
        "panic" => panic!("crashtest panic"),
        "hang" => crate::arch::cpu::halt_forever(),
        other => warn!("crashtest={other} unknown (page-fault|panic|hang); ignored"),
    }
}
