// SPDX-License-Identifier: MIT OR Apache-2.0
//! Interrupt descriptor table, trap entry, and what happens on each vector.
//!
//! Every vector enters through a generated stub (build.rs) that pushes a uniform
//! `TrapFrame` and calls `trap_dispatch`. Exceptions are logged with vector, RIP, CR2 and
//! error code, then the kernel stops; two exceptions are expected and recoverable:
//! `int3` (counted), and faults raised inside a `probe_*` helper, which resume at the
//! helper's fix-up label (used by self-tests and, later, by code that probes hardware).
//! Vectors 32..=255 go to handlers registered with `set_interrupt_handler`.

use super::gdt::{IST_DOUBLE_FAULT, IST_MACHINE_CHECK, IST_NMI};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use x86_64::instructions::segmentation::{Segment, CS};
use x86_64::instructions::tables::lidt;
use x86_64::structures::DescriptorTablePointer;
use x86_64::VirtAddr;

core::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/trap_stubs.s")));
core::arch::global_asm!(
    r#"
    .pushsection .text.trap_common, "ax"
trap_common:
    push rax
    push rcx
    push rdx
    push rbx
    push rbp
    push rsi
    push rdi
    push r8
    push r9
    push r10
    push r11
    push r12
    push r13
    push r14
    push r15
    mov rdi, rsp
    cld
    call trap_dispatch
    pop r15
    pop r14
    pop r13
    pop r12
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rbp
    pop rbx
    pop rdx
    pop rcx
    pop rax
    add rsp, 16
    iretq
    .popsection
    "#
);

extern "C" {
    static trap_stub_table: [u64; 256];
}

/// What the entry stubs and the CPU leave on the stack, lowest address first.
#[repr(C)]
#[derive(Debug)]
pub struct TrapFrame {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rax: u64,
    pub vector: u64,
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

/// A 64-bit interrupt gate.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Gate {
    offset_low: u16,
    selector: u16,
    ist: u8,
    type_attr: u8,
    offset_mid: u16,
    offset_high: u32,
    reserved: u32,
}

const INTERRUPT_GATE_PRESENT: u8 = 0x8e;

impl Gate {
    fn new(handler: u64, selector: u16, ist: u16) -> Gate {
        Gate {
            offset_low: handler as u16,
            selector,
            ist: ist as u8,
            type_attr: INTERRUPT_GATE_PRESENT,
            offset_mid: (handler >> 16) as u16,
            offset_high: (handler >> 32) as u32,
            reserved: 0,
        }
    }
}

static IDT: spin::Once<[Gate; 256]> = spin::Once::new();

/// Builds the IDT once and loads it on this CPU (every CPU shares it; the IST stacks
/// it names are per CPU, through each CPU's TSS).
pub fn load_idt() {
    let idt = IDT.call_once(|| {
        let code_selector = <CS as Segment>::get_reg();
        // SAFETY: `trap_stub_table` is an immutable table of 256 addresses emitted by
        // build.rs into .rodata.
        let stubs = unsafe { &trap_stub_table };
        core::array::from_fn(|vector| {
            let ist = match vector {
                2 => IST_NMI,
                8 => IST_DOUBLE_FAULT,
                18 => IST_MACHINE_CHECK,
                _ => 0,
            };
            Gate::new(stubs[vector], code_selector.0, ist)
        })
    });
    let pointer = DescriptorTablePointer {
        limit: (core::mem::size_of::<[Gate; 256]>() - 1) as u16,
        base: VirtAddr::from_ptr(idt.as_ptr()),
    };
    // SAFETY: the table is 'static, every gate points at a stub that saves state and
    // calls `trap_dispatch`, with the code selector in use now.
    unsafe { lidt(&pointer) };
}

/// Handlers for vectors 32..=255, as `fn(&mut TrapFrame)` addresses (0: none).
static HANDLERS: [AtomicUsize; 256] = [const { AtomicUsize::new(0) }; 256];

pub type InterruptHandler = fn(&mut TrapFrame);

pub fn set_interrupt_handler(vector: u8, handler: InterruptHandler) {
    assert!(vector >= 32, "vectors below 32 are exceptions");
    HANDLERS[usize::from(vector)].store(handler as usize, Ordering::Release);
}

static BREAKPOINTS: AtomicU64 = AtomicU64::new(0);
static SPURIOUS_INTERRUPTS: AtomicU64 = AtomicU64::new(0);

#[cfg(feature = "test-hooks")]
pub fn breakpoint_count() -> u64 {
    BREAKPOINTS.load(Ordering::Relaxed)
}

/// Where a `probe_*` helper resumes after a fault (0: no probe armed).
static FIXUP_RIP: AtomicU64 = AtomicU64::new(0);
/// The fault a probe caught, packed for lock-free hand-over.
static CAUGHT_VECTOR: AtomicU64 = AtomicU64::new(u64::MAX);
static CAUGHT_ERROR: AtomicU64 = AtomicU64::new(0);
static CAUGHT_CR2: AtomicU64 = AtomicU64::new(0);

/// A fault that a probe caught instead of stopping the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg(feature = "test-hooks")]
pub struct CaughtFault {
    pub vector: u8,
    pub error_code: u64,
    /// CR2, for page faults.
    pub address: u64,
}

#[cfg(feature = "test-hooks")]
impl core::fmt::Display for CaughtFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "fault {} (error code {:#x}, address {:#x})",
            self.vector, self.error_code, self.address
        )
    }
}

