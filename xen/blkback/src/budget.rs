// SPDX-License-Identifier: MIT OR Apache-2.0
//! One budget for the grants blkdom maps, shared fairly between its rings: the grants
//! the rings' caches keep mapped (persistent grants) and the grants mapped for requests
//! in flight.
//!
//! Every grant blkdom maps takes a handle of its own maptrack table in Xen (by default
//! 1024 frames of 256 entries: 262,144 handles for the whole domain); when it is full,
//! every map fails, whichever guest it is for. The control path owns a [`GrantBudget`]:
//! when a ring connects or goes it recomputes every ring's shares and publishes them in
//! the ring's [`GrantShare`], one atomic word the ring's own poller reads at each poll.
//! The I/O path takes no lock.
//!
//! - **Persistent grants** stay mapped after their request, so without a bound a few
//!   rings could hold most of the maptrack. Each ring that caches grants may keep
//!   `min(max_per_ring, max_total / rings)`; a ring above its cap evicts unpinned grants
//!   down to it at its next poll, and a ring at its cap maps the grants beyond it per
//!   request, as if the frontend had no persistent grants.
//! - **Grants of requests in flight** (without persistent grants, beyond a cache's cap,
//!   indirect pages not cached) are mapped for one request and unmapped before it is
//!   answered. All rings together may have [`InFlightLimits::total`] of them mapped.
//!   The budget is credit: the domain's pool (an atomic counter) holds what no ring
//!   holds, and each ring's engine holds its part in an [`InFlightCredit`] of its own.
//!   A ring maps for a new request only while what it has mapped leaves room, within
//!   what it holds, for the largest request it may send; otherwise the requests wait in
//!   its ring (taken once its own requests finish, never answered with an error). So
//!   the per-request check reads two numbers of the ring's own, and the rings together
//!   never have more mapped than the total. Credit moves only when a ring's target
//!   (an equal part of the total, at most what its region and its slots can use)
//!   changes: at its next poll a ring above its target gives back what it does not use
//!   (the rest as its requests finish; it takes no new ones until it is below), a ring
//!   below takes what the pool has. The pool keeps [`InFlightLimits::reserve`] for
//!   rings that hold less than one request's worth, so a ring that connects serves a
//!   request at once whatever the others hold (unless another that just connected took
//!   the reserve first: it is refilled by the next credit given back). A ring joins
//!   only if its target would leave room for one of its largest requests (otherwise
//!   its connection is refused).

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The domain's grant limits (kernel command line `grants.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantLimits {
    /// Persistent grants all rings together may keep mapped (`grants.max-total`).
    pub max_total: u32,
    /// Persistent grants one ring may keep mapped (`grants.max-per-ring`); also what its
    /// cache is sized for at connect.
    pub max_per_ring: u32,
    /// Seconds a persistent grant may stay mapped unused (`grants.idle-s`; 0: forever).
    pub idle_secs: u32,
}

impl GrantLimits {
    /// A quarter of Xen's default maptrack (262,144 handles per domain): 256 MiB of
    /// guest pages held by caches. Half goes to the grants of requests in flight
    /// ([`InFlightLimits::DEFAULT`]), and a quarter stays for ring pages.
    pub const DEFAULT_MAX_TOTAL: u32 = 65_536;
    /// Eight times Linux blkback's `max_persistent_grants` (1,056 = 32 slots x (32
    /// segments + 1 indirect page)): a ring of 32 requests of 256 segments each holds
    /// 32 x 257 = 8,224 grants, so blkfront's common large-request setting keeps every
    /// grant cached; eight such rings fill the default total.
    pub const DEFAULT_MAX_PER_RING: u32 = 8_448;
    /// As Linux blkback's `persistent_grant_unused_seconds`.
    pub const DEFAULT_IDLE_SECS: u32 = 60;
    /// Sixteen times Xen's default maptrack: more is surely a typo.
    pub const MAX_TOTAL_LIMIT: u32 = 1 << 22;
    /// Half of a ring's map region (32,768 pages): the other half stays for the grants
    /// of requests in flight, mapped per request ([`InFlightLimits::per_ring`]).
    pub const MAX_PER_RING_LIMIT: u32 = 16_384;
    /// A day.
    pub const MAX_IDLE_SECS: u32 = 86_400;

