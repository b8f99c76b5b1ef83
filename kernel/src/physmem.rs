// SPDX-License-Identifier: MIT OR Apache-2.0
//! Physical memory through the boot identity map: the one place the kernel reads and
//! writes memory it names by physical address (DMA memory and bounce pools, foreign
//! pages mapped into our map space, firmware tables, the boot information).
//!
//! `boot` maps physical `0..IDENTITY_MAPPED_LIMIT` at the same virtual addresses, so a
//! physical address below the limit is also a pointer. Every function checks, once per
//! call, that its whole range lies in `1..IDENTITY_MAPPED_LIMIT`, and panics otherwise:
//! a range outside is a caller's bug, and beyond the identity map there is no telling
//! what an access would touch. Nothing is checked per byte: the copies are plain
//! `memcpy`s, or, for whole 64-byte blocks (the data of block requests: sectors, pages),
//! the bulk copy the boot measured fastest on this CPU ([`crate::arch::copy`]).
//!
//! A device or another domain reads and writes much of this memory behind the
//! compiler's back, so the copies carry compiler fences: a read is followed by an
//! Acquire fence (later code does not move before it; the caller has already seen the
//! completion or index that announced the data), a write is preceded by a Release fence
//! (everything written before is done when the copy starts; the caller then publishes
//! it with its own barrier and doorbell). Ordering against the other agent itself (a
//! CPU fence, a volatile index) stays the caller's business.
//!
//! # Safety
//!
//! The unsafe functions share one contract: the caller names memory it may access
//! for the duration of the call, which is one of
//! - DMA memory it allocated (`devices::hal::allocate_dma`) and still owns;
//! - a foreign page mapped for it (a grant in its ring's map region, or a ring page)
//!   that stays mapped until the call returns;
//! - firmware tables or boot information, which nothing writes (reads only).
//!
//! and no Rust reference to those bytes is live while the call runs. A device or
//! another domain may write the memory concurrently: the copies move bytes, never typed
//! values, so the worst outcome is bytes the caller must not yet trust (it checks a
//! completion or an index first).

use crate::arch::paging::IDENTITY_MAPPED_LIMIT;
use core::sync::atomic::{compiler_fence, Ordering};

/// Whether `len` bytes at `address` lie inside the identity map (and not at address
/// 0): the check every function below makes, for callers that refuse an untrusted
/// address instead of panicking.
#[inline]
pub fn in_identity_map(address: u64, len: usize) -> bool {
    address != 0
        && address
            .checked_add(len as u64)
            .is_some_and(|end| end <= IDENTITY_MAPPED_LIMIT)
}

/// The pointer for `len` bytes at `address`, or a panic when they leave the map.
#[inline]
#[track_caller]
fn pointer(address: u64, len: usize) -> *mut u8 {
    if !in_identity_map(address, len) {
        outside(address, len);
    }
    address as *mut u8
}

#[cold]
#[inline(never)]
#[track_caller]
fn outside(address: u64, len: usize) -> ! {
    panic!("physmem: {len} bytes at {address:#x} are outside the identity map")
}

