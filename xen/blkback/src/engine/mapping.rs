// SPDX-License-Identifier: MIT OR Apache-2.0
//! Grant mapping for requests: the persistent-grant cache, the round's map batch, the
//! unmap batch, and how each segment's page is mapped.
//!
//! Persistent grants are mapped read-write (they are reused for both directions) and
//! stay mapped, pinned while a request uses them; the rest are mapped for one request
//! and unmapped when it finishes. Those transient maps count against the ring's part of
//! the domain's budget for grants in flight (`budget.rs`): the ring takes a request
//! only while what it has mapped or queued leaves room for the largest request it may
//! send (`may_take_request`), so it never has more than its limit mapped.
//!
//! A ring that copies (`GrantMapper::copying`, for a disk whose device bounces) maps
//! nothing: each segment's buffer names its grant (`grant::copy_buffer`), known at once,
//! and the device copies through the hypervisor (`GNTTABOP_copy`). It holds no mapping,
//! so it takes nothing of the budget for grants in flight and unmaps nothing.

use alloc::collections::TryReserveError;
use alloc::vec::Vec;
use core::mem::size_of;
use core::ops::Range;

use crate::abi::MAX_INDIRECT_PAGES;
use crate::fallible;
use crate::grant::{copy_buffer, CacheSlot, GrantCache, GrantOps, MapRequest, MappedGrant};
use crate::stats::RingStats;
use xen::abi::grant_table::RawGrantStatus;

const NO_ENTRY: u32 = u32::MAX;
/// Status of a transient segment whose map has not been issued yet.
const MAP_PENDING: RawGrantStatus = i16::MIN;

/// How one segment's (or indirect page's) page is mapped.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SegmentMap {
    pub grant: MappedGrant,
    /// Index in the persistent cache, or `NO_ENTRY` for a transient mapping.
    pub cache_entry: u32,
    /// 0 once `grant` is known; else `MAP_PENDING` or (transient) the map failure.
    pub status: RawGrantStatus,
}

impl SegmentMap {
    /// Not known until the batch is mapped.
    fn pending(cache_entry: u32) -> Self {
        Self {
            grant: MappedGrant::default(),
            cache_entry,
            status: MAP_PENDING,
        }
    }
}

/// Where the result of one map in the batch goes.
#[derive(Clone, Copy, Debug)]
enum MapTarget {
    Cache(u32),
    Segment(u32),
}

/// The grant-mapping state of one ring.
#[derive(Debug)]
pub(super) struct GrantMapper {
    /// The frontend agreed to persistent grants.
    persistent: bool,
    /// Nothing is mapped: segments name their grants, which the device copies.
    copy: bool,
    cache: GrantCache,
    /// Each segment's mapping, parallel to the slot table's segment area, then one per
    /// indirect page of the request being taken in.
    maps: Vec<SegmentMap>,
    /// Where the indirect pages' entries start in `maps` (the size of the segment area).
    indirect_pages: usize,
    /// The round's map batch, and where each result goes.
    requests: Vec<MapRequest>,
    targets: Vec<MapTarget>,
    results: Vec<Result<MappedGrant, RawGrantStatus>>,
    /// Grants to unmap in the next unmap batch.
    unmaps: Vec<MappedGrant>,
    unmap_results: Vec<Result<(), RawGrantStatus>>,
    /// Transient mappings held by requests, counted from when they are queued (so a
    /// round's batch counts before it is mapped) until they are released.
    transient_mapped: usize,
    /// The most grants one request maps for itself (its segments; its indirect pages
    /// are given back before its data is mapped).
    request_maps: usize,
    /// A request is taken only while `transient_mapped` is below this: the ring's
    /// limit for grants in flight, less `request_maps`, plus one (0: none is taken).
    take_below: usize,
    /// That limit.
    in_flight_limit: usize,
    /// A grant was mapped for its request alone because the cache was at its limit
    /// since the engine last looked (`take_capped`).
    capped: bool,
}