    pub const DEFAULT: GrantLimits = GrantLimits {
        max_total: Self::DEFAULT_MAX_TOTAL,
        max_per_ring: Self::DEFAULT_MAX_PER_RING,
        idle_secs: Self::DEFAULT_IDLE_SECS,
    };

    /// The cap of each of `rings` rings that cache grants: an equal share of the total,
    /// at most `max_per_ring`. The caps of all rings never add up to more than the total.
    pub fn share(&self, rings: usize) -> u32 {
        let rings = u32::try_from(rings.max(1)).unwrap_or(u32::MAX);
        (self.max_total / rings).min(self.max_per_ring)
    }

    /// The idle timeout in ns (0: never).
    pub fn idle_ns(&self) -> u64 {
        u64::from(self.idle_secs) * 1_000_000_000
    }
}

impl Default for GrantLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The bound on grants mapped for requests in flight. Fixed (no command-line key): a
/// share of Xen's default maptrack, like `grants.max-total`'s default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlightLimits {
    /// What all rings together may have mapped for their requests in flight.
    pub total: u32,
    /// What one ring may have mapped: what its map region has room for beside the most
    /// its cache may hold.
    pub per_ring: u32,
    /// Kept in the pool for rings that hold less than one request's worth (one largest
    /// request), so a ring that connects is served at once.
    pub reserve: u32,
}

impl InFlightLimits {
    pub const DEFAULT: InFlightLimits = InFlightLimits {
        // Half of Xen's default maptrack: with `grants.max-total`'s default a quarter
        // stays for ring pages (16 per ring at most) and the domain's other mappings.
        total: 131_072,
        // Up to 7 rings each get all of it: a ring of 512-segment requests then has 32
        // of them in flight.
        per_ring: GrantLimits::MAX_PER_RING_LIMIT,
        reserve: crate::abi::MAX_INDIRECT_SEGMENTS as u32,
    };

    /// Each of `rings` rings' share: an equal part of the total less the reserve, at
    /// most `per_ring`.
    pub fn share(&self, rings: usize) -> u32 {
        let rings = u32::try_from(rings.max(1)).unwrap_or(u32::MAX);
        (self.total.saturating_sub(self.reserve) / rings).min(self.per_ring)
    }
}

