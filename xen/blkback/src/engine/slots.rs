// SPDX-License-Identifier: MIT OR Apache-2.0
//! The slot table: one slot per request between taking it off the ring and answering
//! it, the free list, and the segment area where each slot's descriptors live.

use alloc::collections::TryReserveError;
use alloc::vec::Vec;
use core::mem::size_of;
use core::ops::{Index, IndexMut, Range};

use crate::abi::MAX_SEGMENTS_PER_REQUEST;
use crate::fallible;
use crate::parse::{DataOp, SegmentDesc};

/// What a slot's request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Work {
    Data(DataOp),
    Discard { secure: bool },
}

/// One request in flight through the engine.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub id: u64,
    pub response_op: u8,
    pub work: Work,
    pub sector: u64,
    pub nr_sectors: u64,
    pub nr_segments: u16,
    /// Where this request's segments start in the segment area (descriptors and maps).
    pub seg_base: u32,
    /// Owned by the device.
    pub submitted: bool,
}

impl Slot {
    const IDLE: Slot = Slot {
        id: 0,
        response_op: 0,
        work: Work::Data(DataOp::Read),
        sector: 0,
        nr_sectors: 0,
        nr_segments: 0,
        seg_base: 0,
        submitted: false,
    };
}

/// Segment entries per ring: a dense area of 11 per slot for direct requests, then
/// `max_segments` per slot for indirect ones.
pub(super) fn segment_area(slots: usize, max_segments: usize) -> usize {
    slots * (MAX_SEGMENTS_PER_REQUEST + max_segments)
}

/// Every slot of one ring, the free ones, and their segment descriptors.
#[derive(Debug)]
pub(super) struct SlotTable {
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Descriptors of every slot's segments, at `seg_base..seg_base + nr_segments`.
    descs: Vec<SegmentDesc>,
    /// Segments one request may carry (11, or the advertised indirect count).
    max_segments: usize,
}

impl SlotTable {
    pub fn new(slots: usize, max_segments: usize) -> Result<Self, TryReserveError> {
        let mut free = fallible::with_capacity(slots)?;
        free.extend((0..slots as u16).rev());
        Ok(Self {
            slots: fallible::vec(Slot::IDLE, slots)?,
            free,
            descs: fallible::vec(SegmentDesc::default(), segment_area(slots, max_segments))?,
            max_segments,
        })
    }

    /// Bytes `new` allocates.
    pub fn memory_needed(slots: usize, max_segments: usize) -> usize {
        slots * (size_of::<Slot>() + size_of::<u16>())
            + segment_area(slots, max_segments) * size_of::<SegmentDesc>()
    }

    /// Take a free slot for a new request, its segments in the dense direct area.
    pub fn alloc(&mut self, id: u64, response_op: u8, work: Work, sector: u64) -> Option<u16> {
        let slot = self.free.pop()?;
        self.slots[usize::from(slot)] = Slot {
            id,
            response_op,
            work,
            sector,
            nr_sectors: 0,
            nr_segments: 0,
            seg_base: u32::from(slot) * MAX_SEGMENTS_PER_REQUEST as u32,
            submitted: false,
        };
        Some(slot)
    }

    pub fn free(&mut self, slot: u16) {
        self.free.push(slot);
    }

    /// Move a slot's segments to its indirect area. Indirect requests use the large
    /// per-slot area; direct ones stay in the dense area at the front, so small requests
    /// touch little memory.
    pub fn use_indirect_area(&mut self, slot: u16) {
        let dense = self.slots.len() * MAX_SEGMENTS_PER_REQUEST;
        self.slots[usize::from(slot)].seg_base =
            (dense + usize::from(slot) * self.max_segments) as u32;
    }

    /// Whether a device tag names a slot the device owns.
    pub fn is_submitted(&self, tag: u32) -> bool {
        (tag as usize) < self.slots.len() && self.slots[tag as usize].submitted
    }

    /// Where a slot's staged segments sit in the segment area.
    pub fn segments(&self, slot: u16) -> Range<usize> {
        let entry = &self.slots[usize::from(slot)];
        let base = entry.seg_base as usize;
        base..base + usize::from(entry.nr_segments)
    }

    /// The first `count` descriptors of a slot.
    pub fn descs(&self, slot: u16, count: usize) -> &[SegmentDesc] {
        let base = self.slots[usize::from(slot)].seg_base as usize;
        &self.descs[base..base + count]
    }

    pub fn descs_mut(&mut self, slot: u16, count: usize) -> &mut [SegmentDesc] {
        let base = self.slots[usize::from(slot)].seg_base as usize;
        &mut self.descs[base..base + count]
    }

    /// The descriptor at an index of the segment area.
    pub fn desc(&self, index: usize) -> &SegmentDesc {
        &self.descs[index]
    }
}

impl Index<u16> for SlotTable {
    type Output = Slot;
    fn index(&self, slot: u16) -> &Slot {
        &self.slots[usize::from(slot)]
    }
}

impl IndexMut<u16> for SlotTable {
    fn index_mut(&mut self, slot: u16) -> &mut Slot {
        &mut self.slots[usize::from(slot)]
    }
}
