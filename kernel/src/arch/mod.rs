// SPDX-License-Identifier: MIT OR Apache-2.0
//! x86_64 processor set-up: descriptor tables, traps, paging, CPU identification.
//! All of the kernel's privileged instructions live under this module.

pub mod ap_boot;
pub mod apic;
pub mod copy;
pub mod cpu;
pub mod crc32c;
pub mod gdt;
pub mod jump;
pub mod paging;
pub mod trap;