impl GrantMapper {
    /// `segments` is the size of the segment area; a batch holds up to `batch` maps;
    /// one request maps at most `request_maps` grants. No limit on grants in flight until
    /// `set_in_flight_limit`.
    pub fn new(
        persistent: bool,
        cache_capacity: usize,
        segments: usize,
        batch: usize,
        request_maps: usize,
    ) -> Result<Self, TryReserveError> {
        Ok(Self {
            persistent,
            copy: false,
            cache: GrantCache::try_new(cache_capacity)?,
            maps: fallible::vec(SegmentMap::default(), segments + MAX_INDIRECT_PAGES)?,
            indirect_pages: segments,
            requests: fallible::with_capacity(batch)?,
            targets: fallible::with_capacity(batch)?,
            results: fallible::with_capacity(batch)?,
            unmaps: fallible::with_capacity(batch)?,
            unmap_results: fallible::with_capacity(batch)?,
            transient_mapped: 0,
            request_maps,
            take_below: usize::MAX,
            in_flight_limit: usize::MAX,
            capped: false,
        })
    }

    /// A mapper for a ring that copies: no cache, no batches, no limit; `segments` as
    /// for `new`. Allocates what `memory_needed(0, segments, 0)` says.
    pub fn copying(segments: usize) -> Result<Self, TryReserveError> {
        Ok(Self {
            copy: true,
            ..Self::new(false, 0, segments, 0, 0)?
        })
    }

    /// Bytes `new` allocates.
    pub fn memory_needed(cache_capacity: usize, segments: usize, batch: usize) -> usize {
        GrantCache::memory_needed(cache_capacity)
            + (segments + MAX_INDIRECT_PAGES) * size_of::<SegmentMap>()
            + batch
                * (size_of::<MapRequest>()
                    + size_of::<MapTarget>()
                    + size_of::<Result<MappedGrant, RawGrantStatus>>()
                    + size_of::<MappedGrant>()
                    + size_of::<Result<(), RawGrantStatus>>())
    }

    pub fn persistent(&self) -> bool {
        self.persistent
    }

    /// Whether this ring copies its guest's data instead of mapping it (`copying`).
    pub fn copies(&self) -> bool {
        self.copy
    }

    /// Grants mapped right now, cached or transient (with those queued in the round's
    /// batch, which is mapped before the poll ends).
    pub fn mapped(&self) -> usize {
        self.cache.mapped() + self.transient_mapped
    }

    /// Grants mapped (or queued) for requests alone.
    pub fn in_flight(&self) -> usize {
        self.transient_mapped
    }

    /// The most grants one request maps for itself.
    pub fn request_maps(&self) -> usize {
        self.request_maps
    }

    /// Whether a request may be taken: the grants it may map, on top of those mapped for
    /// requests now, stay within the ring's limit.
    #[inline(always)]
    pub fn may_take_request(&self) -> bool {
        self.transient_mapped < self.take_below
    }

    /// Map at most `limit` grants for requests in flight from now on (those mapped
    /// already stay until their requests finish).
    pub fn set_in_flight_limit(&mut self, limit: usize) {
        self.in_flight_limit = limit;
        self.take_below = limit.saturating_add(1).saturating_sub(self.request_maps);
    }

    /// The most grants mapped for requests in flight now.
    pub fn in_flight_limit(&self) -> usize {
        self.in_flight_limit
    }

    /// Grants held in the persistent cache.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Grants mapped through the persistent cache.
    pub fn persistent_mapped(&self) -> usize {
        self.cache.mapped()
    }

    /// The most grants the cache takes now (the ring's share of the domain's budget).
    pub fn cache_limit(&self) -> usize {
        if self.persistent {
            self.cache.limit()
        } else {
            0
        }
    }

    /// Cache at most `limit` grants from now on; what is held beyond it goes with
    /// `evict_over_limit`.
    pub fn set_cache_limit(&mut self, limit: usize) {
        self.cache.set_limit(limit);
    }

