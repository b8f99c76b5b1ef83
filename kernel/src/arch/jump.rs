// SPDX-License-Identifier: MIT OR Apache-2.0
//! A live upgrade's jump (docs/design.md §4.12, 5): the code that runs from the park
//! area below 1 MiB while the new image is copied over the old one.
//!
//! Two entries, both in 64-bit mode with interrupts off. The code is position-independent
//! (RIP-relative) but reads its data at the park area's fixed address
//! (`handover::park::PARK_BASE`; the block names it, and the area's layout is part of the
//! handover ABI):
//! - `PARK_AP_OFFSET`: a vCPU other than 0 switches to the park area's page tables and
//!   GDT, says it is parked in its mailbox, and spins there until the new image fills
//!   the mailbox (CR3, stack, entry, argument) and sets `GO`.
//! - `TRAMPOLINE_OFFSET`: vCPU 0 does the same switch, copies each segment from the
//!   staged image to its address and zeroes the rest of its memory, drops to 32-bit
//!   protected mode with paging off and enters the new image's PVH entry with EBX = the
//!   new `hvm_start_info`: as Xen or QEMU enter it.
//!
//! The bytes the code reads (parameters, GDT, tables, start info) are built and
//! host-tested in `handover::park`; here is only the code and its installation.

use handover::park::{
    self, AP_STACKS_OFFSET, MAILBOX_OFFSET, M_ARG, M_CR3, M_ENTRY, M_GO, M_PARKED, M_STACK, PAGE,
    PARAMS_OFFSET, PARK_BASE, P_CR3, P_ENTRY32, P_GDT_PTR, P_SEGMENTS, P_SEGMENT_COUNT,
    P_START_INFO, SEGMENT_RECORD, SEL_CODE32, SEL_CODE64, SEL_DATA,
};

/// Where in the code page each entry lies.
const TRAMPOLINE_OFFSET: u64 = 0;
const PARK_AP_OFFSET: u64 = 0x400;

core::arch::global_asm!(
    r#"
    .pushsection .rodata.park_code, "a"
    .balign 16
    /* Onto the park area's tables and GDT, with RSP already on a park stack. */
    .macro park_switch
    mov rax, [{params} + {p_cr3}]
    mov cr3, rax
    lgdt [{params} + {p_gdt_ptr}]
    push {code64}
    lea rax, [rip + 1f]
    push rax
    retfq
1:  mov ax, {data}
    mov ds, ax
    mov es, ax
    mov ss, ax
    .endm

    .global park_code_start
park_code_start:
    .code64
    /* vCPU 0: the trampoline. */
    cli
    cld
    mov rsp, {params} + {page}
    park_switch
    mov rbx, {params} + {p_segments}
    mov r8, [{params} + {p_segment_count}]
11: test r8, r8
    jz 12f
    mov rsi, [rbx]
    mov rdi, [rbx + 8]
    mov rcx, [rbx + 16]
    rep movsb
    mov rcx, [rbx + 24]
    sub rcx, [rbx + 16]
    xor eax, eax
    rep stosb
    add rbx, {segment_record}
    dec r8
    jmp 11b
    /* To 32-bit compatibility mode, still on the identity map... */
12: push {code32}
    lea rax, [rip + 13f]
    push rax
    retfq
    .code32
13: mov ax, {data}
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov fs, ax
    mov gs, ax
    /* ...paging off (this leaves long mode), then EFER and CR4 as at reset. */
    mov eax, cr0
    and eax, 0x7fffffff
    mov cr0, eax
    mov ecx, 0xC0000080
    xor eax, eax
    xor edx, edx
    wrmsr
    mov cr4, eax
    mov ebx, [{params} + {p_start_info}]
    mov eax, [{params} + {p_entry32}]
    jmp eax

    .code64
    .org {park_ap_offset}
    /* Another vCPU: park. RDI = its index (below handover::park::MAX_VCPUS). */
    cli
    cld
    mov rbx, rdi
    shl rbx, 6
    lea rsp, [rbx + {base} + {ap_stacks} + 64]
    add rbx, {base} + {mailboxes}
    park_switch
    mov qword ptr [rbx + {m_parked}], 1
21: pause
    cmp qword ptr [rbx + {m_go}], 0
    je 21b
    mov rax, [rbx + {m_cr3}]
    mov cr3, rax
    mov rsp, [rbx + {m_stack}]
    mov rdi, [rbx + {m_arg}]
    mov rax, [rbx + {m_entry}]
    xor ebp, ebp
    call rax
22: cli
    hlt
    jmp 22b
    .global park_code_end
park_code_end:
    .popsection
    "#,
    base = const PARK_BASE,
    params = const PARK_BASE + PARAMS_OFFSET,
    page = const PAGE,
    p_cr3 = const P_CR3,
    p_gdt_ptr = const P_GDT_PTR,
    p_segments = const P_SEGMENTS,
    p_segment_count = const P_SEGMENT_COUNT,
    p_start_info = const P_START_INFO,
    p_entry32 = const P_ENTRY32,
    segment_record = const SEGMENT_RECORD,
    code64 = const SEL_CODE64,
    code32 = const SEL_CODE32,
    data = const SEL_DATA,
    park_ap_offset = const PARK_AP_OFFSET,
    ap_stacks = const AP_STACKS_OFFSET,
    mailboxes = const MAILBOX_OFFSET,
    m_parked = const M_PARKED,
    m_go = const M_GO,
    m_cr3 = const M_CR3,
    m_stack = const M_STACK,
    m_entry = const M_ENTRY,
    m_arg = const M_ARG,
);

