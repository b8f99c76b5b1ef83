// SPDX-License-Identifier: MIT OR Apache-2.0
//! A free list of indices, for our grant refs and the map area's pages.

use alloc::vec;
use alloc::vec::Vec;

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

#[cfg(test)]
mod tests {
    use super::*;
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
}
