// SPDX-License-Identifier: MIT OR Apache-2.0
//! Real disks: finding them on PCI, bringing up their drivers, and (in the test image)
//! the disk and fault tests that tier 2 runs against QEMU's NVMe and virtio-blk devices.

mod bounce;
#[cfg(feature = "test-hooks")]
mod disktest;
mod dma_pages;
mod error;
#[cfg(feature = "test-hooks")]
mod faulttest;
mod hal;
mod nvme;
pub mod open;
pub mod region;
pub mod remote_memory;
pub mod shutdown;
pub mod stopwatch;
mod virtio;

#[cfg(feature = "test-hooks")]
pub use disktest::disk_test;
pub use error::OpenError;
#[cfg(feature = "test-hooks")]
pub use faulttest::fault_test;

use core::sync::atomic::AtomicBool;

/// Raised by a device queue that asks for its device's recovery (an abort, a reset):
/// the control path is to run `open::Devices::recover` soon. Every device recovering
/// is made with it; pollers look at it once a loop, and wake vCPU 0 for it.
pub static RECOVERY_WANTED: AtomicBool = AtomicBool::new(false);

/// Logs what a device's recovery step did; the time it wants its next step, if any.
fn log_recovery(device: pci::PciAddress, step: cmdslots::RecoveryStep) -> Option<u64> {
    use cmdslots::RecoveryStep;
    match step {
        RecoveryStep::Idle => None,
        RecoveryStep::At(at) => Some(at),
        RecoveryStep::Reset => {
            log::warn!("pci {device}: the device was reset and serves again");
            None
        }
        RecoveryStep::GaveUp { dma_stopped } => {
            log::error!(
                "pci {device}: the device is given up{}; its disks fail every request",
                if dma_stopped {
                    ""
                } else {
                    " (bus mastering could not be turned off)"
                }
            );
            None
        }
    }
}

/// How the devices opened recover (`device.max-resets=`), with `RECOVERY_WANTED` to
/// wake the control path.
pub fn recovery(max_resets: u32) -> cmdslots::RecoveryConfig {
    cmdslots::RecoveryConfig {
        max_resets,
        wake: Some(&RECOVERY_WANTED),
    }
}
