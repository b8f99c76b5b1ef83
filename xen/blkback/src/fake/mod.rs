// SPDX-License-Identifier: MIT OR Apache-2.0
//! Host stand-ins for Xen, shared between threads: guest pages, the grant table, event
//! channels, the frontend's side of the ring, and devices that hold or reorder
//! completions. The fake frontend writes the same pages the backend reads.

pub mod memory;
pub mod plain;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use memory::{FrontRing, GrantTable, GuestMemory, RingView, XenGrants};
pub use plain::{PlainGrants, PlainRing};
pub use xen::xenbus::fake::MemStore;

use crate::engine::EventChannel;

/// A null device of 2^30 sectors (512 GiB), 512-byte blocks, writable, with a cache to
/// flush and no discard, taking `queue_depth` requests: the engine benchmark's device
/// and the queue tests'.
pub fn null_disk(queue_depth: usize) -> blkdev::NullDisk {
    let geometry = blkdev::Geometry {
        sectors: 1 << 30,
        logical_block_size: 512,
        physical_block_size: 4096,
        read_only: false,
        flush: true,
        discard: None,
    };
    blkdev::NullDisk::new(geometry, queue_depth)
}

/// Counts notifications; the other side reads the count.
#[derive(Clone, Debug, Default)]
pub struct CountingEvents(pub Arc<AtomicU64>);

impl CountingEvents {
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

impl EventChannel for CountingEvents {
    fn notify(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// A small deterministic generator (xorshift64*), so failures reproduce from a seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..bound` (bound > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

use blkdev::{BlockDevice, BufferAccess, Completion, IoRequest, SubmitError};
use std::sync::atomic::AtomicBool;

/// Wraps a device and hands its completions back late and out of order: each poll
/// releases every held completion with probability `release_percent`, none while
/// `hold` is set.
#[derive(Debug)]
pub struct ShufflingDevice<D> {
    inner: D,
    held: Vec<Completion>,
    rng: Rng,
    release_percent: u64,
    pub hold: Arc<AtomicBool>,
}

impl<D: BlockDevice> ShufflingDevice<D> {
    pub fn new(inner: D, seed: u64, release_percent: u64) -> Self {
        Self {
            inner,
            held: Vec::new(),
            rng: Rng::new(seed),
            release_percent,
            hold: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }
}

impl<D: BlockDevice> BlockDevice for ShufflingDevice<D> {
    blkdev::forward_to!(inner: geometry, queue_depth, submit);

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let held = &mut self.held;
        self.inner.poll_completions(&mut |c| held.push(c));
        if self.hold.load(Ordering::Acquire) {
            return 0;
        }
        let mut released = 0;
        let mut i = 0;
        while i < self.held.len() {
            if self.rng.chance(self.release_percent) {
                let pick = i + self.rng.below((self.held.len() - i) as u64) as usize;
                sink(self.held.swap_remove(pick));
                released += 1;
            } else {
                i += 1;
            }
        }
        released
    }
}

/// Wraps a device and hands each completion back `latency` (plus up to `jitter`) after
/// its submission, on a clock the test advances; none while `stall` is set.
#[derive(Debug)]
pub struct DelayDevice<D> {
    inner: D,
    clock: Arc<AtomicU64>,
    latency: u64,
    jitter: u64,
    rng: Rng,
    due: std::collections::HashMap<u32, u64>,
    done: Vec<Completion>,
    pub stall: Arc<AtomicBool>,
}

impl<D: BlockDevice> DelayDevice<D> {
    pub fn new(inner: D, clock: Arc<AtomicU64>, latency: u64, jitter: u64) -> Self {
        Self {
            inner,
            clock,
            latency,
            jitter,
            rng: Rng::new(latency ^ jitter),
            due: Default::default(),
            done: Vec::new(),
            stall: Arc::default(),
        }
    }
}

impl<D: BlockDevice> BlockDevice for DelayDevice<D> {
    blkdev::forward_to!(inner: geometry, queue_depth);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        self.inner.submit(request, buffers)?;
        let jitter = match self.jitter {
            0 => 0,
            bound => self.rng.below(bound),
        };
        let due = self.clock.load(Ordering::Acquire) + self.latency + jitter;
        self.due.insert(request.tag, due);
        Ok(())
    }
    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let done = &mut self.done;
        self.inner.poll_completions(&mut |c| done.push(c));
        if self.stall.load(Ordering::Acquire) {
            return 0;
        }
        let now = self.clock.load(Ordering::Acquire);
        let due = &mut self.due;
        let before = self.done.len();
        self.done.retain(|c| {
            if due[&c.tag] > now {
                return true;
            }
            due.remove(&c.tag);
            sink(*c);
            false
        });
        before - self.done.len()
    }
}
