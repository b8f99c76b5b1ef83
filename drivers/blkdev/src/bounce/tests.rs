// SPDX-License-Identifier: MIT OR Apache-2.0
//! The bounce queue against a pool in a vector and a device that records: grant copies
//! that fail (one segment's status), and a write the device had no room for.

use super::*;
use crate::Geometry;
use std::collections::{HashMap, HashSet};

const GUEST: u16 = 7;

/// Pool pages in a vector; the guest's granted pages in a map. `grant_copy` does every
/// entry it can, as Xen does, and fails the batch if an entry's grant is in `failing`.
struct VecPool {
    pages: Vec<[u8; PAGE]>,
    guest: HashMap<u32, [u8; PAGE]>,
    failing: HashSet<u32>,
    /// Batches and entries of copies in (a write's data from the guest) asked for.
    batches: usize,
    entries: usize,
}

impl VecPool {
    fn new() -> Self {
        VecPool {
            pages: vec![[0; PAGE]; POOL_PAGES],
            guest: HashMap::new(),
            failing: HashSet::new(),
            batches: 0,
            entries: 0,
        }
    }
    /// The pool page a DMA address names.
    fn at(&self, address: u64) -> &[u8; PAGE] {
        &self.pages[(address / PAGE as u64 - 1) as usize]
    }
}

impl BouncePool for VecPool {
    type CopyError = String;
    fn dma_address(&self, page: u16) -> u64 {
        // Page 0 is not at address 0, so a zero buffer is never a pool page.
        (u64::from(page) + 1) * PAGE as u64
    }
    fn fill(&mut self, _: u16, _: usize, _: usize, _: &dyn BufferAccess, _: u64) -> bool {
        unreachable!("every buffer here is a foreign page")
    }
    fn copy_out(&mut self, _: u16, _: usize, _: usize, _: u64) {
        unreachable!("every buffer here is a foreign page")
    }
    fn grant_copy(&mut self, copies: &[PageCopy]) -> Result<(), String> {
        if copies.iter().any(|c| !c.to_guest) {
            self.batches += 1;
        }
        self.entries += copies.iter().filter(|c| !c.to_guest).count();
        let mut failed = None;
        for copy in copies {
            let gref = copy.foreign.gref;
            if self.failing.contains(&gref) || copy.foreign.domain != GUEST {
                failed = Some(gref);
                continue;
            }
            let range = copy.offset as usize..(copy.offset + copy.len) as usize;
            let guest = self.guest.entry(gref).or_insert([0; PAGE]);
            let ours = &mut self.pages[usize::from(copy.page)];
            if copy.to_guest {
                guest[range.clone()].copy_from_slice(&ours[range]);
            } else {
                ours[range.clone()].copy_from_slice(&guest[range]);
            }
        }
        match failed {
            Some(gref) => Err(format!("GNTST_general_error for gref {gref}")),
            None => Ok(()),
        }
    }
}

/// Every buffer names a grant of `GUEST` by its number.
struct Grants;

impl BufferAccess for Grants {
    fn read_buffer(&self, _: u64, _: usize, _: &mut [u8]) -> bool {
        false
    }
    fn write_buffer(&self, _: u64, _: usize, _: &[u8]) -> bool {
        false
    }
    fn foreign_page(&self, buffer: u64) -> Option<ForeignPage> {
        Some(ForeignPage {
            domain: GUEST,
            gref: buffer as u32,
        })
    }
}

/// A device with room for `room` requests at once; it keeps the segments of each
/// request it holds, and completes everything it holds at each poll.
struct Device {
    room: usize,
    refuse: bool,
    held: Vec<(u32, IoOp, Vec<DmaSegment>)>,
    submits: usize,
}

impl Device {
    fn new(room: usize) -> Self {
        Device {
            room,
            refuse: false,
            held: Vec::new(),
            submits: 0,
        }
    }
}

