// SPDX-License-Identifier: MIT OR Apache-2.0
//! A RAM disk: the backing store for PVH mode and for tests. Queues are separate handles
//! over one shared store; each keeps its own completion FIFO.
//!
//! Reads and writes are copied during `submit` (the pages they name are reachable only
//! then); the engine bounds one request at 2 MiB (512 segments of 4 KiB). Discards have
//! no such bound (Linux's blkfront sends one discard for the whole disk at mkfs), so a
//! queue works through them a bounded piece per `poll_completions` and completes each once
//! all of it is done: one discard never stalls the other rings of its poller.
//!
//! The store is 64 KiB stripes, each locked on its own, all backed by memory when the disk
//! is made or grows. A discard gives memory back as Linux's brd does: a stripe it covers
//! whole is marked zero at once (it reads back as zeroes from then on), the partial ends
//! are zeroed in place; the control path's [`RamDisk::maintain`] then frees the memory of
//! zero stripes (and of stripes a partial discard left all zero), looking only at the
//! stripes discards noted, a bounded piece per call. Memory goes back to the heap zeroed
//! (a freed stripe's, or a dropped disk's): the heap's next user never sees a guest's
//! data. The I/O path never
//! allocates or frees: a write into a stripe whose memory went back takes a stripe from
//! the disk's spare ones (refilled by `maintain`, from freed stripes or, when asked, from
//! the heap); with none spare the write waits (`QueueFull`: the engine retries it) and the
//! disk asks for memory (`wants_memory`, and the signal it was made with). Given the
//! heap's budget ([`crate::HeapBudget`]), the disk takes memory only from its room (never
//! the control path's reserve), and what it gave back stays promised to it there: no
//! other disk or ring takes what its guest's next writes will want. The disk can
//! grow and shrink while queues serve it ([`RamDisk::resize`]): its capacity is one atomic
//! every queue reads per request.

mod adopt;
mod discard;
mod maintain;
mod memory;
mod resize;
mod stripes;
#[cfg(test)]
mod tests;

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use spin::{Mutex, MutexGuard, Once};

use crate::{
    BlockDevice, BufferAccess, Completion, CompletionQueue, DiscardGeometry, Geometry, HeapBudget,
    IoOp, IoRequest, IoStatus, SubmitError, SECTOR_SIZE,
};
pub use adopt::{AdoptError, HandedStripe};
use discard::PendingDiscard;
pub use maintain::Maintenance;
#[cfg(test)]
pub(crate) use memory::fake;
pub use memory::{address_of, StripeArena, StripeFrames};
pub use resize::ResizeError;
pub use stripes::STRIPE_BYTES;
use stripes::{Stop, Store, Stripe, CHUNK_STRIPES, SPARE_STRIPES};

/// Why a RAM disk cannot be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Bytes it needed.
    pub bytes: u64,
}

impl core::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "not enough memory for a RAM disk of {} bytes",
            self.bytes
        )
    }
}

impl core::error::Error for OutOfMemory {}

/// A RAM disk: handles on one shared store (cloning one is another handle).
#[derive(Clone, Debug)]
pub struct RamDisk {
    store: Arc<Store>,
}

impl RamDisk {
    /// A zero-filled disk of `sectors` 512-byte sectors, writable, with flush and
    /// (secure) discard.
    pub fn new(sectors: u64) -> Self {
        Self::with_geometry(Self::plain(sectors))
    }

    /// The geometry of [`RamDisk::new`].
    pub fn plain(sectors: u64) -> Geometry {
        Geometry {
            sectors,
            logical_block_size: SECTOR_SIZE as u32,
            physical_block_size: 4096,
            read_only: false,
            flush: true,
            discard: Some(DiscardGeometry {
                granularity: SECTOR_SIZE as u32,
                alignment: 0,
                secure: true,
            }),
        }
    }

    /// A zero-filled disk with the given geometry (e.g. read-only, 4 KiB sectors). Panics
    /// when the memory cannot be had (tests; the kernel uses [`RamDisk::try_new`]).
    pub fn with_geometry(geometry: Geometry) -> Self {
        Self::try_new(geometry, geometry.sectors, None, None).expect("RAM disk memory")
    }

    /// A zero-filled disk of `geometry`, all of it backed by memory now (allocated
    /// fallibly), able to grow to `max_sectors`; `signal` is set when a write asks for
    /// memory or maintenance has work left (see [`RamDisk::maintain`]). With `heap`, the
    /// disk takes stripes only from its room (refused if they do not fit it now), and
    /// what discards free stays promised to the disk there.
    pub fn try_new(
        geometry: Geometry,
        max_sectors: u64,
        signal: Option<&'static AtomicBool>,
        heap: Option<&'static HeapBudget>,
    ) -> Result<Self, OutOfMemory> {
        let bytes = geometry.sectors * SECTOR_SIZE;
        let out_of_memory = OutOfMemory { bytes };
        let disk = Self::empty(geometry, max_sectors, signal, heap)?;
        if geometry.sectors > 0 {
            disk.grow(0, geometry.sectors).map_err(|_| out_of_memory)?;
        }
        Ok(disk)
    }