#[cfg(feature = "test-hooks")]
impl core::error::Error for CaughtFault {}

#[cfg(feature = "test-hooks")]
fn take_caught() -> Option<CaughtFault> {
    let vector = CAUGHT_VECTOR.swap(u64::MAX, Ordering::AcqRel);
    (vector != u64::MAX).then(|| CaughtFault {
        vector: vector as u8,
        error_code: CAUGHT_ERROR.load(Ordering::Acquire),
        address: CAUGHT_CR2.load(Ordering::Acquire),
    })
}

/// Reads a u64 at `addr`, returning the fault instead of stopping if the read faults.
#[cfg(feature = "test-hooks")]
pub fn probe_read(addr: u64) -> Result<u64, CaughtFault> {
    let value: u64;
    CAUGHT_VECTOR.store(u64::MAX, Ordering::Release);
    // SAFETY: arms the fix-up with the address of label 2, then reads `addr`. If the
    // read faults, `trap_dispatch` resumes at 2 with every register as it was, and
    // `value` is the zero loaded before the read. The fix-up is disarmed on both paths.
    unsafe {
        core::arch::asm!(
            "lea {tmp}, [rip + 2f]",
            "mov qword ptr [rip + {fixup}], {tmp}",
            "xor {value:e}, {value:e}",
            "mov {value}, qword ptr [{addr}]",
            "2:",
            "mov qword ptr [rip + {fixup}], 0",
            fixup = sym FIXUP_RIP,
            tmp = out(reg) _,
            value = out(reg) value,
            addr = in(reg) addr,
            options(nostack),
        );
    }
    take_caught().map_or(Ok(value), Err)
}

/// Executes `ud2` under a probe: always returns the caught #UD.
#[cfg(feature = "test-hooks")]
pub fn probe_invalid_opcode() -> Result<(), CaughtFault> {
    CAUGHT_VECTOR.store(u64::MAX, Ordering::Release);
    // SAFETY: as in `probe_read`; `ud2` raises #UD and the handler resumes at label 2.
    unsafe {
        core::arch::asm!(
            "lea {tmp}, [rip + 2f]",
            "mov qword ptr [rip + {fixup}], {tmp}",
            "ud2",
            "2:",
            "mov qword ptr [rip + {fixup}], 0",
            fixup = sym FIXUP_RIP,
            tmp = out(reg) _,
            options(nostack),
        );
    }
    take_caught().map_or(Ok(()), Err)
}

pub fn exception_name(vector: u8) -> &'static str {
    match vector {
        0 => "#DE divide error",
        1 => "#DB debug",
        2 => "NMI",
        3 => "#BP breakpoint",
        4 => "#OF overflow",
        5 => "#BR bound range",
        6 => "#UD invalid opcode",
        7 => "#NM device not available",
        8 => "#DF double fault",
        10 => "#TS invalid TSS",
        11 => "#NP segment not present",
        12 => "#SS stack fault",
        13 => "#GP general protection",
        14 => "#PF page fault",
        16 => "#MF x87 error",
        17 => "#AC alignment check",
        18 => "#MC machine check",
        19 => "#XM SIMD error",
        20 => "#VE virtualization",
        21 => "#CP control protection",
        28 => "#HV hypervisor injection",
        29 => "#VC VMM communication",
        30 => "#SX security",
        _ => "reserved",
    }
}

#[no_mangle]
extern "C" fn trap_dispatch(frame: &mut TrapFrame) {
    let vector = frame.vector as u8;
    if vector >= 32 {
        let handler = HANDLERS[usize::from(vector)].load(Ordering::Acquire);
        if handler == 0 {
            SPURIOUS_INTERRUPTS.fetch_add(1, Ordering::Relaxed);
            log::warn!("interrupt on vector {vector} with no handler (ignored)");
        } else {
            // SAFETY: only `set_interrupt_handler` stores here, and it stores the address
            // of an `InterruptHandler`.
            let handler: InterruptHandler =
                unsafe { core::mem::transmute::<usize, InterruptHandler>(handler) };
            handler(frame);
        }
        return;
    }
    let cr2 = if vector == 14 {
        super::cpu::read_cr2()
    } else {
        0
    };
    let fixup = FIXUP_RIP.swap(0, Ordering::AcqRel);
    if fixup != 0 {
        CAUGHT_ERROR.store(frame.error_code, Ordering::Release);
        CAUGHT_CR2.store(cr2, Ordering::Release);
        CAUGHT_VECTOR.store(u64::from(vector), Ordering::Release);
        frame.rip = fixup;
        return;
    }
    if vector == 3 {
        BREAKPOINTS.fetch_add(1, Ordering::Relaxed);
        log::debug!("breakpoint at rip={:#x}", frame.rip - 1);
        return;
    }
    log::error!(
        "exception {} (vector {}) error={:#x} rip={:#x} cr2={:#x} rsp={:#x} cs={:#x} rflags={:#x}",
        exception_name(vector),
        vector,
        frame.error_code,
        frame.rip,
        cr2,
        frame.rsp,
        frame.cs,
        frame.rflags
    );
    log::error!(
        "  rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} rbp={:#x}",
        frame.rax,
        frame.rbx,
        frame.rcx,
        frame.rdx,
        frame.rsi,
        frame.rdi,
        frame.rbp
    );
    crate::power::crash("unexpected exception");
}
