//! Grant mapping: the trait over Xen's `GNTTABOP_map_grant_ref`/`unmap_grant_ref` and the
//! bounded cache of persistently mapped grants.

use alloc::vec::Vec;
use blkdev::BufferAccess;

/// `GNTST_*` status of one grant operation (0 is success).
pub type GrantStatus = i16;

/// `GNTST_general_error`.
pub const GNTST_GENERAL_ERROR: GrantStatus = -1;
/// `GNTST_bad_gntref`.
pub const GNTST_BAD_GNTREF: GrantStatus = -3;
/// `GNTST_permission_denied`.
pub const GNTST_PERMISSION_DENIED: GrantStatus = -8;

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
    fn map(&mut self, requests: &[MapRequest], results: &mut [Result<MappedGrant, GrantStatus>]);
    /// Unmap `grants`; `results[i]` receives the outcome of `grants[i]`.
    fn unmap(&mut self, grants: &[MappedGrant], results: &mut [Result<(), GrantStatus>]);
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryState {
    Free,
    /// Inserted, map requested but not done yet.
    Pending,
    Mapped(MappedGrant),
    /// The map failed; removed once nobody pins it.
    Failed(GrantStatus),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    gref: u32,
    state: EntryState,
    pins: u32,
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
    /// Full of pinned entries: map this one transiently.
    Full,
}

