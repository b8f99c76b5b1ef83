// SPDX-License-Identifier: MIT OR Apache-2.0
//! One I/O submission/completion queue pair, as a `blkdev::BlockDevice`.
//!
//! Every command has an `cmdslots` slot, whose index is its command id. With at most
//! `entries - 1` slots, neither the submission nor the completion queue can overflow.

use blkdev::range_fits;
use blkdev::{
    BlockDevice, BufferAccess, Completion, DeviceFault, DiscardGeometry, DmaRegion, DmaSegment,
    FaultKind, Geometry, IoOp, IoRequest, IoStatus, SubmitError, SECTOR_SIZE,
};
use cmdslots::recovery::LinkedQueue;
use cmdslots::{Finished, QueueLink, Tracker};
use core::sync::atomic::{fence, Ordering};

use crate::command::{
    io_opcode, sgl_descriptor, CommandStatus, SubmissionEntry, CQ_ENTRY_LEN, SGL_DATA_BLOCK,
    SGL_LAST_SEGMENT, SQ_ENTRY_LEN,
};
use crate::controller::{doorbell, pages_for, reg, Capabilities, Namespace, NvmeError};
use crate::prp::{plan_commands, plan_sgl_commands, prp_fields, segment_address, CommandPlan};
use crate::{Hal, PAGE_SIZE};

/// Bytes of one Dataset Management range.
const DSM_RANGE_LEN: u64 = 16;

/// A slot's prepared command.
#[derive(Clone, Copy, Debug)]
struct Prepared {
    entry: [u8; SQ_ENTRY_LEN],
    /// FLUSH or DSM: "invalid field" means not supported, not failed.
    optional: bool,
}

impl Default for Prepared {
    fn default() -> Self {
        Prepared {
            entry: [0; SQ_ENTRY_LEN],
            optional: false,
        }
    }
}

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
    sq: DmaRegion,
    cq: DmaRegion,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
    sq_doorbell: usize,
    cq_doorbell: usize,
    slots: Tracker<Prepared>,
    /// One PRP list page per slot.
    prp_lists: DmaRegion,
    /// One DSM range per slot.
    dsm_ranges: DmaRegion,
    /// Set when the queue failed (a command timed out or the controller went fatal,
    /// and it was not recovered; or another queue stopped the controller): from then on
    /// nothing goes to the device.
    fault: Option<DeviceFault>,
    /// The controller's recovery: an overdue command is aborted, the controller reset
    /// (`Controller::recover`), and this queue serves again after it.
    link: QueueLink,
    stats: QueueStats,
}

