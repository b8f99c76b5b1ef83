// SPDX-License-Identifier: MIT OR Apache-2.0
//! The per-queue engine: one ring of one frontend, driven by the poller of its vCPU.
//!
//! `poll(budget)` consumes at most `budget` requests (each copied out of the ring once,
//! parsed, checked, its grants mapped in one batch per round), collects what the device
//! finished, unmaps what must be unmapped, and only then publishes responses and
//! notifies when the ring macros say so. Everything is allocated in `new`.
//!
//! The engine's parts, one file each: `slots` (the slot table and the segment area),
//! `mapping` (the persistent-grant cache, map and unmap batches, each segment's
//! mapping), `consume` (ring to slot: parse, check, indirect descriptors), `submit` (map
//! batch to device, in order) and `complete` (device to response).

use alloc::vec::Vec;
use blkdev::{BlockDevice, Completion, DeviceFault, Geometry};

use crate::abi::REQUEST_SIZE;
use crate::abi::{self, wire, Protocol, MAX_SEGMENTS_PER_REQUEST};
use crate::budget::{GrantLimits, GrantShare, InFlightCredit, RingDemand};
use crate::fallible;
use crate::grant::GrantOps;
use crate::limits::{Class, IoLimits, Limiter};
use crate::parse::RequestError;
use crate::ring::{BackRing, Response, RingError, RingMemory};
use crate::stats::RingStats;
use zerocopy::FromZeros;

mod complete;
mod consume;
mod mapping;
mod notify;
mod slots;
mod submit;

pub use consume::SEGMENTS_PER_POLL;
use mapping::GrantMapper;
use notify::Moderator;
pub use notify::{DEFAULT_NOTIFY_HOLD_NS, MAX_NOTIFY_HOLD_NS};
use slots::{segment_area, SlotTable};
use submit::Submission;

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
    /// Map no data grant: each segment's buffer names its grant
    /// (`grant::copy_buffer`), and the device (one that bounces: its data goes through
    /// pages of its own) copies with the hypervisor (`GNTTABOP_copy`); indirect pages
    /// are copied too. Such a ring unmaps nothing and holds nothing of the domain's
    /// budget for grants in flight. Persistent grants are then ignored (a backend in
    /// this mode does not offer them).
    pub grant_copy: bool,
    /// What we advertised as `feature-max-indirect-segments`.
    pub max_indirect_segments: u16,
    /// The most grants the cache is sized for (`grants.max-per-ring`); never more than
    /// ring slots × (segments + indirect pages) per request, the most in-flight requests
    /// can reference, which is also the size with `None`. The ring's share of the domain's budget
    /// (`Engine::set_grant_share`) caps it further while the ring runs.
    pub persistent_grant_limit: Option<usize>,
    /// Unmap a cached grant unused this long (ns; 0: never). Time comes from
    /// `Engine::tick`.
    pub idle_release_ns: u64,
    /// Refuse writes even if the device takes them (toolstack `mode` "r").
    pub read_only: bool,
    /// Serve discards if the device can (`false`: the toolstack's `discard-enable` is 0,
    /// and every discard is answered `EOPNOTSUPP` as if the device had none).
    pub discard: bool,
    /// The frontend's ABI (its `protocol` node): the layout of the ring's entries.
    pub protocol: Protocol,
    /// Longest a due event to the frontend may be held while more responses are
    /// expected, so one event carries them all (`notify` module); 0 never holds. With
    /// a window the engine must be driven with [`Engine::poll_at`].
    pub notify_hold_ns: u64,
    /// How long a device command may take (ns; 0: forever): past it the device queue
    /// fails (`BlockDevice::tick`), and every request it holds is answered with an
    /// error. Time comes from `Engine::tick`.
    pub device_timeout_ns: u64,
    /// Where a previous image left this ring (a live upgrade: its `rsp_prod`, every
    /// request before it answered); `None` for a ring the frontend just initialised.
    /// The engine then attaches there ([`BackRing::reattach`]'s checks refuse a ring
    /// not where it was left, or more than full) and kicks the frontend once.
    pub attach_at: Option<u32>,
}

/// The default deadline of a device command: 30 s, Linux's `io_timeout`.
pub const DEFAULT_DEVICE_TIMEOUT_NS: u64 = 30_000_000_000;
/// The longest deadline accepted (the kernel command line's `device.timeout-ms=`): an hour.
pub const MAX_DEVICE_TIMEOUT_NS: u64 = 3_600_000_000_000;

