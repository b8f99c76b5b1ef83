// SPDX-License-Identifier: MIT OR Apache-2.0
//! Taking requests off the ring: copy each slot out once, parse and check it, give it a
//! slot (copying indirect descriptors out of their granted pages), and stage its grants;
//! a request that fails a check is answered at once. A request is taken only while the
//! ring's grants in flight leave room for the largest request: otherwise it waits in the
//! ring, untouched, until requests of this ring finish (or the budget's pool gives the
//! ring more credit).

use blkdev::BlockDevice;

use super::slots::{Slot, Work};
use super::{worth_logging, Engine, EngineState, EventChannel, Held};
use crate::abi::{self, wire, REQUEST_SIZE};
use crate::grant::{GrantOps, MappedGrant};
use crate::limits::Class;
use crate::parse::{
    check_data_access, check_discard, parse_request, DataOp, DirectRequest, DiscardRequest,
    IndirectRequest, Rejected, Request, RequestError, SegmentDesc,
};
use crate::ring::{Response, RingMemory};
use xen::abi::grant_table::GNTST_GENERAL_ERROR;
use zerocopy::IntoBytes;

/// Data segments (pages of up to 4 KiB) one poll takes in, at most: once the requests
/// taken carry this many, the rest wait for the next poll. A poll answers what it took
/// before it looks at the ring again, and a device that copies in `submit` (the RAM
/// disk) copies everything a poll took before the first of those answers is published:
/// the frontend waits for the whole poll's copies, then blkdom waits for it to send
/// more, where Linux blkback answers each request as its copy ends. 64 pages (256 KiB)
/// keeps that wait short, so the frontend refills the ring while the next poll copies
/// (at 256, sixteen 64 KiB requests went in one poll and blkdom served fewer of them
/// than Linux blkback). A larger request (1 MiB is blkfront's usual
/// `max_indirect_segments=256`) still goes, alone in its poll; 4 KiB requests go 64 a
/// poll.
pub const SEGMENTS_PER_POLL: usize = 64;

impl<M: RingMemory, G: GrantOps, D: BlockDevice, E: EventChannel> Engine<M, G, D, E> {
    #[cfg_attr(feature = "profile-passes", inline(never))]
    pub(super) fn consume(&mut self, budget: usize) -> usize {
        let req_prod = self.ring.req_prod();
        if self.ring.prod_overflows(req_prod) {
            self.stats.ring_overflows += 1;
            log::error!(
                "blkback: frontend produced bogus requests (req_prod {} rsp_prod {} ring {}): halting ring",
                req_prod,
                self.ring.rsp_prod_pvt(),
                self.ring.slots()
            );
            self.state = EngineState::Halted;
            return 0;
        }
        if self.moderator.enabled() && self.ring.req_cons() != req_prod {
            let outstanding = self.ring.frontend_outstanding(req_prod);
            self.moderator.sample_outstanding(outstanding, req_prod);
        }
        let (mut consumed, mut segments) = (0, 0);
        let mut raw = [0u8; REQUEST_SIZE];
        // No RING_REQUEST_CONS_OVERFLOW check (Linux has one): it cannot fire after the
        // check above. That keeps `req_prod` within a ring of the responses, the loop
        // stops at this same `req_prod`, and a response moves both ends alike: the
        // requests outstanding never pass a ring.
        while consumed < budget
            && segments < SEGMENTS_PER_POLL
            && (self.throttle.held.is_some() || self.ring.req_cons() != req_prod)
            && self.submission.deferred.is_empty()
            && self.mapper.may_take_request()
        {
            // A request held back by the ring's limits goes first: it is our copy, taken
            // off the ring once; the rest wait in the ring behind it.
            let held = self.throttle.held.take();
            match &held {
                Some(held) => raw = held.raw,
                None => self.ring.take_request_into(&mut raw),
            }
            let parsed = parse_request(&raw, self.max_indirect_segments);
            if let Ok(request) = &parsed {
                if !self.admit(&raw, request, held) {
                    break;
                }
            }
            consumed += 1;
            match parsed {
                Err(rejected) => self.refuse(rejected),
                Ok(request) if self.device_fault.is_some() => self.fail_without_device(&request),
                Ok(Request::Direct(request)) => {
                    segments += usize::from(request.nr_segments);
                    self.start_direct(&request)
                }
                Ok(Request::Indirect(request)) => {
                    segments += usize::from(request.nr_segments);
                    self.start_indirect(&request)
                }
                Ok(Request::Discard(request)) => self.start_discard(&request),
            }
        }
        self.flush_staged();
        let waiting = !self.mapper.may_take_request()
            && (self.ring.req_cons() != req_prod || self.throttle.held.is_some());
        if waiting != self.map_waiting {
            self.map_waiting = waiting;
            self.stats.grant_waits += u64::from(waiting);
        }
        consumed
    }