impl<H: Hal> IoQueue<H> {
    pub(crate) fn new(
        hal: H,
        caps: &Capabilities,
        namespace: &Namespace,
        (qid, entries): (u16, u16),
        (sq, cq): (DmaRegion, DmaRegion),
        link: QueueLink,
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
            slots: Tracker::new(slot_count as u16),
            prp_lists,
            dsm_ranges,
            fault: None,
            link,
            stats: QueueStats::default(),
        })
    }

    pub fn queue_id(&self) -> u16 {
        self.qid
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The queue failed (`BlockDevice::fault` says why); every request now fails.
    pub fn is_dead(&self) -> bool {
        self.fault.is_some()
    }

    /// Answers a request without the device.
    fn complete_locally(&mut self, tag: u32, status: IoStatus) -> Result<(), SubmitError> {
        self.slots.complete_locally(tag, status)
    }

    fn push_to_sq(&mut self, slot: u16) {
        let entry = &self.slots.payload(slot).entry;
        append_to_sq(&self.hal, self.sq, &mut self.sq_tail, self.entries, entry);
        self.slots.launched(slot);
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

    fn submit_data(&mut self, request: &IoRequest<'_>) -> Result<(), SubmitError> {
        let data_bytes: u64 = request.segments.iter().map(|s| u64::from(s.len)).sum();
        if (request.op == IoOp::Write && self.namespace.read_only)
            || data_bytes != request.nr_sectors * SECTOR_SIZE
            || !self.block_aligned(request.sector)
            || !range_fits(request.sector, request.nr_sectors, self.capacity_sectors())
        {
            return Err(SubmitError::Invalid);
        }
        let max_pages = self.namespace.max_pages_per_command;
        let block_size = self.namespace.block_size;
        let refuse = |e| {
            log::warn!("nvme: q{} refused request {}: {e:?}", self.qid, request.tag);
            SubmitError::Invalid
        };
        let max_bytes = max_pages as u64 * PAGE_SIZE;
        let mut data_commands =
            plan_commands(request.segments, max_pages, block_size, &mut |_| {}).map_err(refuse)?;
        // Where the PRP rules split a request, one SGL command (per 256 segments) does.
        let sgl = data_commands > 1 && self.namespace.sgl;
        if sgl {
            data_commands = plan_sgl_commands(request.segments, max_bytes, block_size, &mut |_| {})
                .map_err(refuse)?;
        }
        let commands = data_commands + usize::from(request.preflush);
        if commands > self.slots.capacity() {
            return Err(SubmitError::Invalid);
        }
        if commands > self.slots.free_slots() {
            return Err(SubmitError::QueueFull);
        }
        let head = self.slots.begin(request.tag, commands as u16);
        if request.preflush {
            *self.slots.payload_mut(head) = Prepared {
                entry: SubmissionEntry::new(io_opcode::FLUSH, head, self.namespace.nsid).bytes,
                optional: true,
            };
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
            sgl,
        };
        // Planning again cannot fail: the same input passed above.
        let _ = if sgl {
            plan_sgl_commands(request.segments, max_bytes, block_size, &mut |plan| {
                build.add(self, plan)
            })
        } else {
            plan_commands(request.segments, max_pages, block_size, &mut |plan| {
                build.add(self, plan)
            })
        };
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
        if self.slots.free_slots() == 0 {
            return Err(SubmitError::QueueFull);
        }
        let head = self.slots.begin(tag, 1);
        *self.slots.payload_mut(head) = Prepared {
            entry: SubmissionEntry::new(io_opcode::FLUSH, head, self.namespace.nsid).bytes,
            optional: true,
        };
        self.push_to_sq(head);
        self.ring_sq_doorbell();
        Ok(())
    }

    fn submit_discard(&mut self, request: &IoRequest<'_>, secure: bool) -> Result<(), SubmitError> {
        if self.namespace.read_only
            || !range_fits(request.sector, request.nr_sectors, self.capacity_sectors())
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
        // One deallocate command per range of at most DMRSL blocks: a controller may
        // skip a longer range and still report success.
        let per_command = u64::from(self.namespace.max_discard_blocks.max(1));
        let commands = blocks.div_ceil(per_command);
        if commands > self.slots.capacity() as u64 {
            return Err(SubmitError::Invalid);
        }
        if commands > self.slots.free_slots() as u64 {
            return Err(SubmitError::QueueFull);
        }
        let head = self.slots.begin(request.tag, commands as u16);
        let mut lba = self.lba(request.sector * SECTOR_SIZE);
        let end = lba + blocks;
        for n in 0..commands {
            let slot = if n == 0 { head } else { self.slots.add(head) };
            // Fits 32 bits: at most `max_discard_blocks`.
            let count = (end - lba).min(per_command) as u32;
            let range_area = self
                .dsm_ranges
                .slice(u64::from(slot) * DSM_RANGE_LEN, DSM_RANGE_LEN);
            let mut range = [0u8; DSM_RANGE_LEN as usize];
            range[4..8].copy_from_slice(&count.to_le_bytes());
            range[8..16].copy_from_slice(&lba.to_le_bytes());
            self.hal.write_dma(range_area, 0, &range);
            // One range (NR is 0-based), attribute "deallocate".
            *self.slots.payload_mut(slot) = Prepared {
                entry: SubmissionEntry::new(
                    io_opcode::DATASET_MANAGEMENT,
                    slot,
                    self.namespace.nsid,
                )
                .with_prp(range_area.address(), 0)
                .with_cdw(10, 0)
                .with_cdw(11, 1 << 2)
                .bytes,
                optional: true,
            };
            self.push_to_sq(slot);
            lba += u64::from(count);
        }
        if commands > 1 {
            self.stats.split_requests += 1;
        }
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
        if self.slots.state(slot) != Some(cmdslots::SlotState::InFlight) {
            log::error!(
                "nvme: q{} completion for command {slot}, not in flight",
                self.qid
            );
            return 0;
        }
        self.link.finished(slot);
        let outcome = if status.is_success() {
            IoStatus::Ok
        } else if status.is_unsupported(self.slots.payload(slot).optional) {
            IoStatus::Unsupported
        } else {
            log::warn!("nvme: q{} command {slot} failed: {status}", self.qid);
            self.stats.errors += 1;
            IoStatus::Error
        };
        // A pre-flush finished: its staged data commands go to the device now.
        let mut released = false;
        let (sq, entries, hal) = (self.sq, self.entries, &self.hal);
        let sq_tail = &mut self.sq_tail;
        let commands = &mut self.stats.commands;
        let finished = self.slots.finish(slot, outcome, &mut |slots, staged| {
            append_to_sq(hal, sq, sq_tail, entries, &slots.payload(staged).entry);
            slots.launched(staged);
            *commands += 1;
            released = true;
        });
        if released {
            self.ring_sq_doorbell();
        }
        match finished {
            Finished::Request(completion) => {
                sink(completion);
                self.stats.completions += 1;
                1
            }
            Finished::Pending | Finished::Stray => 0,
        }
    }

    /// The queue fails for good: the controller is stopped from reaching memory first
    /// (bus mastering off: whatever it still holds can no longer land anywhere), then
    /// every request outstanding is answered `Error` at the next poll, and nothing goes
    /// to the device again (later requests are answered without it). Its slots are
    /// reused for those local answers only.
    fn fail(&mut self, kind: FaultKind) {
        let (fault, failed) = self.slots.fail_queue(kind, || self.hal.stop_dma());
        self.fault = Some(fault);
        self.stats.completions += failed as u64;
        log::error!(
            "nvme: q{} failed: {fault}; {failed} outstanding requests fail",
            self.qid
        );
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
    /// Describe data with an SGL (in the slot's list page) instead of PRPs.
    sgl: bool,
}

impl DataCommandBuilder<'_> {
    fn add<H: Hal>(&mut self, queue: &mut IoQueue<H>, plan: CommandPlan) {
        let slot = if self.first && self.staged_after.is_none() {
            self.head
        } else {
            queue.slots.add(self.head)
        };
        self.first = false;
        let slba = queue.lba(self.first_byte + plan.byte_offset);
        let blocks = queue.lba(plan.bytes) as u32;
        let run = &self.segments[plan.first_segment..plan.first_segment + plan.segment_count];
        let list = queue
            .prp_lists
            .slice(u64::from(slot) * PAGE_SIZE, PAGE_SIZE);
        let hal = &queue.hal;
        let entry = SubmissionEntry::new(self.opcode, slot, queue.namespace.nsid);
        let entry = if self.sgl {
            entry.with_sgl(write_sgl(hal, list, run))
        } else {
            let (prp1, prp2) = prp_fields(run, list.address(), &mut |pages: &[DmaSegment]| {
                write_prp_list(hal, list, pages)
            });
            entry.with_prp(prp1, prp2)
        };
        let entry = entry
            .with_cdw(10, slba as u32)
            .with_cdw(11, (slba >> 32) as u32)
            .with_cdw(12, blocks - 1);
        queue.slots.payload_mut(slot).entry = entry.bytes;
        match self.staged_after {
            Some(previous) => {
                queue.slots.stage_after(previous, slot);
                self.staged_after = Some(slot);
            }
            None => queue.push_to_sq(slot),
        }
    }
}

/// Writes `entry` at the submission queue tail and advances the tail (the doorbell is
/// rung separately, once per batch).
fn append_to_sq<H: Hal>(hal: &H, sq: DmaRegion, tail: &mut u16, entries: u16, entry: &[u8]) {
    hal.write_dma(sq, u64::from(*tail) * SQ_ENTRY_LEN as u64, entry);
    *tail = (*tail + 1) % entries;
}

/// The SGL 1 descriptor for `segments`: one data block, or the last (only) segment of
/// data block descriptors written to the `list` page.
fn write_sgl<H: Hal>(hal: &H, list: DmaRegion, segments: &[DmaSegment]) -> [u8; 16] {
    if let [only] = segments {
        return sgl_descriptor(segment_address(only), only.len, SGL_DATA_BLOCK);
    }
    let mut chunk = [0u8; 512];
    for (n, group) in segments.chunks(chunk.len() / 16).enumerate() {
        for (i, segment) in group.iter().enumerate() {
            let descriptor = sgl_descriptor(segment_address(segment), segment.len, SGL_DATA_BLOCK);
            chunk[i * 16..i * 16 + 16].copy_from_slice(&descriptor);
        }
        hal.write_dma(list, (n * chunk.len()) as u64, &chunk[..group.len() * 16]);
    }
    sgl_descriptor(list.address(), segments.len() as u32 * 16, SGL_LAST_SEGMENT)
}

fn write_prp_list<H: Hal>(hal: &H, list: DmaRegion, pages: &[DmaSegment]) {
    let mut chunk = [0u8; 512];
    for (n, group) in pages.chunks(chunk.len() / 8).enumerate() {
        for (i, segment) in group.iter().enumerate() {
            chunk[i * 8..i * 8 + 8].copy_from_slice(&segment_address(segment).to_le_bytes());
        }
        hal.write_dma(list, (n * chunk.len()) as u64, &chunk[..group.len() * 8]);
    }
}

impl<H: Hal> BlockDevice for IoQueue<H> {
    fn geometry(&self) -> Geometry {
        let block = self.namespace.block_size;
        Geometry {
            sectors: self.capacity_sectors(),
            logical_block_size: block,
            physical_block_size: block.max(PAGE_SIZE as u32),
            read_only: self.namespace.read_only,
            flush: self.namespace.volatile_write_cache,
            discard: self.namespace.discard.then_some(DiscardGeometry {
                granularity: block,
                alignment: 0,
                secure: false,
            }),
        }
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
            return self.complete_locally(request.tag, IoStatus::Error);
        }
        if !self.enter() {
            return match self.fault {
                Some(_) => self.complete_locally(request.tag, IoStatus::Error),
                // Being reset: the request waits (the engine keeps it, and the requests
                // behind it stay in the guest's ring).
                None => Err(SubmitError::QueueFull),
            };
        }
        self.stats.requests += 1;
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
            // Stopped: whatever lies in the completion queue names slots long answered.
            // Being reset: the completion queue is the controller's to make again.
            return reported;
        }
        let mut consumed = 0u32;
        loop {
            let entry = u64::from(self.cq_head) * CQ_ENTRY_LEN as u64;
            let dw3 = self.hal.read_dma_u32(self.cq, entry + 12);
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
        }
        self.link.leave();
        reported
    }

    /// Also reads the controller status when commands have waited a while with none
    /// finishing (`health_check_due`): a controller in fatal status answers nothing
    /// more, and its requests fail now rather than at their deadline. With recovery, an
    /// overdue command is to be aborted and a fatal controller reset
    /// (`Controller::recover`) instead.
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
        } else if self.fault.is_none()
            && self.slots.health_check_due(now_ns)
            && self.hal.read_register(reg::CSTS) & reg::CSTS_FATAL != 0
        {
            log::error!("nvme: controller fatal status (CSTS.CFS) on q{}", self.qid);
            self.fail(FaultKind::Fatal);
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

impl<H: Hal> IoQueue<H> {
    /// A tick with recovery: an overdue command is to be aborted, a controller in fatal
    /// status reset (asked of the control path, which runs `Controller::recover`).
    fn ask_recovery(&mut self, now_ns: u64, timeout_ns: u64) {
        if let Some(overdue) = self.slots.tick(now_ns, timeout_ns) {
            let waited_ms = overdue.waited_ns / 1_000_000;
            if self.link.ask_abort(self.qid, overdue.slot, waited_ms) {
                log::error!(
                    "nvme: q{} command {} got no completion in {waited_ms} ms: abort asked",
                    self.qid,
                    overdue.slot
                );
            }
        } else if self.slots.health_check_due(now_ns)
            && self.hal.read_register(reg::CSTS) & reg::CSTS_FATAL != 0
            && self.link.ask_reset(FaultKind::Fatal)
        {
            log::error!(
                "nvme: controller fatal status (CSTS.CFS) on q{}: reset asked",
                self.qid
            );
        }
    }
}

impl<H: Hal> LinkedQueue for IoQueue<H> {
    fn link(&mut self) -> &mut QueueLink {
        &mut self.link
    }

    /// The controller was reset since the queue last looked: the commands it held were
    /// lost with it (the controller dropped them, and reaches no memory for them any
    /// more). They fail, answered `Error` at the next poll; the queue pair, made again
    /// empty by the reset, starts afresh.
    fn resync(&mut self) {
        let failed = self.slots.fail_all();
        self.stats.completions += failed as u64;
        self.sq_tail = 0;
        self.cq_head = 0;
        self.phase = true;
        self.link.synced();
        log::warn!(
            "nvme: q{} serves again after the controller reset; {failed} requests it held fail",
            self.qid
        );
    }

    fn fail(&mut self, kind: FaultKind) {
        IoQueue::fail(self, kind)
    }
}
