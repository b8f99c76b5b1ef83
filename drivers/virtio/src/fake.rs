// SPDX-License-Identifier: MIT OR Apache-2.0
//! An in-process virtio-blk device over the PCI transport, for the tests: common
//! configuration, notifications, split rings with indirect descriptors, a disk in
//! memory, and injectable faults. It serves a queue on each notification, or only when
//! a test calls `process` (`hold`). Faults: an I/O error for requests touching one
//! sector (`fail_sector`), requests touching another taken and never answered
//! (`stall_sector`, until `finish_stalled`, or a reset, which drops them), refused
//! request kinds, NEEDS_RESET after some requests, and bus mastering: once the driver stops the device's DMA, it reads,
//! writes and posts nothing (`dma_blocked` counts what it would have done).

extern crate std;
use std::string::String;
use std::vec::Vec;
use std::{format, vec};

use crate::feature;
use crate::Hal;
use blkdev::DmaRegion;
use cmdslots::fake::{BusMaster, DeviceModel, DmaMemory};

pub const COMMON: u64 = 0x1000_0000;
pub const NOTIFY: u64 = 0x1000_1000;
pub const NOTIFY_MULTIPLIER: u32 = 4;
pub const DEVICE: u64 = 0x1000_2000;
const MEMORY_BYTES: usize = 48 << 20;

#[derive(Clone, Copy, Debug, Default)]
struct Queue {
    /// 0 until the driver sets it: reads give `queue_max` meanwhile.
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    enabled: bool,
    last_avail: u16,
    used_idx: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub queue: u16,
    pub kind: u32,
    pub sector: u64,
    pub bytes: u64,
    pub segments: usize,
}

pub struct FakeDevice {
    pub memory: DmaMemory,
    pub disk: Vec<u8>,
    pub offered: u64,
    pub accepted: u64,
    pub status: u8,
    pub seg_max: u32,
    pub num_queues: u16,
    pub queue_max: u16,
    /// `max_discard_sectors` and `discard_sector_alignment` in the configuration (64
    /// and 8); a discard range longer than the first, or one whose start is off the
    /// second, is noted as a violation (the longer one also fails).
    pub max_discard_sectors: u32,
    pub discard_alignment: u32,
    pub hold: bool,
    /// Once FEATURES_OK is written, clear it again (a device refusing the set).
    pub refuse_features: bool,
    pub fail_sector: Option<u64>,
    pub unsupported_kinds: Vec<u32>,
    /// After this many requests the device sets NEEDS_RESET and stops.
    pub reset_after: Option<usize>,
    /// A read or write touching this sector is taken and held, unanswered, until
    /// `finish_stalled`.
    pub stall_sector: Option<u64>,
    /// Requests held by `stall_sector`: (queue, chain head).
    pub stalled: Vec<(u16, u16)>,
    /// Bus mastering: off (the driver's `stop_dma`), the device reaches no memory.
    pub bus: BusMaster,
    /// A reset (status 0 written) is done at this read of the device status (`Some(0)`:
    /// at once); `None`: never (the status keeps reading what it was).
    pub reset_after_reads: Option<u32>,
    /// Resets asked for (status 0 written).
    pub resets: usize,
    /// A reset asked for and not done yet: reads of the status left until it is.
    resetting: Option<Option<u32>>,
    feature_select: u32,
    driver_feature_select: u32,
    queue_select: u16,
    queues: Vec<Queue>,
    pub served: Vec<Served>,
    pub notifications: usize,
    pub violations: Vec<String>,
}

