// SPDX-License-Identifier: MIT OR Apache-2.0
//! A slice of a device as a disk of its own: sectors `[start, start + sectors)` of the
//! device are sectors `[0, sectors)` of the slice. Every request is checked against the
//! slice before it is moved by `start` and handed on, so nothing one slice's guest sends
//! reaches a byte outside it, whatever the layers above checked.
//!
//! The slice's length can be shared by several queues ([`SharedCapacity`]: the queues of
//! one disk, each on its poller) and grown while they serve: each request reads it once.
//! Whoever grows it checks first that the longer slice still fits the device and meets no
//! other slice (the kernel's device registry does); the device checks its own end anyway.

use alloc::sync::Arc;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::{
    range_fits, BlockDevice, BufferAccess, Geometry, IoOp, IoRequest, SubmitError, SECTOR_SIZE,
};

/// A slice's length in sectors, shared by the queues of one disk (cloning shares it).
#[derive(Clone, Debug)]
pub struct SharedCapacity(Arc<AtomicU64>);

impl SharedCapacity {
    pub fn new(sectors: u64) -> Self {
        SharedCapacity(Arc::new(AtomicU64::new(sectors)))
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// The new length, seen by every queue's next request (the caller checked it).
    pub fn set(&self, sectors: u64) {
        self.0.store(sectors, Ordering::Release);
    }
}

/// Why a slice cannot be made of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceError {
    /// No sectors.
    Empty,
    /// `start + sectors` is beyond the device's capacity.
    BeyondDevice { end: Option<u64>, capacity: u64 },
    /// Start or length is not whole logical blocks of the device.
    NotWholeBlocks { logical_block_size: u32 },
}

impl core::fmt::Display for SliceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SliceError::Empty => f.write_str("a slice of no sectors"),
            SliceError::BeyondDevice {
                end: Some(end),
                capacity,
            } => write!(
                f,
                "the slice ends at sector {end}, beyond the device's {capacity}"
            ),
            SliceError::BeyondDevice { end: None, .. } => {
                f.write_str("the slice ends beyond 2^64 sectors")
            }
            SliceError::NotWholeBlocks { logical_block_size } => write!(
                f,
                "the slice is not whole blocks of {logical_block_size} bytes"
            ),
        }
    }
}

impl core::error::Error for SliceError {}

/// `sectors` sectors of `D` from sector `start`, as a device of its own.
#[derive(Debug)]
pub struct Slice<D> {
    inner: D,
    start: u64,
    sectors: SharedCapacity,
    /// Everything but the length, which is `sectors`.
    geometry: Geometry,
}

impl<D: BlockDevice> Slice<D> {
    /// The slice of `inner` from sector `start`, `sectors` long: non-empty, whole
    /// logical blocks, inside the device. On error the device comes back with why.
    pub fn new(inner: D, start: u64, sectors: u64) -> Result<Self, (D, SliceError)> {
        Self::shared(inner, start, &SharedCapacity::new(sectors))
    }

    /// Like `new`, with a length shared with other queues of the same disk (checked as
    /// it is now).
    pub fn shared(
        inner: D,
        start: u64,
        capacity: &SharedCapacity,
    ) -> Result<Self, (D, SliceError)> {
        let sectors = capacity.get();
        let device = inner.geometry();
        let block = (u64::from(device.logical_block_size) / SECTOR_SIZE).max(1);
        let error = if sectors == 0 {
            Some(SliceError::Empty)
        } else if !range_fits(start, sectors, device.sectors) {
            Some(SliceError::BeyondDevice {
                end: start.checked_add(sectors),
                capacity: device.sectors,
            })
        } else if !start.is_multiple_of(block) || !sectors.is_multiple_of(block) {
            Some(SliceError::NotWholeBlocks {
                logical_block_size: device.logical_block_size,
            })
        } else {
            None
        };
        if let Some(error) = error {
            return Err((inner, error));
        }
        let geometry = Geometry {
            sectors,
            discard: device.discard.map(|mut discard| {
                // Discard granules keep their place on the device: the first one starts
                // `alignment` bytes into the device, so this far into the slice.
                let granularity = u64::from(discard.granularity);
                if granularity > 1 {
                    let into = (start * SECTOR_SIZE) % granularity;
                    let alignment = u64::from(discard.alignment) % granularity;
                    discard.alignment = ((alignment + granularity - into) % granularity) as u32;
                }
                discard
            }),
            ..device
        };
        Ok(Slice {
            inner,
            start,
            sectors: capacity.clone(),
            geometry,
        })
    }

