// SPDX-License-Identifier: MIT OR Apache-2.0
//! Bounce buffers for a disk the device model emulates, under Xen. qemu-xen reaches an HVM
//! domain's memory only through its map of guest RAM, and foreign grants are mapped above
//! RAM, so such a device cannot DMA to them (writes would store leftovers, reads land
//! nowhere). Each data segment goes through a page of this queue's own pool, in
//! RAM: copied in from the guest's page before a write is submitted, copied out to it
//! when a read completes (before the engine hears of it, while the request is its own).
//! Passed-through devices DMA through the IOMMU, which sees grant mappings: no bounce.
//!
//! The rings of such a disk map no data grant at all (`EngineConfig::grant_copy`): their
//! segments name the guest's grants (`BufferAccess::foreign_page`), and the copies in and
//! out are `GNTTABOP_copy` batches, one hypercall per request each way, as QEMU's
//! xen-block does with `xengnttab_grant_copy`. An unmap of a grant makes Xen ask the
//! device model to invalidate its map cache, and qemu-xen answers only once every disk
//! request it holds is done: a disk that maps nothing cannot stall a vCPU that way. A
//! copy that fails (per-entry status) fails its request alone: a write is refused before
//! the device sees it, a read is reported as an error. Buffers that are mapped (tier 2's
//! self-tests, which bounce without Xen) are copied by the CPU as before.
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
    BlockDevice, BufferAccess, Completion, DeviceFault, DmaSegment, ForeignPage, IoOp, IoRequest,
    IoStatus, SubmitError,
};
use core::sync::atomic::{AtomicU64, Ordering};
use xen::abi::grant_table::GnttabCopy;
use xen::grant::{copy_batch, copy_request, CopySide};
use xen::raw::hypercall::NativeHypervisor;

const PAGE: usize = 4096;
/// Pages per queue: room for the largest request (512 indirect segments) twice over.
pub const POOL_PAGES: usize = 1024;

/// One segment of a request in flight, kept at the index of its bounce page (a page is
/// in one request at a time): for a read, where its data goes on completion.
#[derive(Clone, Copy)]
struct Piece {
    /// The request's next page, or `NO_PAGE`.
    next: u16,
    /// A read's destination: the frontend's bytes as `BufferAccess::cpu_address`
    /// checked them at submit (0 for a write, which copies nothing out, and for a
    /// foreign page).
    target: u64,
    /// A read's destination when its buffer is a foreign page: copied with the
    /// hypervisor.
    foreign: Option<ForeignPage>,
    offset: u32,
    len: u32,
}

/// The `GNTTABOP_copy` entry between `len` bytes at `offset` of a pool page at `local`
/// and the same offset of `page` (in: from the guest's page).
fn grant_copy(page: ForeignPage, local: u64, offset: u32, len: u32, to_guest: bool) -> GnttabCopy {
    let ours = CopySide::Local {
        gfn: local >> 12,
        offset: offset as u16,
    };
    let theirs = CopySide::Grant {
        dom: page.domain,
        gref: page.gref,
        offset: offset as u16,
    };
    if to_guest {
        copy_request(ours, theirs, len as u16)
    } else {
        copy_request(theirs, ours, len as u16)
    }
}

/// Log a failed copy batch: the first few, then at powers of two (a guest that revokes
/// its grants must not flood the console).
fn log_copy_failure(failures: &AtomicU64, what: &str, error: &dyn core::fmt::Display) {
    let count = failures.fetch_add(1, Ordering::Relaxed) + 1;
    if count <= 16 || count.is_power_of_two() {
        log::warn!("bounce: grant copy {what} failed ({count} so far): {error}; request answered with an error");
    }
}

/// The end of a request's chain of pages.
const NO_PAGE: u16 = u16::MAX;
/// Tags a queue keeps room for when it is made: a ring's slots, the engine's tags.
const TAGS: usize = blkback::abi::ring_slots(blkback::abi::MAX_RING_PAGE_ORDER) as usize;

/// The bounce state of one tag: its pages are a chain through `BounceQueue::pieces`.
#[derive(Clone, Copy)]
struct InFlight {
    active: bool,
    read: bool,
    first: u16,
}

const IDLE: InFlight = InFlight {
    active: false,
    read: false,
    first: NO_PAGE,
};

