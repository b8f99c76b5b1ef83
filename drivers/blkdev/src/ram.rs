//! A RAM disk: the backing store for PVH mode and for tests. Queues are separate handles
//! over one shared store; each keeps its own completion FIFO.
//!
//! Reads and writes are copied during `submit` (the pages they name are reachable only
//! then); the engine bounds one request at 2 MiB (512 segments of 4 KiB). Discards have
//! no such bound (Linux's blkfront sends one discard for the whole disk at mkfs), so a
//! queue zeroes them a bounded piece per `poll_completions` and completes each once all
//! of it is zeroed: one discard never stalls the other rings of its poller.

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use spin::Mutex;

use crate::{
    BlockDevice, BufferAccess, Completion, CompletionQueue, DiscardGeometry, Geometry, IoOp,
    IoRequest, IoStatus, SubmitError, SECTOR_SIZE,
};

/// Bytes per lock of the store. Queues served by different vCPUs take a stripe's lock
/// only for the pieces they copy, so they meet only on the same 64 KiB; a stripe holds
/// whole sectors, so no sector is ever half written.
const STRIPE_BYTES: usize = 64 * 1024;

/// Bytes of discards a queue zeroes per `poll_completions`, at most. 1 MiB takes tens of
/// microseconds to zero (memset runs at several GB/s, slower nested), about what the
/// largest read or write (2 MiB) costs to copy, so a discard delays the other rings of
/// its poller no more than one large request does, and far less than the 1 ms a poller
/// with requests on its device may sleep; a whole 4 GiB disk still finishes in 4096
/// polls. Smaller pieces would only add polls, larger ones lengthen the stall.
pub const DISCARD_BYTES_PER_POLL: usize = 1 << 20;

/// The store shared by all queues of one RAM disk, in independently locked stripes (no
/// lock over the whole disk on the I/O path).
#[derive(Clone, Debug)]
pub struct RamDisk {
    stripes: Arc<[Mutex<Vec<u8>>]>,
    geometry: Geometry,
}

impl RamDisk {
    /// A zero-filled disk of `sectors` 512-byte sectors, writable, with flush and
    /// (secure) discard.
    pub fn new(sectors: u64) -> Self {
        let geometry = Geometry {
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
        };
        Self::with_geometry(geometry)
    }

