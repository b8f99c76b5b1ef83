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
//! zero stripes (and of stripes a partial discard left all zero). The I/O path never
//! allocates or frees: a write into a stripe whose memory went back takes a stripe from
//! the disk's spare ones (refilled by `maintain`, from freed stripes or, when asked, from
//! the heap); with none spare the write waits (`QueueFull`: the engine retries it) and the
//! disk asks for memory (`wants_memory`, and the signal it was made with). The disk can
//! grow and shrink while queues serve it ([`RamDisk::resize`]): its capacity is one atomic
//! every queue reads per request.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::Range;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use spin::{Mutex, MutexGuard, Once};

use crate::{
    BlockDevice, BufferAccess, Completion, CompletionQueue, DiscardGeometry, Geometry, IoOp,
    IoRequest, IoStatus, SubmitError, SECTOR_SIZE,
};

/// Bytes per lock of the store, and the unit memory is given back in. Queues served by
/// different vCPUs take a stripe's lock only for the pieces they copy, so they meet only
/// on the same 64 KiB; a stripe holds whole sectors, so no sector is ever half written.
pub const STRIPE_BYTES: usize = 64 * 1024;
/// Stripes per table chunk: the stripe table grows by chunks of 16 MiB of disk, made when
/// the disk grows over them (never moved, so queues reach stripes without a lock).
const CHUNK_STRIPES: usize = 256;

/// Bytes of discards a queue zeroes per `poll_completions`, at most. 1 MiB takes tens of
/// microseconds to zero (memset runs at several GB/s, slower nested), about what the
/// largest read or write (2 MiB) costs to copy, so a discard delays the other rings of
/// its poller no more than one large request does, and far less than the 1 ms a poller
/// with requests on its device may sleep. Smaller pieces would only add polls, larger
/// ones lengthen the stall.
pub const DISCARD_BYTES_PER_POLL: usize = 1 << 20;
/// What marking one whole stripe zero costs of that budget: a lock and a store, far less
/// than zeroing it, so 256 stripes (16 MiB of disk) per poll; a whole 4 GiB disk is
/// discarded in 256 polls.
const MARK_COST: usize = DISCARD_BYTES_PER_POLL / 256;

/// Stripes a disk keeps ready for writes into stripes whose memory went back (1 MiB).
pub const SPARE_STRIPES: usize = 16;

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

/// Why a RAM disk keeps its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeError {
    /// No sectors.
    Empty,
    /// Beyond what the disk was made able to grow to.
    TooLarge { max_sectors: u64 },
    /// The memory for the new part could not be had (`bytes` more were needed).
    OutOfMemory { bytes: u64 },
    /// A byte at or beyond the new end holds data (is not zero): the first such sector.
    InUse { sector: u64 },
}

impl core::fmt::Display for ResizeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ResizeError::Empty => f.write_str("a RAM disk of no sectors"),
            ResizeError::TooLarge { max_sectors } => write!(
                f,
                "a RAM disk here grows to {max_sectors} sectors ({} MiB) at most",
                max_sectors >> 11
            ),
            ResizeError::OutOfMemory { bytes } => {
                write!(f, "not enough memory: {bytes} more bytes are needed")
            }
            ResizeError::InUse { sector } => write!(
                f,
                "sector {sector} holds data (a byte that is not zero) beyond the new end; \
                 discard or zero what lies beyond it first"
            ),
        }
    }
}

impl core::error::Error for ResizeError {}

/// What one [`RamDisk::maintain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Bytes of memory given back to the heap.
    pub freed: u64,
    /// Bytes allocated for the spare stripes (asked for by a write).
    pub allocated: u64,
}

/// One stripe: its memory, unless a discard gave it back.
#[derive(Debug, Default)]
struct Stripe {
    memory: Option<Box<[u8]>>,
    /// The stripe reads as zeroes whatever its memory holds (a discard covered it whole).
    zero: bool,
    /// A discard zeroed part of it: `maintain` looks whether all of it is zero now.
    trimmed: bool,
}

/// One stripe's lock on a cache line of its own: queues on different vCPUs working on
/// neighbouring stripes take different locks, and must not write the same line for them.
#[derive(Debug, Default)]
#[repr(align(64))]
struct LockedStripe(Mutex<Stripe>);

impl core::ops::Deref for LockedStripe {
    type Target = Mutex<Stripe>;
    fn deref(&self) -> &Mutex<Stripe> {
        &self.0
    }
}

/// One chunk of the stripe table: `CHUNK_STRIPES` stripes.
type Chunk = Box<[LockedStripe]>;

/// `STRIPE_BYTES` of zeroed memory, or `None` (the heap is short).
fn stripe_memory() -> Option<Box<[u8]>> {
    let mut memory = Vec::new();
    memory.try_reserve_exact(STRIPE_BYTES).ok()?;
    memory.resize(STRIPE_BYTES, 0);
    Some(memory.into_boxed_slice())
}

/// A chunk of the stripe table (stripes without memory yet), or `None`.
fn chunk() -> Option<Chunk> {
    let mut stripes = Vec::new();
    stripes.try_reserve_exact(CHUNK_STRIPES).ok()?;
    stripes.resize_with(CHUNK_STRIPES, LockedStripe::default);
    Some(stripes.into_boxed_slice())
}

/// Why a visit stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// A buffer refused the copy (unknown, or the range leaves its page).
    Buffer,
    /// A write met a stripe without memory, and none was spare.
    NeedMemory,
}

static ZEROES: [u8; 4096] = [0; 4096];

impl Stripe {
    /// Hands the bytes `range` to `out`, piece by piece (zeroes if the stripe is zero).
    fn read(&self, range: Range<usize>, mut out: impl FnMut(&[u8], usize) -> bool) -> bool {
        match (&self.memory, self.zero) {
            (Some(memory), false) => out(&memory[range], 0),
            _ => {
                let mut done = 0;
                while done < range.len() {
                    let take = (range.len() - done).min(ZEROES.len());
                    if !out(&ZEROES[..take], done) {
                        return false;
                    }
                    done += take;
                }
                true
            }
        }
    }

    /// The stripe's bytes for writing: memory from the spare ones if it has none, zeroed
    /// first if the stripe reads as zero.
    fn writable(&mut self, store: &Store) -> Result<&mut [u8], Stop> {
        if self.memory.is_none() {
            self.memory = Some(store.take_spare().ok_or(Stop::NeedMemory)?);
            self.zero = true;
        }
        let memory = self.memory.as_deref_mut().ok_or(Stop::NeedMemory)?;
        if self.zero {
            memory.fill(0);
            self.zero = false;
        }
        Ok(memory)
    }