impl EngineConfig {
    pub fn new(ring_order: u32, persistent_grants: bool) -> Self {
        Self {
            ring_order,
            persistent_grants,
            grant_copy: false,
            max_indirect_segments: abi::MAX_INDIRECT_SEGMENTS,
            persistent_grant_limit: None,
            idle_release_ns: GrantLimits::DEFAULT.idle_ns(),
            read_only: false,
            discard: true,
            protocol: Protocol::X86_64,
            notify_hold_ns: 0,
            device_timeout_ns: DEFAULT_DEVICE_TIMEOUT_NS,
            attach_at: None,
        }
    }

    /// Bytes of heap an engine with this configuration allocates
    /// ([`Engine::memory_needed`]).
    pub fn memory_needed(&self) -> usize {
        Sizing::new(self).memory_needed()
    }

    /// What a ring with this configuration asks of the domain's grant budget
    /// ([`Engine::grant_demand`]).
    pub fn grant_demand(&self) -> RingDemand {
        Sizing::new(self).grant_demand()
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

/// Why an engine could not be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineError {
    /// The ring does not fit what was negotiated.
    Ring(RingError),
    /// The ring's working set (slots, segment area, grant cache, batches) does not fit
    /// in the memory there is.
    OutOfMemory { slots: usize, needed: usize },
}

impl From<RingError> for EngineError {
    fn from(error: RingError) -> Self {
        EngineError::Ring(error)
    }
}

impl core::fmt::Display for EngineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineError::Ring(error) => write!(f, "ring: {error}"),
            EngineError::OutOfMemory { slots, needed } => write!(
                f,
                "not enough memory for a ring of {slots} slots: needs {} KiB",
                needed.div_ceil(1024)
            ),
        }
    }
}

impl core::error::Error for EngineError {}

/// The sizes an engine's memory follows from.
struct Sizing {
    /// Caches grants (`persistent_grants` and not `grant_copy`).
    persistent: bool,
    /// `EngineConfig::grant_copy`.
    copy: bool,
    slots: usize,
    max_indirect_segments: u16,
    /// Segments one request may carry (11, or the advertised indirect count).
    max_segments: usize,
    cache_capacity: usize,
    /// Map and unmap batch size: always room for one whole request.
    batch: usize,
}

impl Sizing {
    fn new(config: &EngineConfig) -> Self {
        let slots = config
            .protocol
            .ring_slots(config.ring_order.min(abi::MAX_RING_PAGE_ORDER))
            as usize;
        let max_indirect_segments = config
            .max_indirect_segments
            .min((abi::SEGMENTS_PER_INDIRECT_PAGE * abi::MAX_INDIRECT_PAGES) as u16);
        let max_segments = MAX_SEGMENTS_PER_REQUEST.max(usize::from(max_indirect_segments));
        let copy = config.grant_copy;
        let persistent = config.persistent_grants && !copy;
        let cache_capacity = if persistent {
            // blkfront grants its indirect pages from the same persistent pool.
            let per_request =
                max_segments + abi::indirect_pages(usize::from(max_indirect_segments));
            let referenced = slots * per_request;
            config
                .persistent_grant_limit
                .map_or(referenced, |limit| limit.min(referenced))
        } else {
            0
        };
        Self {
            persistent,
            copy,
            slots,
            max_indirect_segments,
            max_segments,
            cache_capacity,
            // A copying ring has no map or unmap batch.
            batch: if copy { 0 } else { max_segments.max(256) },
        }
    }

    fn grant_demand(&self) -> RingDemand {
        let request_maps = if self.copy {
            0
        } else {
            self.max_segments as u32
        };
        RingDemand {
            persistent: self.persistent,
            request_maps,
            ring_maps: (self.slots as u32).saturating_mul(request_maps),
        }
    }

    fn memory_needed(&self) -> usize {
        SlotTable::memory_needed(self.slots, self.max_segments)
            + GrantMapper::memory_needed(
                self.cache_capacity,
                segment_area(self.slots, self.max_segments),
                self.batch,
            )
            + Submission::memory_needed(self.slots, self.max_segments)
            + self.slots * core::mem::size_of::<Completion>()
            + abi::PAGE_SIZE
    }
}

/// An engine's heap memory, allocated before it takes its ring.
struct WorkingSet {
    /// Ring slots it was sized for.
    ring_slots: usize,
    max_indirect_segments: u16,
    slots: SlotTable,
    mapper: GrantMapper,
    submission: Submission,
    completions: Vec<Completion>,
    indirect_page: Vec<wire::Segment>,
}

