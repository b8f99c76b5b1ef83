// SPDX-License-Identifier: MIT OR Apache-2.0
//! Our own grant table: the v1 entries we grant other domains access through, and the
//! mapping of its frames into our physmap.

use super::free_list::IndexFreeList;
use crate::abi::grant_table::*;
use crate::abi::memory::{XenAddToPhysmap, XENMAPSPACE_GRANT_TABLE};
use crate::abi::{DomId, DOMID_SELF};
use crate::error::{check, XenError};
use crate::hypercall::{GnttabOp, Hypercall, Hypervisor, MemoryOp};
use crate::SharedMem;
use core::mem::{offset_of, size_of};
use core::sync::atomic::Ordering;

/// Errors of our own grant table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantError {
    /// No free grant ref.
    Exhausted,
    /// v1 entries hold 32-bit frame numbers.
    FrameTooLarge,
    /// The grantee still has the frame mapped (GTF_reading/GTF_writing): try later.
    InUse,
    NotAllocated,
}

impl core::fmt::Display for GrantError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            GrantError::Exhausted => "no free grant reference",
            GrantError::FrameTooLarge => "frame number does not fit a v1 grant entry",
            GrantError::InUse => "the grantee still has the frame mapped",
            GrantError::NotAllocated => "grant reference not allocated",
        })
    }
}

impl core::error::Error for GrantError {}

const FLAGS: usize = offset_of!(GrantEntryV1, flags);
const DOMID: usize = offset_of!(GrantEntryV1, domid);
const FRAME: usize = offset_of!(GrantEntryV1, frame);

/// Our v1 grant table: the frames mapped with [`map_own_table`], plus the ref allocator.
#[derive(Debug)]
pub struct GrantTable {
    entries: SharedMem,
    refs: IndexFreeList,
}

impl GrantTable {
    /// `entries` covers the mapped table frames (512 entries per page). The reserved
    /// entries 0..8 are never handed out.
    pub fn new(entries: SharedMem) -> Self {
        let count = u32::try_from(entries.len() / size_of::<GrantEntryV1>()).unwrap_or(u32::MAX);
        Self {
            entries,
            refs: IndexFreeList::new(GNTTAB_NR_RESERVED_ENTRIES, count),
        }
    }

    fn offset(gref: GrantRef) -> usize {
        gref as usize * size_of::<GrantEntryV1>()
    }

    /// Lets `domid` access guest frame `gfn`. The flags are written last (release), so
    /// the grantee never sees a half-written entry.
    pub fn grant_access(
        &mut self,
        domid: DomId,
        gfn: u64,
        readonly: bool,
    ) -> Result<GrantRef, GrantError> {
        let frame = u32::try_from(gfn).map_err(|_| GrantError::FrameTooLarge)?;
        let gref = self.refs.alloc().ok_or(GrantError::Exhausted)?;
        let at = Self::offset(gref);
        self.entries.store_u32(at + FRAME, frame, Ordering::Relaxed);
        self.entries.store_u16(at + DOMID, domid, Ordering::Relaxed);
        let flags = GTF_PERMIT_ACCESS | if readonly { GTF_READONLY } else { 0 };
        self.entries.store_u16(at + FLAGS, flags, Ordering::Release);
        Ok(gref)
    }

    /// Revokes a grant unless the grantee is using it right now (then `InUse`: the ref
    /// stays allocated and granted; retry later). Clearing the flags with a
    /// compare-exchange closes the race with Xen setting GTF_reading/GTF_writing.
    pub fn end_access(&mut self, gref: GrantRef) -> Result<(), GrantError> {
        if !self.refs.is_allocated(gref) {
            return Err(GrantError::NotAllocated);
        }
        let at = Self::offset(gref) + FLAGS;
        let mut flags = self.entries.load_u16(at, Ordering::Acquire);
        loop {
            if flags & (GTF_READING | GTF_WRITING) != 0 {
                return Err(GrantError::InUse);
            }
            match self.entries.compare_exchange_u16(at, flags, GTF_INVALID) {
                Ok(_) => break,
                Err(now) => flags = now,
            }
        }
        self.refs.free(gref).map_err(|_| GrantError::NotAllocated)
    }

    /// The entry as it is now (diagnostics and tests).
    pub fn entry(&self, gref: GrantRef) -> Option<GrantEntryV1> {
        let at = Self::offset(gref);
        (at + size_of::<GrantEntryV1>() <= self.entries.len()).then(|| GrantEntryV1 {
            flags: self.entries.load_u16(at + FLAGS, Ordering::Acquire),
            domid: self.entries.load_u16(at + DOMID, Ordering::Relaxed),
            frame: self.entries.load_u32(at + FRAME, Ordering::Relaxed),
        })
    }

