// SPDX-License-Identifier: MIT OR Apache-2.0
//! [`SharedMem`]: a window of memory that Xen or another domain writes concurrently.
//!
//! No Rust reference to the memory ever exists: every access is an atomic load, store
//! or read-modify-write at a byte offset, so a peer scribbling on the page at any time
//! cannot cause undefined behaviour here — only wrong values, which the safe layers
//! above validate.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// A shared memory window; cheap to copy (it does not own the memory).
#[derive(Clone, Copy, Debug)]
pub struct SharedMem {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: all access goes through atomics, so concurrent use from several CPUs is sound.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// Wraps `len` bytes at `base`.
    ///
    /// # Safety
    /// `base` must be 8-byte aligned, non-null and valid for reads and writes of `len`
    /// bytes for as long as any copy of the returned value is used, and the memory must
    /// only ever be accessed atomically (or by Xen/the peer domain) while it is.
    pub unsafe fn new(base: *mut u8, len: usize) -> Self {
        let base = NonNull::new(base).expect("SharedMem::new: null base");
        assert_eq!(
            base.as_ptr() as usize % 8,
            0,
            "SharedMem::new: base not 8-aligned"
        );
        Self { base, len }
    }

    /// Wraps memory the program owns forever, e.g. a leaked heap buffer in host tests or
    /// a `static` array in the kernel.
    pub fn from_static(words: &'static [AtomicU64]) -> Self {
        let len = core::mem::size_of_val(words);
        // SAFETY: the slice is 'static, 8-aligned (AtomicU64) and only accessed through
        // atomics by this type; the caller keeps using it only through atomics too.
        unsafe { Self::new(words.as_ptr() as *mut u8, len) }
    }

    /// Allocates a zeroed, leaked window of at least `len` bytes (set-up and tests).
    pub fn alloc_leaked(len: usize) -> Self {
        let words = alloc::vec::Vec::from_iter((0..len.div_ceil(8)).map(|_| AtomicU64::new(0)));
        Self::from_static(alloc::boxed::Box::leak(words.into_boxed_slice()))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte (to compute the guest frame of the window).
    pub fn base_addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// The sub-window `[offset, offset + len)`, if it lies inside this one.
    pub fn window(&self, offset: usize, len: usize) -> Option<SharedMem> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: in bounds of a window that is valid by construction.
        let base = unsafe { self.base.add(offset) };
        Some(SharedMem { base, len })
    }

    /// A pointer to an aligned `size`-byte field at `offset`. Offsets come from ABI
    /// constants and masked ring indices, so a bad one is a bug here: panic.
    fn field(&self, offset: usize, size: usize) -> *mut u8 {
        assert!(
            offset.checked_add(size).is_some_and(|end| end <= self.len),
            "SharedMem: access {offset}+{size} outside {} bytes",
            self.len
        );
        // SAFETY: in bounds (checked above).
        let ptr = unsafe { self.base.as_ptr().add(offset) };
        assert_eq!(
            ptr as usize % size,
            0,
            "SharedMem: misaligned {size}-byte access at {offset}"
        );
        ptr
    }

    fn u8_at(&self, offset: usize) -> &AtomicU8 {
        // SAFETY: `field` checked bounds and alignment; the memory is valid for the
        // lifetime of `self` and only accessed atomically (constructor contract).
        unsafe { &*(self.field(offset, 1) as *const AtomicU8) }
    }

    fn u16_at(&self, offset: usize) -> &AtomicU16 {
        // SAFETY: as in `u8_at`.
        unsafe { &*(self.field(offset, 2) as *const AtomicU16) }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: as in `u8_at`.
        unsafe { &*(self.field(offset, 4) as *const AtomicU32) }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: as in `u8_at`.
        unsafe { &*(self.field(offset, 8) as *const AtomicU64) }
    }

    pub fn load_u8(&self, offset: usize, order: Ordering) -> u8 {
        self.u8_at(offset).load(order)
    }

    pub fn store_u8(&self, offset: usize, value: u8, order: Ordering) {
        self.u8_at(offset).store(value, order)
    }

