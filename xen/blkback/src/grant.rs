// SPDX-License-Identifier: MIT OR Apache-2.0
//! Grant mapping: the trait over Xen's `GNTTABOP_map_grant_ref`/`unmap_grant_ref` and the
//! bounded cache of persistently mapped grants.

use alloc::vec::Vec;
use blkdev::BufferAccess;
use xen::abi::grant_table::{RawGrantStatus, GNTST_GENERAL_ERROR};

/// One page to map from the frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRequest {
    pub gref: u32,
    /// Map read-write (the device writes guest memory, or the grant is persistent).
    pub writable: bool,
}

/// A mapped grant: the handle for unmapping and the buffer id the device uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappedGrant {
    pub handle: u32,
    pub buffer: u64,
}

/// Batched grant operations against one frontend domain. Every entry gets its own
/// status: a batch may partly fail. Through [`BufferAccess`] the engine (and a CPU
/// device) reads and writes mapped pages by their `buffer` id.
pub trait GrantOps: BufferAccess {
    /// Map `requests`; `results[i]` receives the outcome of `requests[i]`.
    fn map(&mut self, requests: &[MapRequest], results: &mut [Result<MappedGrant, RawGrantStatus>]);
    /// Unmap `grants`; `results[i]` receives the outcome of `grants[i]`.
    fn unmap(&mut self, grants: &[MappedGrant], results: &mut [Result<(), RawGrantStatus>]);
}

/// The mark of a buffer id that names a grant instead of a mapping (`copy_buffer`): no
/// mapping's id has it (the kernel's are addresses in its map space, below 2^52).
const COPY_BUFFER: u64 = 1 << 63;

/// The buffer id of a data segment on a ring that copies its guest's data instead of
/// mapping it (`EngineConfig::grant_copy`): the grant itself, never mapped. The
/// `GrantOps`'s [`BufferAccess`] reads and writes it with grant copies and names it to
/// a bounce device as a `blkdev::ForeignPage`.
pub const fn copy_buffer(gref: u32) -> u64 {
    COPY_BUFFER | gref as u64
}

/// The grant a `copy_buffer` id names; `None` for any other buffer id.
pub const fn copied_grant(buffer: u64) -> Option<u32> {
    if buffer & !(u32::MAX as u64) == COPY_BUFFER {
        Some(buffer as u32)
    } else {
        None
    }
}

const NIL: u32 = u32::MAX;
/// Grant references below this are found by direct index rather than by hash: a guest's
/// grant table starts with a few frames of 512 references, and frontends reuse the low
/// ones they allocated at connect time (16 KiB per ring that caches grants).
pub const DIRECT_GREFS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryState {
    Free,
    /// Inserted, map requested but not done yet.
    Pending,
    Mapped(MappedGrant),
    /// The map failed; removed once nobody pins it.
    Failed(RawGrantStatus),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    gref: u32,
    state: EntryState,
    pins: u32,
    /// The cache's clock when the last pin was dropped (ns; what idle release compares).
    last_used: u64,
    /// Neighbours on the LRU list of unpinned entries (towards most / least recently
    /// released); `older` doubles as the free-list link. A pinned entry is on no list.
    newer: u32,
    older: u32,
}

/// Result of looking up a grant for a new request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheSlot {
    /// Already in the cache (mapped or about to be); now pinned.
    Hit(u32),
    /// Newly inserted and pinned; the caller must map it and call `resolve`.
    Inserted(u32),
    /// The cache holds as many grants as its limit allows: map this one for its
    /// request alone (the cache keeps what it has; nothing is evicted to make room).
    AtLimit,
    /// An earlier map of this grant failed and a request still pins the failure: map
    /// this one for its request alone.
    Failed,
}

