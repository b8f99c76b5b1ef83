// SPDX-License-Identifier: MIT OR Apache-2.0
//! One domain's grants mapped page by page into a map area, with a result per entry.

use super::area::GrantMapArea;
use super::batch::{map_entries, map_request, unmap_batch, STATUS_NOT_PROCESSED};
use crate::abi::grant_table::*;
use crate::abi::{DomId, PAGE_SIZE};
use crate::hypercall::Hypervisor;
use alloc::vec::Vec;

/// A foreign grant mapped by [`ForeignGrants`]: the handle that unmaps it and the
/// guest-physical address of the page it is mapped at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignMapping {
    pub handle: GrantHandle,
    pub gpa: u64,
}

/// The raw status an entry reports: `GNTST_general_error` for one Xen never processed.
fn entry_status(status: RawGrantStatus) -> RawGrantStatus {
    if status == STATUS_NOT_PROCESSED {
        GNTST_GENERAL_ERROR
    } else {
        status
    }
}

/// One domain's grants mapped page by page into a [`GrantMapArea`], with a result per
/// entry (a batch may partly fail: each failed entry fails only what it belongs to).
/// Built on [`map_entries`] and [`unmap_batch`]; the bookkeeping rules:
///
/// - an entry whose status is okay is mapped and reported `Ok`, even when the
///   hypercall as a whole failed after it (its page stays allocated until it is
///   unmapped, so it is never handed out twice);
/// - an entry that failed, or that Xen did not reach, gives its page back;
/// - an unmap that failed, or that Xen did not reach, leaves the page mapped: it is
///   counted in [`ForeignGrants::leaked_pages`] and never handed out again.
///
/// The scratch arrays are allocated once, in `new`: mapping and unmapping do not
/// allocate.
#[derive(Debug)]
pub struct ForeignGrants {
    dom: DomId,
    area: GrantMapArea,
    maps: Vec<GnttabMapGrantRef>,
    /// Which entry of the caller's batch each of `maps` is.
    owners: Vec<usize>,
    unmaps: Vec<GnttabUnmapGrantRef>,
    leaked: u64,
}

impl ForeignGrants {
    /// Entries per map or unmap hypercall: the largest request blkif allows a backend
    /// to advertise (512 segments) in one call, so a round of requests costs one map
    /// and one unmap hypercall (each an emulated VM exit for a PVH or HVM domain) where
    /// Linux blkback makes one per 11 segments (24 for a 1 MiB request). Xen preempts a
    /// long batch itself (a hypercall continuation). The batches are allocated with the
    /// ring: 64 bytes per entry, 32 KiB.
    pub const CHUNK: usize = 512;

    /// Maps `dom`'s grants into `area`.
    pub fn new(dom: DomId, area: GrantMapArea) -> Self {
        Self {
            dom,
            area,
            maps: Vec::with_capacity(Self::CHUNK),
            owners: Vec::with_capacity(Self::CHUNK),
            unmaps: Vec::with_capacity(Self::CHUNK),
            leaked: 0,
        }
    }

    /// Maps entries `0..count`, entry `i` being `request(i)` = (grant ref, read-only),
    /// and reports each one's outcome through `outcome(i, ..)`: the mapping, or a raw
    /// `GNTST_*` status (`GNTST_no_space` when the area is full). Returns how many
    /// entries were mapped.
    pub fn map<H: Hypervisor + ?Sized>(
        &mut self,
        hv: &H,
        count: usize,
        request: impl Fn(usize) -> (GrantRef, bool),
        mut outcome: impl FnMut(usize, Result<ForeignMapping, RawGrantStatus>),
    ) -> usize {
        let mut mapped = 0;
        for first in (0..count).step_by(Self::CHUNK) {
            self.maps.clear();
            self.owners.clear();
            for i in first..count.min(first + Self::CHUNK) {
                let (gref, readonly) = request(i);
                match self.area.alloc() {
                    Some(gpa) => {
                        self.maps.push(map_request(gpa, self.dom, gref, readonly));
                        self.owners.push(i);
                    }
                    // Out of map space: this entry fails, the others go on.
                    None => outcome(i, Err(GNTST_NO_SPACE)),
                }
            }
            if self.maps.is_empty() {
                continue;
            }
            // Each entry's own status says what happened to it, whatever the call returned.
            let _ = map_entries(hv, &mut self.maps);
            for (op, &i) in self.maps.iter().zip(&self.owners) {
                if op.status == GNTST_OKAY {
                    mapped += 1;
                    outcome(
                        i,
                        Ok(ForeignMapping {
                            handle: op.handle,
                            gpa: op.host_addr,
                        }),
                    );
                } else {
                    let _ = self.area.free(op.host_addr);
                    outcome(i, Err(entry_status(op.status)));
                }
            }
        }
        mapped
    }

