// SPDX-License-Identifier: MIT OR Apache-2.0
//! A virtio-blk driver for polled I/O over the virtio 1.x ("modern") PCI transport.
//!
//! [`VirtioBlk`] resets the device, negotiates features and sets up one split
//! virtqueue per [`BlkQueue`]; with `VIRTIO_BLK_F_MQ` there are as many as the device
//! offers, so each CPU can own one. With indirect descriptors every request part uses
//! exactly one ring descriptor pointing at its own table (header, one descriptor per
//! segment, status), so a queue of N descriptors holds N parts whatever their segment
//! counts; without them each part owns a fixed run of at most 18 ring descriptors.
//! Requests with more segments than a part takes are split into parts; a write with
//! pre-flush waits for its flush. Completions are polled from the used ring; interrupts
//! stay off.
//!
//! Device access goes through [`Hal`], so the host tests run against a fake device (`fake`).
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

use blkdev::DmaRegion;

mod blk;
mod transport;
mod virtqueue;

pub use blk::{BlkConfig, BlkQueue, VirtioBlk, VirtioError, RESET_TIMEOUT_MS};
pub use transport::PciRegions;

/// What the driver needs from the kernel: DMA memory and time, and MMIO at the
/// mapped capability windows ([`PciRegions`]).
///
/// # Safety
/// Beside the promises of [`blkdev::Dma`]:
/// - the register accessors (`read8` .. `write32`) access the register of their width
///   at `address` when it lies, naturally aligned, inside one of the device's mapped
///   capability windows, and nothing else: any other address touches no memory (an
///   implementation panics).
/// - `read_dma_u16` reads exactly the 2 bytes `region.span(offset, 2)` names (an
///   implementation panics when they leave the region or are unaligned), with one load
///   the compiler may neither merge nor hoist.
#[allow(
    unsafe_code,
    reason = "implementations promise to touch only the device"
)]
pub unsafe trait Hal: blkdev::Dma {
    fn read8(&self, address: u64) -> u8;
    fn read16(&self, address: u64) -> u16;
    fn read32(&self, address: u64) -> u32;
    fn write8(&self, address: u64, value: u8);
    fn write16(&self, address: u64, value: u16);
    fn write32(&self, address: u64, value: u32);
    /// One 16-bit load the compiler may not merge or hoist (the used index).
    fn read_dma_u16(&self, region: DmaRegion, offset: u64) -> u16;
}

/// Feature bits the driver understands.
pub mod feature {
    pub const BLK_SIZE_MAX: u64 = 1 << 1;
    pub const BLK_SEG_MAX: u64 = 1 << 2;
    pub const BLK_RO: u64 = 1 << 5;
    pub const BLK_BLK_SIZE: u64 = 1 << 6;
    pub const BLK_FLUSH: u64 = 1 << 9;
    pub const BLK_TOPOLOGY: u64 = 1 << 10;
    pub const BLK_MQ: u64 = 1 << 12;
    pub const BLK_DISCARD: u64 = 1 << 13;
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    pub const VERSION_1: u64 = 1 << 32;
    /// The device reaches memory through an IOMMU (a disk passed through to a domain):
    /// the addresses the driver hands it are bus addresses, which is what `Dma` gives.
    /// Such a device may refuse to run without it.
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
}

#[cfg(any(test, feature = "fake"))]
pub mod fake;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod tests;
