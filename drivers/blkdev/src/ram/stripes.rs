// SPDX-License-Identifier: MIT OR Apache-2.0
//! The striped store shared by a RAM disk's queues, and its stripes.

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::memory::{address_of, StripeFrames};
use core::ops::{Deref, DerefMut, Range};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use spin::{Mutex, Once};

use crate::{Geometry, HeapBudget, SECTOR_SIZE};

/// Bytes per lock of the store, and the unit memory is given back in. Queues served by
/// different vCPUs take a stripe's lock only for the pieces they copy, so they meet only
/// on the same 64 KiB; a stripe holds whole sectors, so no sector is ever half written.
pub const STRIPE_BYTES: usize = 64 * 1024;
/// Stripes per table chunk: the stripe table grows by chunks of 16 MiB of disk, made when
/// the disk grows over them (never moved, so queues reach stripes without a lock).
pub(super) const CHUNK_STRIPES: usize = 256;

/// Stripes a disk keeps ready for writes into stripes whose memory went back (1 MiB).
pub const SPARE_STRIPES: usize = 16;

/// One stripe's memory, from the disk's [`StripeFrames`]. Zeroed when it goes back
/// there (dropped): whatever it is handed to next (another disk, or the next image's
/// frame allocator) must never see this guest's data.
pub(super) struct StripeMemory {
    memory: &'static mut [u8],
    from: &'static dyn StripeFrames,
}

impl core::fmt::Debug for StripeMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "StripeMemory({:#x})", address_of(self.memory))
    }
}

impl StripeMemory {
    /// Where it lies (what a handover names it by).
    pub(super) fn address(&self) -> u64 {
        address_of(self.memory)
    }
}

impl Drop for StripeMemory {
    fn drop(&mut self) {
        let memory = core::mem::take(&mut self.memory);
        memory.fill(0);
        self.from.give(memory);
    }
}

impl Deref for StripeMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.memory
    }
}

impl DerefMut for StripeMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.memory
    }
}

/// One stripe: its memory, unless a discard gave it back.
#[derive(Debug, Default)]
pub(super) struct Stripe {
    pub(super) memory: Option<StripeMemory>,
    /// The stripe reads as zeroes whatever its memory holds (a discard covered it whole).
    pub(super) zero: bool,
    /// A discard zeroed part of it: `maintain` looks whether all of it is zero now.
    pub(super) trimmed: bool,
}

/// One stripe's lock on a cache line of its own: queues on different vCPUs working on
/// neighbouring stripes take different locks, and must not write the same line for them.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct LockedStripe(Mutex<Stripe>);

impl core::ops::Deref for LockedStripe {
    type Target = Mutex<Stripe>;
    fn deref(&self) -> &Mutex<Stripe> {
        &self.0
    }
}

/// One chunk of the stripe table: `CHUNK_STRIPES` stripes.
pub(super) type Chunk = Box<[LockedStripe]>;

/// `STRIPE_BYTES` of zeroed memory from `from` (which may hand back anything), or
/// `None` (it has none).
pub(super) fn stripe_memory(from: &'static dyn StripeFrames) -> Option<StripeMemory> {
    let memory = from.take()?;
    if memory.len() != STRIPE_BYTES {
        from.give(memory);
        return None;
    }
    memory.fill(0);
    Some(StripeMemory { memory, from })
}

/// The stripe `from` handed over at `address` (its bytes as the old image left them).
pub(super) fn adopted_memory(
    from: &'static dyn StripeFrames,
    address: u64,
) -> Option<StripeMemory> {
    let memory = from.adopt(address)?;
    if memory.len() != STRIPE_BYTES || address_of(memory) != address {
        from.give(memory);
        return None;
    }
    Some(StripeMemory { memory, from })
}

/// A chunk of the stripe table (stripes without memory yet), or `None`.
pub(super) fn chunk() -> Option<Chunk> {
    let mut stripes = Vec::new();
    stripes.try_reserve_exact(CHUNK_STRIPES).ok()?;
    stripes.resize_with(CHUNK_STRIPES, LockedStripe::default);
    Some(stripes.into_boxed_slice())
}

/// Why a visit stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// A buffer refused the copy (unknown, or the range leaves its page).
    Buffer,
    /// A write met a stripe without memory, and none was spare.
    NeedMemory,
}

static ZEROES: [u8; 4096] = [0; 4096];

