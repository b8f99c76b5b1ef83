//! One I/O submission/completion queue pair, as a `blkdev::BlockDevice`.
//!
//! Every command has a slot (its command id is the slot index). A request takes one
//! slot per command; the first slot of a request (its head) carries the tag and counts
//! the request's commands still out. A write with pre-flush puts a FLUSH in the head
//! and keeps its data commands staged until the flush has completed. With at most
//! `entries - 1` slots, neither the submission nor the completion queue can overflow.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use blkdev::{
    BlockDevice, BufferAccess, Completion, DiscardGeometry, DmaSegment, Geometry, IoOp, IoRequest,
    IoStatus, SubmitError, SECTOR_SIZE,
};
use core::sync::atomic::{fence, Ordering};

use crate::command::{io_opcode, CommandStatus, SubmissionEntry, CQ_ENTRY_LEN, SQ_ENTRY_LEN};
use crate::controller::{doorbell, pages_for, reg, Capabilities, Namespace, NvmeError};
use crate::prp::{plan_commands, prp_fields, segment_address, CommandPlan};
use crate::{Hal, PAGE_SIZE};

/// Empty polls with commands outstanding between two looks at CSTS.CFS.
const FATAL_CHECK_INTERVAL: u32 = 1024;
const NO_SLOT: u16 = u16::MAX;
/// Bytes of one Dataset Management range.
const DSM_RANGE_LEN: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Built, waiting for the pre-flush of its request.
    Staged,
    InFlight,
    /// Head whose own command is done while others of its request are not.
    Waiting,
    /// Completed without reaching the device (refused op, dead controller).
    Local,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    tag: u32,
    /// Slot of the request's head.
    head: u16,
    /// Head only: commands of the request not yet completed.
    remaining: u16,
    /// Head only: worst outcome so far.
    status: IoStatus,
    /// Next staged command of the same request.
    next_staged: u16,
    /// FLUSH or DSM: "invalid field" means not supported, not failed.
    optional: bool,
    entry: [u8; SQ_ENTRY_LEN],
}

const EMPTY_SLOT: Slot = Slot {
    state: SlotState::Free,
    tag: 0,
    head: NO_SLOT,
    remaining: 0,
    status: IoStatus::Ok,
    next_staged: NO_SLOT,
    optional: false,
    entry: [0; SQ_ENTRY_LEN],
};

/// Counters for one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub requests: u64,
    pub commands: u64,
    /// Requests that needed more than one data command.
    pub split_requests: u64,
    pub completions: u64,
    pub errors: u64,
}

pub struct IoQueue<H: Hal> {
    hal: H,
    qid: u16,
    namespace: Namespace,
    block_shift: u32,
    entries: u16,
    sq: u64,
    cq: u64,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
    sq_doorbell: usize,
    cq_doorbell: usize,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// One PRP list page per slot.
    prp_lists: u64,
    /// One DSM range per slot.
    dsm_ranges: u64,
    local: VecDeque<u16>,
    outstanding: usize,
    idle_polls: u32,
    dead: bool,
    stats: QueueStats,
}

fn worse(a: IoStatus, b: IoStatus) -> IoStatus {
    match (a, b) {
        (IoStatus::Error, _) | (_, IoStatus::Error) => IoStatus::Error,
        (IoStatus::Unsupported, _) | (_, IoStatus::Unsupported) => IoStatus::Unsupported,
        _ => IoStatus::Ok,
    }
}

impl<H: Hal> IoQueue<H> {
    pub(crate) fn new(
        hal: H,
        caps: &Capabilities,
        namespace: &Namespace,
        qid: u16,
        entries: u16,
        sq: u64,
        cq: u64,
    ) -> Result<Self, NvmeError> {
        let slot_count = usize::from(entries - 1);
        let prp_lists = hal
            .allocate_dma(slot_count)
            .ok_or(NvmeError::OutOfDmaMemory)?;
        let dsm_ranges = hal
            .allocate_dma(pages_for(slot_count * DSM_RANGE_LEN as usize))
            .ok_or(NvmeError::OutOfDmaMemory)?;
        Ok(IoQueue {
            hal,
            qid,
            namespace: *namespace,
            block_shift: namespace.block_size.trailing_zeros(),
            entries,
            sq,
            cq,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            sq_doorbell: doorbell(caps, qid, false),
            cq_doorbell: doorbell(caps, qid, true),
            slots: alloc::vec![EMPTY_SLOT; slot_count],
            free: (0..slot_count as u16).rev().collect(),
            prp_lists,
            dsm_ranges,
            local: VecDeque::with_capacity(slot_count),
            outstanding: 0,
            idle_polls: 0,
            dead: false,
            stats: QueueStats::default(),
        })
    }