impl BlockDevice for Device {
    fn geometry(&self) -> Geometry {
        Geometry {
            sectors: 1 << 20,
            logical_block_size: 512,
            physical_block_size: 512,
            read_only: false,
            flush: false,
            discard: None,
        }
    }
    fn queue_depth(&self) -> usize {
        self.room
    }
    fn submit(&mut self, request: &IoRequest<'_>, _: &dyn BufferAccess) -> Result<(), SubmitError> {
        if self.refuse {
            return Err(SubmitError::Invalid);
        }
        if self.held.len() >= self.room {
            return Err(SubmitError::QueueFull);
        }
        self.submits += 1;
        self.held
            .push((request.tag, request.op, request.segments.to_vec()));
        Ok(())
    }
    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let held = core::mem::take(&mut self.held);
        for (tag, _, _) in &held {
            sink(Completion {
                tag: *tag,
                status: IoStatus::Ok,
            });
        }
        held.len()
    }
}

type Queue = BounceQueue<Device, VecPool>;

fn queue(room: usize) -> Queue {
    BounceQueue::new(Device::new(room), VecPool::new(), 32, Arc::default())
}

/// A request of whole pages, one per grant.
fn request(tag: u32, op: IoOp, grants: &[u64]) -> (u32, IoOp, Vec<DmaSegment>) {
    let segments = grants
        .iter()
        .map(|&gref| DmaSegment {
            buffer: gref,
            offset: 0,
            len: PAGE as u32,
        })
        .collect();
    (tag, op, segments)
}

fn submit(
    queue: &mut Queue,
    (tag, op, segments): &(u32, IoOp, Vec<DmaSegment>),
) -> Result<(), SubmitError> {
    let request = IoRequest {
        tag: *tag,
        op: *op,
        sector: 8 * u64::from(*tag),
        nr_sectors: 8 * segments.len() as u64,
        preflush: false,
        segments,
    };
    queue.submit(&request, &Grants)
}

fn poll(queue: &mut Queue) -> Vec<(u32, IoStatus)> {
    let mut done = Vec::new();
    queue.poll_completions(&mut |c| done.push((c.tag, c.status)));
    done
}

/// The guest's grants 10, 11, 12 hold pages of 0x10, 0x11, 0x12.
fn guest_pages(queue: &mut Queue) {
    for gref in [10, 11, 12] {
        queue.pool.guest.insert(gref, [gref as u8 + 6; PAGE]);
    }
}

