// SPDX-License-Identifier: MIT OR Apache-2.0
//! Helpers for driver tests.

extern crate std;
use blkdev::{
    BlockDevice, BufferAccess, Completion, DeviceFault, Dma, DmaRegion, DmaSegment, FaultKind,
    IoOp, IoRequest, IoStatus,
};
use std::sync::{Arc, Mutex};
use std::vec::Vec;

/// A fake device's bus mastering (PCI command bit 2), as its HAL's `Dma::stop_dma`
/// turns it off: off, the device reaches no memory (`allows` counts what it refused).
#[derive(Clone, Copy, Debug)]
pub struct BusMaster {
    pub on: bool,
    /// `stop_dma` works (`false`: a device that keeps DMAing whatever it is told).
    pub stop_confirms: bool,
    /// What `stop_dma` returned, once called.
    pub stopped: Option<bool>,
    /// Memory accesses refused because bus mastering was off.
    pub blocked: usize,
}

impl Default for BusMaster {
    fn default() -> Self {
        BusMaster {
            on: true,
            stop_confirms: true,
            stopped: None,
            blocked: 0,
        }
    }
}

impl BusMaster {
    /// `Dma::stop_dma`.
    pub fn stop(&mut self) -> bool {
        if self.stop_confirms {
            self.on = false;
        }
        self.stopped = Some(self.stop_confirms);
        self.stop_confirms
    }

    /// `Dma::resume_dma`: on again, and no longer stopped.
    pub fn resume(&mut self) -> bool {
        self.on = true;
        self.stopped = None;
        true
    }

    /// Whether the device may reach memory now (a refusal is counted).
    pub fn allows(&mut self) -> bool {
        if !self.on {
            self.blocked += 1;
        }
        self.on
    }
}

/// Buffer access for DMA drivers, which must never use it.
pub struct NoCpuAccess;

impl BufferAccess for NoCpuAccess {
    fn read_buffer(&self, _: u64, _: usize, _: &mut [u8]) -> bool {
        panic!("DMA driver used CPU buffer access")
    }
    fn write_buffer(&self, _: u64, _: usize, _: &[u8]) -> bool {
        panic!("DMA driver used CPU buffer access")
    }
}

/// Builds a read or write of `segments` (its length in sectors is theirs).
pub fn data_request(
    tag: u32,
    op: blkdev::IoOp,
    sector: u64,
    segments: &[blkdev::DmaSegment],
) -> IoRequest<'_> {
    let bytes: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
    IoRequest {
        tag,
        op,
        sector,
        nr_sectors: bytes / blkdev::SECTOR_SIZE,
        preflush: false,
        segments,
    }
}

/// The guest memory of a fake device: a byte array named by bus address, with a
/// bump allocator for DMA pages (address 0 stays unused).
pub struct DmaMemory {
    bytes: Vec<u8>,
    next_free: u64,
}

impl DmaMemory {
    pub fn new(size: usize) -> Self {
        DmaMemory {
            bytes: std::vec![0; size],
            next_free: 4096,
        }
    }

    /// `pages` zeroed pages, or None when memory is exhausted.
    pub fn allocate(&mut self, pages: usize) -> Option<u64> {
        let address = self.next_free;
        let end = address + pages as u64 * 4096;
        if end as usize > self.bytes.len() {
            return None;
        }
        self.next_free = end;
        self.bytes[address as usize..end as usize].fill(0);
        Some(address)
    }

    /// As `allocate`, as the region a fake HAL's `Dma::allocate_dma` returns.
    #[allow(unsafe_code, reason = "the fake HALs' allocate_dma makes regions")]
    pub fn allocate_region(&mut self, pages: usize) -> Option<blkdev::DmaRegion> {
        let address = self.allocate(pages)?;
        // SAFETY: fresh pages of this memory's bump allocator, zeroed, handed out
        // once; a fake device reaches them by the same address (an index into
        // `bytes`, which every access bounds-checks).
        Some(unsafe { blkdev::DmaRegion::new(address, pages as u64 * 4096) })
    }

    /// Copies the bytes at `offset` of `region` into `out` (a fake `read_dma`).
    pub fn read_region(&self, region: blkdev::DmaRegion, offset: u64, out: &mut [u8]) {
        let address = region.span(offset, out.len() as u64);
        out.copy_from_slice(self.slice(address, out.len()));
    }

    /// Copies `data` to `offset` of `region` (a fake `write_dma`).
    pub fn write_region(&mut self, region: blkdev::DmaRegion, offset: u64, data: &[u8]) {
        let address = region.span(offset, data.len() as u64);
        self.put(address, data);
    }

    pub fn slice(&self, address: u64, len: usize) -> &[u8] {
        &self.bytes[address as usize..address as usize + len]
    }

