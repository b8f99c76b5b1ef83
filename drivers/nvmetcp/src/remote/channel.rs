// SPDX-License-Identifier: MIT OR Apache-2.0
//! One disk queue's way to the network: the ring's poller (any vCPU) puts requests in
//! slots and their indices on a submission ring; the network's owner (vCPU 0) takes
//! them, moves their data, and puts the indices back on a completion ring. Both rings
//! are single-producer single-consumer over atomics, every slot and segment is made at
//! creation: no lock, no allocation per request.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use blkdev::{
    BlockDevice, BufferAccess, Completion, DeviceFault, FaultKind, Geometry, IoOp, IoRequest,
    IoStatus, SubmitError,
};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Requests one channel holds at once (a ring of blkfront's default depth fits twice).
pub const SLOTS: usize = 64;
/// Segments of one request at most (blkdom's `feature-max-indirect-segments`).
pub const MAX_SEGMENTS: usize = 512;
/// Bits of a packed segment that hold its length (at most a page: 4096).
const LEN_BITS: u32 = 13;

/// What a slot asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write { preflush: bool },
    Flush,
    Discard,
}

impl Op {
    fn code(self) -> u32 {
        match self {
            Op::Read => 0,
            Op::Write { preflush: false } => 1,
            Op::Write { preflush: true } => 2,
            Op::Flush => 3,
            Op::Discard => 4,
        }
    }

    fn from_code(code: u32) -> Option<Op> {
        Some(match code {
            0 => Op::Read,
            1 => Op::Write { preflush: false },
            2 => Op::Write { preflush: true },
            3 => Op::Flush,
            4 => Op::Discard,
            _ => return None,
        })
    }
}

/// A request as the network side reads it from its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRequest {
    pub op: Op,
    pub sector: u64,
    /// Data bytes (reads, writes) or sectors (discard).
    pub amount: u64,
    pub segments: usize,
}

struct Slot {
    op: AtomicU32,
    sector: AtomicU64,
    amount: AtomicU64,
    segments: AtomicU32,
}

/// A fixed ring of slot indices, one producer and one consumer.
struct Spsc {
    entries: Box<[AtomicU32]>,
    /// Written by the producer only.
    tail: AtomicU32,
    /// Written by the consumer only.
    head: AtomicU32,
}

impl Spsc {
    fn new() -> Spsc {
        Spsc {
            entries: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            tail: AtomicU32::new(0),
            head: AtomicU32::new(0),
        }
    }

    /// Never full: at most `SLOTS` slot indices exist.
    fn push(&self, value: u32) {
        let tail = self.tail.load(Ordering::Relaxed);
        self.entries[tail as usize % SLOTS].store(value, Ordering::Relaxed);
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
    }

    fn pop(&self) -> Option<u32> {
        let head = self.head.load(Ordering::Relaxed);
        if head == self.tail.load(Ordering::Acquire) {
            return None;
        }
        let value = self.entries[head as usize % SLOTS].load(Ordering::Relaxed);
        self.head.store(head.wrapping_add(1), Ordering::Release);
        Some(value)
    }

    fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire) == self.tail.load(Ordering::Acquire)
    }

    fn len(&self) -> usize {
        let head = self.head.load(Ordering::Acquire);
        self.tail.load(Ordering::Acquire).wrapping_sub(head) as usize
    }
}

/// What both sides of one channel share.
pub struct Shared {
    slots: Box<[Slot]>,
    /// `MAX_SEGMENTS` per slot: address << LEN_BITS | length.
    segments: Box<[AtomicU64]>,
    submitted: Spsc,
    completed: Spsc,
    /// The disk was given up (the target stayed away): ms it waited.
    gave_up: AtomicBool,
    waited_ms: AtomicU64,
    /// Which vCPU submitted last, for the network side to wake (kept by the kernel).
    pub producer_cpu: AtomicU32,
    /// The disk's size in sectors: the namespace as served, which grows when the
    /// target's does (`Remote::serve_grown`).
    sectors: AtomicU64,
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            slots: (0..SLOTS)
                .map(|_| Slot {
                    op: AtomicU32::new(0),
                    sector: AtomicU64::new(0),
                    amount: AtomicU64::new(0),
                    segments: AtomicU32::new(0),
                })
                .collect(),
            segments: (0..SLOTS * MAX_SEGMENTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            submitted: Spsc::new(),
            completed: Spsc::new(),
            gave_up: AtomicBool::new(false),
            waited_ms: AtomicU64::new(0),
            producer_cpu: AtomicU32::new(0),
            sectors: AtomicU64::new(0),
        })
    }

    pub(crate) fn set_sectors(&self, sectors: u64) {
        self.sectors.store(sectors, Ordering::Release);
    }

    /// The next submitted slot, for the network side.
    pub(crate) fn take(&self) -> Option<(u16, SlotRequest)> {
        let index = self.submitted.pop()? as usize;
        let slot = self.slots.get(index)?;
        let op = Op::from_code(slot.op.load(Ordering::Relaxed))?;
        let request = SlotRequest {
            op,
            sector: slot.sector.load(Ordering::Relaxed),
            amount: slot.amount.load(Ordering::Relaxed),
            segments: (slot.segments.load(Ordering::Relaxed) as usize).min(MAX_SEGMENTS),
        };
        Some((index as u16, request))
    }

    /// Submissions are waiting.
    pub fn has_submissions(&self) -> bool {
        !self.submitted.is_empty()
    }

    /// Requests submitted and not yet taken by the network side.
    pub fn submissions(&self) -> usize {
        self.submitted.len()
    }

    /// Completions wait for the queue.
    pub fn has_completions(&self) -> bool {
        !self.completed.is_empty()
    }

    /// Segment `n` of `slot`: where it is and how long.
    pub(crate) fn segment(&self, slot: u16, n: usize) -> (u64, u32) {
        let packed = self.segments[usize::from(slot) * MAX_SEGMENTS + n].load(Ordering::Relaxed);
        (packed >> LEN_BITS, (packed & ((1 << LEN_BITS) - 1)) as u32)
    }

    /// The network side is done with `slot`.
    pub(crate) fn complete(&self, slot: u16, ok: bool) {
        self.completed
            .push(u32::from(slot) | if ok { 0 } else { 1 << 16 });
    }

    pub(crate) fn give_up(&self, waited_ms: u64) {
        self.waited_ms.store(waited_ms, Ordering::Relaxed);
        self.gave_up.store(true, Ordering::Release);
    }

    /// The remote is trying again: its queues take requests again.
    pub(crate) fn revive(&self) {
        self.gave_up.store(false, Ordering::Release);
    }

    pub fn gave_up(&self) -> bool {
        self.gave_up.load(Ordering::Acquire)
    }
}

