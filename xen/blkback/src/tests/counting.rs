// SPDX-License-Identifier: MIT OR Apache-2.0
//! The allocator of this crate's tests: the system's, counting the bytes each thread
//! holds, so a test measures what a piece of code really allocates.
#![allow(unsafe_code, reason = "a test allocator that counts bytes")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

thread_local! {
    /// Bytes this thread allocated and has not freed (freeing another thread's
    /// allocation counts down here: only differences within one thread mean anything).
    static HELD: Cell<isize> = const { Cell::new(0) };
    /// The most `HELD` reached since the last `reset_peak`.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(bytes: isize) {
    let _ = HELD.try_with(|held| {
        held.set(held.get() + bytes);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(held.get())));
    });
}

/// Bytes this thread holds now.
pub fn held() -> isize {
    HELD.with(Cell::get)
}

/// Starts a new peak from what the thread holds now.
pub fn reset_peak() {
    PEAK.with(|peak| peak.set(held()));
}

/// The most this thread held since `reset_peak`.
pub fn peak() -> isize {
    PEAK.with(Cell::get)
}

// SAFETY: every call goes unchanged to the system allocator, with the caller's block and
// layout; the counters are const-initialised thread-local cells, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's layout, handed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's layout, handed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        count(size as isize - layout.size() as isize);
        // SAFETY: the caller's block, layout and size, handed on.
        unsafe { System.realloc(block, layout, size) }
    }
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: the caller's block and layout, handed on.
        unsafe { System.dealloc(block, layout) }
    }
}
