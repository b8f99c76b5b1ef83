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