/// Persistently mapped grants of one ring: a table indexed by grant reference for the
/// small ones (`DIRECT_GREFS`), a fixed-size hash table (linear probing) for the rest,
/// plus an LRU list, all allocated at creation. At most `limit` grants are held (a
/// limit that moves with the ring's share of the domain's budget, never above
/// `capacity`); an entry pinned by an in-flight request is never evicted or released.
///
/// A full cache takes nothing new (`CacheSlot::AtLimit`, as Linux blkback maps what is
/// beyond `max_persistent_grants` per request): evicting to make room would turn a
/// frontend whose grants outnumber the limit into an unmap and a map per miss with no
/// hit left, where keeping the cached ones keeps their hits. Entries leave when the
/// limit drops below what is held (`evict_over_limit`), when unused for the idle
/// timeout (`release_idle`), or at teardown (`drain_oldest`).
///
/// The LRU list (intrusive, doubly linked by slot index) holds only unpinned, mapped
/// entries: an entry leaves it when pinned and goes back as the newest, stamped with
/// the cache's clock, when its last pin is dropped. The list is therefore ordered by
/// last use, and every victim is its oldest entry, O(1) however many entries in-flight
/// requests pin.
#[derive(Debug)]
pub struct GrantCache {
    entries: Vec<Entry>,
    /// By grant reference below its length: entry index + 1, or 0 for none.
    direct: Vec<u32>,
    /// Entry index + 1, or 0 for an empty bucket (grant references past `direct`).
    buckets: Vec<u32>,
    free_head: u32,
    newest: u32,
    oldest: u32,
    len: usize,
    mapped: usize,
    pinned: usize,
    /// The most entries held (at most `entries.len()`).
    limit: usize,
    /// The time (ns) stamped on entries whose last pin is dropped: the poller's clock,
    /// passed in with `set_clock`.
    clock: u64,
    /// Entries looked at while choosing eviction victims (tests bound it).
    #[cfg(test)]
    eviction_visits: u64,
}

impl GrantCache {
    pub fn new(capacity: usize) -> Self {
        Self::try_new(capacity).expect("grant cache allocation")
    }

    /// Bytes a cache of `capacity` entries allocates.
    pub fn memory_needed(capacity: usize) -> usize {
        let capacity = capacity.max(1);
        capacity * core::mem::size_of::<Entry>()
            + ((capacity * 2).next_power_of_two() + Self::direct_len(capacity))
                * core::mem::size_of::<u32>()
    }

    /// The direct table's length: none for a cache of one entry (what a ring without
    /// persistent grants gets as a placeholder).
    fn direct_len(capacity: usize) -> usize {
        if capacity > 1 {
            DIRECT_GREFS
        } else {
            0
        }
    }