    /// The device's sector where the slice starts.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The slice's length in sectors, now.
    pub fn sectors(&self) -> u64 {
        self.sectors.get()
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The device again, for another slice (nothing of this one is kept).
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// `request` moved onto the device, if it stays inside the slice: a read or write
    /// whose segments carry exactly `nr_sectors` sectors, a discard, inside the slice; a
    /// flush (no range) as it is.
    fn moved<'a>(&self, request: &IoRequest<'a>) -> Option<IoRequest<'a>> {
        match request.op {
            IoOp::Flush => return Some(*request),
            IoOp::Read | IoOp::Write => {
                // The device moves what the segments hold: that, not the count, must fit.
                let bytes = request
                    .segments
                    .iter()
                    .try_fold(0u64, |sum, s| sum.checked_add(u64::from(s.len)))?;
                if Some(bytes) != request.nr_sectors.checked_mul(SECTOR_SIZE) {
                    return None;
                }
            }
            IoOp::Discard { .. } => {}
        }
        range_fits(request.sector, request.nr_sectors, self.sectors.get()).then(|| IoRequest {
            // Inside the slice, and the slice inside the device: no overflow.
            sector: request.sector + self.start,
            ..*request
        })
    }
}

impl<D: BlockDevice> BlockDevice for Slice<D> {
    fn geometry(&self) -> Geometry {
        Geometry {
            sectors: self.sectors.get(),
            ..self.geometry
        }
    }

    crate::forward_to!(inner: queue_depth, poll_completions, tick, fault);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        let moved = self.moved(request).ok_or(SubmitError::Invalid)?;
        self.inner.submit(&moved, buffers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Completion, DiscardGeometry, DmaSegment, IoStatus, NoBuffers, RamDisk, RamDiskQueue,
    };
    use alloc::vec::Vec;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Records what reaches the device, completes everything.
    #[derive(Debug)]
    struct Recorder {
        geometry: Geometry,
        seen: Vec<(IoOp, u64, u64, bool)>,
        done: Vec<Completion>,
    }

    impl Recorder {
        fn new(sectors: u64, logical_block_size: u32) -> Recorder {
            Recorder {
                geometry: Geometry {
                    sectors,
                    logical_block_size,
                    physical_block_size: 4096,
                    read_only: false,
                    flush: true,
                    discard: Some(DiscardGeometry {
                        granularity: 4096,
                        alignment: 0,
                        secure: false,
                    }),
                },
                seen: Vec::new(),
                done: Vec::new(),
            }
        }
    }

