//! Grant tables: our own grants (a free list of grant refs over the v1 entry table) and
//! batched map / unmap / copy of other domains' grants with every status checked.

use crate::abi::grant_table::*;
use crate::abi::memory::{XenAddToPhysmap, XENMAPSPACE_GRANT_TABLE};
use crate::abi::{DomId, DOMID_SELF, PAGE_SIZE};
use crate::error::{check, XenError};
use crate::hypercall::{GnttabOp, Hypercall, Hypervisor, MemoryOp, SchedOp};
use crate::SharedMem;
use alloc::vec;
use alloc::vec::Vec;
use core::mem::{offset_of, size_of};
use core::sync::atomic::Ordering;

/// A LIFO free list of indices in `[first, end)`, with a bitmap that catches double
/// frees. All memory is allocated up front; `alloc`/`free` are O(1) and allocation-free.
#[derive(Clone, Debug)]
pub struct IndexFreeList {
    first: u32,
    end: u32,
    free: Vec<u32>,
    in_use: Vec<u64>,
}

/// Why a free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeError {
    OutOfRange,
    NotAllocated,
}

impl core::fmt::Display for FreeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            FreeError::OutOfRange => "index outside the list",
            FreeError::NotAllocated => "index not allocated",
        })
    }
}

impl core::error::Error for FreeError {}

impl IndexFreeList {
    pub fn new(first: u32, end: u32) -> Self {
        let end = end.max(first);
        // Reverse order so that the lowest index is handed out first.
        let free = (first..end).rev().collect();
        let words = (end - first).div_ceil(64) as usize;
        Self {
            first,
            end,
            free,
            in_use: vec![0; words],
        }
    }

    pub fn alloc(&mut self) -> Option<u32> {
        let index = self.free.pop()?;
        let slot = (index - self.first) as usize;
        self.in_use[slot / 64] |= 1 << (slot % 64);
        Some(index)
    }

    pub fn free(&mut self, index: u32) -> Result<(), FreeError> {
        if index < self.first || index >= self.end {
            return Err(FreeError::OutOfRange);
        }
        let slot = (index - self.first) as usize;
        let bit = 1u64 << (slot % 64);
        if self.in_use[slot / 64] & bit == 0 {
            return Err(FreeError::NotAllocated);
        }
        self.in_use[slot / 64] &= !bit;
        self.free.push(index);
        Ok(())
    }

    pub fn is_allocated(&self, index: u32) -> bool {
        index >= self.first && index < self.end && {
            let slot = (index - self.first) as usize;
            self.in_use[slot / 64] & (1 << (slot % 64)) != 0
        }
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }

    pub fn capacity(&self) -> usize {
        (self.end - self.first) as usize
    }
}

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

/// A `GNTST_*` status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantStatus {
    Okay,
    GeneralError,
    BadDomain,
    BadGntref,
    BadHandle,
    BadVirtAddr,
    BadDevAddr,
    NoDeviceSpace,
    PermissionDenied,
    BadPage,
    BadCopyArg,
    AddressTooBig,
    Eagain,
    NoSpace,
    /// Xen did not process the entry (the whole hypercall failed first).
    NotProcessed,
    Unknown(RawGrantStatus),
}

/// Put into `status` before a batch: Xen never writes it, so an entry still holding it
/// after the call was not processed.
const STATUS_NOT_PROCESSED: RawGrantStatus = i16::MIN;

impl GrantStatus {
    pub fn from_raw(status: RawGrantStatus) -> Self {
        match status {
            GNTST_OKAY => Self::Okay,
            GNTST_GENERAL_ERROR => Self::GeneralError,
            GNTST_BAD_DOMAIN => Self::BadDomain,
            GNTST_BAD_GNTREF => Self::BadGntref,
            GNTST_BAD_HANDLE => Self::BadHandle,
            GNTST_BAD_VIRT_ADDR => Self::BadVirtAddr,
            GNTST_BAD_DEV_ADDR => Self::BadDevAddr,
            GNTST_NO_DEVICE_SPACE => Self::NoDeviceSpace,
            GNTST_PERMISSION_DENIED => Self::PermissionDenied,
            GNTST_BAD_PAGE => Self::BadPage,
            GNTST_BAD_COPY_ARG => Self::BadCopyArg,
            GNTST_ADDRESS_TOO_BIG => Self::AddressTooBig,
            GNTST_EAGAIN => Self::Eagain,
            GNTST_NO_SPACE => Self::NoSpace,
            STATUS_NOT_PROCESSED => Self::NotProcessed,
            other => Self::Unknown(other),
        }
    }
}