    /// Whether a grant was mapped for its request alone because of the cache's limit
    /// since the last call.
    pub fn take_capped(&mut self) -> bool {
        core::mem::take(&mut self.capped)
    }

    /// Unmap with one call what `take` removes from the cache, given the room left in
    /// the unmap batch and where each mapping goes; returns how many it removed.
    fn unmap_from_cache<G: GrantOps>(
        &mut self,
        grants: &mut G,
        stats: &mut RingStats,
        take: impl FnOnce(&mut GrantCache, usize, &mut dyn FnMut(MappedGrant)) -> usize,
    ) -> usize {
        self.flush_unmaps(grants, stats);
        let room = self.unmaps.capacity() - self.unmaps.len();
        let unmaps = &mut self.unmaps;
        let taken = take(&mut self.cache, room, &mut |grant| unmaps.push(grant));
        self.flush_unmaps(grants, stats);
        taken
    }

    /// Unmap up to one unmap batch of unpinned cached grants, least recently used
    /// first, while the cache holds more than its limit. Returns how many went.
    pub fn evict_over_limit<G: GrantOps>(
        &mut self,
        grants: &mut G,
        stats: &mut RingStats,
    ) -> usize {
        if self.cache.over_limit() == 0 {
            return 0;
        }
        self.unmap_from_cache(grants, stats, |cache, room, unmapped| {
            cache.evict_over_limit(room, unmapped)
        })
    }

    /// Stamp grants unpinned from now on with `now` (ns); with `idle` > 0, unmap up to
    /// one unmap batch of cached grants unused for `idle` ns. Returns how many went.
    pub fn release_idle<G: GrantOps>(
        &mut self,
        now: u64,
        idle: u64,
        grants: &mut G,
        stats: &mut RingStats,
    ) -> usize {
        self.cache.set_clock(now);
        if idle == 0 || self.cache.is_empty() {
            return 0;
        }
        self.unmap_from_cache(grants, stats, |cache, room, unmapped| {
            cache.release_idle(now, idle, room, unmapped)
        })
    }

    /// The most grants the cache may hold.
    pub fn cache_capacity(&self) -> usize {
        if self.persistent {
            self.cache.capacity()
        } else {
            0
        }
    }

    /// The mappings of `segments`.
    pub fn maps(&self, segments: Range<usize>) -> &[SegmentMap] {
        &self.maps[segments]
    }

    /// Whether the map batch has no room for `count` more maps.
    pub fn batch_full(&self, count: usize) -> bool {
        self.requests.len() + count > self.requests.capacity()
    }

    /// Make room for `count` unmaps, flushing the unmap batch if needed.
    pub fn reserve_unmaps<G: GrantOps>(
        &mut self,
        count: usize,
        grants: &mut G,
        stats: &mut RingStats,
    ) {
        if self.unmaps.len() + count > self.unmaps.capacity() {
            self.flush_unmaps(grants, stats);
        }
    }

    /// Where indirect page `page` of the current request is mapped in `maps`.
    pub fn indirect_page(&self, page: usize) -> usize {
        self.indirect_pages + page
    }

    /// Look up or queue the map of the grant behind `maps[index]`, a data segment or an
    /// indirect page: from the persistent cache if it can (`acquire_cached`), else
    /// mapped for this request alone, writable if `writable`. The mapping is known at
    /// once on a hit on a mapped grant (returns true), else once the batch is mapped and
    /// `resolve` is called (false).
    // The transient path is inlined into the per-segment loops (with a plain `#[inline]`
    // the compiler kept all of `acquire` out of line, a call per segment with persistent
    // grants off); the cache's path stays one call, as inlining it too only added
    // instructions to the persistent path.
    #[inline(always)]
    pub fn acquire(&mut self, index: usize, gref: u32, writable: bool) -> bool {
        if self.persistent {
            return self.acquire_persistent(index, gref, writable);
        }
        if self.copy {
            self.maps[index] = SegmentMap {
                grant: MappedGrant {
                    handle: 0,
                    buffer: copy_buffer(gref),
                },
                cache_entry: NO_ENTRY,
                status: 0,
            };
            return true;
        }
        self.queue_transient(index, gref, writable);
        false
    }

