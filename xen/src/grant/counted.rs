// SPDX-License-Identifier: MIT OR Apache-2.0
//! A hypervisor wrapper that counts the foreign pages mapped through it.

use super::batch::STATUS_NOT_PROCESSED;
use crate::abi::grant_table::*;
use crate::hypercall::{GnttabOp, Hypercall, Hypervisor};

/// A [`Hypervisor`] that counts the foreign pages mapped through it: `count(+n)` for the
/// `n` entries of a `GNTTABOP_map_grant_ref` batch Xen answered okay, `count(-n)` for the
/// `n` entries of a `GNTTABOP_unmap_grant_ref` batch it answered okay; every other call
/// passes through untouched. Whatever path maps or unmaps (a ring, a request's data
/// grants, the unwinding of a failed batch, the undoing of a failed connection), the
/// count follows what Xen holds mapped for us, so no caller has to remember to count.
///
/// `status` is an output of both operations: each entry is marked "not processed" before
/// the call, so an entry Xen never reached (a hypercall failing part-way) is not counted
/// whatever its caller left there.
#[derive(Clone, Copy, Debug)]
pub struct CountedGrants<H, C> {
    hv: H,
    count: C,
}

impl<H: Hypervisor, C: Fn(i64) + Sync> CountedGrants<H, C> {
    pub fn new(hv: H, count: C) -> Self {
        Self { hv, count }
    }

    /// The hypervisor underneath (for calls that map nothing).
    pub fn inner(&self) -> &H {
        &self.hv
    }
}

impl<H: Hypervisor, C: Fn(i64) + Sync> CountedGrants<H, C> {
    /// Marks every entry of `ops` not processed, makes the call, and counts `sign` for
    /// each entry Xen answered okay.
    fn counted<T>(
        &self,
        ops: &mut [T],
        status: fn(&mut T) -> &mut RawGrantStatus,
        sign: i64,
        call: impl FnOnce(&H, &mut [T]) -> i64,
    ) -> i64 {
        for op in ops.iter_mut() {
            *status(op) = STATUS_NOT_PROCESSED;
        }
        let rc = call(&self.hv, ops);
        let okay = ops
            .iter_mut()
            .map(|op| *status(op))
            .filter(|&s| s == GNTST_OKAY)
            .count();
        if okay > 0 {
            (self.count)(sign * okay as i64);
        }
        rc
    }
}

impl<H: Hypervisor, C: Fn(i64) + Sync> Hypervisor for CountedGrants<H, C> {
    fn hypercall(&self, call: Hypercall<'_>) -> i64 {
        match call {
            Hypercall::Gnttab(GnttabOp::MapGrantRef(ops)) => self.counted(
                ops,
                |op| &mut op.status,
                1,
                |hv, ops| hv.hypercall(Hypercall::Gnttab(GnttabOp::MapGrantRef(ops))),
            ),
            Hypercall::Gnttab(GnttabOp::UnmapGrantRef(ops)) => self.counted(
                ops,
                |op| &mut op.status,
                -1,
                |hv, ops| hv.hypercall(Hypercall::Gnttab(GnttabOp::UnmapGrantRef(ops))),
            ),
            other => self.hv.hypercall(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::XenError;
    use crate::fake::FakeXen;
    use crate::grant::batch::tests::requests;
    use crate::grant::{map_batch, unmap_batch, ForeignGrants, GrantMapArea};
    use core::sync::atomic::Ordering;
    use std::vec::Vec;

    /// A fake Xen under [`CountedGrants`], and the count.
    fn counted(
        xen: &FakeXen,
    ) -> (
        CountedGrants<&FakeXen, impl Fn(i64) + Sync>,
        std::sync::Arc<core::sync::atomic::AtomicI64>,
    ) {
        let count = std::sync::Arc::new(core::sync::atomic::AtomicI64::new(0));
        let counter = count.clone();
        let hv = CountedGrants::new(xen, move |delta| {
            counter.fetch_add(delta, Ordering::Relaxed);
        });
        (hv, count)
    }

    #[test]
    fn counted_grants_follow_what_xen_holds_on_every_path() {
        let xen = FakeXen::new();
        let (hv, count) = counted(&xen);
        let check = |what: &str| {
            let held = xen.with(|s| s.mapped.len()) as i64;
            assert_eq!(count.load(Ordering::Relaxed), held, "{what}");
        };
        let mut kept = requests(5);
        map_batch(&hv, &mut kept).unwrap();
        check("a batch mapped");
        // A failed entry: the others are unwound.
        xen.with(|s| s.grant_status.insert((7, 103), GNTST_BAD_GNTREF));
        assert!(map_batch(&hv, &mut requests(6)).is_err());
        check("a batch unwound");
        // The unwinding unmap fails too: that page stays mapped, and counted.
        xen.with(|s| {
            s.grant_status.clear();
            s.grant_status.insert((7, 102), GNTST_GENERAL_ERROR);
            // The handle the fake gives the batch's 2nd entry.
            s.unmap_fails.insert(s.next_handle + 1);
        });
        assert_eq!(map_batch(&hv, &mut requests(3)).unwrap_err().leaked, 1);
        check("a batch whose unwinding leaked a page");
        xen.with(|s| s.grant_status.clear());
        // The hypercall fails part-way.
        xen.with(|s| s.grant_batch_failure = Some((3, -14)));
        assert!(map_batch(&hv, &mut requests(6)).is_err());
        check("a hypercall failing part-way, unwound");
        // Entries answering eagain, retried one by one.
        xen.with(|s| s.grant_eagain.insert((7, 101), 3));
        let mut retried = requests(3);
        map_batch(&hv, &mut retried).unwrap();
        check("eagain retried");
        // Per-entry results, the hypercall failing part-way, mapping and unmapping.
        let mut grants = ForeignGrants::new(7, GrantMapArea::new(0x100000, 8));
        xen.with(|s| s.grant_batch_failure = Some((3, -14)));
        let mut mapped = Vec::new();
        grants.map(
            &hv,
            6,
            |i| (100 + i as GrantRef, false),
            |_, r| mapped.extend(r.ok()),
        );
        assert_eq!(mapped.len(), 3);
        check("foreign grants, a hypercall failing part-way");
        xen.with(|s| s.grant_batch_failure = Some((1, -14)));
        grants.unmap(&hv, 3, |i| mapped[i], |_, _| {});
        check("foreign grants unmapped, a hypercall failing part-way");
        // A stale okay status in an entry Xen never reaches is not a mapping.
        let mut stale = requests(2);
        stale[1].status = GNTST_OKAY;
        xen.with(|s| s.grant_batch_failure = Some((1, -14)));
        let _ = hv.hypercall(Hypercall::Gnttab(GnttabOp::MapGrantRef(&mut stale)));
        check("a stale status");
        // Everything unmapped: nothing counted.
        let handles: Vec<GrantHandle> = xen.with(|s| {
            s.unmap_fails.clear();
            s.mapped.keys().copied().collect()
        });
        let mut unmaps: Vec<GnttabUnmapGrantRef> = handles
            .iter()
            .map(|&handle| GnttabUnmapGrantRef {
                handle,
                ..Default::default()
            })
            .collect();
        unmap_batch(&hv, &mut unmaps).unwrap();
        check("all unmapped");
        assert_eq!(count.load(Ordering::Relaxed), 0);
        // Other calls pass through untouched.
        assert_eq!(
            crate::evtchn::bind_interdomain(&hv, 7, 0),
            Err(XenError::Inval)
        );
    }
}