/// Copies `len` bytes from `from` to `to`: by blocks when `len` is made of them.
///
/// # Safety
/// As `core::ptr::copy_nonoverlapping`.
#[inline]
unsafe fn copy_bytes(from: *const u8, to: *mut u8, len: usize) {
    if len.is_multiple_of(crate::arch::copy::BLOCK) && len > 0 {
        // SAFETY: the caller's contract, and `len` is a non-zero multiple of BLOCK.
        unsafe { crate::arch::copy::copy(to, from, len) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { core::ptr::copy_nonoverlapping(from, to, len) }
    }
}

/// Copies `out.len()` bytes at physical `address` into `out`.
///
/// # Safety
/// See the module documentation: `address..address + out.len()` is memory the caller
/// may read (and `out` is not inside it).
#[inline]
#[track_caller]
pub unsafe fn read(address: u64, out: &mut [u8]) {
    let from = pointer(address, out.len());
    // SAFETY: the range is identity mapped (checked) and readable by the caller's
    // contract; `out` is a distinct, exclusive buffer of the same length.
    unsafe { copy_bytes(from, out.as_mut_ptr(), out.len()) };
    compiler_fence(Ordering::Acquire);
}

/// Copies `data` to physical `address`.
///
/// # Safety
/// See the module documentation: `address..address + data.len()` is memory the caller
/// may write (and `data` is not inside it).
#[inline]
#[track_caller]
pub unsafe fn write(address: u64, data: &[u8]) {
    let to = pointer(address, data.len());
    compiler_fence(Ordering::Release);
    // SAFETY: the range is identity mapped (checked) and writable by the caller's
    // contract; `data` is a distinct buffer of the same length.
    unsafe { copy_bytes(data.as_ptr(), to, data.len()) };
}

/// Copies `len` bytes from physical `from` to physical `to` (a bounce page to a grant).
///
/// # Safety
/// See the module documentation: the caller may read `from..from + len` and write
/// `to..to + len`, and the two ranges do not overlap.
#[inline]
#[track_caller]
pub unsafe fn copy(from: u64, to: u64, len: usize) {
    let (source, target) = (pointer(from, len), pointer(to, len));
    compiler_fence(Ordering::SeqCst);
    // SAFETY: both ranges are identity mapped (checked), readable and writable as the
    // caller's contract says, and disjoint.
    unsafe { copy_bytes(source, target, len) };
    compiler_fence(Ordering::SeqCst);
}

/// Zeroes `len` bytes at physical `address`.
///
/// # Safety
/// As for [`write`].
#[inline]
#[track_caller]
pub unsafe fn zero(address: u64, len: usize) {
    let to = pointer(address, len);
    // SAFETY: as in `write`.
    unsafe { core::ptr::write_bytes(to, 0, len) };
    compiler_fence(Ordering::Release);
}

/// The `len` bytes at physical `address` as a slice, for code that fills a buffer in
/// place (a bounce page handed to `BufferAccess::read_buffer`).
///
/// # Safety
/// The caller may write the range (module documentation) and nothing else, device or
/// CPU, reads or writes it while the slice lives (no device request names it), so the
/// slice is the only access for `'a`.
#[inline]
#[track_caller]
pub unsafe fn bytes_mut<'a>(address: u64, len: usize) -> &'a mut [u8] {
    let at = pointer(address, len);
    // SAFETY: identity mapped (checked), non-null, valid for `len` bytes of `u8` (any
    // value is valid), and exclusively the caller's for `'a` by its contract.
    unsafe { core::slice::from_raw_parts_mut(at, len) }
}

/// One 16-bit load the compiler may neither merge nor hoist (an index a device
/// advances).
///
/// # Safety
/// As for [`read`]; `address` is 2-byte aligned.
#[inline]
#[track_caller]
pub unsafe fn load_u16(address: u64) -> u16 {
    let at = pointer(address, 2);
    debug_assert!(address.is_multiple_of(2));
    // SAFETY: identity mapped (checked), aligned and readable by the caller's contract.
    unsafe { core::ptr::read_volatile(at as *const u16) }
}

/// One 32-bit load the compiler may neither merge nor hoist (a completion's phase
/// word).
///
/// # Safety
/// As for [`read`]; `address` is 4-byte aligned.
#[inline]
#[track_caller]
pub unsafe fn load_u32(address: u64) -> u32 {
    let at = pointer(address, 4);
    debug_assert!(address.is_multiple_of(4));
    // SAFETY: identity mapped (checked), aligned and readable by the caller's contract.
    unsafe { core::ptr::read_volatile(at as *const u32) }
}

/// Copies a `T` from physical `address` (unaligned is fine).
///
/// # Safety
/// As for [`read`]; and every bit pattern is a valid `T` (plain integers, as the boot
/// structures are).
#[inline]
#[track_caller]
pub unsafe fn read_value<T: Copy>(address: u64) -> T {
    let at = pointer(address, core::mem::size_of::<T>());
    // SAFETY: identity mapped (checked) and readable by the caller's contract; any bit
    // pattern is a valid `T` by the same contract.
    let value = unsafe { core::ptr::read_unaligned(at as *const T) };
    compiler_fence(Ordering::Acquire);
    value
}