impl FakeDevice {
    pub fn new(disk_bytes: usize) -> Self {
        FakeDevice {
            memory: DmaMemory::new(MEMORY_BYTES),
            disk: vec![0; disk_bytes],
            offered: feature::VERSION_1
                | feature::RING_INDIRECT_DESC
                | feature::BLK_SEG_MAX
                | feature::BLK_BLK_SIZE
                | feature::BLK_FLUSH
                | feature::BLK_MQ
                | feature::BLK_DISCARD
                | (1 << 29), // EVENT_IDX: offered, must not be taken
            accepted: 0,
            status: 0,
            seg_max: 126,
            num_queues: 4,
            queue_max: 256,
            max_discard_sectors: 64,
            discard_alignment: 8,
            hold: false,
            refuse_features: false,
            fail_sector: None,
            unsupported_kinds: Vec::new(),
            reset_after: None,
            stall_sector: None,
            stalled: Vec::new(),
            bus: BusMaster::default(),
            reset_after_reads: Some(0),
            resets: 0,
            resetting: None,
            feature_select: 0,
            driver_feature_select: 0,
            queue_select: 0,
            queues: vec![Queue::default(); 8],
            served: Vec::new(),
            notifications: 0,
            violations: Vec::new(),
        }
    }

    fn selected(&mut self) -> &mut Queue {
        let q = usize::from(self.queue_select);
        &mut self.queues[q]
    }

    pub fn read(&mut self, address: u64, width: u32) -> u64 {
        if (DEVICE..DEVICE + 0x100).contains(&address) {
            let mut config = [0u8; 0x40];
            let sectors = (self.disk.len() / 512) as u64;
            config[0..8].copy_from_slice(&sectors.to_le_bytes());
            config[0x0c..0x10].copy_from_slice(&self.seg_max.to_le_bytes());
            config[0x14..0x18].copy_from_slice(&512u32.to_le_bytes());
            config[0x22..0x24].copy_from_slice(&self.num_queues.to_le_bytes());
            config[0x24..0x28].copy_from_slice(&self.max_discard_sectors.to_le_bytes());
            config[0x2c..0x30].copy_from_slice(&self.discard_alignment.to_le_bytes());
            let o = (address - DEVICE) as usize;
            let mut v = [0u8; 8];
            v[..width as usize].copy_from_slice(&config[o..o + width as usize]);
            return u64::from_le_bytes(v);
        }
        let max_queues = self.num_queues;
        match address - COMMON {
            0x04 => (self.offered >> (32 * self.feature_select)) & 0xffff_ffff,
            0x12 => u64::from(max_queues),
            0x14 => {
                match self.resetting {
                    Some(Some(0)) => self.reset(),
                    Some(Some(left)) => self.resetting = Some(Some(left - 1)),
                    _ => {}
                }
                u64::from(self.status)
            }
            0x18 => {
                let q = self.queue_select;
                if q >= max_queues {
                    0
                } else {
                    let (size, max) = (self.selected().size, self.queue_max);
                    u64::from(if size == 0 { max } else { size })
                }
            }
            0x1e => u64::from(self.queue_select),
            _ => 0,
        }
    }

    pub fn write(&mut self, address: u64, width: u32, value: u64) {
        if (NOTIFY..DEVICE).contains(&address) {
            let q = (address - NOTIFY) / u64::from(NOTIFY_MULTIPLIER);
            if width != 2 || value != q {
                self.violations
                    .push(format!("notify {value} at queue {q}'s doorbell"));
            }
            if self.status & 4 == 0 {
                self.violations.push("notified before DRIVER_OK".into());
            }
            self.notifications += 1;
            if !self.hold {
                self.process_queue(q as usize);
            }
            return;
        }
        let v32 = value as u32;
        match address - COMMON {
            0x00 => self.feature_select = v32,
            0x08 => self.driver_feature_select = v32,
            0x0c => {
                let shift = 32 * self.driver_feature_select;
                self.accepted =
                    (self.accepted & !(0xffff_ffffu64 << shift)) | (u64::from(v32) << shift);
            }
            0x10 | 0x1a => {
                if value as u16 != 0xffff {
                    self.violations.push("an MSI-X vector was assigned".into());
                }
            }
            0x14 => {
                let new = value as u8;
                if new == 0 {
                    self.resets += 1;
                    self.resetting = Some(self.reset_after_reads);
                    if self.reset_after_reads == Some(0) {
                        self.reset();
                    }
                    return;
                }
                if new & 8 != 0 && self.status & 8 == 0 {
                    if self.accepted & !self.offered != 0 {
                        self.violations.push("accepted features not offered".into());
                    }
                    if self.accepted & (1 << 29) != 0 {
                        self.violations.push("took EVENT_IDX".into());
                    }
                    if self.refuse_features {
                        self.status = new & !8;
                        return;
                    }
                }
                self.status = new;
            }
            0x16 => self.queue_select = value as u16,
            0x18 => {
                let max = self.queue_max;
                let size = value as u16;
                if size > max || !size.is_power_of_two() {
                    self.violations.push(format!("queue size {size}"));
                }
                self.selected().size = size;
            }
            0x1c => {
                if self.status & 8 == 0 {
                    self.violations
                        .push("queue enabled before FEATURES_OK".into());
                }
                self.selected().enabled = value == 1;
            }
            0x20 => self.selected().desc = (self.selected().desc & !0xffff_ffff) | value,
            0x24 => self.selected().desc = (self.selected().desc & 0xffff_ffff) | (value << 32),
            0x28 => self.selected().avail = (self.selected().avail & !0xffff_ffff) | value,
            0x2c => self.selected().avail = (self.selected().avail & 0xffff_ffff) | (value << 32),
            0x30 => self.selected().used = (self.selected().used & !0xffff_ffff) | value,
            0x34 => self.selected().used = (self.selected().used & 0xffff_ffff) | (value << 32),
            o => self
                .violations
                .push(format!("write to common register {o:#x}")),
        }
    }