    /// Discards `range`: the whole stripe (`whole`) is marked zero, a part is zeroed (a
    /// secure discard zeroes the whole stripe's bytes too: none of the old data stays in
    /// memory). True if the stripe now has memory to give back.
    fn discard(&mut self, range: Range<usize>, whole: bool, secure: bool) -> bool {
        if self.zero || self.memory.is_none() {
            return false;
        }
        if let Some(memory) = self.memory.as_deref_mut() {
            if !whole || secure {
                memory[range].fill(0);
            }
        }
        if whole {
            self.zero = true;
            return true;
        }
        self.trimmed = true;
        false
    }

    /// The first byte of `range` that is not zero, if any.
    fn first_data(&self, range: Range<usize>) -> Option<usize> {
        match (&self.memory, self.zero) {
            (Some(memory), false) => {
                let start = range.start;
                memory[range]
                    .iter()
                    .position(|&b| b != 0)
                    .map(|at| start + at)
            }
            _ => None,
        }
    }
}

/// The store shared by all queues of one RAM disk, in independently locked stripes (no
/// lock over the whole disk on the I/O path).
#[derive(Debug)]
struct Store {
    /// Everything but the capacity, which is `sectors`.
    geometry: Geometry,
    sectors: AtomicU64,
    max_sectors: u64,
    chunks: Box<[Once<Chunk>]>,
    /// Bytes of memory the disk holds: its stripes' and the spare ones.
    resident: AtomicU64,
    /// Bytes of memory it gave back so far.
    freed: AtomicU64,
    /// Memory freed from stripes, kept for writes into stripes without memory (room for
    /// `SPARE_STRIPES` reserved when the disk is made: pushing never allocates).
    spare: Mutex<Vec<Box<[u8]>>>,
    /// A discard marked or trimmed stripes, or the disk shrank: `maintain` has work.
    dirty: AtomicBool,
    /// A write found no spare stripe: `maintain` should allocate some.
    wants_memory: AtomicBool,
    /// The last allocation for the spare stripes failed: writes that need memory fail
    /// instead of waiting.
    out_of_memory: AtomicBool,
    /// Set with `wants_memory`, for whoever runs `maintain` (shared by several disks).
    signal: Option<&'static AtomicBool>,
    /// Resizing and maintenance, one at a time (the control path's own work).
    control: Mutex<()>,
}

impl Store {
    fn stripe(&self, index: usize) -> Option<&Mutex<Stripe>> {
        let chunk = self.chunks.get(index / CHUNK_STRIPES)?.get()?;
        chunk.get(index % CHUNK_STRIPES).map(|stripe| &**stripe)
    }

    fn capacity_bytes(&self) -> usize {
        (self.sectors.load(Ordering::Acquire) * SECTOR_SIZE) as usize
    }

    fn take_spare(&self) -> Option<Box<[u8]>> {
        let taken = self.spare.lock().pop();
        if taken.is_none() && !self.wants_memory.swap(true, Ordering::AcqRel) {
            if let Some(signal) = self.signal {
                signal.store(true, Ordering::Release);
            }
        }
        taken
    }

    /// Memory of a stripe that no longer needs it: spare, or back to the heap.
    fn give_back(&self, memory: Box<[u8]>) -> u64 {
        let mut spare = self.spare.lock();
        if spare.len() < spare.capacity() {
            spare.push(memory);
            return 0;
        }
        drop(spare);
        drop(memory);
        self.resident
            .fetch_sub(STRIPE_BYTES as u64, Ordering::Relaxed);
        self.freed.fetch_add(STRIPE_BYTES as u64, Ordering::Relaxed);
        STRIPE_BYTES as u64
    }

