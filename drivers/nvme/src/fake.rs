// SPDX-License-Identifier: MIT OR Apache-2.0
//! An in-process NVMe controller for the tests: registers, admin commands, I/O queues
//! with PRP walking as the spec describes, a disk in memory, and injectable faults.
//! It plays the device either on each doorbell write (`hold = false`) or when a test
//! calls `process` (to observe queue-full and ordering). Faults: a status for commands
//! touching one LBA (`fail_lba`), commands touching another taken and never answered
//! (`stall_lba`, until `finish_stalled`), a fatal status after some commands, and bus
//! mastering: once the driver stops the device's DMA, it fetches, writes and posts
//! nothing (`dma_blocked` counts what it would have done). An Abort takes a held
//! command back (`honour_abort`), or says it did not, or goes unanswered
//! (`ignore_abort`); a controller reset (CC.EN = 0) drops what it holds, as QEMU's
//! finishes its requests first (their data moves if bus mastering allows), and it may
//! then never become ready again (`never_ready`).

extern crate std;
use std::string::String;
use std::vec::Vec;
use std::{format, vec};

use crate::command::{CommandStatus, CQ_ENTRY_LEN, SQ_ENTRY_LEN};
use crate::Hal;
use blkdev::DmaRegion;
use cmdslots::fake::{BusMaster, DeviceModel, DmaMemory};

pub const MEMORY_BYTES: usize = 48 << 20;
const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, Default)]
struct QueueState {
    base: u64,
    entries: u16,
    head: u16,
    tail: u16,
    phase: bool,
    /// For submission queues: the completion queue id.
    cq: u16,
    present: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Executed {
    pub qid: u16,
    pub opcode: u8,
    pub slba: u64,
    pub blocks: u32,
}

pub struct FakeController {
    pub memory: DmaMemory,
    pub disk: Vec<u8>,
    pub block_size: u32,
    pub mqes: u16,
    pub dstrd: u32,
    pub mdts: u8,
    pub dsm: bool,
    /// Dataset Management Range Size Limit in blocks, reported on the NVM command set's
    /// Identify Controller page (0: none). As QEMU, a longer range is skipped without an
    /// error (and noted as a violation).
    pub dmrsl: u32,
    /// Answer Identify CNS 06h (the command set's controller page) "invalid field".
    pub no_cs_identify: bool,
    /// Offer SGLs for I/O (byte aligned).
    pub sgl: bool,
    /// Namespace 1 is write protected.
    pub write_protected: bool,
    pub vwc: bool,
    pub namespace_count: u32,
    pub cap_to: u8,
    /// Identify Controller's RTD3E (microseconds a shutdown may take; 0: not said).
    pub rtd3e_us: u32,
    /// After a shutdown notification (CC.SHN = 01b), CSTS.SHST says "complete" at this
    /// read of CSTS (`Some(0)`: at once); `None`: never (it stays "in progress").
    pub shutdown_after_reads: Option<u32>,
    /// Shutdown notifications received (CC.SHN going from 00b to 01b).
    pub shutdowns: usize,
    shutdown_reads_left: Option<u32>,
    pub never_ready: bool,
    pub hold: bool,
    pub queues_granted: u16,
    /// A command touching this LBA fails with this status.
    pub fail_lba: Option<(u64, CommandStatus)>,
    /// Opcodes answered "invalid opcode".
    pub unsupported_opcodes: Vec<u8>,
    /// After this many I/O commands the controller goes fatal and stops answering.
    pub fatal_after: Option<usize>,
    /// A read or write touching this LBA is taken from its queue and held, unanswered,
    /// until `finish_stalled`.
    pub stall_lba: Option<u64>,
    /// Commands held by `stall_lba`: (submission queue, entry).
    pub stalled: Vec<(u16, [u8; SQ_ENTRY_LEN])>,
    /// An Abort naming a held command takes it back: it completes with "command abort
    /// requested" and the Abort says so. Otherwise the Abort says "not aborted".
    pub honour_abort: bool,
    /// Abort commands are taken and never answered.
    pub ignore_abort: bool,
    /// Abort commands received: (submission queue, command id).
    pub aborts: Vec<(u16, u16)>,
    /// Controller resets (CC.EN 1 -> 0).
    pub resets: usize,
    /// Bus mastering: off (the driver's `stop_dma`), the controller reaches no memory.
    pub bus: BusMaster,
    pub cc: u32,
    pub csts: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: Vec<QueueState>,
    cqs: Vec<QueueState>,
    pub executed: Vec<Executed>,
    pub violations: Vec<String>,
    pub io_commands: usize,
    pub delays_us: u64,
}

impl FakeController {
    pub fn new(disk_bytes: usize) -> Self {
        FakeController {
            memory: DmaMemory::new(MEMORY_BYTES),
            disk: vec![0; disk_bytes],
            block_size: 512,
            mqes: 63,
            dstrd: 0,
            mdts: 5,
            dsm: true,
            dmrsl: 0,
            no_cs_identify: false,
            sgl: false,
            write_protected: false,
            vwc: true,
            namespace_count: 1,
            cap_to: 20,
            rtd3e_us: 0,
            shutdown_after_reads: Some(0),
            shutdowns: 0,
            shutdown_reads_left: None,
            never_ready: false,
            hold: false,
            queues_granted: 8,
            fail_lba: None,
            unsupported_opcodes: Vec::new(),
            fatal_after: None,
            stall_lba: None,
            stalled: Vec::new(),
            honour_abort: false,
            ignore_abort: false,
            aborts: Vec::new(),
            resets: 0,
            bus: BusMaster::default(),
            cc: 0,
            csts: 0,
            aqa: 0,
            asq: 0,
            acq: 0,
            sqs: vec![QueueState::default(); 65],
            cqs: vec![QueueState::default(); 65],
            executed: Vec::new(),
            violations: Vec::new(),
            io_commands: 0,
            delays_us: 0,
        }
    }