    pub fn put(&mut self, address: u64, data: &[u8]) {
        self.bytes[address as usize..address as usize + data.len()].copy_from_slice(data);
    }

    pub fn u16_at(&self, address: u64) -> u16 {
        u16::from_le_bytes(self.slice(address, 2).try_into().unwrap())
    }

    pub fn u32_at(&self, address: u64) -> u32 {
        u32::from_le_bytes(self.slice(address, 4).try_into().unwrap())
    }

    pub fn u64_at(&self, address: u64) -> u64 {
        u64::from_le_bytes(self.slice(address, 8).try_into().unwrap())
    }
}

impl core::ops::Deref for DmaMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl core::ops::DerefMut for DmaMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// Both DMA drivers' scenario of a device that goes bad (fatal status, needs reset)
/// after serving two requests: `queue` is one of its queues, `segments` one page of
/// DMA memory. Four reads go out; polling alone never reads the status register (two
/// hang); the clock does, once the commands waited `HEALTH_CHECK_INTERVAL_NS` with
/// none finishing, and then the two fail, and so does a later read, at once.
pub fn status_read_by_clock_not_by_polls(queue: &mut dyn BlockDevice, segments: &[DmaSegment]) {
    for tag in 0..4 {
        queue
            .submit(&data_request(tag, IoOp::Read, 0, segments), &NoCpuAccess)
            .unwrap();
    }
    let mut done = poll_until(queue, 4, 5000);
    assert_eq!(done.len(), 2, "polls alone answered {done:?}");
    let start = 5 * MS;
    queue.tick(start, TIMEOUT);
    queue.tick(start + crate::HEALTH_CHECK_INTERVAL_NS - 1, TIMEOUT);
    done.extend(drain(queue));
    assert_eq!(done.len(), 2, "status read before the interval: {done:?}");
    assert!(queue.fault().is_none());
    queue.tick(start + crate::HEALTH_CHECK_INTERVAL_NS, TIMEOUT);
    done.extend(drain(queue));
    let statuses: Vec<_> = done.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [IoStatus::Ok, IoStatus::Ok, IoStatus::Error, IoStatus::Error]
    );
    assert!(queue.fault().is_some_and(|f| f.kind == FaultKind::Fatal));
    let later = data_request(9, IoOp::Read, 0, segments);
    assert_eq!(complete_one(queue, &later), IoStatus::Error);
}

/// Polls until `count` completions came or `max_polls` polls passed.
pub fn poll_until(device: &mut dyn BlockDevice, count: usize, max_polls: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    for _ in 0..max_polls {
        device.poll_completions(&mut |c| done.push(c));
        if done.len() >= count {
            break;
        }
    }
    done
}

/// A fake DMA device as the fault scenarios below (and the engine's device-fault
/// tests) drive it, through its HAL.
pub trait FaultyDevice {
    /// Runs `f` on the device's memory.
    fn with_memory(&self, f: &mut dyn FnMut(&mut DmaMemory));
    /// The commands it holds unanswered run and complete now, late.
    fn finish_stalled(&self);
    fn bus(&self) -> BusMaster;
    /// Work it was handed so far (commands run, doorbells seen, fetches refused):
    /// a failed queue's later requests must not change it.
    fn handed(&self) -> usize;

    /// A fresh page of its memory, as one whole-page segment.
    fn page(&self) -> [DmaSegment; 1] {
        let mut buffer = 0;
        self.with_memory(&mut |m| buffer = m.allocate(1).expect("fake memory"));
        [DmaSegment {
            buffer,
            offset: 0,
            len: 4096,
        }]
    }

    fn fill(&self, page: &DmaSegment, byte: u8) {
        self.with_memory(&mut |m| m[page.buffer as usize..][..4096].fill(byte));
    }

    fn holds_only(&self, page: &DmaSegment, byte: u8) -> bool {
        let mut all = false;
        self.with_memory(&mut |m| {
            all = m[page.buffer as usize..][..4096].iter().all(|&b| b == byte)
        });
        all
    }
}

/// A fake DMA device's model as `FakeHal` serves it: its memory, its bus mastering
/// and its faults. The rest (registers, queues) each driver's own `Hal` reaches
/// through `FakeHal::with`.
pub trait DeviceModel {
    fn memory(&mut self) -> &mut DmaMemory;
    fn bus_master(&mut self) -> &mut BusMaster;
    /// `Dma::delay_us` (a device model that keeps no clock ignores it).
    fn delay_us(&mut self, _micros: u64) {}
    /// `FaultyDevice::finish_stalled`.
    fn finish_stalled(&mut self);
    /// `FaultyDevice::handed`.
    fn handed(&self) -> usize;
}

