// SPDX-License-Identifier: MIT OR Apache-2.0
//! Two queues served by two pollers share no written cache line on the I/O path.
//!
//! blkdom serves queue q of a disk on vCPU q mod n, each with its own engine, ring,
//! grants handle and device queue. If the two pollers wrote the same 64-byte line (a
//! shared counter, or two queues' tables that happen to meet in one line), every request
//! would bounce that line between their CPUs, and queues would stop scaling. This
//! machine cannot show 8-queue scaling in the nested rig, so this test checks the cause
//! directly, two ways, for persistent and transient grants and both ring sizes:
//!
//! - Layout: every allocation made while building one queue (its engine's tables, grant
//!   cache, ring, grants, device, the engine itself) is recorded with its owner; no cache
//!   line may hold bytes of both queues' allocations. The heap here is the kernel's
//!   (`linked_list_allocator` with `blkback::line_layout`, `kernel/src/mm.rs`).
//! - Writes: the whole heap and every writable static of this program are snapshot;
//!   queue A alone serves requests (its frontend fills the ring, its engine polls), the
//!   memory is snapshot again; then queue B alone; then the lines each phase changed are
//!   compared: none may have been changed by both. A counter shared by the queues (a
//!   static, or a field of a shared object) changes in both phases and fails this; so
//!   does a heap object of one queue written next to one of the other.
//!
//! A write that leaves a line as it was (a lock taken and released) is not seen by the
//! second check; the first covers every line of the queues' own allocations whatever is
//! written there. `QUEUE_LINES_UNROUNDED=1` runs with the heap without the kernel's
//! rounding, to see the checks fail (two queues' allocations meet in a line).
//!
//! Linux only (the writable statics come from /proc/self/maps); a harness of its own, so
//! no other thread runs while the memory is compared.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use blkback::abi;
use blkback::engine::{Engine, EngineConfig};
use blkback::fake::wire::encode_direct;
use blkback::fake::{
    null_disk, CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, XenGrants,
};
use blkback::parse::SegmentDesc;
use blkback::ring::RingMemory;
use blkback::{line_layout, CACHE_LINE};
use blkdev::NullDisk;
use linked_list_allocator::LockedHeap;

const ARENA_BYTES: usize = 64 << 20;
const MAX_RECORDED: usize = 8192;

/// The kernel's heap over an arena, once `ARENA_START` is set (before: the system's,
/// for what the runtime allocates before `main`).
struct TestHeap;

static HEAP: LockedHeap = LockedHeap::empty();
static ARENA_START: AtomicUsize = AtomicUsize::new(0);
/// The kernel's rounding to whole lines (cleared by `QUEUE_LINES_UNROUNDED=1`).
static ROUNDED: AtomicBool = AtomicBool::new(true);
/// Which queue the allocations being made belong to (0: none recorded).
static OWNER: AtomicU8 = AtomicU8::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Allocations made for a queue: start, end (bytes asked for), owner.
static RECORDED: [[AtomicUsize; 3]; MAX_RECORDED] =
    [const { [const { AtomicUsize::new(0) }; 3] }; MAX_RECORDED];
static RECORDED_LEN: AtomicUsize = AtomicUsize::new(0);

fn in_arena(ptr: *mut u8) -> bool {
    let start = ARENA_START.load(Ordering::Relaxed);
    start != 0 && (start..start + ARENA_BYTES).contains(&(ptr as usize))
}

fn heap_layout(layout: Layout) -> Option<Layout> {
    if ROUNDED.load(Ordering::Relaxed) {
        line_layout(layout)
    } else {
        Some(layout)
    }
}