    pub fn swap_u8(&self, offset: usize, value: u8, order: Ordering) -> u8 {
        self.u8_at(offset).swap(value, order)
    }

    pub fn load_u16(&self, offset: usize, order: Ordering) -> u16 {
        self.u16_at(offset).load(order)
    }

    pub fn store_u16(&self, offset: usize, value: u16, order: Ordering) {
        self.u16_at(offset).store(value, order)
    }

    /// Compare-and-swap; `Ok(old)` when it swapped, `Err(actual)` otherwise.
    pub fn compare_exchange_u16(&self, offset: usize, current: u16, new: u16) -> Result<u16, u16> {
        self.u16_at(offset)
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
    }

    pub fn load_u32(&self, offset: usize, order: Ordering) -> u32 {
        self.u32_at(offset).load(order)
    }

    pub fn store_u32(&self, offset: usize, value: u32, order: Ordering) {
        self.u32_at(offset).store(value, order)
    }

    pub fn load_u64(&self, offset: usize, order: Ordering) -> u64 {
        self.u64_at(offset).load(order)
    }

    pub fn store_u64(&self, offset: usize, value: u64, order: Ordering) {
        self.u64_at(offset).store(value, order)
    }

    pub fn swap_u64(&self, offset: usize, value: u64, order: Ordering) -> u64 {
        self.u64_at(offset).swap(value, order)
    }

    pub fn fetch_and_u64(&self, offset: usize, value: u64, order: Ordering) -> u64 {
        self.u64_at(offset).fetch_and(value, order)
    }

    pub fn fetch_or_u64(&self, offset: usize, value: u64, order: Ordering) -> u64 {
        self.u64_at(offset).fetch_or(value, order)
    }

    fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "SharedMem: bytes {offset}+{len} outside {} bytes",
            self.len
        );
    }

    /// The atomic word at `offset`, which must be 8-aligned and in bounds (the caller
    /// checked the range it copies once).
    fn word_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: in bounds and 8-aligned (the base is 8-aligned by construction, the
        // caller checked the range and the offset's alignment); valid for the lifetime of
        // `self` and only accessed atomically (constructor contract).
        unsafe { &*(self.base.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// The atomic byte at `offset`, in bounds (the caller checked the range).
    fn byte_at(&self, offset: usize) -> &AtomicU8 {
        debug_assert!(offset < self.len);
        // SAFETY: in bounds (checked by the caller); as in `word_at`.
        unsafe { &*(self.base.as_ptr().add(offset) as *const AtomicU8) }
    }

    /// Copies `dst.len()` bytes out with relaxed atomic loads: 8 bytes per load where the
    /// offset is 8-aligned (a ring slot, a whole request or response), single bytes at an
    /// unaligned head or tail. Ordering comes from the ring indices' acquire/release; the
    /// range is checked once.
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) {
        self.check_range(offset, dst.len());
        if offset.is_multiple_of(8) && dst.len().is_multiple_of(8) {
            // Whole words (ring slots, responses): the common case, without the edges.
            for (i, word) in dst.chunks_exact_mut(8).enumerate() {
                let value = self.word_at(offset + 8 * i).load(Ordering::Relaxed);
                word.copy_from_slice(&value.to_le_bytes());
            }
            return;
        }
        let head = offset.wrapping_neg() % 8;
        let head = head.min(dst.len());
        let (head_bytes, rest) = dst.split_at_mut(head);
        for (i, byte) in head_bytes.iter_mut().enumerate() {
            *byte = self.byte_at(offset + i).load(Ordering::Relaxed);
        }
        let mut at = offset + head;
        let mut words = rest.chunks_exact_mut(8);
        for word in &mut words {
            let value = self.word_at(at).load(Ordering::Relaxed);
            word.copy_from_slice(&value.to_le_bytes());
            at += 8;
        }
        for byte in words.into_remainder() {
            *byte = self.byte_at(at).load(Ordering::Relaxed);
            at += 1;
        }
    }

    /// Copies `src` in with relaxed atomic stores, 8 bytes per store where the offset is
    /// 8-aligned and single bytes at an unaligned head or tail (as `read_bytes`).
    pub fn write_bytes(&self, offset: usize, src: &[u8]) {
        self.check_range(offset, src.len());
        if offset.is_multiple_of(8) && src.len().is_multiple_of(8) {
            for (i, word) in src.chunks_exact(8).enumerate() {
                let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                self.word_at(offset + 8 * i).store(value, Ordering::Relaxed);
            }
            return;
        }
        let head = offset.wrapping_neg() % 8;
        let head = head.min(src.len());
        let (head_bytes, rest) = src.split_at(head);
        for (i, byte) in head_bytes.iter().enumerate() {
            self.byte_at(offset + i).store(*byte, Ordering::Relaxed);
        }
        let mut at = offset + head;
        let mut words = rest.chunks_exact(8);
        for word in &mut words {
            let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            self.word_at(at).store(value, Ordering::Relaxed);
            at += 8;
        }
        for byte in words.remainder() {
            self.byte_at(at).store(*byte, Ordering::Relaxed);
            at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_and_stores_round_trip() {
        let mem = SharedMem::alloc_leaked(64);
        assert_eq!(mem.len(), 64);
        mem.store_u64(8, 0x1122_3344_5566_7788, Ordering::Release);
        assert_eq!(mem.load_u64(8, Ordering::Acquire), 0x1122_3344_5566_7788);
        // Little-endian view of the same bytes.
        assert_eq!(mem.load_u32(8, Ordering::Relaxed), 0x5566_7788);
        assert_eq!(mem.load_u16(14, Ordering::Relaxed), 0x1122);
        assert_eq!(mem.load_u8(8, Ordering::Relaxed), 0x88);
        mem.write_bytes(20, b"hello");
        let mut out = [0u8; 5];
        mem.read_bytes(20, &mut out);
        assert_eq!(&out, b"hello");
        assert_eq!(mem.compare_exchange_u16(20, 0x6568, 7), Ok(0x6568));
        assert_eq!(mem.compare_exchange_u16(20, 0x6568, 9), Err(7));
    }

    #[test]
    fn copies_at_every_alignment_and_length_match_byte_by_byte() {
        let mem = SharedMem::alloc_leaked(64);
        for offset in 0..24 {
            for len in 0..=40 {
                let data: Vec<u8> = (0..len).map(|i| (offset * 41 + i * 7 + 1) as u8).collect();
                // Fill around the range, so a copy that strays is seen.
                for at in 0..64 {
                    mem.store_u8(at, 0xEE, Ordering::Relaxed);
                }
                mem.write_bytes(offset, &data);
                for at in 0..64 {
                    let expected = if (offset..offset + len).contains(&at) {
                        data[at - offset]
                    } else {
                        0xEE
                    };
                    assert_eq!(
                        mem.load_u8(at, Ordering::Relaxed),
                        expected,
                        "{offset}+{len} @{at}"
                    );
                }
                let mut out = vec![0u8; len];
                mem.read_bytes(offset, &mut out);
                assert_eq!(out, data, "{offset}+{len}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_write_past_the_end_panics() {
        let mem = SharedMem::alloc_leaked(16);
        mem.write_bytes(9, &[1; 8]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_read_past_the_end_panics() {
        let mem = SharedMem::alloc_leaked(16);
        mem.read_bytes(8, &mut [0; 9]);
    }

    #[test]
    fn windows_are_bounded() {
        let mem = SharedMem::alloc_leaked(64);
        let win = mem.window(16, 16).unwrap();
        win.store_u32(0, 5, Ordering::Relaxed);
        assert_eq!(mem.load_u32(16, Ordering::Relaxed), 5);
        assert!(mem.window(60, 8).is_none());
        assert!(mem.window(usize::MAX, 2).is_none());
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_access_panics() {
        SharedMem::alloc_leaked(16).load_u64(16, Ordering::Relaxed);
    }

    #[test]
    #[should_panic(expected = "misaligned")]
    fn misaligned_access_panics() {
        SharedMem::alloc_leaked(16).load_u32(2, Ordering::Relaxed);
    }
}
