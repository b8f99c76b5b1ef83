// SPDX-License-Identifier: MIT OR Apache-2.0
//! Submission: a checked request's grants go into the round's map batch, the batch is
//! mapped with one call, and the requests go to the device in order (deferred while the
//! device is full or a barrier waits for what came before it).

use alloc::collections::TryReserveError;
use alloc::vec::Vec;
use blkdev::{BlockDevice, DmaSegment, IoOp, IoRequest, SubmitError};

use super::slots::Work;
use super::{Engine, EventChannel};
use crate::fallible;
use crate::grant::GrantOps;
use crate::parse::{DataOp, RequestError};
use crate::ring::RingMemory;

/// A FIFO of slot numbers with fixed capacity.
#[derive(Debug)]
pub(super) struct SlotFifo {
    items: Vec<u16>,
    head: usize,
    len: usize,
}

impl SlotFifo {
    fn new(capacity: usize) -> Result<Self, TryReserveError> {
        Ok(Self {
            items: fallible::vec(0, capacity)?,
            head: 0,
            len: 0,
        })
    }
    fn push(&mut self, slot: u16) {
        debug_assert!(self.len < self.items.len());
        let mut tail = self.head + self.len;
        if tail >= self.items.len() {
            tail -= self.items.len();
        }
        self.items[tail] = slot;
        self.len += 1;
    }
    fn front(&self) -> Option<u16> {
        (self.len > 0).then(|| self.items[self.head])
    }
    pub fn pop(&mut self) -> Option<u16> {
        let front = self.front()?;
        self.head += 1;
        if self.head == self.items.len() {
            self.head = 0;
        }
        self.len -= 1;
        Some(front)
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Requests on their way to the device, and those it owns.
#[derive(Debug)]
pub(super) struct Submission {
    /// Slots whose grants are in the round's map batch.
    staged: Vec<u16>,
    /// Slots the device could not take yet, in ring order.
    pub deferred: SlotFifo,
    /// The DMA list of the request being submitted (its first `nr_segments` entries).
    dma: Vec<DmaSegment>,
    /// Requests handed to the device and not finished.
    pub in_flight: usize,
}

impl Submission {
    pub fn new(slots: usize, max_segments: usize) -> Result<Self, TryReserveError> {
        Ok(Self {
            staged: fallible::with_capacity(slots)?,
            deferred: SlotFifo::new(slots)?,
            dma: fallible::vec(DmaSegment::default(), max_segments)?,
            in_flight: 0,
        })
    }

    /// Bytes `new` allocates.
    pub fn memory_needed(slots: usize, max_segments: usize) -> usize {
        2 * slots * core::mem::size_of::<u16>() + max_segments * core::mem::size_of::<DmaSegment>()
    }
}

impl<M: RingMemory, G: GrantOps, D: BlockDevice, E: EventChannel> Engine<M, G, D, E> {
    /// Look up or queue the map of every segment's grant. Persistent grants are mapped
    /// read-write (they are reused for both directions), transient ones read-only when
    /// the device only reads them. A request whose grants are all mapped already (cache
    /// hits) goes to the device at once unless requests staged before it wait for the
    /// map batch (the device gets requests in ring order); the others wait for the
    /// round's batch (`flush_staged`).
    #[cfg_attr(feature = "profile-passes", inline(never))]
    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    pub(super) fn stage(&mut self, slot: u16) {
        let count = usize::from(self.slots[slot].nr_segments);
        if self.mapper.batch_full(count) {
            self.flush_staged();
        }
        self.mapper
            .reserve_unmaps(count, &mut self.grants, &mut self.stats);
        let writable =
            self.mapper.persistent() || self.slots[slot].work == Work::Data(DataOp::Read);
        let mut mapped = true;
        for i in self.slots.segments(slot) {
            let gref = self.slots.desc(i).gref;
            mapped &= self.mapper.acquire(i, gref, writable);
        }
        // Its indirect pages count too (they were acquired just before).
        if self.mapper.take_capped() {
            self.stats.capped_requests += 1;
        }
        if mapped && self.submission.staged.is_empty() {
            self.submit_or_defer(slot);
        } else {
            self.submission.staged.push(slot);
        }
    }

    /// Issue the round's map batch (after the round's unmaps, so the number of mapped
    /// grants never exceeds the bound), then submit or fail every staged request.
    #[cfg_attr(feature = "profile-passes", inline(never))]
    pub(super) fn flush_staged(&mut self) {
        if self.submission.staged.is_empty() {
            return;
        }
        // Transient maps that all succeeded are filled in by the batch itself: no second
        // pass over the staged requests' segments (`map_batch`).
        let known = self.mapper.map_batch(&mut self.grants, &mut self.stats);
        for n in 0..self.submission.staged.len() {
            let slot = self.submission.staged[n];
            let mapped = if known {
                Ok(())
            } else {
                self.mapper.resolve(self.slots.segments(slot))
            };
            match mapped {
                Ok(()) => self.submit_or_defer(slot),
                Err(status) => self.fail(slot, RequestError::GrantFailed(status)),
            }
        }
        self.submission.staged.clear();
    }

    /// A barrier is started only once everything before it has finished (as Linux
    /// drains its ring); requests behind a deferred one wait in order.
    fn must_wait(&self, slot: u16) -> bool {
        self.slots[slot].work == Work::Data(DataOp::Barrier) && self.submission.in_flight > 0
    }

    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    pub(super) fn submit_or_defer(&mut self, slot: u16) {
        if !self.submission.deferred.is_empty() || self.must_wait(slot) {
            self.submission.deferred.push(slot);
            return;
        }
        match self.try_submit(slot) {
            Ok(()) => {}
            Err(SubmitError::QueueFull) => {
                self.stats.device_busy += 1;
                self.submission.deferred.push(slot);
            }
            Err(SubmitError::Invalid) => self.fail(slot, RequestError::DeviceRefused),
        }
    }

    /// Hand a slot to the device: one DMA segment per grant, never merged.
    #[cfg_attr(feature = "profile-passes", inline(never))]
    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    fn try_submit(&mut self, slot: u16) -> Result<(), SubmitError> {
        let entry = self.slots[slot];
        let count = usize::from(entry.nr_segments);
        let dma = &mut self.submission.dma[..count];
        for ((segment, desc), map) in dma
            .iter_mut()
            .zip(self.slots.descs(slot, count))
            .zip(self.mapper.maps(self.slots.segments(slot)))
        {
            *segment = DmaSegment {
                buffer: map.grant.buffer,
                offset: desc.byte_offset(),
                len: desc.byte_len(),
            };
        }
        let (op, preflush) = match entry.work {
            Work::Data(DataOp::Read) => (IoOp::Read, false),
            Work::Data(DataOp::Write) => (IoOp::Write, false),
            Work::Data(DataOp::Flush | DataOp::Barrier) if count == 0 => (IoOp::Flush, false),
            Work::Data(DataOp::Flush | DataOp::Barrier) => (IoOp::Write, true),
            Work::Discard { secure } => (IoOp::Discard { secure }, false),
        };
        let request = IoRequest {
            tag: u32::from(slot),
            op,
            sector: entry.sector,
            nr_sectors: entry.nr_sectors,
            preflush,
            segments: dma,
        };
        self.device.submit(&request, &self.grants)?;
        self.slots[slot].submitted = true;
        self.submission.in_flight += 1;
        Ok(())
    }

    pub(super) fn retry_deferred(&mut self) {
        while let Some(slot) = self.submission.deferred.front() {
            if self.must_wait(slot) {
                return;
            }
            match self.try_submit(slot) {
                Ok(()) => {}
                Err(SubmitError::QueueFull) => return,
                Err(SubmitError::Invalid) => self.fail(slot, RequestError::DeviceRefused),
            }
            self.submission.deferred.pop();
        }
    }
}
