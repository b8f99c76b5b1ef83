// SPDX-License-Identifier: MIT OR Apache-2.0
//! Event-channel delivery: each vCPU gets upcalls on `UPCALL_VECTOR` and dispatches the
//! ports bound to it from its own handler table. A port is bound to exactly one vCPU, so
//! tables are never shared; each table's lock only orders registration against dispatch.

use super::{failed, get, InitError};
use crate::arch::{apic, trap};
use crate::smp::{self, MAX_CPUS};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use xen::abi::event_channel::EvtchnPort;
use xen::domain::UpcallMode;
use xen::evtchn::HandlerTable;
use xen::shared_info::VcpuEvents;
// Handlers are registered by the self-tests only.
#[cfg(feature = "test-hooks")]
use xen::{evtchn, evtchn::EventHandler, XenError};

/// The vector Xen raises for event channels on every vCPU.
pub const UPCALL_VECTOR: u8 = 0xf3;

/// One vCPU's event delivery: its handler table and what its upcalls did. Each slot has
/// cache lines of its own (every upcall writes its vCPU's counters).
#[repr(align(64))]
struct EventSlot {
    table: spin::Mutex<Option<HandlerTable>>,
    /// Upcalls taken.
    upcalls: AtomicU64,
    /// Handlers run.
    dispatched: AtomicU64,
}

/// Per vCPU, the one port its poller blocks on in `SCHEDOP_poll` (0: none). An upcall
/// marks it pending, so an event that reached this vCPU as an upcall (on a port it does
/// not poll) also ends that poll, or, taken just before the poll, makes it return at once
/// (docs/design.md, "Stray wake-ups").
static WAKE_PORT: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];

/// Says which port `vcpu`'s poller blocks on (0: none); its upcalls will mark it pending.
pub fn set_wake_port(vcpu: usize, port: EvtchnPort) {
    if let Some(slot) = WAKE_PORT.get(vcpu) {
        slot.store(port, Ordering::Release);
    }
}

static EVENTS: [EventSlot; MAX_CPUS] = [const {
    EventSlot {
        table: spin::Mutex::new(None),
        upcalls: AtomicU64::new(0),
        dispatched: AtomicU64::new(0),
    }
}; MAX_CPUS];

/// Routes `vcpu`'s event upcalls to `UPCALL_VECTOR` (any vCPU, up or not yet).
pub fn init_vcpu(vcpu: u32) -> Result<(), InitError> {
    let domain = get().ok_or(InitError::NotInitialised)?;
    trap::set_interrupt_handler(UPCALL_VECTOR, on_upcall);
    let mode = xen::domain::setup_upcall(&domain.hv, vcpu, UPCALL_VECTOR)
        .map_err(failed("upcall set-up"))?;
    let first = *domain.upcall_mode.call_once(|| mode);
    if first != mode {
        log::warn!("xen: vCPU {vcpu} got upcall mode {mode:?}, vCPU 0 has {first:?}");
    }
    Ok(())
}

fn on_upcall(_frame: &mut trap::TrapFrame) {
    let cpu = smp::current().index.load(Ordering::Relaxed) as usize;
    let slot = &EVENTS[cpu];
    slot.upcalls.fetch_add(1, Ordering::Relaxed);
    let Some(domain) = get() else { return };
    if domain.upcall_mode.get() == Some(&UpcallMode::PerVcpuVector) {
        // The per-vCPU vector comes through the local APIC and needs its EOI.
        apic::end_of_interrupt();
    }
    let Some(vcpu_info) = domain.vcpu_info(cpu) else {
        return;
    };
    let events = VcpuEvents {
        shared: domain.shared,
        vcpu_info,
    };
    // Clear upcall_pending before each scan: an event after the scan sets it again and
    // we go round, instead of losing it.
    loop {
        vcpu_info.clear_upcall_pending();
        let mut table = slot.table.lock();
        match table.as_mut() {
            Some(table) => {
                let n = table.dispatch_pending(&events);
                slot.dispatched.fetch_add(n as u64, Ordering::Relaxed);
            }
            // Nothing registered here: drop the selector so it cannot pile up.
            None => drop(vcpu_info.take_selector()),
        }
        drop(table);
        if !vcpu_info.upcall_pending() {
            break;
        }
    }
    let wake = WAKE_PORT[cpu].load(Ordering::Acquire);
    if wake != 0 {
        domain.shared.set_pending(wake);
    }
}

/// Binds `port` to `vcpu`, registers its handler there, and unmasks it.
#[cfg(feature = "test-hooks")]
pub fn register(
    port: EvtchnPort,
    vcpu: u32,
    handler: EventHandler,
    context: usize,
) -> Result<(), XenError> {
    let domain = get().ok_or(XenError::NoSys)?;
    let slot = &EVENTS.get(vcpu as usize).ok_or(XenError::Inval)?.table;
    // Masked while it moves: EVTCHNOP_unmask then re-delivers an event that is already
    // pending (binding an interdomain channel marks it pending) to the new vCPU. Xen's
    // unmask only does that for a port whose mask bit was set.
    domain.shared.mask(port);
    evtchn::bind_vcpu(&domain.hv, port, vcpu)?;
    x86_64::instructions::interrupts::without_interrupts(|| {
        slot.lock()
            .get_or_insert_with(HandlerTable::new)
            .register(port, handler, context)
    })?;
    evtchn::unmask(&domain.hv, port)
}

/// Removes `port`'s handler (the port itself is closed by its owner).
#[cfg(feature = "test-hooks")]
pub fn unregister(port: EvtchnPort, vcpu: u32) {
    if let Some(slot) = EVENTS.get(vcpu as usize) {
        x86_64::instructions::interrupts::without_interrupts(|| {
            if let Some(table) = slot.table.lock().as_mut() {
                table.unregister(port);
            }
        });
    }
}

/// (upcalls taken, handlers dispatched) on `vcpu`.
#[cfg(feature = "test-hooks")]
pub fn counters(vcpu: usize) -> (u64, u64) {
    let slot = &EVENTS[vcpu];
    (
        slot.upcalls.load(Ordering::Relaxed),
        slot.dispatched.load(Ordering::Relaxed),
    )
}
