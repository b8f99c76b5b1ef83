// SPDX-License-Identifier: MIT OR Apache-2.0
//! Bounce buffers for a disk the device model emulates, under Xen. qemu-xen reaches an HVM
//! domain's memory only through its map of guest RAM, and foreign grants are mapped above
//! RAM, so such a device cannot DMA to them (writes would store leftovers, reads land
//! nowhere). Each data segment goes through a page of this queue's own pool, in
//! RAM: copied in from the grant before a write is submitted, copied out to the grant
//! when a read completes (before the engine hears of it, while the grant is still mapped).
//! Passed-through devices DMA through the IOMMU, which sees grant mappings: no bounce.
//!
//! A failed queue (`BlockDevice::fault`: a command past its deadline) answers what it
//! held with errors while an emulated device may still be working on it: QEMU maps a
//! command's memory when it starts it, so turning bus mastering off does not stop it
//! writing a read's data there when it finally completes (tier 2 shows it). That
//! data lands in this pool only: a read's data is copied out to the guest on success
//! alone, and the failed queue never uses a page of the pool again.

use super::hal::allocate_dma;
use super::open::Queue;
use crate::physmem;
use alloc::sync::Arc;
use alloc::vec::Vec;
use blkdev::{
    BlockDevice, BufferAccess, Completion, DeviceFault, DmaSegment, IoOp, IoRequest, IoStatus,
    SubmitError,
};
use core::sync::atomic::{AtomicU64, Ordering};

const PAGE: usize = 4096;
/// Pages per queue: room for the largest request (512 indirect segments) twice over.
pub const POOL_PAGES: usize = 1024;

/// One segment of a request in flight: its bounce page and, for a read, where its data
/// goes on completion.
#[derive(Clone, Copy)]
struct Piece {
    page: u16,
    /// A read's destination: the frontend's bytes as `BufferAccess::cpu_address`
    /// checked them at submit (0 for a write, which copies nothing out).
    target: u64,
    offset: u32,
    len: u32,
}

/// The bounce state of one tag (reused, so the hot path does not allocate once warm).
#[derive(Default)]
struct InFlight {
    active: bool,
    read: bool,
    pieces: Vec<Piece>,
}

pub struct BounceQueue {
    inner: Queue,
    /// Physical (= identity-mapped virtual) address of the pool's first page.
    pool: u64,
    free: Vec<u16>,
    in_flight: Vec<InFlight>,
    segments: Vec<DmaSegment>,
    /// Bytes copied through the pool (in and out), shared by the device's queues: a
    /// device that should DMA straight to grants shows here if it does not.
    bounced_bytes: Arc<AtomicU64>,
}

impl BounceQueue {
    pub fn new(inner: Queue, bounced_bytes: Arc<AtomicU64>) -> Option<BounceQueue> {
        // Zeroed: the heap hands back memory other disks' guests wrote (a RAM disk's
        // stripes, another pool), and a device that reports a read done without writing
        // all of it (short, or faulty) would have that copied out to this guest.
        let pool = allocate_dma(POOL_PAGES)?;
        Some(BounceQueue {
            inner,
            pool,
            free: (0..POOL_PAGES as u16).rev().collect(),
            in_flight: Vec::new(),
            segments: Vec::with_capacity(POOL_PAGES),
            bounced_bytes,
        })
    }
}

/// Address of page `page` of a pool starting at `pool`.
fn page_address(pool: u64, page: u16) -> u64 {
    pool + page as u64 * PAGE as u64
}

impl BlockDevice for BounceQueue {
    blkdev::forward_to!(inner: geometry, queue_depth, tick);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        if request.segments.is_empty() || self.inner.fault().is_some() {
            // A failed queue answers without the device, and without a page.
            return self.inner.submit(request, buffers);
        }
        if request.segments.len() > POOL_PAGES {
            return Err(SubmitError::Invalid);
        }
        if request.segments.len() > self.free.len() {
            // Pages come back as requests complete; the engine retries.
            return Err(SubmitError::QueueFull);
        }
        let tag = request.tag as usize;
        if self.in_flight.len() <= tag {
            self.in_flight.resize_with(tag + 1, InFlight::default);
        }
        let read = request.op == IoOp::Read;
        self.segments.clear();
        let mut pieces = core::mem::take(&mut self.in_flight[tag].pieces);
        pieces.clear();
        let mut copied = true;
        for segment in request.segments {
            let (offset, len) = (segment.offset as usize, segment.len as usize);
            let Some(page) = self.free.pop() else {
                copied = false;
                break;
            };
            let address = page_address(self.pool, page);
            // A read's data is copied out on completion, when `buffers` is gone: its
            // destination is checked now, by the same check as every other access.
            let target = if read {
                buffers.cpu_address(segment.buffer, offset, len)
            } else {
                Some(0)
            };
            pieces.push(Piece {
                page,
                target: target.unwrap_or(0),
                offset: segment.offset,
                len: segment.len,
            });
            if offset + len > PAGE || target.is_none() {
                copied = false;
                break;
            }
            if !read {
                // SAFETY: `page` came off this queue's free list: a page of the pool it
                // allocated, which no device request uses now; offset + len <= PAGE.
                let bounce = unsafe { physmem::bytes_mut(address + offset as u64, len) };
                if !buffers.read_buffer(segment.buffer, offset, bounce) {
                    copied = false;
                    break;
                }
            }
            self.segments.push(DmaSegment {
                buffer: address,
                offset: segment.offset,
                len: segment.len,
            });
        }
        let submitted = if copied {
            if !read {
                let bytes: u64 = self.segments.iter().map(|s| u64::from(s.len)).sum();
                self.bounced_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            let bounced = IoRequest {
                segments: &self.segments,
                ..*request
            };
            self.inner.submit(&bounced, buffers)
        } else {
            Err(SubmitError::Invalid)
        };
        if submitted.is_err() {
            self.free.extend(pieces.iter().map(|p| p.page));
            pieces.clear();
        }
        let entry = &mut self.in_flight[tag];
        entry.pieces = pieces;
        entry.active = submitted.is_ok();
        entry.read = read;
        submitted
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let pool = self.pool;
        let (in_flight, free) = (&mut self.in_flight, &mut self.free);
        let bounced_bytes = &self.bounced_bytes;
        self.inner.poll_completions(&mut |completion| {
            if let Some(entry) = in_flight.get_mut(completion.tag as usize) {
                if entry.active {
                    for piece in &entry.pieces {
                        if entry.read && completion.status == IoStatus::Ok {
                            let from = page_address(pool, piece.page) + piece.offset as u64;
                            // SAFETY: `from` is inside this queue's pool page, which the
                            // device has finished with (its completion is here); `target`
                            // is what `BufferAccess::cpu_address` gave at submit for
                            // these `len` bytes (inside a page holding a grant mapped for
                            // this request), which stays mapped until `sink` tells the
                            // engine the request is done.
                            unsafe { physmem::copy(from, piece.target, piece.len as usize) };
                            bounced_bytes.fetch_add(u64::from(piece.len), Ordering::Relaxed);
                        }
                        free.push(piece.page);
                    }
                    entry.active = false;
                }
            }
            sink(completion)
        })
    }

    /// A failed queue's pages are reused by local answers only: the device, stopped,
    /// never gets another request, and an error's pages are not copied out.
    fn fault(&self) -> Option<DeviceFault> {
        self.inner.fault()
    }
}
