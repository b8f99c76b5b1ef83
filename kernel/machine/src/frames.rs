// SPDX-License-Identifier: MIT OR Apache-2.0
//! Physical frame allocator over the firmware memory map.
//!
//! It holds free physical ranges in a fixed array (it runs before the heap exists),
//! kept sorted and coalesced. Single frames come from the lowest range; contiguous runs
//! (the heap, DMA rings) are carved with the alignment asked for.

pub const FRAME_SIZE: u64 = 4096;

/// Free ranges the allocator can track. Freeing into a full table is refused (the
/// frame is then leaked and counted) rather than growing: there is no heap underneath.
pub const MAX_RANGES: usize = 128;

/// A half-open physical range `[start, end)`, both multiples of `FRAME_SIZE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PhysRange {
    pub start: u64,
    pub end: u64,
}

impl PhysRange {
    pub const fn new(start: u64, end: u64) -> Self {
        PhysRange { start, end }
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// The largest frame-aligned range inside this one.
    pub fn frames_inside(&self) -> PhysRange {
        let start = self.start.div_ceil(FRAME_SIZE).saturating_mul(FRAME_SIZE);
        let end = self.end / FRAME_SIZE * FRAME_SIZE;
        PhysRange {
            start,
            end: end.max(start),
        }
    }

    /// The smallest frame-aligned range covering this one.
    pub fn frames_covering(&self) -> PhysRange {
        let start = self.start / FRAME_SIZE * FRAME_SIZE;
        let end = self.end.div_ceil(FRAME_SIZE).saturating_mul(FRAME_SIZE);
        PhysRange { start, end }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// No free range can satisfy the request.
    OutOfMemory,
    /// The range table is full; the frames were not taken back.
    TableFull,
    /// Address not frame-aligned, or the frame is already free.
    BadFree,
}

impl core::fmt::Display for FrameError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            FrameError::OutOfMemory => "out of memory",
            FrameError::TableFull => "the free-range table is full",
            FrameError::BadFree => "freed frames that are unaligned or already free",
        })
    }
}

impl core::error::Error for FrameError {}

pub struct FrameAllocator {
    ranges: [PhysRange; MAX_RANGES],
    count: usize,
    leaked_frames: u64,
}

impl Default for FrameAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameAllocator {
    pub const fn new() -> Self {
        FrameAllocator {
            ranges: [PhysRange::new(0, 0); MAX_RANGES],
            count: 0,
            leaked_frames: 0,
        }
    }

    pub fn ranges(&self) -> &[PhysRange] {
        &self.ranges[..self.count]
    }

    pub fn free_bytes(&self) -> u64 {
        self.ranges().iter().map(PhysRange::len).sum()
    }

    pub fn leaked_frames(&self) -> u64 {
        self.leaked_frames
    }

    /// Adds usable memory (trimmed to whole frames). Overlaps with free memory are merged.
    pub fn add(&mut self, range: PhysRange) -> Result<(), FrameError> {
        let range = range.frames_inside();
        if range.is_empty() {
            return Ok(());
        }
        // Remove any overlap first so a range is never free twice, then insert.
        self.remove(range);
        self.insert(range)
    }

    /// Takes a range out of the free memory (the image, firmware tables, ...).
    pub fn remove(&mut self, range: PhysRange) {
        let range = range.frames_covering();
        let mut i = 0;
        while i < self.count {
            let r = self.ranges[i];
            if r.end <= range.start || r.start >= range.end {
                i += 1;
                continue;
            }
            let left = PhysRange::new(r.start, range.start.max(r.start));
            let right = PhysRange::new(range.end.min(r.end), r.end);
            match (left.is_empty(), right.is_empty()) {
                (true, true) => {
                    self.delete(i);
                    continue;
                }
                (false, true) => self.ranges[i] = left,
                (true, false) => self.ranges[i] = right,
                (false, false) => {
                    self.ranges[i] = left;
                    if self.count == MAX_RANGES {
                        // Cannot split: dropping the right part is safe (memory merely unused).
                        self.leaked_frames += right.len() / FRAME_SIZE;
                    } else {
                        self.insert_at(i + 1, right);
                        i += 1;
                    }
                }
            }
            i += 1;
        }
    }

    /// One frame, the lowest free one.
    pub fn allocate(&mut self) -> Result<u64, FrameError> {
        self.allocate_contiguous(1, FRAME_SIZE)
    }