impl Stripe {
    /// Hands the bytes `range` to `out`, piece by piece (zeroes if the stripe is zero).
    pub(super) fn read(
        &self,
        range: Range<usize>,
        mut out: impl FnMut(&[u8], usize) -> bool,
    ) -> bool {
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
    pub(super) fn writable(&mut self, store: &Store) -> Result<&mut [u8], Stop> {
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

    /// The first byte of `range` that is not zero, if any.
    pub(super) fn first_data(&self, range: Range<usize>) -> Option<usize> {
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
pub(super) struct Store {
    /// Everything but the capacity, which is `sectors`.
    pub(super) geometry: Geometry,
    pub(super) sectors: AtomicU64,
    pub(super) max_sectors: u64,
    pub(super) chunks: Box<[Once<Chunk>]>,
    /// Bytes of memory the disk holds: its stripes' and the spare ones.
    pub(super) resident: AtomicU64,
    /// Bytes of memory it gave back so far.
    pub(super) freed: AtomicU64,
    /// Memory freed from stripes, kept for writes into stripes without memory (room for
    /// `SPARE_STRIPES` reserved when the disk is made: pushing never allocates).
    pub(super) spare: Mutex<Vec<StripeMemory>>,
    /// One bit per stripe `maintain` is to look at (a discard marked or trimmed it, or
    /// it lies beyond a shrunk end), for every stripe the disk can grow to: set by the
    /// I/O path without a lock or an allocation, and `maintain` visits only these.
    pub(super) noted: Box<[AtomicU64]>,
    /// Bits set in `noted` (at least: counted before a bit is set).
    pub(super) noted_count: AtomicUsize,
    /// A write found no spare stripe: `maintain` should allocate some.
    pub(super) wants_memory: AtomicBool,
    /// The last allocation for the spare stripes failed: writes that need memory fail
    /// instead of waiting.
    pub(super) out_of_memory: AtomicBool,
    /// Set with `wants_memory`, for whoever runs `maintain` (shared by several disks).
    pub(super) signal: Option<&'static AtomicBool>,
    /// The budget for disks: stripes are taken from its room alone, and what the disk
    /// gave back and will want again is promised to it there.
    pub(super) heap: Option<&'static HeapBudget>,
    /// Where its stripes come from (the budget's arena, or the heap without one).
    pub(super) frames: &'static dyn StripeFrames,
    /// Bytes promised to the disk in `heap`, as last told (`settle`).
    pub(super) promised: AtomicU64,
    /// Resizing and maintenance, one at a time (the control path's own work); holds the
    /// stripe `maintain` goes on from.
    pub(super) control: Mutex<usize>,
}

impl Store {
    pub(super) fn stripe(&self, index: usize) -> Option<&Mutex<Stripe>> {
        let chunk = self.chunks.get(index / CHUNK_STRIPES)?.get()?;
        chunk.get(index % CHUNK_STRIPES).map(|stripe| &**stripe)
    }

    pub(super) fn capacity_bytes(&self) -> usize {
        (self.sectors.load(Ordering::Acquire) * SECTOR_SIZE) as usize
    }

    /// Stripe `index` has work for `maintain`.
    pub(super) fn note(&self, index: usize) {
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        let Some(word) = self.noted.get(word) else {
            return;
        };
        if word.load(Ordering::Acquire) & bit != 0 {
            return;
        }
        // Counted first, so `maintain` (which clears the bit, then counts down) never
        // counts below zero.
        self.noted_count.fetch_add(1, Ordering::AcqRel);
        if word.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            self.noted_count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Clears stripe `index`'s note; true if it was set.
    pub(super) fn take_note(&self, index: usize) -> bool {
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        let taken = self
            .noted
            .get(word)
            .is_some_and(|word| word.fetch_and(!bit, Ordering::AcqRel) & bit != 0);
        if taken {
            self.noted_count.fetch_sub(1, Ordering::AcqRel);
        }
        taken
    }

    /// Bytes backing every stripe of the capacity would take beyond the memory the disk
    /// holds (its stripes' and the spare ones): what it gave back and will want again
    /// when its guest writes there.
    fn wanted(&self) -> u64 {
        let stripes = self.capacity_bytes().div_ceil(STRIPE_BYTES) as u64;
        (stripes * STRIPE_BYTES as u64).saturating_sub(self.resident.load(Ordering::Relaxed))
    }

    /// Tells the heap's budget what the disk is promised now (after its memory or its
    /// capacity changed; the control path's, one at a time).
    pub(super) fn settle(&self) {
        if let Some(heap) = self.heap {
            let now = self.wanted();
            heap.repromise(self.promised.swap(now, Ordering::AcqRel), now);
        }
    }

    /// How many of `at_most` new stripes the disk may take from the heap now: none of
    /// the reserve, nor of what other disks were promised (of its own promise, all).
    pub(super) fn stripes_to_take(&self, at_most: usize) -> usize {
        let Some(heap) = self.heap else {
            return at_most;
        };
        let room = heap.room_besides(self.promised.load(Ordering::Acquire));
        at_most.min(usize::try_from(room / STRIPE_BYTES as u64).unwrap_or(usize::MAX))
    }

    fn take_spare(&self) -> Option<StripeMemory> {
        let taken = self.spare.lock().pop();
        if taken.is_none() && !self.wants_memory.swap(true, Ordering::AcqRel) {
            if let Some(signal) = self.signal {
                signal.store(true, Ordering::Release);
            }
        }
        taken
    }

    /// Memory of a stripe that no longer needs it: spare, or back to the heap.
    pub(super) fn give_back(&self, memory: StripeMemory) -> u64 {
        let mut spare = self.spare.lock();
        if spare.len() < spare.capacity() {
            spare.push(memory);
            return 0;
        }
        drop(spare);
        // Zeroed as it goes (`StripeMemory`'s drop).
        drop(memory);
        self.resident
            .fetch_sub(STRIPE_BYTES as u64, Ordering::Relaxed);
        self.freed.fetch_add(STRIPE_BYTES as u64, Ordering::Relaxed);
        STRIPE_BYTES as u64
    }

    /// Calls `visit(stripe, range, done)` for the store's bytes `[byte_offset,
    /// byte_offset + len)` stripe by stripe, with each stripe locked while its piece is
    /// visited; `done` is how many bytes came before this piece.
    pub(super) fn visit(
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

impl Drop for Store {
    /// The disk's memory goes back to the heap: so does what it was promised.
    fn drop(&mut self) {
        if let Some(heap) = self.heap {
            heap.repromise(*self.promised.get_mut(), 0);
        }
    }
}