    /// A device reset: the held requests run first (their data moves if bus mastering
    /// allows, as QEMU finishes what it started) and are dropped with every queue:
    /// nothing goes to a used ring for them. The device forgets its driver: status 0,
    /// no features, no queues.
    fn reset(&mut self) {
        for (q, head) in core::mem::take(&mut self.stalled) {
            if self.bus.allows() {
                let queue = self.queues[usize::from(q)];
                self.serve(q, queue, head);
            }
        }
        self.status = 0;
        self.accepted = 0;
        self.queues = vec![Queue::default(); 8];
        self.resetting = None;
    }

    pub fn process(&mut self) {
        for q in 0..self.queues.len() {
            if self.queues[q].enabled {
                self.process_queue(q);
            }
        }
    }

    fn process_queue(&mut self, q: usize) {
        let queue = self.queues[q];
        if !queue.enabled {
            self.violations.push(format!("queue {q} not enabled"));
            return;
        }
        if !self.bus.allows() {
            // The available ring is host memory.
            return;
        }
        let mut last = queue.last_avail;
        while last != self.memory.u16_at(queue.avail + 2) {
            if self.status & 0x40 != 0 {
                break;
            }
            if self.reset_after.is_some_and(|n| self.served.len() >= n) {
                self.status |= 0x40;
                break;
            }
            let head = self
                .memory
                .u16_at(queue.avail + 4 + 2 * u64::from(last % queue.size));
            last = last.wrapping_add(1);
            if self.stalls(queue, head) {
                self.stalled.push((q as u16, head));
                continue;
            }
            let written = self.serve(q as u16, queue, head);
            self.put_used(q, head, written);
        }
        self.queues[q].last_avail = last;
    }

    /// Appends `head` to queue `q`'s used ring.
    fn put_used(&mut self, q: usize, head: u16, written: u32) {
        let queue = self.queues[q];
        let position = queue.used + 4 + 8 * u64::from(queue.used_idx % queue.size);
        let mut element = [0u8; 8];
        element[0..4].copy_from_slice(&u32::from(head).to_le_bytes());
        element[4..8].copy_from_slice(&written.to_le_bytes());
        self.memory.put(position, &element);
        let used_idx = queue.used_idx.wrapping_add(1);
        self.memory.put(queue.used + 2, &used_idx.to_le_bytes());
        self.queues[q].used_idx = used_idx;
    }

