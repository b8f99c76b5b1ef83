// SPDX-License-Identifier: MIT OR Apache-2.0
//! Bounce buffers: a queue whose device cannot reach the guests' pages (under Xen, a disk
//! the device model emulates: qemu-xen DMAs only into guest RAM as its memory map knows
//! it, and foreign grants are mapped above RAM). Each data segment goes through a page
//! of the queue's own pool: copied in from the guest's page before a write is submitted,
//! copied out to it when a read completes (before the engine hears of it, while the
//! request is its own). The kernel gives the pool and the copies ([`BouncePool`]: pages
//! in its RAM, `GNTTABOP_copy`); this is the bookkeeping, which host tests drive with a
//! pool of their own.
//!
//! A ring that copies maps no data grant (`EngineConfig::grant_copy`): its segments name
//! the guest's grants (`BufferAccess::foreign_page`), and the copies in and out are
//! batches, one per request each way. A copy that fails (an entry's status) fails its
//! request alone: a write is refused before the device sees it, a read is reported as an
//! error. Buffers that are mapped (tier 2's self-tests, which bounce without Xen) are
//! copied by the CPU.
//!
//! A write copied in when the device queue turns out full is kept, pages and all, and
//! submitted from `poll_completions` once the device has room: its data is copied from
//! the guest once, however long the device stays full. Until then the queue takes no
//! other request (`QueueFull` before any copy), so requests keep their order.
//!
//! A failed queue (`BlockDevice::fault`: a command past its deadline) answers what it
//! held with errors while an emulated device may still be working on it: QEMU maps a
//! command's memory when it starts it, so turning bus mastering off does not stop it
//! writing a read's data there when it finally completes. That data lands in the pool
//! only: a read's data is copied out to the guest on success alone, and the failed queue
//! never uses a page of the pool again.

use crate::{
    BlockDevice, BufferAccess, Completion, DeviceFault, DmaSegment, ForeignPage, IoOp, IoRequest,
    IoStatus, NoBuffers, SubmitError,
};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

pub const PAGE: usize = 4096;
/// Pages per queue: room for the largest request (512 indirect segments) twice over.
pub const POOL_PAGES: usize = 1024;

/// One copy between `len` bytes at `offset` of pool page `page` and the same bytes of a
/// guest's granted page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopy {
    pub page: u16,
    pub foreign: ForeignPage,
    pub offset: u32,
    pub len: u32,
    /// Out (a read's data, to the guest), or in (a write's, from it).
    pub to_guest: bool,
}

/// The pool's pages and how data moves in and out of them. Every page number given is
/// below [`POOL_PAGES`] and off the queue's free list (no device request uses it), and
/// `offset + len` stays inside the page.
pub trait BouncePool {
    /// Why a batch of grant copies failed (logged).
    type CopyError: fmt::Display;
    /// The address the device is given for `page`.
    fn dma_address(&self, page: u16) -> u64;
    /// Bytes `offset..offset + len` of `page` from `buffer` at the same offset, through
    /// `buffers` (a mapped buffer); false if `buffers` refuses.
    fn fill(
        &mut self,
        page: u16,
        offset: usize,
        len: usize,
        buffers: &dyn BufferAccess,
        buffer: u64,
    ) -> bool;
    /// Bytes `offset..offset + len` of `page` to `target`, an address
    /// `BufferAccess::cpu_address` gave for them at submit (still mapped: the request
    /// has not completed yet).
    fn copy_out(&mut self, page: u16, offset: usize, len: usize, target: u64);
    /// One request's grant copies, in one batch: an error if any of them failed.
    fn grant_copy(&mut self, copies: &[PageCopy]) -> Result<(), Self::CopyError>;
}

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

const UNUSED: Piece = Piece {
    next: NO_PAGE,
    target: 0,
    foreign: None,
    offset: 0,
    len: 0,
};

/// Log a failed copy batch: the first few, then at powers of two (a guest that revokes
/// its grants must not flood the console).
fn log_copy_failure(failures: &AtomicU64, what: &str, error: &dyn fmt::Display) {
    let count = failures.fetch_add(1, Ordering::Relaxed) + 1;
    if count <= 16 || count.is_power_of_two() {
        log::warn!("bounce: grant copy {what} failed ({count} so far): {error}; request answered with an error");
    }
}

/// The end of a request's chain of pages.
const NO_PAGE: u16 = u16::MAX;

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

