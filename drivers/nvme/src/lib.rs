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
//! in-process controller model.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

mod command;
mod controller;
mod prp;
mod queue;

pub use command::{CommandStatus, Opcode};
pub use controller::{Controller, ControllerIdentity, InitConfig, Namespace, NvmeError, Version};
pub use prp::{plan_commands, CommandPlan, PlanError};
pub use queue::{IoQueue, QueueStats};

/// Bytes per memory page as the driver configures the controller (CC.MPS = 0).
pub const PAGE_SIZE: u64 = 4096;

/// What the driver needs from the platform.
///
/// DMA memory is named by physical (bus) address; `allocate_dma` is for set-up only.
pub trait Hal: Clone {
    /// Reads the 32-bit controller register at byte `offset` of BAR 0.
    fn read_register(&self, offset: usize) -> u32;
    fn write_register(&self, offset: usize, value: u32);
    /// `pages` zeroed, physically contiguous, page-aligned pages; their bus address.
    fn allocate_dma(&self, pages: usize) -> Option<u64>;
    /// Copies DMA memory at `address` into `out`.
    fn read_dma(&self, address: u64, out: &mut [u8]);
    /// Copies `data` into DMA memory at `address`.
    fn write_dma(&self, address: u64, data: &[u8]);
    /// One 32-bit load the compiler may not merge or hoist (the completion phase word).
    fn read_dma_u32(&self, address: u64) -> u32;
    /// Waits at least `micros` microseconds.
    fn delay_us(&self, micros: u64);
}

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