/// The first thing that went wrong in a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchFault {
    /// The hypercall itself failed (bad arguments, `-EFAULT`, ...).
    Hypercall(XenError),
    /// Entry `index` failed with `status`.
    Entry { index: usize, status: GrantStatus },
}

impl core::fmt::Display for BatchFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BatchFault::Hypercall(e) => write!(f, "hypercall failed: {e}"),
            BatchFault::Entry { index, status } => write!(f, "entry {index}: {status:?}"),
        }
    }
}

/// A failed [`map_batch`]: nothing stays mapped, except `leaked` entries whose unwinding
/// unmap failed too (they keep their handle; their guest-physical pages must not be
/// reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapError {
    pub fault: BatchFault,
    /// Entries that failed (or were not processed).
    pub failed: usize,
    pub leaked: usize,
}

impl core::fmt::Display for MapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "grant map failed ({}): {} entries not mapped, {} left mapped",
            self.fault, self.failed, self.leaked
        )
    }
}

impl core::error::Error for MapError {}

/// A handle that Xen never returns, for entries that are not mapped.
pub const INVALID_HANDLE: GrantHandle = u32::MAX;

/// How often an entry answering `GNTST_eagain` (grantor's page being paged in) is retried.
pub const EAGAIN_RETRIES: u32 = 16;

/// A request to map `gref` of `dom` at guest-physical address `gpa`.
pub fn map_request(gpa: u64, dom: DomId, gref: GrantRef, readonly: bool) -> GnttabMapGrantRef {
    GnttabMapGrantRef {
        host_addr: gpa,
        flags: GNTMAP_HOST_MAP | if readonly { GNTMAP_READONLY } else { 0 },
        ref_: gref,
        dom,
        status: STATUS_NOT_PROCESSED,
        handle: INVALID_HANDLE,
        dev_bus_addr: 0,
    }
}

/// The unmap request undoing a successful map.
pub fn unmap_request(mapped: &GnttabMapGrantRef) -> GnttabUnmapGrantRef {
    GnttabUnmapGrantRef {
        host_addr: mapped.host_addr,
        dev_bus_addr: 0,
        handle: mapped.handle,
        status: STATUS_NOT_PROCESSED,
    }
}

fn grant_call<H: Hypervisor + ?Sized>(hv: &H, op: GnttabOp<'_>) -> Result<(), XenError> {
    check(hv.hypercall(Hypercall::Gnttab(op))).map(drop)
}

/// Maps a batch with one hypercall. On success every entry is mapped (`status` okay,
/// `handle` set). On any failure — the hypercall, or any entry after
/// [`EAGAIN_RETRIES`] retries — the entries that did map are unmapped again (batched)
/// and the error says what failed first; no partial result is left behind.
pub fn map_batch<H: Hypervisor + ?Sized>(
    hv: &H,
    ops: &mut [GnttabMapGrantRef],
) -> Result<(), MapError> {
    let BatchError { fault, failed } = match map_entries(hv, ops) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let leaked = unwind_maps(hv, ops);
    Err(MapError {
        fault,
        failed,
        leaked,
    })
}

/// Maps a batch with one hypercall (entries answering `GNTST_eagain` are retried) and
/// leaves each entry's outcome in its `status`, undoing nothing: every entry whose status
/// is okay is mapped and belongs to the caller, *even when the hypercall failed*. Xen
/// handles entries in order and writes each one back before the next, so when it fails
/// part-way (`-EFAULT` on entry k), the entries before k are mapped with their handle
/// set, and the rest still hold the "not processed" status this function puts in first
/// (`ops` is our own memory: Xen's write-back of an entry it processed cannot fault).
pub fn map_entries<H: Hypervisor + ?Sized>(
    hv: &H,
    ops: &mut [GnttabMapGrantRef],
) -> Result<(), BatchError> {
    for op in ops.iter_mut() {
        op.status = STATUS_NOT_PROCESSED;
        op.handle = INVALID_HANDLE;
    }
    let call = grant_call(hv, GnttabOp::MapGrantRef(ops));
    if call.is_ok() {
        retry_eagain(hv, ops);
    }
    batch_result(call, ops.iter().map(|op| op.status))
}