    pub fn queue_id(&self) -> u16 {
        self.qid
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The controller reported a fatal error; every request now fails.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    fn take_slot(&mut self) -> u16 {
        let slot = self.free.pop().expect("slot count checked before taking");
        self.slots[usize::from(slot)] = EMPTY_SLOT;
        slot
    }

    fn release(&mut self, slot: u16) {
        self.slots[usize::from(slot)].state = SlotState::Free;
        self.free.push(slot);
    }

    /// Answers a request without the device.
    fn complete_locally(&mut self, tag: u32, status: IoStatus) -> Result<(), SubmitError> {
        if self.free.is_empty() {
            return Err(SubmitError::QueueFull);
        }
        let slot = self.take_slot();
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::Local;
        s.tag = tag;
        s.status = status;
        self.local.push_back(slot);
        Ok(())
    }

    fn push_to_sq(&mut self, slot: u16) {
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::InFlight;
        let address = self.sq + u64::from(self.sq_tail) * SQ_ENTRY_LEN as u64;
        self.hal.write_dma(address, &s.entry);
        self.sq_tail = (self.sq_tail + 1) % self.entries;
        self.outstanding += 1;
        self.stats.commands += 1;
    }

    fn ring_sq_doorbell(&self) {
        // Entries must be in memory before the controller hears of them.
        fence(Ordering::SeqCst);
        self.hal
            .write_register(self.sq_doorbell, u32::from(self.sq_tail));
    }

    fn block_aligned(&self, sector: u64) -> bool {
        (sector * SECTOR_SIZE).is_multiple_of(u64::from(self.namespace.block_size))
    }

    fn lba(&self, byte: u64) -> u64 {
        byte >> self.block_shift
    }

    fn capacity_sectors(&self) -> u64 {
        self.namespace.capacity_bytes() / SECTOR_SIZE
    }

    /// Takes the head slot of a request.
    fn start_request(&mut self, tag: u32, commands: u16) -> u16 {
        let head = self.take_slot();
        let s = &mut self.slots[usize::from(head)];
        s.tag = tag;
        s.head = head;
        s.remaining = commands;
        head
    }

    fn submit_data(&mut self, request: &IoRequest<'_>) -> Result<(), SubmitError> {
        let data_bytes: u64 = request.segments.iter().map(|s| u64::from(s.len)).sum();
        if data_bytes != request.nr_sectors * SECTOR_SIZE
            || !self.block_aligned(request.sector)
            || !range_fits(request.sector, request.nr_sectors, self.capacity_sectors())
        {
            return Err(SubmitError::Invalid);
        }
        let max_pages = self.namespace.max_pages_per_command;
        let block_size = self.namespace.block_size;
        let data_commands = plan_commands(request.segments, max_pages, block_size, &mut |_| {})
            .map_err(|e| {
                log::warn!("nvme: q{} refused request {}: {e:?}", self.qid, request.tag);
                SubmitError::Invalid
            })?;
        let commands = data_commands + usize::from(request.preflush);
        if commands > self.slots.len() {
            return Err(SubmitError::Invalid);
        }
        if commands > self.free.len() {
            return Err(SubmitError::QueueFull);
        }
        let head = self.start_request(request.tag, commands as u16);
        if request.preflush {
            let s = &mut self.slots[usize::from(head)];
            s.optional = true;
            s.entry = SubmissionEntry::new(io_opcode::FLUSH, head, self.namespace.nsid).bytes;
        }
        let opcode = if request.op == IoOp::Read {
            io_opcode::READ
        } else {
            io_opcode::WRITE
        };
        let mut build = DataCommandBuilder {
            head,
            opcode,
            first_byte: request.sector * SECTOR_SIZE,
            segments: request.segments,
            staged_after: request.preflush.then_some(head),
            first: true,
        };
        // Planning again cannot fail: the same input passed above.
        let _ = plan_commands(request.segments, max_pages, block_size, &mut |plan| {
            build.add(self, plan)
        });
        if request.preflush {
            self.push_to_sq(head);
        }
        if data_commands > 1 {
            self.stats.split_requests += 1;
        }
        self.ring_sq_doorbell();
        Ok(())
    }

    fn submit_flush(&mut self, tag: u32) -> Result<(), SubmitError> {
        if self.free.is_empty() {
            return Err(SubmitError::QueueFull);
        }
        let head = self.start_request(tag, 1);
        let s = &mut self.slots[usize::from(head)];
        s.optional = true;
        s.entry = SubmissionEntry::new(io_opcode::FLUSH, head, self.namespace.nsid).bytes;
        self.push_to_sq(head);
        self.ring_sq_doorbell();
        Ok(())
    }

    fn submit_discard(&mut self, request: &IoRequest<'_>, secure: bool) -> Result<(), SubmitError> {
        if !range_fits(request.sector, request.nr_sectors, self.capacity_sectors())
            || !self.block_aligned(request.sector)
            || !self.block_aligned(request.nr_sectors)
        {
            return Err(SubmitError::Invalid);
        }
        if secure || !self.namespace.discard {
            // Deallocation is not a secure erase; and without DSM there is nothing to do.
            return self.complete_locally(request.tag, IoStatus::Unsupported);
        }
        let blocks = self.lba(request.nr_sectors * SECTOR_SIZE);
        if blocks == 0 {
            return self.complete_locally(request.tag, IoStatus::Ok);
        }
        let Ok(blocks) = u32::try_from(blocks) else {
            return Err(SubmitError::Invalid);
        };
        if self.free.is_empty() {
            return Err(SubmitError::QueueFull);
        }
        let head = self.start_request(request.tag, 1);
        let range_address = self.dsm_ranges + u64::from(head) * DSM_RANGE_LEN;
        let mut range = [0u8; DSM_RANGE_LEN as usize];
        range[4..8].copy_from_slice(&blocks.to_le_bytes());
        range[8..16].copy_from_slice(&self.lba(request.sector * SECTOR_SIZE).to_le_bytes());
        self.hal.write_dma(range_address, &range);
        let s = &mut self.slots[usize::from(head)];
        s.optional = true;
        // One range (NR is 0-based), attribute "deallocate".
        s.entry = SubmissionEntry::new(io_opcode::DATASET_MANAGEMENT, head, self.namespace.nsid)
            .with_prp(range_address, 0)
            .with_cdw(10, 0)
            .with_cdw(11, 1 << 2)
            .bytes;
        self.push_to_sq(head);
        self.ring_sq_doorbell();
        Ok(())
    }

    /// Accounts one finished command; reports its request when it was the last one.
    fn finish_command(
        &mut self,
        slot: u16,
        status: CommandStatus,
        sink: &mut dyn FnMut(Completion),
    ) -> usize {
        let Some(s) = self.slots.get(usize::from(slot)).copied() else {
            log::error!("nvme: q{} completion for unknown command {slot}", self.qid);
            return 0;
        };
        if s.state != SlotState::InFlight {
            log::error!(
                "nvme: q{} completion for command {slot} in state {:?}",
                self.qid,
                s.state
            );
            return 0;
        }
        self.outstanding -= 1;
        let outcome = if status.is_success() {
            IoStatus::Ok
        } else if status.is_unsupported(s.optional) {
            IoStatus::Unsupported
        } else {
            log::warn!("nvme: q{} command {slot} failed: {status}", self.qid);
            self.stats.errors += 1;
            IoStatus::Error
        };
        let head = s.head;
        let mut finished = 1;
        if slot == head && s.next_staged != NO_SLOT {
            // A pre-flush finished: release its data commands, or fail them unstarted.
            let mut next = s.next_staged;
            while next != NO_SLOT {
                let following = self.slots[usize::from(next)].next_staged;
                if outcome == IoStatus::Ok {
                    self.push_to_sq(next);
                } else {
                    self.release(next);
                    finished += 1;
                }
                next = following;
            }
            self.slots[usize::from(head)].next_staged = NO_SLOT;
            if outcome == IoStatus::Ok {
                self.ring_sq_doorbell();
            }
        }
        let h = &mut self.slots[usize::from(head)];
        h.status = worse(h.status, outcome);
        h.remaining -= finished;
        if slot != head {
            self.release(slot);
        } else {
            self.slots[usize::from(head)].state = SlotState::Waiting;
        }
        let h = self.slots[usize::from(head)];
        if h.remaining == 0 {
            sink(Completion {
                tag: h.tag,
                status: h.status,
            });
            self.release(head);
            self.stats.completions += 1;
            return 1;
        }
        0
    }

    /// CSTS.CFS seen: fail everything outstanding and refuse new work.
    fn declare_dead(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        log::error!(
            "nvme: controller fatal status (CSTS.CFS) on q{}: failing {} outstanding commands",
            self.qid,
            self.outstanding
        );
        self.dead = true;
        let mut reported = 0;
        for index in 0..self.slots.len() {
            let s = self.slots[index];
            let is_head = s.head == index as u16;
            if is_head && matches!(s.state, SlotState::InFlight | SlotState::Waiting) {
                sink(Completion {
                    tag: s.tag,
                    status: IoStatus::Error,
                });
                reported += 1;
                self.stats.completions += 1;
            }
        }
        for index in 0..self.slots.len() {
            if matches!(
                self.slots[index].state,
                SlotState::InFlight | SlotState::Waiting | SlotState::Staged
            ) {
                self.release(index as u16);
            }
        }
        self.outstanding = 0;
        reported
    }
}

/// Turns the planned commands of one read or write into slots.
struct DataCommandBuilder<'a> {
    head: u16,
    opcode: u8,
    first_byte: u64,
    segments: &'a [DmaSegment],
    /// With a pre-flush: the slot the next command is staged after.
    staged_after: Option<u16>,
    first: bool,
}

