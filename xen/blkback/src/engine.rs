//! The per-queue engine: one ring of one frontend, driven by the poller of its vCPU.
//!
//! `poll(budget)` consumes at most `budget` requests (each copied out of the ring once,
//! parsed, checked, its grants mapped in one batch per round), collects what the device
//! finished, unmaps what must be unmapped, and only then publishes responses and
//! notifies when the ring macros say so. Everything is allocated in `new`.

use alloc::vec::Vec;
use blkdev::{
    BlockDevice, Completion, DmaSegment, Geometry, IoOp, IoRequest, IoStatus, SubmitError,
};

use crate::abi::{self, MAX_SEGMENTS_PER_REQUEST, SEGMENT_SIZE};
use crate::grant::{CacheSlot, GrantCache, GrantOps, GrantStatus, MapRequest, MappedGrant};
use crate::parse::{
    check_data_access, check_discard, parse_request, DataOp, DirectRequest, DiscardRequest,
    IndirectRequest, Rejected, Request, RequestError, SegmentDesc,
};
use crate::ring::{BackRing, Response, RingError, RingMemory};
use crate::stats::RingStats;

/// Sends an event to the frontend (`EVTCHNOP_send`).
pub trait EventChannel {
    fn notify(&mut self);
}

/// Parameters fixed at connect time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub ring_order: u32,
    /// The frontend agreed to `feature-persistent`.
    pub persistent_grants: bool,
    /// What we advertised as `feature-max-indirect-segments`.
    pub max_indirect_segments: u16,
    /// Cap on cached grants; `None` means ring slots × segments per request, the most
    /// in-flight requests can reference.
    pub persistent_grant_limit: Option<usize>,
    /// Refuse writes even if the device takes them (toolstack `mode` "r").
    pub read_only: bool,
}