// SAFETY: before the arena exists every call goes to `System`; after, to `HEAP` (which
// owns the arena) with the layout rounded the same way for an allocation and its release
// (`ROUNDED` is set before the arena, never after), and a release goes back to whichever
// allocator owns the address. The rounded layout is at least as large and as aligned.
unsafe impl GlobalAlloc for TestHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        if ARENA_START.load(Ordering::Relaxed) == 0 {
            // SAFETY: the caller's contract.
            return unsafe { System.alloc(layout) };
        }
        let Some(rounded) = heap_layout(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's contract, with a layout at least as strict.
        let ptr = unsafe { HEAP.alloc(rounded) };
        let owner = OWNER.load(Ordering::Relaxed);
        if owner != 0 && !ptr.is_null() {
            let n = RECORDED_LEN.fetch_add(1, Ordering::Relaxed);
            assert!(n < MAX_RECORDED, "more allocations than recorded");
            let entry = &RECORDED[n];
            entry[0].store(ptr as usize, Ordering::Relaxed);
            entry[1].store(ptr as usize + layout.size(), Ordering::Relaxed);
            entry[2].store(usize::from(owner), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // A released allocation is no queue's any more (its memory may be the next's).
        for entry in &RECORDED[..RECORDED_LEN.load(Ordering::Relaxed)] {
            if entry[0].load(Ordering::Relaxed) == ptr as usize {
                entry[2].store(0, Ordering::Relaxed);
            }
        }
        if in_arena(ptr) {
            let rounded = heap_layout(layout).expect("allocated with this layout");
            // SAFETY: `ptr` came from `HEAP.alloc` with this rounded layout.
            unsafe { HEAP.dealloc(ptr, rounded) }
        } else {
            // SAFETY: `ptr` came from `System.alloc` with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }
}

#[global_allocator]
static ALLOCATOR: TestHeap = TestHeap;

/// Gives the heap its arena (taken from the system allocator, never released).
fn init_arena() {
    if std::env::var_os("QUEUE_LINES_UNROUNDED").is_some() {
        ROUNDED.store(false, Ordering::Relaxed);
    }
    let layout = Layout::from_size_align(ARENA_BYTES, 4096).expect("arena layout");
    // SAFETY: a non-zero size.
    let arena = unsafe { System.alloc_zeroed(layout) };
    assert!(!arena.is_null(), "arena");
    // SAFETY: the arena is ours alone from now on, valid for `ARENA_BYTES` bytes.
    unsafe { HEAP.lock().init(arena, ARENA_BYTES) };
    ARENA_START.store(arena as usize, Ordering::Release);
}

/// One queue as a poller and a frontend see it.
struct Queue {
    front: FrontRing,
    /// Grants the frontend uses, in turn (twice the ring's slots, so that cached
    /// grants and slots do not pair up the same way every round).
    grants: u32,
    /// Requests sent so far: ids, sectors and grants vary with it, so the lines a
    /// request passes through change with every one (a line written with the bytes it
    /// already held would not show in the comparison).
    sent: u64,
    engine: Engine<RingView, XenGrants, NullDisk, CountingEvents>,
    /// The ring's pages, for the sanity check.
    ring: RingView,
}

impl Queue {
    /// Everything a queue has, made with its allocations recorded as `owner`'s: its
    /// frontend's memory and grant table, ring, engine and device queue.
    fn new(owner: u8, order: u32, persistent: bool) -> Box<Queue> {
        OWNER.store(owner, Ordering::Relaxed);
        let ring_pages = 1usize << order;
        let grants = 2 * abi::ring_slots(order) + 3;
        let memory = GuestMemory::new(ring_pages + grants as usize);
        let table = GrantTable::new(memory.clone());
        for gref in 1..=grants {
            table.grant(gref, ring_pages + gref as usize - 1, false);
        }
        let pages: Vec<usize> = (0..ring_pages).collect();
        let front = FrontRing::new(RingView::new(memory.clone(), pages.clone()), order);
        // The frontend polls: no events.
        front.view().store_u32(abi::sring::RSP_EVENT, u32::MAX / 2);
        let engine = Engine::new(
            RingView::new(memory.clone(), pages.clone()),
            XenGrants(table),
            null_disk(abi::ring_slots(order) as usize),
            CountingEvents::default(),
            EngineConfig::new(order, persistent),
        )
        .expect("engine");
        let queue = Box::new(Queue {
            front,
            grants,
            sent: 0,
            engine,
            ring: RingView::new(memory, pages),
        });
        OWNER.store(0, Ordering::Relaxed);
        queue
    }

    /// Rounds of: the frontend takes every response and refills the ring (4 KiB reads,
    /// each with an id, sector and grant of its own), the poller polls. Allocates
    /// nothing.
    fn serve(&mut self, rounds: usize) {
        let slots = self.front.slots() as usize;
        for _ in 0..rounds {
            self.front.take_responses(|_| {});
            for _ in 0..self.front.free_slots() {
                let n = self.sent;
                self.sent += 1;
                let seg = SegmentDesc {
                    gref: 1 + (n % u64::from(self.grants)) as u32,
                    first_sect: 0,
                    last_sect: 7,
                };
                let request = encode_direct(abi::OP_READ, n, (n % 4096) * 8, &[seg]);
                self.front.put_request(&request);
            }
            self.front.push_requests();
            self.engine.poll(slots);
        }
    }
}

/// A range of memory the snapshots cover.
#[derive(Clone, Copy, Debug)]
struct Region {
    start: usize,
    len: usize,
    name: &'static str,
}

/// The writable mappings of this program's image (.data, .bss), from /proc/self/maps.
fn static_regions() -> Vec<Region> {
    let exe = std::fs::read_link("/proc/self/exe").expect("/proc/self/exe");
    let exe = exe.to_string_lossy().into_owned();
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mut regions: Vec<Region> = Vec::new();
    let mut last_end = None;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (range, perms) = (fields[0], fields[1]);
        let path = fields.get(5).copied().unwrap_or("");
        let (start, end) = range.split_once('-').expect("range");
        let start = usize::from_str_radix(start, 16).expect("start");
        let end = usize::from_str_radix(end, 16).expect("end");
        // The image's writable pages, and the anonymous pages right after them (the
        // rest of .bss).
        let image = path == exe;
        let bss_tail = path.is_empty() && last_end == Some(start);
        if perms.starts_with("rw") && (image || bss_tail) {
            regions.push(Region {
                start,
                len: end - start,
                name: "static",
            });
        }
        last_end = (image && perms.starts_with("rw")).then_some(end);
    }
    assert!(
        !regions.is_empty(),
        "no writable image mapping in /proc/self/maps"
    );
    regions
}

/// Copies of the regions, in memory of the system allocator's (outside everything
/// compared), made before the phases.
struct Snapshot {
    bytes: &'static mut [u8],
}

impl Snapshot {
    fn new(regions: &[Region]) -> Snapshot {
        let len: usize = regions.iter().map(|r| r.len).sum();
        let layout = Layout::from_size_align(len, 4096).expect("snapshot layout");
        // SAFETY: a non-zero size; the buffer is leaked, so the slice lives forever.
        let bytes = unsafe {
            let ptr = System.alloc_zeroed(layout);
            assert!(!ptr.is_null());
            std::slice::from_raw_parts_mut(ptr, len)
        };
        Snapshot { bytes }
    }

    fn take(&mut self, regions: &[Region]) {
        let mut at = 0;
        for region in regions {
            // SAFETY: the region is mapped readable for the whole run (the arena, the
            // image's data); nothing else runs, so no one writes it while it is copied,
            // and the copy goes to memory outside every region.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    region.start as *const u8,
                    self.bytes[at..].as_mut_ptr(),
                    region.len,
                );
            }
            at += region.len;
        }
    }
}