/// Re-issues entries that answered `GNTST_eagain`, one at a time, yielding in between.
fn retry_eagain<H: Hypervisor + ?Sized>(hv: &H, ops: &mut [GnttabMapGrantRef]) {
    for op in ops.iter_mut().filter(|op| op.status == GNTST_EAGAIN) {
        for _ in 0..EAGAIN_RETRIES {
            let _ = hv.hypercall(Hypercall::Sched(SchedOp::Yield));
            op.status = STATUS_NOT_PROCESSED;
            if grant_call(hv, GnttabOp::MapGrantRef(core::slice::from_mut(op))).is_err()
                || op.status != GNTST_EAGAIN
            {
                break;
            }
        }
    }
}

/// Unmaps the entries of a failed batch that did map; returns how many could not be.
fn unwind_maps<H: Hypervisor + ?Sized>(hv: &H, ops: &mut [GnttabMapGrantRef]) -> usize {
    const CHUNK: usize = 16;
    let mut leaked = 0;
    let mut chunk = [GnttabUnmapGrantRef::default(); CHUNK];
    let mut owners = [0usize; CHUNK];
    let mut pending = 0;
    let mut flush =
        |chunk: &mut [GnttabUnmapGrantRef], owners: &[usize], ops: &mut [GnttabMapGrantRef]| {
            let call = grant_call(hv, GnttabOp::UnmapGrantRef(chunk));
            for (unmap, &owner) in chunk.iter().zip(owners) {
                if call.is_ok() && unmap.status == GNTST_OKAY {
                    ops[owner].handle = INVALID_HANDLE;
                    ops[owner].status = STATUS_NOT_PROCESSED;
                } else {
                    leaked += 1;
                }
            }
        };
    for index in 0..ops.len() {
        if ops[index].status != GNTST_OKAY {
            continue;
        }
        chunk[pending] = unmap_request(&ops[index]);
        owners[pending] = index;
        pending += 1;
        if pending == CHUNK {
            flush(&mut chunk[..pending], &owners[..pending], ops);
            pending = 0;
        }
    }
    if pending > 0 {
        flush(&mut chunk[..pending], &owners[..pending], ops);
    }
    leaked
}

/// A failed [`unmap_batch`] or [`copy_batch`]: `failed` entries did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchError {
    pub fault: BatchFault,
    pub failed: usize,
}

impl core::fmt::Display for BatchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "grant batch failed ({}): {} entries",
            self.fault, self.failed
        )
    }
}

impl core::error::Error for BatchError {}

fn batch_result(
    call: Result<(), XenError>,
    statuses: impl Iterator<Item = RawGrantStatus>,
) -> Result<(), BatchError> {
    let mut first_bad = None;
    let mut failed = 0;
    for (index, status) in statuses.enumerate() {
        if status != GNTST_OKAY {
            failed += 1;
            first_bad.get_or_insert((index, status));
        }
    }
    let fault = match (call, first_bad) {
        (Ok(()), None) => return Ok(()),
        (Err(e), _) => BatchFault::Hypercall(e),
        (Ok(()), Some((index, status))) => BatchFault::Entry {
            index,
            status: GrantStatus::from_raw(status),
        },
    };
    Err(BatchError { fault, failed })
}

/// Unmaps a batch with one hypercall and checks every status. Entries that failed keep
/// their `status`; the caller must treat their pages as still mapped.
pub fn unmap_batch<H: Hypervisor + ?Sized>(
    hv: &H,
    ops: &mut [GnttabUnmapGrantRef],
) -> Result<(), BatchError> {
    for op in ops.iter_mut() {
        op.status = STATUS_NOT_PROCESSED;
    }
    let call = grant_call(hv, GnttabOp::UnmapGrantRef(ops));
    batch_result(call, ops.iter().map(|op| op.status))
}

/// One side of a grant copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopySide {
    /// A grant of another domain.
    Grant {
        dom: DomId,
        gref: GrantRef,
        offset: u16,
    },
    /// One of our own guest frames.
    Local { gfn: u64, offset: u16 },
}

