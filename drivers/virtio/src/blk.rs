// SPDX-License-Identifier: MIT OR Apache-2.0
//! The virtio-blk device and its queues.

use alloc::vec::Vec;
use blkdev::range_fits;
use blkdev::{
    BlockDevice, BufferAccess, Completion, DeviceFault, DiscardGeometry, DmaRegion, DmaSegment,
    FaultKind, Geometry, IoOp, IoRequest, IoStatus, SubmitError, SECTOR_SIZE,
};
use cmdslots::recovery::LinkedQueue;
use cmdslots::{Finished, QueueLink, Recoverer, RecoveryConfig, SlotState, Tracker};

use crate::feature;
use crate::transport::{common, status, Common, PciRegions, NO_VECTOR};
use crate::virtqueue::{descriptor, SplitRing, DESC_F_NEXT, DESC_F_WRITE, DESC_LEN};
use crate::Hal;

mod recover;

const REQUEST_IN: u32 = 0;
const REQUEST_OUT: u32 = 1;
const REQUEST_FLUSH: u32 = 4;
const REQUEST_DISCARD: u32 = 11;
const STATUS_OK: u8 = 0;
/// How long a reset may take (device status back to 0).
pub const RESET_TIMEOUT_MS: u64 = 1000;
const STATUS_UNSUPPORTED: u8 = 2;

/// Descriptors in one indirect table (one page): header, data, status.
const TABLE_ENTRIES: usize = 256;
/// Without indirect descriptors: the longest chain a slot owns in the ring's table.
const DIRECT_CHAIN_MAX: u16 = 18;
const TABLE_BYTES: u64 = TABLE_ENTRIES as u64 * DESC_LEN;
/// Per slot: request header at 0, discard range at 16, status byte at 32.
const HEADER_AREA: u64 = 64;
const STATUS_OFFSET: u64 = 32;
const RANGE_OFFSET: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VirtioError {
    /// The device status did not read back 0 after a reset.
    ResetTimeout,
    MissingFeature(&'static str),
    /// FEATURES_OK did not stick: the device refused our feature set.
    FeaturesRefused,
    NoQueueLeft,
    /// The device reports size 0 for this queue.
    QueueUnavailable(u16),
    OutOfDmaMemory,
    /// After a reset the device no longer offers a feature it had negotiated.
    FeaturesChanged,
    /// Bus mastering did not turn back on after a reset.
    DmaNotResumed,
}

impl core::fmt::Display for VirtioError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VirtioError::ResetTimeout => write!(f, "device did not reset"),
            VirtioError::MissingFeature(what) => write!(f, "device lacks {what}"),
            VirtioError::FeaturesRefused => write!(f, "device refused the negotiated features"),
            VirtioError::NoQueueLeft => write!(f, "all the device's queues are in use"),
            VirtioError::QueueUnavailable(q) => write!(f, "queue {q} is not available"),
            VirtioError::OutOfDmaMemory => write!(f, "out of DMA memory"),
            VirtioError::FeaturesChanged => {
                write!(f, "after a reset the device offers fewer features")
            }
            VirtioError::DmaNotResumed => write!(f, "bus mastering did not turn back on"),
        }
    }
}

impl core::error::Error for VirtioError {}

/// The block device configuration, as negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlkConfig {
    /// In 512-byte sectors.
    pub capacity: u64,
    /// Most data segments per request (SEG_MAX), if the device says.
    pub seg_max: Option<u32>,
    pub block_size: u32,
    pub physical_block_size: u32,
    pub num_queues: u16,
    pub read_only: bool,
    pub flush: bool,
    /// (max sectors per discard, sector alignment), with DISCARD.
    pub discard: Option<(u32, u32)>,
}

fn read_config<H: Hal>(hal: &H, device: u64, features: u64) -> BlkConfig {
    let capacity = u64::from(hal.read32(device)) | (u64::from(hal.read32(device + 4)) << 32);
    let has = |bit: u64| features & bit != 0;
    let block_size = if has(feature::BLK_BLK_SIZE) {
        hal.read32(device + 0x14)
    } else {
        512
    };
    let block_size = if block_size.is_power_of_two() && (512..=4096).contains(&block_size) {
        block_size
    } else {
        512
    };
    let physical_block_size = if has(feature::BLK_TOPOLOGY) {
        block_size << hal.read8(device + 0x18).min(3)
    } else {
        block_size
    };
    BlkConfig {
        capacity,
        seg_max: has(feature::BLK_SEG_MAX).then(|| hal.read32(device + 0x0c)),
        block_size,
        physical_block_size,
        num_queues: if has(feature::BLK_MQ) {
            hal.read16(device + 0x22).max(1)
        } else {
            1
        },
        read_only: has(feature::BLK_RO),
        flush: has(feature::BLK_FLUSH),
        discard: has(feature::BLK_DISCARD)
            .then(|| (hal.read32(device + 0x24), hal.read32(device + 0x2c))),
    }
}