/// The test HAL of a fake DMA device: every clone reaches the same model `M`. It is
/// `Dma` and `FaultyDevice` for any model; each driver implements its own `Hal` (the
/// registers) for `FakeHal<its model>`.
pub struct FakeHal<M>(pub Arc<Mutex<M>>);

impl<M> Clone for FakeHal<M> {
    fn clone(&self) -> Self {
        FakeHal(Arc::clone(&self.0))
    }
}

impl<M> FakeHal<M> {
    pub fn new(model: M) -> Self {
        FakeHal(Arc::new(Mutex::new(model)))
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut M) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }
}

// SAFETY: DMA memory is the model's `DmaMemory`, whose bump allocator hands out
// zeroed pages once; copies go through `DmaRegion::span` into that bounds-checked
// `Vec`.
#[allow(unsafe_code, reason = "a test double of the kernel's HAL")]
unsafe impl<M: DeviceModel> Dma for FakeHal<M> {
    fn allocate_dma(&self, pages: usize) -> Option<DmaRegion> {
        self.with(|m| m.memory().allocate_region(pages))
    }
    fn read_dma(&self, region: DmaRegion, offset: u64, out: &mut [u8]) {
        self.with(|m| m.memory().read_region(region, offset, out))
    }
    fn write_dma(&self, region: DmaRegion, offset: u64, data: &[u8]) {
        self.with(|m| m.memory().write_region(region, offset, data))
    }
    fn delay_us(&self, micros: u64) {
        self.with(|m| m.delay_us(micros))
    }
    fn stop_dma(&self) -> bool {
        self.with(|m| m.bus_master().stop())
    }
    fn dma_stopped(&self) -> Option<bool> {
        self.with(|m| m.bus_master().stopped)
    }
    fn resume_dma(&self) -> bool {
        self.with(|m| m.bus_master().resume())
    }
}

impl<M: DeviceModel> FaultyDevice for FakeHal<M> {
    fn with_memory(&self, f: &mut dyn FnMut(&mut DmaMemory)) {
        self.with(|m| f(m.memory()))
    }
    fn finish_stalled(&self) {
        self.with(|m| m.finish_stalled())
    }
    fn bus(&self) -> BusMaster {
        self.with(|m| *m.bus_master())
    }
    fn handed(&self) -> usize {
        self.with(|m| m.handed())
    }
}

pub const MS: u64 = 1_000_000;
/// Linux's io_timeout, blkdom's default deadline.
pub const TIMEOUT: u64 = 30_000 * MS;

/// Both DMA drivers' scenario of a command their device never completes: `queue` and
/// `other` are two queues of `device`, which holds every read of `stalled_sector`.
/// The queue serves around it; the command fails past its deadline (not at it),
/// after the device was stopped; the device completing it late writes nothing;
/// later requests fail without reaching the device; the other queue fails too.
pub fn a_stalled_command_fails_after_its_deadline(
    queue: &mut dyn BlockDevice,
    other: &mut dyn BlockDevice,
    device: &dyn FaultyDevice,
    stalled_sector: u64,
) {
    queue.tick(0, TIMEOUT);
    other.tick(0, TIMEOUT);
    let (stalled, fine) = (device.page(), device.page());
    device.fill(&stalled[0], 0xa5);
    let read = |tag, sector, page| data_request(tag, IoOp::Read, sector, page);
    queue
        .submit(&read(1, stalled_sector, &stalled), &NoCpuAccess)
        .unwrap();
    let around = stalled_sector + 64;
    assert_eq!(complete_one(queue, &read(2, around, &fine)), IoStatus::Ok);
    assert_eq!(complete_one(other, &read(3, around, &fine)), IoStatus::Ok);
    // A poller ticks on every pass: the stalled command is stamped with this one.
    queue.tick(MS, TIMEOUT);
    // Not at the deadline; past it at the next scan (at most a second later).
    queue.tick(TIMEOUT, TIMEOUT);
    assert!(drain(queue).is_empty());
    assert_eq!((queue.fault(), device.bus().stopped), (None, None));
    queue.tick(TIMEOUT + crate::scan_interval(TIMEOUT), TIMEOUT);
    let fault = DeviceFault {
        kind: FaultKind::Timeout { waited_ms: 31_000 },
        dma_stopped: true,
    };
    assert_eq!(queue.fault(), Some(fault));
    assert_eq!((device.bus().stopped, device.bus().on), (Some(true), false));
    // Failed for good: a later tick, its device now stopped, keeps the first reason.
    queue.tick(TIMEOUT + 2 * crate::scan_interval(TIMEOUT), TIMEOUT);
    assert_eq!(queue.fault(), Some(fault));
    let error = |tag| Completion {
        tag,
        status: IoStatus::Error,
    };
    assert_eq!(drain(queue), [error(1)]);
    // The device wakes up and completes the command: bus mastering is off, so its
    // data never reaches the page, and nothing is reported.
    device.finish_stalled();
    assert_eq!(device.bus().blocked, 1);
    assert!(device.holds_only(&stalled[0], 0xa5));
    assert!(drain(queue).is_empty());
    // Later requests are answered at once, without the device.
    let handed = device.handed();
    for tag in 10..20 {
        assert_eq!(
            complete_one(queue, &read(tag, around, &fine)),
            IoStatus::Error
        );
    }
    assert_eq!(device.handed(), handed);
    // The device's other queue fails at its next tick, and says why.
    other.tick(TIMEOUT + 2 * MS, TIMEOUT);
    let stopped = DeviceFault {
        kind: FaultKind::Stopped,
        dma_stopped: true,
    };
    assert_eq!(other.fault(), Some(stopped));
    assert_eq!(
        complete_one(other, &read(21, around, &fine)),
        IoStatus::Error
    );
}