impl WorkingSet {
    /// Everything `config` needs, if it is at most `budget` bytes and the heap has it.
    fn new(config: &EngineConfig, budget: usize) -> Result<Self, EngineError> {
        let sizing = Sizing::new(config);
        let Sizing {
            persistent,
            copy,
            slots,
            max_indirect_segments,
            max_segments,
            cache_capacity,
            batch,
        } = sizing;
        let out_of_memory = EngineError::OutOfMemory {
            slots,
            needed: sizing.memory_needed(),
        };
        if sizing.memory_needed() > budget {
            return Err(out_of_memory);
        }
        Ok(Self {
            ring_slots: slots,
            max_indirect_segments,
            slots: SlotTable::new(slots, max_segments).map_err(|_| out_of_memory)?,
            mapper: if copy {
                GrantMapper::copying(segment_area(slots, max_segments))
            } else {
                GrantMapper::new(
                    persistent,
                    cache_capacity,
                    segment_area(slots, max_segments),
                    batch,
                    max_segments,
                )
            }
            .map_err(|_| out_of_memory)?,
            submission: Submission::new(slots, max_segments).map_err(|_| out_of_memory)?,
            completions: fallible::with_capacity(slots).map_err(|_| out_of_memory)?,
            indirect_page: fallible::vec(
                wire::Segment::new_zeroed(),
                abi::SEGMENTS_PER_INDIRECT_PAGE,
            )
            .map_err(|_| out_of_memory)?,
        })
    }
}

/// An engine that was not started ([`Engine::new_within`]): why, and everything it was
/// given, untouched.
pub struct NotStarted<M, G, D, E> {
    pub error: EngineError,
    pub memory: M,
    pub grants: G,
    pub device: D,
    pub events: E,
}

impl<M, G, D, E> core::fmt::Debug for NotStarted<M, G, D, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NotStarted")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// Teardown cannot finish yet: the device still owns requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy {
    pub in_flight: usize,
}

/// Log the first few occurrences of a frontend fault, then only at powers of two, so a
/// hostile frontend cannot flood the console.
fn worth_logging(count: u64) -> bool {
    count <= 16 || count.is_power_of_two()
}

/// A request taken off the ring that the ring's limits hold back: its copy, when it
/// began to wait, what it is charged to.
#[derive(Clone, Copy)]
struct Held {
    raw: [u8; REQUEST_SIZE],
    since: u64,
    class: Class,
}

/// The ring's I/O limits: its buckets and the one request they hold back, if any.
#[derive(Default)]
struct Throttle {
    limiter: Limiter,
    held: Option<Held>,
}

/// One ring served by one poller.
pub struct Engine<M, G, D, E> {
    ring: BackRing<M>,
    grants: G,
    device: D,
    events: E,
    geometry: Geometry,
    max_indirect_segments: u16,
    state: EngineState,
    slots: SlotTable,
    mapper: GrantMapper,
    submission: Submission,
    completions: Vec<Completion>,
    /// Where an indirect page's descriptors are copied to.
    indirect_page: Vec<wire::Segment>,
    /// An event arrived since the last poll.
    event_pending: bool,
    /// The ring's share of the domain's grant budget, read at every poll.
    share: Option<GrantShare>,
    /// What the ring holds of the domain's credit for grants in flight (from its share's
    /// pool; unbounded without a share).
    credit: InFlightCredit,
    /// The last `consume` left requests in the ring because the ring's grants in flight
    /// were at its limit (counted once per wait in `grant_waits`).
    map_waiting: bool,
    /// `EngineConfig::idle_release_ns`.
    idle_release_ns: u64,
    /// When to send or hold the frontend's events.
    moderator: Moderator,
    /// `EngineConfig::device_timeout_ns`.
    device_timeout_ns: u64,
    /// The device queue failed: requests are answered with an error without it.
    device_fault: Option<DeviceFault>,
    /// The ring's share of its disk's I/O limits (`Engine::set_limits`).
    throttle: Throttle,
    /// The poller's clock as of the last `poll_at` or `tick`.
    now: u64,
    stats: RingStats,
}

