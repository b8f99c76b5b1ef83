//! Real disks: finding them on PCI, bringing up their drivers, and the disk test that
//! tier 2 runs against QEMU's NVMe and virtio-blk devices.

mod bounce;
mod disktest;
pub mod open;
mod platform;
mod virtio;

pub use disktest::disk_test;
