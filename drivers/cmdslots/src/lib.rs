//! The command slots the DMA block drivers (NVMe, virtio-blk) share: a fixed table,
//! allocated once.
//!
//! A request becomes one or more device commands, one slot each (a driver uses the slot
//! number as its command id). The request's first slot, its head, holds the tag, the
//! number of its commands still out and the worst status so far. A write with
//! pre-flush puts the FLUSH in the head and keeps its data commands *staged* until the
//! flush has completed: devices may reorder commands, so only completion orders them.
//! Requests a driver answers itself (refused operation, dead device) also take a slot,
//! which bounds them like everything else.
//!
//! Deadlines: each command is stamped with the driver's clock (`tick`) when it goes to
//! the device, and `tick` says when the oldest one has waited longer than the timeout.
//! The driver then stops its device and `fail_all` answers every request it holds with
//! an error; such a queue never hands a slot to its device again.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use blkdev::{Completion, DeviceFault, Dma, FaultKind, IoStatus, SubmitError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Free,
    /// Built, waiting for the pre-flush of its request.
    Staged,
    InFlight,
    /// A head whose own command is done while others of its request are not.
    Waiting,
    /// Answered without the device; reported by the next `drain_local`.
    Local,
}

pub const NO_SLOT: u16 = u16::MAX;

/// Helpers for driver tests.
#[cfg(any(test, feature = "fake"))]
pub mod fake {
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
    pub fn poll_until(
        device: &mut dyn BlockDevice,
        count: usize,
        max_polls: usize,
    ) -> Vec<Completion> {
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
}

#[derive(Clone, Copy, Debug)]
struct Slot<P> {
    state: SlotState,
    tag: u32,
    head: u16,
    remaining: u16,
    status: IoStatus,
    next_staged: u16,
    /// The clock when the command went to the device (`launched`).
    since: u64,
    payload: P,
}

/// A command the device has held longer than the timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overdue {
    pub slot: u16,
    /// How long it has been with the device, ns.
    pub waited_ns: u64,
}

/// How often `Tracker::tick` looks for overdue commands: an eighth of the timeout, at
/// least every second and at most every millisecond. A command is given up between
/// `timeout` and `timeout + scan_interval(timeout)` after it went to the device.
pub fn scan_interval(timeout_ns: u64) -> u64 {
    (timeout_ns / 8).clamp(1_000_000, 1_000_000_000)
}

/// How long commands may be in flight with none finishing before the driver reads its
/// device's status (`Tracker::health_check_due`), and then how often.
pub const HEALTH_CHECK_INTERVAL_NS: u64 = 10_000_000;

/// What a finished command meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    /// Its request still has commands out.
    Pending,
    /// Its request is complete.
    Request(Completion),
    /// The slot was not in flight: a device bug or a stale completion (logged).
    Stray,
}

/// A DMA driver queue's `BlockDevice::fault`: its own (`own`), or its device's, stopped
/// by another queue (`device_stopped`: what `Dma::dma_stopped` says).
pub fn queue_fault(own: Option<DeviceFault>, device_stopped: Option<bool>) -> Option<DeviceFault> {
    own.or_else(|| {
        device_stopped.map(|dma_stopped| DeviceFault {
            kind: FaultKind::Stopped,
            dma_stopped,
        })
    })
}

/// The worse of two outcomes: an error beats "unsupported" beats success.
pub fn worse(a: IoStatus, b: IoStatus) -> IoStatus {
    match (a, b) {
        (IoStatus::Error, _) | (_, IoStatus::Error) => IoStatus::Error,
        (IoStatus::Unsupported, _) | (_, IoStatus::Unsupported) => IoStatus::Unsupported,
        _ => IoStatus::Ok,
    }
}

/// The slot table. `P` is the driver's per-command data (a prepared command, say).
pub struct Tracker<P: Copy + Default> {
    slots: Vec<Slot<P>>,
    free: Vec<u16>,
    local: VecDeque<u16>,
    in_flight: usize,
    /// The clock as of the last `tick` (commands launched now are stamped with it).
    now: u64,
    /// `tick` was called at least once (stamps before it mean nothing).
    clock_started: bool,
    /// A command was launched since the last `tick` (stamped with its time).
    launched_since_tick: bool,
    /// When `tick` next looks at the slots.
    next_scan: u64,
    /// A command finished since the last `health_check_due` (the device is alive).
    finished_since_check: bool,
    /// When the device last showed it was alive, or had its status read (None: never
    /// asked yet; the first `health_check_due` starts the clock).
    last_sign_of_life: Option<u64>,
}