/// A reset, feature-negotiated device whose queues are being set up.
pub struct VirtioBlk<H: Hal> {
    common: Common<H>,
    regions: PciRegions,
    config: BlkConfig,
    indirect: bool,
    next_queue: u16,
    /// What was negotiated: a reset negotiates it again.
    features: u64,
    /// Every virtqueue set up, for a reset to set up again.
    created: Vec<CreatedQueue>,
    /// The device's recovery after a timeout or a needs-reset status (`recover`).
    recoverer: Recoverer,
}

/// A virtqueue as it was set up: a reset sets it up again, the same.
#[derive(Clone, Copy, Debug)]
struct CreatedQueue {
    index: u16,
    size: u16,
    desc: DmaRegion,
    avail: DmaRegion,
    used: DmaRegion,
}

/// The features the driver understands.
const UNDERSTOOD: u64 = feature::VERSION_1
    | feature::ACCESS_PLATFORM
    | feature::RING_INDIRECT_DESC
    | feature::BLK_SIZE_MAX
    | feature::BLK_SEG_MAX
    | feature::BLK_RO
    | feature::BLK_BLK_SIZE
    | feature::BLK_FLUSH
    | feature::BLK_TOPOLOGY
    | feature::BLK_MQ
    | feature::BLK_DISCARD;

/// Resets the device (status 0, read back as 0 within a second) and says the driver
/// is here (ACKNOWLEDGE, DRIVER).
fn reset_device<H: Hal>(common: &Common<H>) -> Result<(), VirtioError> {
    common.set_status(0);
    let mut waited = 0;
    while common.status() != 0 {
        if waited >= RESET_TIMEOUT_MS * 1000 {
            return Err(VirtioError::ResetTimeout);
        }
        common.hal.delay_us(100);
        waited += 100;
    }
    common.add_status(status::ACKNOWLEDGE);
    common.add_status(status::DRIVER);
    Ok(())
}

/// Tells the device the driver takes `features`; false when it refuses them.
fn accept_features<H: Hal>(common: &Common<H>, features: u64) -> bool {
    common.set_driver_features(features);
    common.add_status(status::FEATURES_OK);
    if common.status() & status::FEATURES_OK == 0 {
        return false;
    }
    common.write16(common::MSIX_CONFIG, NO_VECTOR);
    true
}

/// Gives the device the selected virtqueue, `size` entries in the rings of `queue`, and
/// enables it; returns its notification offset.
fn enable_queue<H: Hal>(common: &Common<H>, queue: &CreatedQueue) -> u16 {
    common.write16(common::QUEUE_SIZE, queue.size);
    common.write64(common::QUEUE_DESC, queue.desc.address());
    common.write64(common::QUEUE_DRIVER, queue.avail.address());
    common.write64(common::QUEUE_DEVICE, queue.used.address());
    common.write16(common::QUEUE_MSIX_VECTOR, NO_VECTOR);
    let notify_off = common.read16(common::QUEUE_NOTIFY_OFF);
    common.write16(common::QUEUE_ENABLE, 1);
    notify_off
}

/// Where a slot's descriptor chain lives.
#[derive(Clone, Copy, Debug)]
enum Chains {
    /// Slot i: ring descriptor i, pointing at indirect table i.
    Indirect { tables: DmaRegion },
    /// Slot i: descriptors `i * per_slot ..` of the ring's own table.
    Direct { desc: DmaRegion, per_slot: u16 },
}

impl Chains {
    /// The slot's descriptors: its indirect table, or its run of the ring's table.
    fn table(&self, slot: u16) -> DmaRegion {
        match *self {
            Chains::Indirect { tables } => tables.slice(u64::from(slot) * TABLE_BYTES, TABLE_BYTES),
            Chains::Direct { desc, per_slot } => desc.slice(
                u64::from(slot * per_slot) * DESC_LEN,
                u64::from(per_slot) * DESC_LEN,
            ),
        }
    }