    pub fn available(&self) -> usize {
        self.refs.available()
    }
}

/// Maps our grant table frames at `first_gpfn..` (`XENMEM_add_to_physmap`,
/// `XENMAPSPACE_grant_table`), growing the table to `want_frames` (capped at the
/// domain's `max_nr_frames`). Returns how many frames are mapped.
pub fn map_own_table<H: Hypervisor + ?Sized>(
    hv: &H,
    first_gpfn: u64,
    want_frames: u32,
) -> Result<u32, XenError> {
    let mut query = GnttabQuerySize {
        dom: DOMID_SELF,
        ..Default::default()
    };
    check(hv.hypercall(Hypercall::Gnttab(GnttabOp::QuerySize(&mut query))))?;
    if query.status != GNTST_OKAY {
        return Err(XenError::Inval);
    }
    let frames = want_frames.min(query.max_nr_frames);
    for idx in 0..frames {
        let mut arg = XenAddToPhysmap {
            domid: DOMID_SELF,
            size: 0,
            space: XENMAPSPACE_GRANT_TABLE,
            idx: u64::from(idx),
            gpfn: first_gpfn + u64::from(idx),
        };
        check(hv.hypercall(Hypercall::Memory(MemoryOp::AddToPhysmap(&mut arg))))?;
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::PAGE_SIZE;
    use crate::fake::FakeXen;
    use std::vec::Vec;

    fn table(pages: usize) -> GrantTable {
        GrantTable::new(SharedMem::alloc_leaked(pages * PAGE_SIZE))
    }

    #[test]
    fn granting_writes_the_entry_and_skips_reserved_refs() {
        let mut t = table(1);
        assert_eq!(t.available(), 512 - 8);
        let rw = t.grant_access(3, 0x1234, false).unwrap();
        let ro = t.grant_access(4, 0x5678, true).unwrap();
        assert_eq!((rw, ro), (8, 9));
        assert_eq!(
            t.entry(rw),
            Some(GrantEntryV1 {
                flags: GTF_PERMIT_ACCESS,
                domid: 3,
                frame: 0x1234
            })
        );
        assert_eq!(t.entry(ro).unwrap().flags, GTF_PERMIT_ACCESS | GTF_READONLY);
        assert_eq!(
            t.grant_access(3, 1 << 32, false),
            Err(GrantError::FrameTooLarge)
        );
        for _ in 0..(512 - 10) {
            t.grant_access(3, 1, false).unwrap();
        }
        assert_eq!(t.grant_access(3, 1, false), Err(GrantError::Exhausted));
    }

    #[test]
    fn ending_access_waits_for_the_grantee() {
        let mem = SharedMem::alloc_leaked(PAGE_SIZE);
        let mut t = GrantTable::new(mem);
        let gref = t.grant_access(3, 77, false).unwrap();
        // Xen marks the grant in use while the grantee has it mapped.
        let flags_at = gref as usize * 8;
        mem.store_u16(flags_at, GTF_PERMIT_ACCESS | GTF_WRITING, Ordering::Release);
        assert_eq!(t.end_access(gref), Err(GrantError::InUse));
        assert_eq!(
            t.available(),
            512 - 9,
            "the ref stays allocated while in use"
        );
        mem.store_u16(flags_at, GTF_PERMIT_ACCESS, Ordering::Release);
        assert_eq!(t.end_access(gref), Ok(()));
        assert_eq!(t.entry(gref).unwrap().flags, GTF_INVALID);
        assert_eq!(t.end_access(gref), Err(GrantError::NotAllocated));
        assert_eq!(
            t.grant_access(5, 1, true).unwrap(),
            gref,
            "freed ref is reused"
        );
    }

    #[test]
    fn own_table_frames_are_added_to_the_physmap() {
        let xen = FakeXen::new();
        xen.with(|s| s.grant_frames = (1, 4));
        assert_eq!(map_own_table(&xen, 0x9000, 8), Ok(4));
        xen.with(|s| {
            let got: Vec<(u64, u64)> = s.physmap.iter().map(|a| (a.idx, a.gpfn)).collect();
            assert_eq!(got, [(0, 0x9000), (1, 0x9001), (2, 0x9002), (3, 0x9003)]);
            assert!(s
                .physmap
                .iter()
                .all(|a| a.space == XENMAPSPACE_GRANT_TABLE && a.domid == DOMID_SELF));
        });
    }
}
