// SPDX-License-Identifier: MIT OR Apache-2.0
use super::*;
use crate::DmaSegment;
use std::cell::RefCell;
use std::collections::HashMap;

#[test]
fn memory_a_disk_lets_go_holds_none_of_its_data() {
    let stripes = 48;
    let (heap, arena) = crate::heap::fake::budget(4 << 20, 1 << 30, 64);
    let dirty_frees = || arena.dirty.load(core::sync::atomic::Ordering::Relaxed);
    let disk = RamDisk::try_new(
        RamDisk::plain(stripes * STRIPE_SECTORS),
        0,
        None,
        Some(heap),
    )
    .unwrap();
    let full = stripes as usize * STRIPE_BYTES;
    let mut bytes = vec![0xff; full];
    disk.read_at(0, &mut bytes);
    assert!(
        bytes.iter().all(|&b| b == 0),
        "poisoned memory zeroed first"
    );
    disk.write_at(0, &vec![0x5A; full]);
    let mut queue = disk.queue(8);
    discard_now(&mut queue, 0, 40 * STRIPE_SECTORS);
    let before = dirty_frees();
    // 40 stripes emptied: 16 kept spare (still holding the data), 24 to the arena.
    assert_eq!(maintain_all(&disk).freed, 24 * STRIPE_BYTES as u64);
    assert_eq!(dirty_frees(), before, "freed stripes were zeroed");
    // A write into an empty stripe once the spare ones are used takes fresh memory from
    // the arena (poisoned here): the rest of that stripe reads zero.
    for n in 0..=SPARE_STRIPES as u64 {
        while write_page(&mut queue, 1, n * STRIPE_SECTORS, 0x11) == Err(SubmitError::QueueFull) {
            disk.maintain();
        }
        collect(&mut queue);
    }
    let mut stripe = vec![0xff; STRIPE_BYTES];
    disk.read_at(SPARE_STRIPES * STRIPE_BYTES, &mut stripe);
    assert!(stripe[..4096].iter().all(|&b| b == 0x11));
    assert!(stripe[4096..].iter().all(|&b| b == 0));
    // The disk's last handles go: its stripes (8 hold data) and spare memory too.
    drop(queue);
    drop(disk);
    assert_eq!(dirty_frees(), before, "a dropped disk's memory was zeroed");
}

#[test]
fn a_disk_is_refused_the_memory_a_discarded_disk_will_want_back() {
    use crate::heap::fake;
    let stripe = STRIPE_BYTES as u64;
    // The disk's 64 stripes and 8 more.
    let (heap, _) = fake::budget(4 << 20, 1 << 30, 72);
    let made = |stripes: u64, max: u64| {
        RamDisk::try_new(
            RamDisk::plain(stripes * STRIPE_SECTORS),
            max * STRIPE_SECTORS,
            None,
            Some(heap),
        )
    };
    let disk = made(64, 0).unwrap();
    assert_eq!(heap.promised(), 0, "all its memory is in hand");
    let mut queue = disk.queue(32);
    discard_now(&mut queue, 0, 64 * STRIPE_SECTORS);
    maintain_all(&disk);
    // 48 stripes went back to the arena (16 are kept spare): the disk wants them again
    // when its guest writes there.
    assert_eq!(heap.promised(), 48 * stripe);
    // The arena has them free, and 8 stripes more.
    assert_eq!(heap.stripe_room(), 8 * stripe);
    assert_eq!(
        made(16, 0).map(drop),
        Err(OutOfMemory { bytes: 16 * stripe })
    );
    let small = made(4, 64).unwrap();
    assert_eq!(
        small.resize(16 * STRIPE_SECTORS),
        Err(ResizeError::OutOfMemory { bytes: 12 * stripe })
    );
    small.resize(8 * STRIPE_SECTORS).unwrap();
    assert_eq!(heap.stripe_room(), 0);
    // The discarded disk takes back its own: its guest writes into 32 of its stripes
    // (16 from the spare ones, 16 from the arena).
    for n in 0..32 {
        while write_page(&mut queue, 1, n * STRIPE_SECTORS, 0x11) == Err(SubmitError::QueueFull) {
            disk.maintain();
        }
        assert_eq!(collect(&mut queue)[0].status, IoStatus::Ok);
    }
    assert_eq!(heap.promised(), 32 * stripe);
    // A disk that goes takes its promise along.
    drop(queue);
    drop(disk);
    assert_eq!(heap.promised(), 0);
    drop(small);
    assert_eq!(heap.promised(), 0);
}

/// Pages named by number, for buffer access in tests.
#[derive(Default)]
pub(super) struct Pages(pub(super) RefCell<HashMap<u64, Vec<u8>>>);

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

/// A 4 KiB write of `fill` at `sector` through `queue`.
pub(super) fn write_page(
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

pub(super) fn discard_now(queue: &mut RamDiskQueue, sector: u64, nr_sectors: u64) {
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

/// Runs `maintain` until it has no work left; what the calls did together.
pub(super) fn maintain_all(disk: &RamDisk) -> Maintenance {
    let mut all = Maintenance::default();
    for _ in 0..100_000 {
        let done = disk.maintain();
        all.freed += done.freed;
        all.allocated += done.allocated;
        all.visited += done.visited;
        if !done.more {
            return all;
        }
    }
    panic!("maintenance never finished");
}

pub(super) const STRIPE_SECTORS: u64 = (STRIPE_BYTES / 512) as u64;

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

pub(super) fn collect(queue: &mut RamDiskQueue) -> Vec<Completion> {
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
