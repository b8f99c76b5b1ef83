// SPDX-License-Identifier: MIT OR Apache-2.0
//! Physical memory: the frame allocator filled from the PVH memory map, the kernel
//! heap (`linked_list_allocator`, for set-up only: the I/O path never allocates) and the
//! RAM disks' stripe arena (64 KiB units of their own, so a live upgrade can hand them
//! over by address: docs/design.md §4.12).

use crate::arch::paging::IDENTITY_MAPPED_LIMIT;
use crate::bootinfo::BootInfo;
use blkdev::{HeapBudget, StripeArena};
use boot::start_info::{memmap_type, HvmModlistEntry};
use core::alloc::GlobalAlloc;
use linked_list_allocator::LockedHeap;
use machine::frames::{FrameAllocator, FrameError, PhysRange, FRAME_SIZE};

#[global_allocator]
static LINES: LineHeap = LineHeap;

static HEAP: LockedHeap = LockedHeap::empty();

/// The kernel heap as the global allocator: every allocation on cache lines of its own
/// (`blkback::line_layout`), so no two rings' state (engine tables, grant caches, their
/// counters) shares a line, however their allocations fall: two queues on two pollers
/// never write the same line (`xen/blkback/tests/queues_share_no_line.rs`). Costs up to
/// 63 bytes per allocation, taken at set-up only.
struct LineHeap;

// SAFETY: every call goes to `HEAP` with the layout rounded by `line_layout`, the same
// rounding for an allocation and its release (it only depends on the layout); the
// rounded layout is at least as large and as aligned as the one asked for.
unsafe impl GlobalAlloc for LineHeap {
    unsafe fn alloc(&self, layout: core::alloc::Layout) -> *mut u8 {
        match blkback::line_layout(layout) {
            // SAFETY: the caller's contract, with a layout at least as strict.
            Some(lines) => unsafe { GlobalAlloc::alloc(&HEAP, lines) },
            None => core::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: core::alloc::Layout) {
        // `alloc` succeeded with this layout, so the rounding does too.
        if let Some(lines) = blkback::line_layout(layout) {
            // SAFETY: `ptr` came from `HEAP.alloc` with exactly this rounded layout.
            unsafe { GlobalAlloc::dealloc(&HEAP, ptr, lines) }
        }
    }
}

static FRAMES: spin::Mutex<FrameAllocator> = spin::Mutex::new(FrameAllocator::new());

/// RAM as the memory map said at boot (identity-mapped part), for checking a handover
/// block against: at most `MAX_RAM_RANGES` entries.
const MAX_RAM_RANGES: usize = 32;
static RAM: spin::Mutex<([core::ops::Range<u64>; MAX_RAM_RANGES], usize)> =
    spin::Mutex::new(([const { 0..0 }; MAX_RAM_RANGES], 0));

/// RAM as the memory map said at boot.
pub fn ram_ranges() -> alloc::vec::Vec<core::ops::Range<u64>> {
    let ram = RAM.lock();
    ram.0[..ram.1].to_vec()
}

/// Heap size: a quarter of free memory, at least HEAP_MIN (or all there is): rings'
/// engines, device queues and bounce pages, RAM disks' stripe tables and the control
/// path. RAM disks' stripes take the stripe arena: every 64 KiB-aligned run left after
/// the heap, less FRAMES_KEPT kept as frames for page tables, shared pages and stacks.
const HEAP_MIN: u64 = 32 << 20;
const FRAMES_KEPT: u64 = 8 << 20;

/// The RAM disks' stripes (`blkdev::StripeFrames`), filled once at boot.
pub static STRIPES: StripeArena = StripeArena::new();

extern "C" {
    static __image_start: u8;
    static __image_end: u8;
    static __notes_start: u8;
    static __notes_end: u8;
}

#[derive(Debug, Clone, Copy)]
pub struct MemoryReport {
    pub ram_bytes: u64,
    pub heap_start: u64,
    pub heap_bytes: u64,
    /// The stripe arena's size.
    pub stripe_bytes: u64,
    pub image: PhysRange,
    /// Where every image is loaded, kept free for the next one (`handover::image`).
    pub load_window: PhysRange,
    /// Booted from a live upgrade: the memory ranges its handover block lists (and
    /// their bytes), kept out of the frame allocator; `None` on a cold boot or when the
    /// block was refused (logged).
    pub kept: Option<(usize, u64)>,
}

pub fn image_range() -> PhysRange {
    // Only the addresses of the linker-script symbols are taken, never their contents.
    PhysRange::new(
        &raw const __image_start as u64,
        &raw const __image_end as u64,
    )
}

/// The image's ELF notes (the `.note` section: PVH entry, build id, handover versions),
/// as loaded.
pub fn image_notes() -> &'static [u8] {
    let start = &raw const __notes_start;
    let len = (&raw const __notes_end as usize).saturating_sub(start as usize);
    // SAFETY: linker.ld puts the `.note` section between the two symbols, inside the
    // image's read-only data, loaded with the image and never written.
    unsafe { core::slice::from_raw_parts(start, len) }
}

