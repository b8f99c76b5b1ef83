// SPDX-License-Identifier: MIT OR Apache-2.0
//! The blkif engine's small traits over the real thing: ring pages and foreign grants
//! mapped at guest-physical addresses of our map space, `EVTCHNOP_send`, and the
//! xenstore client.

use super::poller::POLLERS;
use super::space::MapRegion;
use alloc::string::String;
use alloc::vec::Vec;
use blkback::engine::EventChannel;
use blkback::grant::{copied_grant, GrantOps, MapRequest, MappedGrant};
use blkback::ring::RingMemory;
use blkdev::{BufferAccess, ForeignPage};
use core::sync::atomic::Ordering;
use xen::abi::event_channel::EvtchnPort;
use xen::abi::grant_table::RawGrantStatus;
use xen::abi::DomId;
use xen::grant::{
    copy_batch, copy_request, CopySide, CountedGrants, ForeignGrants, ForeignMapping, GrantMapArea,
};
use xen::raw::hypercall::NativeHypervisor;
use xen::xenbus::{StoreError, TxId, XenStore};
use xen::xenstore::{Transaction, XsErrno, XsError};
use xen::SharedMem;

pub const PAGE_SIZE: usize = 4096;

/// Records `delta` foreign pages (ring and data grants) mapped (positive) or unmapped
/// (negative) by this vCPU. Counted per vCPU, in its poller slot: data grants are mapped
/// and unmapped by the vCPU that serves the ring, so each counter stays in its own cache
/// line; only the sum means anything. Called by [`GrantHypervisor`] alone, for every
/// entry Xen mapped or unmapped.
fn count_mapped_pages(delta: i64) {
    let cpu = crate::smp::current().index.load(Ordering::Relaxed) as usize;
    POLLERS[cpu]
        .mapped_pages
        .fetch_add(delta, Ordering::Relaxed);
}

/// The hypervisor every grant map and unmap goes through: it counts what Xen answered
/// (`xen::grant::CountedGrants`), so `mapped_pages` follows what Xen holds whichever
/// path mapped or unmapped (a ring, a request's data, a batch unwound, a connection
/// undone).
pub type GrantHypervisor = CountedGrants<NativeHypervisor, fn(i64)>;

pub fn grant_hypervisor(hv: NativeHypervisor) -> GrantHypervisor {
    CountedGrants::new(hv, count_mapped_pages)
}

/// Every foreign page this domain has mapped right now (0 when no frontend holds
/// anything of ours).
pub fn mapped_pages() -> i64 {
    POLLERS
        .iter()
        .map(|slot| slot.mapped_pages.load(Ordering::Relaxed))
        .sum()
}

/// A frontend's ring, mapped on consecutive guest-physical (= virtual) pages.
pub struct SharedRing {
    pub mem: SharedMem,
}

impl RingMemory for SharedRing {
    fn size_bytes(&self) -> usize {
        self.mem.len()
    }

    fn load_u32(&self, offset: usize) -> u32 {
        self.mem.load_u32(offset, Ordering::Acquire)
    }

    fn store_u32(&self, offset: usize, value: u32) {
        self.mem.store_u32(offset, value, Ordering::Release)
    }

    fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        self.mem.read_bytes(offset, out)
    }

    fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.mem.write_bytes(offset, data)
    }

    fn full_fence(&self) {
        core::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// One frontend's grants mapped into one ring's map region: a thin layer over
/// `xen::grant::ForeignGrants` (per-entry statuses, what mapped is never lost, even when
/// a whole hypercall fails). Owned by the vCPU that serves the ring: no lock.
pub struct FrontendGrants {
    hv: GrantHypervisor,
    grants: ForeignGrants,
    frontend: DomId,
}

impl FrontendGrants {
    pub fn new(hv: NativeHypervisor, frontend: DomId, region: &MapRegion) -> Self {
        FrontendGrants {
            hv: grant_hypervisor(hv),
            grants: ForeignGrants::new(
                frontend,
                GrantMapArea::new(region.grant_base >> 12, region.grant_pages),
            ),
            frontend,
        }
    }

    /// One `GNTTABOP_copy` call between `len` bytes at `offset` of the frontend's grant
    /// `gref` and our memory at `local` (an identity-mapped address: two entries when
    /// it crosses a page), towards the frontend when `to_guest`. False unless every
    /// entry succeeded: the engine then refuses the request, and logs it (rate-limited:
    /// a guest that revokes its grants must not flood the console).
    fn copy(&self, gref: u32, offset: usize, local: u64, len: usize, to_guest: bool) -> bool {
        if len == 0 || offset + len > PAGE_SIZE || !crate::physmem::in_identity_map(local, len) {
            return false;
        }
        let mut ops = [Default::default(); 2];
        let (mut done, mut count) = (0, 0);
        while done < len {
            let at = local + done as u64;
            let in_page = PAGE_SIZE - (at as usize % PAGE_SIZE);
            let take = in_page.min(len - done);
            let ours = CopySide::Local {
                gfn: at >> 12,
                offset: (at as usize % PAGE_SIZE) as u16,
            };
            let theirs = CopySide::Grant {
                dom: self.frontend,
                gref,
                offset: (offset + done) as u16,
            };
            let (source, dest) = if to_guest {
                (ours, theirs)
            } else {
                (theirs, ours)
            };
            ops[count] = copy_request(source, dest, take as u16);
            count += 1;
            done += take;
        }
        copy_batch(&self.hv, &mut ops[..count]).is_ok()
    }

    /// Pages whose unmap failed: still mapped, never handed out again.
    pub fn leaked_pages(&self) -> u64 {
        self.grants.leaked_pages()
    }
}

/// Every CPU access to a data grant (the engine's, a RAM disk's, the bounce path's)
/// goes through `ForeignGrants::buffer_address`: a page of this ring's map region that
/// holds a grant mapped now, and bytes inside that page.
///
/// A ring that copies (a disk whose device bounces) names grants instead
/// (`blkback::grant::copy_buffer`): those are read and written with `GNTTABOP_copy`
/// (the engine's copies of indirect pages), and named to the bounce queue as foreign
/// pages, which it copies the data of in batches.
impl BufferAccess for FrontendGrants {
    fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
        if let Some(gref) = copied_grant(buffer) {
            return self.copy(gref, offset, out.as_mut_ptr() as u64, out.len(), false);
        }
        let Some(addr) = self.grants.buffer_address(buffer, offset, out.len()) else {
            return false;
        };
        // SAFETY: the bytes lie in a page of this ring's map region holding a grant the
        // engine mapped (checked above), identity mapped; reads of another domain's page
        // are copies, never references.
        unsafe { crate::physmem::read(addr, out) };
        true
    }

    fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
        if let Some(gref) = copied_grant(buffer) {
            return self.copy(gref, offset, data.as_ptr() as u64, data.len(), true);
        }
        let Some(addr) = self.grants.buffer_address(buffer, offset, data.len()) else {
            return false;
        };
        // SAFETY: as in `read_buffer`; the engine maps writable whatever the device writes.
        unsafe { crate::physmem::write(addr, data) };
        true
    }

    fn cpu_address(&self, buffer: u64, offset: usize, len: usize) -> Option<u64> {
        self.grants.buffer_address(buffer, offset, len)
    }

    fn foreign_page(&self, buffer: u64) -> Option<ForeignPage> {
        copied_grant(buffer).map(|gref| ForeignPage {
            domain: self.frontend,
            gref,
        })
    }
}