    /// Index of the slot's first descriptor within its table (for `next` links).
    fn first_index(&self, slot: u16) -> u16 {
        match *self {
            Chains::Indirect { .. } => 0,
            Chains::Direct { per_slot, .. } => slot * per_slot,
        }
    }

    fn post<H: Hal>(&self, ring: &mut SplitRing, hal: &H, slot: u16, entries: u16) {
        match *self {
            Chains::Indirect { .. } => ring.post_indirect(hal, slot, self.table(slot), entries),
            Chains::Direct { per_slot, .. } => ring.post_chain(hal, slot * per_slot),
        }
    }

    /// The slot whose chain starts at descriptor `id`.
    fn slot_of(&self, id: u32) -> Option<u16> {
        let id = u16::try_from(id).ok()?;
        match *self {
            Chains::Indirect { .. } => Some(id),
            Chains::Direct { per_slot, .. } => id.is_multiple_of(per_slot).then(|| id / per_slot),
        }
    }
}

impl<H: Hal> VirtioBlk<H> {
    /// Resets the device and negotiates features (the device is not live until
    /// `start`). `recovery`: how it recovers when a request times out (`recover`).
    pub fn init(
        hal: H,
        regions: PciRegions,
        recovery: RecoveryConfig,
    ) -> Result<Self, VirtioError> {
        let common = Common {
            hal: hal.clone(),
            base: regions.common,
        };
        reset_device(&common)?;
        let offered = common.device_features();
        let fail = |e| {
            common.add_status(status::FAILED);
            Err(e)
        };
        if offered & feature::VERSION_1 == 0 {
            return fail(VirtioError::MissingFeature("VIRTIO_F_VERSION_1"));
        }
        let features = offered & UNDERSTOOD;
        if !accept_features(&common, features) {
            return fail(VirtioError::FeaturesRefused);
        }
        let mut config = read_config(&hal, regions.device, features);
        // The transport may offer fewer queues than the block configuration names.
        config.num_queues = config
            .num_queues
            .min(common.read16(common::NUM_QUEUES).max(1));
        Ok(VirtioBlk {
            common,
            regions,
            config,
            indirect: features & feature::RING_INDIRECT_DESC != 0,
            next_queue: 0,
            features,
            created: Vec::new(),
            recoverer: Recoverer::new(recovery),
        })
    }

    pub fn config(&self) -> &BlkConfig {
        &self.config
    }

    /// Indirect descriptors were negotiated (otherwise each request part takes a run
    /// of the ring's own descriptors, so bigger rings hold more).
    pub fn indirect(&self) -> bool {
        self.indirect
    }