/// Fills the frame allocator from the memory map and carves out the heap. `handover`:
/// the handover module (address, length) when booted from a live upgrade, whose memory
/// ranges are kept out before the heap is carved.
pub fn init(info: &BootInfo, handover: Option<(u64, u64)>) -> Result<MemoryReport, FrameError> {
    let mut frames = FRAMES.lock();
    let mut ram_bytes = 0;
    for entry in info.memmap().iter().filter(|e| e.kind == memmap_type::RAM) {
        ram_bytes += entry.size;
        // Only identity-mapped RAM is handed out until the kernel maps more.
        let end = entry
            .addr
            .saturating_add(entry.size)
            .min(IDENTITY_MAPPED_LIMIT);
        if entry.addr < end {
            frames.add(PhysRange::new(entry.addr, end))?;
            let mut ram = RAM.lock();
            if ram.1 < MAX_RAM_RANGES {
                let n = ram.1;
                ram.0[n] = entry.addr..end;
                ram.1 += 1;
            }
        }
    }
    // Keep out: the real-mode area and firmware data below 1 MiB, the image, and what
    // the loader handed us (start info, memory map, command line, modules).
    frames.remove(PhysRange::new(0, 1 << 20));
    let image = image_range();
    frames.remove(image);
    // And the rest of the load window: a live upgrade's next image is loaded there, so
    // nothing this image allocates (heap, RAM disks, vcpu_info, the handover) may lie in
    // it (docs/design.md §4.12).
    let window = handover::image::LOAD_WINDOW;
    frames.remove(PhysRange::new(window.start, window.end));
    let si = &info.start_info;
    let reserve = |frames: &mut FrameAllocator, start: u64, len: u64| {
        if start != 0 {
            frames.remove(PhysRange::new(start, start.saturating_add(len.max(1))));
        }
    };
    reserve(
        &mut frames,
        info.start_info_paddr,
        core::mem::size_of_val(si) as u64,
    );
    reserve(
        &mut frames,
        si.memmap_paddr,
        u64::from(si.memmap_entries) * 24,
    );
    reserve(
        &mut frames,
        si.cmdline_paddr,
        crate::bootinfo::MAX_CMDLINE_LEN as u64,
    );
    let modlist_len = u64::from(si.nr_modules) * core::mem::size_of::<HvmModlistEntry>() as u64;
    reserve(&mut frames, si.modlist_paddr, modlist_len);
    for i in 0..u64::from(si.nr_modules) {
        let entry_paddr = si.modlist_paddr + i * core::mem::size_of::<HvmModlistEntry>() as u64;
        if crate::physmem::in_identity_map(entry_paddr, core::mem::size_of::<HvmModlistEntry>()) {
            // SAFETY: the boot loader's module list, which nothing writes (identity mapped,
            // checked above); plain integers.
            let module: HvmModlistEntry = unsafe { crate::physmem::read_value(entry_paddr) };
            reserve(&mut frames, module.paddr, module.size);
            reserve(
                &mut frames,
                module.cmdline_paddr,
                crate::bootinfo::MAX_CMDLINE_LEN as u64,
            );
        }
    }

    // Every module (beyond those BootInfo kept, too), whatever it holds.
    let kept = handover.and_then(|module| keep_handover_ranges(info, &mut frames, image, module));

    let free_bytes_before_heap = frames.free_bytes();
    let heap_bytes = (free_bytes_before_heap / 4).max(HEAP_MIN.min(free_bytes_before_heap / 4 * 3))
        / FRAME_SIZE
        * FRAME_SIZE;
    let heap_start = frames.allocate_contiguous(heap_bytes / FRAME_SIZE, 2 << 20)?;
    // SAFETY: the range was just taken from the frame allocator, so nothing else uses it;
    // it is identity mapped, writable, and handed to the heap exactly once.
    unsafe { HEAP.lock().init(heap_start as *mut u8, heap_bytes as usize) };
    let stripe_bytes = fill_stripes(&mut frames);
    Ok(MemoryReport {
        ram_bytes,
        heap_start,
        heap_bytes,
        stripe_bytes,
        image,
        load_window: PhysRange::new(window.start, window.end),
        kept,
    })
}