impl EngineConfig {
    pub fn new(ring_order: u32, persistent_grants: bool) -> Self {
        Self {
            ring_order,
            persistent_grants,
            max_indirect_segments: abi::MAX_INDIRECT_SEGMENTS,
            persistent_grant_limit: None,
            read_only: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineState {
    Running,
    /// The frontend broke the ring protocol; only in-flight requests are finished.
    Halted,
    /// Teardown started: no new requests are taken.
    Draining,
    /// Nothing in flight, every grant unmapped.
    Disconnected,
}

/// What one `poll` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollOutcome {
    pub consumed: usize,
    pub completed: usize,
    pub notified: bool,
}

impl PollOutcome {
    pub fn did_work(&self) -> bool {
        self.consumed > 0 || self.completed > 0
    }
}

/// Teardown cannot finish yet: the device still owns requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy {
    pub in_flight: usize,
}

const NO_ENTRY: u32 = u32::MAX;
/// Status of a transient segment whose map has not been issued yet.
const MAP_PENDING: GrantStatus = i16::MIN;

/// How one segment's page is mapped.
#[derive(Clone, Copy, Debug, Default)]
struct SegmentMap {
    grant: MappedGrant,
    /// Index in the persistent cache, or `NO_ENTRY` for a transient mapping.
    cache_entry: u32,
    /// 0 once `grant` is known; else `MAP_PENDING` or (transient) the map failure.
    status: GrantStatus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Data(DataOp),
    Discard { secure: bool },
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    id: u64,
    response_op: u8,
    work: Work,
    sector: u64,
    nr_sectors: u64,
    nr_segments: u16,
    /// Where this request's segments start in `descs`/`maps`.
    seg_base: u32,
    /// Owned by the device.
    submitted: bool,
}

#[derive(Clone, Copy, Debug)]
enum MapTarget {
    Cache(u32),
    Segment(u32),
}

/// A FIFO of slot numbers with fixed capacity.
#[derive(Debug)]
struct SlotFifo {
    items: Vec<u16>,
    head: usize,
    len: usize,
}

impl SlotFifo {
    fn new(capacity: usize) -> Self {
        Self {
            items: alloc::vec![0; capacity],
            head: 0,
            len: 0,
        }
    }
    fn push(&mut self, slot: u16) {
        debug_assert!(self.len < self.items.len());
        let mut tail = self.head + self.len;
        if tail >= self.items.len() {
            tail -= self.items.len();
        }
        self.items[tail] = slot;
        self.len += 1;
    }
    fn front(&self) -> Option<u16> {
        (self.len > 0).then(|| self.items[self.head])
    }
    fn pop(&mut self) -> Option<u16> {
        let front = self.front()?;
        self.head += 1;
        if self.head == self.items.len() {
            self.head = 0;
        }
        self.len -= 1;
        Some(front)
    }
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Segment entries per ring: a dense area of 11 per slot for direct requests, then
/// `max_segments` per slot for indirect ones.
fn segment_area(slots: usize, max_segments: usize) -> usize {
    slots * (MAX_SEGMENTS_PER_REQUEST + max_segments)
}

/// Log the first few occurrences of a frontend fault, then only at powers of two, so a
/// hostile frontend cannot flood the console.
fn worth_logging(count: u64) -> bool {
    count <= 16 || count.is_power_of_two()
}

fn status_code(status: IoStatus) -> i16 {
    match status {
        IoStatus::Ok => abi::RSP_OKAY,
        IoStatus::Error => abi::RSP_ERROR,
        IoStatus::Unsupported => abi::RSP_EOPNOTSUPP,
    }
}

/// One ring served by one poller.
pub struct Engine<M, G, D, E> {
    ring: BackRing<M>,
    grants: G,
    device: D,
    events: E,
    geometry: Geometry,
    persistent: bool,
    max_indirect_segments: u16,
    /// Segments one request may carry (11, or the advertised indirect count).
    max_segments: usize,
    state: EngineState,
    slots: Vec<Slot>,
    free_slots: Vec<u16>,
    descs: Vec<SegmentDesc>,
    maps: Vec<SegmentMap>,
    cache: GrantCache,
    map_requests: Vec<MapRequest>,
    map_targets: Vec<MapTarget>,
    map_results: Vec<Result<MappedGrant, GrantStatus>>,
    staged: Vec<u16>,
    unmaps: Vec<MappedGrant>,
    unmap_results: Vec<Result<(), GrantStatus>>,
    deferred: SlotFifo,
    completions: Vec<Completion>,
    dma: Vec<DmaSegment>,
    indirect_page: Vec<u8>,
    in_flight: usize,
    transient_mapped: usize,
    /// An event arrived since the last poll.
    event_pending: bool,
    stats: RingStats,
}

impl<M: RingMemory, G: GrantOps, D: BlockDevice, E: EventChannel> Engine<M, G, D, E> {
    /// Attach to a mapped ring. All per-ring memory is allocated here.
    pub fn new(
        memory: M,
        grants: G,
        device: D,
        events: E,
        config: EngineConfig,
    ) -> Result<Self, RingError> {
        let ring = BackRing::new(memory, config.ring_order)?;
        let slots = ring.slots() as usize;
        let max_indirect_segments = config
            .max_indirect_segments
            .min((abi::SEGMENTS_PER_INDIRECT_PAGE * abi::MAX_INDIRECT_PAGES) as u16);
        let max_segments = MAX_SEGMENTS_PER_REQUEST.max(usize::from(max_indirect_segments));
        let cache_capacity = if config.persistent_grants {
            config
                .persistent_grant_limit
                .unwrap_or(slots * max_segments)
        } else {
            0
        };
        // A batch always has room for one whole request.
        let batch = max_segments.max(256);
        let idle_slot = Slot {
            id: 0,
            response_op: 0,
            work: Work::Data(DataOp::Read),
            sector: 0,
            nr_sectors: 0,
            nr_segments: 0,
            seg_base: 0,
            submitted: false,
        };
        let mut geometry = device.geometry();
        geometry.read_only |= config.read_only;
        Ok(Self {
            ring,
            grants,
            geometry,
            device,
            events,
            persistent: config.persistent_grants,
            max_indirect_segments,
            max_segments,
            state: EngineState::Running,
            slots: alloc::vec![idle_slot; slots],
            free_slots: (0..slots as u16).rev().collect(),
            descs: alloc::vec![SegmentDesc::default(); segment_area(slots, max_segments)],
            maps: alloc::vec![SegmentMap::default(); segment_area(slots, max_segments)],
            cache: GrantCache::new(cache_capacity),
            map_requests: Vec::with_capacity(batch),
            map_targets: Vec::with_capacity(batch),
            map_results: Vec::with_capacity(batch),
            staged: Vec::with_capacity(slots),
            unmaps: Vec::with_capacity(batch),
            unmap_results: Vec::with_capacity(batch),
            deferred: SlotFifo::new(slots),
            completions: Vec::with_capacity(slots),
            dma: Vec::with_capacity(max_segments),
            indirect_page: alloc::vec![0; abi::PAGE_SIZE],
            in_flight: 0,
            transient_mapped: 0,
            event_pending: false,
            stats: RingStats::default(),
        })
    }