impl DataCommandBuilder<'_> {
    fn add<H: Hal>(&mut self, queue: &mut IoQueue<H>, plan: CommandPlan) {
        let slot = if self.first && self.staged_after.is_none() {
            self.head
        } else {
            let slot = queue.take_slot();
            queue.slots[usize::from(slot)].head = self.head;
            slot
        };
        self.first = false;
        let slba = queue.lba(self.first_byte + plan.byte_offset);
        let blocks = queue.lba(plan.bytes) as u32;
        let run = &self.segments[plan.first_segment..plan.first_segment + plan.segment_count];
        let list = queue.prp_lists + u64::from(slot) * PAGE_SIZE;
        let hal = &queue.hal;
        let (prp1, prp2) = prp_fields(run, list, &mut |pages: &[DmaSegment]| {
            write_prp_list(hal, list, pages)
        });
        let entry = SubmissionEntry::new(self.opcode, slot, queue.namespace.nsid)
            .with_prp(prp1, prp2)
            .with_cdw(10, slba as u32)
            .with_cdw(11, (slba >> 32) as u32)
            .with_cdw(12, blocks - 1);
        queue.slots[usize::from(slot)].entry = entry.bytes;
        match self.staged_after {
            Some(previous) => {
                queue.slots[usize::from(slot)].state = SlotState::Staged;
                queue.slots[usize::from(previous)].next_staged = slot;
                self.staged_after = Some(slot);
            }
            None => queue.push_to_sq(slot),
        }
    }
}

