// SPDX-License-Identifier: MIT OR Apache-2.0
//! The NVMe/TCP digest (CRC32C) by the CPU's `crc32` instruction (SSE4.2), installed
//! into `nvmetcp::crc32c` when this CPU has it, computes exactly what the crate's table
//! does, and runs faster, measured once at boot ([`calibrate`]) as [`super::copy`]
//! picks its copy. Natively the instruction is several times faster than any table;
//! under QEMU's TCG it is emulated by a helper call, whose speed the measure settles.

use core::arch::asm;

use super::copy::tsc;

use alloc::vec::Vec;
use log::info;
use nvmetcp::crc32c;

/// CPUID.1:ECX[20].
fn has_sse42() -> bool {
    super::cpu::cpuid(1, 0).ecx & (1 << 20) != 0
}

/// The raw CRC32C register update by the `crc32` instruction, 8 bytes at a time. Only
/// reachable once [`has_sse42`] said yes ([`calibrate`], [`self_check`]).
fn by_instruction(register: u32, data: &[u8]) -> u32 {
    let (words, tail) = data.as_chunks::<8>();
    let mut wide = u64::from(register);
    for word in words {
        let value = u64::from_le_bytes(*word);
        // SAFETY: `crc32` only computes on two registers (no memory, no flags kept);
        // this function is called only on a CPU with SSE4.2 (see above).
        unsafe {
            asm!("crc32 {r}, {v}", r = inout(reg) wide, v = in(reg) value,
                options(pure, nomem, nostack))
        };
    }
    let mut narrow = wide as u32;
    for &byte in tail {
        // SAFETY: as above, on a byte.
        unsafe {
            asm!("crc32 {r:e}, {v}", r = inout(reg) narrow, v = in(reg_byte) byte,
                options(pure, nomem, nostack))
        };
    }
    narrow
}

/// The instruction computes what the table does: every length up to 300 bytes at
/// every start within 8, and a page, from several registers. Err names the first
/// length and start that differ.
fn agrees(data: &[u8]) -> Result<(), (usize, usize)> {
    for start in 0..8 {
        for len in (0..300).chain([4096 - start]) {
            let piece = &data[start..start + len];
            for register in [!0, 0, 0x1234_5678] {
                if by_instruction(register, piece) != crc32c::software_update(register, piece) {
                    return Err((len, start));
                }
            }
        }
    }
    Ok(())
}

/// Times both ways over 4 KiB (best of three rounds of 16, alternating) and installs
/// the instruction when it is there, agrees with the table and is faster. Call once,
/// on the boot CPU, before the first NVMe/TCP connection.
pub fn calibrate() {
    if !has_sse42() {
        info!("crc32c: no SSE4.2: digests by a table");
        return;
    }
    let data: Vec<u8> = (0..4096u32 + 8).map(|i| (i * 31 + i / 251) as u8).collect();
    if let Err((len, start)) = agrees(&data) {
        log::error!(
            "crc32c: the crc32 instruction disagrees with the table ({len} bytes at \
             offset {start}): digests by the table"
        );
        return;
    }
    const ROUNDS: u64 = 16;
    let page = &data[..4096];
    let mut best = [u64::MAX; 2];
    for _ in 0..3 {
        for (way, best) in best.iter_mut().enumerate() {
            let update: crc32c::Update = if way == 0 {
                by_instruction
            } else {
                crc32c::software_update
            };
            let start = tsc();
            let mut register = !0;
            for _ in 0..ROUNDS {
                register = update(register, core::hint::black_box(page));
            }
            core::hint::black_box(register);
            *best = (*best).min(tsc().wrapping_sub(start) / ROUNDS);
        }
    }
    let faster = best[0] < best[1];
    if faster {
        crc32c::accelerate(by_instruction);
    }
    info!(
        "crc32c: 4 KiB in {} TSC ticks by the crc32 instruction, {} by a table: using {}",
        best[0],
        best[1],
        if faster {
            "the instruction"
        } else {
            "the table"
        }
    );
}

/// The instruction, where the CPU has it, computes what the table does.
#[cfg(feature = "test-hooks")]
pub fn self_check() -> Result<bool, (usize, usize)> {
    if !has_sse42() {
        return Ok(false);
    }
    let data: Vec<u8> = (0..4096u32 + 8).map(|i| (i * 7 + 3) as u8).collect();
    agrees(&data).map(|()| true)
}