impl Default for InFlightLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a ring needs of the budget (`Engine::grant_demand`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingDemand {
    /// It caches grants (`feature-persistent`): it shares the persistent total.
    pub persistent: bool,
    /// The most grants one request maps for itself (its segments, at most as many as the
    /// ring advertised): with less than this in hand the ring takes no request.
    pub request_maps: u32,
    /// The most its requests could have mapped at once (slots x `request_maps`): it is
    /// never given more.
    pub ring_maps: u32,
}

impl RingDemand {
    /// Whether the ring maps grants at all (one that copies its guest's data maps none).
    pub fn maps(&self) -> bool {
        self.persistent || self.ring_maps > 0
    }
}

/// The domain's credit for grants of requests in flight that no ring holds.
#[derive(Debug)]
struct Pool {
    free: AtomicU32,
    reserve: u32,
}

/// One ring's shares, written by the control path and read by the ring's poller.
#[derive(Clone, Debug)]
pub struct GrantShare {
    /// The cache's cap (low half) and the target for grants in flight (high half): one
    /// word, so the poller reads both with one load.
    caps: Arc<AtomicU64>,
    /// Where the ring takes its credit for grants in flight from; `None`: a share
    /// outside any budget, with no bound on them.
    pool: Option<Arc<Pool>>,
}

const fn pack(cap: u32, in_flight: u32) -> u64 {
    (in_flight as u64) << 32 | cap as u64
}

impl GrantShare {
    /// A share of its own (not part of any budget): a cache cap of `cap`, and no bound
    /// on grants in flight.
    pub fn fixed(cap: u32) -> Self {
        GrantShare {
            caps: Arc::new(AtomicU64::new(pack(cap, u32::MAX))),
            pool: None,
        }
    }

    /// The cache's cap and the target for grants in flight, as published now.
    #[inline]
    pub fn caps(&self) -> (u32, u32) {
        let caps = self.caps.load(Ordering::Relaxed);
        (caps as u32, (caps >> 32) as u32)
    }

    /// The cache's cap as published now.
    pub fn cap(&self) -> usize {
        self.caps().0 as usize
    }

    /// The target for grants in flight as published now.
    pub fn in_flight(&self) -> usize {
        self.caps().1 as usize
    }

    /// A ring's holder of credit from this share's pool (it holds nothing yet).
    pub fn credit(&self) -> InFlightCredit {
        InFlightCredit {
            pool: self.pool.clone(),
            held: 0,
            limit: 0,
        }
    }

    fn set(&self, cap: u32, in_flight: u32) {
        self.caps.store(pack(cap, in_flight), Ordering::Relaxed);
    }

    fn same(&self, other: &GrantShare) -> bool {
        Arc::ptr_eq(&self.caps, &other.caps)
    }
}

/// What one ring holds of the domain's credit for grants of requests in flight. Owned
/// by the ring's engine and moved towards its share's target by [`follow`]; given back
/// whole when dropped (the ring is gone).
///
/// [`follow`]: InFlightCredit::follow
#[derive(Debug)]
pub struct InFlightCredit {
    pool: Option<Arc<Pool>>,
    held: u32,
    /// What the ring may have mapped now: what it holds, at most its target.
    limit: u32,
}

impl InFlightCredit {
    /// Credit of no pool and no bound (an engine without a share).
    pub const fn unbounded() -> Self {
        InFlightCredit {
            pool: None,
            held: u32::MAX,
            limit: u32::MAX,
        }
    }

    /// Credit held now.
    pub fn held(&self) -> u32 {
        self.held
    }

    /// Follow `target` (the share's), with `in_use` grants of the ring's requests
    /// mapped: give back to the pool what is held above both, take from the pool what
    /// is missing up to the target (up to `request_maps` from the reserve too, beyond it
    /// only what the pool has above the reserve). Returns the ring's new limit when it
    /// changed. Touches the pool only while what is held is not the target.
    #[inline]
    pub fn follow(&mut self, target: u32, in_use: usize, request_maps: u32) -> Option<u32> {
        if self.held == target && self.limit == target {
            return None;
        }
        self.settle(target, in_use, request_maps)
    }

    #[cold]
    fn settle(&mut self, target: u32, in_use: usize, request_maps: u32) -> Option<u32> {
        match &self.pool {
            None => self.held = target,
            Some(pool) if self.held > target => {
                let in_use = u32::try_from(in_use).unwrap_or(u32::MAX).min(self.held);
                let back = self.held - target.max(in_use);
                if back > 0 {
                    pool.free.fetch_add(back, Ordering::Relaxed);
                    self.held -= back;
                }
            }
            Some(pool) => {
                let missing = target - self.held;
                let from_reserve = request_maps.saturating_sub(self.held).min(missing);
                let takes = |free: u32| {
                    from_reserve
                        .min(free)
                        .max(free.saturating_sub(pool.reserve).min(missing))
                };
                if let Ok(free) =
                    pool.free
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |free| {
                            let n = takes(free);
                            (n > 0).then(|| free - n)
                        })
                {
                    self.held += takes(free);
                }
            }
        }
        let limit = self.held.min(target);
        (limit != self.limit).then(|| {
            self.limit = limit;
            limit
        })
    }
}

impl Drop for InFlightCredit {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.free.fetch_add(self.held, Ordering::Relaxed);
        }
    }
}

/// No ring can join: the grants in flight it would be given are fewer than one of its
/// requests (or another ring's) maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoShare {
    /// Rings in the budget now.
    pub rings: usize,
    /// The domain's total for grants in flight.
    pub total: u32,
    /// What each ring would get with one more.
    pub share: u32,
    /// The largest request's grants of the ring that would fall short.
    pub request_maps: u32,
}

impl core::fmt::Display for NoShare {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "no grant maps left for another ring: {} rings share the {} grants of requests \
             in flight, and one more would leave each {}, fewer than a request of {} segments maps",
            self.rings, self.total, self.share, self.request_maps
        )
    }
}

/// A ring in the budget.
#[derive(Debug)]
struct Member {
    share: GrantShare,
    demand: RingDemand,
}

