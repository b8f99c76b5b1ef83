// SPDX-License-Identifier: MIT OR Apache-2.0
//! Bounce buffers for a disk the device model emulates, under Xen: the pool in our RAM
//! and the copies with the hypervisor that `blkdev::bounce` (the bookkeeping, host
//! tested) moves data through. qemu-xen reaches an HVM domain's memory only through its
//! map of guest RAM, and foreign grants are mapped above RAM, so such a device cannot DMA
//! to them; passed-through devices DMA through the IOMMU, which sees grant mappings: no
//! bounce. Copies to and from the guests' grants are `GNTTABOP_copy` batches, one
//! hypercall per request each way, as QEMU's xen-block does with `xengnttab_grant_copy`:
//! an unmap of a grant makes Xen ask the device model to invalidate its map cache, and
//! qemu-xen answers only once every disk request it holds is done, so a disk that maps
//! nothing cannot stall a vCPU that way.

use super::hal::allocate_dma;
use super::open::Queue;
use crate::physmem;
use alloc::sync::Arc;
use alloc::vec::Vec;
use blkdev::bounce::{BouncePool, PageCopy, PAGE};
use blkdev::BufferAccess;
use core::fmt;
use core::sync::atomic::AtomicU64;
use xen::abi::grant_table::GnttabCopy;
use xen::grant::{copy_batch, copy_request, BatchError, CopySide};
use xen::raw::hypercall::NativeHypervisor;

pub use blkdev::bounce::POOL_PAGES;

/// A device queue behind bounce buffers in our RAM.
pub type BounceQueue = blkdev::bounce::BounceQueue<Queue, RamPool>;

/// Tags a queue keeps room for when it is made: a ring's slots, the engine's tags.
const TAGS: usize = blkback::abi::ring_slots(blkback::abi::MAX_RING_PAGE_ORDER) as usize;

/// `inner` behind a pool of its own (zeroed), or `None` without the memory for it.
pub fn new(inner: Queue, bounced_bytes: Arc<AtomicU64>) -> Option<BounceQueue> {
    Some(blkdev::bounce::BounceQueue::new(
        inner,
        RamPool::new()?,
        TAGS,
        bounced_bytes,
    ))
}

/// [`POOL_PAGES`] pages of our RAM, identity mapped, which devices DMA to; grant copies
/// with the hypervisor.
pub struct RamPool {
    /// Physical (= identity-mapped virtual) address of the first page.
    base: u64,
    /// One request's `GNTTABOP_copy` entries, one per pool page at most: made with the
    /// pool, so a copy allocates nothing.
    entries: Vec<GnttabCopy>,
    /// What issues them (`None` without Xen: no buffer is then foreign).
    hv: Option<NativeHypervisor>,
}

impl RamPool {
    fn new() -> Option<RamPool> {
        // Zeroed: the heap hands back memory other disks' guests wrote (a RAM disk's
        // stripes, another pool), and a device that reports a read done without writing
        // all of it (short, or faulty) would have that copied out to this guest.
        let base = allocate_dma(POOL_PAGES)?;
        Some(RamPool {
            base,
            entries: Vec::with_capacity(POOL_PAGES),
            hv: crate::xen_domain::get().map(|xen| xen.hv),
        })
    }

    /// Where bytes `offset..offset + len` of `page` are: inside the pool (checked).
    fn span(&self, page: u16, offset: usize, len: usize) -> u64 {
        assert!(usize::from(page) < POOL_PAGES && offset + len <= PAGE);
        self.base + u64::from(page) * PAGE as u64 + offset as u64
    }
}

/// Why a batch of grant copies failed.
pub enum CopyFailed {
    /// Not under Xen: a foreign page cannot be reached at all.
    NoHypervisor,
    Batch(BatchError),
}

impl fmt::Display for CopyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyFailed::NoHypervisor => f.write_str("no hypervisor to copy with"),
            CopyFailed::Batch(error) => error.fmt(f),
        }
    }
}

impl BouncePool for RamPool {
    type CopyError = CopyFailed;

    fn dma_address(&self, page: u16) -> u64 {
        self.span(page, 0, 0)
    }

    fn fill(
        &mut self,
        page: u16,
        offset: usize,
        len: usize,
        buffers: &dyn BufferAccess,
        buffer: u64,
    ) -> bool {
        let at = self.span(page, offset, len);
        // SAFETY: `at..at + len` lies inside this pool's page `page` (checked by `span`),
        // memory `allocate_dma` gave this pool alone; the bounce queue fills only pages
        // off its free list, which no device request uses now.
        let bounce = unsafe { physmem::bytes_mut(at, len) };
        buffers.read_buffer(buffer, offset, bounce)
    }

    fn copy_out(&mut self, page: u16, offset: usize, len: usize, target: u64) {
        let from = self.span(page, offset, len);
        // SAFETY: `from` is inside this pool's page (checked by `span`), which the device
        // has finished with (its completion is being handled); `target` is what
        // `BufferAccess::cpu_address` gave at submit for these `len` bytes (inside a page
        // holding a grant mapped for this request), which stays mapped until the engine
        // hears the request is done, after this copy.
        unsafe { physmem::copy(from, target, len) };
    }

    fn grant_copy(&mut self, copies: &[PageCopy]) -> Result<(), CopyFailed> {
        let hv = self.hv.ok_or(CopyFailed::NoHypervisor)?;
        self.entries.clear();
        for copy in copies {
            let ours = CopySide::Local {
                gfn: self.span(copy.page, 0, 0) >> 12,
                offset: copy.offset as u16,
            };
            let theirs = CopySide::Grant {
                dom: copy.foreign.domain,
                gref: copy.foreign.gref,
                offset: copy.offset as u16,
            };
            self.entries.push(if copy.to_guest {
                copy_request(ours, theirs, copy.len as u16)
            } else {
                copy_request(theirs, ours, copy.len as u16)
            });
        }
        copy_batch(&hv, &mut self.entries).map_err(CopyFailed::Batch)
    }
}