    /// A read or write covering `stall_sector` (its header names the sector, its data
    /// descriptors the length).
    fn stalls(&self, queue: Queue, head: u16) -> bool {
        let Some(stall) = self.stall_sector else {
            return false;
        };
        let d = queue.desc + 16 * u64::from(head);
        let (first, flags) = (self.memory.u64_at(d), self.memory.u16_at(d + 12));
        let (table, mut i) = if flags & 4 != 0 {
            (first, 0)
        } else {
            (queue.desc, head)
        };
        let header = self.memory.u64_at(table + 16 * u64::from(i));
        let (kind, sector) = (self.memory.u32_at(header), self.memory.u64_at(header + 8));
        let mut bytes = 0u64;
        loop {
            let e = table + 16 * u64::from(i);
            if self.memory.u16_at(e + 12) & 1 == 0 {
                break;
            }
            i = self.memory.u16_at(e + 14);
            bytes += u64::from(self.memory.u32_at(table + 16 * u64::from(i) + 8));
        }
        // The status byte's descriptor is counted too: at most one sector too many.
        matches!(kind, 0 | 1) && (sector..sector + bytes.div_ceil(512).max(1)).contains(&stall)
    }

    /// The held requests run and complete now, late (their data moves and they are put
    /// in the used ring, unless bus mastering is off by now).
    pub fn finish_stalled(&mut self) {
        for (q, head) in core::mem::take(&mut self.stalled) {
            if !self.bus.allows() {
                continue;
            }
            let queue = self.queues[usize::from(q)];
            let written = self.serve(q, queue, head);
            self.put_used(usize::from(q), head, written);
        }
    }

    /// Runs the request whose chain starts at descriptor `head`; returns bytes written.
    fn serve(&mut self, q: u16, queue: Queue, head: u16) -> u32 {
        if head >= queue.size {
            self.violations.push(format!("head {head} out of range"));
            return 0;
        }
        let d = queue.desc + 16 * u64::from(head);
        let (table, table_len, flags) = (
            self.memory.u64_at(d),
            self.memory.u32_at(d + 8),
            self.memory.u16_at(d + 12),
        );
        // An indirect table, or a chain in the ring's own descriptor table.
        let (table, entries, mut i) = if flags & 4 != 0 {
            if self.accepted & feature::RING_INDIRECT_DESC == 0 || flags != 4 {
                self.violations
                    .push(format!("indirect descriptor flags {flags} not negotiated"));
                return 0;
            }
            if table_len % 16 != 0 || table_len == 0 {
                self.violations
                    .push(format!("indirect table of {table_len} bytes"));
                return 0;
            }
            (table, (table_len / 16) as u16, 0)
        } else {
            (queue.desc, queue.size, head)
        };
        let mut chain = Vec::new();
        loop {
            let e = table + 16 * u64::from(i);
            let (addr, len, f, next) = (
                self.memory.u64_at(e),
                self.memory.u32_at(e + 8),
                self.memory.u16_at(e + 12),
                self.memory.u16_at(e + 14),
            );
            if f & 4 != 0 {
                self.violations
                    .push("indirect descriptor inside a chain".into());
                return 0;
            }
            chain.push((addr, len, f & 2 != 0));
            if f & 1 == 0 {
                break;
            }
            if next >= entries || chain.len() > usize::from(entries) {
                self.violations.push("chain leaves its table".into());
                return 0;
            }
            i = next;
        }
        if flags & 4 != 0 && chain.len() != usize::from(entries) {
            self.violations.push("table longer than its chain".into());
        }
        let (header, header_len, header_writable) = chain[0];
        let (status_address, status_len, status_writable) = *chain.last().unwrap();
        if header_len != 16 || header_writable || status_len != 1 || !status_writable {
            self.violations
                .push("header or status descriptor malformed".into());
            return 0;
        }
        let kind = self.memory.u32_at(header);
        let sector = self.memory.u64_at(header + 8);
        let data = &chain[1..chain.len() - 1];
        let bytes: u64 = data.iter().map(|(_, l, _)| u64::from(*l)).sum();
        self.served.push(Served {
            queue: q,
            kind,
            sector,
            bytes,
            segments: data.len(),
        });
        if data.len() > self.seg_max as usize && matches!(kind, 0 | 1) {
            self.violations
                .push(format!("{} segments exceed seg_max", data.len()));
        }
        let mut status = 0u8;
        let mut written = 1u32;
        if self.unsupported_kinds.contains(&kind) {
            status = 2;
        } else {
            match kind {
                0 | 1 => {
                    let end = sector * 512 + bytes;
                    let failed = self
                        .fail_sector
                        .is_some_and(|s| (sector..end.div_ceil(512)).contains(&s));
                    if end > self.disk.len() as u64 || failed {
                        status = 1;
                    } else {
                        let mut at = (sector * 512) as usize;
                        for &(addr, len, device_writes) in data {
                            let (a, l) = (addr as usize, len as usize);
                            if device_writes != (kind == 0) {
                                self.violations.push("data direction flag wrong".into());
                            }
                            if kind == 0 {
                                self.memory[a..a + l].copy_from_slice(&self.disk[at..at + l]);
                                written += len;
                            } else {
                                self.disk[at..at + l].copy_from_slice(&self.memory[a..a + l]);
                            }
                            at += l;
                        }
                    }
                }
                4 => {
                    if !data.is_empty() {
                        self.violations.push("flush with data".into());
                    }
                }
                11 => {
                    for &(addr, len, _) in data {
                        if len != 16 {
                            self.violations.push("discard range length".into());
                            continue;
                        }
                        let start = self.memory.u64_at(addr);
                        let count = u64::from(self.memory.u32_at(addr + 8));
                        if count > u64::from(self.max_discard_sectors)
                            || (start + count) * 512 > self.disk.len() as u64
                        {
                            status = 1;
                            continue;
                        }
                        if !start.is_multiple_of(u64::from(self.discard_alignment.max(1))) {
                            self.violations
                                .push(format!("discard at {start}, off the alignment"));
                        }
                        self.disk[(start * 512) as usize..((start + count) * 512) as usize].fill(0);
                        self.served.last_mut().unwrap().sector = start;
                        self.served.last_mut().unwrap().bytes = count * 512;
                    }
                }
                _ => status = 2,
            }
        }
        self.memory.put(status_address, &[status]);
        written
    }
}

