// SPDX-License-Identifier: MIT OR Apache-2.0
//! One budget of persistently mapped grants for the whole driver domain, shared fairly
//! between the rings that cache grants.
//!
//! Every grant blkdom maps takes a handle of its own maptrack table in Xen (by default
//! 1024 frames of 256 entries: 262,144 handles for the whole domain). Persistent grants
//! stay mapped after their request, so without a bound a few rings could hold most of
//! them and make every other guest's maps fail. The control path owns a [`GrantBudget`]:
//! when a ring that caches grants connects or disconnects it recomputes every such
//! ring's cap, `min(max_per_ring, max_total / rings)`, and publishes it in the ring's
//! [`GrantShare`], an atomic that the ring's own poller reads at each poll. The I/O path
//! takes no lock and shares no counter: a ring above its cap evicts unpinned grants down
//! to it at its next poll, and a ring at its cap maps the grants beyond it per request,
//! as if the frontend had no persistent grants (I/O never fails because of the budget).

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

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
    /// guest pages held by caches leaves 196,608 handles for rings and the grants of
    /// requests in flight.
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
    /// of requests in flight, mapped per request.
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

/// One ring's cap, written by the control path and read by the ring's poller.
#[derive(Clone, Debug)]
pub struct GrantShare(Arc<AtomicU32>);

impl GrantShare {
    /// A share of its own (not part of any budget), starting at `cap`.
    pub fn fixed(cap: u32) -> Self {
        GrantShare(Arc::new(AtomicU32::new(cap)))
    }

    /// The cap as published now.
    pub fn cap(&self) -> usize {
        self.0.load(Ordering::Relaxed) as usize
    }

    fn set(&self, cap: u32) {
        self.0.store(cap, Ordering::Relaxed);
    }
}

/// The rings that cache grants and their caps. Owned by the control path; joining and
/// leaving allocate and walk the rings, but only there, never on the I/O path.
#[derive(Debug)]
pub struct GrantBudget {
    limits: GrantLimits,
    rings: Vec<GrantShare>,
}

impl GrantBudget {
    pub const fn new(limits: GrantLimits) -> Self {
        GrantBudget {
            limits,
            rings: Vec::new(),
        }
    }

    pub fn limits(&self) -> GrantLimits {
        self.limits
    }

    /// Rings that cache grants now.
    pub fn rings(&self) -> usize {
        self.rings.len()
    }

    /// What each ring may cache now.
    pub fn share(&self) -> u32 {
        self.limits.share(self.rings.len())
    }

    /// A new ring's share; every ring's cap is recomputed (the others shrink, and evict
    /// down to theirs at their next poll).
    pub fn join(&mut self) -> GrantShare {
        let share = GrantShare::fixed(0);
        self.rings.push(share.clone());
        self.rebalance();
        share
    }

    /// A ring is gone (its grants unmapped): the others may grow.
    pub fn leave(&mut self, share: &GrantShare) {
        self.rings.retain(|ring| !Arc::ptr_eq(&ring.0, &share.0));
        share.set(0);
        self.rebalance();
    }

    fn rebalance(&self) {
        let cap = self.share();
        for ring in &self.rings {
            ring.set(cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_equal_bounded_per_ring_and_never_add_up_past_the_total() {
        let limits = GrantLimits {
            max_total: 1000,
            max_per_ring: 300,
            idle_secs: 60,
        };
        let mut budget = GrantBudget::new(limits);
        let a = budget.join();
        assert_eq!(a.cap(), 300);
        let mut rings = vec![a];
        for n in 2..=7 {
            rings.push(budget.join());
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
        for ring in rings.drain(..) {
            budget.leave(&ring);
        }
        assert_eq!((budget.rings(), budget.share()), (0, 300));
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
    }
}