    /// Sets up the next virtqueue with at most `size` entries (rounded down to a power
    /// of two; the device's maximum caps it).
    pub fn create_queue(&mut self, size: u16) -> Result<BlkQueue<H>, VirtioError> {
        let index = self.next_queue;
        if index >= self.config.num_queues {
            return Err(VirtioError::NoQueueLeft);
        }
        let common = &self.common;
        common.write16(common::QUEUE_SELECT, index);
        let max = common.read16(common::QUEUE_SIZE);
        if max == 0 {
            return Err(VirtioError::QueueUnavailable(index));
        }
        let wanted = size.clamp(2, max);
        let size: u16 = 1 << (15 - wanted.leading_zeros());
        let seg_limit = self.config.seg_max.map_or(TABLE_ENTRIES - 2, |m| {
            (m as usize).clamp(1, TABLE_ENTRIES - 2)
        });
        let hal = &common.hal;
        let ring = SplitRing::new(hal, size).ok_or(VirtioError::OutOfDmaMemory)?;
        let (chains, slot_count, max_part_segments) = if self.indirect {
            let tables = hal
                .allocate_dma(usize::from(size) * TABLE_BYTES as usize / 4096)
                .ok_or(VirtioError::OutOfDmaMemory)?;
            (Chains::Indirect { tables }, size, seg_limit)
        } else {
            // Each slot owns a fixed run of the ring's descriptors: header, data, status.
            let per_slot = (seg_limit as u16 + 2).min(DIRECT_CHAIN_MAX).min(size);
            if per_slot < 3 {
                return Err(VirtioError::QueueUnavailable(index));
            }
            let chains = Chains::Direct {
                desc: ring.desc,
                per_slot,
            };
            (chains, size / per_slot, usize::from(per_slot - 2))
        };
        let headers = hal
            .allocate_dma((usize::from(size) * HEADER_AREA as usize).div_ceil(4096))
            .ok_or(VirtioError::OutOfDmaMemory)?;
        let created = CreatedQueue {
            index,
            size,
            desc: ring.desc,
            avail: ring.avail,
            used: ring.used,
        };
        let notify_off = enable_queue(common, &created);
        self.next_queue += 1;
        self.created.push(created);

        let config = &self.config;
        Ok(BlkQueue {
            hal: hal.clone(),
            index,
            ring,
            notify: self.regions.notify
                + u64::from(notify_off) * u64::from(self.regions.notify_multiplier),
            status_register: self.regions.common + common::DEVICE_STATUS,
            slots: Tracker::new(slot_count),
            chains,
            headers,
            max_part_segments,
            geometry: Geometry {
                sectors: config.capacity,
                logical_block_size: config.block_size,
                physical_block_size: config.physical_block_size,
                read_only: config.read_only,
                flush: config.flush,
                discard: config.discard.map(|(_, alignment)| DiscardGeometry {
                    granularity: (alignment.max(1) * 512).max(config.block_size),
                    alignment: 0,
                    secure: false,
                }),
            },
            // Pieces of a long discard start on the alignment the device asks for: the
            // most it takes, rounded down to that alignment.
            max_discard_sectors: config.discard.map_or(0, |(max, alignment)| {
                let alignment = u64::from(alignment.max(1));
                let max = u64::from(max.max(1));
                if max >= alignment {
                    max - max % alignment
                } else {
                    max
                }
            }),
            fault: None,
            link: self.recoverer.link(),
        })
    }

    /// Tells the device the driver is ready (after its queues are set up).
    pub fn start(&self) {
        self.common.add_status(status::DRIVER_OK);
    }

    /// Resets the device (device status 0): it stops using its queues and forgets them.
    /// Done once the status reads 0 again (`reset_complete`). Its queues must not be
    /// used afterwards.
    pub fn begin_reset(&self) {
        self.common.set_status(0);
    }

    /// Whether the reset `begin_reset` asked for is done.
    pub fn reset_complete(&self) -> bool {
        self.common.status() == 0
    }
}

/// A device stops by a reset.
impl<H: Hal> blkdev::shutdown::Stop for VirtioBlk<H> {
    fn begin_stop(&mut self) -> Result<(), alloc::string::String> {
        self.begin_reset();
        Ok(())
    }

    fn stopped(&mut self) -> Result<bool, alloc::string::String> {
        Ok(self.reset_complete())
    }

    fn stop_deadline_ns(&self) -> u64 {
        RESET_TIMEOUT_MS * 1_000_000
    }
}

/// A slot's prepared part: how many descriptors its indirect table holds.
#[derive(Clone, Copy, Debug, Default)]
struct Part {
    entries: u16,
}

/// One virtqueue of a virtio-blk device, for one CPU.
pub struct BlkQueue<H: Hal> {
    hal: H,
    index: u16,
    ring: SplitRing,
    notify: u64,
    status_register: u64,
    /// Slot i uses chain i (see `Chains`) and header area i.
    slots: Tracker<Part>,
    chains: Chains,
    headers: DmaRegion,
    max_part_segments: usize,
    geometry: Geometry,
    max_discard_sectors: u64,
    /// Set when the queue failed (a request timed out or the device asked for a reset,
    /// and it was not recovered; or another queue stopped the device): from then on
    /// nothing goes to the device.
    fault: Option<DeviceFault>,
    /// The device's recovery: a request past its deadline has the device reset
    /// (`VirtioBlk::recover`), and this queue serves again after it.
    link: QueueLink,
}

/// What a part carries after its header.
enum Body<'a> {
    None,
    Data {
        segments: &'a [DmaSegment],
        device_writes: bool,
    },
    /// A discard range, already in the header area.
    Range,
}

impl<H: Hal> BlkQueue<H> {
    pub fn queue_index(&self) -> u16 {
        self.index
    }

    /// The queue failed (`BlockDevice::fault` says why); every request now fails.
    pub fn is_dead(&self) -> bool {
        self.fault.is_some()
    }