    /// Unmaps entries `0..count`, entry `i` being `grant(i)` (a mapping this object
    /// made), and reports each one's outcome through `outcome(i, ..)`. Returns how many
    /// were unmapped; the others stay mapped for good (see [`Self::leaked_pages`]).
    pub fn unmap<H: Hypervisor + ?Sized>(
        &mut self,
        hv: &H,
        count: usize,
        grant: impl Fn(usize) -> ForeignMapping,
        mut outcome: impl FnMut(usize, Result<(), RawGrantStatus>),
    ) -> usize {
        let mut unmapped = 0;
        for first in (0..count).step_by(Self::CHUNK) {
            self.unmaps.clear();
            for i in first..count.min(first + Self::CHUNK) {
                let mapping = grant(i);
                self.unmaps.push(GnttabUnmapGrantRef {
                    host_addr: mapping.gpa,
                    dev_bus_addr: 0,
                    handle: mapping.handle,
                    status: STATUS_NOT_PROCESSED,
                });
            }
            let _ = unmap_batch(hv, &mut self.unmaps);
            for (op, i) in self.unmaps.iter().zip(first..) {
                if op.status == GNTST_OKAY {
                    unmapped += 1;
                    let _ = self.area.free(op.host_addr);
                    outcome(i, Ok(()));
                } else {
                    self.leaked += 1;
                    outcome(i, Err(entry_status(op.status)));
                }
            }
        }
        unmapped
    }

    /// Pages whose unmap failed: still mapped, never handed out again.
    pub fn leaked_pages(&self) -> u64 {
        self.leaked
    }

    /// The address of the `len` bytes at `offset` of `buffer`, if `buffer` is a page of
    /// the area that holds a mapping now (mapped by this object and not unmapped since)
    /// and the bytes stay inside that page; `None` otherwise. Every CPU access to a
    /// mapped grant goes through this check: an address anywhere else (another ring's
    /// region, our own memory, a page of the area with nothing mapped) is refused.
    pub fn buffer_address(&self, buffer: u64, offset: usize, len: usize) -> Option<u64> {
        let end = offset.checked_add(len)?;
        (end <= PAGE_SIZE && self.area.is_allocated(buffer)).then(|| buffer + offset as u64)
    }

