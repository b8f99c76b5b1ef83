// SPDX-License-Identifier: MIT OR Apache-2.0
//! Splitting a request's segments into NVMe commands whose data PRPs can describe.
//!
//! A PRP list names whole pages after the first entry: the first segment may start
//! anywhere (dword aligned) but must run to its page end if more follow, and every later
//! segment must start on a page boundary. Segments come one per granted page and are
//! never merged, so a segment list that breaks those rules (a short segment in the
//! middle) is split into several commands at the break, each for consecutive blocks.

use crate::PAGE_SIZE;
use blkdev::{DmaSegment, SECTOR_SIZE};

/// One command's share of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandPlan {
    pub first_segment: usize,
    pub segment_count: usize,
    /// Where this command's data starts, in bytes from the request's first sector.
    pub byte_offset: u64,
    pub bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The segment at this index is empty, not whole sectors, not dword aligned, or
    /// crosses its page.
    BadSegment(usize),
    /// A command's share is not a whole number of logical blocks.
    NotBlockMultiple,
    NoSegments,
}

impl core::fmt::Display for PlanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlanError::BadSegment(index) => write!(f, "segment {index} cannot be described"),
            PlanError::NotBlockMultiple => {
                f.write_str("a command's share is not whole logical blocks")
            }
            PlanError::NoSegments => f.write_str("no segments"),
        }
    }
}

impl core::error::Error for PlanError {}

pub(crate) fn segment_address(segment: &DmaSegment) -> u64 {
    segment.buffer.wrapping_add(u64::from(segment.offset))
}

fn check_segment(index: usize, segment: &DmaSegment) -> Result<(), PlanError> {
    let address = segment_address(segment);
    let len = u64::from(segment.len);
    let ok = len > 0
        && len.is_multiple_of(SECTOR_SIZE)
        && address.is_multiple_of(4)
        && address % PAGE_SIZE + len <= PAGE_SIZE
        && segment
            .buffer
            .checked_add(u64::from(segment.offset))
            .is_some();
    if ok {
        Ok(())
    } else {
        Err(PlanError::BadSegment(index))
    }
}

/// Calls `visit` for each command `segments` needs, each naming at most `max_pages`
/// pages, and returns the number of commands. Everything is checked before the first
/// call to `visit`, so an error means nothing was visited.
pub fn plan_commands(
    segments: &[DmaSegment],
    max_pages: usize,
    block_size: u32,
    visit: &mut dyn FnMut(CommandPlan),
) -> Result<usize, PlanError> {
    if segments.is_empty() {
        return Err(PlanError::NoSegments);
    }
    for (index, segment) in segments.iter().enumerate() {
        check_segment(index, segment)?;
    }
    // Checking pass, then the visiting pass over the same boundaries.
    let count = walk(segments, max_pages, block_size, &mut |_| {})?;
    walk(segments, max_pages, block_size, visit)?;
    Ok(count)
}

fn walk(
    segments: &[DmaSegment],
    max_pages: usize,
    block_size: u32,
    visit: &mut dyn FnMut(CommandPlan),
) -> Result<usize, PlanError> {
    let max_pages = max_pages.max(1);
    let mut count = 0;
    let mut current = CommandPlan {
        first_segment: 0,
        segment_count: 0,
        byte_offset: 0,
        bytes: 0,
    };
    let mut emit = |plan: CommandPlan| {
        if !plan.bytes.is_multiple_of(u64::from(block_size)) {
            return Err(PlanError::NotBlockMultiple);
        }
        visit(plan);
        count += 1;
        Ok(())
    };
    for (index, segment) in segments.iter().enumerate() {
        let address = segment_address(segment);
        if current.segment_count > 0 {
            let previous = &segments[index - 1];
            let previous_end = segment_address(previous) + u64::from(previous.len);
            let joinable = previous_end.is_multiple_of(PAGE_SIZE)
                && address.is_multiple_of(PAGE_SIZE)
                && current.segment_count < max_pages;
            if !joinable {
                emit(current)?;
                current = CommandPlan {
                    first_segment: index,
                    segment_count: 0,
                    byte_offset: current.byte_offset + current.bytes,
                    bytes: 0,
                };
            }
        }
        current.segment_count += 1;
        current.bytes += u64::from(segment.len);
    }
    emit(current)?;
    Ok(count)
}

/// Data block descriptors one SGL list page holds.
pub const SGL_LIST_ENTRIES: usize = 256;

/// Like [`plan_commands`] for SGL commands: no page rules, only at most
/// `SGL_LIST_ENTRIES` segments and `max_bytes` per command.
pub fn plan_sgl_commands(
    segments: &[DmaSegment],
    max_bytes: u64,
    block_size: u32,
    visit: &mut dyn FnMut(CommandPlan),
) -> Result<usize, PlanError> {
    if segments.is_empty() {
        return Err(PlanError::NoSegments);
    }
    for (index, segment) in segments.iter().enumerate() {
        check_segment(index, segment)?;
    }
    let pass = |visit: &mut dyn FnMut(CommandPlan)| {
        let mut current = CommandPlan {
            first_segment: 0,
            segment_count: 0,
            byte_offset: 0,
            bytes: 0,
        };
        let mut emitted = 0;
        for (index, segment) in segments.iter().enumerate() {
            let len = u64::from(segment.len);
            if current.segment_count == SGL_LIST_ENTRIES || current.bytes + len > max_bytes {
                if !current.bytes.is_multiple_of(u64::from(block_size)) {
                    return Err(PlanError::NotBlockMultiple);
                }
                visit(current);
                emitted += 1;
                current = CommandPlan {
                    first_segment: index,
                    segment_count: 0,
                    byte_offset: current.byte_offset + current.bytes,
                    bytes: 0,
                };
            }
            current.segment_count += 1;
            current.bytes += len;
        }
        if !current.bytes.is_multiple_of(u64::from(block_size)) {
            return Err(PlanError::NotBlockMultiple);
        }
        visit(current);
        Ok(emitted + 1)
    };
    pass(&mut |_| {})?;
    pass(visit)
}

/// The two PRP fields of a command covering `segments` (one page each). `list` is the
/// bus address of the command's PRP list page, which `write_list` fills when needed.
pub(crate) fn prp_fields(
    segments: &[DmaSegment],
    list: u64,
    write_list: &mut dyn FnMut(&[DmaSegment]),
) -> (u64, u64) {
    let prp1 = segment_address(&segments[0]);
    let prp2 = match segments.len() {
        1 => 0,
        2 => segment_address(&segments[1]),
        _ => {
            write_list(&segments[1..]);
            list
        }
    };
    (prp1, prp2)
}
