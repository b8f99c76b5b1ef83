// SPDX-License-Identifier: MIT OR Apache-2.0
//! One poller per vCPU. Each owns the rings whose queue index maps to its vCPU (queue q
//! on vCPU q mod n), their engines and device queues: nothing on the I/O path is shared
//! or locked. New rings arrive through the vCPU's inbox (an atomic flag, then a lock
//! taken only when the flag is set), and a doorbell event channel wakes a sleeping
//! poller.
//!
//! Adaptive idle: the poller spins while the gaps between its bursts of work say a
//! request is likely soon, for a spell that adapts to them (`polling::spin`); otherwise,
//! or once the spell is over, it re-arms every ring (`prepare_to_sleep`, the final check)
//! and blocks in `SCHEDOP_poll` on one port (its lone ring's, kept masked, or its
//! doorbell; its other ports come as upcalls: `arrange_wake`), so an idle blkdom leaves
//! its pCPUs to the guests and is not woken by other vCPUs' events. While it spins, `poll.idle=yield` has it yield
//! its pCPU (`SCHEDOP_yield`) between looks instead of a PAUSE.

use super::adapters::{FrontendGrants, Notify, SharedRing};
use super::disk::DeviceQueue;
use super::space::{self, MapRegion};
use crate::smp::MAX_CPUS;
use crate::xen_domain;
use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use blkback::engine::Engine;
use blkback::limits::IoLimits;
use blkback::stats::RingStats;
use bootconfig::PollerConfig;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use polling::idle::PollIdle;
use polling::owed::{OwedSends, MAX_OWED};
use polling::sleep::{sleep_deadline, MAX_SLEEP_NS};
use polling::spin::{Decision, SpinPolicy};
use polling::wake::WakePlan;
use xen::abi::event_channel::EvtchnPort;
use xen::abi::DOMID_SELF;
use xen::ring::RingConnection;

pub type BlkEngine = Engine<SharedRing, FrontendGrants, DeviceQueue, Notify>;

/// Requests taken from a ring per pass (bounded work per poll, XSA-332).
const POLL_BUDGET: usize = 64;
/// How often a poller publishes its rings' counters for the control path (which puts
/// them in xenstore every 5 s): by time, as a loop costs anything from nanoseconds to
/// a trapped RDTSC's round trip through Xen.
const RING_STATS_PERIOD_NS: u64 = 500_000_000;

/// Shared between the control path and the poller serving one queue.
#[derive(Default)]
pub struct QueueControl {
    /// Set by control: drain, unmap, unbind, then report `detached`.
    pub detach: AtomicBool,
    pub detached: AtomicBool,
    /// The engine's counters as of the poller's last publication, on lines of their
    /// own: vCPU 0 locks them to read while this poller reads `detach` every loop.
    pub stats: blkback::CacheAligned<spin::Mutex<RingStats>>,
    pub leaked_pages: AtomicU64,
    /// The device queue, handed back by the poller on release (a real disk's queues are
    /// reused by the next connection).
    pub device: spin::Mutex<Option<DeviceQueue>>,
    /// Raised by control when the disk was resized: the poller has the engine refresh
    /// its capacity, then acknowledges the same number in `resize_acked`.
    pub resize_epoch: AtomicU64,
    pub resize_acked: AtomicU64,
    /// The ring's device queue failed (set once by the poller; the control path reports
    /// it in xenstore).
    pub fault: spin::Mutex<Option<blkdev::DeviceFault>>,
    /// The ring's part of its disk's I/O limits, set by control, which then raises
    /// `limits_epoch`: the poller locks `limits` only when the epoch moved (an operator
    /// changed them), never on the I/O path.
    pub limits: spin::Mutex<IoLimits>,
    pub limits_epoch: AtomicU64,
    /// Where the poller let go of the ring (its port, closed since, and `rsp_prod`,
    /// equal to `req_cons`: every request taken was answered), set before `detached`:
    /// what a live upgrade hands over, or re-attaches at when it is abandoned.
    pub left_at: spin::Mutex<Option<handover::vbd::LeftAt>>,
}

