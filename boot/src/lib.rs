// SPDX-License-Identifier: MIT OR Apache-2.0
//! PVH entry for blkdom.
//!
//! A PVH loader (Xen's domain builder, or QEMU's `-kernel`) finds the
//! `XEN_ELFNOTE_PHYS32_ENTRY` note, loads the image at its physical address and enters
//! `pvh_start32` in 32-bit protected mode, paging off, with `%ebx` holding the physical
//! address of `hvm_start_info`. This crate switches to long mode with the first 4 GiB
//! identity mapped (2 MiB pages) and calls the kernel's
//! `extern "C" fn kernel_main(start_info_paddr: u64) -> !`.
//!
//! There is no hypercall page: the kernel issues `vmcall`/`vmmcall` itself.
#![no_std]

pub mod start_info;

/// Size of the stack the bootstrap processor runs on until the kernel switches stacks.
/// vCPU 0's control path runs on it too, and an NVMe/TCP disk's attach (the control
/// path, the network and a session's bring-up, nested) took more than 64 KiB.
pub const BOOT_STACK_SIZE: usize = 256 * 1024;

/// ELF note type of the 32-bit physical entry point (Xen's `elfnote.h`).
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

#[cfg(target_os = "none")]
core::arch::global_asm!(
    r#"
    /* The PVH note: name "Xen", type XEN_ELFNOTE_PHYS32_ENTRY, 32-bit entry address. */
    .pushsection .note.Xen, "a", @note
    .balign 4
    .long 4
    .long 4
    .long {note_type}
    .asciz "Xen"
    .balign 4
    .long pvh_start32
    .balign 4
    .popsection

    .pushsection .text.boot32, "ax"
    .code32
    .global pvh_start32
pvh_start32:
    cli
    cld
    mov esi, ebx                       /* keep hvm_start_info's address */

    /* Zero .bss: the page tables and the boot stack live there. */
    mov edi, offset __bss_start
    mov ecx, offset __bss_end
    sub ecx, edi
    shr ecx, 2
    xor eax, eax
    rep stosd
    /* A PVH loader leaves %esp undefined (Xen: 0); the far return below pushes. */
    mov esp, offset boot_stack_top

    /* PML4[0] -> PDPT; PDPT[0..4] -> four page directories; each PD maps 1 GiB in
       2 MiB pages (present, writable, page-size). Together: 0..4 GiB identity. */
    mov eax, offset boot_pdpt
    or eax, 0x3
    mov [boot_pml4], eax
    mov edi, offset boot_pdpt
    mov eax, offset boot_pd
    or eax, 0x3
    mov ecx, 4
2:  mov [edi], eax
    add eax, 4096
    add edi, 8
    loop 2b
    mov edi, offset boot_pd
    mov eax, 0x83
    xor edx, edx
    mov ecx, 2048
3:  mov [edi], eax
    mov [edi + 4], edx
    add eax, 0x200000
    adc edx, 0
    add edi, 8
    loop 3b

    /* CR4.PAE, then CR3. */
    mov eax, cr4
    or eax, 1 << 5
    mov cr4, eax
    mov eax, offset boot_pml4
    mov cr3, eax

    /* EFER.LME, and EFER.NXE when the CPU has NX (CPUID 0x80000001 EDX bit 20). */
    mov eax, 0x80000000
    cpuid
    xor ebx, ebx
    cmp eax, 0x80000001
    jb 4f
    mov eax, 0x80000001
    cpuid
    bt edx, 20
    jnc 4f
    mov ebx, 1 << 11
4:  mov ecx, 0xC0000080
    rdmsr
    or eax, 1 << 8
    or eax, ebx
    wrmsr

    /* CR0: PE, WP, PG. */
    mov eax, cr0
    or eax, 0x80010001
    mov cr0, eax

    lgdt [boot_gdt_ptr]
    push 0x08
    mov eax, offset boot_long_mode
    push eax
    retf

    .code64
boot_long_mode:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    xor eax, eax
    mov fs, ax
    mov gs, ax
    lea rsp, [rip + boot_stack_top]
    xor ebp, ebp
    mov edi, esi                        /* kernel_main(start_info_paddr) */
    call kernel_main
6:  cli
    hlt
    jmp 6b
    .popsection

    .pushsection .rodata.boot_gdt, "a"
    .balign 16
boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff            /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff            /* 0x10: data */
boot_gdt_end:
    .balign 4
boot_gdt_ptr:
    .word boot_gdt_end - boot_gdt - 1
    .long boot_gdt
    .popsection

    .pushsection .bss.boot, "aw", @nobits
    .balign 4096
boot_pml4:
    .skip 4096
boot_pdpt:
    .skip 4096
boot_pd:
    .skip 4 * 4096
    .balign 16
boot_stack_bottom:
    .skip {stack_size}
    .global boot_stack_top
boot_stack_top:
    .popsection
    "#,
    note_type = const XEN_ELFNOTE_PHYS32_ENTRY,
    stack_size = const BOOT_STACK_SIZE,
);

#[cfg(target_os = "none")]
extern "C" {
    /// The 32-bit entry named in the PVH note (defined in assembly above).
    pub fn pvh_start32();
}