/// Both DMA drivers' scenario of a device that ignores `stop_dma` (its bus stays
/// on): the fault says the device could not be stopped, and the queue still never
/// hands it another request.
pub fn a_device_that_cannot_be_stopped_is_reported_so(
    queue: &mut dyn BlockDevice,
    device: &dyn FaultyDevice,
    stalled_sector: u64,
) {
    queue.tick(0, TIMEOUT);
    let page = device.page();
    let read = |tag, sector| data_request(tag, IoOp::Read, sector, &page);
    queue
        .submit(&read(1, stalled_sector), &NoCpuAccess)
        .unwrap();
    queue.tick(MS, TIMEOUT);
    queue.tick(TIMEOUT + crate::scan_interval(TIMEOUT), TIMEOUT);
    let fault = DeviceFault {
        kind: FaultKind::Timeout { waited_ms: 31_000 },
        dma_stopped: false,
    };
    assert_eq!(queue.fault(), Some(fault));
    assert_eq!(drain(queue).len(), 1);
    let handed = device.handed();
    assert_eq!(complete_one(queue, &read(2, 0)), IoStatus::Error);
    assert_eq!(device.handed(), handed);
}

/// Writes `byte` over `page` at `sector` through `queue`, then reads it back into the
/// page, cleared first (tags `tag` and `tag + 1`): whether both completed `Ok` and the
/// data came back.
pub fn writes_and_reads_back(
    queue: &mut dyn BlockDevice,
    device: &dyn FaultyDevice,
    page: &[DmaSegment; 1],
    (tag, sector, byte): (u32, u64, u8),
) -> bool {
    device.fill(&page[0], byte);
    let written = complete_one(queue, &data_request(tag, IoOp::Write, sector, page));
    device.fill(&page[0], !byte);
    let read = complete_one(queue, &data_request(tag + 1, IoOp::Read, sector, page));
    (written, read) == (IoStatus::Ok, IoStatus::Ok) && device.holds_only(&page[0], byte)
}

/// Both DMA drivers' check of a device given up after its resets: every queue of it
/// reports `fault`, the one that has not looked since too (`idle`); `holder`, at its
/// next tick (`now`), fails the request `held` it held; later requests on either fail
/// at once, without the device.
pub fn a_given_up_device_fails_every_queue(
    holder: &mut dyn BlockDevice,
    idle: &mut dyn BlockDevice,
    device: &dyn FaultyDevice,
    (fault, held, now): (DeviceFault, u32, u64),
) {
    assert_eq!(idle.fault(), Some(fault));
    holder.tick(now, TIMEOUT);
    assert_eq!(holder.fault(), Some(fault));
    let held = Completion {
        tag: held,
        status: IoStatus::Error,
    };
    assert_eq!(drain(holder), [held]);
    let page = device.page();
    let handed = device.handed();
    let later = data_request(1000, IoOp::Read, 0, &page);
    assert_eq!(complete_one(holder, &later), IoStatus::Error);
    assert_eq!(complete_one(idle, &later), IoStatus::Error);
    assert_eq!(device.handed(), handed);
}

/// Everything the device reports now.
pub fn drain(device: &mut dyn BlockDevice) -> Vec<Completion> {
    let mut out = Vec::new();
    device.poll_completions(&mut |c| out.push(c));
    out
}

/// Submits `request`, expects exactly its completion on the next poll (the test
/// device answers on the doorbell); returns its status.
pub fn complete_one(device: &mut dyn BlockDevice, request: &IoRequest<'_>) -> IoStatus {
    device.submit(request, &NoCpuAccess).unwrap();
    let done = drain(device);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].tag, request.tag);
    done[0].status
}