    /// Free pages of the area.
    pub fn available(&self) -> usize {
        self.area.available()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeXen;
    use std::vec::Vec;

    /// Maps grants `100..100 + n` of domain 7 (even ones read-only) with `grants`.
    fn map_foreign(
        xen: &FakeXen,
        grants: &mut ForeignGrants,
        n: usize,
    ) -> Vec<Result<ForeignMapping, i16>> {
        let mut results = std::vec![Err(i16::MAX); n];
        grants.map(
            xen,
            n,
            |i| (100 + i as GrantRef, i % 2 == 0),
            |i, result| results[i] = result,
        );
        results
    }

    #[test]
    fn foreign_grants_keep_what_mapped_before_a_failed_hypercall() {
        let xen = FakeXen::new();
        let mut grants = ForeignGrants::new(7, GrantMapArea::new(0x100000, 8));
        // Xen maps 3 entries, then the hypercall fails (-EFAULT on the 4th).
        xen.with(|s| s.grant_batch_failure = Some((3, -14)));
        let results = map_foreign(&xen, &mut grants, 6);
        let mapped: Vec<ForeignMapping> = results[..3].iter().map(|r| r.unwrap()).collect();
        assert!(results[3..].iter().all(|r| *r == Err(GNTST_GENERAL_ERROR)));
        xen.with(|s| {
            assert_eq!(s.mapped.len(), 3, "Xen holds 3 mappings");
            for m in &mapped {
                assert_eq!(s.mapped.get(&m.handle).map(|e| e.2), Some(m.gpa));
            }
        });
        assert_eq!(grants.available(), 8 - 3, "the mapped pages stay allocated");
        // The next batch never lands on a page that is still mapped.
        let more = map_foreign(&xen, &mut grants, 5);
        let pages: std::collections::HashSet<u64> = xen.with(|s| {
            assert_eq!(s.mapped.len(), 8);
            s.mapped.values().map(|e| e.2).collect()
        });
        assert_eq!(pages.len(), 8, "no page is mapped twice");
        assert_eq!(more.iter().filter(|r| r.is_ok()).count(), 5);
        // And what mapped before the failure unmaps by its handle.
        let mut unmapped = Vec::new();
        let n = grants.unmap(&xen, 3, |i| mapped[i], |_, r| unmapped.push(r));
        assert_eq!((n, unmapped), (3, std::vec![Ok(()); 3]));
        assert_eq!(grants.available(), 3);
        assert_eq!(grants.leaked_pages(), 0);
    }

    #[test]
    fn foreign_grants_report_each_entry() {
        let xen = FakeXen::new();
        const N: usize = ForeignGrants::CHUNK;
        let mut grants = ForeignGrants::new(7, GrantMapArea::new(0x100000, N as u32 + 6));
        xen.with(|s| s.grant_status.insert((7, 101), GNTST_BAD_GNTREF));
        let results = map_foreign(&xen, &mut grants, N + 8);
        assert_eq!(results[1], Err(GNTST_BAD_GNTREF));
        // CHUNK entries in the first call; the failed one gave its page back, so 7 of
        // the 8 in the second call find a page and the last finds none.
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), N + 6);
        assert_eq!(results[N + 7], Err(GNTST_NO_SPACE));
        xen.with(|s| {
            assert_eq!(s.mapped.len(), N + 6);
            assert_eq!(s.calls.len(), 2, "CHUNK entries per hypercall");
            assert!(s.mapped.values().all(|e| e.1 != 101));
        });
        assert_eq!(grants.available(), 0);
    }

    #[test]
    fn the_largest_request_maps_and_unmaps_in_one_hypercall_each() {
        let xen = FakeXen::new();
        // 512 segments: what blkdom advertises as feature-max-indirect-segments.
        let mut grants = ForeignGrants::new(7, GrantMapArea::new(0x100000, 512));
        let mapped: Vec<ForeignMapping> = map_foreign(&xen, &mut grants, 512)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        xen.with(|s| assert_eq!(s.calls.len(), 1, "one map hypercall"));
        let n = grants.unmap(&xen, 512, |i| mapped[i], |_, r| assert_eq!(r, Ok(())));
        assert_eq!(n, 512);
        xen.with(|s| {
            assert_eq!(s.calls.len(), 2, "one unmap hypercall");
            assert!(s.mapped.is_empty());
        });
    }

    #[test]
    fn foreign_grants_unmap_per_entry_after_a_failed_hypercall() {
        let xen = FakeXen::new();
        let mut grants = ForeignGrants::new(7, GrantMapArea::new(0x100000, 4));
        let mapped: Vec<ForeignMapping> = map_foreign(&xen, &mut grants, 4)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        // Xen unmaps 2 entries, then fails: the other 2 are still mapped.
        xen.with(|s| s.grant_batch_failure = Some((2, -14)));
        let mut results = Vec::new();
        let n = grants.unmap(&xen, 4, |i| mapped[i], |_, r| results.push(r));
        assert_eq!(n, 2);
        assert_eq!(
            results,
            [
                Ok(()),
                Ok(()),
                Err(GNTST_GENERAL_ERROR),
                Err(GNTST_GENERAL_ERROR)
            ]
        );
        assert_eq!(grants.leaked_pages(), 2);
        assert_eq!(grants.available(), 2, "only unmapped pages come back");
        xen.with(|s| assert_eq!(s.mapped.len(), 2));
        let again = map_foreign(&xen, &mut grants, 3);
        assert_eq!(again[2], Err(GNTST_NO_SPACE), "leaked pages are not reused");
    }

    #[test]
    fn foreign_grants_resolve_only_bytes_of_pages_mapped_now() {
        let xen = FakeXen::new();
        let mut grants = ForeignGrants::new(7, GrantMapArea::new(0x100000, 4));
        let base = 0x1_0000_0000u64;
        let mapped: Vec<ForeignMapping> = map_foreign(&xen, &mut grants, 2)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let (a, b) = (mapped[0].gpa, mapped[1].gpa);
        assert_eq!((a, b), (base, base + 0x1000));
        assert_eq!(grants.buffer_address(a, 0, 4096), Some(a));
        assert_eq!(grants.buffer_address(b, 512, 1024), Some(b + 512));
        assert_eq!(grants.buffer_address(b, 4096, 0), Some(b + 4096));
        for (buffer, offset, len) in [
            (a, 4000, 200),        // leaves the page
            (a, usize::MAX, 2),    // overflows
            (a + 8, 0, 8),         // not a page address
            (base + 0x2000, 0, 8), // a page of the area with nothing mapped
            (base + 0x4000, 0, 8), // just past the area
            (base - 0x1000, 0, 8), // just before it
            (0x10_0000, 0, 8),     // our own memory
            (!0xfffu64, 0, 8),     // the last page of all
        ] {
            assert_eq!(
                grants.buffer_address(buffer, offset, len),
                None,
                "{buffer:#x}+{offset}/{len}"
            );
        }
        // Once unmapped, a page is refused too.
        grants.unmap(&xen, 1, |_| mapped[0], |_, r| assert_eq!(r, Ok(())));
        assert_eq!(grants.buffer_address(a, 0, 8), None);
        assert_eq!(grants.buffer_address(b, 0, 8), Some(b));
    }
}