    /// The queue fails for good: the device is stopped from reaching memory first (bus
    /// mastering off: whatever it still holds can no longer land anywhere), then every
    /// request outstanding is answered `Error` at the next poll, and nothing goes to the
    /// device again. Its slots are reused for those local answers only.
    fn fail(&mut self, kind: FaultKind) {
        let (fault, failed) = self.slots.fail_queue(kind, || self.hal.stop_dma());
        self.fault = Some(fault);
        log::error!(
            "virtio: q{} failed: {fault}; {failed} outstanding requests fail",
            self.index
        );
    }

    /// The slot's header area.
    fn header(&self, slot: u16) -> DmaRegion {
        self.headers
            .slice(u64::from(slot) * HEADER_AREA, HEADER_AREA)
    }

    /// Writes the header and the descriptor chain of `slot`.
    fn prepare(&mut self, slot: u16, kind: u32, sector: u64, body: Body<'_>) {
        let header = self.header(slot);
        let mut bytes = [0u8; 16];
        bytes[0..4].copy_from_slice(&kind.to_le_bytes());
        bytes[8..16].copy_from_slice(&sector.to_le_bytes());
        self.hal.write_dma(header, 0, &bytes);
        // A status other than OK until the device writes it.
        self.hal.write_dma(header, STATUS_OFFSET, &[0xff]);

        let table = self.chains.table(slot);
        let first = self.chains.first_index(slot);
        let mut chunk = [0u8; 32 * DESC_LEN as usize];
        let mut in_chunk = 0;
        let mut written = 0u16;
        let mut emit = |entry: [u8; 16], hal: &H| {
            chunk[in_chunk * 16..in_chunk * 16 + 16].copy_from_slice(&entry);
            in_chunk += 1;
            written += 1;
            if in_chunk == 32 {
                hal.write_dma(table, u64::from(written - 32) * DESC_LEN, &chunk);
                in_chunk = 0;
            }
        };
        emit(
            descriptor(header.span(0, 16), 16, DESC_F_NEXT, first + 1),
            &self.hal,
        );
        match body {
            Body::None => {}
            Body::Range => emit(
                descriptor(header.span(RANGE_OFFSET, 16), 16, DESC_F_NEXT, first + 2),
                &self.hal,
            ),
            Body::Data {
                segments,
                device_writes,
            } => {
                let flags = DESC_F_NEXT | if device_writes { DESC_F_WRITE } else { 0 };
                for (i, segment) in segments.iter().enumerate() {
                    let address = segment.buffer + u64::from(segment.offset);
                    emit(
                        descriptor(address, segment.len, flags, first + i as u16 + 2),
                        &self.hal,
                    );
                }
            }
        }
        emit(
            descriptor(header.span(STATUS_OFFSET, 1), 1, DESC_F_WRITE, 0),
            &self.hal,
        );
        if in_chunk > 0 {
            self.hal.write_dma(
                table,
                u64::from(written - in_chunk as u16) * DESC_LEN,
                &chunk[..in_chunk * 16],
            );
        }
        self.slots.payload_mut(slot).entries = written;
    }

    fn launch(&mut self, slot: u16) {
        let entries = self.slots.payload(slot).entries;
        self.chains.post(&mut self.ring, &self.hal, slot, entries);
        self.slots.launched(slot);
    }

    fn publish(&self) {
        if self.ring.publish(&self.hal) {
            self.hal.write16(self.notify, self.index);
        }
    }

