// SPDX-License-Identifier: MIT OR Apache-2.0
//! Where on its device a disk lies: the whole device, an explicit extent, or a GPT
//! partition, whose table is read through one of the device's queues before any disk has
//! them. The checks are `backing::check_slice` and `backing::gpt` (host-tested); this is
//! the reading.

use super::dma_pages::DmaPages;
use super::hal::{allocate_dma, ticks};
use super::open::Queue;
use crate::physmem;
use alloc::vec::Vec;
use backing::gpt::{self, GptError, Wanted};
use backing::{check_slice, Extent, Region, SliceError};
use blkdev::{DmaSegment, Geometry, IoOp, IoRequest, IoStatus, SubmitError};
use core::fmt;

const PAGE: usize = 4096;
/// DMA pages a table is read through (a usual entry array, 16 KiB, in one request).
const READ_PAGES: usize = 16;
/// A read must finish within 5 s (counted in TSC ticks at up to 5 GHz: the control path
/// may run before the clock is calibrated).
const READ_TIMEOUT_TICKS: u64 = 5 * 5_000_000_000;

/// Why a disk's region could not be placed on its device.
#[derive(Debug)]
pub enum RegionError {
    /// No queue to read the partition table through.
    NoQueue,
    Slice(SliceError),
    Gpt(GptError),
    /// Reading the partition table failed.
    Read {
        what: &'static str,
        offset: u64,
        len: usize,
        why: ReadError,
    },
}

#[derive(Debug)]
pub enum ReadError {
    NoDmaMemory,
    Refused(SubmitError),
    Device(IoStatus),
    /// No completion in time: the queue is given up (it may still answer).
    Timeout,
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::NoQueue => f.write_str("no queue to read the partition table through"),
            RegionError::Slice(error) => write!(f, "{error}"),
            RegionError::Gpt(error) => write!(f, "{error}"),
            RegionError::Read {
                what,
                offset,
                len,
                why,
            } => {
                write!(f, "reading the GPT {what} ({len} bytes at byte {offset}): ")?;
                match why {
                    ReadError::NoDmaMemory => f.write_str("no memory for DMA"),
                    ReadError::Refused(error) => write!(f, "{error}"),
                    ReadError::Device(status) => write!(f, "the device answered {status:?}"),
                    ReadError::Timeout => f.write_str("no answer within 5 s"),
                }
            }
        }
    }
}

impl core::error::Error for RegionError {}

/// The extent of `region` on a device of `geometry` when no table has to be read: the
/// whole device, or an explicit extent (checked against the device). None for a
/// partition.
pub fn without_table(region: Region, geometry: &Geometry) -> Option<Result<Extent, RegionError>> {
    let device_bytes = geometry.sectors.saturating_mul(blkdev::SECTOR_SIZE);
    match region {
        Region::Whole => Extent::new(0, device_bytes).map(Ok),
        Region::Extent { offset, size } => Some(
            // The parser checked that offset + size fits.
            Extent::new(offset, size)
                .ok_or(SliceError::Empty)
                .and_then(|extent| {
                    check_slice(extent, device_bytes, geometry.logical_block_size)?;
                    Ok(extent)
                })
                .map_err(RegionError::Slice),
        ),
        Region::Partition(_) | Region::PartitionNamed(_) => None,
    }
}

/// Reads partition tables. Its DMA pages are made on first use and kept (set-up memory
/// is never freed); a read that does not finish gives up the pages and the queue (the
/// device may still write to them), which are kept here, never used again.
#[derive(Default)]
pub struct TableReader {
    pages: Option<u64>,
    abandoned: Vec<Queue>,
}

impl TableReader {
    /// The extent of `region` on the device `queues` drive, and for a partition the
    /// bytes of the table it was found by (no other disk may cover them while it
    /// serves); its GPT is read through the last of the queues (idle: nothing in
    /// flight). `progress` runs while a read waits: what moves the queue's requests
    /// when no hardware does (a remote namespace's: the network pass, which the control
    /// path, this caller, otherwise runs itself). A queue that does not answer leaves
    /// `queues`.
    pub fn locate(
        &mut self,
        region: Region,
        queues: &mut Vec<Queue>,
        progress: &mut dyn FnMut(),
    ) -> Result<(Extent, Option<Extent>), RegionError> {
        let queue = queues.last_mut().ok_or(RegionError::NoQueue)?;
        let geometry = queue.geometry();
        let wanted = match region {
            Region::Partition(number) => Wanted::Number(number),
            Region::PartitionNamed(name) => Wanted::Name(name),
            Region::Whole | Region::Extent { .. } => {
                return without_table(region, &geometry)
                    .unwrap_or(Err(RegionError::Slice(SliceError::Empty)))
                    .map(|extent| (extent, None));
            }
        };
        let device_bytes = geometry.sectors.saturating_mul(blkdev::SECTOR_SIZE);
        let block_size = geometry.logical_block_size;
        let result = (|| {
            let (at, len) =
                gpt::header_location(block_size, device_bytes).map_err(RegionError::Gpt)?;
            let block = self.read(queue, "header", at, len, progress)?;
            let header =
                gpt::Header::parse(&block, block_size, device_bytes).map_err(RegionError::Gpt)?;
            let (at, len) = header.entries_location();
            // Whole blocks: the header's check put them on the disk.
            let blocks = len.div_ceil(block_size as usize) * block_size as usize;
            let entries = self.read(queue, "entry array", at, blocks, progress)?;
            let found = header.find(&entries, wanted).map_err(RegionError::Gpt)?;
            check_slice(found.extent, device_bytes, block_size).map_err(RegionError::Slice)?;
            Ok((found.extent, Some(header.table_extent())))
        })();
        if let Err(RegionError::Read {
            why: ReadError::Timeout,
            ..
        }) = result
        {
            self.abandoned.extend(queues.pop());
        }
        result
    }

