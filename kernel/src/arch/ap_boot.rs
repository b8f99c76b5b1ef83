// SPDX-License-Identifier: MIT OR Apache-2.0
//! Starting application processors the PC way (INIT, start-up IPI), used under plain
//! QEMU. A start-up IPI starts the CPU in 16-bit real mode at `vector << 12`, so a small
//! trampoline is copied to `TRAMPOLINE_PADDR`; it climbs to long mode with the boot
//! CPU's page tables and jumps to the Rust entry with the CPU's index and stack.
//! (Under Xen, PVH vCPUs are started with VCPUOP_initialise instead.)

use core::sync::atomic::{fence, Ordering};

/// Page the trampoline runs from: below 1 MiB (real mode), not used by anything else
/// once the kernel has copied its boot information.
pub const TRAMPOLINE_PADDR: u64 = 0x8000;

core::arch::global_asm!(
    r#"
    .pushsection .rodata.ap_trampoline, "a"
    .balign 16
    .global ap_trampoline_start
ap_trampoline_start:
    .code16
    cli
    cld
    mov ax, cs
    mov ds, ax
    lgdt [{gdt_ptr_offset}]
    mov eax, cr0
    or eax, 1
    mov cr0, eax
    /* ljmpl 0x08, protected-mode entry (32-bit offset, so the operand-size prefix) */
    .byte 0x66, 0xea
    .long {base} + (ap_protected - ap_trampoline_start)
    .word 0x08

    .code32
ap_protected:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov eax, cr4
    or eax, 1 << 5
    mov cr4, eax
    mov eax, [{base} + {data_offset}]
    mov cr3, eax
    mov ecx, 0xC0000080
    rdmsr
    or eax, [{base} + {data_offset} + 32]
    wrmsr
    mov eax, cr0
    or eax, 0x80010000
    mov cr0, eax
    /* ljmp 0x18, long-mode entry */
    .byte 0xea
    .long {base} + (ap_long - ap_trampoline_start)
    .word 0x18

    .code64
ap_long:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    xor eax, eax
    mov fs, ax
    mov gs, ax
    mov rsp, [{base} + {data_offset} + 8]
    mov rdi, [{base} + {data_offset} + 24]
    mov rax, [{base} + {data_offset} + 16]
    xor ebp, ebp
    call rax
2:  cli
    hlt
    jmp 2b

    /* Fixed offsets: the assembler cannot put label differences in memory operands. */
    .org {gdt_offset}
ap_gdt:
    .quad 0
    .quad 0x00cf9a000000ffff    /* 0x08: 32-bit code */
    .quad 0x00cf92000000ffff    /* 0x10: data */
    .quad 0x00af9a000000ffff    /* 0x18: 64-bit code */
    .org {gdt_ptr_offset}
ap_gdt_ptr:
    .word ap_gdt_ptr - ap_gdt - 1
    .long {base} + (ap_gdt - ap_trampoline_start)

    .org {data_offset}
    .global ap_trampoline_data
ap_trampoline_data:
ap_data_cr3:
    .quad 0
ap_data_stack:
    .quad 0
ap_data_entry:
    .quad 0
ap_data_index:
    .quad 0
ap_data_efer:
    .quad 0
    .global ap_trampoline_end
ap_trampoline_end:
    .popsection
    "#,
    base = const TRAMPOLINE_PADDR,
    gdt_offset = const GDT_OFFSET,
    gdt_ptr_offset = const GDT_OFFSET + 32,
    data_offset = const DATA_OFFSET,
);

/// Offsets inside the trampoline page (the code before them is < 0x1c0 bytes; `.org`
/// fails the build if it ever grows past them).
const GDT_OFFSET: usize = 0x1c0;
const DATA_OFFSET: usize = 0x200;

extern "C" {
    static ap_trampoline_start: u8;
    static ap_trampoline_data: u8;
    static ap_trampoline_end: u8;
}

/// What the trampoline hands the new CPU (layout fixed by the data labels above).
#[repr(C)]
pub struct TrampolineData {
    pub cr3: u64,
    pub stack_top: u64,
    pub entry: u64,
    pub cpu_index: u64,
    /// Bits OR-ed into EFER: LME, and NXE when the boot CPU uses it.
    pub efer_bits: u64,
}

/// Copies the trampoline to its page and fills in the hand-over data for one CPU.
pub fn install(data: TrampolineData) {
    let start = &raw const ap_trampoline_start as usize;
    let data_offset = &raw const ap_trampoline_data as usize - start;
    let len = &raw const ap_trampoline_end as usize - start;
    assert!(len <= 4096 && data_offset + core::mem::size_of::<TrampolineData>() <= len);
    // SAFETY: TRAMPOLINE_PADDR is an identity-mapped page below 1 MiB that the frame
    // allocator never hands out; the source is the trampoline in .rodata; the data slot
    // lies inside the copied bytes (checked above) and is 8-byte aligned.
    unsafe {
        core::ptr::copy_nonoverlapping(start as *const u8, TRAMPOLINE_PADDR as *mut u8, len);
        core::ptr::write_volatile(
            (TRAMPOLINE_PADDR as usize + data_offset) as *mut TrampolineData,
            data,
        );
    }
    fence(Ordering::SeqCst);
}