/// A `GNTTABOP_copy` entry for `len` bytes (each side must stay inside its page; Xen
/// answers `GNTST_bad_copy_arg` otherwise).
pub fn copy_request(source: CopySide, dest: CopySide, len: u16) -> GnttabCopy {
    let mut flags = 0;
    let mut side = |side: CopySide, gref_flag: u16| match side {
        CopySide::Grant { dom, gref, offset } => {
            flags |= gref_flag;
            GnttabCopyPtr {
                u: u64::from(gref),
                domid: dom,
                offset,
            }
        }
        CopySide::Local { gfn, offset } => GnttabCopyPtr {
            u: gfn,
            domid: DOMID_SELF,
            offset,
        },
    };
    let source = side(source, GNTCOPY_SOURCE_GREF);
    let dest = side(dest, GNTCOPY_DEST_GREF);
    GnttabCopy {
        source,
        dest,
        len,
        flags,
        status: STATUS_NOT_PROCESSED,
    }
}

/// Copies a batch with one hypercall and checks every status; each entry's `status`
/// stays for the caller to answer per request.
pub fn copy_batch<H: Hypervisor + ?Sized>(
    hv: &H,
    ops: &mut [GnttabCopy],
) -> Result<(), BatchError> {
    for op in ops.iter_mut() {
        op.status = STATUS_NOT_PROCESSED;
    }
    let call = grant_call(hv, GnttabOp::Copy(ops));
    batch_result(call, ops.iter().map(|op| op.status))
}

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

/// Guest-physical pages reserved for mapping foreign grants (a hole in our memory map),
/// handed out one page at a time.
#[derive(Clone, Debug)]
pub struct GrantMapArea {
    base_gfn: u64,
    pages: IndexFreeList,
}

impl GrantMapArea {
    pub fn new(base_gfn: u64, pages: u32) -> Self {
        Self {
            base_gfn,
            pages: IndexFreeList::new(0, pages),
        }
    }

    /// A free page's guest-physical address.
    pub fn alloc(&mut self) -> Option<u64> {
        let index = self.pages.alloc()?;
        Some((self.base_gfn + u64::from(index)) * PAGE_SIZE as u64)
    }

    pub fn free(&mut self, gpa: u64) -> Result<(), FreeError> {
        let gfn = gpa / PAGE_SIZE as u64;
        if !gpa.is_multiple_of(PAGE_SIZE as u64) || gfn < self.base_gfn {
            return Err(FreeError::OutOfRange);
        }
        let index = u32::try_from(gfn - self.base_gfn).map_err(|_| FreeError::OutOfRange)?;
        self.pages.free(index)
    }

    pub fn available(&self) -> usize {
        self.pages.available()
    }