    /// `len` bytes at byte `offset` (whole blocks) through `queue`.
    fn read(
        &mut self,
        queue: &mut Queue,
        what: &'static str,
        offset: u64,
        len: usize,
        progress: &mut dyn FnMut(),
    ) -> Result<Vec<u8>, RegionError> {
        let fail = |why| RegionError::Read {
            what,
            offset,
            len,
            why,
        };
        let mut out = alloc::vec![0u8; len];
        let mut done = 0;
        while done < len {
            let base = match self.pages {
                Some(base) => base,
                None => {
                    let base =
                        allocate_dma(READ_PAGES).ok_or_else(|| fail(ReadError::NoDmaMemory))?;
                    *self.pages.insert(base)
                }
            };
            let chunk = (len - done).min(READ_PAGES * PAGE);
            let segments: Vec<DmaSegment> = (0..chunk.div_ceil(PAGE))
                .map(|page| DmaSegment {
                    buffer: base + (page * PAGE) as u64,
                    offset: 0,
                    len: (chunk - page * PAGE).min(PAGE) as u32,
                })
                .collect();
            let request = IoRequest {
                tag: 0,
                op: IoOp::Read,
                sector: (offset + done as u64) / blkdev::SECTOR_SIZE,
                nr_sectors: (chunk as u64) / blkdev::SECTOR_SIZE,
                preflush: false,
                segments: &segments,
            };
            let pages = DmaPages {
                base,
                pages: READ_PAGES,
            };
            queue
                .submit(&request, &pages)
                .map_err(|e| fail(ReadError::Refused(e)))?;
            let start = ticks();
            let status = loop {
                let mut status = None;
                queue.poll_completions(&mut |c| {
                    if c.tag == request.tag {
                        status = Some(c.status);
                    }
                });
                if let Some(status) = status {
                    break status;
                }
                if ticks().wrapping_sub(start) > READ_TIMEOUT_TICKS {
                    // The device may still write to these pages.
                    self.pages = None;
                    return Err(fail(ReadError::Timeout));
                }
                progress();
                core::hint::spin_loop();
            };
            if status != IoStatus::Ok {
                return Err(fail(ReadError::Device(status)));
            }
            // SAFETY: the pages are this reader's DMA memory (allocated above, READ_PAGES
            // long, chunk fits), and the device finished writing them.
            unsafe { physmem::read(base, &mut out[done..done + chunk]) };
            done += chunk;
        }
        Ok(out)
    }
}

/// One 4 KiB block at byte 0 of what `queue` serves, written from or read into `block`
/// (the registry test's look at which data a name reaches). Its DMA page is left to the
/// device when it does not answer within the read timeout.
#[cfg(feature = "test-hooks")]
pub fn first_block(
    queue: &mut dyn blkdev::BlockDevice,
    op: IoOp,
    block: &mut [u8; PAGE],
) -> Result<(), alloc::string::String> {
    use alloc::format;
    let base = allocate_dma(1).ok_or("no DMA memory")?;
    if op == IoOp::Write {
        // SAFETY: the page is ours (allocated just now, one page long) and no device has
        // it yet.
        unsafe { physmem::write(base, block) };
    }
    let segments = [DmaSegment {
        buffer: base,
        offset: 0,
        len: PAGE as u32,
    }];
    let request = IoRequest {
        tag: 0,
        op,
        sector: 0,
        nr_sectors: (PAGE as u64) / blkdev::SECTOR_SIZE,
        preflush: false,
        segments: &segments,
    };
    let pages = DmaPages { base, pages: 1 };
    queue
        .submit(&request, &pages)
        .map_err(|e| format!("refused: {e}"))?;
    let start = ticks();
    let status = loop {
        let mut status = None;
        queue.poll_completions(&mut |c| status = Some(c.status));
        if let Some(status) = status {
            break status;
        }
        if ticks().wrapping_sub(start) > READ_TIMEOUT_TICKS {
            return Err("no answer".into());
        }
        core::hint::spin_loop();
    };
    if status != IoStatus::Ok {
        return Err(format!("{status:?}"));
    }
    if op == IoOp::Read {
        // SAFETY: the page is ours and the device finished writing it.
        unsafe { physmem::read(base, block) };
    }
    Ok(())
}