    fn cap(&self) -> u64 {
        u64::from(self.mqes)
            | (1 << 16)
            | (u64::from(self.cap_to) << 24)
            | (u64::from(self.dstrd) << 32)
            | (1 << 37)
            | (4 << 52)
    }

    fn stride(&self) -> usize {
        4 << self.dstrd
    }

    pub fn read_register(&mut self, offset: usize) -> u32 {
        match offset {
            0x00 => self.cap() as u32,
            0x04 => (self.cap() >> 32) as u32,
            0x08 => 0x0001_0400,
            0x14 => self.cc,
            0x1c => {
                if let Some(left) = self.shutdown_reads_left {
                    if left == 0 {
                        self.csts = (self.csts & !(0b11 << 2)) | (0b10 << 2);
                        self.shutdown_reads_left = None;
                    } else {
                        self.shutdown_reads_left = Some(left - 1);
                    }
                }
                self.csts
            }
            0x24 => self.aqa,
            _ => 0,
        }
    }

    pub fn write_register(&mut self, offset: usize, value: u32) {
        match offset {
            0x0c | 0x10 => {}
            0x14 => {
                let was = self.cc & 1;
                let shutdown = (value >> 14) & 0b11 == 0b01 && (self.cc >> 14) & 0b11 == 0;
                if shutdown && value & 1 == 0 {
                    self.violations
                        .push("shutdown notification with CC.EN clear".into());
                }
                self.cc = value;
                if shutdown {
                    self.shutdowns += 1;
                    // "Shutdown processing occurring" until it is done.
                    self.csts = (self.csts & !(0b11 << 2)) | (0b01 << 2);
                    self.shutdown_reads_left = self.shutdown_after_reads;
                }
                if was == 0 && value & 1 == 1 {
                    self.enable();
                } else if value & 1 == 0 {
                    if was == 1 {
                        self.disable();
                    }
                    self.csts &= !1;
                    self.sqs.iter_mut().for_each(|q| *q = QueueState::default());
                    self.cqs.iter_mut().for_each(|q| *q = QueueState::default());
                }
            }
            0x24 => self.aqa = value,
            0x28 => self.asq = (self.asq & !0xffff_ffff) | u64::from(value),
            0x2c => self.asq = (self.asq & 0xffff_ffff) | (u64::from(value) << 32),
            0x30 => self.acq = (self.acq & !0xffff_ffff) | u64::from(value),
            0x34 => self.acq = (self.acq & 0xffff_ffff) | (u64::from(value) << 32),
            o if o >= 0x1000 => {
                if (self.cc >> 14) & 0b11 != 0 {
                    self.violations.push(format!(
                        "doorbell write at {o:#x} after the shutdown notification"
                    ));
                }
                let index = (o - 0x1000) / self.stride();
                if (o - 0x1000) % self.stride() != 0 {
                    self.violations
                        .push(format!("doorbell write at {o:#x} off stride"));
                    return;
                }
                let qid = index / 2;
                if index.is_multiple_of(2) {
                    if !self.sqs[qid].present || u32::from(self.sqs[qid].entries) <= value {
                        self.violations.push(format!("bad SQ {qid} tail {value}"));
                        return;
                    }
                    self.sqs[qid].tail = value as u16;
                    if !self.hold {
                        self.process_queue(qid);
                    }
                } else {
                    if !self.cqs[qid].present || u32::from(self.cqs[qid].entries) <= value {
                        self.violations.push(format!("bad CQ {qid} head {value}"));
                        return;
                    }
                    self.cqs[qid].head = value as u16;
                }
            }
            o => self.violations.push(format!("write to register {o:#x}")),
        }
    }

