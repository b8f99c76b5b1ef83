// SPDX-License-Identifier: MIT OR Apache-2.0
//! Bulk copies of whole 64-byte blocks (the data of block requests: grant pages, RAM-disk
//! stripes, bounce pages, indirect pages), by whichever of two ways this CPU runs
//! faster, measured once at boot ([`calibrate`]), as Linux picks its RAID and XOR
//! routines.
//!
//! - `rep movsq`, what the image's `memcpy` (compiler_builtins, without `ermsb`) does
//!   for the body of a copy. On hardware it is the fastest for 4 KiB.
//! - A loop of eight 8-byte loads and eight stores per 64 bytes, in assembly so that the
//!   compiler cannot turn it into SSE. Under QEMU's TCG every iteration of a `rep`
//!   string instruction is emulated on its own and 128-bit SSE moves are slow, while
//!   plain 8-byte moves are translated into a few host instructions each: there the loop
//!   is the faster way, by far (and `rep movsb`, Linux's memcpy on a CPU with ERMS, the
//!   slowest); natively the three are close.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, Ordering};

use alloc::vec;
use log::info;

/// The copies take the 8-byte loop (else `rep movsq`).
static LOOP: AtomicBool = AtomicBool::new(false);

/// Block size both ways copy in; [`copy`] takes multiples of it.
pub const BLOCK: usize = 64;

/// Copies `len` bytes (a non-zero multiple of [`BLOCK`]) from `from` to `to`.
///
/// # Safety
/// `from..from + len` is readable, `to..to + len` writable, for the whole call; the two
/// ranges do not overlap.
#[inline]
pub unsafe fn copy(to: *mut u8, from: *const u8, len: usize) {
    debug_assert!(len > 0 && len.is_multiple_of(BLOCK));
    if LOOP.load(Ordering::Relaxed) {
        // SAFETY: as this function's contract.
        unsafe { copy_loop(to, from, len) }
    } else {
        // SAFETY: as this function's contract.
        unsafe { copy_movsq(to, from, len) }
    }
}

/// # Safety
/// As [`copy`].
#[inline]
unsafe fn copy_movsq(to: *mut u8, from: *const u8, len: usize) {
    // SAFETY: RCX quadwords are read from RSI and written to RDI, ascending (the ABI
    // keeps the direction flag clear): exactly the two ranges of the caller's contract.
    unsafe {
        asm!(
            "rep movsq",
            inout("rcx") len / 8 => _,
            inout("rdi") to => _,
            inout("rsi") from => _,
            options(nostack, preserves_flags)
        );
    }
}

/// # Safety
/// As [`copy`].
#[inline]
unsafe fn copy_loop(to: *mut u8, from: *const u8, len: usize) {
    // SAFETY: each iteration loads the 64 bytes at RSI and stores them at RDI, then
    // advances both by 64 and counts RCX down by 64 until it reaches 0: it touches
    // exactly `from..from + len` (reads) and `to..to + len` (writes), `len` being a
    // non-zero multiple of 64 (the caller's contract).
    unsafe {
        asm!(
            "2:",
            "mov rax, [rsi]",
            "mov rdx, [rsi + 8]",
            "mov r8, [rsi + 16]",
            "mov r9, [rsi + 24]",
            "mov r10, [rsi + 32]",
            "mov r11, [rsi + 40]",
            "mov r13, [rsi + 48]",
            "mov r12, [rsi + 56]",
            "mov [rdi], rax",
            "mov [rdi + 8], rdx",
            "mov [rdi + 16], r8",
            "mov [rdi + 24], r9",
            "mov [rdi + 32], r10",
            "mov [rdi + 40], r11",
            "mov [rdi + 48], r13",
            "mov [rdi + 56], r12",
            "add rsi, 64",
            "add rdi, 64",
            "sub rcx, 64",
            "jnz 2b",
            inout("rcx") len => _,
            inout("rdi") to => _,
            inout("rsi") from => _,
            out("rax") _,
            out("rdx") _,
            out("r8") _,
            out("r9") _,
            out("r10") _,
            out("r11") _,
            out("r13") _,
            out("r12") _,
            options(nostack)
        );
    }
}

pub(super) fn tsc() -> u64 {
    // SAFETY: RDTSC only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Times both ways on 4 KiB pages (256 copies per round, best of three rounds each,
/// alternating, so a trapped RDTSC, slow under Xen's default `tsc_mode`, weighs the
/// same on both) and keeps the faster for every copy from now on. Call once at boot, on
/// the boot CPU, before other CPUs run (they read the choice).
pub fn calibrate() {
    const PAGE: usize = 4096;
    const COPIES: u64 = 256;
    let mut buffer = vec![0x5au8; 2 * PAGE];
    let (from, to) = buffer.split_at_mut(PAGE);
    let mut best = [u64::MAX; 2];
    for _ in 0..3 {
        for (way, best) in best.iter_mut().enumerate() {
            let start = tsc();
            for _ in 0..COPIES {
                // SAFETY: two distinct 4 KiB halves of `buffer`, which lives for the call.
                unsafe {
                    if way == 0 {
                        copy_movsq(to.as_mut_ptr(), from.as_ptr(), PAGE)
                    } else {
                        copy_loop(to.as_mut_ptr(), from.as_ptr(), PAGE)
                    }
                }
                core::hint::black_box(&mut *to);
            }
            *best = (*best).min(tsc().wrapping_sub(start) / COPIES);
        }
    }
    debug_assert!(to.iter().all(|&b| b == 0x5a));
    let uses_loop = best[1] < best[0];
    LOOP.store(uses_loop, Ordering::Relaxed);
    info!(
        "copy: 4 KiB in {} TSC ticks by rep movsq, {} by 8-byte moves: using {}",
        best[0],
        best[1],
        if uses_loop {
            "8-byte moves"
        } else {
            "rep movsq"
        }
    );
}

/// Both ways copy exactly the bytes asked for: every length in blocks up to 8 KiB, at
/// aligned and unaligned addresses, with the bytes around the target untouched. A
/// failure names the way, the length and the offset.
#[cfg(feature = "test-hooks")]
pub fn self_check() -> Result<(), (&'static str, usize, usize)> {
    const MAX: usize = 8192;
    let source: alloc::vec::Vec<u8> = (0..MAX + 64).map(|i| (i * 7 + 3) as u8).collect();
    let mut target = vec![0u8; MAX + 128];
    for (name, way) in [
        (
            "rep movsq",
            copy_movsq as unsafe fn(*mut u8, *const u8, usize),
        ),
        ("8-byte moves", copy_loop),
    ] {
        for offset in [0, 1, 8, 13, 64] {
            for len in (BLOCK..=MAX).step_by(BLOCK) {
                target.fill(0xee);
                // SAFETY: `offset + len` bytes fit in both vectors (64 spare in the
                // source, 128 in the target), which do not overlap.
                unsafe {
                    way(
                        target.as_mut_ptr().add(offset),
                        source.as_ptr().add(offset),
                        len,
                    )
                };
                let copied = target[offset..offset + len] == source[offset..offset + len];
                let around = target[..offset]
                    .iter()
                    .chain(&target[offset + len..])
                    .all(|&b| b == 0xee);
                if !(copied && around) {
                    return Err((name, len, offset));
                }
            }
        }
    }
    Ok(())
}