/// Addresses of the lines that differ between two snapshots.
fn changed_lines(regions: &[Region], before: &Snapshot, after: &Snapshot) -> Vec<usize> {
    let mut lines = Vec::new();
    let mut at = 0;
    for region in regions {
        for line in (0..region.len).step_by(CACHE_LINE) {
            let a = &before.bytes[at + line..at + line + CACHE_LINE];
            let b = &after.bytes[at + line..at + line + CACHE_LINE];
            if a != b {
                lines.push(region.start + line);
            }
        }
        at += region.len;
    }
    lines
}

/// The queues' allocations still held: (start, end, owner).
fn recorded() -> Vec<(usize, usize, usize)> {
    RECORDED[..RECORDED_LEN.load(Ordering::Relaxed)]
        .iter()
        .map(|e| {
            (
                e[0].load(Ordering::Relaxed),
                e[1].load(Ordering::Relaxed),
                e[2].load(Ordering::Relaxed),
            )
        })
        .filter(|&(_, _, owner)| owner != 0)
        .collect()
}

/// What a line holds, for a failure message.
fn describe(line: usize, regions: &[Region], allocations: &[(usize, usize, usize)]) -> String {
    let owners: Vec<String> = allocations
        .iter()
        .filter(|(start, end, _)| *start < line + CACHE_LINE && line < *end)
        .map(|(start, end, owner)| format!("queue {owner}'s {} bytes at {start:#x}", end - start))
        .collect();
    let region = regions
        .iter()
        .find(|r| (r.start..r.start + r.len).contains(&line))
        .map_or("?", |r| r.name);
    format!("line {line:#x} ({region}): {}", owners.join(", "))
}