    /// `acquire` with persistent grants: a cache hit or a new entry, else transient.
    #[inline]
    fn acquire_persistent(&mut self, index: usize, gref: u32, writable: bool) -> bool {
        if let Some(map) = self.acquire_cached(gref) {
            self.maps[index] = map;
            return map.status == 0;
        }
        self.queue_transient(index, gref, writable);
        false
    }

    /// Queue the map of `gref` for this request alone, its result for `maps[index]`.
    #[inline(always)]
    fn queue_transient(&mut self, index: usize, gref: u32, writable: bool) {
        self.requests.push(MapRequest { gref, writable });
        self.targets.push(MapTarget::Segment(index as u32));
        self.maps[index] = SegmentMap::pending(NO_ENTRY);
        self.transient_mapped += 1;
    }

    /// `gref`'s entry in the persistent cache, pinned: a hit (usually mapped already),
    /// or a new entry whose read-write map is queued (persistent grants are reused for
    /// both directions). `None` when the cache is at its limit (noted for
    /// `take_capped`) or the grant's last map failed: map it for this request alone.
    #[inline(always)]
    fn acquire_cached(&mut self, gref: u32) -> Option<SegmentMap> {
        match self.cache.acquire(gref) {
            CacheSlot::Hit(entry) => Some(match self.cache.grant(entry) {
                // No second look-up at resolve time.
                Ok(grant) => SegmentMap {
                    grant,
                    cache_entry: entry,
                    status: 0,
                },
                Err(_) => SegmentMap::pending(entry),
            }),
            CacheSlot::Inserted(entry) => {
                self.requests.push(MapRequest {
                    gref,
                    writable: true,
                });
                self.targets.push(MapTarget::Cache(entry));
                Some(SegmentMap::pending(entry))
            }
            CacheSlot::AtLimit => {
                self.capped = true;
                None
            }
            CacheSlot::Failed => None,
        }
    }