/// A write copied in that the device had no room for: its segments are in
/// `BounceQueue::segments`, its pages in flight under its tag.
#[derive(Clone, Copy)]
struct Kept {
    tag: u32,
    op: IoOp,
    sector: u64,
    nr_sectors: u64,
    preflush: bool,
}

pub struct BounceQueue<D, P> {
    inner: D,
    pool: P,
    free: Vec<u16>,
    /// One per pool page. With `in_flight`, `segments` and `copies`, made with the queue:
    /// the I/O path allocates nothing, however many segments a guest's requests carry.
    pieces: Vec<Piece>,
    in_flight: Vec<InFlight>,
    /// The segments of the request being submitted, or of the kept one.
    segments: Vec<DmaSegment>,
    /// One request's grant copies (in at submit, out at completion).
    copies: Vec<PageCopy>,
    kept: Option<Kept>,
    /// Copy batches that failed, for the log's rate limit.
    copy_failures: AtomicU64,
    /// Bytes copied through the pool (in and out), shared by the device's queues: a
    /// device that should DMA straight to grants shows here if it does not.
    bounced_bytes: Arc<AtomicU64>,
}

impl<D: BlockDevice, P: BouncePool> BounceQueue<D, P> {
    /// `inner` behind the pages of `pool`, with room for tags below `tags` (a ring's
    /// slots; others are taken fallibly when they come).
    pub fn new(inner: D, pool: P, tags: usize, bounced_bytes: Arc<AtomicU64>) -> Self {
        BounceQueue {
            inner,
            pool,
            free: (0..POOL_PAGES as u16).rev().collect(),
            pieces: alloc::vec![UNUSED; POOL_PAGES],
            in_flight: alloc::vec![IDLE; tags],
            segments: Vec::with_capacity(POOL_PAGES),
            copies: Vec::with_capacity(POOL_PAGES),
            kept: None,
            copy_failures: AtomicU64::new(0),
            bounced_bytes,
        }
    }

    /// The pool (tests look at its pages).
    pub fn pool(&self) -> &P {
        &self.pool
    }

    /// The queue it bounces for.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Puts the pages of the chain from `first` back on the free list.
    fn give_back(&mut self, mut page: u16) {
        while let Some(piece) = self.pieces.get(usize::from(page)) {
            self.free.push(page);
            page = piece.next;
        }
    }

    /// Takes pages for `request`'s segments and fills a write's: `Ok(first page)` with
    /// `segments` ready for the device, or `Err(first page)` (pages to give back) when a
    /// buffer is refused or a copy fails.
    fn stage(&mut self, request: &IoRequest<'_>, buffers: &dyn BufferAccess) -> Result<u16, u16> {
        let read = request.op == IoOp::Read;
        self.segments.clear();
        self.copies.clear();
        let (mut first, mut last) = (NO_PAGE, NO_PAGE);
        for segment in request.segments {
            let (offset, len) = (segment.offset as usize, segment.len as usize);
            let Some(page) = self.free.pop() else {
                return Err(first);
            };
            let foreign = buffers.foreign_page(segment.buffer);
            // A read's data is copied out on completion, when `buffers` is gone: its
            // destination is checked now, by the same check as every other access (a
            // foreign page is checked by the hypervisor, at each copy).
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
                return Err(first);
            }
            if let (false, Some(foreign)) = (read, foreign) {
                // Copied with the rest of the request's, below.
                self.copies.push(PageCopy {
                    page,
                    foreign,
                    offset: segment.offset,
                    len: segment.len,
                    to_guest: false,
                });
            } else if !read && !self.pool.fill(page, offset, len, buffers, segment.buffer) {
                return Err(first);
            }
            self.segments.push(DmaSegment {
                buffer: self.pool.dma_address(page),
                offset: segment.offset,
                len: segment.len,
            });
        }
        if !self.copies.is_empty() {
            // The write's pages from the guest's grants, in one batch; one entry that
            // fails refuses the request (the engine answers it with an error).
            if let Err(error) = self.pool.grant_copy(&self.copies) {
                log_copy_failure(&self.copy_failures, "in", &error);
                return Err(first);
            }
        }
        if !read {
            let bytes: u64 = self.segments.iter().map(|s| u64::from(s.len)).sum();
            self.bounced_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        Ok(first)
    }