    fn enable(&mut self) {
        if self.never_ready {
            return;
        }
        if (self.cc >> 16) & 0xf != 6 || (self.cc >> 20) & 0xf != 4 {
            self.violations.push("CC entry sizes".into());
        }
        let sq_entries = (self.aqa & 0xfff) as u16 + 1;
        let cq_entries = ((self.aqa >> 16) & 0xfff) as u16 + 1;
        self.sqs[0] = QueueState {
            base: self.asq,
            entries: sq_entries,
            present: true,
            ..Default::default()
        };
        self.cqs[0] = QueueState {
            base: self.acq,
            entries: cq_entries,
            phase: true,
            present: true,
            ..Default::default()
        };
        self.csts |= 1;
    }

    /// CC.EN 1 -> 0: the held commands run first (their data moves if bus mastering
    /// allows), and are dropped with every queue: nothing is posted for them.
    fn disable(&mut self) {
        self.resets += 1;
        // A reset clears a fatal status.
        self.csts &= !2;
        for (qid, entry) in core::mem::take(&mut self.stalled) {
            if self.bus.allows() {
                self.io(qid, &entry);
            }
        }
    }

    /// Runs every submitted command of every queue.
    pub fn process(&mut self) {
        for qid in 0..self.sqs.len() {
            if self.sqs[qid].present {
                self.process_queue(qid);
            }
        }
    }

    fn process_queue(&mut self, qid: usize) {
        while self.sqs[qid].head != self.sqs[qid].tail {
            if self.csts & 2 != 0 {
                return;
            }
            if !self.bus.allows() {
                // Fetching the entry is a read of host memory.
                return;
            }
            let q = self.sqs[qid];
            let address = q.base + u64::from(q.head) * SQ_ENTRY_LEN as u64;
            let entry: [u8; SQ_ENTRY_LEN] =
                self.memory.slice(address, SQ_ENTRY_LEN).try_into().unwrap();
            self.sqs[qid].head = (q.head + 1) % q.entries;
            let (status, result) = if qid == 0 {
                if entry[0] == 0x08 && self.ignore_abort {
                    self.aborts.push(Self::abort_target(&entry));
                    continue;
                }
                self.admin(&entry)
            } else {
                self.io_commands += 1;
                if self.fatal_after.is_some_and(|n| self.io_commands > n) {
                    self.csts |= 2;
                    return;
                }
                if self.stalls(&entry) {
                    self.stalled.push((qid as u16, entry));
                    continue;
                }
                (self.io(qid as u16, &entry), 0)
            };
            let cid = u16::from_le_bytes([entry[2], entry[3]]);
            self.post(q.cq as usize, qid as u16, cid, status, result);
        }
    }