    /// A zero-filled disk with the given geometry (e.g. read-only, 4 KiB sectors).
    pub fn with_geometry(geometry: Geometry) -> Self {
        let bytes = usize::try_from(geometry.sectors * SECTOR_SIZE).expect("RAM disk size");
        let stripes = (0..bytes.div_ceil(STRIPE_BYTES))
            .map(|i| Mutex::new(alloc::vec![0; STRIPE_BYTES.min(bytes - i * STRIPE_BYTES)]))
            .collect();
        Self { stripes, geometry }
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Handles on this disk's store (clones and queues): 1 means this one alone.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.stripes)
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

    /// Calls `visit(piece, done)` for the store's bytes `[byte_offset, byte_offset + len)`
    /// stripe by stripe, with each stripe locked while its piece is visited; `done` is
    /// how many bytes came before this piece. Stops at the first `false`.
    fn visit(
        &self,
        byte_offset: usize,
        len: usize,
        mut visit: impl FnMut(&mut [u8], usize) -> bool,
    ) -> bool {
        let mut done = 0;
        while done < len {
            let at = byte_offset + done;
            let (stripe, within) = (at / STRIPE_BYTES, at % STRIPE_BYTES);
            let take = (STRIPE_BYTES - within).min(len - done);
            let mut store = self.stripes[stripe].lock();
            if !visit(&mut store[within..within + take], done) {
                return false;
            }
            done += take;
        }
        true
    }

    /// Copy bytes out of the disk (for checks and set-up).
    pub fn read_at(&self, byte_offset: usize, out: &mut [u8]) {
        self.visit(byte_offset, out.len(), |piece, done| {
            out[done..done + piece.len()].copy_from_slice(piece);
            true
        });
    }

    /// Copy bytes into the disk (for set-up).
    pub fn write_at(&self, byte_offset: usize, data: &[u8]) {
        self.visit(byte_offset, data.len(), |piece, done| {
            piece.copy_from_slice(&data[done..done + piece.len()]);
            true
        });
    }

    /// Carry out a read, write or flush on the store; the result is the completion
    /// status. (Discards are zeroed by the queue, piece by piece.)
    fn execute(&self, request: &IoRequest<'_>, buffers: &dyn BufferAccess) -> IoStatus {
        // In range: `submit` checked sector + nr_sectors against the capacity (for
        // everything but a flush, which has no range).
        let start = (request.sector.wrapping_mul(SECTOR_SIZE)) as usize;
        match request.op {
            IoOp::Flush | IoOp::Discard { .. } => IoStatus::Ok,
            IoOp::Read | IoOp::Write => {
                let mut cursor = start;
                for segment in request.segments {
                    let len = segment.len as usize;
                    let offset = segment.offset as usize;
                    let ok = self.visit(cursor, len, |disk, done| {
                        if request.op == IoOp::Read {
                            buffers.write_buffer(segment.buffer, offset + done, disk)
                        } else {
                            buffers.read_buffer(segment.buffer, offset + done, disk)
                        }
                    });
                    if !ok {
                        return IoStatus::Error;
                    }
                    cursor += len;
                }
                IoStatus::Ok
            }
        }
    }
}

/// A discard accepted and not yet zeroed to its end: bytes `[next, end)` of the store.
#[derive(Clone, Copy, Debug)]
struct PendingDiscard {
    tag: u32,
    next: usize,
    end: usize,
}

/// One queue of a [`RamDisk`]. Reads, writes and flushes finish during `submit`;
/// discards are zeroed at most [`DISCARD_BYTES_PER_POLL`] per `poll_completions`, oldest
/// first. Completions are reported by `poll_completions`, as a real device would.
#[derive(Debug)]
pub struct RamDiskQueue {
    disk: RamDisk,
    completions: CompletionQueue,
    /// Discards not finished yet (each holds a place of the queue depth, so its
    /// completion always finds room).
    discards: VecDeque<PendingDiscard>,
}

impl RamDiskQueue {
    /// Zeroes at most [`DISCARD_BYTES_PER_POLL`] bytes of the pending discards and
    /// queues the completion of each one finished.
    fn advance_discards(&mut self) {
        let mut budget = DISCARD_BYTES_PER_POLL;
        while budget > 0 {
            let Some(discard) = self.discards.front_mut() else {
                break;
            };
            let take = (discard.end - discard.next).min(budget);
            self.disk.visit(discard.next, take, |piece, _| {
                piece.fill(0);
                true
            });
            discard.next += take;
            budget -= take;
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
}

impl BlockDevice for RamDiskQueue {
    fn geometry(&self) -> Geometry {
        self.disk.geometry
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
        if !request.fits(nr_sectors, self.disk.geometry.sectors) {
            return Err(SubmitError::Invalid);
        }
        if request.op == IoOp::Write && self.disk.geometry.read_only {
            return Err(SubmitError::Invalid);
        }
        let status = match request.op {
            IoOp::Discard { secure } => {
                if self
                    .disk
                    .geometry
                    .discard
                    .is_none_or(|d| secure && !d.secure)
                {
                    IoStatus::Unsupported
                } else if nr_sectors == 0 {
                    IoStatus::Ok
                } else {
                    // In range (checked above): zeroed by the polls to come.
                    let start = (request.sector * SECTOR_SIZE) as usize;
                    self.discards.push_back(PendingDiscard {
                        tag: request.tag,
                        next: start,
                        end: start + (nr_sectors * SECTOR_SIZE) as usize,
                    });
                    return Ok(());
                }
            }
            _ => self.disk.execute(request, buffers),
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

    /// Zero bytes on the whole disk.
    fn zero_bytes(disk: &RamDisk) -> usize {
        let mut bytes = vec![0; disk.geometry().sectors as usize * 512];
        disk.read_at(0, &mut bytes);
        bytes.iter().filter(|&&b| b == 0).count()
    }

    #[test]
    fn a_whole_disk_discard_is_zeroed_a_bounded_piece_per_poll() {
        // 8 MiB and one page: 9 pieces, the last one short.
        let bytes = 8 * DISCARD_BYTES_PER_POLL + 4096;
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
        assert_eq!(zero_bytes(&disk), 0, "submit zeroes nothing");
        let mut polls = 0;
        let mut zeroed = 0;
        loop {
            let completions = collect(&mut first);
            polls += 1;
            let now = zero_bytes(&disk);
            assert!(
                now > zeroed && now - zeroed <= DISCARD_BYTES_PER_POLL,
                "poll {polls} zeroed {} bytes",
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
        assert_eq!(polls, 9);
        assert_eq!(zeroed, bytes);
    }

    #[test]
    fn pending_discards_hold_their_place_in_the_queue() {
        let disk = RamDisk::new((4 * DISCARD_BYTES_PER_POLL / 512) as u64);
        let mut queue = disk.queue(2);
        let pages = Pages::default();
        let discard = |tag, sector| IoRequest {
            tag,
            op: IoOp::Discard { secure: true },
            sector,
            nr_sectors: (DISCARD_BYTES_PER_POLL / 512 + 1) as u64,
            preflush: false,
            segments: &[],
        };
        queue.submit(&discard(1, 0), &pages).unwrap();
        let second = (2 * DISCARD_BYTES_PER_POLL / 512) as u64;
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