impl<P: Copy + Default> Tracker<P> {
    pub fn new(capacity: u16) -> Self {
        let empty = Slot {
            state: SlotState::Free,
            tag: 0,
            head: NO_SLOT,
            remaining: 0,
            status: IoStatus::Ok,
            next_staged: NO_SLOT,
            since: 0,
            payload: P::default(),
        };
        Tracker {
            slots: alloc::vec![empty; usize::from(capacity.min(NO_SLOT - 1))],
            free: (0..capacity.min(NO_SLOT - 1)).rev().collect(),
            local: VecDeque::with_capacity(usize::from(capacity)),
            in_flight: 0,
            now: 0,
            clock_started: false,
            launched_since_tick: false,
            next_scan: 0,
            finished_since_check: false,
            last_sign_of_life: None,
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Commands handed to the device and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn state(&self, slot: u16) -> Option<SlotState> {
        self.slots.get(usize::from(slot)).map(|s| s.state)
    }

    pub fn payload(&self, slot: u16) -> &P {
        &self.slots[usize::from(slot)].payload
    }

    pub fn payload_mut(&mut self, slot: u16) -> &mut P {
        &mut self.slots[usize::from(slot)].payload
    }

    fn take(&mut self, head: Option<u16>) -> u16 {
        let slot = self
            .free
            .pop()
            .expect("callers check free_slots before taking");
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::Staged;
        s.head = head.unwrap_or(slot);
        s.remaining = 0;
        s.status = IoStatus::Ok;
        s.next_staged = NO_SLOT;
        s.payload = P::default();
        slot
    }

    /// Starts a request of `commands` commands (the caller checked `free_slots`); the
    /// head slot returned is the first command's.
    pub fn begin(&mut self, tag: u32, commands: u16) -> u16 {
        let head = self.take(None);
        let s = &mut self.slots[usize::from(head)];
        s.tag = tag;
        s.remaining = commands;
        head
    }

    /// Another command slot for the request headed by `head`.
    pub fn add(&mut self, head: u16) -> u16 {
        self.take(Some(head))
    }

    /// Keeps `slot` back until `after` (the head's pre-flush, or the previous staged
    /// command) completes.
    pub fn stage_after(&mut self, after: u16, slot: u16) {
        self.slots[usize::from(slot)].state = SlotState::Staged;
        self.slots[usize::from(after)].next_staged = slot;
    }

    /// The command in `slot` is now with the device (stamped with the clock of the last
    /// `tick`).
    pub fn launched(&mut self, slot: u16) {
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::InFlight;
        s.since = self.now;
        self.in_flight += 1;
        self.launched_since_tick = true;
    }

    /// The driver's clock (ns, monotonic). Returns the oldest command in flight if it
    /// has been with the device longer than `timeout_ns` (0: no deadline). Looks at the
    /// slots at most every `scan_interval(timeout_ns)`, otherwise costs a comparison.
    /// Commands launched before the first tick count from it, and so do those launched
    /// after a quiet spell longer than a scan interval without a tick (a queue parked
    /// idle, then given work before its next tick): their stamp is that old tick's.
    pub fn tick(&mut self, now: u64, timeout_ns: u64) -> Option<Overdue> {
        let stale = self.now;
        if !self.clock_started {
            self.clock_started = true;
            for s in &mut self.slots {
                s.since = now;
            }
        } else if self.launched_since_tick && now.saturating_sub(stale) > scan_interval(timeout_ns)
        {
            for s in &mut self.slots {
                if s.state == SlotState::InFlight && s.since == stale {
                    s.since = now;
                }
            }
        }
        self.launched_since_tick = false;
        self.now = now;
        if timeout_ns == 0 || self.in_flight == 0 || now < self.next_scan {
            return None;
        }
        self.next_scan = now.saturating_add(scan_interval(timeout_ns));
        let (slot, oldest) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SlotState::InFlight)
            .min_by_key(|(_, s)| s.since)?;
        let waited_ns = now.saturating_sub(oldest.since);
        (waited_ns > timeout_ns).then_some(Overdue {
            slot: slot as u16,
            waited_ns,
        })
    }

    /// Whether the driver should read its device's status register now (a fatal or
    /// needs-reset bit): commands have been in flight for `HEALTH_CHECK_INTERVAL_NS`
    /// without one finishing, and no status was read in that time. Timed, not counted
    /// in polls: a register read is a VM exit under Xen's HVM, and a poll count makes
    /// their rate follow the poller's speed (and a control-path read's register count
    /// follow the machine's load).
    pub fn health_check_due(&mut self, now: u64) -> bool {
        let finished = core::mem::take(&mut self.finished_since_check);
        let quiet_since = match self.last_sign_of_life {
            Some(last) if self.in_flight > 0 && !finished => last,
            _ => {
                self.last_sign_of_life = Some(now);
                return false;
            }
        };
        if now.saturating_sub(quiet_since) < HEALTH_CHECK_INTERVAL_NS {
            return false;
        }
        self.last_sign_of_life = Some(now);
        true
    }

    fn release(&mut self, slot: u16) {
        self.slots[usize::from(slot)].state = SlotState::Free;
        self.free.push(slot);
    }

    /// Answers a request without the device; refused when no slot is free.
    pub fn complete_locally(&mut self, tag: u32, status: IoStatus) -> Result<(), SubmitError> {
        if self.free.is_empty() {
            return Err(SubmitError::QueueFull);
        }
        let slot = self.take(None);
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::Local;
        s.tag = tag;
        s.status = status;
        self.local.push_back(slot);
        Ok(())
    }

    /// Reports the locally answered requests.
    pub fn drain_local(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let mut reported = 0;
        while let Some(slot) = self.local.pop_front() {
            let s = self.slots[usize::from(slot)];
            sink(Completion {
                tag: s.tag,
                status: s.status,
            });
            self.release(slot);
            reported += 1;
        }
        reported
    }

    /// Accounts the command in `slot` finishing with `outcome`. When it was a pre-flush,
    /// its staged commands go to `launch` on success (the driver hands them to the
    /// device and must call `launched`), or fail unstarted otherwise.
    pub fn finish(
        &mut self,
        slot: u16,
        outcome: IoStatus,
        launch: &mut dyn FnMut(&mut Self, u16),
    ) -> Finished {
        let Some(s) = self.slots.get(usize::from(slot)).copied() else {
            return Finished::Stray;
        };
        if s.state != SlotState::InFlight {
            return Finished::Stray;
        }
        self.in_flight -= 1;
        self.finished_since_check = true;
        let head = s.head;
        let mut finished = 1;
        if slot == head && s.next_staged != NO_SLOT {
            let mut next = s.next_staged;
            self.slots[usize::from(head)].next_staged = NO_SLOT;
            while next != NO_SLOT {
                let following = self.slots[usize::from(next)].next_staged;
                if outcome == IoStatus::Ok {
                    launch(self, next);
                } else {
                    self.release(next);
                    finished += 1;
                }
                next = following;
            }
        }
        let h = &mut self.slots[usize::from(head)];
        h.status = worse(h.status, outcome);
        h.remaining -= finished;
        if slot == head {
            h.state = SlotState::Waiting;
        } else {
            self.release(slot);
        }
        let h = self.slots[usize::from(head)];
        if h.remaining > 0 {
            return Finished::Pending;
        }
        self.release(head);
        Finished::Request(Completion {
            tag: h.tag,
            status: h.status,
        })
    }

    /// A DMA driver's `BlockDevice::tick`: why its queue must fail now, if it must.
    /// Nothing if it has failed already (`own`, its fault); else its device was stopped
    /// by another queue (`device`'s `Dma::dma_stopped` says so), or a command has been
    /// with it longer than `timeout_ns` (logged).
    pub fn due(
        &mut self,
        own: Option<DeviceFault>,
        now: u64,
        timeout_ns: u64,
        device: &impl Dma,
    ) -> Option<FaultKind> {
        if own.is_some() {
            return None;
        }
        if device.dma_stopped().is_some() {
            return Some(FaultKind::Stopped);
        }
        let overdue = self.tick(now, timeout_ns)?;
        let waited_ms = overdue.waited_ns / 1_000_000;
        log::error!(
            "command slot {} got no completion in {waited_ms} ms",
            overdue.slot
        );
        Some(FaultKind::Timeout { waited_ms })
    }

    /// Fails the queue for `kind`: `stop_dma` first (the device's DMA off: what it holds
    /// can no longer land anywhere), then every request outstanding (`fail_all`).
    /// Returns the fault and how many requests failed.
    pub fn fail_queue(
        &mut self,
        kind: FaultKind,
        stop_dma: impl FnOnce() -> bool,
    ) -> (DeviceFault, usize) {
        let dma_stopped = stop_dma();
        let failed = self.fail_all();
        (DeviceFault { kind, dma_stopped }, failed)
    }

    /// Fails every request with commands out or staged: each is answered `Error` by the
    /// next `drain_local`, and every slot it held is free again. Only once the device
    /// can no longer touch what they named (its DMA stopped, or it is known to have
    /// dropped them): a freed slot is reused. Returns how many requests failed.
    pub fn fail_all(&mut self) -> usize {
        let mut failed = 0;
        for index in 0..self.slots.len() {
            let s = &mut self.slots[index];
            if !matches!(
                s.state,
                SlotState::InFlight | SlotState::Waiting | SlotState::Staged
            ) {
                continue;
            }
            if s.head == index as u16 {
                s.state = SlotState::Local;
                s.status = IoStatus::Error;
                self.local.push_back(index as u16);
                failed += 1;
            } else {
                self.release(index as u16);
            }
        }
        self.in_flight = 0;
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch_all(t: &mut Tracker<u8>, slot: u16) {
        t.launched(slot);
    }

    #[test]
    fn a_split_request_completes_after_its_last_command_with_the_worst_status() {
        let mut t: Tracker<u8> = Tracker::new(4);
        let head = t.begin(7, 3);
        let second = t.add(head);
        let third = t.add(head);
        for s in [head, second, third] {
            t.launched(s);
        }
        assert_eq!(t.free_slots(), 1);
        assert_eq!(
            t.finish(second, IoStatus::Ok, &mut launch_all),
            Finished::Pending
        );
        assert_eq!(
            t.finish(head, IoStatus::Error, &mut launch_all),
            Finished::Pending
        );
        assert_eq!(t.state(head), Some(SlotState::Waiting));
        assert_eq!(
            t.finish(head, IoStatus::Ok, &mut launch_all),
            Finished::Stray
        );
        assert_eq!(
            t.finish(third, IoStatus::Unsupported, &mut launch_all),
            Finished::Request(Completion {
                tag: 7,
                status: IoStatus::Error
            })
        );
        assert_eq!(t.free_slots(), 4);
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.finish(99, IoStatus::Ok, &mut launch_all), Finished::Stray);
    }

    #[test]
    fn staged_commands_launch_after_the_flush_or_fail_with_it() {
        let mut t: Tracker<u8> = Tracker::new(8);
        let head = t.begin(1, 3);
        let a = t.add(head);
        t.stage_after(head, a);
        let b = t.add(head);
        t.stage_after(a, b);
        t.launched(head);
        let mut launched = Vec::new();
        let r = t.finish(head, IoStatus::Ok, &mut |t, s| {
            launched.push(s);
            t.launched(s);
        });
        assert_eq!(r, Finished::Pending);
        assert_eq!(launched, [a, b]);
        t.finish(b, IoStatus::Ok, &mut launch_all);
        assert!(matches!(
            t.finish(a, IoStatus::Ok, &mut launch_all),
            Finished::Request(Completion {
                tag: 1,
                status: IoStatus::Ok
            })
        ));

        let head = t.begin(2, 3);
        let a = t.add(head);
        t.stage_after(head, a);
        let b = t.add(head);
        t.stage_after(a, b);
        t.launched(head);
        let r = t.finish(head, IoStatus::Unsupported, &mut |_, _| panic!("launched"));
        assert_eq!(
            r,
            Finished::Request(Completion {
                tag: 2,
                status: IoStatus::Unsupported
            })
        );
        assert_eq!(t.free_slots(), 8);
    }

    #[test]
    fn local_answers_and_failing_everything() {
        let mut t: Tracker<u8> = Tracker::new(3);
        t.complete_locally(5, IoStatus::Unsupported).unwrap();
        let head = t.begin(6, 2);
        let other = t.add(head);
        t.launched(head);
        t.stage_after(head, other);
        assert_eq!(
            t.complete_locally(8, IoStatus::Ok),
            Err(SubmitError::QueueFull)
        );
        let mut seen = Vec::new();
        assert_eq!(t.drain_local(&mut |c| seen.push(c)), 1);
        assert_eq!(t.fail_all(), 1);
        // Failed, not yet reported: no slot is free before the report.
        assert_eq!(t.free_slots(), 2);
        assert_eq!(t.drain_local(&mut |c| seen.push(c)), 1);
        assert_eq!(
            seen,
            [
                Completion {
                    tag: 5,
                    status: IoStatus::Unsupported
                },
                Completion {
                    tag: 6,
                    status: IoStatus::Error
                }
            ]
        );
        assert_eq!(t.free_slots(), 3);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_command_is_overdue_only_past_its_deadline() {
        const MS: u64 = 1_000_000;
        let mut t: Tracker<u8> = Tracker::new(4);
        // Launched before the clock started: counts from the first tick.
        let early = t.begin(1, 1);
        t.launched(early);
        assert_eq!(t.tick(1_000 * MS, 100 * MS), None);
        let late = t.begin(2, 1);
        assert_eq!(t.tick(1_050 * MS, 100 * MS), None);
        t.launched(late);
        assert_eq!(t.tick(1_055 * MS, 100 * MS), None);
        // Exactly at the deadline is not past it (the scan interval is 12.5 ms).
        assert_eq!(t.tick(1_100 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(1_113 * MS, 100 * MS),
            Some(Overdue {
                slot: early,
                waited_ns: 113 * MS
            })
        );
        // Between scans nothing is looked at.
        assert_eq!(t.tick(1_114 * MS, 100 * MS), None);
        // The early one done, the later one is judged on its own stamp.
        assert!(matches!(
            t.finish(early, IoStatus::Ok, &mut launch_all),
            Finished::Request(_)
        ));
        assert_eq!(t.tick(1_140 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(1_151 * MS, 100 * MS),
            None,
            "the next scan is due at 1152.5 ms"
        );
        assert_eq!(
            t.tick(1_153 * MS, 100 * MS),
            Some(Overdue {
                slot: late,
                waited_ns: 103 * MS
            })
        );
        // No deadline, or nothing in flight: nothing is ever overdue.
        assert_eq!(t.tick(9_000 * MS, 0), None);
        t.fail_all();
        assert_eq!(t.tick(10_000 * MS, 100 * MS), None);
    }

    #[test]
    fn a_command_launched_after_a_quiet_spell_counts_from_the_next_tick() {
        const MS: u64 = 1_000_000;
        let mut t: Tracker<u8> = Tracker::new(4);
        let busy = t.begin(1, 1);
        t.launched(busy);
        assert_eq!(t.tick(0, 100 * MS), None);
        assert!(matches!(
            t.finish(busy, IoStatus::Ok, &mut launch_all),
            Finished::Request(_)
        ));
        // Parked for an hour without ticks, then given a command before the next tick.
        let fresh = t.begin(2, 1);
        t.launched(fresh);
        let hour = 3_600_000 * MS;
        assert_eq!(t.tick(hour, 100 * MS), None, "not an hour old");
        assert_eq!(t.tick(hour + 100 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(hour + 113 * MS, 100 * MS),
            Some(Overdue {
                slot: fresh,
                waited_ns: 113 * MS
            })
        );
    }

    #[test]
    fn the_status_is_read_only_after_a_quiet_interval_with_commands_out() {
        const MS: u64 = 1_000_000;
        let interval = HEALTH_CHECK_INTERVAL_NS;
        let mut t: Tracker<u8> = Tracker::new(4);
        // Nothing in flight: never, however long.
        assert!(!t.health_check_due(0));
        assert!(!t.health_check_due(interval * 10));
        let first = t.begin(1, 1);
        t.launched(first);
        let second = t.begin(2, 1);
        t.launched(second);
        let start = interval * 10;
        assert!(!t.health_check_due(start + interval - 1));
        // A command finished: the device is alive, and the quiet interval starts again.
        t.finish(first, IoStatus::Ok, &mut launch_all);
        assert!(!t.health_check_due(start + interval + MS));
        assert!(!t.health_check_due(start + 2 * interval));
        assert!(t.health_check_due(start + 2 * interval + MS));
        // Then once per interval, not at every call.
        assert!(!t.health_check_due(start + 2 * interval + 2 * MS));
        assert!(t.health_check_due(start + 3 * interval + MS));
    }

    #[test]
    fn failed_requests_keep_their_slots_until_reported() {
        let mut t: Tracker<u8> = Tracker::new(4);
        let head = t.begin(9, 2);
        let second = t.add(head);
        t.launched(head);
        t.launched(second);
        assert_eq!(t.fail_all(), 1);
        assert_eq!(t.in_flight(), 0);
        // A late completion of either command is stray: nothing is reported twice.
        assert_eq!(
            t.finish(second, IoStatus::Ok, &mut launch_all),
            Finished::Stray
        );
        assert_eq!(
            t.finish(head, IoStatus::Ok, &mut launch_all),
            Finished::Stray
        );
        let mut seen = Vec::new();
        t.drain_local(&mut |c| seen.push(c));
        assert_eq!(
            seen,
            [Completion {
                tag: 9,
                status: IoStatus::Error
            }]
        );
        assert_eq!(t.free_slots(), 4);
    }
}