    /// `frames` contiguous frames starting at a multiple of `align` (a power of two ≥ 4 KiB).
    pub fn allocate_contiguous(&mut self, frames: u64, align: u64) -> Result<u64, FrameError> {
        let bytes = frames
            .checked_mul(FRAME_SIZE)
            .ok_or(FrameError::OutOfMemory)?;
        let align = align.max(FRAME_SIZE);
        if bytes == 0 || !align.is_power_of_two() {
            return Err(FrameError::OutOfMemory);
        }
        for i in 0..self.count {
            let r = self.ranges[i];
            let Some(start) = r.start.checked_next_multiple_of(align) else {
                continue;
            };
            let Some(end) = start.checked_add(bytes) else {
                continue;
            };
            if end > r.end {
                continue;
            }
            self.remove(PhysRange::new(start, end));
            return Ok(start);
        }
        Err(FrameError::OutOfMemory)
    }

    /// Returns `frames` frames starting at `start` to the free memory.
    pub fn free(&mut self, start: u64, frames: u64) -> Result<(), FrameError> {
        let range = PhysRange::new(start, start + frames * FRAME_SIZE);
        if !start.is_multiple_of(FRAME_SIZE) || frames == 0 {
            return Err(FrameError::BadFree);
        }
        if self
            .ranges()
            .iter()
            .any(|r| r.start < range.end && range.start < r.end)
        {
            return Err(FrameError::BadFree);
        }
        self.insert(range)
            .inspect_err(|_| self.leaked_frames += frames)
    }

    fn insert(&mut self, range: PhysRange) -> Result<(), FrameError> {
        let pos = self
            .ranges()
            .iter()
            .position(|r| r.start > range.start)
            .unwrap_or(self.count);
        let merges_left = pos > 0 && self.ranges[pos - 1].end == range.start;
        let merges_right = pos < self.count && self.ranges[pos].start == range.end;
        match (merges_left, merges_right) {
            (true, true) => {
                self.ranges[pos - 1].end = self.ranges[pos].end;
                self.delete(pos);
            }
            (true, false) => self.ranges[pos - 1].end = range.end,
            (false, true) => self.ranges[pos].start = range.start,
            (false, false) => {
                if self.count == MAX_RANGES {
                    return Err(FrameError::TableFull);
                }
                self.insert_at(pos, range);
            }
        }
        Ok(())
    }

    fn insert_at(&mut self, pos: usize, range: PhysRange) {
        self.ranges.copy_within(pos..self.count, pos + 1);
        self.ranges[pos] = range;
        self.count += 1;
    }

    fn delete(&mut self, pos: usize) {
        self.ranges.copy_within(pos + 1..self.count, pos);
        self.count -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_display_their_cause() {
        let text = |e: &dyn core::error::Error| e.to_string();
        assert_eq!(text(&FrameError::OutOfMemory), "out of memory");
        assert_eq!(text(&FrameError::TableFull), "the free-range table is full");
    }

    const MIB: u64 = 1 << 20;

    fn allocator(ranges: &[(u64, u64)]) -> FrameAllocator {
        let mut a = FrameAllocator::new();
        for &(s, e) in ranges {
            a.add(PhysRange::new(s, e)).unwrap();
        }
        a
    }

    #[test]
    fn add_trims_to_frames_and_merges() {
        let a = allocator(&[(0x1001, 0x5fff), (0x5000, 0x9000)]);
        assert_eq!(a.ranges(), &[PhysRange::new(0x2000, 0x9000)]);
        assert_eq!(a.free_bytes(), 0x7000);
    }

    #[test]
    fn remove_splits_around_reserved_memory() {
        let mut a = allocator(&[(MIB, 16 * MIB)]);
        a.remove(PhysRange::new(2 * MIB + 10, 3 * MIB - 10)); // covers whole frames
        assert_eq!(
            a.ranges(),
            &[
                PhysRange::new(MIB, 2 * MIB),
                PhysRange::new(3 * MIB, 16 * MIB)
            ]
        );
        a.remove(PhysRange::new(0, MIB + 4096));
        assert_eq!(a.ranges()[0], PhysRange::new(MIB + 4096, 2 * MIB));
        a.remove(PhysRange::new(MIB, 20 * MIB));
        assert!(a.ranges().is_empty());
    }

    #[test]
    fn single_frames_are_distinct_and_come_back() {
        let mut a = allocator(&[(MIB, MIB + 16 * 4096)]);
        let mut got: Vec<u64> = (0..16).map(|_| a.allocate().unwrap()).collect();
        assert_eq!(a.allocate(), Err(FrameError::OutOfMemory));
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 16);
        assert!(got
            .iter()
            .all(|f| f % FRAME_SIZE == 0 && (MIB..MIB + 16 * 4096).contains(f)));
        for f in got.iter().rev() {
            a.free(*f, 1).unwrap();
        }
        assert_eq!(a.ranges(), &[PhysRange::new(MIB, MIB + 16 * 4096)]);
    }