    /// Whether maps are queued in the batch.
    pub fn has_maps(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Unmap what is queued (so the number of mapped grants never exceeds the bound),
    /// then map the batch with one call and, in one pass over the results, resolve each
    /// cache entry and record each transient mapping.
    ///
    /// Returns whether every segment acquired since the last batch is now known
    /// (`status == 0` in `maps`): true when the batch held only transient maps and none
    /// failed, so `resolve` has nothing to fill in or report. A cache entry in the batch
    /// (segments that hit it while it was pending wait for `resolve` to copy its
    /// mapping) or any failure makes it false. A hit on a pending entry can only be on
    /// one inserted into this batch: entries are pending only between `acquire` and
    /// `map_batch`, and a failed one is never a hit (`CacheSlot::Failed`).
    pub fn map_batch<G: GrantOps>(&mut self, grants: &mut G, stats: &mut RingStats) -> bool {
        self.flush_unmaps(grants, stats);
        if self.requests.is_empty() {
            return true;
        }
        self.results.clear();
        self.results.resize(self.requests.len(), Err(MAP_PENDING));
        grants.map(&self.requests, &mut self.results);
        stats.map_batches += 1;
        let mut known = true;
        for (target, result) in self.targets.iter().zip(&self.results) {
            match (*target, *result) {
                (MapTarget::Cache(entry), result) => {
                    known = false;
                    if result.is_err() {
                        stats.grant_failures += 1;
                    }
                    self.cache.resolve(entry, result);
                }
                (MapTarget::Segment(index), Ok(grant)) => {
                    let map = &mut self.maps[index as usize];
                    map.grant = grant;
                    map.status = 0;
                }
                (MapTarget::Segment(index), Err(status)) => {
                    known = false;
                    stats.grant_failures += 1;
                    self.maps[index as usize].status = status;
                    // Counted when queued; nothing to release.
                    self.transient_mapped -= 1;
                }
            }
        }
        self.requests.clear();
        self.targets.clear();
        known
    }

    /// The mapping of `maps[index]` once its batch is mapped, or the status it failed
    /// with.
    pub fn resolve_one(&mut self, index: usize) -> Result<MappedGrant, RawGrantStatus> {
        resolve_map(&self.cache, &mut self.maps[index])
    }

    /// Fill in the mapping of each segment in `segments`; the first failure, if any.
    pub fn resolve(&mut self, segments: Range<usize>) -> Result<(), RawGrantStatus> {
        let mut outcome = Ok(());
        for map in &mut self.maps[segments] {
            if map.status == 0 {
                continue;
            }
            if let Err(status) = resolve_map(&self.cache, map) {
                outcome = outcome.and(Err(status));
            }
        }
        outcome
    }

    /// Give back the grants of `maps[indices]`: cached ones are unpinned, transient ones
    /// queued for the unmap batch (which must have room for them).
    #[inline(always)]
    pub fn release(&mut self, indices: Range<usize>) {
        if self.copy {
            // Nothing was mapped.
            return;
        }
        for map in &self.maps[indices] {
            if map.cache_entry != NO_ENTRY {
                self.cache.release(map.cache_entry);
            } else if map.status == 0 {
                self.unmaps.push(map.grant);
                self.transient_mapped -= 1;
            }
        }
    }

    /// Unmap everything queued, with one call.
    pub fn flush_unmaps<G: GrantOps>(&mut self, grants: &mut G, stats: &mut RingStats) {
        if self.unmaps.is_empty() {
            return;
        }
        self.unmap_results.clear();
        self.unmap_results.resize(self.unmaps.len(), Ok(()));
        grants.unmap(&self.unmaps, &mut self.unmap_results);
        stats.unmap_batches += 1;
        let failures = self.unmap_results.iter().filter(|r| r.is_err()).count();
        if failures > 0 {
            stats.grant_failures += failures as u64;
            log::error!("blkback: {} grant unmaps failed", failures);
        }
        self.unmaps.clear();
    }

    /// Empty the persistent cache (teardown, nothing in flight).
    pub fn unmap_all<G: GrantOps>(&mut self, grants: &mut G, stats: &mut RingStats) {
        while !self.cache.is_empty() {
            let room = self.unmaps.capacity() - self.unmaps.len();
            let unmaps = &mut self.unmaps;
            self.cache
                .drain_oldest(room, &mut |grant| unmaps.push(grant));
            self.flush_unmaps(grants, stats);
        }
        self.flush_unmaps(grants, stats);
    }
}

/// The mapping behind `map` once its batch is mapped (filled in from the cache if need
/// be), or the status it failed with.
fn resolve_map(cache: &GrantCache, map: &mut SegmentMap) -> Result<MappedGrant, RawGrantStatus> {
    if map.status != 0 {
        if map.cache_entry == NO_ENTRY {
            return Err(map.status);
        }
        map.grant = cache.grant(map.cache_entry)?;
        map.status = 0;
    }
    Ok(map.grant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{GrantTable, GuestMemory, XenGrants};
    use xen::abi::grant_table::GNTST_GENERAL_ERROR;

    /// Grants 1..=3 over pages 0..3 (maps of grant 3 fail), and a mapper over them
    /// with 4 segments, persistent grants (a cache of 4) or not.
    fn rig(
        persistent: bool,
    ) -> (
        std::sync::Arc<GrantTable>,
        XenGrants,
        RingStats,
        GrantMapper,
    ) {
        let table = GrantTable::new(GuestMemory::new(3));
        for gref in 1..=3 {
            table.grant(gref, gref as usize - 1, false);
        }
        table.fail_maps_of(3);
        let mapper = GrantMapper::new(persistent, 4, 4, 8, 2).unwrap();
        (
            table.clone(),
            XenGrants(table),
            RingStats::default(),
            mapper,
        )
    }

    #[test]
    fn a_batch_is_known_only_when_its_maps_are_all_transient_and_all_succeeded() {
        let (table, mut grants, mut stats, mut mapper) = rig(false);
        assert!(!mapper.acquire(0, 1, true));
        assert!(!mapper.acquire(1, 2, false));
        assert!(mapper.map_batch(&mut grants, &mut stats));
        // Known means filled in: nothing left for `resolve`.
        assert!(mapper.maps(0..2).iter().all(|map| map.status == 0));
        assert_eq!(mapper.resolve(0..2), Ok(()));
        assert_eq!(table.live_mappings().0, 2);
        // One failure in the batch: not known, and `resolve` reports it.
        assert!(!mapper.acquire(2, 1, true));
        assert!(!mapper.acquire(3, 3, true));
        assert!(!mapper.map_batch(&mut grants, &mut stats));
        assert_eq!(mapper.resolve(2..3), Ok(()));
        assert_eq!(mapper.resolve(2..4), Err(GNTST_GENERAL_ERROR));
        assert_eq!(stats.grant_failures, 1);
        mapper.release(0..4);
        mapper.flush_unmaps(&mut grants, &mut stats);
        assert_eq!(table.live_mappings().0, 0);
        assert_eq!(mapper.mapped(), 0);
    }

    #[test]
    fn grants_in_flight_count_from_their_queueing_and_bound_the_requests_taken() {
        // Requests of up to 2 grants, at most 3 mapped.
        let (table, mut grants, mut stats, mut mapper) = rig(false);
        assert!(mapper.may_take_request(), "no limit until one is set");
        mapper.set_in_flight_limit(3);
        assert!(mapper.may_take_request());
        assert!(!mapper.acquire(0, 1, true));
        // Queued is counted: the round's batch is not mapped yet.
        assert_eq!((mapper.in_flight(), table.live_mappings().0), (1, 0));
        assert!(mapper.may_take_request(), "1 + 2 <= 3");
        assert!(!mapper.acquire(1, 3, true));
        assert!(!mapper.may_take_request(), "2 + 2 > 3");
        // Grant 3 does not map: it no longer counts.
        assert!(!mapper.map_batch(&mut grants, &mut stats));
        assert_eq!((mapper.in_flight(), table.live_mappings().0), (1, 1));
        assert!(mapper.may_take_request());
        mapper.release(0..2);
        assert_eq!(mapper.in_flight(), 0);
        // A limit below one request's grants takes none.
        mapper.set_in_flight_limit(1);
        assert!(!mapper.may_take_request());
        assert_eq!(mapper.in_flight_limit(), 1);
        mapper.set_in_flight_limit(2);
        assert!(mapper.may_take_request());
        mapper.flush_unmaps(&mut grants, &mut stats);
        assert_eq!(table.live_mappings().0, 0);
    }

    #[test]
    fn a_batch_with_a_cache_entry_is_not_known_until_resolved() {
        let (table, mut grants, mut stats, mut mapper) = rig(true);
        // A new entry, and a hit on it while it is pending: both wait for `resolve`.
        assert!(!mapper.acquire(0, 1, true));
        assert!(!mapper.acquire(1, 1, true));
        assert!(mapper.maps(0..2).iter().all(|map| map.status != 0));
        assert!(!mapper.map_batch(&mut grants, &mut stats));
        assert_eq!(mapper.resolve(0..2), Ok(()));
        let [first, second] = [mapper.maps(0..1)[0], mapper.maps(1..2)[0]];
        assert_eq!((first.status, second.status), (0, 0));
        assert_eq!(first.grant.buffer, second.grant.buffer);
        mapper.release(0..2);
        mapper.unmap_all(&mut grants, &mut stats);
        assert_eq!(table.live_mappings().0, 0);
    }
}