extern "C" {
    static park_code_start: u8;
    static park_code_end: u8;
}

/// The park code's bytes (page 0 of the park area).
pub fn code() -> &'static [u8] {
    let start = &raw const park_code_start;
    let len = &raw const park_code_end as usize - start as usize;
    assert!(len as u64 <= PAGE);
    // SAFETY: the two symbols bound the assembled code above, in read-only data.
    unsafe { core::slice::from_raw_parts(start, len) }
}

/// Parks this vCPU (not vCPU 0) in the park area, whose code, parameters and tables
/// vCPU 0 has written: it waits there with interrupts off until the new image releases
/// it, and never comes back.
pub fn park_this_cpu(index: usize) -> ! {
    assert!(index != 0 && index < park::MAX_VCPUS);
    x86_64::instructions::interrupts::disable();
    // SAFETY: the park area's code and data are in place (the caller's contract, kept
    // by `upgrade::jump`, which parks vCPUs only after writing them); the code switches
    // to the park area's own tables, GDT and stack and never returns, so nothing of
    // this image is used by this vCPU after the jump.
    unsafe {
        core::arch::asm!(
            "jmp rax",
            in("rax") PARK_BASE + PARK_AP_OFFSET,
            in("rdi") index as u64,
            options(noreturn)
        )
    }
}

/// Enters the trampoline on vCPU 0: the new image is copied over this one and entered.
///
/// # Safety
/// The park area holds the code, parameters (each segment checked by
/// `handover::image::check` and `handover::park::params_page`), tables and start info;
/// every other vCPU is parked; no device does DMA into memory the new image uses.
pub unsafe fn enter_trampoline() -> ! {
    x86_64::instructions::interrupts::disable();
    // SAFETY: the caller's contract; the trampoline replaces every page of this image
    // and never returns.
    unsafe {
        core::arch::asm!(
            "jmp rax",
            in("rax") PARK_BASE + TRAMPOLINE_OFFSET,
            options(noreturn)
        )
    }
}

/// Whether vCPU `vcpu` has reached its spin loop.
pub fn is_parked(vcpu: usize) -> bool {
    // SAFETY: the mailbox lies in the park area, identity mapped, which this image
    // wrote and keeps; an 8-byte aligned volatile load.
    unsafe {
        core::ptr::read_volatile((park::mailbox(PARK_BASE, vcpu) + M_PARKED) as *const u64)
            == park::MAILBOX_SET
    }
}

/// What a released vCPU is given.
pub struct Release {
    pub cr3: u64,
    pub stack_top: u64,
    pub entry: u64,
    pub arg: u64,
}

/// Releases parked vCPU `vcpu` of the park area at `park` (the new image's side): fills
/// its mailbox, then sets `GO`. Returns false when it was not parked.
///
/// The park area is the handover's (checked to be a Park range in RAM below 1 MiB,
/// kept out of the frame allocator).
pub fn release(park_base: u64, vcpu: usize, what: &Release) -> bool {
    if vcpu == 0 || vcpu >= park::MAX_VCPUS || park_base != PARK_BASE {
        return false;
    }
    let mailbox = park::mailbox(park_base, vcpu);
    let word = |offset: u64| (mailbox + offset) as *mut u64;
    // SAFETY: the mailbox lies in the park area (checked base, bounded index), identity
    // mapped and kept out of the frame allocator; the parked vCPU only reads these words
    // after it sees GO, which is stored last, with a fence before it.
    unsafe {
        if core::ptr::read_volatile(word(M_PARKED)) != park::MAILBOX_SET {
            return false;
        }
        core::ptr::write_volatile(word(M_CR3), what.cr3);
        core::ptr::write_volatile(word(M_STACK), what.stack_top);
        core::ptr::write_volatile(word(M_ENTRY), what.entry);
        core::ptr::write_volatile(word(M_ARG), what.arg);
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        core::ptr::write_volatile(word(M_GO), park::MAILBOX_SET);
    }
    true
}