    /// Whether the ring's limits let `request` go now. If so it is charged one operation
    /// (its bytes once checked: `count_request`) and, if it had been held, the wait is
    /// counted; if not, `raw` (its copy) is held until the buckets are due.
    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    fn admit(&mut self, raw: &[u8; REQUEST_SIZE], request: &Request, held: Option<Held>) -> bool {
        if !self.throttle.limiter.active() {
            if let Some(held) = held {
                // Limits lifted while it waited.
                self.stats.throttle_ns += self.now.saturating_sub(held.since);
            }
            return true;
        }
        let class = class_of(request);
        if !self.throttle.limiter.admits(class, self.now) {
            let since = held.map_or(self.now, |held| held.since);
            if held.is_none() {
                self.stats.throttle_waits += 1;
            }
            self.throttle.held = Some(Held {
                raw: *raw,
                since,
                class,
            });
            return false;
        }
        if let Some(held) = held {
            self.stats.throttle_ns += self.now.saturating_sub(held.since);
        }
        self.throttle.limiter.charge_op(class, self.now);
        true
    }

    /// Answer a request that never got a slot.
    fn refuse(&mut self, rejected: Rejected) {
        self.stats.bad_requests += 1;
        self.stats.errors += 1;
        if worth_logging(self.stats.bad_requests) {
            log::warn!(
                "blkback: refusing request id {:#x} op {}: {:?}",
                rejected.id,
                rejected.operation,
                rejected.error
            );
        }
        self.ring.put_response(rejected.response());
    }

    /// The device failed: a well-formed request is answered with an error at once,
    /// nothing mapped for it.
    fn fail_without_device(&mut self, request: &Request) {
        let (id, operation) = match request {
            Request::Direct(r) => (r.id, r.op.code()),
            Request::Indirect(r) => (r.id, r.op.code()),
            Request::Discard(r) => (r.id, abi::OP_DISCARD),
        };
        self.stats.device_errors += 1;
        self.stats.errors += 1;
        self.ring.put_response(Response {
            id,
            operation,
            status: abi::RSP_ERROR,
        });
    }

    /// Refuse a request that already holds a slot but no grants.
    fn refuse_slot(&mut self, slot: u16, error: RequestError) {
        // Its indirect pages may have met the cache's cap: not a request served.
        self.mapper.take_capped();
        let Slot {
            id, response_op, ..
        } = self.slots[slot];
        self.slots.free(slot);
        self.refuse(Rejected {
            id,
            operation: response_op,
            error,
        });
    }

    fn count_request(&mut self, work: Work, nr_sectors: u64) {
        if self.throttle.limiter.active() {
            let class = match work {
                Work::Data(DataOp::Read) => Class::Read,
                _ => Class::Write,
            };
            // A discard comes with 0 sectors: it moves no data, an operation, no bytes.
            let bytes = nr_sectors * blkdev::SECTOR_SIZE;
            self.throttle.limiter.charge_bytes(class, bytes, self.now);
        }
        match work {
            Work::Data(DataOp::Read) => {
                self.stats.reads += 1;
                self.stats.sectors_read += nr_sectors;
            }
            Work::Data(DataOp::Write) => {
                self.stats.writes += 1;
                self.stats.sectors_written += nr_sectors;
            }
            Work::Data(DataOp::Flush | DataOp::Barrier) => {
                self.stats.flushes += 1;
                self.stats.sectors_written += nr_sectors;
            }
            Work::Discard { .. } => self.stats.discards += 1,
        }
    }

    /// A slot for a data request, or the request is refused (cannot happen while the
    /// ring's consumer check holds, but a refusal beats a panic).
    fn claim_data_slot(&mut self, id: u64, op: DataOp, sector: u64) -> Option<u16> {
        let slot = self.slots.alloc(id, op.code(), Work::Data(op), sector);
        if slot.is_none() {
            self.refuse(Rejected {
                id,
                operation: op.code(),
                error: RequestError::DeviceRefused,
            });
        }
        slot
    }

    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    fn start_direct(&mut self, request: &DirectRequest) {
        let Some(slot) = self.claim_data_slot(request.id, request.op, request.sector) else {
            return;
        };
        let count = usize::from(request.nr_segments);
        for (desc, segment) in self
            .slots
            .descs_mut(slot, count)
            .iter_mut()
            .zip(request.segments())
        {
            *desc = segment;
        }
        self.stage_checked(slot, count);
    }