impl GrantOps for FrontendGrants {
    fn map(
        &mut self,
        requests: &[MapRequest],
        results: &mut [Result<MappedGrant, RawGrantStatus>],
    ) {
        let count = requests.len().min(results.len());
        self.grants.map(
            &self.hv,
            count,
            |i| (requests[i].gref, !requests[i].writable),
            |i, result| {
                results[i] = result.map(|m| MappedGrant {
                    handle: m.handle,
                    buffer: m.gpa,
                })
            },
        );
    }

    fn unmap(&mut self, grants: &[MappedGrant], results: &mut [Result<(), RawGrantStatus>]) {
        let count = grants.len().min(results.len());
        self.grants.unmap(
            &self.hv,
            count,
            |i| ForeignMapping {
                handle: grants[i].handle,
                gpa: grants[i].buffer,
            },
            |i, result| results[i] = result,
        );
    }
}

/// `EVTCHNOP_send` on the ring's port.
pub struct Notify {
    pub hv: NativeHypervisor,
    pub port: EvtchnPort,
}

impl EventChannel for Notify {
    fn notify(&mut self) {
        // A poller that expects to sleep after this pass sends it with the sleep.
        if !super::poller::owe_send(self.port) {
            super::poller::send_counted(&self.hv, self.port);
        }
    }
}

/// The negotiation's xenstore operations over the `xen` crate's client.
pub struct Store<'a>(pub &'a mut super::super::xen_domain::store::Client);

/// Maps the client's error, naming the operation and node when it is a real failure
/// (a bare "EACCES" in the log tells an operator nothing).
fn store_error<'a>(
    operation: &'static str,
    path: &'a str,
) -> impl FnOnce(XsError) -> StoreError + 'a {
    move |error| match error {
        XsError::Xenstored(XsErrno::Enoent) => StoreError::NotFound,
        XsError::Xenstored(XsErrno::Eagain) => StoreError::Again,
        other => StoreError::Failed(alloc::format!("{operation} {path}: {other:?}")),
    }
}

impl XenStore for Store<'_> {
    fn read(&mut self, tx: TxId, path: &str) -> Result<String, StoreError> {
        self.0
            .read_string(Transaction(tx), path)
            .map_err(store_error("read", path))
    }

    fn write(&mut self, tx: TxId, path: &str, value: &str) -> Result<(), StoreError> {
        self.0
            .write(Transaction(tx), path, value.as_bytes())
            .map_err(store_error("write", path))
    }

    fn mkdir(&mut self, tx: TxId, path: &str) -> Result<(), StoreError> {
        self.0
            .mkdir(Transaction(tx), path)
            .map_err(store_error("mkdir", path))
    }

    fn rm(&mut self, tx: TxId, path: &str) -> Result<(), StoreError> {
        self.0
            .rm(Transaction(tx), path)
            .map_err(store_error("rm", path))
    }

    fn directory(&mut self, tx: TxId, path: &str) -> Result<Vec<String>, StoreError> {
        self.0
            .directory(Transaction(tx), path)
            .map_err(store_error("directory", path))
    }

    fn transaction_start(&mut self) -> Result<TxId, StoreError> {
        self.0
            .transaction_start()
            .map(|t| t.0)
            .map_err(store_error("transaction_start", ""))
    }

    fn transaction_end(&mut self, tx: TxId, commit: bool) -> Result<(), StoreError> {
        self.0
            .transaction_end(Transaction(tx), commit)
            .map_err(store_error("transaction_end", ""))
    }
}