    /// Like `new`, failing instead of aborting when the memory is not there.
    pub fn try_new(capacity: usize) -> Result<Self, alloc::collections::TryReserveError> {
        let capacity = capacity.max(1);
        let mut entries = crate::fallible::with_capacity(capacity)?;
        for i in 0..capacity {
            let next = if i + 1 < capacity { i as u32 + 1 } else { NIL };
            entries.push(Entry {
                gref: 0,
                state: EntryState::Free,
                pins: 0,
                last_used: 0,
                newer: NIL,
                older: next,
            });
        }
        Ok(Self {
            entries,
            direct: crate::fallible::vec(0, Self::direct_len(capacity))?,
            buckets: crate::fallible::vec(0, (capacity * 2).next_power_of_two())?,
            free_head: 0,
            newest: NIL,
            oldest: NIL,
            len: 0,
            mapped: 0,
            pinned: 0,
            limit: capacity,
            clock: 0,
            #[cfg(test)]
            eviction_visits: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// The most entries the cache takes now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Take at most `limit` entries from now on (at most the capacity). Lowering it
    /// below what is held evicts nothing by itself: see `evict_over_limit`.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.min(self.capacity());
    }

    /// Entries held beyond the limit.
    pub fn over_limit(&self) -> usize {
        self.len.saturating_sub(self.limit)
    }

    /// The time stamped on entries unpinned from now on (the caller's clock, ns).
    pub fn set_clock(&mut self, now: u64) {
        self.clock = now;
    }

    /// Entries held (mapped, pending or failed).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Grants currently mapped through the cache.
    pub fn mapped(&self) -> usize {
        self.mapped
    }

    fn bucket_of(&self, gref: u32) -> usize {
        (gref.wrapping_mul(0x9E37_79B1) as usize) & (self.buckets.len() - 1)
    }

    /// The entry holding `gref`.
    fn lookup(&self, gref: u32) -> Option<u32> {
        match self.direct.get(gref as usize) {
            Some(&slot) => slot.checked_sub(1),
            None => self.find(gref).map(|b| self.buckets[b] - 1),
        }
    }

    /// The hash bucket holding `gref` (one past the direct table).
    fn find(&self, gref: u32) -> Option<usize> {
        let mask = self.buckets.len() - 1;
        let mut b = self.bucket_of(gref);
        loop {
            match self.buckets[b] {
                0 => return None,
                slot if self.entries[slot as usize - 1].gref == gref => return Some(b),
                _ => b = (b + 1) & mask,
            }
        }
    }

    fn unlink(&mut self, index: u32) {
        let Entry { newer, older, .. } = self.entries[index as usize];
        match newer {
            NIL => self.newest = older,
            n => self.entries[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.entries[o as usize].newer = newer,
        }
    }

    fn push_newest(&mut self, index: u32) {
        let entry = &mut self.entries[index as usize];
        entry.newer = NIL;
        entry.older = self.newest;
        match self.newest {
            NIL => self.oldest = index,
            n => self.entries[n as usize].newer = index,
        }
        self.newest = index;
    }

    /// Remove entry `index` from table and list; returns its mapping if it had one.
    fn remove(&mut self, index: u32) -> Option<MappedGrant> {
        let gref = self.entries[index as usize].gref;
        if let Some(slot) = self.direct.get_mut(gref as usize) {
            *slot = 0;
        } else {
            self.remove_hashed(gref);
        }
        if self.entries[index as usize].pins == 0 {
            self.unlink(index);
        } else {
            self.pinned -= 1;
        }
        let entry = &mut self.entries[index as usize];
        let state = core::mem::replace(&mut entry.state, EntryState::Free);
        entry.pins = 0;
        entry.older = self.free_head;
        self.free_head = index;
        self.len -= 1;
        match state {
            EntryState::Mapped(grant) => {
                self.mapped -= 1;
                Some(grant)
            }
            _ => None,
        }
    }

    fn remove_hashed(&mut self, gref: u32) {
        let mut hole = self.find(gref).expect("cached entry is in the table");
        // Backward-shift deletion keeps every probe chain unbroken.
        let mask = self.buckets.len() - 1;
        let mut next = (hole + 1) & mask;
        while self.buckets[next] != 0 {
            let home = self.bucket_of(self.entries[self.buckets[next] as usize - 1].gref);
            if (next.wrapping_sub(home) & mask) >= (next.wrapping_sub(hole) & mask) {
                self.buckets[hole] = self.buckets[next];
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.buckets[hole] = 0;
    }

    /// Find or insert `gref` and pin it. Nothing is evicted: at the limit the caller
    /// maps the grant for its request alone.
    pub fn acquire(&mut self, gref: u32) -> CacheSlot {
        if let Some(index) = self.lookup(gref) {
            if !matches!(self.entries[index as usize].state, EntryState::Failed(_)) {
                self.pin(index);
                return CacheSlot::Hit(index);
            }
            return CacheSlot::Failed;
        }
        if self.len >= self.limit {
            return CacheSlot::AtLimit;
        }
        debug_assert_ne!(
            self.free_head, NIL,
            "below the limit, so below the capacity"
        );
        let index = self.free_head;
        self.free_head = self.entries[index as usize].older;
        self.entries[index as usize] = Entry {
            gref,
            state: EntryState::Pending,
            pins: 1,
            last_used: self.clock,
            newer: NIL,
            older: NIL,
        };
        self.pinned += 1;
        if let Some(slot) = self.direct.get_mut(gref as usize) {
            *slot = index + 1;
        } else {
            let mask = self.buckets.len() - 1;
            let mut b = self.bucket_of(gref);
            while self.buckets[b] != 0 {
                b = (b + 1) & mask;
            }
            self.buckets[b] = index + 1;
        }
        self.len += 1;
        CacheSlot::Inserted(index)
    }

    /// Remove the least recently used unpinned entry, handing its mapping to
    /// `unmapped`; false when every entry is pinned (or none is held).
    fn remove_oldest(&mut self, unmapped: &mut dyn FnMut(MappedGrant)) -> bool {
        let victim = self.oldest;
        #[cfg(test)]
        {
            self.eviction_visits += 1;
        }
        if victim == NIL {
            return false;
        }
        debug_assert_eq!(self.entries[victim as usize].pins, 0);
        if let Some(grant) = self.remove(victim) {
            unmapped(grant);
        }
        true
    }

    /// Remove up to `max` unpinned entries, least recently used first, while more are
    /// held than the limit allows; their mappings go to `unmapped`. Returns how many
    /// went. Pinned entries stay (their requests are in flight): the rest goes once
    /// they are unpinned, at a later call.
    pub fn evict_over_limit(&mut self, max: usize, unmapped: &mut dyn FnMut(MappedGrant)) -> usize {
        let mut evicted = 0;
        while evicted < max && self.len > self.limit && self.remove_oldest(unmapped) {
            evicted += 1;
        }
        evicted
    }

    /// Remove up to `max` unpinned entries unused for at least `idle` ns at `now`,
    /// oldest first, handing their mappings to `unmapped`; returns how many went. An
    /// entry pinned by an in-flight request is on no list and is never looked at.
    pub fn release_idle(
        &mut self,
        now: u64,
        idle: u64,
        max: usize,
        unmapped: &mut dyn FnMut(MappedGrant),
    ) -> usize {
        let mut released = 0;
        while released < max
            && self.oldest != NIL
            && now.saturating_sub(self.entries[self.oldest as usize].last_used) >= idle
            && self.remove_oldest(unmapped)
        {
            released += 1;
        }
        released
    }

    /// Pin a held entry, taking it off the LRU list if it was unpinned.
    fn pin(&mut self, index: u32) {
        if self.entries[index as usize].pins == 0 {
            self.unlink(index);
            self.pinned += 1;
        }
        self.entries[index as usize].pins += 1;
    }

    /// Record the outcome of mapping an inserted entry.
    pub fn resolve(&mut self, index: u32, result: Result<MappedGrant, RawGrantStatus>) {
        let entry = &mut self.entries[index as usize];
        debug_assert_eq!(entry.state, EntryState::Pending);
        entry.state = match result {
            Ok(grant) => {
                self.mapped += 1;
                EntryState::Mapped(grant)
            }
            Err(status) => EntryState::Failed(status),
        };
    }

    /// The mapping behind a pinned entry, or the status its map failed with.
    pub fn grant(&self, index: u32) -> Result<MappedGrant, RawGrantStatus> {
        match self.entries[index as usize].state {
            EntryState::Mapped(grant) => Ok(grant),
            EntryState::Failed(status) => Err(status),
            EntryState::Pending | EntryState::Free => Err(GNTST_GENERAL_ERROR),
        }
    }

    /// Drop one pin; an entry whose map failed goes away with its last pin, a mapped
    /// one becomes the newest unpinned entry.
    pub fn release(&mut self, index: u32) {
        let entry = &mut self.entries[index as usize];
        debug_assert!(entry.pins > 0);
        entry.pins -= 1;
        if entry.pins != 0 {
            return;
        }
        match entry.state {
            EntryState::Failed(_) => {
                // Still counted as pinned until `remove` takes it out.
                entry.pins = 1;
                self.remove(index);
            }
            _ => {
                entry.last_used = self.clock;
                self.pinned -= 1;
                self.push_newest(index);
            }
        }
    }

    /// Entries pinned by in-flight requests.
    pub fn pinned(&self) -> usize {
        self.pinned
    }

    /// Remove up to `max` entries, oldest first, handing their mappings to `unmapped`
    /// (teardown). Pinned entries go too (after the unpinned ones): call only with
    /// nothing in flight.
    pub fn drain_oldest(&mut self, max: usize, unmapped: &mut dyn FnMut(MappedGrant)) {
        let mut next_pinned = 0;
        for _ in 0..max {
            let index = if self.oldest != NIL {
                self.oldest
            } else if self.pinned > 0 {
                while self.entries[next_pinned].pins == 0 {
                    next_pinned += 1;
                }
                next_pinned as u32
            } else {
                return;
            };
            if let Some(grant) = self.remove(index) {
                unmapped(grant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xen::abi::grant_table::GNTST_BAD_GNTREF;

    fn grant(gref: u32) -> MappedGrant {
        MappedGrant {
            handle: gref,
            buffer: u64::from(gref) << 12,
        }
    }

    fn acquire_mapped(cache: &mut GrantCache, gref: u32) -> u32 {
        match cache.acquire(gref) {
            CacheSlot::Inserted(i) => {
                cache.resolve(i, Ok(grant(gref)));
                i
            }
            CacheSlot::Hit(i) => i,
            other => panic!("gref {gref}: {other:?}"),
        }
    }

    #[test]
    fn a_full_cache_keeps_what_it_holds_and_takes_nothing_new() {
        let mut cache = GrantCache::new(4);
        let pinned_first = acquire_mapped(&mut cache, 10);
        for gref in [11, 12, 13] {
            let i = acquire_mapped(&mut cache, gref);
            cache.release(i);
        }
        // Full: a new grant is not cached (its request maps it alone), nothing evicted.
        assert_eq!(cache.acquire(14), CacheSlot::AtLimit);
        assert_eq!((cache.len(), cache.mapped()), (4, 4));
        assert_eq!(cache.grant(pinned_first), Ok(grant(10)));
        // Held grants still hit.
        assert!(matches!(cache.acquire(12), CacheSlot::Hit(_)));
        assert_eq!(cache.pinned(), 2);
    }

    #[test]
    fn a_lower_limit_evicts_least_recently_used_unpinned_entries_only() {
        let mut cache = GrantCache::new(8);
        let pinned = acquire_mapped(&mut cache, 10);
        for gref in [11, 12, 13, 14, 15] {
            let i = acquire_mapped(&mut cache, gref);
            cache.release(i);
        }
        // Touch 11: 12 becomes the least recently used.
        let i = acquire_mapped(&mut cache, 11);
        cache.release(i);
        cache.set_limit(3);
        assert_eq!(cache.over_limit(), 3);
        assert_eq!(cache.acquire(99), CacheSlot::AtLimit);
        let mut evicted = Vec::new();
        // Bounded: at most two this call.
        assert_eq!(cache.evict_over_limit(2, &mut |g| evicted.push(g)), 2);
        assert_eq!(evicted, [grant(12), grant(13)]);
        assert_eq!(cache.evict_over_limit(8, &mut |g| evicted.push(g)), 1);
        assert_eq!(evicted, [grant(12), grant(13), grant(14)]);
        assert_eq!((cache.len(), cache.over_limit()), (3, 0));
        // 10 is the oldest but pinned: it stays, and nothing more goes.
        assert_eq!(cache.evict_over_limit(8, &mut |g| evicted.push(g)), 0);
        assert_eq!(cache.grant(pinned), Ok(grant(10)));
        // Everything pinned and over the limit: nothing can go until a pin is dropped.
        cache.set_limit(1);
        let others: Vec<u32> = [11, 15]
            .iter()
            .map(|&g| acquire_mapped(&mut cache, g))
            .collect();
        assert_eq!(cache.evict_over_limit(8, &mut |g| evicted.push(g)), 0);
        cache.release(others[1]);
        assert_eq!(cache.evict_over_limit(8, &mut |g| evicted.push(g)), 1);
        assert_eq!(evicted.last(), Some(&grant(15)));
        // The limit never exceeds the capacity.
        cache.set_limit(1000);
        assert_eq!(cache.limit(), 8);
    }

    #[test]
    fn idle_release_takes_entries_unused_for_the_timeout_and_never_pinned_ones() {
        let mut cache = GrantCache::new(8);
        cache.set_clock(1_000);
        for gref in [1, 2] {
            let i = acquire_mapped(&mut cache, gref);
            cache.release(i);
        }
        // 3 is used at 1_000 and pinned again later: its old stamp must not count.
        let three = acquire_mapped(&mut cache, 3);
        cache.release(three);
        cache.set_clock(5_000);
        let i = acquire_mapped(&mut cache, 4);
        cache.release(i);
        assert_eq!(acquire_mapped(&mut cache, 3), three);
        let mut released = Vec::new();
        // Not yet: 1 and 2 were last used 9_999 ns before.
        assert_eq!(
            cache.release_idle(10_999, 10_000, 8, &mut |g| released.push(g)),
            0
        );
        // Exactly the timeout: 1 and 2 go (bounded to one per call), 3 is pinned.
        assert_eq!(
            cache.release_idle(11_000, 10_000, 1, &mut |g| released.push(g)),
            1
        );
        assert_eq!(
            cache.release_idle(11_000, 10_000, 8, &mut |g| released.push(g)),
            1
        );
        assert_eq!(released, [grant(1), grant(2)]);
        assert_eq!(
            cache.release_idle(u64::MAX, 10_000, 8, &mut |g| released.push(g)),
            1
        );
        assert_eq!(released.last(), Some(&grant(4)));
        assert_eq!((cache.len(), cache.pinned()), (1, 1));
        assert_eq!(cache.grant(three), Ok(grant(3)));
        // Unpinned at 20_000: idle from then on.
        cache.set_clock(20_000);
        cache.release(three);
        assert_eq!(
            cache.release_idle(29_999, 10_000, 8, &mut |g| released.push(g)),
            0
        );
        assert_eq!(
            cache.release_idle(30_000, 10_000, 8, &mut |g| released.push(g)),
            1
        );
        assert!(cache.is_empty());
    }

    #[test]
    fn failed_maps_leave_with_their_last_pin_and_clear_unmaps_all() {
        let mut cache = GrantCache::new(8);
        let CacheSlot::Inserted(bad) = cache.acquire(5) else {
            panic!()
        };
        let CacheSlot::Hit(again) = cache.acquire(5) else {
            panic!()
        };
        assert_eq!(bad, again);
        cache.resolve(bad, Err(GNTST_BAD_GNTREF));
        assert_eq!(cache.grant(bad), Err(GNTST_BAD_GNTREF));
        assert_eq!(cache.acquire(5), CacheSlot::Failed);
        cache.release(bad);
        assert_eq!(cache.len(), 1);
        cache.release(bad);
        assert!(cache.is_empty());
        for gref in 0..8 {
            let i = acquire_mapped(&mut cache, gref * 1024);
            cache.release(i);
        }
        let mut unmapped = Vec::new();
        cache.drain_oldest(usize::MAX, &mut |g| unmapped.push(g.handle));
        unmapped.sort();
        assert_eq!(unmapped, (0..8).map(|g| g * 1024).collect::<Vec<_>>());
        assert_eq!((cache.len(), cache.mapped()), (0, 0));
    }

    /// A frontend that keeps most of a full cache pinned (large in-flight requests)
    /// must not make every eviction walk the pinned entries: each looks at one entry.
    #[test]
    fn eviction_is_constant_time_when_most_entries_are_pinned() {
        const CAPACITY: u32 = 32768;
        let mut cache = GrantCache::new(CAPACITY as usize);
        // Oldest first: 32000 pinned entries, then 768 unpinned ones.
        for gref in 0..CAPACITY {
            let i = acquire_mapped(&mut cache, gref);
            if gref >= 32000 {
                cache.release(i);
            }
        }
        assert_eq!((cache.len(), cache.pinned()), (32768, 32000));
        // The ring's share drops by 512 (a 512-segment request's worth).
        cache.set_limit(CAPACITY as usize - 512);
        let mut evicted = Vec::new();
        assert_eq!(
            cache.evict_over_limit(usize::MAX, &mut |g| evicted.push(g)),
            512
        );
        assert_eq!(evicted, (32000..32512).map(grant).collect::<Vec<_>>());
        assert_eq!(
            cache.eviction_visits, 512,
            "one entry looked at per eviction"
        );
        // With every entry pinned an eviction gives up without a walk as well.
        for gref in 32512..CAPACITY {
            acquire_mapped(&mut cache, gref);
        }
        cache.set_limit(0);
        let before = cache.eviction_visits;
        assert_eq!(cache.evict_over_limit(usize::MAX, &mut |_| ()), 0);
        assert!(cache.eviction_visits - before <= 1);
        assert_eq!(cache.release_idle(u64::MAX, 0, usize::MAX, &mut |_| ()), 0);
        assert!(cache.eviction_visits - before <= 2);
        assert_eq!(cache.pinned(), CAPACITY as usize - 512);
        // Teardown still finds the pinned entries.
        let mut unmapped = 0;
        cache.drain_oldest(usize::MAX, &mut |_| unmapped += 1);
        assert_eq!((unmapped, cache.len(), cache.pinned()), (32256, 0, 0));
    }

    #[test]
    fn table_survives_heavy_churn_with_colliding_keys() {
        // Keys below `DIRECT_GREFS` (direct table), above it (hash table, colliding),
        // and both mixed.
        let direct = DIRECT_GREFS as u32;
        for key in [
            |k: u32| k,
            |k: u32| k + DIRECT_GREFS as u32,
            |k: u32| {
                if k.is_multiple_of(128) {
                    k
                } else {
                    k + DIRECT_GREFS as u32
                }
            },
        ] {
            churn(key);
        }
        // The boundary itself.
        let mut cache = GrantCache::new(4);
        for gref in [direct - 1, direct, direct + 1, u32::MAX] {
            let i = acquire_mapped(&mut cache, gref);
            assert_eq!(cache.grant(i), Ok(grant(gref)));
            assert_eq!(cache.acquire(gref), CacheSlot::Hit(i));
            cache.release(i);
            cache.release(i);
        }
        assert_eq!(cache.len(), 4);
        let mut unmapped = Vec::new();
        cache.drain_oldest(usize::MAX, &mut |g| unmapped.push(g.handle));
        assert_eq!(unmapped, [direct - 1, direct, direct + 1, u32::MAX]);
        assert!(cache.lookup(direct).is_none() && cache.lookup(direct - 1).is_none());
    }

    fn churn(key: fn(u32) -> u32) {
        let mut cache = GrantCache::new(16);
        let mut evicted = Vec::new();
        let mut model: std::collections::VecDeque<u32> = Default::default();
        for round in 0..5000u32 {
            let gref = key((round * 7919) % 61 * 64);
            // Make room the way a shrinking share does: the least recently used goes.
            if !model.contains(&gref) && model.len() == 16 {
                cache.set_limit(15);
                assert_eq!(cache.evict_over_limit(1, &mut |g| evicted.push(g)), 1);
                cache.set_limit(16);
                let gone = model.pop_front().unwrap();
                assert_eq!(evicted.pop(), Some(grant(gone)));
            }
            let i = acquire_mapped(&mut cache, gref);
            assert_eq!(cache.grant(i), Ok(grant(gref)));
            cache.release(i);
            model.retain(|&g| g != gref);
            model.push_back(gref);
            assert!(evicted.is_empty());
            assert_eq!(cache.len(), model.len());
        }
    }
}