    fn submit_data(&mut self, request: &IoRequest<'_>) -> Result<(), SubmitError> {
        let bytes: u64 = request.segments.iter().map(|s| u64::from(s.len)).sum();
        let segments_ok = request.segments.iter().all(|s| {
            s.len > 0
                && u64::from(s.offset) + u64::from(s.len) <= 4096
                && s.buffer.checked_add(u64::from(s.offset)).is_some()
        });
        if request.segments.is_empty()
            || !segments_ok
            || bytes != request.nr_sectors * SECTOR_SIZE
            || !range_fits(request.sector, request.nr_sectors, self.geometry.sectors)
            || (request.op == IoOp::Write && self.geometry.read_only)
        {
            return Err(SubmitError::Invalid);
        }
        let parts = request.segments.len().div_ceil(self.max_part_segments);
        let commands = parts + usize::from(request.preflush);
        if commands > self.slots.capacity() {
            return Err(SubmitError::Invalid);
        }
        if commands > self.slots.free_slots() {
            return Err(SubmitError::QueueFull);
        }
        let head = self.slots.begin(request.tag, commands as u16);
        let mut previous = None;
        if request.preflush {
            self.prepare(head, REQUEST_FLUSH, 0, Body::None);
            previous = Some(head);
        }
        let (kind, device_writes) = if request.op == IoOp::Read {
            (REQUEST_IN, true)
        } else {
            (REQUEST_OUT, false)
        };
        let mut sector = request.sector;
        for (k, part) in request.segments.chunks(self.max_part_segments).enumerate() {
            let slot = if k == 0 && !request.preflush {
                head
            } else {
                self.slots.add(head)
            };
            self.prepare(
                slot,
                kind,
                sector,
                Body::Data {
                    segments: part,
                    device_writes,
                },
            );
            sector += part.iter().map(|s| u64::from(s.len)).sum::<u64>() / SECTOR_SIZE;
            match previous {
                Some(after) => {
                    self.slots.stage_after(after, slot);
                    previous = Some(slot);
                }
                None => self.launch(slot),
            }
        }
        if request.preflush {
            self.launch(head);
        }
        self.publish();
        Ok(())
    }

    fn submit_flush(&mut self, tag: u32) -> Result<(), SubmitError> {
        if !self.geometry.flush {
            return self.slots.complete_locally(tag, IoStatus::Unsupported);
        }
        if self.slots.free_slots() == 0 {
            return Err(SubmitError::QueueFull);
        }
        let head = self.slots.begin(tag, 1);
        self.prepare(head, REQUEST_FLUSH, 0, Body::None);
        self.launch(head);
        self.publish();
        Ok(())
    }

    fn submit_discard(&mut self, request: &IoRequest<'_>, secure: bool) -> Result<(), SubmitError> {
        if !range_fits(request.sector, request.nr_sectors, self.geometry.sectors) {
            return Err(SubmitError::Invalid);
        }
        if secure || self.geometry.discard.is_none() {
            return self
                .slots
                .complete_locally(request.tag, IoStatus::Unsupported);
        }
        if request.nr_sectors == 0 {
            return self.slots.complete_locally(request.tag, IoStatus::Ok);
        }
        let parts = request.nr_sectors.div_ceil(self.max_discard_sectors);
        if parts > self.slots.capacity() as u64 {
            return Err(SubmitError::Invalid);
        }
        if parts > self.slots.free_slots() as u64 {
            return Err(SubmitError::QueueFull);
        }
        let head = self.slots.begin(request.tag, parts as u16);
        let mut sector = request.sector;
        let end = request.sector + request.nr_sectors;
        for k in 0..parts {
            let slot = if k == 0 { head } else { self.slots.add(head) };
            let count = (end - sector).min(self.max_discard_sectors);
            let mut range = [0u8; 16];
            range[0..8].copy_from_slice(&sector.to_le_bytes());
            range[8..12].copy_from_slice(&(count as u32).to_le_bytes());
            self.hal.write_dma(self.header(slot), RANGE_OFFSET, &range);
            self.prepare(slot, REQUEST_DISCARD, 0, Body::Range);
            self.launch(slot);
            sector += count;
        }
        self.publish();
        Ok(())
    }
}

