// SPDX-License-Identifier: MIT OR Apache-2.0
//! An NVMe driver for polled I/O.
//!
//! [`Controller`] resets and enables the controller, runs the admin queue (identify,
//! number of queues, I/O queue creation) and hands out [`IoQueue`]s: one submission/
//! completion queue pair each, meant to be owned by one CPU. An `IoQueue` implements
//! [`blkdev::BlockDevice`]: a request becomes one or more NVMe commands (PRP entries, one
//! per 4 KiB segment, PRP lists for longer transfers), completions are found by their
//! phase bit, never by interrupts.
//!
//! All device access goes through [`Hal`], so the host tests run the driver against an
//! in-process fake controller (`fake`).
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

use blkdev::DmaRegion;

mod command;
mod controller;
mod prp;
mod queue;

pub use command::{CommandStatus, Opcode};
pub use controller::{
    Controller, ControllerIdentity, Disable, InitConfig, Namespace, NamespaceIdentity, NvmeError,
    Version, MAX_IDENTIFIED_NAMESPACES, SHUTDOWN_MAX_MS, SHUTDOWN_MIN_MS,
};
pub use prp::{plan_commands, plan_sgl_commands, CommandPlan, PlanError, SGL_LIST_ENTRIES};
pub use queue::{IoQueue, QueueStats};

/// Bytes per memory page as the driver configures the controller (CC.MPS = 0).
pub const PAGE_SIZE: u64 = 4096;

/// What the driver needs from the kernel: DMA memory and time, and the controller's
/// registers.
///
/// # Safety
/// Beside the promises of [`blkdev::Dma`]:
/// - `read_register` and `write_register` access the 32-bit register at byte `offset`
///   of the controller's register window (BAR 0, as mapped) and nothing else: an
///   `offset` outside the window or unaligned touches no memory (an implementation
///   panics).
/// - `read_dma_u32` reads exactly the 4 bytes `region.span(offset, 4)` names (an
///   implementation panics when they leave the region or are unaligned), with one load
///   the compiler may neither merge nor hoist.
#[allow(
    unsafe_code,
    reason = "implementations promise to touch only the device"
)]
pub unsafe trait Hal: blkdev::Dma {
    /// Reads the 32-bit controller register at byte `offset` of BAR 0.
    fn read_register(&self, offset: usize) -> u32;
    fn write_register(&self, offset: usize, value: u32);
    /// One 32-bit load the compiler may not merge or hoist (the completion phase word).
    fn read_dma_u32(&self, region: DmaRegion, offset: u64) -> u32;
}

#[cfg(any(test, feature = "fake"))]
pub mod fake;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod tests;