/// The rings and their shares. Owned by the control path; joining and leaving allocate
/// and walk the rings, but only there, never on the I/O path.
#[derive(Debug)]
pub struct GrantBudget {
    limits: GrantLimits,
    in_flight: InFlightLimits,
    pool: Arc<Pool>,
    rings: Vec<Member>,
}

impl GrantBudget {
    pub fn new(limits: GrantLimits) -> Self {
        Self::with_in_flight(limits, InFlightLimits::DEFAULT)
    }

    /// A budget with other bounds on grants in flight (tests: small ones).
    pub fn with_in_flight(limits: GrantLimits, in_flight: InFlightLimits) -> Self {
        GrantBudget {
            limits,
            in_flight,
            pool: Arc::new(Pool {
                free: AtomicU32::new(in_flight.total),
                reserve: in_flight.reserve,
            }),
            rings: Vec::new(),
        }
    }

    pub fn limits(&self) -> GrantLimits {
        self.limits
    }

    pub fn in_flight_limits(&self) -> InFlightLimits {
        self.in_flight
    }

    /// Rings that cache grants now.
    pub fn rings(&self) -> usize {
        self.rings.iter().filter(|r| r.demand.persistent).count()
    }

    /// Rings in the budget now (all connected rings).
    pub fn in_flight_rings(&self) -> usize {
        self.rings.len()
    }

    /// Rings that map grants for their requests (a ring that copies maps none, and
    /// takes nothing of the others' shares).
    fn mapping_rings(&self) -> usize {
        self.rings.iter().filter(|r| r.demand.maps()).count()
    }

    /// What each ring may cache now.
    pub fn share(&self) -> u32 {
        self.limits.share(self.rings())
    }

    /// What each ring may have mapped for its requests in flight now (less if its
    /// slots cannot use that much).
    pub fn in_flight_share(&self) -> u32 {
        self.in_flight.share(self.mapping_rings())
    }

    /// Credit for grants in flight that no ring holds now.
    pub fn in_flight_free(&self) -> u32 {
        self.pool.free.load(Ordering::Relaxed)
    }

    /// A new ring's shares; every ring's are recomputed (the others shrink: they evict
    /// cached grants down to their cap and give back credit above their target from
    /// their next poll). Refused when the ring, or another, would be left less than one
    /// of its requests needs in flight.
    pub fn join(&mut self, demand: RingDemand) -> Result<GrantShare, NoShare> {
        let share = self
            .in_flight
            .share(self.mapping_rings() + usize::from(demand.maps()));
        let request_maps = self
            .rings
            .iter()
            .map(|r| r.demand.request_maps)
            .fold(demand.request_maps, u32::max);
        if share < request_maps {
            return Err(NoShare {
                rings: self.mapping_rings(),
                total: self.in_flight.total,
                share,
                request_maps,
            });
        }
        let share = GrantShare {
            caps: Arc::new(AtomicU64::new(0)),
            pool: Some(self.pool.clone()),
        };
        self.rings.push(Member {
            share: share.clone(),
            demand,
        });
        self.rebalance();
        Ok(share)
    }

    /// A ring is gone (its grants unmapped, its credit given back): the others may grow.
    pub fn leave(&mut self, share: &GrantShare) {
        self.rings.retain(|ring| !ring.share.same(share));
        share.set(0, 0);
        self.rebalance();
    }