    /// Gives the kept request to the device if it has room now: `Some(completion)` when
    /// the device refused it for good (it is then answered with an error).
    fn submit_kept(&mut self) -> Option<Completion> {
        let kept = self.kept?;
        let request = IoRequest {
            tag: kept.tag,
            op: kept.op,
            sector: kept.sector,
            nr_sectors: kept.nr_sectors,
            preflush: kept.preflush,
            segments: &self.segments,
        };
        // A device behind bounce buffers DMAs to the pool: it needs no buffer access.
        match self.inner.submit(&request, &NoBuffers) {
            Ok(()) => {
                self.kept = None;
                None
            }
            Err(SubmitError::QueueFull) => None,
            Err(SubmitError::Invalid) => {
                self.kept = None;
                let entry = core::mem::replace(&mut self.in_flight[kept.tag as usize], IDLE);
                self.give_back(entry.first);
                Some(Completion {
                    tag: kept.tag,
                    status: IoStatus::Error,
                })
            }
        }
    }
}

impl<D: BlockDevice, P: BouncePool> BlockDevice for BounceQueue<D, P> {
    crate::forward_to!(inner: geometry, queue_depth, tick);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        if self.inner.fault().is_some() {
            // A failed queue answers without the device, and without a page.
            return self.inner.submit(request, buffers);
        }
        if self.kept.is_some() {
            // Nothing passes the kept request (it goes first once the device has room).
            return Err(SubmitError::QueueFull);
        }
        if request.segments.is_empty() {
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
        let first = match self.stage(request, buffers) {
            Ok(first) => first,
            Err(first) => {
                self.give_back(first);
                return Err(SubmitError::Invalid);
            }
        };
        let bounced = IoRequest {
            segments: &self.segments,
            ..*request
        };
        match self.inner.submit(&bounced, buffers) {
            Ok(()) => {}
            Err(SubmitError::QueueFull) if !read => {
                // Copied in already: kept, and submitted when the device has room, so
                // the guest's data is not copied again.
                self.kept = Some(Kept {
                    tag: request.tag,
                    op: request.op,
                    sector: request.sector,
                    nr_sectors: request.nr_sectors,
                    preflush: request.preflush,
                });
            }
            Err(error) => {
                self.give_back(first);
                return Err(error);
            }
        }
        self.in_flight[tag] = InFlight {
            active: true,
            read,
            first,
        };
        Ok(())
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let (in_flight, pieces, free) = (&mut self.in_flight, &self.pieces, &mut self.free);
        let (copies, pool, copy_failures) = (&mut self.copies, &mut self.pool, &self.copy_failures);
        let bounced_bytes = &self.bounced_bytes;
        let mut done = self.inner.poll_completions(&mut |mut completion| {
            if let Some(entry) = in_flight.get_mut(completion.tag as usize) {
                if entry.active {
                    copies.clear();
                    let mut page = entry.first;
                    while let Some(piece) = pieces.get(usize::from(page)) {
                        let out = entry.read && completion.status == IoStatus::Ok;
                        if let (true, Some(foreign)) = (out, piece.foreign) {
                            // The page goes back to the free list now, but nothing takes
                            // it before this closure's copy below.
                            copies.push(PageCopy {
                                page,
                                foreign,
                                offset: piece.offset,
                                len: piece.len,
                                to_guest: true,
                            });
                        } else if out {
                            let (offset, len) = (piece.offset as usize, piece.len as usize);
                            pool.copy_out(page, offset, len, piece.target);
                            bounced_bytes.fetch_add(u64::from(piece.len), Ordering::Relaxed);
                        }
                        free.push(page);
                        page = piece.next;
                    }
                    *entry = IDLE;
                    if !copies.is_empty() {
                        // The read's data to the guest's grants, in one batch; one entry
                        // that fails makes the request an error.
                        match pool.grant_copy(copies) {
                            Ok(()) => {
                                let bytes: u64 = copies.iter().map(|c| u64::from(c.len)).sum();
                                bounced_bytes.fetch_add(bytes, Ordering::Relaxed);
                            }
                            Err(error) => {
                                log_copy_failure(copy_failures, "out", &error);
                                completion.status = IoStatus::Error;
                            }
                        }
                    }
                }
            }
            sink(completion)
        });
        // The device may have room now for the write kept for it.
        if let Some(refused) = self.submit_kept() {
            sink(refused);
            done += 1;
        }
        done
    }

    /// A failed queue's pages are reused by local answers only: the device, stopped,
    /// never gets another request, and an error's pages are not copied out.
    fn fault(&self) -> Option<DeviceFault> {
        self.inner.fault()
    }
}

#[cfg(test)]
mod tests;