    /// A disk of no capacity yet (`try_new` grows it, `adopt` fills it).
    fn empty(
        geometry: Geometry,
        max_sectors: u64,
        signal: Option<&'static AtomicBool>,
        heap: Option<&'static HeapBudget>,
    ) -> Result<Self, OutOfMemory> {
        let bytes = geometry.sectors * SECTOR_SIZE;
        let out_of_memory = OutOfMemory { bytes };
        let max_sectors = max_sectors.max(geometry.sectors);
        let max_stripes =
            usize::try_from((max_sectors * SECTOR_SIZE).div_ceil(STRIPE_BYTES as u64))
                .map_err(|_| out_of_memory)?;
        let mut chunks = Vec::new();
        chunks
            .try_reserve_exact(max_stripes.div_ceil(CHUNK_STRIPES))
            .map_err(|_| out_of_memory)?;
        chunks.resize_with(max_stripes.div_ceil(CHUNK_STRIPES), Once::new);
        let mut spare = Vec::new();
        spare
            .try_reserve_exact(SPARE_STRIPES)
            .map_err(|_| out_of_memory)?;
        let mut noted = Vec::new();
        noted
            .try_reserve_exact(max_stripes.div_ceil(64))
            .map_err(|_| out_of_memory)?;
        noted.resize_with(max_stripes.div_ceil(64), AtomicU64::default);
        let disk = RamDisk {
            store: Arc::new(Store {
                geometry,
                sectors: AtomicU64::new(0),
                max_sectors,
                chunks: chunks.into_boxed_slice(),
                resident: AtomicU64::new(0),
                freed: AtomicU64::new(0),
                spare: Mutex::new(spare),
                noted: noted.into_boxed_slice(),
                noted_count: AtomicUsize::new(0),
                wants_memory: AtomicBool::new(false),
                out_of_memory: AtomicBool::new(false),
                signal,
                heap,
                frames: heap.map_or(&memory::HEAP_STRIPES as &dyn StripeFrames, |heap| {
                    heap.stripes()
                }),
                promised: AtomicU64::new(0),
                control: Mutex::new(0),
            }),
        };
        Ok(disk)
    }

    pub fn geometry(&self) -> Geometry {
        Geometry {
            sectors: self.sectors(),
            ..self.store.geometry
        }
    }

    /// Capacity now, in sectors.
    pub fn sectors(&self) -> u64 {
        self.store.sectors.load(Ordering::Acquire)
    }

    /// The most the disk can grow to.
    pub fn max_sectors(&self) -> u64 {
        self.store.max_sectors
    }

    /// Bytes of memory the disk holds now (its stripes and the spare ones).
    pub fn resident_bytes(&self) -> u64 {
        self.store.resident.load(Ordering::Relaxed)
    }

    /// Bytes of memory discards gave back so far.
    pub fn freed_bytes(&self) -> u64 {
        self.store.freed.load(Ordering::Relaxed)
    }

    /// A write waits for memory: call [`RamDisk::maintain`].
    pub fn wants_memory(&self) -> bool {
        self.store.wants_memory.load(Ordering::Acquire)
    }

    /// Whether `other` is a handle on this disk's store.
    pub fn same(&self, other: &RamDisk) -> bool {
        Arc::ptr_eq(&self.store, &other.store)
    }

    /// Handles on this disk's store (clones and queues): 1 means this one alone.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.store)
    }

    /// A handle for one device queue holding up to `depth` requests.
    pub fn queue(&self, depth: usize) -> RamDiskQueue {
        let completions = CompletionQueue::with_capacity(depth);
        RamDiskQueue {
            disk: self.clone(),
            discards: VecDeque::with_capacity(completions.capacity()),
            completions,
        }
    }

    /// Copy bytes out of the disk (for checks and set-up).
    pub fn read_at(&self, byte_offset: usize, out: &mut [u8]) {
        let _ = self
            .store
            .visit(byte_offset, out.len(), |stripe, range, done| {
                stripe.read(range, |piece, at| {
                    out[done + at..done + at + piece.len()].copy_from_slice(piece);
                    true
                });
                Ok(())
            });
    }

    /// Copy bytes into the disk (for set-up; memory for stripes that gave theirs back
    /// comes from the spare ones).
    pub fn write_at(&self, byte_offset: usize, data: &[u8]) {
        let store = &*self.store;
        let _ = store.visit(byte_offset, data.len(), |stripe, range, done| {
            let len = range.len();
            stripe.writable(store)?[range].copy_from_slice(&data[done..done + len]);
            Ok(())
        });
    }
}