/// Checks the handover block in a heap of its own (frames taken for the moment), keeps
/// every memory range it lists out of `frames`, then gives those frames back and leaves
/// the heap empty for `init` to carve: the block is untrusted until decoded, and
/// decoding needs a heap, but the real heap must not land on a range it lists. The
/// block is decoded again, in the real heap, when the rest of it is used.
///
/// The scratch heap lies in the load window past this image when it fits there: any
/// free frame elsewhere may be one the block lists and something still writes, above
/// all a `vcpu_info` or `shared_info` frame, where Xen keeps writing the time (it
/// corrupted a decoded stripe list in the rig), while no image ever lets anything
/// live in the window (`init`) and a jump passes no module there.
fn keep_handover_ranges(
    info: &BootInfo,
    frames: &mut FrameAllocator,
    image: PhysRange,
    (paddr, len): (u64, u64),
) -> Option<(usize, u64)> {
    let scratch_frames = (len.saturating_mul(4) + (1 << 20)).div_ceil(FRAME_SIZE);
    let window = handover::image::LOAD_WINDOW;
    let tail = image.end.next_multiple_of(FRAME_SIZE);
    let tail_end = tail.saturating_add(scratch_frames * FRAME_SIZE);
    let module_in_tail = info
        .modules()
        .iter()
        .any(|m| m.paddr < tail_end && tail < m.paddr.saturating_add(m.size));
    let in_window = tail >= window.start && tail_end <= window.end && !module_in_tail;
    let scratch = if in_window {
        tail
    } else {
        match frames.allocate_contiguous(scratch_frames, FRAME_SIZE) {
            Ok(start) => start,
            Err(e) => {
                log::error!("upgrade: no memory to check the handover block ({e:?}); ignored");
                return None;
            }
        }
    };
    // SAFETY: the frames are the load window past the image (out of every allocator,
    // no module there: checked above) or were just taken from the allocator, and nothing
    // else uses them; identity mapped and writable. The heap is empty (nothing allocated
    // before `init`) and is emptied again below, after every allocation made in it is
    // dropped.
    unsafe {
        HEAP.lock()
            .init(scratch as *mut u8, (scratch_frames * FRAME_SIZE) as usize)
    };
    log::info!(
        "upgrade: handover block checked in a scratch heap at {scratch:#x} ({})",
        if in_window {
            "the load window"
        } else {
            "free frames"
        }
    );
    let (ram, n) = info.ram();
    let block = crate::handoff::read_module(paddr, len);
    let limits = handover::block::Limits {
        ram: &ram[..n],
        vcpus: crate::smp::MAX_CPUS,
        max_queues: crate::smp::MAX_CPUS,
    };
    let decoded = handover::block::Handover::decode(&block, &limits);
    // Frames taken from the allocator go back first (their bytes stay as they are until
    // the heap is carved), so that a range the block lists inside them is removed after.
    if !in_window {
        if let Err(e) = frames.free(scratch, scratch_frames) {
            log::warn!("upgrade: scratch frames not given back ({e:?})");
        }
    }
    let kept = match &decoded {
        Ok(h) => {
            for range in &h.ranges {
                frames.remove(PhysRange::new(range.start, range.end()));
            }
            Some((h.ranges.len(), h.ranges.iter().map(|r| r.len).sum()))
        }
        Err(e) => {
            log::error!("upgrade: handover block refused: {e}");
            None
        }
    };
    drop(decoded);
    drop(block);
    *HEAP.lock() = linked_list_allocator::Heap::empty();
    kept
}

/// Moves every whole 64 KiB-aligned run of free frames but `FRAMES_KEPT` into the stripe
/// arena (the heap exists by now: the arena's unit table is on it); returns its bytes.
fn fill_stripes(frames: &mut FrameAllocator) -> u64 {
    const UNIT: u64 = blkdev::STRIPE_BYTES as u64;
    let mut spare = frames.free_bytes().saturating_sub(FRAMES_KEPT);
    let ranges: alloc::vec::Vec<PhysRange> = frames.ranges().to_vec();
    let mut added = 0;
    // Highest first: low frames stay for page tables and shared pages.
    for range in ranges.iter().rev() {
        let start = range.start.next_multiple_of(UNIT);
        let end = range.end / UNIT * UNIT;
        if end <= start || spare < UNIT {
            continue;
        }
        let len = (end - start).min(spare / UNIT * UNIT);
        let run = PhysRange::new(end - len, end);
        frames.remove(run);
        spare -= len;
        // SAFETY: the run was just taken from the frame allocator, so nothing else uses
        // it; it lies below `IDENTITY_MAPPED_LIMIT` (the allocator holds nothing above),
        // so it is identity mapped and writable; it is handed to the arena once, for the
        // domain's life (the arena hands out each unit to one owner at a time).
        let memory = unsafe { core::slice::from_raw_parts_mut(run.start as *mut u8, len as usize) };
        added += STRIPES.add(memory);
    }
    added
}

