// SPDX-License-Identifier: MIT OR Apache-2.0
//! Byte sinks for the log: COM1 (a 16550 UART) under plain QEMU, and I/O port 0xE9,
//! which Xen prints on its own serial console as `(dN) ...` lines for PVH/HVM guests
//! (QEMU's `-debugcon` captures it too). The Xen console ring joins these with the Xen
//! domain layer (`xen_domain`).

use core::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use x86_64::instructions::port::Port;

pub const COM1: u16 = 0x3f8;
const DEBUGCON_PORT: u16 = 0xe9;

static UART_BASE: AtomicU16 = AtomicU16::new(0);
/// The Xen console ring writer, once `xen_domain` has found it.
static XEN_CONSOLE: spin::Once<fn(&[u8])> = spin::Once::new();
static DEBUGCON: AtomicBool = AtomicBool::new(false);

/// A 16550 at `base`, found by its scratch register (absent ports read back 0xff).
struct Uart {
    base: u16,
}

impl Uart {
    fn out(&self, offset: u16, value: u8) {
        // SAFETY: writes to the UART's own register block, found by `probe`; no memory
        // is touched.
        unsafe { Port::new(self.base + offset).write(value) }
    }

    fn input(&self, offset: u16) -> u8 {
        // SAFETY: as in `out`; reading a UART register has no side effect on memory.
        unsafe { Port::new(self.base + offset).read() }
    }

    fn probe(base: u16) -> Option<Uart> {
        let uart = Uart { base };
        for pattern in [0x5a, 0xa5] {
            uart.out(7, pattern);
            if uart.input(7) != pattern {
                return None;
            }
        }
        Some(uart)
    }

    fn init(&self) {
        self.out(1, 0x00); // no interrupts
        self.out(3, 0x80); // DLAB: divisor follows
        self.out(0, 0x01); // 115200 baud
        self.out(1, 0x00);
        self.out(3, 0x03); // 8N1
        self.out(2, 0xc7); // FIFOs on, cleared
        self.out(4, 0x03); // DTR, RTS
    }

    fn write_byte(&self, byte: u8) {
        // Bounded wait for the transmitter: a wedged UART must not hang the kernel.
        for _ in 0..100_000 {
            if self.input(5) & 0x20 != 0 {
                break;
            }
            core::hint::spin_loop();
        }
        self.out(0, byte);
    }
}

/// Picks the sinks: COM1 when a UART answers, port 0xE9 when running under Xen.
pub fn init(under_xen: bool) {
    if let Some(uart) = Uart::probe(COM1) {
        uart.init();
        UART_BASE.store(COM1, Ordering::Relaxed);
    }
    DEBUGCON.store(under_xen, Ordering::Relaxed);
}

pub fn write_bytes(bytes: &[u8]) {
    if let Some(write) = XEN_CONSOLE.get() {
        write(bytes);
    }
    let base = UART_BASE.load(Ordering::Relaxed);
    let debugcon = DEBUGCON.load(Ordering::Relaxed);
    for &byte in bytes {
        if base != 0 {
            let uart = Uart { base };
            if byte == b'\n' {
                uart.write_byte(b'\r');
            }
            uart.write_byte(byte);
        }
        if debugcon {
            // SAFETY: port 0xE9 is the hypervisor's debug console; writing it only
            // emits a byte.
            unsafe { Port::new(DEBUGCON_PORT).write(byte) }
        }
    }
}

pub fn enable_xen_console(write: fn(&[u8])) {
    XEN_CONSOLE.call_once(|| write);
}

/// Waits until the UART has sent everything (before power-off).
pub fn flush() {
    let base = UART_BASE.load(Ordering::Relaxed);
    if base != 0 {
        let uart = Uart { base };
        for _ in 0..100_000 {
            if uart.input(5) & 0x40 != 0 {
                break;
            }
            core::hint::spin_loop();
        }
    }
}