    #[test]
    fn contiguous_runs_respect_alignment() {
        let mut a = allocator(&[(MIB + 4096, 8 * MIB)]);
        let start = a.allocate_contiguous(512, 2 * MIB).unwrap();
        assert_eq!(start, 2 * MIB);
        assert_eq!(
            a.ranges(),
            &[
                PhysRange::new(MIB + 4096, 2 * MIB),
                PhysRange::new(4 * MIB, 8 * MIB)
            ]
        );
        assert_eq!(
            a.allocate_contiguous(2048, 4096),
            Err(FrameError::OutOfMemory)
        );
        assert_eq!(a.allocate_contiguous(0, 4096), Err(FrameError::OutOfMemory));
        assert_eq!(
            a.allocate_contiguous(1, 3 * 4096),
            Err(FrameError::OutOfMemory)
        );
    }

    #[test]
    fn double_free_and_unaligned_free_are_refused() {
        let mut a = allocator(&[(MIB, 2 * MIB)]);
        let f = a.allocate().unwrap();
        a.free(f, 1).unwrap();
        assert_eq!(a.free(f, 1), Err(FrameError::BadFree));
        assert_eq!(a.free(f + 1, 1), Err(FrameError::BadFree));
    }

    #[test]
    fn a_full_table_leaks_instead_of_corrupting() {
        let mut a = FrameAllocator::new();
        // MAX_RANGES disjoint ranges with one-frame gaps.
        for i in 0..MAX_RANGES as u64 {
            a.add(PhysRange::new(i * 2 * 4096, i * 2 * 4096 + 4096))
                .unwrap();
        }
        assert_eq!(a.ranges().len(), MAX_RANGES);
        // A new disjoint range cannot be tracked.
        assert_eq!(
            a.add(PhysRange::new(1 << 40, (1 << 40) + 4096)),
            Err(FrameError::TableFull)
        );
        // Filling a gap merges, so it always fits.
        a.free(4096, 1).unwrap();
        assert_eq!(a.ranges().len(), MAX_RANGES - 1);
        let before = a.free_bytes();
        a.free(1 << 41, 1).unwrap(); // fits again now that one slot is spare
        assert_eq!(a.free_bytes(), before + 4096);
        assert_eq!(a.free(1 << 42, 1), Err(FrameError::TableFull));
        assert_eq!(a.leaked_frames(), 1);
    }
}

/// The largest range inside `[low, high)` that no entry of `used` overlaps, aligned to
/// `align` (a power of two) at both ends. For placing foreign mappings (grants) where
/// the memory map has nothing.
pub fn largest_hole(used: &[PhysRange], low: u64, high: u64, align: u64) -> Option<PhysRange> {
    let mut sorted: [PhysRange; MAX_RANGES] = [PhysRange::default(); MAX_RANGES];
    let n = used.len().min(MAX_RANGES);
    sorted[..n].copy_from_slice(&used[..n]);
    let sorted = &mut sorted[..n];
    sorted.sort_unstable_by_key(|r| r.start);
    let mut best: Option<PhysRange> = None;
    let mut cursor = low;
    let mut consider = |start: u64, end: u64| {
        let start = start.checked_next_multiple_of(align)?;
        let end = end / align * align;
        let hole = PhysRange::new(start, end);
        if start < end && best.is_none_or(|b| hole.len() > b.len()) {
            best = Some(hole);
        }
        Some(())
    };
    for r in sorted.iter().filter(|r| !r.is_empty()) {
        if r.start > cursor {
            consider(cursor, r.start.min(high));
        }
        cursor = cursor.max(r.end);
        if cursor >= high {
            break;
        }
    }
    if cursor < high {
        consider(cursor, high);
    }
    best
}

#[cfg(test)]
mod hole_tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn finds_the_gap_between_ram_and_firmware() {
        // A PVH domain with 512 MiB: RAM, then ACPI and special pages near 4 GiB.
        let used = [
            PhysRange::new(0, 512 * MIB),
            PhysRange::new(0xfc00_0000, 0xfc00_8000),
            PhysRange::new(0xfeff_8000, 0xff00_0000),
        ];
        let hole = largest_hole(&used, 0, 4 * GIB, 2 * MIB).unwrap();
        assert_eq!(hole, PhysRange::new(512 * MIB, 0xfc00_0000));
    }

    #[test]
    fn respects_bounds_alignment_and_unsorted_overlapping_input() {
        let used = [
            PhysRange::new(3 * GIB, 3 * GIB + 5),
            PhysRange::new(0, GIB + 1),
            PhysRange::new(MIB, 2 * MIB),
        ];
        let hole = largest_hole(&used, 0, 4 * GIB, 2 * MIB).unwrap();
        assert_eq!(hole, PhysRange::new(GIB + 2 * MIB, 3 * GIB));
        assert_eq!(largest_hole(&used, 0, GIB, 2 * MIB), None);
        assert_eq!(
            largest_hole(&[], 5, 4 * MIB + 7, 2 * MIB),
            Some(PhysRange::new(2 * MIB, 4 * MIB))
        );
    }
}