/// Booted from a live upgrade: the RAM disks' stripes the handover lists (its RamDisk
/// ranges, kept out of the frame allocator and so of the heap) join the stripe arena,
/// where `RamDisk::adopt` finds them. Before any RAM disk is opened; returns the bytes.
pub fn add_handed_stripes(handover: &handover::block::Handover) -> u64 {
    let mut added = 0;
    for range in handover
        .ranges
        .iter()
        .filter(|r| r.kind == handover::block::RangeKind::RamDisk)
    {
        // SAFETY: `Handover::decode` checked the range lies in RAM below the identity
        // map's end, page-aligned, overlapping no other range; `init` kept it out of
        // the frame allocator before the heap was carved, so nothing else uses it; it
        // goes to the arena once (ranges are disjoint), for the domain's life.
        let memory =
            unsafe { core::slice::from_raw_parts_mut(range.start as *mut u8, range.len as usize) };
        added += STRIPES.add(memory);
    }
    added
}

pub fn allocate_frame() -> Result<u64, FrameError> {
    FRAMES.lock().allocate()
}

#[cfg(feature = "test-hooks")]
pub fn free_frame(paddr: u64) -> Result<(), FrameError> {
    FRAMES.lock().free(paddr, 1)
}

pub fn free_frame_bytes() -> u64 {
    FRAMES.lock().free_bytes()
}

/// Bytes of heap not in use now.
pub fn heap_free() -> usize {
    HEAP.lock().free()
}

/// `faulttest.heap-left-kib` (test image): takes heap, for good, until the memory for disks
/// and rings has `kib` KiB left, so that a scenario meets the refusals of a short heap.
/// Returns the KiB taken.
#[cfg(feature = "test-hooks")]
pub fn leave_for_disks(kib: u64) -> u64 {
    let want = kib << 10;
    let mut taken = 0u64;
    let mut piece = 1u64 << 20;
    while DISK_MEMORY.room() > want && piece >= 4096 {
        let take = piece.min(DISK_MEMORY.room() - want);
        let mut held: alloc::vec::Vec<u8> = alloc::vec::Vec::new();
        if held.try_reserve_exact(take as usize).is_ok() {
            core::mem::forget(held);
            taken += take;
        } else {
            piece /= 2;
        }
    }
    taken >> 10
}

/// Heap no disk or ring may take. The control path allocates infallibly (a failed
/// allocation aborts the domain), so the reserve must hold what it allocates once disks
/// and rings have taken all the rest: the state of each vbd the toolstack adds (paths,
/// negotiation, watches: a few KiB, kept while it is refused too), each round's
/// passing strings (xenstore replies of 4 KiB at most, a statistics line per vbd), and
/// the small tables a disk or ring makes infallibly once its bulk memory was granted (a
/// device queue's command slots or a RAM disk queue's completions, tens of KiB). Those
/// tables, for every ring the map space allows (`backend::space`: about 21), take under
/// 1 MiB of it; the rest holds a few hundred vbds.
pub const CONTROL_RESERVE: u64 = 4 << 20;

/// The memory disks and rings may use: rings' engines, device queues, bounce pages and
/// RAM disks' stripe tables are taken only from the heap's room, RAM disks' stripes
/// only from the arena's (`blkdev::HeapBudget`).
pub static DISK_MEMORY: HeapBudget = HeapBudget::new(CONTROL_RESERVE, heap_free, &STRIPES);

/// Bytes a ring's engine may take now (`DISK_MEMORY`'s room).
pub fn ring_room() -> usize {
    usize::try_from(DISK_MEMORY.room()).unwrap_or(usize::MAX)
}

/// Bytes of heap in use now.
#[cfg(feature = "test-hooks")]
pub fn heap_used() -> usize {
    HEAP.lock().used()
}

/// Bytes of heap free and in use, read together (`data/blkdom-pollers`: a soak compares
/// them before and after guests come and go).
pub fn heap_usage() -> (usize, usize) {
    let heap = HEAP.lock();
    (heap.free(), heap.used())
}