impl<M: RingMemory, G: GrantOps, D: BlockDevice, E: EventChannel> Engine<M, G, D, E> {
    /// Bytes of heap an engine for `config` allocates (its whole working set: slot
    /// table and segment area, grant mappings and cache, batches). Check it against the
    /// free heap before connecting a ring.
    pub fn memory_needed(config: &EngineConfig) -> usize {
        Sizing::new(config).memory_needed()
    }

    /// Attach to a mapped ring. All per-ring memory is allocated here, fallibly: a
    /// failed allocation is `EngineError::OutOfMemory`, never an abort.
    pub fn new(
        memory: M,
        grants: G,
        device: D,
        events: E,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        Self::new_within(memory, grants, device, events, config, usize::MAX)
            .map_err(|refused| refused.error)
    }

    /// Like `new`, refusing up front when the engine would need more than `budget`
    /// bytes (the free heap, say). A refusal hands back everything the engine was
    /// given ([`NotStarted`]): the device queue above all, which goes back to the pool
    /// it came from.
    pub fn new_within(
        memory: M,
        grants: G,
        device: D,
        events: E,
        config: EngineConfig,
        budget: usize,
    ) -> Result<Self, NotStarted<M, G, D, E>> {
        let working = BackRing::fits(&memory, config.ring_order)
            .and_then(|()| match config.attach_at {
                Some(rsp_prod) => {
                    BackRing::check_reattach(&memory, config.ring_order, config.protocol, rsp_prod)
                }
                None => Ok(()),
            })
            .map_err(EngineError::Ring)
            .and_then(|()| WorkingSet::new(&config, budget));
        let working = match working {
            Ok(working) => working,
            Err(error) => {
                return Err(NotStarted {
                    error,
                    memory,
                    grants,
                    device,
                    events,
                })
            }
        };
        let ring = match config.attach_at {
            Some(rsp_prod) => {
                BackRing::attach_at(memory, config.ring_order, config.protocol, rsp_prod)
            }
            None => BackRing::attach(memory, config.ring_order, config.protocol),
        };
        debug_assert_eq!(working.ring_slots, ring.slots() as usize);
        let mut geometry = device.geometry();
        geometry.read_only |= config.read_only;
        if !config.discard {
            geometry.discard = None;
        }
        let mut engine = Self {
            ring,
            grants,
            geometry,
            device,
            events,
            max_indirect_segments: working.max_indirect_segments,
            state: EngineState::Running,
            slots: working.slots,
            mapper: working.mapper,
            submission: working.submission,
            completions: working.completions,
            indirect_page: working.indirect_page,
            event_pending: false,
            share: None,
            credit: InFlightCredit::unbounded(),
            map_waiting: false,
            idle_release_ns: config.idle_release_ns,
            moderator: Moderator::new(config.notify_hold_ns),
            device_timeout_ns: config.device_timeout_ns,
            device_fault: None,
            throttle: Throttle::default(),
            now: 0,
            stats: RingStats::default(),
        };
        if config.attach_at.is_some() {
            // An event the previous image held, or one lost while the frontend's port
            // was unbound: a frontend told once too often only looks at its ring.
            engine.send_notification();
        }
        Ok(engine)
    }

    /// Follow `share` from now on: each poll reads it. A ring holding more than its
    /// cache's cap unmaps unpinned grants down to it (at most one unmap batch per poll);
    /// at the cap, further grants are mapped per request. Grants mapped per request are
    /// bounded by the credit the ring holds, moved towards the share's target through
    /// the budget's pool (`budget::InFlightCredit`): a ring at its limit leaves requests
    /// in the ring until its requests in flight give grants back. Credit held under an
    /// earlier share goes back to that share's pool.
    pub fn set_grant_share(&mut self, share: GrantShare) {
        self.credit = share.credit();
        self.share = Some(share);
        self.apply_grant_share();
    }

    /// What this ring asks of the domain's grant budget (as
    /// [`EngineConfig::grant_demand`]).
    pub fn grant_demand(&self) -> RingDemand {
        let request_maps = self.mapper.request_maps() as u32;
        RingDemand {
            persistent: self.mapper.persistent(),
            request_maps,
            ring_maps: self.ring.slots().saturating_mul(request_maps),
        }
    }

