// SPDX-License-Identifier: MIT OR Apache-2.0
//! The guest-physical pages foreign grants are mapped at.

use super::free_list::{FreeError, IndexFreeList};
use crate::abi::PAGE_SIZE;

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

#[cfg(test)]
mod tests {
    use super::*;

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