/// Persistently mapped grants of one ring: a fixed-size hash table (linear probing)
/// plus an LRU list, all allocated at creation. At most `capacity` grants are ever held;
/// an entry pinned by an in-flight request is never evicted.
///
/// The LRU list (intrusive, doubly linked by slot index) holds only unpinned, mapped
/// entries: an entry leaves it when pinned and goes back as the newest when its last
/// pin is dropped. The victim of an eviction is therefore always the list's oldest
/// entry, O(1) however many entries in-flight requests pin.
#[derive(Debug)]
pub struct GrantCache {
    entries: Vec<Entry>,
    /// Entry index + 1, or 0 for an empty bucket.
    buckets: Vec<u32>,
    free_head: u32,
    newest: u32,
    oldest: u32,
    len: usize,
    mapped: usize,
    pinned: usize,
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
            + (capacity * 2).next_power_of_two() * core::mem::size_of::<u32>()
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
                newer: NIL,
                older: next,
            });
        }
        Ok(Self {
            entries,
            buckets: crate::fallible::vec(0, (capacity * 2).next_power_of_two())?,
            free_head: 0,
            newest: NIL,
            oldest: NIL,
            len: 0,
            mapped: 0,
            pinned: 0,
            #[cfg(test)]
            eviction_visits: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.entries.len()
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

    /// Find or insert `gref` and pin it. Eviction of an unpinned, least recently used
    /// entry hands its mapping to `evicted` for unmapping.
    pub fn acquire(&mut self, gref: u32, evicted: &mut dyn FnMut(MappedGrant)) -> CacheSlot {
        if let Some(bucket) = self.find(gref) {
            let index = self.buckets[bucket] - 1;
            if !matches!(self.entries[index as usize].state, EntryState::Failed(_)) {
                self.pin(index);
                return CacheSlot::Hit(index);
            }
            return CacheSlot::Full;
        }
        if self.free_head == NIL {
            // The oldest unpinned entry: pinned ones are not on the list.
            let victim = self.oldest;
            #[cfg(test)]
            {
                self.eviction_visits += 1;
            }
            if victim == NIL {
                return CacheSlot::Full;
            }
            debug_assert_eq!(self.entries[victim as usize].pins, 0);
            if let Some(grant) = self.remove(victim) {
                evicted(grant);
            }
        }
        let index = self.free_head;
        self.free_head = self.entries[index as usize].older;
        self.entries[index as usize] = Entry {
            gref,
            state: EntryState::Pending,
            pins: 1,
            newer: NIL,
            older: NIL,
        };
        self.pinned += 1;
        let mask = self.buckets.len() - 1;
        let mut b = self.bucket_of(gref);
        while self.buckets[b] != 0 {
            b = (b + 1) & mask;
        }
        self.buckets[b] = index + 1;
        self.len += 1;
        CacheSlot::Inserted(index)
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
    pub fn resolve(&mut self, index: u32, result: Result<MappedGrant, GrantStatus>) {
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
    pub fn grant(&self, index: u32) -> Result<MappedGrant, GrantStatus> {
        match self.entries[index as usize].state {
            EntryState::Mapped(grant) => Ok(grant),
            EntryState::Failed(status) => Err(status),
            EntryState::Pending | EntryState::Free => Err(crate::grant::GNTST_GENERAL_ERROR),
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

    fn grant(gref: u32) -> MappedGrant {
        MappedGrant {
            handle: gref,
            buffer: u64::from(gref) << 12,
        }
    }

    fn acquire_mapped(cache: &mut GrantCache, gref: u32, evicted: &mut Vec<MappedGrant>) -> u32 {
        match cache.acquire(gref, &mut |g| evicted.push(g)) {
            CacheSlot::Inserted(i) => {
                cache.resolve(i, Ok(grant(gref)));
                i
            }
            CacheSlot::Hit(i) => i,
            CacheSlot::Full => panic!("cache full"),
        }
    }

    #[test]
    fn persistent_grant_bound_evicts_least_recently_used_unpinned() {
        let mut cache = GrantCache::new(4);
        let mut evicted = Vec::new();
        let pinned_first = acquire_mapped(&mut cache, 10, &mut evicted);
        for gref in [11, 12, 13] {
            let i = acquire_mapped(&mut cache, gref, &mut evicted);
            cache.release(i);
        }
        // Touch 11 so 12 becomes the least recently used unpinned entry.
        let i = acquire_mapped(&mut cache, 11, &mut evicted);
        cache.release(i);
        acquire_mapped(&mut cache, 14, &mut evicted);
        // 10 is older but pinned; 12 goes.
        assert_eq!(evicted, [grant(12)]);
        assert_eq!((cache.len(), cache.mapped()), (4, 4));
        assert_eq!(cache.grant(pinned_first), Ok(grant(10)));
        // Everything pinned: no eviction, the caller must map transiently.
        for gref in [11, 13] {
            acquire_mapped(&mut cache, gref, &mut evicted);
        }
        assert_eq!(cache.acquire(99, &mut |g| evicted.push(g)), CacheSlot::Full);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.pinned(), 4);
    }

    #[test]
    fn failed_maps_leave_with_their_last_pin_and_clear_unmaps_all() {
        let mut cache = GrantCache::new(8);
        let CacheSlot::Inserted(bad) = cache.acquire(5, &mut |_| ()) else {
            panic!()
        };
        let CacheSlot::Hit(again) = cache.acquire(5, &mut |_| ()) else {
            panic!()
        };
        assert_eq!(bad, again);
        cache.resolve(bad, Err(GNTST_BAD_GNTREF));
        assert_eq!(cache.grant(bad), Err(GNTST_BAD_GNTREF));
        cache.release(bad);
        assert_eq!(cache.len(), 1);
        cache.release(bad);
        assert!(cache.is_empty());
        let mut evicted = Vec::new();
        for gref in 0..8 {
            let i = acquire_mapped(&mut cache, gref * 1024, &mut evicted);
            cache.release(i);
        }
        let mut unmapped = Vec::new();
        cache.drain_oldest(usize::MAX, &mut |g| unmapped.push(g.handle));
        unmapped.sort();
        assert_eq!(unmapped, (0..8).map(|g| g * 1024).collect::<Vec<_>>());
        assert_eq!((cache.len(), cache.mapped()), (0, 0));
    }

    /// A frontend that keeps most of a full cache pinned (large in-flight requests)
    /// must not make every miss walk the pinned entries: eviction looks at one entry.
    #[test]
    fn eviction_is_constant_time_when_most_entries_are_pinned() {
        const CAPACITY: u32 = 32768;
        let mut cache = GrantCache::new(CAPACITY as usize);
        let mut evicted = Vec::new();
        // Oldest first: 32000 pinned entries, then 768 unpinned ones.
        for gref in 0..CAPACITY {
            let i = acquire_mapped(&mut cache, gref, &mut evicted);
            if gref >= 32000 {
                cache.release(i);
            }
        }
        assert_eq!((cache.len(), cache.pinned()), (32768, 32000));
        assert!(evicted.is_empty());
        // 512 misses, as one 512-segment indirect request brings.
        for gref in CAPACITY..CAPACITY + 512 {
            acquire_mapped(&mut cache, gref, &mut evicted);
        }
        assert_eq!(evicted, (32000..32512).map(grant).collect::<Vec<_>>());
        assert_eq!(
            cache.eviction_visits, 512,
            "one entry looked at per eviction"
        );
        // With every entry pinned a miss is refused without a walk as well.
        for gref in 32512..CAPACITY {
            acquire_mapped(&mut cache, gref, &mut evicted);
        }
        let before = cache.eviction_visits;
        assert_eq!(cache.acquire(u32::MAX - 1, &mut |_| ()), CacheSlot::Full);
        assert!(cache.eviction_visits - before <= 1);
        assert_eq!(cache.pinned(), CAPACITY as usize);
        // Teardown still finds the pinned entries.
        let mut unmapped = 0;
        cache.drain_oldest(usize::MAX, &mut |_| unmapped += 1);
        assert_eq!((unmapped, cache.len(), cache.pinned()), (32768, 0, 0));
    }

    #[test]
    fn table_survives_heavy_churn_with_colliding_keys() {
        let mut cache = GrantCache::new(16);
        let mut evicted = Vec::new();
        let mut model: std::collections::VecDeque<u32> = Default::default();
        for round in 0..5000u32 {
            let gref = (round * 7919) % 61 * 64;
            let i = acquire_mapped(&mut cache, gref, &mut evicted);
            assert_eq!(cache.grant(i), Ok(grant(gref)));
            cache.release(i);
            model.retain(|&g| g != gref);
            model.push_back(gref);
            if model.len() > 16 {
                let gone = model.pop_front().unwrap();
                assert_eq!(evicted.pop(), Some(grant(gone)));
            }
            assert!(evicted.is_empty());
            assert_eq!(cache.len(), model.len());
        }
    }
}