    /// Follow the share's cap and target, and evict one bounded batch if the cache is
    /// above its cap. Once the ring holds its target, one load and two compares.
    fn apply_grant_share(&mut self) {
        let Some(share) = &self.share else { return };
        let (cap, in_flight) = share.caps();
        let cap = cap as usize;
        if cap != self.mapper.cache_limit() {
            self.mapper.set_cache_limit(cap);
        }
        let request_maps = self.mapper.request_maps() as u32;
        if let Some(limit) = self
            .credit
            .follow(in_flight, self.mapper.in_flight(), request_maps)
        {
            self.mapper.set_in_flight_limit(limit as usize);
        }
        self.stats.cap_evicted +=
            self.mapper
                .evict_over_limit(&mut self.grants, &mut self.stats) as u64;
    }

    /// The poller's clock (ns, monotonic): the device times its commands by it (one
    /// held past `EngineConfig::device_timeout_ns` fails the device queue: what it holds
    /// is answered with errors at the next poll, and so is every request from then on,
    /// at once and without mapping its grants); grants unpinned from now on are stamped
    /// with it, and cached grants unused for the idle timeout are unmapped, at most one
    /// unmap batch per call. Grants pinned by requests in flight are never released.
    /// Returns how many were unmapped. Allocates nothing; cheap when nothing is due.
    pub fn tick(&mut self, now: u64) -> usize {
        self.now = self.now.max(now);
        self.device.tick(now, self.device_timeout_ns);
        if self.device_fault.is_none() {
            if let Some(fault) = self.device.fault() {
                log::error!(
                    "blkback: device failed: {fault}; this ring's requests are answered with errors"
                );
                self.device_fault = Some(fault);
            }
        }
        if !self.mapper.persistent() {
            return 0;
        }
        let released =
            self.mapper
                .release_idle(now, self.idle_release_ns, &mut self.grants, &mut self.stats);
        self.stats.idle_released += released as u64;
        released
    }

    pub fn state(&self) -> EngineState {
        self.state
    }

    /// Why the device queue failed, once it has (seen at a `tick`).
    pub fn device_fault(&self) -> Option<DeviceFault> {
        self.device_fault
    }

    pub fn stats(&self) -> RingStats {
        RingStats {
            grants_mapped: self.mapper.mapped() as u64,
            persistent_grants: self.mapper.persistent_mapped() as u64,
            grant_cap: self.mapper.cache_limit() as u64,
            // A ring that copies maps no grant for its requests: its bound is none at all
            // (its copies are bounded by its device's bounce pages, not by the budget).
            in_flight_cap: if self.mapper.copies() {
                0
            } else {
                self.mapper.in_flight_limit().min(u32::MAX as usize) as u64
            },
            ..self.stats
        }
    }

    /// Requests handed to the device and not finished.
    pub fn in_flight(&self) -> usize {
        self.submission.in_flight
    }

    /// Grants held in the persistent cache right now.
    pub fn cached_grants(&self) -> usize {
        self.mapper.cached()
    }

    /// The most grants the cache was sized for.
    pub fn cache_capacity(&self) -> usize {
        self.mapper.cache_capacity()
    }