#[test]
fn a_write_whose_copy_in_fails_for_one_segment_is_refused_alone_and_gives_its_pages_back() {
    let mut queue = queue(8);
    guest_pages(&mut queue);
    queue.pool.failing.insert(11);
    let free = queue.free.len();
    assert_eq!(
        submit(&mut queue, &request(1, IoOp::Write, &[10, 11, 12])),
        Err(SubmitError::Invalid),
        "the engine answers it with an error"
    );
    assert_eq!(queue.inner().submits, 0, "the device never saw it");
    assert_eq!(queue.free.len(), free, "its pages are free again");
    assert_eq!(queue.bounced_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(queue.copy_failures.load(Ordering::Relaxed), 1);
    // The next write, of good grants, goes through with its own data.
    assert_eq!(
        submit(&mut queue, &request(2, IoOp::Write, &[10, 12])),
        Ok(())
    );
    let (_, _, segments) = &queue.inner().held[0];
    let carried: Vec<u8> = segments
        .iter()
        .map(|s| queue.pool().at(s.buffer)[0])
        .collect();
    assert_eq!(carried, [0x10, 0x12]);
    assert_eq!(poll(&mut queue), [(2, IoStatus::Ok)]);
    assert_eq!(queue.free.len(), free);
}

#[test]
fn a_read_whose_copy_out_fails_for_one_segment_is_an_error_and_the_others_are_not() {
    let mut queue = queue(8);
    queue.pool.failing.insert(21);
    assert_eq!(
        submit(&mut queue, &request(1, IoOp::Read, &[20, 21])),
        Ok(())
    );
    assert_eq!(submit(&mut queue, &request(2, IoOp::Read, &[22])), Ok(()));
    // The device's data for both, in the pool pages it was given.
    let pages: Vec<u64> = queue
        .inner()
        .held
        .iter()
        .flat_map(|(_, _, s)| s.iter().map(|s| s.buffer))
        .collect();
    for address in pages {
        let page = (address / PAGE as u64 - 1) as usize;
        queue.pool.pages[page] = [0x5a; PAGE];
    }
    let free = queue.free.len();
    let mut done = poll(&mut queue);
    done.sort_by_key(|&(tag, _)| tag);
    assert_eq!(done, [(1, IoStatus::Error), (2, IoStatus::Ok)]);
    assert_eq!(
        queue.pool.guest[&22], [0x5a; PAGE],
        "the good read's data reached the guest"
    );
    assert_eq!(
        queue.free.len(),
        free + 3,
        "every page back, the failed read's too"
    );
    assert_eq!(queue.copy_failures.load(Ordering::Relaxed), 1);
}

#[test]
fn a_write_the_device_has_no_room_for_is_copied_in_once_and_submitted_when_there_is() {
    let mut queue = queue(1);
    guest_pages(&mut queue);
    assert_eq!(submit(&mut queue, &request(1, IoOp::Read, &[20])), Ok(()));
    // The device is full: the write is copied in, and kept rather than refused.
    assert_eq!(
        submit(&mut queue, &request(2, IoOp::Write, &[10, 11])),
        Ok(())
    );
    assert_eq!((queue.pool.batches, queue.pool.entries), (1, 2));
    assert_eq!(queue.inner().submits, 1);
    // Nothing passes it, and nothing is copied for what waits behind it.
    assert_eq!(
        submit(&mut queue, &request(3, IoOp::Write, &[12])),
        Err(SubmitError::QueueFull)
    );
    assert_eq!(queue.pool.batches, 1);
    // The read completes, which makes room: the kept write goes to the device as it
    // was copied, with no second copy.
    assert_eq!(poll(&mut queue), [(1, IoStatus::Ok)]);
    assert_eq!(queue.inner().submits, 2);
    let (tag, _, segments) = &queue.inner().held[0];
    let carried: Vec<u8> = segments
        .iter()
        .map(|s| queue.pool().at(s.buffer)[0])
        .collect();
    assert_eq!((*tag, carried), (2, vec![0x10, 0x11]));
    assert_eq!(
        (queue.pool.batches, queue.pool.entries),
        (1, 2),
        "copied in once"
    );
    // The read's page out, and the write's two pages in, once.
    assert_eq!(queue.bounced_bytes.load(Ordering::Relaxed), 3 * PAGE as u64);
    assert_eq!(poll(&mut queue), [(2, IoStatus::Ok)]);
    // The one behind it goes now.
    assert_eq!(submit(&mut queue, &request(3, IoOp::Write, &[12])), Ok(()));
    assert_eq!(queue.pool.batches, 2);
}

#[test]
fn a_kept_write_the_device_then_refuses_is_answered_with_an_error_and_frees_its_pages() {
    let mut queue = queue(0);
    guest_pages(&mut queue);
    let free = queue.free.len();
    assert_eq!(submit(&mut queue, &request(4, IoOp::Write, &[10])), Ok(()));
    assert_eq!(poll(&mut queue), [], "still no room: it waits");
    queue.inner.refuse = true;
    assert_eq!(poll(&mut queue), [(4, IoStatus::Error)]);
    assert_eq!(queue.free.len(), free);
    // Nothing kept any more: the queue takes requests again.
    queue.inner.refuse = false;
    queue.inner.room = 1;
    assert_eq!(submit(&mut queue, &request(5, IoOp::Write, &[12])), Ok(()));
}

#[test]
fn a_read_the_device_has_no_room_for_is_refused_as_full_and_holds_no_page() {
    let mut queue = queue(0);
    let free = queue.free.len();
    assert_eq!(
        submit(&mut queue, &request(1, IoOp::Read, &[20])),
        Err(SubmitError::QueueFull)
    );
    assert_eq!(queue.free.len(), free);
    assert!(queue.kept.is_none());
}
