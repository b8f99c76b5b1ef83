// SPDX-License-Identifier: MIT OR Apache-2.0
//! The local APIC, in xAPIC (MMIO) mode: this CPU's id, end-of-interrupt, and the
//! inter-processor interrupts used to start and wake other CPUs.

use core::sync::atomic::{AtomicU64, Ordering};

/// Default xAPIC base; the MADT may override it.
pub const DEFAULT_BASE: u64 = 0xfee0_0000;

const REG_ID: u64 = 0x20;
const REG_EOI: u64 = 0xb0;
const REG_SPURIOUS: u64 = 0xf0;
const REG_ICR_LOW: u64 = 0x300;
const REG_ICR_HIGH: u64 = 0x310;

const ICR_DELIVERY_PENDING: u32 = 1 << 12;
const ICR_INIT: u32 = 0x0000_4500; // INIT, level assert
const ICR_STARTUP: u32 = 0x0000_4600; // start-up IPI, vector in bits 0..8
const ICR_FIXED: u32 = 0x0000_4000; // fixed delivery, level assert

/// Vector for spurious APIC interrupts (low nibble must be 0xf on old APICs).
pub const SPURIOUS_VECTOR: u8 = 0xff;

static BASE: AtomicU64 = AtomicU64::new(DEFAULT_BASE);

pub fn set_base(base: u64) {
    BASE.store(base, Ordering::Relaxed);
}

fn read(reg: u64) -> u32 {
    // SAFETY: the APIC register page is identity mapped (below 4 GiB); APIC registers are
    // 32-bit, 16-byte aligned, and must be accessed with 32-bit volatile accesses.
    unsafe { core::ptr::read_volatile((BASE.load(Ordering::Relaxed) + reg) as *const u32) }
}

fn write(reg: u64, value: u32) {
    // SAFETY: as in `read`.
    unsafe { core::ptr::write_volatile((BASE.load(Ordering::Relaxed) + reg) as *mut u32, value) }
}

/// Software-enables this CPU's APIC (so it accepts IPIs) with the spurious vector set.
pub fn enable() {
    write(REG_SPURIOUS, 0x100 | u32::from(SPURIOUS_VECTOR));
}

/// Masks every line of the legacy 8259 PICs. Firmware (SeaBIOS, before QEMU's PVH
/// option ROM, or before an HVM domain's kernel) leaves the timer's IRQ 0 unmasked on
/// vectors 0x08.. — the CPU exception vectors — so the first tick after `sti` would look
/// like a double fault. A PVH domain has no PIC; the writes are then ignored.
pub fn mask_legacy_pic() {
    // SAFETY: ports 0x21 and 0xa1 are the PICs' interrupt mask registers; writing them
    // only masks interrupt lines and touches no memory.
    unsafe {
        x86_64::instructions::port::Port::<u8>::new(0x21).write(0xff);
        x86_64::instructions::port::Port::<u8>::new(0xa1).write(0xff);
    }
}

pub fn id() -> u32 {
    read(REG_ID) >> 24
}

pub fn end_of_interrupt() {
    write(REG_EOI, 0);
}

fn send_ipi(apic_id: u32, command: u32) {
    write(REG_ICR_HIGH, apic_id << 24);
    write(REG_ICR_LOW, command);
    for _ in 0..1_000_000 {
        if read(REG_ICR_LOW) & ICR_DELIVERY_PENDING == 0 {
            return;
        }
        core::hint::spin_loop();
    }
    log::warn!("IPI {command:#x} to APIC {apic_id} still pending");
}

pub fn send_init(apic_id: u32) {
    send_ipi(apic_id, ICR_INIT);
}

/// Start-up IPI: the target starts in real mode at `vector_page << 12`.
pub fn send_startup(apic_id: u32, vector_page: u8) {
    send_ipi(apic_id, ICR_STARTUP | u32::from(vector_page));
}

pub fn send_fixed(apic_id: u32, vector: u8) {
    send_ipi(apic_id, ICR_FIXED | u32::from(vector));
}