    /// Calls `visit(stripe, range, done)` for the store's bytes `[byte_offset,
    /// byte_offset + len)` stripe by stripe, with each stripe locked while its piece is
    /// visited; `done` is how many bytes came before this piece.
    fn visit(
        &self,
        byte_offset: usize,
        len: usize,
        mut visit: impl FnMut(&mut Stripe, Range<usize>, usize) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        let mut done = 0;
        while done < len {
            let at = byte_offset + done;
            let (index, within) = (at / STRIPE_BYTES, at % STRIPE_BYTES);
            let take = (STRIPE_BYTES - within).min(len - done);
            // Inside the capacity, so inside a chunk made before the capacity grew.
            let stripe = self.stripe(index).ok_or(Stop::Buffer)?;
            visit(&mut stripe.lock(), within..within + take, done)?;
            done += take;
        }
        Ok(())
    }
}

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
        Self::try_new(geometry, geometry.sectors, None).expect("RAM disk memory")
    }

    /// A zero-filled disk of `geometry`, all of it backed by memory now (allocated
    /// fallibly), able to grow to `max_sectors`; `signal` is set when a write asks for
    /// memory (see [`RamDisk::maintain`]).
    pub fn try_new(
        geometry: Geometry,
        max_sectors: u64,
        signal: Option<&'static AtomicBool>,
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
        let disk = RamDisk {
            store: Arc::new(Store {
                geometry,
                sectors: AtomicU64::new(0),
                max_sectors,
                chunks: chunks.into_boxed_slice(),
                resident: AtomicU64::new(0),
                freed: AtomicU64::new(0),
                spare: Mutex::new(spare),
                dirty: AtomicBool::new(false),
                wants_memory: AtomicBool::new(false),
                out_of_memory: AtomicBool::new(false),
                signal,
                control: Mutex::new(()),
            }),
        };
        if geometry.sectors > 0 {
            disk.grow(0, geometry.sectors).map_err(|_| out_of_memory)?;
        }
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

    /// Grows or shrinks the disk to `sectors` while queues serve it (the control path's;
    /// one resize or maintenance at a time). Growing backs the new part with zeroed
    /// memory first (allocated fallibly) and only then publishes the capacity. Shrinking
    /// is refused while any byte at or beyond the new end is not zero ("in use"): data
    /// there would be lost. A guest writing beyond the new end while the disk shrinks
    /// loses those writes, as with any disk cut short under it.
    pub fn resize(&self, sectors: u64) -> Result<(), ResizeError> {
        let _one = self.store.control.lock();
        let old = self.sectors();
        if sectors == 0 {
            return Err(ResizeError::Empty);
        }
        if sectors > self.store.max_sectors {
            return Err(ResizeError::TooLarge {
                max_sectors: self.store.max_sectors,
            });
        }
        if sectors > old {
            return self.grow(old, sectors);
        }
        if sectors < old {
            let data = |disk: &RamDisk| {
                disk.first_data(sectors, old)
                    .map(|sector| ResizeError::InUse { sector })
            };
            if let Some(refusal) = data(self) {
                return Err(refusal);
            }
            self.store.sectors.store(sectors, Ordering::Release);
            // A write that passed the old capacity just before: look once more.
            if let Some(refusal) = data(self) {
                self.store.sectors.store(old, Ordering::Release);
                return Err(refusal);
            }
            self.store.dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Bytes of memory growing to `new` sectors would allocate now (stripes without
    /// memory on the way, and table chunks not made yet); 0 for no growth.
    pub fn memory_to_grow(&self, new: u64) -> u64 {
        let old = self.sectors();
        if new <= old || new > self.store.max_sectors {
            return 0;
        }
        let stripes = Self::stripes_between(old, new);
        let table = (CHUNK_STRIPES * core::mem::size_of::<LockedStripe>()) as u64;
        let mut bytes = 0;
        for index in stripes.clone() {
            match self.store.chunks[index / CHUNK_STRIPES].get() {
                Some(chunk) if chunk[index % CHUNK_STRIPES].lock().memory.is_some() => {}
                Some(_) => bytes += STRIPE_BYTES as u64,
                None if index.is_multiple_of(CHUNK_STRIPES) || index == stripes.start => {
                    bytes += STRIPE_BYTES as u64 + table
                }
                None => bytes += STRIPE_BYTES as u64,
            }
        }
        bytes
    }

    /// The stripes holding sectors `[old, new)`.
    fn stripes_between(old: u64, new: u64) -> Range<usize> {
        let first = (old * SECTOR_SIZE) as usize / STRIPE_BYTES;
        let end = ((new * SECTOR_SIZE) as usize).div_ceil(STRIPE_BYTES);
        first..end
    }

    /// Backs sectors `[old, new)` with zeroed memory, then publishes `new`.
    fn grow(&self, old: u64, new: u64) -> Result<(), ResizeError> {
        let store = &*self.store;
        let old_bytes = (old * SECTOR_SIZE) as usize;
        let new_bytes = (new * SECTOR_SIZE) as usize;
        let stripes = Self::stripes_between(old, new);
        for index in stripes.clone() {
            let out_of_memory = || ResizeError::OutOfMemory {
                bytes: ((stripes.end - index) * STRIPE_BYTES) as u64,
            };
            let chunk = store.chunks[index / CHUNK_STRIPES]
                .try_call_once(|| chunk().ok_or(()))
                .map_err(|()| out_of_memory())?;
            let mut stripe = chunk[index % CHUNK_STRIPES].lock();
            let zero = stripe.zero;
            match stripe.memory.as_deref_mut() {
                None => {
                    stripe.memory = Some(stripe_memory().ok_or_else(out_of_memory)?);
                    store
                        .resident
                        .fetch_add(STRIPE_BYTES as u64, Ordering::Relaxed);
                }
                Some(memory) if zero => memory.fill(0),
                // Memory kept from before a shrink: what lies beyond the old end goes.
                Some(memory) => {
                    let start = index * STRIPE_BYTES;
                    memory[old_bytes.max(start) - start..].fill(0);
                }
            }
            stripe.zero = false;
            stripe.trimmed = false;
        }
        debug_assert!(new_bytes <= stripes.end * STRIPE_BYTES);
        store.sectors.store(new, Ordering::Release);
        Ok(())
    }

    /// The first sector in `[from, to)` holding a byte that is not zero.
    fn first_data(&self, from: u64, to: u64) -> Option<u64> {
        let (from, to) = ((from * SECTOR_SIZE) as usize, (to * SECTOR_SIZE) as usize);
        let mut found = None;
        let _ = self.store.visit(from, to - from, |stripe, range, done| {
            let start = range.start;
            match stripe.first_data(range) {
                Some(at) => {
                    found = Some(((from + done + at - start) as u64) / SECTOR_SIZE);
                    Err(Stop::Buffer)
                }
                None => Ok(()),
            }
        });
        found
    }

    /// The control path's care of the disk, off the I/O path: frees the memory of
    /// stripes that read as zero (a discard covered them, or its partial pieces left
    /// them all zero) or lie beyond a shrunk end (up to `SPARE_STRIPES` of it kept spare
    /// for writes into such stripes), and when a write asked for memory, allocates spare
    /// stripes (fallibly; if none can be had, writes that need memory fail until some can).
    pub fn maintain(&self) -> Maintenance {
        let store = &*self.store;
        let _one = store.control.lock();
        let mut done = Maintenance::default();
        if store.dirty.swap(false, Ordering::AcqRel) {
            let capacity = store.capacity_bytes().div_ceil(STRIPE_BYTES);
            let chunks = store.chunks.iter().map_while(Once::get);
            for (index, stripe) in chunks.flat_map(|chunk| chunk.iter()).enumerate() {
                let mut stripe = stripe.lock();
                if core::mem::take(&mut stripe.trimmed)
                    && stripe.first_data(0..STRIPE_BYTES).is_none()
                {
                    stripe.zero = true;
                }
                if stripe.memory.is_some() && (stripe.zero || index >= capacity) {
                    if let Some(memory) = stripe.memory.take() {
                        stripe.zero = false;
                        drop(stripe);
                        done.freed += store.give_back(memory);
                    }
                }
            }
        }
        if store.wants_memory.load(Ordering::Acquire) {
            // Allocated without the spare lock held (writers take it).
            let room = {
                let spare = store.spare.lock();
                spare.capacity() - spare.len()
            };
            let mut fresh: [Option<Box<[u8]>>; SPARE_STRIPES] = Default::default();
            for slot in fresh.iter_mut().take(room) {
                *slot = stripe_memory();
                if slot.is_none() {
                    break;
                }
            }
            let mut spare = store.spare.lock();
            for memory in fresh.into_iter().flatten() {
                // Writers only take, and this runs one at a time: the room is there.
                if spare.len() < spare.capacity() {
                    spare.push(memory);
                    done.allocated += STRIPE_BYTES as u64;
                }
            }
            store.resident.fetch_add(done.allocated, Ordering::Relaxed);
            store
                .out_of_memory
                .store(spare.is_empty(), Ordering::Release);
            store.wants_memory.store(false, Ordering::Release);
        }
        done
    }
}

/// A discard accepted and not yet carried out to its end: bytes `[next, end)` of the
/// store.
#[derive(Clone, Copy, Debug)]
struct PendingDiscard {
    tag: u32,
    next: usize,
    end: usize,
    secure: bool,
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
    /// Works through the pending discards, at most [`DISCARD_BYTES_PER_POLL`] zeroed (a
    /// whole stripe marked costs [`MARK_COST`]), and queues the completion of each one
    /// finished.
    fn advance_discards(&mut self) {
        let store = &*self.disk.store;
        let mut budget = DISCARD_BYTES_PER_POLL;
        let capacity = store.capacity_bytes();
        while budget > 0 {
            let Some(discard) = self.discards.front_mut() else {
                break;
            };
            let at = discard.next;
            let within = at % STRIPE_BYTES;
            let take = (STRIPE_BYTES - within).min(discard.end - at);
            let whole = within == 0 && (take == STRIPE_BYTES || at + take >= capacity);
            let secure = discard.secure;
            let mut marked = false;
            let _ = store.visit(at, take, |stripe, range, _| {
                marked = stripe.discard(range, whole, secure);
                Ok(())
            });
            if marked || !whole {
                store.dirty.store(true, Ordering::Release);
            }
            discard.next += take;
            let cost = if whole && !secure { MARK_COST } else { take };
            budget = budget.saturating_sub(cost);
            if discard.next == discard.end {
                let tag = discard.tag;
                self.discards.pop_front();
                // Cannot fail: submit kept a place for it.
                let _ = self.completions.push(Completion {
                    tag,
                    status: IoStatus::Ok,
                });
            }
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DmaSegment;
    use core::sync::atomic::AtomicBool;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// Pages named by number, for buffer access in tests.
    #[derive(Default)]
    struct Pages(RefCell<HashMap<u64, Vec<u8>>>);

    impl BufferAccess for Pages {
        fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
            let pages = self.0.borrow();
            let Some(page) = pages.get(&buffer) else {
                return false;
            };
            let Some(src) = page.get(offset..offset + out.len()) else {
                return false;
            };
            out.copy_from_slice(src);
            true
        }
        fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
            let mut pages = self.0.borrow_mut();
            let Some(page) = pages.get_mut(&buffer) else {
                return false;
            };
            let Some(dst) = page.get_mut(offset..offset + data.len()) else {
                return false;
            };
            dst.copy_from_slice(data);
            true
        }
    }

    #[test]
    fn segments_across_stripe_boundaries_land_whole() {
        // A 4 KiB segment starting one sector before a stripe boundary, and a discard over
        // three stripes: pieces split across locks must line up byte for byte.
        let disk = RamDisk::new((3 * STRIPE_BYTES / 512) as u64);
        let mut queue = disk.queue(4);
        let pages = Pages::default();
        let pattern: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        pages.0.borrow_mut().insert(1, pattern.clone());
        let segments = [DmaSegment {
            buffer: 1,
            offset: 0,
            len: 4096,
        }];
        let first = (STRIPE_BYTES / 512 - 1) as u64;
        let write = IoRequest {
            tag: 1,
            op: IoOp::Write,
            sector: first,
            nr_sectors: 8,
            preflush: false,
            segments: &segments,
        };
        queue.submit(&write, &pages).unwrap();
        let mut on_disk = vec![0; 4096];
        disk.read_at(first as usize * 512, &mut on_disk);
        assert_eq!(on_disk, pattern);
        pages.0.borrow_mut().insert(2, vec![0; 4096]);
        let read_segments = [DmaSegment {
            buffer: 2,
            offset: 0,
            len: 4096,
        }];
        let read = IoRequest {
            tag: 2,
            op: IoOp::Read,
            segments: &read_segments,
            ..write
        };
        queue.submit(&read, &pages).unwrap();
        assert_eq!(pages.0.borrow()[&2], pattern);
        let discard = IoRequest {
            tag: 3,
            op: IoOp::Discard { secure: false },
            sector: 1,
            nr_sectors: (3 * STRIPE_BYTES / 512 - 2) as u64,
            preflush: false,
            segments: &[],
        };
        queue.submit(&discard, &pages).unwrap();
        let statuses: Vec<_> = collect(&mut queue).iter().map(|c| c.status).collect();
        assert_eq!(statuses, [IoStatus::Ok; 3]);
        disk.read_at(first as usize * 512, &mut on_disk);
        assert!(on_disk.iter().all(|&b| b == 0));
    }

    /// Buffer access that records, at each copy, which of the disk's first stripes are
    /// locked.
    struct Watching<'a> {
        pages: &'a Pages,
        disk: &'a RamDisk,
        locked: RefCell<Vec<Vec<usize>>>,
    }

    impl Watching<'_> {
        fn record(&self) {
            let locked = (0..4)
                .filter(|&i| self.disk.store.stripe(i).is_some_and(|s| s.is_locked()))
                .collect();
            self.locked.borrow_mut().push(locked);
        }
    }

    impl BufferAccess for Watching<'_> {
        fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
            self.record();
            self.pages.read_buffer(buffer, offset, out)
        }
        fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
            self.record();
            self.pages.write_buffer(buffer, offset, data)
        }
    }

    #[test]
    fn a_large_request_crosses_stripes_one_lock_at_a_time() {
        // 40 segments of 1 to 8 sectors at varying offsets in their pages, from one
        // sector into stripe 0 to stripe 2: each byte lands where the segments say, and
        // each copy holds exactly the lock of its stripe.
        let disk = RamDisk::new((4 * STRIPE_BYTES / 512) as u64);
        let mut queue = disk.queue(4);
        let pages = Pages::default();
        let mut segments = Vec::new();
        let mut expected = Vec::new();
        for i in 0..40u64 {
            let first = i % 3;
            let sectors = 8 - first - (i % 2) * (i % 5).min(8 - first - 1);
            let data: Vec<u8> = (0..4096).map(|b| (b as u64 * 13 + i) as u8).collect();
            let (offset, len) = (first as usize * 512, sectors as usize * 512);
            expected.extend_from_slice(&data[offset..offset + len]);
            pages.0.borrow_mut().insert(100 + i, data);
            segments.push(DmaSegment {
                buffer: 100 + i,
                offset: offset as u32,
                len: len as u32,
            });
        }
        let nr_sectors = expected.len() as u64 / 512;
        let sector = (STRIPE_BYTES / 512 - 1) as u64;
        assert!(
            (sector + nr_sectors) * 512 > 2 * STRIPE_BYTES as u64,
            "reaches stripe 2"
        );
        let watching = Watching {
            pages: &pages,
            disk: &disk,
            locked: RefCell::new(Vec::new()),
        };
        let write = IoRequest {
            tag: 1,
            op: IoOp::Write,
            sector,
            nr_sectors,
            preflush: false,
            segments: &segments,
        };
        queue.submit(&write, &watching).unwrap();
        let mut on_disk = vec![0; expected.len()];
        disk.read_at(sector as usize * 512, &mut on_disk);
        assert!(
            on_disk == expected,
            "the write landed where its segments say"
        );
        for page in 100..140 {
            pages.0.borrow_mut().insert(page, vec![0; 4096]);
        }
        let read = IoRequest {
            tag: 2,
            op: IoOp::Read,
            ..write
        };
        queue.submit(&read, &watching).unwrap();
        let mut back = Vec::new();
        for segment in &segments {
            let page = &pages.0.borrow()[&segment.buffer];
            let (offset, len) = (segment.offset as usize, segment.len as usize);
            back.extend_from_slice(&page[offset..offset + len]);
        }
        assert!(back == expected, "the read brought back what was written");
        let locked = watching.locked.into_inner();
        assert!(locked.iter().all(|l| l.len() == 1), "one lock at a time");
        let mut stripes: Vec<usize> = locked.iter().map(|l| l[0]).collect();
        stripes.dedup();
        assert_eq!(stripes, [0, 1, 2, 0, 1, 2], "in disk order, twice");
        assert_eq!(
            collect(&mut queue)
                .iter()
                .map(|c| c.status)
                .collect::<Vec<_>>(),
            [IoStatus::Ok; 2]
        );
    }

    /// Zero bytes on the whole disk.
    fn zero_bytes(disk: &RamDisk) -> usize {
        let mut bytes = vec![0; disk.geometry().sectors as usize * 512];
        disk.read_at(0, &mut bytes);
        bytes.iter().filter(|&&b| b == 0).count()
    }

    #[test]
    fn a_whole_disk_discard_is_carried_out_a_bounded_piece_per_poll() {
        // 768 stripes and one page: 256 whole stripes marked per poll, so 4 polls.
        let bytes = 768 * STRIPE_BYTES + 4096;
        let disk = RamDisk::new((bytes / 512) as u64);
        disk.write_at(0, &vec![0xA5; bytes]);
        let (mut first, mut second) = (disk.queue(4), disk.queue(4));
        let pages = Pages::default();
        let discard = IoRequest {
            tag: 1,
            op: IoOp::Discard { secure: false },
            sector: 0,
            nr_sectors: (bytes / 512) as u64,
            preflush: false,
            segments: &[],
        };
        first.submit(&discard, &pages).unwrap();
        assert_eq!(zero_bytes(&disk), 0, "submit discards nothing");
        let mut polls = 0;
        let mut zeroed = 0;
        loop {
            let completions = collect(&mut first);
            polls += 1;
            let now = zero_bytes(&disk);
            assert!(
                now > zeroed && now - zeroed <= 256 * STRIPE_BYTES,
                "poll {polls} discarded {} bytes",
                now - zeroed
            );
            zeroed = now;
            if polls == 1 {
                // A read on another queue of the disk, submitted meanwhile, completes
                // while the discard is still going.
                pages.0.borrow_mut().insert(9, vec![0; 4096]);
                let segments = [DmaSegment {
                    buffer: 9,
                    offset: 0,
                    len: 4096,
                }];
                let read = IoRequest {
                    tag: 2,
                    op: IoOp::Read,
                    sector: (bytes / 512 - 8) as u64,
                    nr_sectors: 8,
                    preflush: false,
                    segments: &segments,
                };
                second.submit(&read, &pages).unwrap();
                assert_eq!(
                    collect(&mut second),
                    [Completion {
                        tag: 2,
                        status: IoStatus::Ok
                    }]
                );
                assert!(completions.is_empty(), "the discard is not done yet");
                assert_eq!(pages.0.borrow()[&9], vec![0xA5; 4096]);
            }
            if !completions.is_empty() {
                assert_eq!(
                    completions,
                    [Completion {
                        tag: 1,
                        status: IoStatus::Ok
                    }]
                );
                break;
            }
        }
        assert_eq!(polls, 4);
        assert_eq!(zeroed, bytes);
    }

    #[test]
    fn partial_discards_are_zeroed_within_the_byte_budget() {
        // Pieces of stripes: each costs what it zeroes, 1 MiB per poll at most.
        let disk = RamDisk::new((64 * STRIPE_BYTES / 512) as u64);
        disk.write_at(0, &vec![0x5A; 64 * STRIPE_BYTES]);
        let mut queue = disk.queue(64);
        let pages = Pages::default();
        // 40 discards of 60 KiB, each inside one stripe (4 KiB in).
        for n in 0..40u64 {
            let discard = IoRequest {
                tag: n as u32,
                op: IoOp::Discard { secure: false },
                sector: n * (STRIPE_BYTES as u64 / 512) + 8,
                nr_sectors: 120,
                preflush: false,
                segments: &[],
            };
            queue.submit(&discard, &pages).unwrap();
        }
        let mut finished = 0;
        let mut polls = 0;
        while finished < 40 {
            finished += collect(&mut queue).len();
            polls += 1;
        }
        // 40 x 60 KiB = 2.3 MiB: three polls.
        assert_eq!(polls, 3);
        assert_eq!(zero_bytes(&disk), 40 * 60 * 1024);
    }

    impl RamDisk {
        /// What stripe `index`'s memory holds, whatever the stripe reads as.
        fn raw_stripe(&self, index: usize) -> Option<Vec<u8>> {
            let stripe = self.store.stripe(index)?.lock();
            stripe.memory.as_deref().map(<[u8]>::to_vec)
        }
    }

    #[test]
    fn a_secure_discard_leaves_none_of_the_data_in_memory() {
        let disk = RamDisk::new(8 * STRIPE_SECTORS);
        disk.write_at(0, &vec![0x77; 8 * STRIPE_BYTES]);
        let mut queue = disk.queue(4);
        let discard = |sector, secure| IoRequest {
            tag: 1,
            op: IoOp::Discard { secure },
            sector,
            nr_sectors: STRIPE_SECTORS,
            preflush: false,
            segments: &[],
        };
        queue
            .submit(&discard(3 * STRIPE_SECTORS, true), &Pages::default())
            .unwrap();
        queue
            .submit(&discard(4 * STRIPE_SECTORS, false), &Pages::default())
            .unwrap();
        while collect(&mut queue).len() < 2 {}
        let mut bytes = vec![0xff; 2 * STRIPE_BYTES];
        disk.read_at(3 * STRIPE_BYTES, &mut bytes);
        assert!(bytes.iter().all(|&b| b == 0), "both read as zeroes");
        assert!(
            disk.raw_stripe(3).unwrap().iter().all(|&b| b == 0),
            "secure: wiped"
        );
        assert!(
            disk.raw_stripe(4).unwrap().iter().all(|&b| b == 0x77),
            "plain: only marked (freed by maintain)"
        );
    }

    /// A 4 KiB write of `fill` at `sector` through `queue`.
    fn write_page(
        queue: &mut RamDiskQueue,
        tag: u32,
        sector: u64,
        fill: u8,
    ) -> Result<(), SubmitError> {
        let pages = Pages::default();
        pages.0.borrow_mut().insert(1, vec![fill; 4096]);
        let segments = [DmaSegment {
            buffer: 1,
            offset: 0,
            len: 4096,
        }];
        let write = IoRequest {
            tag,
            op: IoOp::Write,
            sector,
            nr_sectors: 8,
            preflush: false,
            segments: &segments,
        };
        queue.submit(&write, &pages)
    }

    fn discard_now(queue: &mut RamDiskQueue, sector: u64, nr_sectors: u64) {
        let discard = IoRequest {
            tag: 99,
            op: IoOp::Discard { secure: false },
            sector,
            nr_sectors,
            preflush: false,
            segments: &[],
        };
        queue.submit(&discard, &Pages::default()).unwrap();
        while collect(queue).is_empty() {}
    }

    const STRIPE_SECTORS: u64 = (STRIPE_BYTES / 512) as u64;

    #[test]
    fn discarded_stripes_read_as_zeroes_and_give_their_memory_back() {
        let stripes = 64;
        let disk = RamDisk::new(stripes * STRIPE_SECTORS);
        let full = stripes * STRIPE_BYTES as u64;
        assert_eq!((disk.resident_bytes(), disk.freed_bytes()), (full, 0));
        disk.write_at(0, &vec![0x77; full as usize]);
        let mut queue = disk.queue(8);
        // 40 whole stripes and half a stripe on each side: stripes 2..=41 whole.
        discard_now(&mut queue, STRIPE_SECTORS * 3 / 2, 41 * STRIPE_SECTORS);
        let mut bytes = vec![0; full as usize];
        disk.read_at(0, &mut bytes);
        let zero_from = STRIPE_BYTES * 3 / 2;
        let zero_to = zero_from + 41 * STRIPE_BYTES;
        assert!(bytes[..zero_from].iter().all(|&b| b == 0x77));
        assert!(bytes[zero_from..zero_to].iter().all(|&b| b == 0));
        assert!(bytes[zero_to..].iter().all(|&b| b == 0x77));
        // Nothing is freed on the I/O path.
        assert_eq!(disk.resident_bytes(), full);
        let done = disk.maintain();
        // 40 stripes: 16 kept spare, 24 back to the heap.
        assert_eq!(done.freed, 24 * STRIPE_BYTES as u64);
        assert_eq!(disk.freed_bytes(), done.freed);
        assert_eq!(disk.resident_bytes(), full - done.freed);
        assert_eq!(
            disk.maintain(),
            Maintenance::default(),
            "nothing left to do"
        );
        // Still zeroes, and the data around them intact.
        disk.read_at(0, &mut bytes);
        assert!(bytes[zero_from..zero_to].iter().all(|&b| b == 0));
        assert!(bytes[zero_to..].iter().all(|&b| b == 0x77));

        // Two halves discarded apart leave stripe 50 all zero: its memory goes too.
        discard_now(&mut queue, 50 * STRIPE_SECTORS, STRIPE_SECTORS / 2);
        discard_now(
            &mut queue,
            50 * STRIPE_SECTORS + STRIPE_SECTORS / 2,
            STRIPE_SECTORS / 2,
        );
        assert_eq!(disk.maintain().freed, STRIPE_BYTES as u64);
    }

    #[test]
    fn writes_into_freed_stripes_take_spare_memory_then_wait_for_more() {
        static SIGNAL: AtomicBool = AtomicBool::new(false);
        let stripes = 40;
        let disk =
            RamDisk::try_new(RamDisk::plain(stripes * STRIPE_SECTORS), 0, Some(&SIGNAL)).unwrap();
        let mut queue = disk.queue(32);
        discard_now(&mut queue, 0, stripes * STRIPE_SECTORS);
        disk.maintain();
        assert_eq!(
            disk.resident_bytes(),
            (SPARE_STRIPES * STRIPE_BYTES) as u64,
            "only the spare stripes stay"
        );
        // One write into each of the first 16 stripes: each takes a spare stripe.
        for n in 0..SPARE_STRIPES as u64 {
            write_page(&mut queue, n as u32, n * STRIPE_SECTORS + 8, 0x33).unwrap();
        }
        assert_eq!(collect(&mut queue).len(), SPARE_STRIPES);
        assert!(!disk.wants_memory() && !SIGNAL.load(Ordering::Acquire));
        // The 17th waits: the engine gets QueueFull and retries; the disk asks.
        let next = sector_in(SPARE_STRIPES);
        assert_eq!(
            write_page(&mut queue, 20, next, 0x44),
            Err(SubmitError::QueueFull)
        );
        assert!(disk.wants_memory() && SIGNAL.load(Ordering::Acquire));
        let done = disk.maintain();
        assert_eq!(done.allocated, (SPARE_STRIPES * STRIPE_BYTES) as u64);
        assert!(!disk.wants_memory());
        write_page(&mut queue, 20, next, 0x44).unwrap();
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
        // Each written stripe holds its page and zeroes around it (the spare memory
        // came from stripes that held 0x00.. and was zeroed on use).
        let mut stripe = vec![0xff; STRIPE_BYTES];
        disk.read_at(0, &mut stripe);
        assert!(stripe[..4096].iter().all(|&b| b == 0));
        assert!(stripe[4096..8192].iter().all(|&b| b == 0x33));
        assert!(stripe[8192..].iter().all(|&b| b == 0));
        disk.read_at(SPARE_STRIPES * STRIPE_BYTES, &mut stripe);
        assert!(stripe[4096..8192].iter().all(|&b| b == 0x44));
        assert!(stripe[8192..].iter().all(|&b| b == 0));
    }

    /// The second page of stripe `stripe`.
    fn sector_in(stripe: usize) -> u64 {
        stripe as u64 * STRIPE_SECTORS + 8
    }

    #[test]
    fn a_disk_grows_under_its_queues_and_the_new_part_reads_zero() {
        let disk = RamDisk::try_new(
            RamDisk::plain(16 * STRIPE_SECTORS),
            300 * STRIPE_SECTORS,
            None,
        )
        .unwrap();
        let mut queue = disk.queue(8);
        let end = 8 * STRIPE_SECTORS;
        disk.resize(end).unwrap();
        assert_eq!(write_page(&mut queue, 1, end, 1), Err(SubmitError::Invalid));
        // Bytes beyond the end, still backed (a write racing the shrink could leave them)
        // must not show when the disk grows again.
        disk.write_at((end * 512) as usize + 4096, &[0x99; 4096]);
        disk.maintain();
        disk.write_at((end * 512) as usize + 4096, &[0x99; 4096]);
        assert_eq!(disk.memory_to_grow(end), 0);
        // Stripe 8 holds the stale page, 291 more need memory, and a table chunk.
        let needed = disk.memory_to_grow(300 * STRIPE_SECTORS);
        let stripes = 291 * STRIPE_BYTES as u64;
        let table = (CHUNK_STRIPES * core::mem::size_of::<LockedStripe>()) as u64;
        assert_eq!(table, 16384, "a line per stripe");
        assert_eq!(needed, stripes + table, "{needed}");
        disk.resize(300 * STRIPE_SECTORS).unwrap();
        assert_eq!(queue.geometry().sectors, 300 * STRIPE_SECTORS);
        // 300 stripes, and 7 spare (the shrink's 8 kept, one taken by the stale page).
        assert_eq!(disk.resident_bytes(), 307 * STRIPE_BYTES as u64);
        let mut grown = vec![0xff; 292 * STRIPE_BYTES];
        disk.read_at((end * 512) as usize, &mut grown);
        assert!(grown.iter().all(|&b| b == 0));
        // The queue made before writes there now, and its neighbour's data is intact.
        write_page(&mut queue, 2, 299 * STRIPE_SECTORS, 2).unwrap();
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
        assert_eq!(
            disk.resize(301 * STRIPE_SECTORS),
            Err(ResizeError::TooLarge {
                max_sectors: 300 * STRIPE_SECTORS
            })
        );
        assert_eq!(disk.resize(0), Err(ResizeError::Empty));
    }

    #[test]
    fn a_disk_shrinks_only_over_bytes_that_are_zero() {
        let disk = RamDisk::new(64 * STRIPE_SECTORS);
        let mut queue = disk.queue(8);
        let data = 40 * STRIPE_SECTORS + 16;
        write_page(&mut queue, 1, data, 7).unwrap();
        collect(&mut queue);
        // Data at `data`: shrinking to or below it is refused, naming it.
        let refused = disk.resize(32 * STRIPE_SECTORS).unwrap_err();
        assert_eq!(refused, ResizeError::InUse { sector: data });
        assert!(refused.to_string().contains("holds data"), "{refused}");
        assert_eq!(disk.sectors(), 64 * STRIPE_SECTORS, "unchanged");
        assert_eq!(
            disk.resize(data + 7),
            Err(ResizeError::InUse { sector: data + 7 })
        );
        // Just past the data: allowed; beyond the new end is refused from then on.
        disk.resize(data + 8).unwrap();
        assert_eq!(queue.geometry().sectors, data + 8);
        assert_eq!(
            write_page(&mut queue, 2, data + 8, 1),
            Err(SubmitError::Invalid)
        );
        // Once discarded, the data is not in use: the disk shrinks, memory goes back.
        discard_now(&mut queue, data, 8);
        disk.resize(16 * STRIPE_SECTORS).unwrap();
        assert_eq!(disk.resident_bytes(), 64 * STRIPE_BYTES as u64);
        let done = disk.maintain();
        // 48 stripes beyond the end: 16 kept spare, 32 freed.
        assert_eq!(done.freed, 32 * STRIPE_BYTES as u64);
        assert_eq!(disk.resident_bytes(), 32 * STRIPE_BYTES as u64);
        // Grown again: zeroes where the data was, backed by memory again.
        disk.resize(64 * STRIPE_SECTORS).unwrap();
        assert_eq!(
            disk.resident_bytes(),
            64 * STRIPE_BYTES as u64 + 16 * STRIPE_BYTES as u64
        );
        let mut page = vec![0xff; 4096];
        disk.read_at(data as usize * 512, &mut page);
        assert!(page.iter().all(|&b| b == 0));
    }

    #[test]
    fn pending_discards_hold_their_place_in_the_queue() {
        // Each discard is 256 whole stripes and one sector: more than one poll does.
        let disk = RamDisk::new(4 * 256 * STRIPE_SECTORS);
        let mut queue = disk.queue(2);
        let pages = Pages::default();
        let discard = |tag, sector| IoRequest {
            tag,
            op: IoOp::Discard { secure: false },
            sector,
            nr_sectors: 256 * STRIPE_SECTORS + 1,
            preflush: false,
            segments: &[],
        };
        queue.submit(&discard(1, 0), &pages).unwrap();
        let second = 2 * 256 * STRIPE_SECTORS;
        queue.submit(&discard(2, second), &pages).unwrap();
        assert_eq!(
            queue.submit(&flush_at(3), &pages),
            Err(SubmitError::QueueFull)
        );
        // One piece per poll across both, oldest first.
        assert!(collect(&mut queue).is_empty());
        let tags = |c: Vec<Completion>| c.iter().map(|c| c.tag).collect::<Vec<_>>();
        assert_eq!(tags(collect(&mut queue)), [1]);
        // The place discard 1 held is free again; the flush finishes at once.
        queue.submit(&flush_at(3), &pages).unwrap();
        assert_eq!(tags(collect(&mut queue)), [3, 2]);
        // Unsupported and empty discards answer at once.
        let plain = RamDisk::with_geometry(Geometry {
            discard: None,
            ..disk.geometry()
        });
        let mut queue = plain.queue(2);
        queue.submit(&discard(4, 0), &pages).unwrap();
        let statuses: Vec<_> = collect(&mut queue).iter().map(|c| c.status).collect();
        assert_eq!(statuses, [IoStatus::Unsupported]);
        let mut queue = disk.queue(2);
        let empty = IoRequest {
            nr_sectors: 0,
            ..discard(5, 0)
        };
        queue.submit(&empty, &pages).unwrap();
        let statuses: Vec<_> = collect(&mut queue).iter().map(|c| c.status).collect();
        assert_eq!(statuses, [IoStatus::Ok]);
    }

    fn flush_at(tag: u32) -> IoRequest<'static> {
        IoRequest {
            tag,
            op: IoOp::Flush,
            sector: 0,
            nr_sectors: 0,
            preflush: false,
            segments: &[],
        }
    }

    #[test]
    fn handles_count_clones_and_queues() {
        let disk = RamDisk::new(8);
        assert_eq!(disk.handles(), 1);
        let queue = disk.queue(1);
        let clone = disk.clone();
        assert_eq!(disk.handles(), 3);
        drop(queue);
        drop(clone);
        assert_eq!(disk.handles(), 1);
    }

    #[test]
    fn queues_on_threads_write_their_own_ranges() {
        // Two queues used from two threads at once, as two pollers do.
        let disk = RamDisk::new(4096);
        let workers: Vec<_> = [0x11u8, 0x22]
            .into_iter()
            .enumerate()
            .map(|(n, byte)| {
                let mut queue = disk.queue(8);
                std::thread::spawn(move || {
                    let pages = Pages::default();
                    pages.0.borrow_mut().insert(1, vec![byte; 4096]);
                    let segments = [DmaSegment {
                        buffer: 1,
                        offset: 0,
                        len: 4096,
                    }];
                    for round in 0..256u64 {
                        let request = IoRequest {
                            tag: round as u32,
                            op: IoOp::Write,
                            // Interleaved 4 KiB blocks: both threads touch every stripe.
                            sector: (round * 2 + n as u64) * 8,
                            nr_sectors: 8,
                            preflush: false,
                            segments: &segments,
                        };
                        queue.submit(&request, &pages).unwrap();
                        collect(&mut queue);
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let mut block = vec![0; 4096];
        for index in 0..512usize {
            disk.read_at(index * 4096, &mut block);
            let expected = if index % 2 == 0 { 0x11 } else { 0x22 };
            assert!(block.iter().all(|&b| b == expected), "block {index}");
        }
    }

    fn collect(queue: &mut RamDiskQueue) -> Vec<Completion> {
        let mut out = Vec::new();
        queue.poll_completions(&mut |c| out.push(c));
        out
    }

    #[test]
    fn write_then_read_round_trips_through_separate_segments() {
        let disk = RamDisk::new(64);
        let mut queue = disk.queue(4);
        let pages = Pages::default();
        pages.0.borrow_mut().insert(1, vec![0xAB; 4096]);
        pages.0.borrow_mut().insert(2, vec![0xCD; 4096]);
        let segments = [
            DmaSegment {
                buffer: 1,
                offset: 512,
                len: 512,
            },
            DmaSegment {
                buffer: 2,
                offset: 0,
                len: 1024,
            },
        ];
        let write = IoRequest {
            tag: 7,
            op: IoOp::Write,
            sector: 10,
            nr_sectors: 3,
            preflush: false,
            segments: &segments,
        };
        queue.submit(&write, &pages).unwrap();
        assert_eq!(
            collect(&mut queue),
            [Completion {
                tag: 7,
                status: IoStatus::Ok
            }]
        );
        let mut on_disk = vec![0; 1536];
        disk.read_at(10 * 512, &mut on_disk);
        assert!(on_disk[..512].iter().all(|&b| b == 0xAB));
        assert!(on_disk[512..].iter().all(|&b| b == 0xCD));

        pages.0.borrow_mut().insert(3, vec![0; 4096]);
        let read_segments = [DmaSegment {
            buffer: 3,
            offset: 1024,
            len: 1536,
        }];
        let read = IoRequest {
            tag: 8,
            op: IoOp::Read,
            segments: &read_segments,
            ..write
        };
        queue.submit(&read, &pages).unwrap();
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
        assert_eq!(&pages.0.borrow()[&3][1024..2560], &on_disk[..]);
    }

    #[test]
    fn refuses_out_of_range_and_full_queue() {
        let disk = RamDisk::new(8);
        let mut queue = disk.queue(1);
        let pages = Pages::default();
        let past_end = IoRequest {
            tag: 1,
            op: IoOp::Discard { secure: false },
            sector: 7,
            nr_sectors: 2,
            preflush: false,
            segments: &[],
        };
        assert_eq!(queue.submit(&past_end, &pages), Err(SubmitError::Invalid));
        let overflow = IoRequest {
            sector: u64::MAX,
            ..past_end
        };
        assert_eq!(queue.submit(&overflow, &pages), Err(SubmitError::Invalid));
        // An empty flush has no position: Linux sends sector -1.
        let flush = IoRequest {
            op: IoOp::Flush,
            sector: u64::MAX,
            nr_sectors: 0,
            ..past_end
        };
        queue.submit(&flush, &pages).unwrap();
        assert_eq!(queue.submit(&flush, &pages), Err(SubmitError::QueueFull));
        assert_eq!(collect(&mut queue).len(), 1);
    }

    #[test]
    fn unknown_buffer_completes_with_error() {
        let disk = RamDisk::new(8);
        let mut queue = disk.queue(2);
        let segments = [DmaSegment {
            buffer: 99,
            offset: 0,
            len: 512,
        }];
        let read = IoRequest {
            tag: 3,
            op: IoOp::Read,
            sector: 0,
            nr_sectors: 1,
            preflush: false,
            segments: &segments,
        };
        queue.submit(&read, &Pages::default()).unwrap();
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Error);
    }
}
