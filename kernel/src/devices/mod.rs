//! Real disks: finding them on PCI, bringing up their drivers, and the disk test that
//! tier 2 runs against QEMU's NVMe and virtio-blk devices.

mod bounce;
mod disktest;
mod dma_pages;
mod error;
mod faulttest;
mod hal;
mod nvme;
pub mod open;
pub mod region;
pub mod stopwatch;
mod virtio;

pub use disktest::disk_test;
pub use error::OpenError;
pub use faulttest::fault_test;

use core::sync::atomic::{AtomicU64, Ordering};

/// How long a device command may go without completion before its device is failed and
/// stopped (ns; 0: forever): `device.timeout-ms=`, set at boot.
static DEVICE_TIMEOUT_NS: AtomicU64 = AtomicU64::new(blkback::engine::DEFAULT_DEVICE_TIMEOUT_NS);

pub fn set_device_timeout_ns(ns: u64) {
    DEVICE_TIMEOUT_NS.store(ns, Ordering::Relaxed);
}

pub fn device_timeout_ns() -> u64 {
    DEVICE_TIMEOUT_NS.load(Ordering::Relaxed)
}
