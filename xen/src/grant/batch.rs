// SPDX-License-Identifier: MIT OR Apache-2.0
//! Batched map / unmap / copy of other domains' grants, one hypercall a batch, with
//! every status checked.

use crate::abi::grant_table::*;
use crate::abi::{DomId, DOMID_SELF};
use crate::error::{check, XenError};
use crate::hypercall::{GnttabOp, Hypercall, Hypervisor, SchedOp};

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
pub(super) const STATUS_NOT_PROCESSED: RawGrantStatus = i16::MIN;

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::fake::FakeXen;
    use std::vec::Vec;

    pub(in crate::grant) fn requests(n: u32) -> Vec<GnttabMapGrantRef> {
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
}