pub struct ServedQueue {
    pub engine: BlkEngine,
    /// The ring's pages (mapped at `region.ring_base`) and its bound event channel.
    pub ring: RingConnection,
    pub region: MapRegion,
    pub control: Arc<QueueControl>,
    /// The last `control.resize_epoch` the engine refreshed its capacity for.
    pub resize_seen: u64,
    /// The engine's device fault is in `control.fault`.
    pub fault_seen: bool,
    /// The last `control.limits_epoch` the engine took its limits from.
    pub limits_seen: u64,
}

/// What a poller counts, for `data/blkdom-pollers`.
pub struct PollerCounters {
    pub loops: AtomicU64,
    pub busy_loops: AtomicU64,
    pub sleeps: AtomicU64,
    pub rings: AtomicU32,
    /// Event-channel sends to frontends, and the time spent in them (the hypercall: in a
    /// PVH domain a VM exit, the floor under every response a sleeping frontend waits for).
    pub notifications: AtomicU64,
    pub notify_ns: AtomicU64,
    /// Of the sends, those that went with the sleep that followed them, in one trap into
    /// Xen (`OwedSends`; their time is the sleep's, not in `notify_ns`).
    pub sends_with_sleep: AtomicU64,
    /// Wake-ups from a sleep with none of the poller's ports pending and its deadline
    /// not come: another vCPU's event (docs/design.md, stray wake-ups).
    pub stray_wakes: AtomicU64,
}

// What a poller holds for its sleep fits one multicall with the poll.
const _: () = assert!(MAX_OWED <= xen::hypercall::MAX_SENDS_BEFORE_POLL);

/// Sends the events `owed` holds now, one by one: the poller goes on instead of
/// sleeping (the sends it holds for a sleep, `polling::owed`, docs/design.md §4.4).
#[inline(never)]
fn flush_owed(owed: &OwedSends, hv: &xen::raw::hypercall::NativeHypervisor) {
    let mut ports = [0; MAX_OWED];
    let n = owed.take(&mut ports);
    for &port in &ports[..n] {
        send_counted(hv, port);
    }
}

/// Called by a ring's `Notify` on this vCPU: true when the event on `port` is held for
/// the poller's sleep (or already is) instead of sent now.
pub fn owe_send(port: EvtchnPort) -> bool {
    let cpu = crate::smp::current().index.load(Ordering::Relaxed) as usize;
    POLLERS.get(cpu).is_some_and(|slot| slot.owed.owe(port))
}

/// Sends an event to a frontend on `port`, counted and timed on the calling vCPU's
/// poller. A failed send means the frontend closed its end; teardown follows.
pub fn send_counted(hv: &xen::raw::hypercall::NativeHypervisor, port: EvtchnPort) {
    let start = crate::xen_domain::now_ns();
    let _ = xen::evtchn::send(hv, port);
    count_notification(crate::xen_domain::now_ns().saturating_sub(start));
}