    impl BlockDevice for Recorder {
        fn geometry(&self) -> Geometry {
            self.geometry
        }
        fn queue_depth(&self) -> usize {
            7
        }
        fn submit(&mut self, r: &IoRequest<'_>, _: &dyn BufferAccess) -> Result<(), SubmitError> {
            self.seen.push((r.op, r.sector, r.nr_sectors, r.preflush));
            self.done.push(Completion {
                tag: r.tag,
                status: IoStatus::Ok,
            });
            Ok(())
        }
        fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
            let n = self.done.len();
            self.done.drain(..).for_each(sink);
            n
        }
    }

    /// Pages by address, for the RAM disk's copies.
    #[derive(Default)]
    struct Pages(Mutex<HashMap<u64, Vec<u8>>>);

    impl BufferAccess for Pages {
        fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
            let pages = self.0.lock().unwrap();
            let Some(page) = pages.get(&buffer) else {
                return false;
            };
            out.copy_from_slice(&page[offset..offset + out.len()]);
            true
        }
        fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
            let mut pages = self.0.lock().unwrap();
            let page = pages.entry(buffer).or_insert_with(|| vec![0; 4096]);
            page[offset..offset + data.len()].copy_from_slice(data);
            true
        }
    }

    fn request(op: IoOp, sector: u64, nr_sectors: u64, segments: &[DmaSegment]) -> IoRequest<'_> {
        IoRequest {
            tag: 9,
            op,
            sector,
            nr_sectors,
            preflush: false,
            segments,
        }
    }

    /// `sectors` sectors of data in whole pages.
    fn pages(sectors: u64) -> Vec<DmaSegment> {
        let mut left = sectors * 512;
        let mut out = Vec::new();
        while left > 0 {
            let len = left.min(4096);
            out.push(DmaSegment {
                buffer: 0x10_0000 + out.len() as u64 * 4096,
                offset: 0,
                len: len as u32,
            });
            left -= len;
        }
        out
    }

    #[test]
    fn geometry_is_the_slices() {
        let slice = Slice::new(Recorder::new(1 << 20, 512), 2048, 16384).unwrap();
        let g = slice.geometry();
        assert_eq!(g.sectors, 16384);
        assert_eq!(
            (g.logical_block_size, g.physical_block_size, g.flush),
            (512, 4096, true)
        );
        assert_eq!(g.discard.unwrap().alignment, 0);
        assert_eq!(slice.queue_depth(), 7);
        assert_eq!((slice.start(), slice.sectors()), (2048, 16384));
        // A slice starting mid-granule: the first whole granule is 3 sectors in.
        let slice = Slice::new(Recorder::new(1 << 20, 512), 2053, 16384).unwrap();
        assert_eq!(slice.geometry().discard.unwrap().alignment, 3 * 512);
        let mut device = Recorder::new(1 << 20, 512);
        device.geometry.discard.as_mut().unwrap().alignment = 1024;
        let slice = Slice::new(device, 2049, 16384).unwrap();
        assert_eq!(slice.geometry().discard.unwrap().alignment, 512);
    }

    #[test]
    fn requests_move_by_the_start() {
        let mut slice = Slice::new(Recorder::new(1 << 20, 512), 2048, 16384).unwrap();
        let data = pages(8);
        let mut writeback = request(IoOp::Write, 16376, 8, &data);
        writeback.preflush = true;
        for r in [
            request(IoOp::Read, 0, 8, &data),
            writeback,
            request(IoOp::Discard { secure: true }, 100, 16284, &[]),
            // A flush has no range (Linux sends sector -1): it passes as it is.
            request(IoOp::Flush, u64::MAX, 0, &[]),
        ] {
            assert_eq!(slice.submit(&r, &NoBuffers), Ok(()));
        }
        assert_eq!(
            slice.inner().seen,
            [
                (IoOp::Read, 2048, 8, false),
                (IoOp::Write, 2048 + 16376, 8, true),
                (IoOp::Discard { secure: true }, 2148, 16284, false),
                (IoOp::Flush, u64::MAX, 0, false),
            ]
        );
        let mut tags = Vec::new();
        assert_eq!(slice.poll_completions(&mut |c| tags.push(c.tag)), 4);
        assert_eq!(tags, [9; 4]);
        assert_eq!(slice.into_inner().seen.len(), 4);
    }

    #[test]
    fn nothing_outside_the_slice_reaches_the_device() {
        let mut slice = Slice::new(Recorder::new(1 << 20, 512), 2048, 16384).unwrap();
        let (one, eight) = (pages(1), pages(8));
        let mut short = pages(16);
        short[1].len = 512;
        let mut long = pages(8);
        long[0].len = 8192;
        for r in [
            // Past the end, straddling it, far beyond, wrapping.
            request(IoOp::Read, 16384, 1, &one),
            request(IoOp::Write, 16380, 8, &eight),
            request(IoOp::Write, 1 << 19, 8, &eight),
            request(IoOp::Read, u64::MAX - 3, 8, &eight),
            request(IoOp::Discard { secure: false }, 16000, 385, &[]),
            request(IoOp::Discard { secure: false }, 0, 16385, &[]),
            request(IoOp::Discard { secure: false }, 1, u64::MAX, &[]),
            // A count that understates (or overstates) what the segments carry.
            request(IoOp::Write, 16376, 1, &eight),
            request(IoOp::Write, 16383, 1, &eight),
            request(IoOp::Read, 0, 16, &short),
            request(IoOp::Read, 0, 8, &long),
            request(IoOp::Read, 0, u64::MAX, &eight),
            request(IoOp::Write, 0, 1, &[]),
        ] {
            assert_eq!(
                slice.submit(&r, &NoBuffers),
                Err(SubmitError::Invalid),
                "{r:?}"
            );
        }
        assert!(slice.inner().seen.is_empty());
        // The last sector, and the whole slice, are inside.
        assert_eq!(
            slice.submit(&request(IoOp::Read, 16383, 1, &one), &NoBuffers),
            Ok(())
        );
        assert_eq!(
            slice.submit(
                &request(IoOp::Discard { secure: false }, 0, 16384, &[]),
                &NoBuffers
            ),
            Ok(())
        );
        assert_eq!(slice.inner().seen.len(), 2);
    }

    #[test]
    fn slices_must_lie_on_the_device() {
        let make = |sectors, block, start, len| {
            Slice::new(Recorder::new(sectors, block), start, len).map(|s| s.sectors())
        };
        assert_eq!(make(4096, 512, 0, 4096).ok(), Some(4096));
        assert_eq!(make(4096, 512, 4095, 1).ok(), Some(1));
        let err = |r: Result<u64, (Recorder, SliceError)>| r.unwrap_err().1;
        assert_eq!(err(make(4096, 512, 0, 0)), SliceError::Empty);
        assert_eq!(
            err(make(4096, 512, 4095, 2)),
            SliceError::BeyondDevice {
                end: Some(4097),
                capacity: 4096
            }
        );
        assert_eq!(
            err(make(4096, 512, u64::MAX, 2)),
            SliceError::BeyondDevice {
                end: None,
                capacity: 4096
            }
        );
        assert_eq!(
            err(make(4096, 4096, 4, 8)),
            SliceError::NotWholeBlocks {
                logical_block_size: 4096
            }
        );
        assert_eq!(
            err(make(4096, 4096, 8, 12)),
            SliceError::NotWholeBlocks {
                logical_block_size: 4096
            }
        );
        assert_eq!(make(4096, 4096, 8, 16).ok(), Some(16));
        // The device comes back on error, untouched.
        let (device, _) = Slice::new(Recorder::new(64, 512), 0, 65).unwrap_err();
        assert_eq!(device.geometry().sectors, 64);
        assert_eq!(
            SliceError::BeyondDevice {
                end: Some(4097),
                capacity: 4096
            }
            .to_string(),
            "the slice ends at sector 4097, beyond the device's 4096"
        );
    }

    /// Two slices of one RAM disk: each reads its own writes at its own place, and a
    /// byte next to a slice is never touched.
    #[test]
    fn data_lands_inside_the_slice() {
        let disk = RamDisk::new(64);
        let marker = vec![0xa5u8; 64 * 512];
        disk.write_at(0, &marker);
        let mut a: Slice<RamDiskQueue> = Slice::new(disk.queue(4), 8, 16).unwrap();
        let mut b = Slice::new(disk.queue(4), 24, 16).unwrap();
        let buffers = Pages::default();
        let data = pages(24);
        for (n, s) in data.iter().enumerate() {
            buffers.write_buffer(s.buffer, 0, &[n as u8 + 1; 4096]);
        }
        let mut finished = Vec::new();
        assert_eq!(
            a.submit(&request(IoOp::Write, 0, 16, &data[..2]), &buffers),
            Ok(())
        );
        a.poll_completions(&mut |c| finished.push(c.status));
        assert_eq!(
            b.submit(&request(IoOp::Write, 8, 8, &data[2..3]), &buffers),
            Ok(())
        );
        b.poll_completions(&mut |c| finished.push(c.status));
        assert_eq!(finished, [IoStatus::Ok; 2]);
        let mut all = vec![0u8; 64 * 512];
        disk.read_at(0, &mut all);
        assert!(all[..8 * 512].iter().all(|b| *b == 0xa5));
        assert!(all[8 * 512..16 * 512].iter().all(|b| *b == 1));
        assert!(all[16 * 512..24 * 512].iter().all(|b| *b == 2));
        assert!(all[24 * 512..32 * 512].iter().all(|b| *b == 0xa5));
        assert!(all[32 * 512..40 * 512].iter().all(|b| *b == 3));
        assert!(all[40 * 512..].iter().all(|b| *b == 0xa5));
        // Slice b reads back sector 8 of its own, not of the disk.
        let out = [DmaSegment {
            buffer: 0x90_0000,
            offset: 0,
            len: 512,
        }];
        assert_eq!(b.submit(&request(IoOp::Read, 8, 1, &out), &buffers), Ok(()));
        b.poll_completions(&mut |_| {});
        let mut sector = [0u8; 512];
        buffers.read_buffer(0x90_0000, 0, &mut sector);
        assert_eq!(sector, [3; 512]);
        // A discard of slice a drops its sectors only.
        assert_eq!(
            a.submit(
                &request(IoOp::Discard { secure: true }, 0, 16, &[]),
                &buffers
            ),
            Ok(())
        );
        a.poll_completions(&mut |_| {});
        disk.read_at(0, &mut all);
        assert!(all[..8 * 512].iter().all(|b| *b == 0xa5));
        assert!(all[8 * 512..24 * 512].iter().all(|b| *b == 0));
        assert!(all[24 * 512..32 * 512].iter().all(|b| *b == 0xa5));
    }

    #[test]
    fn a_shared_length_grows_for_every_queue_of_the_slice() {
        let capacity = SharedCapacity::new(16);
        let mut first = Slice::shared(Recorder::new(1 << 20, 512), 2048, &capacity).unwrap();
        let mut second = Slice::shared(Recorder::new(1 << 20, 512), 2048, &capacity).unwrap();
        let data = pages(8);
        let buffers = NoBuffers;
        let beyond = request(IoOp::Write, 16, 8, &data[..1]);
        assert_eq!(first.submit(&beyond, &buffers), Err(SubmitError::Invalid));
        assert_eq!(second.submit(&beyond, &buffers), Err(SubmitError::Invalid));
        capacity.set(64);
        for slice in [&mut first, &mut second] {
            assert_eq!(slice.geometry().sectors, 64);
            assert_eq!(slice.sectors(), 64);
            assert_eq!(slice.submit(&beyond, &buffers), Ok(()));
            assert_eq!(
                slice.inner().seen.last(),
                Some(&(IoOp::Write, 2064, 8, false))
            );
        }
        // Still nothing past the new end.
        let past = request(IoOp::Discard { secure: false }, 60, 8, &[]);
        assert_eq!(first.submit(&past, &buffers), Err(SubmitError::Invalid));
    }
}