/// One queue of a remote namespace, as the engine drives it: the producer's end of a
/// channel. Buffers are named by their CPU address (`BufferAccess::cpu_address`, valid
/// until the request completes): the network side copies straight between TCP and the
/// guest's granted pages.
pub struct DiskQueue {
    shared: Arc<Shared>,
    geometry: Geometry,
    free: Vec<u16>,
    tags: [u32; SLOTS],
}

impl DiskQueue {
    pub(crate) fn new(shared: Arc<Shared>, geometry: Geometry) -> DiskQueue {
        shared.set_sectors(geometry.sectors);
        DiskQueue {
            shared,
            geometry,
            free: (0..SLOTS as u16).rev().collect(),
            tags: [0; SLOTS],
        }
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Requests this queue holds (submitted, not yet reported).
    pub fn in_flight(&self) -> usize {
        SLOTS - self.free.len()
    }
}

impl BlockDevice for DiskQueue {
    fn geometry(&self) -> Geometry {
        Geometry {
            sectors: self.shared.sectors.load(Ordering::Acquire),
            ..self.geometry
        }
    }

    fn queue_depth(&self) -> usize {
        SLOTS
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        let bytes: u64 = request.segments.iter().map(|s| u64::from(s.len)).sum();
        let (op, amount) = match request.op {
            IoOp::Read => (Op::Read, bytes),
            IoOp::Write => (
                Op::Write {
                    preflush: request.preflush,
                },
                bytes,
            ),
            IoOp::Flush => (Op::Flush, 0),
            IoOp::Discard { .. } => (Op::Discard, request.nr_sectors),
        };
        let sectors = match op {
            Op::Discard => amount,
            _ => bytes / blkdev::SECTOR_SIZE,
        };
        let data = matches!(op, Op::Read | Op::Write { .. });
        if !request.fits(sectors, self.shared.sectors.load(Ordering::Acquire))
            || request.segments.len() > MAX_SEGMENTS
            || (data && (request.segments.is_empty() || !bytes.is_multiple_of(blkdev::SECTOR_SIZE)))
        {
            return Err(SubmitError::Invalid);
        }
        let Some(&slot) = self.free.last() else {
            return Err(SubmitError::QueueFull);
        };
        let base = usize::from(slot) * MAX_SEGMENTS;
        for (n, segment) in request.segments.iter().enumerate() {
            let len = segment.len as usize;
            let address = buffers.cpu_address(segment.buffer, segment.offset as usize, len);
            let fits = |a: &u64| len > 0 && len <= 4096 && *a >> (64 - LEN_BITS) == 0;
            let Some(address) = address.filter(fits) else {
                return Err(SubmitError::Invalid);
            };
            self.shared.segments[base + n]
                .store(address << LEN_BITS | len as u64, Ordering::Relaxed);
        }
        self.free.pop();
        let s = &self.shared.slots[usize::from(slot)];
        s.op.store(op.code(), Ordering::Relaxed);
        s.sector.store(request.sector, Ordering::Relaxed);
        s.amount.store(amount, Ordering::Relaxed);
        s.segments
            .store(request.segments.len() as u32, Ordering::Relaxed);
        self.tags[usize::from(slot)] = request.tag;
        self.shared.submitted.push(u32::from(slot));
        Ok(())
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let mut n = 0;
        while let Some(entry) = self.shared.completed.pop() {
            let slot = (entry & 0xffff) as u16;
            let Some(&tag) = self.tags.get(usize::from(slot)) else {
                continue;
            };
            self.free.push(slot);
            let status = if entry >> 16 == 0 {
                IoStatus::Ok
            } else {
                IoStatus::Error
            };
            sink(Completion { tag, status });
            n += 1;
        }
        n
    }

    fn fault(&self) -> Option<DeviceFault> {
        self.shared.gave_up().then(|| DeviceFault {
            kind: FaultKind::TargetGone {
                waited_ms: self.shared.waited_ms.load(Ordering::Relaxed),
            },
            // No device DMAs: the network side copies, and copies nothing for a request
            // once it completed it.
            dma_stopped: true,
        })
    }
}
