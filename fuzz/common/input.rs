// SPDX-License-Identifier: MIT OR Apache-2.0
//! A fuzz input read front to back; past its end every byte reads as zero. Each target
//! includes this file and uses some of its readers.
#![allow(dead_code)]

pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn byte(&mut self) -> u8 {
        let (&first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        first
    }
    /// `n` bytes little-endian (missing ones zero).
    pub fn uint(&mut self, n: usize) -> u64 {
        (0..n).fold(0, |v, i| v | u64::from(self.byte()) << (8 * i))
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }
}