fn range_fits(sector: u64, nr_sectors: u64, capacity: u64) -> bool {
    sector
        .checked_add(nr_sectors)
        .is_some_and(|end| end <= capacity)
}

fn write_prp_list<H: Hal>(hal: &H, list: u64, pages: &[DmaSegment]) {
    let mut chunk = [0u8; 512];
    for (n, group) in pages.chunks(chunk.len() / 8).enumerate() {
        for (i, segment) in group.iter().enumerate() {
            chunk[i * 8..i * 8 + 8].copy_from_slice(&segment_address(segment).to_le_bytes());
        }
        hal.write_dma(list + (n * chunk.len()) as u64, &chunk[..group.len() * 8]);
    }
}

impl<H: Hal> BlockDevice for IoQueue<H> {
    fn geometry(&self) -> Geometry {
        let block = self.namespace.block_size;
        Geometry {
            sectors: self.capacity_sectors(),
            logical_block_size: block,
            physical_block_size: block.max(PAGE_SIZE as u32),
            read_only: false,
            flush: self.namespace.volatile_write_cache,
            discard: self.namespace.discard.then_some(DiscardGeometry {
                granularity: block,
                alignment: 0,
                secure: false,
            }),
        }
    }

    fn queue_depth(&self) -> usize {
        self.slots.len()
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        _buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        if self.dead {
            return self.complete_locally(request.tag, IoStatus::Error);
        }
        self.stats.requests += 1;
        match request.op {
            IoOp::Read | IoOp::Write => self.submit_data(request),
            IoOp::Flush => self.submit_flush(request.tag),
            IoOp::Discard { secure } => self.submit_discard(request, secure),
        }
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
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
        let mut consumed = 0u32;
        loop {
            let address = self.cq + u64::from(self.cq_head) * CQ_ENTRY_LEN as u64;
            let dw3 = self.hal.read_dma_u32(address + 12);
            if (dw3 & (1 << 16) != 0) != self.phase {
                break;
            }
            // The rest of the entry is read only after its phase bit was seen.
            fence(Ordering::Acquire);
            self.cq_head += 1;
            if self.cq_head == self.entries {
                self.cq_head = 0;
                self.phase = !self.phase;
            }
            consumed += 1;
            reported += self.finish_command(dw3 as u16, CommandStatus::from_dw3(dw3), sink);
        }
        if consumed > 0 {
            self.hal
                .write_register(self.cq_doorbell, u32::from(self.cq_head));
            self.idle_polls = 0;
        } else if self.outstanding > 0 {
            self.idle_polls += 1;
            if self.idle_polls.is_multiple_of(FATAL_CHECK_INTERVAL)
                && self.hal.read_register(reg::CSTS) & reg::CSTS_FATAL != 0
            {
                reported += self.declare_dead(sink);
            }
        }
        reported
    }
}
