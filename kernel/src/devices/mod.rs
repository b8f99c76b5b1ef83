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
pub mod shutdown;
pub mod stopwatch;
mod virtio;

#[cfg(feature = "test-hooks")]
pub use disktest::disk_test;
pub use error::OpenError;
#[cfg(feature = "test-hooks")]
pub use faulttest::fault_test;