    fn rebalance(&self) {
        let (cap, in_flight) = (self.share(), self.in_flight_share());
        for ring in &self.rings {
            let cap = if ring.demand.persistent { cap } else { 0 };
            ring.share.set(cap, in_flight.min(ring.demand.ring_maps));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring that caches grants, of 32 slots of 11-segment requests.
    const CACHING: RingDemand = RingDemand {
        persistent: true,
        request_maps: 11,
        ring_maps: 32 * 11,
    };

    #[test]
    fn shares_are_equal_bounded_per_ring_and_never_add_up_past_the_total() {
        let limits = GrantLimits {
            max_total: 1000,
            max_per_ring: 300,
            idle_secs: 60,
        };
        let mut budget = GrantBudget::new(limits);
        let a = budget.join(CACHING).unwrap();
        assert_eq!(a.cap(), 300);
        let mut rings = vec![a];
        for n in 2..=7 {
            rings.push(budget.join(CACHING).unwrap());
            let cap = (1000 / n).min(300);
            assert!(rings.iter().all(|r| r.cap() == cap), "{n} rings");
            assert!(rings.iter().map(GrantShare::cap).sum::<usize>() <= 1000);
        }
        assert_eq!(rings[0].cap(), 142);
        let gone = rings.remove(3);
        budget.leave(&gone);
        assert_eq!(gone.cap(), 0);
        assert_eq!(budget.rings(), 6);
        assert!(rings.iter().all(|r| r.cap() == 166));
        // A share that is not in the budget changes nothing.
        budget.leave(&GrantShare::fixed(5));
        assert_eq!(budget.rings(), 6);
        // A ring without persistent grants caches nothing and shrinks no cap.
        let plain = budget
            .join(RingDemand {
                persistent: false,
                ..CACHING
            })
            .unwrap();
        assert_eq!((plain.cap(), budget.rings()), (0, 6));
        assert!(rings.iter().all(|r| r.cap() == 166));
        budget.leave(&plain);
        for ring in rings.drain(..) {
            budget.leave(&ring);
        }
        assert_eq!((budget.rings(), budget.share()), (0, 300));
    }

    /// Room for two rings of 512-segment requests (`LARGE`) in flight, not three.
    const SMALL_IN_FLIGHT: InFlightLimits = InFlightLimits {
        total: 1264,
        per_ring: 600,
        reserve: 64,
    };
    const LARGE: RingDemand = RingDemand {
        persistent: false,
        request_maps: 512,
        ring_maps: 32 * 512,
    };

    #[test]
    fn in_flight_shares_are_equal_bounded_by_what_a_ring_can_use_and_refused_below_a_request() {
        let mut budget = GrantBudget::with_in_flight(GrantLimits::DEFAULT, SMALL_IN_FLIGHT);
        let (large, small) = (
            LARGE,
            RingDemand {
                request_maps: 11,
                ring_maps: 32 * 11,
                ..LARGE
            },
        );
        let a = budget.join(large).unwrap();
        assert_eq!(a.in_flight(), 600, "at most per_ring");
        let b = budget.join(large).unwrap();
        assert_eq!((a.in_flight(), b.in_flight()), (600, 600));
        // A third would leave each 400: enough for its own requests of 11 segments, not
        // for the others' 512.
        let refused = budget.join(small).unwrap_err();
        let expected = NoShare {
            rings: 2,
            total: 1264,
            share: 400,
            request_maps: 512,
        };
        assert_eq!(refused, expected);
        assert_eq!((a.in_flight(), budget.in_flight_rings()), (600, 2));
        // One of the large ones goes: a small one fits, and gets what its slots can use.
        budget.leave(&b);
        assert_eq!(b.in_flight(), 0);
        let c = budget.join(small).unwrap();
        assert_eq!((a.in_flight(), c.in_flight()), (600, 32 * 11));
        assert_eq!(budget.join(small).unwrap_err().request_maps, 512);
        budget.leave(&a);
        let d = budget.join(small).unwrap();
        assert_eq!((c.in_flight(), d.in_flight()), (352, 352));
        assert_eq!(budget.in_flight_share(), 600);
    }

    /// A ring that copies its guest's data maps nothing: it joins (and leaves) without
    /// shrinking any other ring's share, and is never refused for want of one.
    #[test]
    fn rings_that_copy_take_no_share_of_grants_in_flight() {
        let mut budget = GrantBudget::with_in_flight(GrantLimits::DEFAULT, SMALL_IN_FLIGHT);
        let copying = RingDemand {
            persistent: false,
            request_maps: 0,
            ring_maps: 0,
        };
        let large = LARGE;
        let a = budget.join(large).unwrap();
        let b = budget.join(large).unwrap();
        let copies: Vec<GrantShare> = (0..8).map(|_| budget.join(copying).unwrap()).collect();
        assert_eq!((a.in_flight(), b.in_flight()), (600, 600));
        assert!(copies.iter().all(|c| c.in_flight() == 0 && c.caps().0 == 0));
        assert_eq!(budget.in_flight_share(), 600);
        // A third mapping ring is still refused as before: the copying ones do not count.
        assert_eq!(budget.join(large).unwrap_err().rings, 2);
        budget.leave(&copies[0]);
        assert_eq!(
            (a.in_flight(), b.in_flight(), budget.in_flight_rings()),
            (600, 600, 9)
        );
    }

    #[test]
    fn credit_moves_only_through_the_pool_and_keeps_its_reserve_for_rings_without_a_request() {
        let mut budget = GrantBudget::with_in_flight(
            GrantLimits::DEFAULT,
            InFlightLimits {
                total: 1000,
                per_ring: 1000,
                reserve: 100,
            },
        );
        let demand = RingDemand {
            persistent: false,
            request_maps: 100,
            ring_maps: 10_000,
        };
        let a = budget.join(demand).unwrap();
        let mut a_credit = a.credit();
        assert_eq!(a.in_flight(), 900);
        assert_eq!(a_credit.follow(900, 0, 100), Some(900));
        assert_eq!(
            a_credit.follow(900, 0, 100),
            None,
            "settled: no pool access"
        );
        assert_eq!(budget.in_flight_free(), 100, "the reserve");
        // A second ring: targets drop to 450. `a` uses all its 900: it gives back
        // nothing yet, and takes nothing new (its limit is its target).
        let b = budget.join(demand).unwrap();
        let mut b_credit = b.credit();
        assert_eq!(a_credit.follow(450, 900, 100), Some(450));
        assert_eq!((a_credit.held(), budget.in_flight_free()), (900, 100));
        // `b` holds nothing: it takes one request's worth from the reserve, no more.
        assert_eq!(b_credit.follow(450, 0, 100), Some(100));
        assert_eq!(budget.in_flight_free(), 0);
        assert_eq!(b_credit.follow(450, 0, 100), None);
        // Some of `a`'s requests finish: it gives back what it no longer uses above
        // its target, which first refills the reserve.
        assert_eq!(a_credit.follow(450, 800, 100), None);
        assert_eq!((a_credit.held(), budget.in_flight_free()), (800, 100));
        assert_eq!(b_credit.follow(450, 0, 100), None);
        // `a`'s requests finish: its credit goes back down to its target, `b` takes it.
        assert_eq!(a_credit.follow(450, 300, 100), None);
        assert_eq!((a_credit.held(), budget.in_flight_free()), (450, 450));
        assert_eq!(b_credit.follow(450, 0, 100), Some(450));
        assert_eq!(budget.in_flight_free(), 100);
        assert_eq!(
            a_credit.held() + b_credit.held() + budget.in_flight_free(),
            1000
        );
        // A ring that goes gives everything back.
        drop(b_credit);
        budget.leave(&b);
        assert_eq!(budget.in_flight_free(), 550);
        assert_eq!(a_credit.follow(900, 0, 100), Some(900));
        assert_eq!(budget.in_flight_free(), 100);
        // Credit outside a budget follows its target at once.
        let mut fixed = GrantShare::fixed(7).credit();
        assert_eq!(GrantShare::fixed(7).caps(), (7, u32::MAX));
        assert_eq!(fixed.follow(u32::MAX, 5, 100), Some(u32::MAX));
    }

    #[test]
    fn defaults_fit_xens_default_maptrack() {
        let limits = GrantLimits::default();
        let maptrack = 1024 * 256;
        assert!(limits.max_total * 4 <= maptrack);
        assert!(
            limits.max_per_ring >= 32 * 257,
            "a QD32 ring of 256-segment requests"
        );
        assert_eq!(limits.idle_ns(), 60_000_000_000);
        assert_eq!(limits.share(1), 8448);
        assert_eq!(limits.share(16), 4096);
        // Persistent and in flight together: three quarters of the maptrack.
        let in_flight = InFlightLimits::default();
        assert_eq!(limits.max_total + in_flight.total, maptrack / 4 * 3);
        // A ring's cache and its requests in flight fit its map region.
        assert_eq!(
            GrantLimits::MAX_PER_RING_LIMIT + in_flight.per_ring,
            32 * 1024
        );
        // Seven rings get all a ring can use; 31 (a 4 GiB map space) still eight
        // requests of 512 segments each.
        assert_eq!(in_flight.share(7), in_flight.per_ring);
        assert!(in_flight.share(8) < in_flight.per_ring);
        assert!(in_flight.share(31) >= 8 * 512);
        assert_eq!(in_flight.reserve, 512);
    }
}