pub struct BounceQueue {
    inner: Queue,
    /// Physical (= identity-mapped virtual) address of the pool's first page.
    pool: u64,
    free: Vec<u16>,
    /// One per pool page. With `in_flight` and `segments`, made with the queue: the
    /// I/O path allocates nothing, however many segments a guest's requests carry.
    pieces: Vec<Piece>,
    in_flight: Vec<InFlight>,
    segments: Vec<DmaSegment>,
    /// One request's grant copies (in at submit, out at completion), one entry per page
    /// of the pool at most: made with the queue.
    copies: Vec<GnttabCopy>,
    /// What issues them (`None` without Xen: no buffer is then foreign).
    hv: Option<NativeHypervisor>,
    /// Copy batches that failed, for the log's rate limit.
    copy_failures: AtomicU64,
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
        let unused = Piece {
            next: NO_PAGE,
            target: 0,
            foreign: None,
            offset: 0,
            len: 0,
        };
        Some(BounceQueue {
            inner,
            pool,
            free: (0..POOL_PAGES as u16).rev().collect(),
            pieces: alloc::vec![unused; POOL_PAGES],
            in_flight: alloc::vec![IDLE; TAGS],
            segments: Vec::with_capacity(POOL_PAGES),
            copies: Vec::with_capacity(POOL_PAGES),
            hv: crate::xen_domain::get().map(|xen| xen.hv),
            copy_failures: AtomicU64::new(0),
            bounced_bytes,
        })
    }

    /// Puts the pages of the chain from `first` back on the free list.
    fn give_back(&mut self, mut page: u16) {
        while let Some(piece) = self.pieces.get(usize::from(page)) {
            self.free.push(page);
            page = piece.next;
        }
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
            // Beyond a ring's slots: the test hooks' tags alone; taken fallibly.
            let more = tag + 1 - self.in_flight.len();
            self.in_flight
                .try_reserve_exact(more)
                .map_err(|_| SubmitError::Invalid)?;
            self.in_flight.resize(tag + 1, IDLE);
        }
        let read = request.op == IoOp::Read;
        self.segments.clear();
        self.copies.clear();
        let (mut first, mut last) = (NO_PAGE, NO_PAGE);
        let mut copied = true;
        for segment in request.segments {
            let (offset, len) = (segment.offset as usize, segment.len as usize);
            let Some(page) = self.free.pop() else {
                copied = false;
                break;
            };
            let address = page_address(self.pool, page);
            let foreign = buffers.foreign_page(segment.buffer);
            // A read's data is copied out on completion, when `buffers` is gone: its
            // destination is checked now, by the same check as every other access (a
            // foreign page is checked by Xen, at each copy).
            let target = if read && foreign.is_none() {
                buffers.cpu_address(segment.buffer, offset, len)
            } else {
                Some(0)
            };
            self.pieces[usize::from(page)] = Piece {
                next: NO_PAGE,
                target: target.unwrap_or(0),
                foreign: if read { foreign } else { None },
                offset: segment.offset,
                len: segment.len,
            };
            match self.pieces.get_mut(usize::from(last)) {
                Some(previous) => previous.next = page,
                None => first = page,
            }
            last = page;
            if offset + len > PAGE || target.is_none() {
                copied = false;
                break;
            }
            if let (false, Some(foreign)) = (read, foreign) {
                // Copied with the rest of the request's, below.
                self.copies.push(grant_copy(
                    foreign,
                    address,
                    segment.offset,
                    segment.len,
                    false,
                ));
            } else if !read {
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
        if copied && !self.copies.is_empty() {
            // The write's pages from the guest's grants, in one call; one entry that
            // fails refuses the request (the engine answers it with an error).
            copied = match self.hv.map(|hv| copy_batch(&hv, &mut self.copies)) {
                Some(Ok(())) => true,
                Some(Err(error)) => {
                    log_copy_failure(&self.copy_failures, "in", &error);
                    false
                }
                None => false,
            };
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
            self.give_back(first);
        }
        self.in_flight[tag] = InFlight {
            active: submitted.is_ok(),
            read,
            first: if submitted.is_ok() { first } else { NO_PAGE },
        };
        submitted
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let pool = self.pool;
        let (in_flight, pieces, free) = (&mut self.in_flight, &self.pieces, &mut self.free);
        let (copies, hv, copy_failures) = (&mut self.copies, self.hv, &self.copy_failures);
        let bounced_bytes = &self.bounced_bytes;
        self.inner.poll_completions(&mut |mut completion| {
            if let Some(entry) = in_flight.get_mut(completion.tag as usize) {
                if entry.active {
                    copies.clear();
                    let mut page = entry.first;
                    while let Some(piece) = pieces.get(usize::from(page)) {
                        let done = entry.read && completion.status == IoStatus::Ok;
                        if let (true, Some(foreign)) = (done, piece.foreign) {
                            // The page goes back to the free list now, but nothing takes
                            // it before this closure's copy below.
                            let local = page_address(pool, page);
                            copies.push(grant_copy(foreign, local, piece.offset, piece.len, true));
                        } else if done {
                            let from = page_address(pool, page) + piece.offset as u64;
                            // SAFETY: `from` is inside this queue's pool page, which the
                            // device has finished with (its completion is here); `target`
                            // is what `BufferAccess::cpu_address` gave at submit for
                            // these `len` bytes (inside a page holding a grant mapped for
                            // this request), which stays mapped until `sink` tells the
                            // engine the request is done.
                            unsafe { physmem::copy(from, piece.target, piece.len as usize) };
                            bounced_bytes.fetch_add(u64::from(piece.len), Ordering::Relaxed);
                        }
                        free.push(page);
                        page = piece.next;
                    }
                    *entry = IDLE;
                    if !copies.is_empty() {
                        // The read's data to the guest's grants, in one call; one entry
                        // that fails makes the request an error.
                        match hv.map(|hv| copy_batch(&hv, copies)) {
                            Some(Ok(())) => {
                                let bytes: u64 = copies.iter().map(|c| u64::from(c.len)).sum();
                                bounced_bytes.fetch_add(bytes, Ordering::Relaxed);
                            }
                            Some(Err(error)) => {
                                log_copy_failure(copy_failures, "out", &error);
                                completion.status = IoStatus::Error;
                            }
                            None => completion.status = IoStatus::Error,
                        }
                    }
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