/// No line holds bytes of allocations of both queues. Allocations never overlap, so
/// only a line at either end of one can hold another's bytes: those are compared.
/// Returns how many lines the queues' allocations cover.
fn check_layout(regions: &[Region]) -> Result<usize, String> {
    let allocations = recorded();
    let mut ends = Vec::with_capacity(2 * allocations.len());
    let mut covered = 0;
    for &(start, end, owner) in &allocations {
        let first = start / CACHE_LINE;
        let last = (end.max(start + 1) - 1) / CACHE_LINE;
        covered += last - first + 1;
        ends.push((first, owner));
        ends.push((last, owner));
    }
    ends.sort_unstable();
    let mut shared: Vec<usize> = ends
        .windows(2)
        .filter(|pair| pair[0].0 == pair[1].0 && pair[0].1 != pair[1].1)
        .map(|pair| pair[0].0 * CACHE_LINE)
        .collect();
    if shared.is_empty() {
        return Ok(covered);
    }
    shared.dedup();
    Err(format!(
        "{} lines, such as\n  {}",
        shared.len(),
        shared
            .iter()
            .take(8)
            .map(|&line| describe(line, regions, &allocations))
            .collect::<Vec<_>>()
            .join("\n  ")
    ))
}

fn run(order: u32, persistent: bool) -> Result<String, String> {
    RECORDED_LEN.store(0, Ordering::Relaxed);
    let mut a = Queue::new(1, order, persistent);
    let mut b = Queue::new(2, order, persistent);
    let rounds = 61;
    // Warm up: caches filled, every slot used once.
    a.serve(rounds);
    b.serve(rounds);
    let mut regions = static_regions();
    regions.push(Region {
        start: ARENA_START.load(Ordering::Relaxed),
        len: ARENA_BYTES,
        name: "heap",
    });
    let mut snapshots = [
        Snapshot::new(&regions),
        Snapshot::new(&regions),
        Snapshot::new(&regions),
    ];
    let (served_a, served_b) = (a.engine.stats().reads, b.engine.stats().reads);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    snapshots[0].take(&regions);
    a.serve(rounds);
    snapshots[1].take(&regions);
    b.serve(rounds);
    snapshots[2].take(&regions);
    assert_eq!(
        ALLOCATIONS.load(Ordering::Relaxed),
        allocations,
        "the phases allocated: the comparison would see the heap's own bookkeeping"
    );
    assert!(a.engine.stats().reads > served_a && b.engine.stats().reads > served_b);
    let layout_lines = check_layout(&regions)
        .map_err(|lines| format!("lines holding both queues' allocations:\n  {lines}"))?;
    let by_a = changed_lines(&regions, &snapshots[0], &snapshots[1]);
    let by_b = changed_lines(&regions, &snapshots[1], &snapshots[2]);
    // The comparison sees what it must: each queue's ring indices.
    for (name, queue, lines) in [("A", &a, &by_a), ("B", &b, &by_b)] {
        if !lines.contains(&queue.ring_header_line()) {
            return Err(format!(
                "queue {name}'s ring header is not among the lines it changed"
            ));
        }
    }
    let both: Vec<usize> = by_a
        .iter()
        .copied()
        .filter(|line| by_b.binary_search(line).is_ok())
        .collect();
    if !both.is_empty() {
        let allocations = recorded();
        return Err(format!(
            "{} lines written by both queues:\n  {}",
            both.len(),
            both.iter()
                .take(8)
                .map(|&line| describe(line, &regions, &allocations))
                .collect::<Vec<_>>()
                .join("\n  ")
        ));
    }
    if std::env::var_os("QUEUE_LINES_VERBOSE").is_some() {
        let allocations = recorded();
        for &line in &by_a {
            println!("  A wrote {}", describe(line, &regions, &allocations));
        }
    }
    Ok(format!(
        "{} lines of queue allocations, none shared; lines written: A {}, B {}, by both 0",
        layout_lines,
        by_a.len(),
        by_b.len()
    ))
}

impl Queue {
    /// The line of the ring's indices (`req_prod`..`rsp_event`), which every round
    /// writes.
    fn ring_header_line(&self) -> usize {
        self.ring.page_address(0) / CACHE_LINE * CACHE_LINE
    }
}

fn main() {
    // Test runners ask a test binary for its tests first (cargo-nextest: `--list
    // --format terse`, one `name: test` line each); this binary is one test.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|arg| arg == "--list") {
        if !args.iter().any(|arg| arg == "--ignored") {
            println!("queues_share_no_line: test");
        }
        return;
    }
    if !cfg!(target_os = "linux") {
        println!("queues_share_no_line: skipped (needs /proc/self/maps)");
        return;
    }
    init_arena();
    let mut failed = false;
    for (order, persistent) in [(0, true), (0, false), (4, true), (4, false)] {
        let name = format!(
            "ring order {order}, persistent grants {}",
            if persistent { "on" } else { "off" }
        );
        match run(order, persistent) {
            Ok(summary) => println!("queues_share_no_line: {name}: ok ({summary})"),
            Err(why) => {
                println!("queues_share_no_line: {name}: FAILED: {why}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
