// SPDX-License-Identifier: MIT OR Apache-2.0
//! blkdom's Xen guest interface: the vendored ABI, hypercalls through a swappable
//! [`Hypervisor`] trait, event channels, grant tables, a xenstore client, the
//! device-class independent side of xenbus ([`xenbus`]) and the PV console ring.
//!
//! Everything except [`raw`] is safe code over two small abstractions: the
//! [`Hypervisor`] trait (hypercalls) and [`SharedMem`] (memory shared with Xen or
//! another domain, accessed only through atomics). Host tests replace the first with a
//! fake and back the second with ordinary heap memory.
//!
//! # Bringing up a PVH/HVM domain (what the kernel calls, in order)
//!
//! 1. `kernel/machine`'s hypervisor detection gives Xen's CPUID base leaf;
//!    [`domain::XenCpuid::read`] adds version, domid/vCPU id where Xen reports them, and
//!    the rate the domain's TSC counts at ([`tsc::TscRate`] times with the raw TSC).
//! 2. `unsafe { raw::hypercall::NativeHypervisor::detect() }`: `vmcall` or `vmmcall` from
//!    the CPUID vendor (AMD/Hygon: `vmmcall`).
//! 3. Take one RAM frame for `shared_info`, [`domain::map_shared_info`] it (Xen
//!    replaces the page; never use that frame for anything else), wrap it with
//!    `unsafe { SharedMem::new(..) }` and [`shared_info::SharedInfoPage::new`].
//! 4. Per vCPU: `vcpu_info` is `legacy_vcpu_info(n)` for n < 32, or put it in per-CPU
//!    data with [`domain::register_vcpu_info`] (once, before upcalls).
//! 5. Per vCPU: install the upcall IDT handler (clear `evtchn_upcall_pending`; LAPIC EOI
//!    in [`domain::UpcallMode::PerVcpuVector`]), then [`domain::setup_upcall`].
//! 6. [`domain::console_params`] → [`console::ConsoleRing`] over that page; log with
//!    `write_all(bytes, || evtchn::send(..), bounded wait)`. `Err(NoDev)` means no Xen
//!    console (plain QEMU): keep port 0xE9 / COM1.
//! 7. [`domain::store_params`] → [`xenstore::SharedXenstoreRing`] with an
//!    [`evtchn::PortSignal`] (clock: `vcpu_info.clock().system_time_at(raw::cpu::read_tsc())`)
//!    → [`xenstore::XenstoreClient`]: read `name`, `domid`; watch `control/shutdown`.
//! 8. Secondary vCPUs: [`domain::start_vcpu`] with a [`domain::LongModeStart`] (BSP's
//!    CR0/CR3/CR4/EFER, entry, stack, argument); `Err(Exist)` → use INIT-SIPI instead.
//! 9. Event channels: [`evtchn::bind_interdomain`] / [`evtchn::alloc_unbound`],
//!    [`evtchn::bind_vcpu`] to the serving vCPU, register in that vCPU's
//!    [`evtchn::HandlerTable`], [`evtchn::unmask`], for ports served from upcalls
//!    (`dispatch_pending(&VcpuEvents { .. })`). blkdom's pollers sleep in
//!    [`evtchn::poll`] on one masked port each and take their other ports as upcalls (a
//!    multi-port `SCHEDOP_poll` is woken by every event of the domain: docs/design.md,
//!    "Stray wake-ups"); [`evtchn::idle_wait`] is the wake-up-safe sleep on upcalls
//!    alone.
//! 10. Grants: [`grant::map_batch`]/[`grant::unmap_batch`]/[`grant::copy_batch`] at
//!     guest-physical pages from a [`grant::GrantMapArea`] (a hole in the memory map),
//!     or [`grant::ForeignGrants`] for per-entry results over such an area (data
//!     grants: one failed entry fails only its own request); our own grants through
//!     [`grant::map_own_table`] + [`grant::GrantTable`]. A backend maps a frontend's ring
//!     and binds its event channel as one [`ring::RingConnection`] (undone whole when a
//!     step fails, released whole), and counts what it holds mapped with
//!     [`grant::CountedGrants`] around its hypervisor.
//! 11. [`domain::shutdown`] with `Poweroff` (control/shutdown = "poweroff") or `Crash`
//!     (panic), so `xl` reports the right reason.
// `xenbus::fake` holds host-only test doubles, which use std.
#![cfg_attr(not(any(test, feature = "fake")), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod abi;
mod byte_ring;
pub mod console;
pub mod domain;
pub mod error;
pub mod evtchn;
pub mod grant;
pub mod hypercall;
pub mod raw;
pub mod ring;
pub mod shared_info;
pub mod tsc;
pub mod xenbus;
pub mod xenstore;

#[cfg(test)]
mod fake;

pub use error::XenError;
pub use hypercall::{Hypercall, Hypervisor};
pub use raw::shm::SharedMem;