    /// The most grants the cache takes now (its share of the budget).
    pub fn cache_limit(&self) -> usize {
        self.mapper.cache_limit()
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

    /// The device's capacity changed (a disk resized while it serves): requests are
    /// checked against the new one from now on. The caller publishes the new size only
    /// after every engine of the disk did this, so no frontend sends a request for a
    /// sector its engine does not know yet; a shrink lowers the device's capacity first.
    pub fn refresh_capacity(&mut self) {
        self.geometry.sectors = self.device.geometry().sectors;
    }

    /// Sectors requests are checked against.
    pub fn capacity(&self) -> u64 {
        self.geometry.sectors
    }

    /// `poll` at time `now_ns` (the poller's clock, which must not go back): what a
    /// held notification's deadline is measured against.
    pub fn poll_at(&mut self, budget: usize, now_ns: u64) -> PollOutcome {
        self.moderator.set_now(now_ns);
        self.now = self.now.max(now_ns);
        self.poll(budget)
    }

    /// When a held notification must go out (the poller must poll by then, asleep or
    /// not); `None` when none is held.
    pub fn notify_deadline(&self) -> Option<u64> {
        self.moderator.deadline()
    }

    /// Enforce `limits` (this ring's part of its disk's, `IoLimits::per_queue`) from the
    /// last `poll_at`/`tick` time on; `IoLimits::NONE` lifts them. A request held back
    /// is looked at again at the next poll under the new limits.
    pub fn set_limits(&mut self, limits: &IoLimits) {
        self.throttle.limiter.set(limits, self.now);
    }

    /// The limits this ring enforces.
    pub fn limits(&self) -> IoLimits {
        self.throttle.limiter.limits()
    }

    /// When the ring's limits let the request they hold back go (the poller must poll
    /// by then, asleep or not); `None` when none is held. Driven with `poll_at`, the
    /// request goes at the first poll at or after it.
    pub fn throttle_deadline(&self) -> Option<u64> {
        let held = self.throttle.held.as_ref()?;
        (self.state == EngineState::Running).then(|| self.throttle.limiter.due(held.class))
    }

    /// One pass: take up to `budget` requests (and up to [`SEGMENTS_PER_POLL`] data
    /// segments: at least one request), finish completed ones, publish responses (at the
    /// time of the last `poll_at`).
    pub fn poll(&mut self, budget: usize) -> PollOutcome {
        self.stats.polls += 1;
        self.apply_grant_share();
        let mut consumed = 0;
        if matches!(self.state, EngineState::Running | EngineState::Halted) {
            // Requests accepted before a halt still go to the device.
            self.retry_deferred();
        }
        if self.state == EngineState::Running && self.submission.deferred.is_empty() {
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

    /// Before blocking: send a held notification (a poller never sleeps on one: what
    /// was coming did not come while it spun, and no hold depends on its timer), then
    /// re-arm `req_event` and look once more (`RING_FINAL_CHECK_FOR_REQUESTS`). True
    /// means nothing is pending and the poller may sleep until the event channel (or
    /// the device) wakes it. Requests left in the ring because its grants in flight are
    /// at its limit do not keep it awake while its own requests are on the device: the
    /// poller comes back for those soon (`in_flight`), and they give grants back. A ring
    /// waiting for credit other rings give back keeps it polling.
    pub fn prepare_to_sleep(&mut self) -> bool {
        self.release_before_sleep();
        if self.state != EngineState::Running {
            return true;
        }
        let requests = self.ring.final_check_for_requests();
        // Held back by the ring's limits: the poller sleeps until `throttle_deadline`
        // at most (a grant wait still keeps it polling, as below).
        let throttled = self.throttle.held.is_some() && self.mapper.may_take_request();
        self.submission.deferred.is_empty()
            && (throttled
                || !requests
                || (!self.mapper.may_take_request() && self.submission.in_flight > 0))
    }

    /// Requests wait in the ring because the ring's grants in flight are at its limit.
    pub fn waits_for_grants(&self) -> bool {
        self.state == EngineState::Running
            && !self.mapper.may_take_request()
            && self.ring.unconsumed(self.ring.req_prod()) > 0
    }

    /// Stop taking requests, fail the ones the device never accepted, finish the rest
    /// and unmap every grant. Returns `Busy` while the device still owns requests: call
    /// again later (poll the device meanwhile through this call). Idempotent.
    pub fn disconnect(&mut self) -> Result<(), Busy> {
        if self.state == EngineState::Disconnected {
            return Ok(());
        }
        self.state = EngineState::Draining;
        self.answer_held();
        self.flush_staged();
        while let Some(slot) = self.submission.deferred.pop() {
            self.fail(slot, RequestError::DeviceRefused);
        }
        self.reap_completions();
        self.publish_responses();
        // A held notification goes out now: nobody polls a torn-down ring.
        self.release_held_notification();
        if self.submission.in_flight > 0 {
            return Err(Busy {
                in_flight: self.submission.in_flight,
            });
        }
        self.mapper.unmap_all(&mut self.grants, &mut self.stats);
        self.state = EngineState::Disconnected;
        Ok(())
    }

    /// Teardown with a request held back by the limits: it was taken off the ring, so it
    /// is answered (with an error, as requests the device never accepted are).
    fn answer_held(&mut self) {
        let Some(held) = self.throttle.held.take() else {
            return;
        };
        self.stats.throttle_ns += self.now.saturating_sub(held.since);
        let (id, operation) =
            match crate::parse::parse_request(&held.raw, self.max_indirect_segments) {
                Ok(crate::parse::Request::Direct(r)) => (r.id, r.op.code()),
                Ok(crate::parse::Request::Indirect(r)) => (r.id, r.op.code()),
                Ok(crate::parse::Request::Discard(r)) => (r.id, abi::OP_DISCARD),
                // Only parsed requests are held.
                Err(rejected) => (rejected.id, rejected.operation),
            };
        self.stats.errors += 1;
        self.ring.put_response(Response {
            id,
            operation,
            status: abi::RSP_ERROR,
        });
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
}