    fn start_indirect(&mut self, request: &IndirectRequest) {
        self.stats.indirect += 1;
        let Some(slot) = self.claim_data_slot(request.id, request.op, request.sector) else {
            return;
        };
        self.slots.use_indirect_area(slot);
        let count = usize::from(request.nr_segments);
        match self.copy_indirect_segments(slot, request) {
            Ok(()) => self.stage_checked(slot, count),
            Err(error) => self.refuse_slot(slot, error),
        }
    }

    /// Get the indirect pages mapped (from the persistent cache, or one map batch), copy
    /// each page's descriptors out once, check them, and let go of the pages.
    fn copy_indirect_segments(
        &mut self,
        slot: u16,
        request: &IndirectRequest,
    ) -> Result<(), RequestError> {
        let pages = request.nr_indirect_pages();
        let total = usize::from(request.nr_segments);
        // The batch below must not mix with a staged round.
        self.flush_staged();
        self.mapper
            .reserve_unmaps(pages, &mut self.grants, &mut self.stats);
        for (page, &gref) in request.indirect_grefs[..pages].iter().enumerate() {
            // Like data pages: blkfront reuses its persistently granted pages for
            // descriptors too. Transient ones are only read.
            let index = self.mapper.indirect_page(page);
            let _ = self.mapper.acquire(index, gref, false);
        }
        if self.mapper.has_maps() {
            self.mapper.map_batch(&mut self.grants, &mut self.stats);
        }
        let mut outcome = Ok(());
        for page in 0..pages {
            let index = self.mapper.indirect_page(page);
            match self.mapper.resolve_one(index) {
                Ok(grant) if outcome.is_ok() => {
                    let first = page * abi::SEGMENTS_PER_INDIRECT_PAGE;
                    let descs = &mut self.slots.descs_mut(slot, total)[first..];
                    outcome = copy_descriptors(&self.grants, grant, &mut self.indirect_page, descs);
                }
                Ok(_) => {}
                Err(status) => outcome = Err(RequestError::GrantFailed(status)),
            }
            // The copy is all we need: unpin or unmap the page right away.
            self.mapper.release(index..index + 1);
        }
        outcome
    }

    /// Check a data request's segments against the device, then queue its grants for
    /// mapping.
    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    fn stage_checked(&mut self, slot: u16, count: usize) {
        let Slot { work, sector, .. } = self.slots[slot];
        let Work::Data(op) = work else {
            unreachable!("data request")
        };
        match check_data_access(op, sector, self.slots.descs(slot, count), &self.geometry) {
            Ok(nr_sectors) => {
                let entry = &mut self.slots[slot];
                entry.nr_sectors = nr_sectors;
                entry.nr_segments = count as u16;
                self.count_request(work, nr_sectors);
                self.stage(slot);
            }
            Err(error) => self.refuse_slot(slot, error),
        }
    }

    fn start_discard(&mut self, request: &DiscardRequest) {
        let work = Work::Discard {
            secure: request.secure,
        };
        self.count_request(work, 0);
        let rejected = |error| Rejected {
            id: request.id,
            operation: abi::OP_DISCARD,
            error,
        };
        if let Err(error) = check_discard(request, &self.geometry) {
            return self.refuse(rejected(error));
        }
        let Some(slot) = self
            .slots
            .alloc(request.id, abi::OP_DISCARD, work, request.sector)
        else {
            return self.refuse(rejected(RequestError::DeviceRefused));
        };
        self.slots[slot].nr_sectors = request.nr_sectors;
        self.submit_or_defer(slot);
    }
}

/// Copy up to one page of descriptors out of a mapped indirect page (one read into
/// `page`) into `descs`, checking each.
fn copy_descriptors<G: GrantOps>(
    grants: &G,
    grant: MappedGrant,
    page: &mut [wire::Segment],
    descs: &mut [SegmentDesc],
) -> Result<(), RequestError> {
    let count = descs.len().min(abi::SEGMENTS_PER_INDIRECT_PAGE);
    let segments = &mut page[..count];
    if !grants.read_buffer(grant.buffer, 0, segments.as_mut_bytes()) {
        return Err(RequestError::GrantFailed(GNTST_GENERAL_ERROR));
    }
    for (desc, segment) in descs.iter_mut().zip(segments.iter()) {
        let parsed = SegmentDesc::from_wire(segment);
        parsed.check()?;
        *desc = parsed;
    }
    Ok(())
}

/// What a request is charged to: reads to the read buckets, everything else (writes,
/// flushes, discards) to the write buckets.
fn class_of(request: &Request) -> Class {
    match request {
        Request::Direct(DirectRequest {
            op: DataOp::Read, ..
        })
        | Request::Indirect(IndirectRequest {
            op: DataOp::Read, ..
        }) => Class::Read,
        _ => Class::Write,
    }
}