/// The test HAL: every access goes to the shared fake device.
pub type FakeHal = cmdslots::fake::FakeHal<FakeDevice>;

/// Where `FakeDevice` has its configuration structures (the regions `VirtioBlk::init`
/// is given).
pub fn regions() -> crate::PciRegions {
    crate::PciRegions {
        common: COMMON,
        notify: NOTIFY,
        notify_multiplier: NOTIFY_MULTIPLIER,
        device: DEVICE,
    }
}

// SAFETY: the registers are plain Rust state of the `FakeDevice`, reached by safe code
// only (a register it does not know is recorded or ignored, a bad index panics); the used index is
// read through `DmaRegion::span` from the fake's memory, a bounds-checked `Vec`.
#[allow(unsafe_code, reason = "a test double of the kernel's HAL")]
unsafe impl Hal for FakeHal {
    fn read8(&self, address: u64) -> u8 {
        self.with(|m| m.read(address, 1) as u8)
    }
    fn read16(&self, address: u64) -> u16 {
        self.with(|m| m.read(address, 2) as u16)
    }
    fn read32(&self, address: u64) -> u32 {
        self.with(|m| m.read(address, 4) as u32)
    }
    fn write8(&self, address: u64, value: u8) {
        self.with(|m| m.write(address, 1, u64::from(value)))
    }
    fn write16(&self, address: u64, value: u16) {
        self.with(|m| m.write(address, 2, u64::from(value)))
    }
    fn write32(&self, address: u64, value: u32) {
        self.with(|m| m.write(address, 4, u64::from(value)))
    }
    fn read_dma_u16(&self, region: DmaRegion, offset: u64) -> u16 {
        self.with(|m| m.memory.u16_at(region.span(offset, 2)))
    }
}

impl DeviceModel for FakeDevice {
    fn memory(&mut self) -> &mut DmaMemory {
        &mut self.memory
    }
    fn bus_master(&mut self) -> &mut BusMaster {
        &mut self.bus
    }
    fn finish_stalled(&mut self) {
        FakeDevice::finish_stalled(self)
    }
    fn handed(&self) -> usize {
        self.notifications + self.bus.blocked
    }
}