    /// Whether `gpa` is the address of a page of the area that is handed out now.
    pub fn is_allocated(&self, gpa: u64) -> bool {
        let gfn = gpa / PAGE_SIZE as u64;
        gpa.is_multiple_of(PAGE_SIZE as u64)
            && gfn >= self.base_gfn
            && u32::try_from(gfn - self.base_gfn).is_ok_and(|index| self.pages.is_allocated(index))
    }
}

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
    use crate::fake::FakeXen;
    use std::vec::Vec;

    #[test]
    fn free_list_hands_out_lowest_first_and_catches_double_free() {
        let mut list = IndexFreeList::new(8, 12);
        assert_eq!(list.capacity(), 4);
        assert_eq!(list.alloc(), Some(8));
        assert_eq!(list.alloc(), Some(9));
        assert_eq!(list.free(8), Ok(()));
        assert_eq!(list.free(8), Err(FreeError::NotAllocated));
        assert_eq!(list.free(7), Err(FreeError::OutOfRange));
        assert_eq!(list.free(12), Err(FreeError::OutOfRange));
        assert_eq!(list.alloc(), Some(8));
        assert_eq!(list.alloc(), Some(10));
        assert_eq!(list.alloc(), Some(11));
        assert_eq!(list.alloc(), None);
        assert_eq!(list.available(), 0);
        assert!(list.is_allocated(11));
        assert!(!list.is_allocated(3));
    }

    #[test]
    fn free_list_survives_many_cycles_without_losing_indices() {
        let mut list = IndexFreeList::new(0, 200);
        let mut held = Vec::new();
        for round in 0..50u32 {
            while let Some(i) = list.alloc() {
                held.push(i);
                if held.len() % 7 == (round % 7) as usize {
                    break;
                }
            }
            // Free every other held index.
            let mut keep = Vec::new();
            for (n, i) in held.drain(..).enumerate() {
                if n % 2 == 0 {
                    list.free(i).unwrap()
                } else {
                    keep.push(i)
                }
            }
            held = keep;
        }
        for i in held.drain(..) {
            list.free(i).unwrap();
        }
        assert_eq!(list.available(), 200);
    }

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

    fn requests(n: u32) -> Vec<GnttabMapGrantRef> {
        (0..n)
            .map(|i| map_request(0x1_0000_0000 + u64::from(i) * 4096, 7, 100 + i, i % 2 == 0))
            .collect()
    }

    #[test]
    fn map_batch_maps_everything_in_one_call() {
        let xen = FakeXen::new();
        let mut ops = requests(5);
        map_batch(&xen, &mut ops).unwrap();
        assert!(ops
            .iter()
            .all(|op| op.status == GNTST_OKAY && op.handle != INVALID_HANDLE));
        assert_eq!(ops[0].flags, GNTMAP_HOST_MAP | GNTMAP_READONLY);
        assert_eq!(ops[1].flags, GNTMAP_HOST_MAP);
        xen.with(|s| {
            assert_eq!(s.mapped.len(), 5);
            assert_eq!(s.calls.len(), 1, "one hypercall for the batch");
        });
        let mut unmaps: Vec<_> = ops.iter().map(unmap_request).collect();
        unmap_batch(&xen, &mut unmaps).unwrap();
        xen.with(|s| assert!(s.mapped.is_empty()));
    }

    #[test]
    fn map_batch_unwinds_when_one_entry_fails() {
        let xen = FakeXen::new();
        xen.with(|s| s.grant_status.insert((7, 103), GNTST_BAD_GNTREF));
        let mut ops = requests(6);
        let err = map_batch(&xen, &mut ops).unwrap_err();
        assert_eq!(
            err,
            MapError {
                fault: BatchFault::Entry {
                    index: 3,
                    status: GrantStatus::BadGntref
                },
                failed: 1,
                leaked: 0
            }
        );
        xen.with(|s| assert!(s.mapped.is_empty(), "successful maps were undone"));
        assert!(ops.iter().all(|op| op.handle == INVALID_HANDLE));
    }

    #[test]
    fn map_batch_unwinds_big_batches_in_chunks() {
        let xen = FakeXen::new();
        xen.with(|s| {
            s.grant_status
                .insert((7, 100 + 39), GNTST_PERMISSION_DENIED)
        });
        let mut ops = requests(40);
        let err = map_batch(&xen, &mut ops).unwrap_err();
        assert_eq!(
            err.fault,
            BatchFault::Entry {
                index: 39,
                status: GrantStatus::PermissionDenied
            }
        );
        xen.with(|s| {
            assert!(s.mapped.is_empty());
            // 1 map + 3 unmap chunks (16 + 16 + 7).
            assert_eq!(s.calls.len(), 4);
        });
    }

    #[test]
    fn map_batch_unwinds_after_a_failed_hypercall() {
        let xen = FakeXen::new();
        // Xen processed 3 entries, then failed (e.g. -EFAULT on the 4th).
        xen.with(|s| s.grant_batch_failure = Some((3, -14)));
        let mut ops = requests(6);
        let err = map_batch(&xen, &mut ops).unwrap_err();
        assert_eq!(err.fault, BatchFault::Hypercall(XenError::Fault));
        assert_eq!(err.failed, 3, "the 3 unprocessed entries");
        assert!(ops.iter().all(|op| op.handle == INVALID_HANDLE));
        assert_eq!(
            GrantStatus::from_raw(ops[5].status),
            GrantStatus::NotProcessed
        );
        xen.with(|s| assert!(s.mapped.is_empty()));
    }

    #[test]
    fn map_batch_retries_eagain_then_gives_up() {
        let xen = FakeXen::new();
        xen.with(|s| s.grant_eagain.insert((7, 101), 3));
        let mut ops = requests(3);
        map_batch(&xen, &mut ops).unwrap();
        xen.with(|s| {
            assert_eq!(s.mapped.len(), 3);
            assert_eq!(s.yields, 3);
        });

        let xen = FakeXen::new();
        xen.with(|s| s.grant_eagain.insert((7, 102), EAGAIN_RETRIES + 5));
        let mut ops = requests(3);
        let err = map_batch(&xen, &mut ops).unwrap_err();
        assert_eq!(
            err.fault,
            BatchFault::Entry {
                index: 2,
                status: GrantStatus::Eagain
            }
        );
        xen.with(|s| assert!(s.mapped.is_empty()));
    }

    #[test]
    fn failed_unwinding_is_reported_as_leaked() {
        let xen = FakeXen::new();
        xen.with(|s| {
            s.grant_status.insert((7, 102), GNTST_GENERAL_ERROR);
            s.unmap_fails.insert(101); // the handle the fake gives the 2nd entry
        });
        let mut ops = requests(3);
        let err = map_batch(&xen, &mut ops).unwrap_err();
        assert_eq!(err.leaked, 1);
        assert_eq!(ops[1].handle, 101, "the leaked mapping keeps its handle");
        assert_eq!(ops[0].handle, INVALID_HANDLE);
        xen.with(|s| assert_eq!(s.mapped.len(), 1));
    }

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

    #[test]
    fn unmap_batch_reports_bad_handles() {
        let xen = FakeXen::new();
        let mut ops = requests(2);
        map_batch(&xen, &mut ops).unwrap();
        let mut unmaps: Vec<_> = ops.iter().map(unmap_request).collect();
        unmaps.push(GnttabUnmapGrantRef {
            handle: 999,
            ..Default::default()
        });
        let err = unmap_batch(&xen, &mut unmaps).unwrap_err();
        assert_eq!(
            err,
            BatchError {
                fault: BatchFault::Entry {
                    index: 2,
                    status: GrantStatus::BadHandle
                },
                failed: 1
            }
        );
        xen.with(|s| assert!(s.mapped.is_empty()));
    }

    #[test]
    fn copy_batch_builds_requests_and_checks_each_status() {
        let xen = FakeXen::new();
        xen.with(|s| s.grant_status.insert((9, 12), GNTST_BAD_GNTREF));
        let mut ops = [
            copy_request(
                CopySide::Grant {
                    dom: 9,
                    gref: 11,
                    offset: 512,
                },
                CopySide::Local {
                    gfn: 0x42,
                    offset: 0,
                },
                1024,
            ),
            copy_request(
                CopySide::Local {
                    gfn: 0x43,
                    offset: 0,
                },
                CopySide::Grant {
                    dom: 9,
                    gref: 12,
                    offset: 0,
                },
                4096,
            ),
            copy_request(
                CopySide::Local {
                    gfn: 0x44,
                    offset: 4000,
                },
                CopySide::Grant {
                    dom: 9,
                    gref: 13,
                    offset: 0,
                },
                200,
            ),
        ];
        assert_eq!(ops[0].flags, GNTCOPY_SOURCE_GREF);
        assert_eq!(
            ops[0].source,
            GnttabCopyPtr {
                u: 11,
                domid: 9,
                offset: 512
            }
        );
        assert_eq!(
            ops[0].dest,
            GnttabCopyPtr {
                u: 0x42,
                domid: DOMID_SELF,
                offset: 0
            }
        );
        assert_eq!(ops[1].flags, GNTCOPY_DEST_GREF);
        let err = copy_batch(&xen, &mut ops).unwrap_err();
        assert_eq!(err.failed, 2);
        assert_eq!(
            err.fault,
            BatchFault::Entry {
                index: 1,
                status: GrantStatus::BadGntref
            }
        );
        assert_eq!(ops[0].status, GNTST_OKAY);
        assert_eq!(
            GrantStatus::from_raw(ops[2].status),
            GrantStatus::BadCopyArg
        );
        xen.with(|s| assert_eq!(s.calls.len(), 1));
    }

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

    #[test]
    fn grant_map_area_hands_out_page_addresses() {
        let mut area = GrantMapArea::new(0x100000, 3);
        let a = area.alloc().unwrap();
        let b = area.alloc().unwrap();
        assert_eq!((a, b), (0x1_0000_0000, 0x1_0000_1000));
        assert_eq!(area.free(a + 1), Err(FreeError::OutOfRange));
        assert_eq!(area.free(0x1000), Err(FreeError::OutOfRange));
        assert_eq!(area.free(a), Ok(()));
        assert_eq!(area.free(a), Err(FreeError::NotAllocated));
        assert_eq!(area.available(), 2);
    }
}