impl<H: Hal> BlockDevice for BlkQueue<H> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn queue_depth(&self) -> usize {
        self.slots.capacity()
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        _buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        if self.fault.is_some() {
            return self.slots.complete_locally(request.tag, IoStatus::Error);
        }
        if !self.enter() {
            return match self.fault {
                Some(_) => self.slots.complete_locally(request.tag, IoStatus::Error),
                // Being reset: the request waits (the engine keeps it, and the requests
                // behind it stay in the guest's ring).
                None => Err(SubmitError::QueueFull),
            };
        }
        let submitted = match request.op {
            IoOp::Read | IoOp::Write => self.submit_data(request),
            IoOp::Flush => self.submit_flush(request.tag),
            IoOp::Discard { secure } => self.submit_discard(request, secure),
        };
        self.link.leave();
        submitted
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let entered = self.fault.is_none() && self.enter();
        let mut reported = self.slots.drain_local(sink);
        if !entered {
            // Stopped: whatever lies in the used ring names slots long answered. Being
            // reset: the used ring is the device's to set up again.
            return reported;
        }
        let mut released = false;
        while let Some((id, _written)) = self.ring.next_used(&self.hal) {
            let Some(slot) = self.chains.slot_of(id) else {
                log::error!("virtio: q{} used element names descriptor {id}", self.index);
                continue;
            };
            if self.slots.state(slot) != Some(SlotState::InFlight) {
                log::error!(
                    "virtio: q{} completion for descriptor {slot}, not in flight",
                    self.index
                );
                continue;
            }
            self.link.finished(slot);
            let mut byte = [0u8; 1];
            self.hal
                .read_dma(self.header(slot), STATUS_OFFSET, &mut byte);
            let outcome = match byte[0] {
                STATUS_OK => IoStatus::Ok,
                STATUS_UNSUPPORTED => IoStatus::Unsupported,
                other => {
                    log::warn!(
                        "virtio: q{} request in slot {slot} failed (status {other})",
                        self.index
                    );
                    IoStatus::Error
                }
            };
            let (ring, hal, chains) = (&mut self.ring, &self.hal, self.chains);
            let finished = self.slots.finish(slot, outcome, &mut |slots, staged| {
                chains.post(ring, hal, staged, slots.payload(staged).entries);
                slots.launched(staged);
                released = true;
            });
            if let Finished::Request(completion) = finished {
                sink(completion);
                reported += 1;
            }
        }
        if released {
            self.publish();
        }
        self.link.leave();
        reported
    }

    /// Also reads the device status when commands have waited a while with none
    /// finishing (`health_check_due`): a device that needs a reset answers nothing more,
    /// and its requests fail now rather than at their deadline. With recovery, either
    /// has the device reset (`VirtioBlk::recover`) instead.
    fn tick(&mut self, now_ns: u64, timeout_ns: u64) {
        if self.link.recovers() {
            if self.fault.is_none() && self.enter() {
                self.ask_recovery(now_ns, timeout_ns);
                self.link.leave();
            }
            return;
        }
        if let Some(kind) = self.slots.due(self.fault, now_ns, timeout_ns, &self.hal) {
            self.fail(kind);
        } else if self.fault.is_none() && self.slots.health_check_due(now_ns) {
            let device_status = self.hal.read8(self.status_register);
            if device_status & (status::NEEDS_RESET | status::FAILED) != 0 {
                log::error!(
                    "virtio: device status {device_status:#x} on q{}",
                    self.index
                );
                self.fail(FaultKind::Fatal);
            }
        }
    }

    fn fault(&self) -> Option<DeviceFault> {
        if self.link.recovers() {
            return self
                .fault
                .or_else(|| self.link.failed(self.hal.dma_stopped()));
        }
        cmdslots::queue_fault(self.fault, self.hal.dma_stopped())
    }
}

impl<H: Hal> BlkQueue<H> {
    /// A tick with recovery: a request past its deadline, or a device asking for a
    /// reset, has the control path reset it (virtio-blk has no abort).
    fn ask_recovery(&mut self, now_ns: u64, timeout_ns: u64) {
        if let Some(overdue) = self.slots.tick(now_ns, timeout_ns) {
            let waited_ms = overdue.waited_ns / 1_000_000;
            if self.link.ask_reset(FaultKind::Timeout { waited_ms }) {
                log::error!(
                    "virtio: q{} request in slot {} got no completion in {waited_ms} ms: reset asked",
                    self.index,
                    overdue.slot
                );
            }
        } else if self.slots.health_check_due(now_ns) {
            let device_status = self.hal.read8(self.status_register);
            if device_status & (status::NEEDS_RESET | status::FAILED) != 0
                && self.link.ask_reset(FaultKind::Fatal)
            {
                log::error!(
                    "virtio: device status {device_status:#x} on q{}: reset asked",
                    self.index
                );
            }
        }
    }
}

impl<H: Hal> LinkedQueue for BlkQueue<H> {
    fn link(&mut self) -> &mut QueueLink {
        &mut self.link
    }

    /// The device was reset since the queue last looked: the requests it held were lost
    /// with it. They fail, answered `Error` at the next poll; the virtqueue, set up
    /// again empty by the reset, starts afresh.
    fn resync(&mut self) {
        let failed = self.slots.fail_all();
        self.ring.restart();
        self.link.synced();
        log::warn!(
            "virtio: q{} serves again after the device reset; {failed} requests it held fail",
            self.index
        );
    }

    fn fail(&mut self, kind: FaultKind) {
        BlkQueue::fail(self, kind)
    }
}