    /// A read or write covering `stall_lba`.
    fn stalls(&self, entry: &[u8; SQ_ENTRY_LEN]) -> bool {
        let slba = u64::from(Self::cdw(entry, 10)) | (u64::from(Self::cdw(entry, 11)) << 32);
        let blocks = u64::from(Self::cdw(entry, 12) & 0xffff) + 1;
        matches!(entry[0], 0x01 | 0x02)
            && self
                .stall_lba
                .is_some_and(|lba| (slba..slba + blocks).contains(&lba))
    }

    /// The held commands run and complete now, late (their data moves and their
    /// completions are posted, unless bus mastering is off by now).
    pub fn finish_stalled(&mut self) {
        for (qid, entry) in core::mem::take(&mut self.stalled) {
            if !self.bus.allows() {
                continue;
            }
            let status = self.io(qid, &entry);
            let cid = u16::from_le_bytes([entry[2], entry[3]]);
            let cq = self.sqs[usize::from(qid)].cq;
            self.post(usize::from(cq), qid, cid, status, 0);
        }
    }

    fn post(&mut self, cqid: usize, sqid: u16, cid: u16, status: CommandStatus, result: u32) {
        if !self.bus.allows() {
            return;
        }
        let cq = self.cqs[cqid];
        if (cq.tail + 1) % cq.entries == cq.head {
            self.violations.push(format!("CQ {cqid} overflow"));
            return;
        }
        let mut bytes = [0u8; CQ_ENTRY_LEN];
        bytes[0..4].copy_from_slice(&result.to_le_bytes());
        bytes[8..10].copy_from_slice(&self.sqs[sqid as usize].head.to_le_bytes());
        bytes[10..12].copy_from_slice(&sqid.to_le_bytes());
        let dw3 = u32::from(cid) | (u32::from(cq.phase) << 16) | (u32::from(status.0) << 17);
        bytes[12..16].copy_from_slice(&dw3.to_le_bytes());
        let address = (cq.base + u64::from(cq.tail) * CQ_ENTRY_LEN as u64) as usize;
        self.memory[address..address + CQ_ENTRY_LEN].copy_from_slice(&bytes);
        let c = &mut self.cqs[cqid];
        c.tail = (c.tail + 1) % c.entries;
        if c.tail == 0 {
            c.phase = !c.phase;
        }
    }

    fn cdw(entry: &[u8; SQ_ENTRY_LEN], n: usize) -> u32 {
        u32::from_le_bytes(entry[n * 4..n * 4 + 4].try_into().unwrap())
    }

    /// The (submission queue, command id) an Abort names.
    fn abort_target(entry: &[u8; SQ_ENTRY_LEN]) -> (u16, u16) {
        let cdw10 = Self::cdw(entry, 10);
        (cdw10 as u16, (cdw10 >> 16) as u16)
    }

    /// An Abort: a held command it names completes "command abort requested" when the
    /// controller honours aborts (dword 0 bit 0 clear: aborted); otherwise not aborted.
    fn abort(&mut self, entry: &[u8; SQ_ENTRY_LEN]) -> (CommandStatus, u32) {
        let (sqid, cid) = Self::abort_target(entry);
        self.aborts.push((sqid, cid));
        let held = self
            .stalled
            .iter()
            .position(|(q, e)| *q == sqid && u16::from_le_bytes([e[2], e[3]]) == cid);
        match held {
            Some(at) if self.honour_abort => {
                self.stalled.remove(at);
                let cq = self.sqs[usize::from(sqid)].cq;
                self.post(usize::from(cq), sqid, cid, CommandStatus::new(0, 0x07), 0);
                (CommandStatus::SUCCESS, 0)
            }
            _ => (CommandStatus::SUCCESS, 1),
        }
    }

