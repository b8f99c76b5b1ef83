// SPDX-License-Identifier: MIT OR Apache-2.0
//! Page-table changes after boot. `boot` identity-maps 0..4 GiB with 2 MiB pages; the
//! kernel maps 4 KiB pages elsewhere (grant mappings, MMIO, tests) through the
//! `x86_64` crate's mapper, with page-table frames from the frame allocator.

use x86_64::registers::control::Cr3;
use x86_64::structures::paging::mapper::MapToError;
use x86_64::structures::paging::{
    FrameAllocator, Mapper, OffsetPageTable, Page, PageTable, PageTableFlags, PhysFrame, Size4KiB,
    Translate,
};
use x86_64::{PhysAddr, VirtAddr};

/// Physical memory below this is identity mapped by `boot`.
pub const IDENTITY_MAPPED_LIMIT: u64 = 4 << 30;

/// Serialises page-table edits between CPUs (control path only, never the I/O path).
static PAGE_TABLE_LOCK: spin::Mutex<()> = spin::Mutex::new(());

struct KernelFrames;

// SAFETY: frames come from the kernel's frame allocator, are unused, and lie below
// IDENTITY_MAPPED_LIMIT, so the mapper can zero and edit them through the identity map.
unsafe impl FrameAllocator<Size4KiB> for KernelFrames {
    fn allocate_frame(&mut self) -> Option<PhysFrame> {
        let paddr = crate::mm::allocate_frame().ok()?;
        Some(PhysFrame::containing_address(PhysAddr::new(paddr)))
    }
}

fn with_mapper<R>(f: impl FnOnce(&mut OffsetPageTable<'static>) -> R) -> R {
    let _guard = PAGE_TABLE_LOCK.lock();
    let (level_4, _) = Cr3::read();
    let table = level_4.start_address().as_u64() as *mut PageTable;
    // SAFETY: CR3 names the live level-4 table, which (like every page-table frame we
    // allocate) is below 4 GiB and so identity mapped; the lock makes this the only
    // mutable view while `f` runs.
    let mut mapper = unsafe { OffsetPageTable::new(&mut *table, VirtAddr::zero()) };
    f(&mut mapper)
}

#[derive(Debug)]
pub enum MapError {
    AlreadyMapped,
    InsideHugePage,
    OutOfFrames,
    #[cfg(feature = "test-hooks")]
    NotMapped,
}

impl core::fmt::Display for MapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MapError::AlreadyMapped => "the page is already mapped",
            MapError::InsideHugePage => "the page lies inside a huge page",
            MapError::OutOfFrames => "no frame left for a page table",
            #[cfg(feature = "test-hooks")]
            MapError::NotMapped => "the page is not mapped",
        })
    }
}

impl core::error::Error for MapError {}

/// Maps the 4 KiB page at `virt` to the frame at `phys`.
pub fn map_page(virt: u64, phys: u64, flags: PageTableFlags) -> Result<(), MapError> {
    let page = Page::<Size4KiB>::containing_address(VirtAddr::new(virt));
    let frame = PhysFrame::containing_address(PhysAddr::new(phys));
    with_mapper(|mapper| {
        // SAFETY: callers map pages outside the identity-mapped kernel range (enforced
        // below by the mapper refusing huge-page parents), so no existing Rust reference
        // is invalidated by the new mapping.
        let flush = unsafe {
            mapper.map_to(
                page,
                frame,
                flags | PageTableFlags::PRESENT,
                &mut KernelFrames,
            )
        }
        .map_err(|e| match e {
            MapToError::FrameAllocationFailed => MapError::OutOfFrames,
            MapToError::ParentEntryHugePage => MapError::InsideHugePage,
            MapToError::PageAlreadyMapped(_) => MapError::AlreadyMapped,
        })?;
        flush.flush();
        Ok(())
    })
}

/// Unmaps the 4 KiB page at `virt`; returns the frame it mapped.
#[cfg(feature = "test-hooks")]
pub fn unmap_page(virt: u64) -> Result<u64, MapError> {
    let page = Page::<Size4KiB>::containing_address(VirtAddr::new(virt));
    with_mapper(|mapper| {
        let (frame, flush) = mapper.unmap(page).map_err(|e| match e {
            x86_64::structures::paging::mapper::UnmapError::ParentEntryHugePage => {
                MapError::InsideHugePage
            }
            _ => MapError::NotMapped,
        })?;
        flush.flush();
        Ok(frame.start_address().as_u64())
    })
}

/// The physical address `virt` maps to, if any.
pub fn translate(virt: u64) -> Option<u64> {
    with_mapper(|mapper| {
        mapper
            .translate_addr(VirtAddr::new(virt))
            .map(|p| p.as_u64())
    })
}
