//! The blkif engine's small traits over the real thing: ring pages and foreign grants
//! mapped at guest-physical addresses of our map space, `EVTCHNOP_send`, and the
//! xenstore client.

use super::poller::POLLERS;
use super::space::MapRegion;
use alloc::string::String;
use alloc::vec::Vec;
use blkback::engine::EventChannel;
use blkback::grant::{GrantOps, GrantStatus, MapRequest, MappedGrant, GNTST_GENERAL_ERROR};
use blkback::ring::RingMemory;
use blkback::xenstore::{StoreError, TxId, XenStore};
use blkdev::BufferAccess;
use core::sync::atomic::Ordering;
use xen::abi::event_channel::EvtchnPort;
use xen::abi::grant_table::{GnttabMapGrantRef, GnttabUnmapGrantRef, GNTST_NO_SPACE, GNTST_OKAY};
use xen::abi::DomId;
use xen::grant::{map_request, unmap_request, GrantMapArea};
use xen::hypercall::GnttabOp;
use xen::raw::hypercall::NativeHypervisor;
use xen::xenstore::{Transaction, XsErrno, XsError};
use xen::{Hypercall, Hypervisor, SharedMem};

pub const PAGE_SIZE: usize = 4096;

/// Records `delta` foreign pages (ring and data grants) mapped (positive) or unmapped
/// (negative) by this vCPU. Counted per vCPU, in its poller slot: data grants are mapped
/// and unmapped by the vCPU that serves the ring, so each counter stays in its own cache
/// line; only the sum means anything.
pub fn count_mapped_pages(delta: i64) {
    let cpu = crate::smp::current().index.load(Ordering::Relaxed) as usize;
    POLLERS[cpu]
        .mapped_pages
        .fetch_add(delta, Ordering::Relaxed);
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

/// Entries per map or unmap hypercall; the scratch arrays are allocated once, at connect.
const BATCH: usize = 64;

/// Batched maps and unmaps of one frontend's grants into one ring's map region. Owned by
/// the vCPU that serves the ring: no lock.
pub struct FrontendGrants {
    hv: NativeHypervisor,
    frontend: DomId,
    area: GrantMapArea,
    /// Guest-physical range the area covers (buffers outside it are refused).
    range: (u64, u64),
    map_ops: Vec<GnttabMapGrantRef>,
    /// Which request each entry of `map_ops` belongs to.
    map_index: Vec<usize>,
    unmap_ops: Vec<GnttabUnmapGrantRef>,
    /// Pages whose unmap failed: never handed out again.
    pub leaked_pages: u64,
}

impl FrontendGrants {
    pub fn new(hv: NativeHypervisor, frontend: DomId, region: &MapRegion) -> Self {
        FrontendGrants {
            hv,
            frontend,
            area: GrantMapArea::new(region.grant_base >> 12, region.grant_pages),
            range: (
                region.grant_base,
                region.grant_base + u64::from(region.grant_pages) * PAGE_SIZE as u64,
            ),
            map_ops: Vec::with_capacity(BATCH),
            map_index: Vec::with_capacity(BATCH),
            unmap_ops: Vec::with_capacity(BATCH),
            leaked_pages: 0,
        }
    }

    fn page(&self, buffer: u64, offset: usize, len: usize) -> Option<usize> {
        let inside = buffer >= self.range.0
            && buffer < self.range.1
            && buffer.is_multiple_of(PAGE_SIZE as u64);
        (inside && offset.checked_add(len)? <= PAGE_SIZE).then_some(buffer as usize + offset)
    }
}

impl BufferAccess for FrontendGrants {
    fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
        let Some(addr) = self.page(buffer, offset, out.len()) else {
            return false;
        };
        // SAFETY: `buffer` is a page of this ring's map region (checked above), identity
        // mapped, holding a grant the engine mapped; reads of another domain's page are
        // copies, never references.
        unsafe { crate::physmem::read(addr as u64, out) };
        true
    }

    fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
        let Some(addr) = self.page(buffer, offset, data.len()) else {
            return false;
        };
        // SAFETY: as in `read_buffer`; the engine maps writable whatever the device writes.
        unsafe { crate::physmem::write(addr as u64, data) };
        true
    }
}

impl GrantOps for FrontendGrants {
    fn map(&mut self, requests: &[MapRequest], results: &mut [Result<MappedGrant, GrantStatus>]) {
        for (requests, results) in requests.chunks(BATCH).zip(results.chunks_mut(BATCH)) {
            self.map_ops.clear();
            self.map_index.clear();
            for (i, (request, result)) in requests.iter().zip(results.iter_mut()).enumerate() {
                match self.area.alloc() {
                    Some(gpa) => {
                        self.map_ops.push(map_request(
                            gpa,
                            self.frontend,
                            request.gref,
                            !request.writable,
                        ));
                        self.map_index.push(i);
                    }
                    // Out of map space: this entry fails, the others go on.
                    None => *result = Err(GNTST_NO_SPACE),
                }
            }
            if self.map_ops.is_empty() {
                continue;
            }
            let call = self
                .hv
                .hypercall(Hypercall::Gnttab(GnttabOp::MapGrantRef(&mut self.map_ops)));
            let mut mapped = 0;
            for (op, &i) in self.map_ops.iter().zip(self.map_index.iter()) {
                if call >= 0 && op.status == GNTST_OKAY {
                    mapped += 1;
                    results[i] = Ok(MappedGrant {
                        handle: op.handle,
                        buffer: op.host_addr,
                    });
                } else {
                    results[i] = Err(if call >= 0 {
                        op.status
                    } else {
                        GNTST_GENERAL_ERROR
                    });
                    let _ = self.area.free(op.host_addr);
                }
            }
            count_mapped_pages(mapped);
        }
    }

    fn unmap(&mut self, grants: &[MappedGrant], results: &mut [Result<(), GrantStatus>]) {
        for (grants, results) in grants.chunks(BATCH).zip(results.chunks_mut(BATCH)) {
            self.unmap_ops.clear();
            for grant in grants {
                let mapped = GnttabMapGrantRef {
                    host_addr: grant.buffer,
                    handle: grant.handle,
                    ..map_request(0, 0, 0, true)
                };
                self.unmap_ops.push(unmap_request(&mapped));
            }
            let call = self.hv.hypercall(Hypercall::Gnttab(GnttabOp::UnmapGrantRef(
                &mut self.unmap_ops,
            )));
            let mut unmapped = 0;
            for (op, result) in self.unmap_ops.iter().zip(results.iter_mut()) {
                if call >= 0 && op.status == GNTST_OKAY {
                    unmapped += 1;
                    *result = Ok(());
                    let _ = self.area.free(op.host_addr);
                } else {
                    *result = Err(if call >= 0 {
                        op.status
                    } else {
                        GNTST_GENERAL_ERROR
                    });
                    self.leaked_pages += 1;
                }
            }
            count_mapped_pages(-unmapped);
        }
    }
}

/// `EVTCHNOP_send` on the ring's port.
pub struct Notify {
    pub hv: NativeHypervisor,
    pub port: EvtchnPort,
}

impl EventChannel for Notify {
    fn notify(&mut self) {
        // A failed send means the frontend closed its end; teardown follows.
        let _ = xen::evtchn::send(&self.hv, self.port);
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