    fn admin(&mut self, entry: &[u8; SQ_ENTRY_LEN]) -> (CommandStatus, u32) {
        let prp1 = u64::from_le_bytes(entry[24..32].try_into().unwrap());
        let nsid = Self::cdw(entry, 1);
        let ok = CommandStatus::SUCCESS;
        match entry[0] {
            0x06 => {
                let mut page = vec![0u8; 4096];
                match Self::cdw(entry, 10) {
                    1 => {
                        page[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
                        page[4..24].copy_from_slice(b"fake-serial         ");
                        page[24..64].copy_from_slice(&{
                            let mut m = [b' '; 40];
                            m[..9].copy_from_slice(b"Fake NVMe");
                            m
                        });
                        page[77] = self.mdts;
                        page[88..92].copy_from_slice(&self.rtd3e_us.to_le_bytes());
                        page[516..520].copy_from_slice(&self.namespace_count.to_le_bytes());
                        page[520] = if self.dsm { 1 << 2 } else { 0 };
                        page[525] = u8::from(self.vwc);
                        page[536] = u8::from(self.sgl);
                    }
                    0 if nsid == 1 => {
                        let blocks = (self.disk.len() / self.block_size as usize) as u64;
                        page[0..8].copy_from_slice(&blocks.to_le_bytes());
                        page[8..16].copy_from_slice(&blocks.to_le_bytes());
                        page[26] = 1;
                        page[99] = u8::from(self.write_protected);
                        // Format 0: 4 KiB with metadata (unused), format 1: ours.
                        page[128..132].copy_from_slice(&[8, 0, 12, 0]);
                        page[132..136].copy_from_slice(&[
                            0,
                            0,
                            self.block_size.trailing_zeros() as u8,
                            0,
                        ]);
                    }
                    0 => {} // inactive namespace: all zeros
                    // The NVM command set (CSI 0 in CDW11 31:24): DMRSL at byte 4.
                    6 if Self::cdw(entry, 11) >> 24 == 0 && !self.no_cs_identify => {
                        page[4..8].copy_from_slice(&self.dmrsl.to_le_bytes());
                    }
                    _ => return (CommandStatus::new(0, 2), 0),
                }
                self.memory[prp1 as usize..prp1 as usize + 4096].copy_from_slice(&page);
                (ok, 0)
            }
            0x08 => self.abort(entry),
            0x09 if Self::cdw(entry, 10) & 0xff == 7 => {
                let n = u32::from(self.queues_granted - 1);
                (ok, n | (n << 16))
            }
            0x05 | 0x01 => {
                let cdw10 = Self::cdw(entry, 10);
                let cdw11 = Self::cdw(entry, 11);
                let qid = (cdw10 & 0xffff) as usize;
                let entries = (cdw10 >> 16) as u16 + 1;
                if qid == 0 || qid > usize::from(self.queues_granted) || cdw11 & 1 == 0 {
                    return (CommandStatus::new(1, 1), 0);
                }
                if entries > self.mqes + 1 {
                    return (CommandStatus::new(1, 2), 0);
                }
                let state = QueueState {
                    base: prp1,
                    entries,
                    phase: true,
                    cq: (cdw11 >> 16) as u16,
                    present: true,
                    ..Default::default()
                };
                if entry[0] == 0x05 {
                    self.cqs[qid] = state;
                } else {
                    if !self.cqs[usize::from(state.cq)].present {
                        return (CommandStatus::new(1, 0), 0);
                    }
                    self.sqs[qid] = state;
                }
                (ok, 0)
            }
            _ => (CommandStatus::new(0, 1), 0),
        }
    }

    /// The pages (address, length) a command's PRPs name for `bytes` of data.
    fn prp_walk(&mut self, prp1: u64, prp2: u64, bytes: u64) -> Option<Vec<(u64, u64)>> {
        if !prp1.is_multiple_of(4) {
            self.violations
                .push(format!("PRP1 {prp1:#x} not dword aligned"));
            return None;
        }
        let first = (PAGE - prp1 % PAGE).min(bytes);
        let mut pieces = vec![(prp1, first)];
        let mut left = bytes - first;
        if left == 0 {
            return Some(pieces);
        }
        if left <= PAGE {
            if !prp2.is_multiple_of(PAGE) {
                self.violations
                    .push(format!("PRP2 {prp2:#x} has an offset"));
                return None;
            }
            pieces.push((prp2, left));
            return Some(pieces);
        }
        if !prp2.is_multiple_of(8) {
            self.violations
                .push(format!("PRP list {prp2:#x} misaligned"));
            return None;
        }
        let mut entry = prp2;
        while left > 0 {
            let page = self.memory.u64_at(entry);
            if !page.is_multiple_of(PAGE) {
                self.violations
                    .push(format!("PRP list entry {page:#x} has an offset"));
                return None;
            }
            let len = left.min(PAGE);
            pieces.push((page, len));
            left -= len;
            entry += 8;
            if entry.is_multiple_of(PAGE) && left > 0 {
                self.violations.push("PRP list runs past its page".into());
                return None;
            }
        }
        Some(pieces)
    }

    /// The pieces an SGL 1 descriptor names for `bytes` of data.
    fn sgl_walk(&mut self, sgl1: &[u8], bytes: u64) -> Option<Vec<(u64, u64)>> {
        if !self.sgl {
            self.violations.push("SGL used without SGL support".into());
            return None;
        }
        let address = u64::from_le_bytes(sgl1[0..8].try_into().unwrap());
        let len = u32::from_le_bytes(sgl1[8..12].try_into().unwrap());
        let pieces = match sgl1[15] >> 4 {
            0 => vec![(address, u64::from(len))],
            3 => {
                if len % 16 != 0 || len == 0 {
                    self.violations.push(format!("SGL segment of {len} bytes"));
                    return None;
                }
                let mut pieces = Vec::new();
                for i in 0..u64::from(len / 16) {
                    let d = address + i * 16;
                    if self.memory[d as usize + 15] >> 4 != 0 {
                        self.violations
                            .push("SGL list entry is not a data block".into());
                        return None;
                    }
                    pieces.push((self.memory.u64_at(d), u64::from(self.memory.u32_at(d + 8))));
                }
                pieces
            }
            other => {
                self.violations.push(format!("SGL descriptor type {other}"));
                return None;
            }
        };
        let total: u64 = pieces.iter().map(|p| p.1).sum();
        if total != bytes {
            self.violations
                .push(format!("SGL covers {total} bytes, command {bytes}"));
            return None;
        }
        Some(pieces)
    }

    fn io(&mut self, qid: u16, entry: &[u8; SQ_ENTRY_LEN]) -> CommandStatus {
        let opcode = entry[0];
        let slba = u64::from(Self::cdw(entry, 10)) | (u64::from(Self::cdw(entry, 11)) << 32);
        let blocks = (Self::cdw(entry, 12) & 0xffff) + 1;
        let prp1 = u64::from_le_bytes(entry[24..32].try_into().unwrap());
        let prp2 = u64::from_le_bytes(entry[32..40].try_into().unwrap());
        if Self::cdw(entry, 1) != 1 {
            return CommandStatus::new(0, 0x0b);
        }
        let record = |blocks| Executed {
            qid,
            opcode,
            slba,
            blocks,
        };
        if self.unsupported_opcodes.contains(&opcode) {
            self.executed.push(record(0));
            return CommandStatus::new(0, 1);
        }
        let bs = u64::from(self.block_size);
        let disk_blocks = self.disk.len() as u64 / bs;
        match opcode {
            0x00 => {
                self.executed.push(record(0));
                CommandStatus::SUCCESS
            }
            0x01 | 0x02 => {
                self.executed.push(record(blocks));
                if slba + u64::from(blocks) > disk_blocks {
                    return CommandStatus::new(0, 0x80);
                }
                if let Some((lba, status)) = self.fail_lba {
                    if (slba..slba + u64::from(blocks)).contains(&lba) {
                        return status;
                    }
                }
                let bytes = u64::from(blocks) * bs;
                if bytes > (PAGE << self.mdts) && self.mdts != 0 {
                    self.violations.push(format!("{bytes} bytes exceed MDTS"));
                    return CommandStatus::new(0, 2);
                }
                let pieces = match entry[1] >> 6 {
                    0 => self.prp_walk(prp1, prp2, bytes),
                    1 => self.sgl_walk(&entry[24..40], bytes),
                    _ => None,
                };
                let Some(pieces) = pieces else {
                    return CommandStatus::new(0, 0x13);
                };
                let mut disk_at = (slba * bs) as usize;
                for (address, len) in pieces {
                    let (a, l) = (address as usize, len as usize);
                    if opcode == 0x01 {
                        self.disk[disk_at..disk_at + l].copy_from_slice(&self.memory[a..a + l]);
                    } else {
                        self.memory[a..a + l].copy_from_slice(&self.disk[disk_at..disk_at + l]);
                    }
                    disk_at += l;
                }
                CommandStatus::SUCCESS
            }
            0x09 if self.dsm => {
                let ranges = Self::cdw(entry, 10) as usize + 1;
                if Self::cdw(entry, 11) & 4 == 0 {
                    self.violations.push("DSM without deallocate".into());
                }
                for r in 0..ranges {
                    let at = prp1 + r as u64 * 16;
                    let len = u64::from(self.memory.u32_at(at + 4));
                    let start = self.memory.u64_at(at + 8);
                    self.executed.push(Executed {
                        qid,
                        opcode,
                        slba: start,
                        blocks: len as u32,
                    });
                    if start + len > disk_blocks {
                        return CommandStatus::new(0, 0x80);
                    }
                    if self.dmrsl != 0 && len > u64::from(self.dmrsl) {
                        // Skipped, and success all the same: QEMU's behaviour.
                        self.violations
                            .push(format!("DSM range of {len} blocks above DMRSL"));
                        continue;
                    }
                    self.disk[(start * bs) as usize..((start + len) * bs) as usize].fill(0);
                }
                CommandStatus::SUCCESS
            }
            _ => {
                self.executed.push(record(0));
                CommandStatus::new(0, 1)
            }
        }
    }
}

/// The test HAL: every access goes to the shared fake controller.
pub type FakeHal = cmdslots::fake::FakeHal<FakeController>;

// SAFETY: the registers are plain Rust state of the `FakeController`, reached by safe code
// only (a register it does not know is recorded or ignored, a bad index panics); completion words are
// read through `DmaRegion::span` from the fake's memory, a bounds-checked `Vec`.
#[allow(unsafe_code, reason = "a test double of the kernel's HAL")]
unsafe impl Hal for FakeHal {
    fn read_register(&self, offset: usize) -> u32 {
        self.with(|m| m.read_register(offset))
    }
    fn write_register(&self, offset: usize, value: u32) {
        self.with(|m| m.write_register(offset, value))
    }
    fn read_dma_u32(&self, region: DmaRegion, offset: u64) -> u32 {
        self.with(|m| m.memory.u32_at(region.span(offset, 4)))
    }
}

impl DeviceModel for FakeController {
    fn memory(&mut self) -> &mut DmaMemory {
        &mut self.memory
    }
    fn bus_master(&mut self) -> &mut BusMaster {
        &mut self.bus
    }
    fn delay_us(&mut self, micros: u64) {
        self.delays_us += micros;
    }
    fn finish_stalled(&mut self) {
        FakeController::finish_stalled(self)
    }
    fn handed(&self) -> usize {
        self.executed.len() + self.bus.blocked
    }
}