/// One queue of a [`RamDisk`]. Reads, writes and flushes finish during `submit`;
/// discards are worked through a bounded piece per `poll_completions`, oldest first.
/// Completions are reported by `poll_completions`, as a real device would.
#[derive(Debug)]
pub struct RamDiskQueue {
    disk: RamDisk,
    completions: CompletionQueue,
    /// Discards not finished yet (each holds a place of the queue depth, so its
    /// completion always finds room).
    discards: VecDeque<PendingDiscard>,
}

impl RamDiskQueue {
    /// Carries out a read or write on the store. A request's segments are consecutive
    /// on the disk, so the stripe a piece lies in stays locked for the pieces after it
    /// in the same stripe (up to 16 pages of 4 KiB for one lock taken), and is let go
    /// before the next stripe is locked: one lock held at a time, as before.
    fn execute(&self, request: &IoRequest<'_>, buffers: &dyn BufferAccess) -> Result<(), Stop> {
        let store = &*self.disk.store;
        let read = request.op == IoOp::Read;
        // In range: `submit` checked sector + nr_sectors against the capacity.
        let mut cursor = (request.sector * SECTOR_SIZE) as usize;
        let mut held: Option<(usize, MutexGuard<'_, Stripe>)> = None;
        for segment in request.segments {
            let (len, offset) = (segment.len as usize, segment.offset as usize);
            let mut done = 0;
            while done < len {
                let at = cursor + done;
                let (index, within) = (at / STRIPE_BYTES, at % STRIPE_BYTES);
                let take = (STRIPE_BYTES - within).min(len - done);
                let stripe = match &mut held {
                    Some((locked, guard)) if *locked == index => guard,
                    other => {
                        *other = None;
                        // Inside the capacity, so inside a chunk made before it grew.
                        let stripe = store.stripe(index).ok_or(Stop::Buffer)?;
                        &mut other.insert((index, stripe.lock())).1
                    }
                };
                let range = within..within + take;
                let copied = if read {
                    stripe.read(range, |piece, at| {
                        buffers.write_buffer(segment.buffer, offset + done + at, piece)
                    })
                } else {
                    let disk = &mut stripe.writable(store)?[range];
                    buffers.read_buffer(segment.buffer, offset + done, disk)
                };
                if !copied {
                    return Err(Stop::Buffer);
                }
                done += take;
            }
            cursor += len;
        }
        Ok(())
    }
}

impl BlockDevice for RamDiskQueue {
    fn geometry(&self) -> Geometry {
        self.disk.geometry()
    }

    fn queue_depth(&self) -> usize {
        self.completions.capacity()
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        if self.completions.len() + self.discards.len() >= self.completions.capacity() {
            return Err(SubmitError::QueueFull);
        }
        let store = &*self.disk.store;
        let data_bytes: u64 = request.segments.iter().map(|s| u64::from(s.len)).sum();
        let nr_sectors = match request.op {
            IoOp::Flush => 0,
            IoOp::Discard { .. } => request.nr_sectors,
            IoOp::Read | IoOp::Write => {
                if !data_bytes.is_multiple_of(SECTOR_SIZE)
                    || data_bytes / SECTOR_SIZE != request.nr_sectors
                {
                    return Err(SubmitError::Invalid);
                }
                request.nr_sectors
            }
        };
        if !request.fits(nr_sectors, store.sectors.load(Ordering::Acquire)) {
            return Err(SubmitError::Invalid);
        }
        if request.op == IoOp::Write && store.geometry.read_only {
            return Err(SubmitError::Invalid);
        }
        let status = match request.op {
            IoOp::Flush => IoStatus::Ok,
            IoOp::Discard { secure } => {
                if store.geometry.discard.is_none_or(|d| secure && !d.secure) {
                    IoStatus::Unsupported
                } else if nr_sectors == 0 {
                    IoStatus::Ok
                } else {
                    // In range (checked above): carried out by the polls to come.
                    let start = (request.sector * SECTOR_SIZE) as usize;
                    self.discards.push_back(PendingDiscard {
                        tag: request.tag,
                        next: start,
                        end: start + (nr_sectors * SECTOR_SIZE) as usize,
                        secure,
                    });
                    return Ok(());
                }
            }
            IoOp::Read | IoOp::Write => match self.execute(request, buffers) {
                Ok(()) => IoStatus::Ok,
                Err(Stop::Buffer) => IoStatus::Error,
                // Memory is on its way (the disk asked for it): the engine retries.
                Err(Stop::NeedMemory) if !store.out_of_memory.load(Ordering::Acquire) => {
                    return Err(SubmitError::QueueFull)
                }
                Err(Stop::NeedMemory) => IoStatus::Error,
            },
        };
        self.completions.push(Completion {
            tag: request.tag,
            status,
        })
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        self.advance_discards();
        self.completions.drain(sink)
    }
}