    pub fn state(&self) -> EngineState {
        self.state
    }

    pub fn stats(&self) -> RingStats {
        RingStats {
            grants_mapped: (self.cache.mapped() + self.transient_mapped) as u64,
            ..self.stats
        }
    }

    /// Requests handed to the device and not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Grants held in the persistent cache right now.
    pub fn cached_grants(&self) -> usize {
        self.cache.len()
    }

    /// The most grants the cache may hold.
    pub fn cache_capacity(&self) -> usize {
        if self.persistent {
            self.cache.capacity()
        } else {
            0
        }
    }

    pub fn ring(&self) -> &BackRing<M> {
        &self.ring
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn grants(&self) -> &G {
        &self.grants
    }

    /// One pass: take up to `budget` requests, finish completed ones, publish responses.
    pub fn poll(&mut self, budget: usize) -> PollOutcome {
        self.stats.polls += 1;
        let mut consumed = 0;
        if matches!(self.state, EngineState::Running | EngineState::Halted) {
            // Requests accepted before a halt still go to the device.
            self.retry_deferred();
        }
        if self.state == EngineState::Running && self.deferred.is_empty() {
            consumed = self.consume(budget);
        }
        let completed = self.reap_completions();
        let notified = self.publish_responses();
        if consumed == 0 && completed == 0 {
            self.stats.empty_polls += 1;
            if self.event_pending {
                self.stats.spurious_events += 1;
            }
        }
        self.event_pending = false;
        PollOutcome {
            consumed,
            completed,
            notified,
        }
    }

    /// The ring's event channel fired (call before the next `poll`): a poll that then
    /// finds nothing counts the event as spurious.
    pub fn event_received(&mut self) {
        self.stats.events += 1;
        self.event_pending = true;
    }

    /// Before blocking: re-arm `req_event` and look once more
    /// (`RING_FINAL_CHECK_FOR_REQUESTS`). True means nothing is pending and the poller
    /// may sleep until the event channel (or the device) wakes it.
    pub fn prepare_to_sleep(&mut self) -> bool {
        if self.state != EngineState::Running {
            return true;
        }
        self.deferred.is_empty() && !self.ring.final_check_for_requests()
    }

    /// Stop taking requests, fail the ones the device never accepted, finish the rest
    /// and unmap every grant. Returns `Busy` while the device still owns requests: call
    /// again later (poll the device meanwhile through this call). Idempotent.
    pub fn disconnect(&mut self) -> Result<(), Busy> {
        if self.state == EngineState::Disconnected {
            return Ok(());
        }
        self.state = EngineState::Draining;
        self.flush_staged();
        while let Some(slot) = self.deferred.pop() {
            self.fail(slot, RequestError::DeviceRefused);
        }
        self.reap_completions();
        self.publish_responses();
        if self.in_flight > 0 {
            return Err(Busy {
                in_flight: self.in_flight,
            });
        }
        while !self.cache.is_empty() {
            let room = self.unmaps.capacity() - self.unmaps.len();
            let unmaps = &mut self.unmaps;
            self.cache
                .drain_oldest(room, &mut |grant| unmaps.push(grant));
            self.flush_unmaps();
        }
        self.flush_unmaps();
        self.state = EngineState::Disconnected;
        Ok(())
    }

    /// Give back the ring memory, grant, device and event handles (after `disconnect`).
    pub fn into_parts(self) -> (M, G, D, E) {
        (
            self.ring.into_memory(),
            self.grants,
            self.device,
            self.events,
        )
    }

    fn consume(&mut self, budget: usize) -> usize {
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
        let mut consumed = 0;
        while consumed < budget
            && self.ring.req_cons() != req_prod
            && !self.ring.cons_overflows()
            && self.deferred.is_empty()
        {
            let raw = self.ring.take_request();
            consumed += 1;
            match parse_request(&raw, self.max_indirect_segments) {
                Err(rejected) => self.refuse(rejected),
                Ok(Request::Direct(request)) => self.start_direct(&request),
                Ok(Request::Indirect(request)) => self.start_indirect(&request),
                Ok(Request::Discard(request)) => self.start_discard(&request),
            }
        }
        self.flush_staged();
        consumed
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

    fn alloc_slot(&mut self, id: u64, response_op: u8, work: Work, sector: u64) -> Option<u16> {
        let slot = self.free_slots.pop()?;
        self.slots[usize::from(slot)] = Slot {
            id,
            response_op,
            work,
            sector,
            nr_sectors: 0,
            nr_segments: 0,
            seg_base: u32::from(slot) * MAX_SEGMENTS_PER_REQUEST as u32,
            submitted: false,
        };
        Some(slot)
    }

    fn count_request(&mut self, work: Work, nr_sectors: u64) {
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
        let slot = self.alloc_slot(id, op.code(), Work::Data(op), sector);
        if slot.is_none() {
            self.refuse(Rejected {
                id,
                operation: op.code(),
                error: RequestError::DeviceRefused,
            });
        }
        slot
    }

    fn start_direct(&mut self, request: &DirectRequest) {
        let Some(slot) = self.claim_data_slot(request.id, request.op, request.sector) else {
            return;
        };
        let count = usize::from(request.nr_segments);
        let base = self.slots[usize::from(slot)].seg_base as usize;
        for (desc, segment) in self.descs[base..base + count]
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
        // Indirect requests use the large per-slot area; direct ones stay in the dense
        // area at the front, so small requests touch little memory.
        let dense = self.slots.len() * MAX_SEGMENTS_PER_REQUEST;
        self.slots[usize::from(slot)].seg_base =
            (dense + usize::from(slot) * self.max_segments) as u32;
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
        if self.unmaps.len() + pages > self.unmaps.capacity() {
            self.flush_unmaps();
        }
        let mut cache_entries = [NO_ENTRY; abi::MAX_INDIRECT_PAGES];
        for (page, &gref) in request.indirect_grefs[..pages].iter().enumerate() {
            if self.persistent {
                // Like data pages: blkfront reuses its persistently granted pages for
                // descriptors too.
                let unmaps = &mut self.unmaps;
                match self.cache.acquire(gref, &mut |grant| unmaps.push(grant)) {
                    CacheSlot::Hit(entry) => {
                        cache_entries[page] = entry;
                        continue;
                    }
                    CacheSlot::Inserted(entry) => {
                        cache_entries[page] = entry;
                        self.map_requests.push(MapRequest {
                            gref,
                            writable: true,
                        });
                        self.map_targets.push(MapTarget::Cache(entry));
                        continue;
                    }
                    CacheSlot::Full => {}
                }
            }
            self.map_requests.push(MapRequest {
                gref,
                writable: false,
            });
            self.map_targets.push(MapTarget::Segment(page as u32));
        }
        let mut transient = [Err(MAP_PENDING); abi::MAX_INDIRECT_PAGES];
        if !self.map_requests.is_empty() {
            // Evictions first, so the number of mapped grants stays within the bound.
            self.flush_unmaps();
            self.issue_map_batch();
            for (target, result) in self.map_targets.iter().zip(&self.map_results) {
                if let MapTarget::Segment(page) = *target {
                    transient[page as usize] = *result;
                }
            }
            self.map_targets.clear();
        }
        let mut outcome = Ok(());
        let base = self.slots[usize::from(slot)].seg_base as usize;
        for page in 0..pages {
            let entry = cache_entries[page];
            let mapped = if entry != NO_ENTRY {
                self.cache.grant(entry)
            } else {
                transient[page]
            };
            match mapped {
                Ok(grant) if outcome.is_ok() => {
                    let first = page * abi::SEGMENTS_PER_INDIRECT_PAGE;
                    outcome = self.copy_descriptors(grant, base + first, total - first);
                }
                Ok(_) => {}
                Err(status) => outcome = Err(RequestError::GrantFailed(status)),
            }
            // The copy is all we need: unpin or unmap the page right away.
            match (entry, mapped) {
                (NO_ENTRY, Ok(grant)) => self.unmaps.push(grant),
                (NO_ENTRY, Err(_)) => {}
                (entry, _) => self.cache.release(entry),
            }
        }
        outcome
    }

    /// Copy up to one page of descriptors out of a mapped indirect page (one read) into
    /// `descs[at..]`, checking each.
    fn copy_descriptors(
        &mut self,
        grant: MappedGrant,
        at: usize,
        remaining: usize,
    ) -> Result<(), RequestError> {
        let count = remaining.min(abi::SEGMENTS_PER_INDIRECT_PAGE);
        let bytes = &mut self.indirect_page[..count * SEGMENT_SIZE];
        if !self.grants.read_buffer(grant.buffer, 0, bytes) {
            return Err(RequestError::GrantFailed(crate::grant::GNTST_GENERAL_ERROR));
        }
        for (i, raw) in bytes.chunks_exact(SEGMENT_SIZE).enumerate() {
            let desc = SegmentDesc::from_bytes(raw);
            desc.check()?;
            self.descs[at + i] = desc;
        }
        Ok(())
    }

    /// Check a data request's segments against the device, then queue its grants for
    /// mapping.
    fn stage_checked(&mut self, slot: u16, count: usize) {
        let Slot { work, sector, .. } = self.slots[usize::from(slot)];
        let Work::Data(op) = work else {
            unreachable!("data request")
        };
        let base = self.slots[usize::from(slot)].seg_base as usize;
        match check_data_access(op, sector, &self.descs[base..base + count], &self.geometry) {
            Ok(nr_sectors) => {
                let entry = &mut self.slots[usize::from(slot)];
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
        let Some(slot) = self.alloc_slot(request.id, abi::OP_DISCARD, work, request.sector) else {
            return self.refuse(rejected(RequestError::DeviceRefused));
        };
        self.slots[usize::from(slot)].nr_sectors = request.nr_sectors;
        self.submit_or_defer(slot);
    }

    /// Refuse a request that already holds a slot but no grants.
    fn refuse_slot(&mut self, slot: u16, error: RequestError) {
        let Slot {
            id, response_op, ..
        } = self.slots[usize::from(slot)];
        self.free_slots.push(slot);
        self.refuse(Rejected {
            id,
            operation: response_op,
            error,
        });
    }

    /// Look up or queue the map of every segment's grant. Persistent grants are mapped
    /// read-write (they are reused for both directions), transient ones read-only when
    /// the device only reads them.
    fn stage(&mut self, slot: u16) {
        let Slot {
            work, nr_segments, ..
        } = self.slots[usize::from(slot)];
        let count = usize::from(nr_segments);
        if self.map_requests.len() + count > self.map_requests.capacity() {
            self.flush_staged();
        }
        if self.unmaps.len() + count > self.unmaps.capacity() {
            self.flush_unmaps();
        }
        let writable = self.persistent || work == Work::Data(DataOp::Read);
        let base = self.slots[usize::from(slot)].seg_base as usize;
        for i in base..base + count {
            let gref = self.descs[i].gref;
            let mut cache_entry = NO_ENTRY;
            let mut known = None;
            if self.persistent {
                let unmaps = &mut self.unmaps;
                match self.cache.acquire(gref, &mut |grant| unmaps.push(grant)) {
                    CacheSlot::Hit(entry) => {
                        cache_entry = entry;
                        // Usually already mapped: no second look-up at flush time.
                        known = self.cache.grant(entry).ok();
                    }
                    CacheSlot::Inserted(entry) => {
                        cache_entry = entry;
                        self.map_requests.push(MapRequest {
                            gref,
                            writable: true,
                        });
                        self.map_targets.push(MapTarget::Cache(entry));
                    }
                    CacheSlot::Full => {}
                }
            }
            if cache_entry == NO_ENTRY {
                self.map_requests.push(MapRequest { gref, writable });
                self.map_targets.push(MapTarget::Segment(i as u32));
            }
            self.maps[i] = match known {
                Some(grant) => SegmentMap {
                    grant,
                    cache_entry,
                    status: 0,
                },
                None => SegmentMap {
                    grant: MappedGrant::default(),
                    cache_entry,
                    status: MAP_PENDING,
                },
            };
        }
        self.staged.push(slot);
    }

    /// Map everything in `map_requests` with one call. Cache entries are resolved here;
    /// the results stay in `map_results`, parallel to `map_targets`, for the caller.
    fn issue_map_batch(&mut self) {
        self.map_results.clear();
        self.map_results
            .resize(self.map_requests.len(), Err(MAP_PENDING));
        self.grants.map(&self.map_requests, &mut self.map_results);
        self.stats.map_batches += 1;
        for (target, result) in self.map_targets.iter().zip(&self.map_results) {
            if result.is_err() {
                self.stats.grant_failures += 1;
            }
            if let MapTarget::Cache(entry) = *target {
                self.cache.resolve(entry, *result);
            }
        }
        self.map_requests.clear();
    }

    /// Issue the round's map batch (after the round's unmaps, so the number of mapped
    /// grants never exceeds the bound), then submit or fail every staged request.
    fn flush_staged(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        self.flush_unmaps();
        if !self.map_requests.is_empty() {
            self.issue_map_batch();
            for (target, result) in self.map_targets.iter().zip(&self.map_results) {
                if let MapTarget::Segment(index) = *target {
                    let map = &mut self.maps[index as usize];
                    match *result {
                        Ok(grant) => {
                            map.grant = grant;
                            map.status = 0;
                            self.transient_mapped += 1;
                        }
                        Err(status) => map.status = status,
                    }
                }
            }
            self.map_targets.clear();
        }
        for n in 0..self.staged.len() {
            let slot = self.staged[n];
            match self.resolve_grants(slot) {
                Ok(()) => self.submit_or_defer(slot),
                Err(status) => self.fail(slot, RequestError::GrantFailed(status)),
            }
        }
        self.staged.clear();
    }

    /// Fill in each segment's mapping; the first failure, if any.
    fn resolve_grants(&mut self, slot: u16) -> Result<(), GrantStatus> {
        let base = self.slots[usize::from(slot)].seg_base as usize;
        let count = usize::from(self.slots[usize::from(slot)].nr_segments);
        let mut outcome = Ok(());
        for map in &mut self.maps[base..base + count] {
            if map.status == 0 {
                continue;
            }
            if map.cache_entry != NO_ENTRY {
                match self.cache.grant(map.cache_entry) {
                    Ok(grant) => {
                        map.grant = grant;
                        map.status = 0;
                    }
                    Err(status) => outcome = outcome.and(Err(status)),
                }
            } else {
                outcome = outcome.and(Err(map.status));
            }
        }
        outcome
    }

    /// A barrier is started only once everything before it has finished (as Linux
    /// drains its ring); requests behind a deferred one wait in order.
    fn must_wait(&self, slot: u16) -> bool {
        self.slots[usize::from(slot)].work == Work::Data(DataOp::Barrier) && self.in_flight > 0
    }

    fn submit_or_defer(&mut self, slot: u16) {
        if !self.deferred.is_empty() || self.must_wait(slot) {
            self.deferred.push(slot);
            return;
        }
        match self.try_submit(slot) {
            Ok(()) => {}
            Err(SubmitError::QueueFull) => {
                self.stats.device_busy += 1;
                self.deferred.push(slot);
            }
            Err(SubmitError::Invalid) => self.fail(slot, RequestError::DeviceRefused),
        }
    }

    /// Hand a slot to the device: one DMA segment per grant, never merged.
    fn try_submit(&mut self, slot: u16) -> Result<(), SubmitError> {
        let entry = self.slots[usize::from(slot)];
        let base = self.slots[usize::from(slot)].seg_base as usize;
        let count = usize::from(entry.nr_segments);
        self.dma.clear();
        for (desc, map) in self.descs[base..base + count]
            .iter()
            .zip(&self.maps[base..base + count])
        {
            self.dma.push(DmaSegment {
                buffer: map.grant.buffer,
                offset: desc.byte_offset(),
                len: desc.byte_len(),
            });
        }
        let (op, preflush) = match entry.work {
            Work::Data(DataOp::Read) => (IoOp::Read, false),
            Work::Data(DataOp::Write) => (IoOp::Write, false),
            Work::Data(DataOp::Flush | DataOp::Barrier) if count == 0 => (IoOp::Flush, false),
            Work::Data(DataOp::Flush | DataOp::Barrier) => (IoOp::Write, true),
            Work::Discard { secure } => (IoOp::Discard { secure }, false),
        };
        let request = IoRequest {
            tag: u32::from(slot),
            op,
            sector: entry.sector,
            nr_sectors: entry.nr_sectors,
            preflush,
            segments: &self.dma,
        };
        self.device.submit(&request, &self.grants)?;
        self.slots[usize::from(slot)].submitted = true;
        self.in_flight += 1;
        Ok(())
    }

    fn retry_deferred(&mut self) {
        while let Some(slot) = self.deferred.front() {
            if self.must_wait(slot) {
                return;
            }
            match self.try_submit(slot) {
                Ok(()) => {}
                Err(SubmitError::QueueFull) => return,
                Err(SubmitError::Invalid) => self.fail(slot, RequestError::DeviceRefused),
            }
            self.deferred.pop();
        }
    }

    /// Give back a slot's grants: cached ones are unpinned, transient ones queued for
    /// the unmap batch.
    fn release_grants(&mut self, slot: u16) {
        let base = self.slots[usize::from(slot)].seg_base as usize;
        let count = usize::from(self.slots[usize::from(slot)].nr_segments);
        if self.unmaps.len() + count > self.unmaps.capacity() {
            self.flush_unmaps();
        }
        for map in &self.maps[base..base + count] {
            if map.cache_entry != NO_ENTRY {
                self.cache.release(map.cache_entry);
            } else if map.status == 0 {
                self.unmaps.push(map.grant);
                self.transient_mapped -= 1;
            }
        }
        self.slots[usize::from(slot)].nr_segments = 0;
    }

    /// Answer a slot and free it. The response becomes visible at the next publish,
    /// after the unmaps queued before it.
    fn respond(&mut self, slot: u16, status: i16) {
        let Slot {
            id, response_op, ..
        } = self.slots[usize::from(slot)];
        if status != abi::RSP_OKAY {
            self.stats.errors += 1;
        }
        self.ring.put_response(Response {
            id,
            operation: response_op,
            status,
        });
        self.free_slots.push(slot);
    }

    /// A request that holds a slot (and maybe grants) failed before reaching the device.
    fn fail(&mut self, slot: u16, error: RequestError) {
        if worth_logging(self.stats.errors + 1) {
            let Slot {
                id, response_op, ..
            } = self.slots[usize::from(slot)];
            log::warn!(
                "blkback: request id {:#x} op {} failed: {:?}",
                id,
                response_op,
                error
            );
        }
        self.release_grants(slot);
        self.respond(slot, error.status());
    }

    fn reap_completions(&mut self) -> usize {
        self.completions.clear();
        let completions = &mut self.completions;
        let capacity = completions.capacity();
        self.device.poll_completions(&mut |completion| {
            if completions.len() < capacity {
                completions.push(completion);
            }
        });
        let mut finished = 0;
        for n in 0..self.completions.len() {
            let Completion { tag, status } = self.completions[n];
            let slot = tag as u16;
            let known =
                (tag as usize) < self.slots.len() && self.slots[usize::from(slot)].submitted;
            if !known {
                log::error!("blkback: device completed unknown tag {}", tag);
                continue;
            }
            self.slots[usize::from(slot)].submitted = false;
            self.in_flight -= 1;
            self.release_grants(slot);
            self.respond(slot, status_code(status));
            finished += 1;
        }
        finished
    }

    fn flush_unmaps(&mut self) {
        if self.unmaps.is_empty() {
            return;
        }
        self.unmap_results.clear();
        self.unmap_results.resize(self.unmaps.len(), Ok(()));
        self.grants.unmap(&self.unmaps, &mut self.unmap_results);
        self.stats.unmap_batches += 1;
        let failures = self.unmap_results.iter().filter(|r| r.is_err()).count();
        if failures > 0 {
            self.stats.grant_failures += failures as u64;
            log::error!("blkback: {} grant unmaps failed", failures);
        }
        self.unmaps.clear();
    }

    /// Unmap first, then make the responses visible, then notify if asked to.
    fn publish_responses(&mut self) -> bool {
        self.flush_unmaps();
        if self.ring.push_responses() {
            self.events.notify();
            self.stats.notifications += 1;
            return true;
        }
        false
    }
}