/// Counts one event-channel send to a frontend, `ns` long, on the calling vCPU's poller.
fn count_notification(ns: u64) {
    let cpu = crate::smp::current().index.load(Ordering::Relaxed) as usize;
    if let Some(slot) = POLLERS.get(cpu) {
        slot.counters.notifications.fetch_add(1, Ordering::Relaxed);
        slot.counters.notify_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// One vCPU's poller as the others reach it: its inbox (filled by the control path), its
/// doorbell, its counters. Each slot has cache lines of its own: every poller writes its
/// counters on every loop, and neighbours must not make each other's lines bounce.
#[repr(align(64))]
pub struct PollerSlot {
    /// Rings handed over by the control path, not yet taken; `inbox_pending` says there
    /// are some (the poller looks at the flag every loop, at the lock only when it is set).
    /// `None` until the first (boxed: `None` is then all zeroes, and so is the whole
    /// slot, which keeps the array in .bss instead of the image).
    #[allow(clippy::box_collection)]
    inbox: spin::Mutex<Option<Box<Vec<ServedQueue>>>>,
    inbox_pending: AtomicBool,
    /// Sending end of the poller's doorbell (0: no poller yet).
    doorbell: AtomicU32,
    /// Its receiving end (closed with it before a live upgrade's jump).
    doorbell_rx: AtomicU32,
    /// Rings assigned to this poller (counted at attach, so placement never lags).
    assigned: AtomicU32,
    /// Foreign pages (ring and data grants) this vCPU mapped and has not unmapped (can
    /// go negative: a ring's pages are mapped on vCPU 0 and unmapped by its poller).
    pub mapped_pages: AtomicI64,
    pub counters: PollerCounters,
    owed: OwedSends,
}

impl PollerSlot {
    const fn new() -> PollerSlot {
        PollerSlot {
            inbox: spin::Mutex::new(None),
            inbox_pending: AtomicBool::new(false),
            doorbell: AtomicU32::new(0),
            doorbell_rx: AtomicU32::new(0),
            assigned: AtomicU32::new(0),
            mapped_pages: AtomicI64::new(0),
            counters: PollerCounters {
                loops: AtomicU64::new(0),
                busy_loops: AtomicU64::new(0),
                sleeps: AtomicU64::new(0),
                rings: AtomicU32::new(0),
                notifications: AtomicU64::new(0),
                notify_ns: AtomicU64::new(0),
                sends_with_sleep: AtomicU64::new(0),
                stray_wakes: AtomicU64::new(0),
            },
            owed: OwedSends::new(),
        }
    }
}

/// Every vCPU's poller slot, by vCPU index.
pub static POLLERS: [PollerSlot; MAX_CPUS] = [const { PollerSlot::new() }; MAX_CPUS];

/// The poller with the fewest rings; vCPU 0 (which also runs the control path) only
/// when it has strictly fewer than every other.
pub fn least_loaded(cpus: usize) -> usize {
    (0..cpus.max(1))
        .min_by_key(|&cpu| (POLLERS[cpu].assigned.load(Ordering::Relaxed), cpu == 0))
        .unwrap_or(0)
}

/// Hands a connected ring to the poller of `cpu`.
pub fn attach(cpu: usize, queue: ServedQueue) {
    let slot = &POLLERS[cpu];
    slot.assigned.fetch_add(1, Ordering::Relaxed);
    slot.inbox
        .lock()
        .get_or_insert_with(Box::default)
        .push(queue);
    slot.inbox_pending.store(true, Ordering::Release);
    ring_doorbell(cpu);
}

/// Wakes every poller that sleeps (after the rings' grant caps changed).
pub fn ring_all_doorbells() {
    for cpu in 0..crate::smp::online_count() {
        ring_doorbell(cpu);
    }
}

/// Set by a live upgrade's jump once the park area is written and every ring is
/// released: each poller but vCPU 0's parks at its next sleep.
pub static PARK: AtomicBool = AtomicBool::new(false);

/// Closes `cpu`'s doorbell (both ends): no port this image bound outlives the jump.
pub fn close_doorbell(cpu: usize) {
    crate::xen_domain::events::set_wake_port(cpu, 0);
    let Some(xen) = xen_domain::get() else { return };
    for port in [
        POLLERS[cpu].doorbell.swap(0, Ordering::AcqRel),
        POLLERS[cpu].doorbell_rx.swap(0, Ordering::AcqRel),
    ] {
        if port != 0 {
            if let Err(e) = xen::evtchn::close(&xen.hv, port) {
                log::warn!("poller: doorbell port {port} of vCPU {cpu} not closed: {e:?}");
            }
        }
    }
}

/// Wakes the poller of `cpu` if it sleeps.
pub fn ring_doorbell(cpu: usize) {
    let port = POLLERS[cpu].doorbell.load(Ordering::Acquire);
    if let (Some(xen), true) = (xen_domain::get(), port != 0) {
        let _ = xen::evtchn::send(&xen.hv, port);
    }
}

/// Unmaps a ring's pages, closes its port and gives back its map region (retired if
/// `data_leaked` data grants, or any ring page, stay mapped in it, or if the ring's
/// device failed and could not be stopped: `unstoppable`). Returns the pages
/// that stay mapped. The one way a connected ring goes: after its engine disconnected
/// (the poller), or when its connection fails after the ring connected (`vbd.rs`).
pub fn release_ring(
    ring: RingConnection,
    region: MapRegion,
    data_leaked: u64,
    unstoppable: bool,
) -> u64 {
    let Some(xen) = xen_domain::get() else {
        return 0;
    };
    let ring_leaked = match ring.release(&super::adapters::grant_hypervisor(xen.hv)) {
        Ok(()) => 0,
        Err(e) => {
            log::error!(
                "blkback: unmapping ring pages: {:?} ({} pages stay mapped)",
                e.error,
                e.leaked
            );
            e.leaked as u64
        }
    };
    let leaked = data_leaked + ring_leaked;
    if unstoppable {
        log::error!(
            "blkback: map region {} retired: its device failed and could not be stopped",
            region.index
        );
    } else {
        space::release(region, leaked);
    }
    leaked
}

/// Releases a ring whose engine has disconnected (no request in flight, every data grant
/// unmapped) and hands its device queue back.
fn release(cpu: usize, queue: ServedQueue) {
    POLLERS[cpu].assigned.fetch_sub(1, Ordering::Relaxed);
    let ServedQueue {
        engine,
        ring,
        region,
        control,
        ..
    } = queue;
    // A device that failed and could not be stopped may still write to the pages it was
    // given: their guest-physical addresses must never hold another grant.
    let unstoppable = engine.device_fault().is_some_and(|f| !f.dma_stopped);
    // Drained: every request taken is answered and published, so `rsp_prod` is
    // `req_cons` (the ring re-attaches there).
    *control.left_at.lock() = Some(handover::vbd::LeftAt {
        backend_port: ring.port(),
        rsp_prod: engine.ring().rsp_prod_pvt(),
    });
    let (_, grants, device, _) = engine.into_parts();
    *control.device.lock() = Some(device);
    let leaked = release_ring(ring, region, grants.leaked_pages(), unstoppable);
    control.leaked_pages.store(leaked, Ordering::Release);
    control.detached.store(true, Ordering::Release);
}

/// Masks the port `cpu`'s poller polls and unmasks its others, bound to `cpu`, so each
/// reaches it as an upcall (`polling::wake`). Cheap when nothing changed: only a port
/// still masked costs a hypercall. Interrupts must be on while the poller runs, so an
/// upcall is taken (a vLAPIC request left pending would swallow the next one).
fn arrange_wake(cpu: usize, ports: &[EvtchnPort], wake: &WakePlan) {
    let Some(xen) = xen_domain::get() else { return };
    crate::xen_domain::events::set_wake_port(cpu, wake.polled);
    for &port in ports {
        if wake.masked(port) {
            xen.shared.mask(port);
        } else if xen.shared.is_masked(port) {
            if let Err(e) = xen::evtchn::unmask(&xen.hv, port) {
                log::warn!("poller: vCPU {cpu}: port {port} not unmasked: {e:?}");
            }
        }
    }
}

/// A loopback event channel: sending on the first port marks the second pending.
fn doorbell_pair() -> Option<(EvtchnPort, EvtchnPort)> {
    let xen = xen_domain::get()?;
    let sender = xen::evtchn::alloc_unbound(&xen.hv, DOMID_SELF).ok()?;
    let receiver = xen::evtchn::bind_interdomain(&xen.hv, DOMID_SELF, sender).ok()?;
    xen.shared.mask(receiver);
    Some((sender, receiver))
}

/// Work the control path (vCPU 0) does between polls; returns how soon it wants to run
/// again (ns), and its event channel joins the poller's wait set.
pub trait ControlWork {
    fn port(&self) -> Option<EvtchnPort>;
    /// The storage network's event channel (the vif's), if there is a network.
    fn net_ports(&self) -> &[EvtchnPort];
    /// One pass of the storage network (every pass of vCPU 0), if there is one.
    fn poll_net(&mut self) -> Option<super::net::NetPoll>;
    /// Requests of remote disks wait for the network, or frames for it arrived (looked
    /// at before sleeping; arms the network's events for the sleep).
    fn net_waiting(&self) -> bool;
    /// When the storage network's next timer is due (ns), if there is a network.
    fn net_timer_due(&mut self) -> Option<u64>;
    fn run(&mut self) -> Option<u64>;
    /// A RAM disk asked for memory or has maintenance left (`disk::RAM_MEMORY_WANTED`):
    /// run it now.
    fn maintain_memory(&mut self);
}

/// A poller without the control path saw `RAM_MEMORY_WANTED` and woke vCPU 0 for it
/// (once, until control has run the maintenance).
pub static RAM_KICK_SENT: AtomicBool = AtomicBool::new(false);

/// A poller without the control path saw `devices::RECOVERY_WANTED` (a device queue
/// asked for an abort or a reset) and woke vCPU 0 for it (once, until control has run).
static RECOVERY_KICK_SENT: AtomicBool = AtomicBool::new(false);

/// A poller handed a ring's device fault to the control path (`QueueControl::fault`):
/// vCPU 0 runs the control path at its next pass, which writes the fault to xenstore
/// then, not at its next statistics round up to 5 s later.
static FAULT_NEWS: AtomicBool = AtomicBool::new(false);

/// The poll loop of this vCPU, run as `config` says; never returns.
pub fn run(cpu: usize, mut control: Option<&mut dyn ControlWork>, config: &PollerConfig) -> ! {
    let xen = xen_domain::get().expect("pollers run under Xen");
    let slot = &POLLERS[cpu];
    let counters = &slot.counters;
    let (sender, doorbell) = doorbell_pair().expect("doorbell event channel");
    if let Err(e) = xen::evtchn::bind_vcpu(&xen.hv, doorbell, cpu as u32) {
        log::warn!("poller: vCPU {cpu}: doorbell port {doorbell} stays on vCPU 0: {e:?}");
    }
    // The doorbell and the ports this poller does not poll come as upcalls.
    x86_64::instructions::interrupts::enable();
    slot.doorbell.store(sender, Ordering::Release);
    slot.doorbell_rx.store(doorbell, Ordering::Release);
    let mut served: Vec<ServedQueue> = Vec::with_capacity(64);
    let mut ports: Vec<EvtchnPort> = Vec::with_capacity(128);
    // Every port this poller waits on; it polls exactly one of them (`wake`).
    let mut wake = WakePlan::new(doorbell, &[]);
    let rebuild_ports = |served: &Vec<ServedQueue>,
                         ports: &mut Vec<EvtchnPort>,
                         wake: &mut WakePlan,
                         control: &Option<&mut dyn ControlWork>| {
        ports.clear();
        ports.push(doorbell);
        ports.extend(control.as_ref().and_then(|c| c.port()));
        ports.extend(control.as_ref().map_or(&[][..], |c| c.net_ports()));
        let first_ring = ports.len();
        ports.extend(served.iter().map(|s| s.ring.port()));
        *wake = WakePlan::new(doorbell, &ports[first_ring..]);
        arrange_wake(cpu, ports, wake);
    };
    rebuild_ports(&served, &mut ports, &mut wake, &control);
    let (min_spell_ns, max_spell_ns) = (config.spin_min_ns, config.spin_max_ns);
    let mut spin = SpinPolicy::new(min_spell_ns, max_spell_ns);
    // `auto` was settled at boot (main); the default only if it was not.
    let idle = config.idle.unwrap_or_default();
    let mut control_due = 0u64;
    let mut next_ring_stats = 0u64;
    log::info!(
        "poller: vCPU {cpu} serving (doorbell port {doorbell}, spin {}-{} us ({}), notify hold {} us)",
        min_spell_ns / 1000,
        max_spell_ns / 1000,
        idle.name(),
        config.notify_hold_ns / 1000
    );
    loop {
        counters.loops.fetch_add(1, Ordering::Relaxed);
        // The loop's time: what held notifications' deadlines are measured against.
        let now = xen.now_ns();
        if slot.inbox_pending.swap(false, Ordering::AcqRel) {
            for queue in slot
                .inbox
                .lock()
                .iter_mut()
                .flat_map(|inbox| inbox.drain(..))
            {
                xen.shared.mask(queue.ring.port());
                served.push(queue);
            }
            rebuild_ports(&served, &mut ports, &mut wake, &control);
            counters.rings.store(served.len() as u32, Ordering::Relaxed);
        }
        // Event sends owed to the sleep in a pass after which the poller expects to sleep.
        slot.owed.collect(!spin.expects_work());
        let mut work = false;
        // Work that was not the rings' (a ring still draining, memory maintenance, the
        // network): the next pass comes whatever the spin policy says.
        let mut other_work = false;
        // Requests answered this pass: how deep a burst the frontends keep (SpinPolicy).
        let mut answered = 0u32;
        let mut i = 0;
        while i < served.len() {
            let queue = &mut served[i];
            if queue.control.detach.load(Ordering::Acquire) {
                if queue.engine.disconnect().is_ok() {
                    *queue.control.stats.lock() = queue.engine.stats();
                    // Nothing is sent on a port after its ring's release closed it.
                    flush_owed(&slot.owed, &xen.hv);
                    release(cpu, served.swap_remove(i));
                    rebuild_ports(&served, &mut ports, &mut wake, &control);
                    counters.rings.store(served.len() as u32, Ordering::Relaxed);
                } else {
                    work = true;
                    other_work = true;
                    i += 1;
                }
                continue;
            }
            if xen.shared.is_pending(queue.ring.port()) {
                xen.shared.clear_pending(queue.ring.port());
                queue.engine.event_received();
            }
            let resize = queue.control.resize_epoch.load(Ordering::Acquire);
            if resize != queue.resize_seen {
                queue.engine.refresh_capacity();
                queue.resize_seen = resize;
                queue.control.resize_acked.store(resize, Ordering::Release);
            }
            let limits = queue.control.limits_epoch.load(Ordering::Acquire);
            if limits != queue.limits_seen {
                queue.engine.set_limits(&queue.control.limits.lock());
                queue.limits_seen = limits;
            }
            let outcome = queue.engine.poll_at(POLL_BUDGET, now);
            work |= outcome.did_work();
            answered = answered.saturating_add(outcome.completed as u32);
            i += 1;
        }
        if super::disk::RAM_MEMORY_WANTED.load(Ordering::Relaxed) {
            match control.as_mut() {
                Some(control) => {
                    control.maintain_memory();
                    // Set again: maintenance has more to do, a bounded piece a loop.
                    let more = super::disk::RAM_MEMORY_WANTED.load(Ordering::Relaxed);
                    work |= more;
                    other_work |= more;
                }
                None if !RAM_KICK_SENT.swap(true, Ordering::AcqRel) => ring_doorbell(0),
                None => {}
            }
        }
        // The storage network: frames, remote disks' commands and data, reconnects.
        let (mut net_busy, mut net_news) = (false, false);
        if let Some(net) = control.as_mut().and_then(|c| c.poll_net()) {
            work |= net.work;
            other_work |= net.work;
            net_busy = net.busy;
            net_news = net.news;
        }
        // A device queue asked for its device's recovery: the control path runs it now.
        let recovery_news = crate::devices::RECOVERY_WANTED.load(Ordering::Relaxed);
        if recovery_news && control.is_none() && !RECOVERY_KICK_SENT.swap(true, Ordering::AcqRel) {
            ring_doorbell(0);
        }
        // The rings' clock: device commands are timed by it, grants unpinned from now on
        // are stamped with it, and cached grants idle for the timeout are unmapped (a
        // bounded batch; cheap otherwise).
        tick(&mut served, now);
        if now >= next_ring_stats {
            next_ring_stats = now.saturating_add(RING_STATS_PERIOD_NS);
            for queue in &served {
                if let Some(mut stats) = queue.control.stats.try_lock() {
                    *stats = queue.engine.stats();
                }
            }
        }
        if let Some(control) = control.as_mut() {
            let kicked = control.port().is_some_and(|p| xen.shared.is_pending(p));
            let fault_news = FAULT_NEWS.swap(false, Ordering::AcqRel);
            if kicked || fault_news || recovery_news || net_news || now >= control_due {
                if let Some(p) = control.port() {
                    xen.shared.clear_pending(p);
                }
                RECOVERY_KICK_SENT.store(false, Ordering::Release);
                control_due = now.saturating_add(control.run().unwrap_or(MAX_SLEEP_NS));
                rebuild_ports(&served, &mut ports, &mut wake, &Some(&mut **control));
            }
        }
        if work {
            counters.busy_loops.fetch_add(1, Ordering::Relaxed);
            spin.on_work(now, answered);
            // Events owed, and the policy sleeps at once after this work: the sleep
            // comes now, without a pass that would find nothing (its final checks stand
            // for that pass), and the events go with it.
            let owed = slot.owed.any();
            if !owed || other_work || spin.on_idle(now) == Decision::Spin {
                flush_owed(&slot.owed, &xen.hv);
                continue;
            }
        } else if spin.on_idle(now) == Decision::Spin {
            flush_owed(&slot.owed, &xen.hv);
            match idle {
                PollIdle::Pause => core::hint::spin_loop(),
                // Another vCPU on this pCPU (a guest's, say) runs first, if one is
                // runnable; it fails only if Xen refuses the call, and then this was a
                // plain look again.
                PollIdle::Yield => {
                    let _ = xen::domain::yield_now(&xen.hv);
                }
                PollIdle::Spin => {}
            }
            continue;
        }
        // Re-arm every ring (no short-circuit: each needs its final check). An event a
        // ring held (notification moderation) goes with the sleep too.
        slot.owed.collect(true);
        let quiet = served
            .iter_mut()
            .fold(true, |quiet, q| q.engine.prepare_to_sleep() & quiet);
        if !quiet || slot.inbox_pending.load(Ordering::Acquire) {
            flush_owed(&slot.owed, &xen.hv);
            spin.on_sleep_abandoned();
            continue;
        }
        // Remote disks' requests and the vif's frames that came since the network's
        // pass are taken now (this also arms the vif's events for the sleep).
        if control
            .as_ref()
            .is_some_and(|control| control.net_waiting())
        {
            flush_owed(&slot.owed, &xen.hv);
            spin.on_sleep_abandoned();
            continue;
        }
        // A live upgrade's jump: every ring was released (the drain), so this vCPU parks
        // (vCPU 0, which runs the control path, jumps instead).
        if control.is_none() && served.is_empty() && PARK.load(Ordering::Acquire) {
            flush_owed(&slot.owed, &xen.hv);
            close_doorbell(cpu);
            crate::arch::jump::park_this_cpu(cpu);
        }
        counters.sleeps.fetch_add(1, Ordering::Relaxed);
        // Device completions raise no event: with requests on a device, come back soon.
        // `prepare_to_sleep` sent every held notification; a held deadline would still
        // bound the sleep. A ring at its I/O limits is looked at again when its buckets
        // let its next request go (one wake-up per due request, no periodic timer).
        let device_busy = net_busy || served.iter().any(|q| q.engine.in_flight() > 0);
        let notify_due = served
            .iter()
            .filter_map(|q| {
                q.engine
                    .notify_deadline()
                    .into_iter()
                    .chain(q.engine.throttle_deadline())
                    .min()
            })
            .chain(control.as_mut().and_then(|c| c.net_timer_due()))
            .min();
        let deadline = sleep_deadline(
            now,
            control.is_some().then_some(control_due),
            device_busy,
            notify_due,
        );
        // Returns when the polled port is pending (an upcall for any other port of this
        // vCPU marks it so), at the deadline, or on an interrupt; not for other vCPUs'
        // events, as it polls one port.
        let mut owed_ports = [0; MAX_OWED];
        let n_owed = slot.owed.take(&mut owed_ports);
        let owed = &owed_ports[..n_owed];
        if !owed.is_empty() {
            counters
                .notifications
                .fetch_add(owed.len() as u64, Ordering::Relaxed);
            counters
                .sends_with_sleep
                .fetch_add(owed.len() as u64, Ordering::Relaxed);
        }
        let _ = xen::evtchn::poll_after_sends(
            &xen.hv,
            owed,
            core::slice::from_ref(&wake.polled),
            deadline,
        );
        // Up to a second asleep: the grants the next polls unpin must not carry the
        // time before the sleep (they would look idle for that much longer).
        let woke = xen.now_ns();
        if woke < deadline && !ports.iter().any(|&port| xen.shared.is_pending(port)) {
            counters.stray_wakes.fetch_add(1, Ordering::Relaxed);
        }
        // Whatever woke it: if its first look finds nothing it sleeps again at once.
        spin.on_wake();
        xen.shared.clear_pending(doorbell);
        tick(&mut served, woke);
    }
}

/// Gives every ring the clock (`Engine::tick`), and hands a device fault a ring's engine
/// saw for the first time to the control path (woken for it: `FAULT_NEWS`).
fn tick(served: &mut [ServedQueue], now: u64) {
    for queue in served {
        queue.engine.tick(now);
        if !queue.fault_seen {
            if let Some(fault) = queue.engine.device_fault() {
                *queue.control.fault.lock() = Some(fault);
                queue.fault_seen = true;
                FAULT_NEWS.store(true, Ordering::Release);
                ring_doorbell(0);
            }
        }
    }
}
