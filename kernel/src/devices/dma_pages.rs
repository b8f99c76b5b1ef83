// SPDX-License-Identifier: MIT OR Apache-2.0
//! CPU access to whole pages of DMA memory a kernel-side user allocated (the disk test's
//! buffers, the partition-table reader's): for a device that copies with the CPU (the RAM
//! disk; DMA devices never call it). Any address outside those pages is refused, so the
//! copies touch only memory the user owns.

use super::hal::PAGE;
use crate::physmem;
use blkdev::BufferAccess;
#[cfg(feature = "test-hooks")]
use blkdev::DmaSegment;

#[derive(Clone, Copy)]
pub struct DmaPages {
    /// Physical address of the first page.
    pub base: u64,
    pub pages: usize,
}

impl DmaPages {
    /// No pages: for requests without data.
    #[cfg(feature = "test-hooks")]
    pub const NONE: DmaPages = DmaPages { base: 0, pages: 0 };

    /// Physical address of `len` bytes at `offset` of page `buffer`, if that is one of
    /// these pages and the bytes stay inside it.
    fn address(&self, buffer: u64, offset: usize, len: usize) -> Option<u64> {
        let page = buffer.checked_sub(self.base)?;
        let inside = page.is_multiple_of(PAGE) && page / PAGE < self.pages as u64;
        (inside && offset.checked_add(len)? <= PAGE as usize).then_some(buffer + offset as u64)
    }

    /// Copies `data` into the pages along `segments` (which name these pages).
    #[cfg(feature = "test-hooks")]
    pub fn scatter(&self, segments: &[DmaSegment], data: &[u8]) {
        let mut at = 0;
        for s in segments {
            let len = s.len as usize;
            let copied = self.write_buffer(s.buffer, s.offset as usize, &data[at..at + len]);
            assert!(copied, "segment outside its DMA pages");
            at += len;
        }
    }

    /// Copies the pages along `segments` (which name these pages) into `data`.
    #[cfg(feature = "test-hooks")]
    pub fn gather(&self, segments: &[DmaSegment], data: &mut [u8]) {
        let mut at = 0;
        for s in segments {
            let len = s.len as usize;
            let copied = self.read_buffer(s.buffer, s.offset as usize, &mut data[at..at + len]);
            assert!(copied, "segment outside its DMA pages");
            at += len;
        }
    }
}

impl BufferAccess for DmaPages {
    fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
        let Some(address) = self.address(buffer, offset, out.len()) else {
            return false;
        };
        // SAFETY: the bytes lie in one of these DMA pages (checked above), which their
        // user allocated and owns; `out` is the caller's own memory.
        unsafe { physmem::read(address, out) };
        true
    }

    fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
        let Some(address) = self.address(buffer, offset, data.len()) else {
            return false;
        };
        // SAFETY: as in `read_buffer`.
        unsafe { physmem::write(address, data) };
        true
    }

    fn cpu_address(&self, buffer: u64, offset: usize, len: usize) -> Option<u64> {
        self.address(buffer, offset, len)
    }
}
