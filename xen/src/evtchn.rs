// SPDX-License-Identifier: MIT OR Apache-2.0
//! Event channels: typed wrappers over `event_channel_op`, the 2-level pending-bit scan
//! with per-vCPU port ownership, a handler table, and the idle protocol a poller uses to
//! sleep without losing a wake-up.
//!
//! # Sleeping without a lost wake-up (HVM/PVH vCPUs)
//!
//! Xen delivers an event to an HVM/PVH vCPU as an interrupt (the per-vCPU upcall vector,
//! or the domain-wide callback vector). `SCHEDOP_block` (and the HLT intercept) only
//! returns at once if an interrupt is *deliverable* at that moment
//! (`hvm_local_events_need_delivery`: RFLAGS.IF set and no STI/MOV-SS shadow). Hence:
//!
//! * blocking with interrupts disabled sleeps through an interrupt that is already
//!   pending in the virtual LAPIC (woken only by the *next* event);
//! * `sti; vmcall(SCHEDOP_block)` does not help: the STI shadow still covers the
//!   `vmcall` when Xen checks (Xen advances RIP and drops the shadow only after the
//!   hypercall returns, `svm.c`/`vmx.c` VMMCALL/VMCALL exits);
//! * blocking with interrupts enabled races with the interrupt being taken between the
//!   last check and the hypercall;
//! * `sti; hlt` is atomic: HLT is intercepted, Xen first advances RIP and clears the
//!   shadow (`svm_vmexit_do_hlt`, `EXIT_REASON_HLT`), then `hvm_hlt` ->
//!   `vcpu_block_enable_events` — the very path of `SCHEDOP_block` — sees the pending
//!   interrupt as deliverable and does not block.
//!
//! So [`idle_wait`] does: disable interrupts, clear `evtchn_upcall_pending`, run the
//! caller's final check (rings, pending bits), and if there is nothing, `sti; hlt`.
//! The upcall interrupt handler must clear `evtchn_upcall_pending` (required with the
//! callback-vector fallback, where Xen re-injects while it is set) and, for the per-vCPU
//! vector, write the LAPIC EOI; it need not scan — the poller does after waking.
//!
//! For a vCPU that only waits on event channels (no device interrupts), `SCHEDOP_poll`
//! on its ports is also race-free, even with the ports masked and interrupts off:
//! Xen checks the ports' pending bits after marking the vCPU as polling.

use crate::abi::event_channel::*;
use crate::abi::shared_info::{BITS_PER_XEN_ULONG, EVTCHN_2L_NR_CHANNELS, EVTCHN_2L_WORDS};
use crate::abi::DomId;
use crate::abi::DOMID_SELF;
use crate::error::{check, XenError};
use crate::hypercall::{EvtchnOp, Hypercall, Hypervisor, SchedOp, MAX_SENDS_BEFORE_POLL};
use alloc::vec::Vec;

fn evtchn_op<H: Hypervisor + ?Sized>(hv: &H, op: EvtchnOp<'_>) -> Result<(), XenError> {
    check(hv.hypercall(Hypercall::Evtchn(op))).map(drop)
}

/// Allocates a port that `remote_dom` may bind to (we are the listener).
pub fn alloc_unbound<H: Hypervisor + ?Sized>(
    hv: &H,
    remote_dom: DomId,
) -> Result<EvtchnPort, XenError> {
    let mut arg = EvtchnAllocUnbound {
        dom: DOMID_SELF,
        remote_dom,
        port: 0,
    };
    evtchn_op(hv, EvtchnOp::AllocUnbound(&mut arg))?;
    Ok(arg.port)
}

/// Binds to `remote_port` of `remote_dom` (e.g. a frontend's `event-channel`); returns
/// our local port, bound to vCPU 0 until [`bind_vcpu`].
pub fn bind_interdomain<H: Hypervisor + ?Sized>(
    hv: &H,
    remote_dom: DomId,
    remote_port: EvtchnPort,
) -> Result<EvtchnPort, XenError> {
    let mut arg = EvtchnBindInterdomain {
        remote_dom,
        remote_port,
        local_port: 0,
    };
    evtchn_op(hv, EvtchnOp::BindInterdomain(&mut arg))?;
    Ok(arg.local_port)
}

pub fn send<H: Hypervisor + ?Sized>(hv: &H, port: EvtchnPort) -> Result<(), XenError> {
    evtchn_op(hv, EvtchnOp::Send(&mut EvtchnPortArg { port }))
}

pub fn close<H: Hypervisor + ?Sized>(hv: &H, port: EvtchnPort) -> Result<(), XenError> {
    evtchn_op(hv, EvtchnOp::Close(&mut EvtchnPortArg { port }))
}

/// Clears the mask bit and has Xen re-deliver an event that arrived while masked.
pub fn unmask<H: Hypervisor + ?Sized>(hv: &H, port: EvtchnPort) -> Result<(), XenError> {
    evtchn_op(hv, EvtchnOp::Unmask(&mut EvtchnPortArg { port }))
}

/// Routes `port`'s notifications to `vcpu`.
pub fn bind_vcpu<H: Hypervisor + ?Sized>(
    hv: &H,
    port: EvtchnPort,
    vcpu: u32,
) -> Result<(), XenError> {
    evtchn_op(hv, EvtchnOp::BindVcpu(&mut EvtchnBindVcpu { port, vcpu }))
}

/// What a port is connected to (`EVTCHNOP_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelState {
    Closed,
    Unbound {
        remote_dom: DomId,
    },
    Interdomain {
        remote_dom: DomId,
        remote_port: EvtchnPort,
    },
    Pirq(u32),
    Virq(u32),
    Ipi,
    Unknown(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelStatus {
    pub state: ChannelState,
    pub vcpu: u32,
}

pub fn status<H: Hypervisor + ?Sized>(hv: &H, port: EvtchnPort) -> Result<ChannelStatus, XenError> {
    let mut arg = EvtchnStatus {
        dom: DOMID_SELF,
        port,
        ..Default::default()
    };
    evtchn_op(hv, EvtchnOp::Status(&mut arg))?;
    let state = match arg.status {
        EVTCHNSTAT_CLOSED => ChannelState::Closed,
        EVTCHNSTAT_UNBOUND => ChannelState::Unbound {
            remote_dom: arg.u[0] as DomId,
        },
        EVTCHNSTAT_INTERDOMAIN => ChannelState::Interdomain {
            remote_dom: arg.u[0] as DomId,
            remote_port: arg.u[1],
        },
        EVTCHNSTAT_PIRQ => ChannelState::Pirq(arg.u[0]),
        EVTCHNSTAT_VIRQ => ChannelState::Virq(arg.u[0]),
        EVTCHNSTAT_IPI => ChannelState::Ipi,
        other => ChannelState::Unknown(other),
    };
    Ok(ChannelStatus {
        state,
        vcpu: arg.vcpu,
    })
}

/// Blocks in `SCHEDOP_poll` until one of `ports` is pending or `timeout_ns` (absolute
/// Xen system time; 0 = none). Works with the ports masked and interrupts disabled.
pub fn poll<H: Hypervisor + ?Sized>(
    hv: &H,
    ports: &[EvtchnPort],
    timeout_ns: u64,
) -> Result<(), XenError> {
    check_poll_ports(ports)?;
    check(hv.hypercall(Hypercall::Sched(SchedOp::Poll { ports, timeout_ns }))).map(drop)
}

/// `SCHEDOP_poll` takes 1 to [`SCHED_POLL_MAX_PORTS`](crate::abi::sched::SCHED_POLL_MAX_PORTS) ports.
fn check_poll_ports(ports: &[EvtchnPort]) -> Result<(), XenError> {
    if ports.is_empty() || ports.len() > crate::abi::sched::SCHED_POLL_MAX_PORTS {
        return Err(XenError::Inval);
    }
    Ok(())
}

/// Sends on each of `sends`, then blocks as [`poll`] does, in one trap into Xen
/// (`multicall`; a PVH or HVM vCPU's every trap is a VM exit): the poller about to
/// sleep owes frontends their events. Past [`MAX_SENDS_BEFORE_POLL`] sends the rest go
/// first, one by one; where Xen refuses the multicall (-ENOSYS, nothing done) the
/// sends go one by one and the poll alone (every Xen this runs on offers `multicall`
/// to HVM and PVH guests; one that did not would cost a trap more per sleep).
/// Sends that fail (a port whose peer closed it) are not reported, as callers of
/// [`send`] ignore them; the poll's result is.
pub fn poll_after_sends<H: Hypervisor + ?Sized>(
    hv: &H,
    sends: &[EvtchnPort],
    ports: &[EvtchnPort],
    timeout_ns: u64,
) -> Result<(), XenError> {
    check_poll_ports(ports)?;
    let (first, last) = sends.split_at(sends.len().saturating_sub(MAX_SENDS_BEFORE_POLL));
    for &port in first {
        let _ = send(hv, port);
    }
    if !last.is_empty() {
        let rc = hv.hypercall(Hypercall::Sched(SchedOp::PollAfterSends {
            sends: last,
            ports,
            timeout_ns,
        }));
        if rc != -(crate::abi::errno::ENOSYS as i64) {
            return check(rc).map(drop);
        }
    }
    for &port in last {
        let _ = send(hv, port);
    }
    poll(hv, ports, timeout_ns)
}

/// Kicks and waits on one event channel for a control-path ring (xenstore, console):
/// `notify` sends on the port; `wait` returns once the port is pending (clearing it) or
/// fails with `Timeout` after `timeout_ns`. The port may stay masked: `SCHEDOP_poll`
/// sees masked pending bits. No wake-up is lost: a pending bit set after the caller's
/// last check is either seen here or ends the poll.
pub struct PortSignal<H, C> {
    pub hv: H,
    pub port: EvtchnPort,
    pub shared: crate::shared_info::SharedInfoPage,
    /// Xen system time in ns (e.g. `XenClock::system_time_at(read_tsc())`).
    pub now_ns: C,
    pub timeout_ns: u64,
}

impl<H: Hypervisor, C: FnMut() -> u64> crate::xenstore::RingSignal for PortSignal<H, C> {
    fn notify(&mut self) {
        // A failed send means the port is gone; the ring's wait times out and reports it.
        let _ = send(&self.hv, self.port);
    }

    fn wait(&mut self) -> Result<(), crate::xenstore::RingError> {
        let deadline = (self.now_ns)().saturating_add(self.timeout_ns);
        loop {
            if self.shared.is_pending(self.port) {
                self.shared.clear_pending(self.port);
                return Ok(());
            }
            if (self.now_ns)() >= deadline {
                return Err(crate::xenstore::RingError::Timeout);
            }
            // Returns early for any deliverable interrupt too; the loop re-checks.
            if poll(&self.hv, core::slice::from_ref(&self.port), deadline).is_err() {
                return Err(crate::xenstore::RingError::Timeout);
            }
        }
    }
}

/// The 2-level bitmaps as one vCPU sees them (implemented over the real `shared_info`
/// by [`crate::shared_info::VcpuEvents`]).
pub trait EventBits {
    /// Atomically reads and clears this vCPU's `evtchn_pending_sel`.
    fn take_selector(&self) -> u64;
    fn pending_word(&self, word: usize) -> u64;
    fn mask_word(&self, word: usize) -> u64;
    fn clear_pending(&self, port: EvtchnPort);
}

/// A set of ports (the 4096 of the 2-level ABI).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSet {
    words: [u64; EVTCHN_2L_WORDS],
}

impl Default for PortSet {
    fn default() -> Self {
        Self {
            words: [0; EVTCHN_2L_WORDS],
        }
    }
}

impl PortSet {
    /// `false` if the port is outside the 2-level range.
    pub fn insert(&mut self, port: EvtchnPort) -> bool {
        let port = port as usize;
        if port >= EVTCHN_2L_NR_CHANNELS {
            return false;
        }
        self.words[port / BITS_PER_XEN_ULONG] |= 1 << (port % BITS_PER_XEN_ULONG);
        true
    }

    pub fn remove(&mut self, port: EvtchnPort) {
        let port = port as usize;
        if port < EVTCHN_2L_NR_CHANNELS {
            self.words[port / BITS_PER_XEN_ULONG] &= !(1 << (port % BITS_PER_XEN_ULONG));
        }
    }

    pub fn contains(&self, port: EvtchnPort) -> bool {
        let port = port as usize;
        port < EVTCHN_2L_NR_CHANNELS
            && self.words[port / BITS_PER_XEN_ULONG] & (1 << (port % BITS_PER_XEN_ULONG)) != 0
    }

    pub fn word(&self, word: usize) -> u64 {
        self.words[word]
    }
}

/// Where the next scan starts, so a busy low port cannot starve higher ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanCursor {
    next_port: usize,
}

/// One bounded pass over the pending events of one vCPU: takes the selector, and for each
/// selected word dispatches every port that is pending, unmasked and in `owned`, clearing
/// its pending bit *before* the dispatch (a new event during the handler sets it again).
/// Each port is dispatched at most once per call; the pass starts after the port the
/// previous pass ended at. Ports of other vCPUs sharing a word are left pending for their
/// owner (Xen set the owner's selector too). Returns the number of dispatches.
pub fn scan_pending<B: EventBits + ?Sized>(
    bits: &B,
    owned: &PortSet,
    cursor: &mut ScanCursor,
    mut dispatch: impl FnMut(EvtchnPort),
) -> usize {
    let selector = bits.take_selector();
    if selector == 0 {
        return 0;
    }
    let start = cursor.next_port % EVTCHN_2L_NR_CHANNELS;
    let (start_word, start_bit) = (start / BITS_PER_XEN_ULONG, start % BITS_PER_XEN_ULONG);
    let mut dispatched = 0;
    // Words start_word, start_word+1, ..., wrapping back to start_word for its low bits.
    for step in 0..=EVTCHN_2L_WORDS {
        let word = (start_word + step) % EVTCHN_2L_WORDS;
        if selector & (1 << word) == 0 {
            continue;
        }
        let range_mask = if step == 0 {
            !0u64 << start_bit
        } else if step == EVTCHN_2L_WORDS {
            if start_bit == 0 {
                break;
            }
            !(!0u64 << start_bit)
        } else {
            !0
        };
        let mut ready =
            bits.pending_word(word) & !bits.mask_word(word) & owned.word(word) & range_mask;
        while ready != 0 {
            let bit = ready.trailing_zeros() as usize;
            ready &= ready - 1;
            let port = (word * BITS_PER_XEN_ULONG + bit) as EvtchnPort;
            bits.clear_pending(port);
            dispatch(port);
            dispatched += 1;
            cursor.next_port = word * BITS_PER_XEN_ULONG + bit + 1;
        }
    }
    dispatched
}

/// An event handler: a plain function plus one word of context (no allocation or
/// locking at dispatch time).
pub type EventHandler = fn(port: EvtchnPort, context: usize);

/// One vCPU's ports and their handlers.
#[derive(Clone, Debug, Default)]
pub struct HandlerTable {
    owned: PortSet,
    /// Sorted by port.
    handlers: Vec<(EvtchnPort, EventHandler, usize)>,
    cursor: ScanCursor,
}

impl HandlerTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the handler of `port` (set-up path: may allocate).
    pub fn register(
        &mut self,
        port: EvtchnPort,
        handler: EventHandler,
        context: usize,
    ) -> Result<(), XenError> {
        if !self.owned.insert(port) {
            return Err(XenError::Inval);
        }
        match self.handlers.binary_search_by_key(&port, |entry| entry.0) {
            Ok(i) => self.handlers[i] = (port, handler, context),
            Err(i) => self.handlers.insert(i, (port, handler, context)),
        }
        Ok(())
    }

    pub fn unregister(&mut self, port: EvtchnPort) {
        self.owned.remove(port);
        if let Ok(i) = self.handlers.binary_search_by_key(&port, |entry| entry.0) {
            self.handlers.remove(i);
        }
    }

    pub fn owned(&self) -> &PortSet {
        &self.owned
    }

    /// Scans and dispatches once (see [`scan_pending`]); returns the dispatch count.
    pub fn dispatch_pending<B: EventBits + ?Sized>(&mut self, bits: &B) -> usize {
        let handlers = &self.handlers;
        scan_pending(bits, &self.owned, &mut self.cursor, |port| {
            if let Ok(i) = handlers.binary_search_by_key(&port, |entry| entry.0) {
                let (_, handler, context) = handlers[i];
                handler(port, context);
            }
        })
    }
}

/// Interrupt control for [`idle_wait`]; the kernel's implementation is
/// `crate::raw::cpu::NativeCpu`.
pub trait CpuIdle {
    fn disable_interrupts(&self);
    fn enable_interrupts(&self);
    /// `sti; hlt`: enables interrupts and halts as one step, so an interrupt pending
    /// while they were disabled ends the halt at once.
    fn enable_interrupts_and_halt(&self);
}

/// How [`idle_wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The final check found work; the vCPU did not halt.
    WorkFound,
    /// The vCPU halted and an interrupt woke it.
    Halted,
}

/// The poller's sleep (see the module docs): interrupts off, clear
/// `evtchn_upcall_pending` with `clear_upcall`, final check with `has_work`, then
/// `sti; hlt` if there is nothing. Interrupts are enabled on return either way.
pub fn idle_wait<C: CpuIdle + ?Sized>(
    cpu: &C,
    clear_upcall: impl FnOnce(),
    has_work: impl FnOnce() -> bool,
) -> Wake {
    cpu.disable_interrupts();
    clear_upcall();
    if has_work() {
        cpu.enable_interrupts();
        return Wake::WorkFound;
    }
    cpu.enable_interrupts_and_halt();
    Wake::Halted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeXen;
    use crate::shared_info::{SharedInfoPage, VcpuEvents, VcpuInfoView};
    use crate::SharedMem;
    use core::cell::{Cell, RefCell};
    use std::vec;

    /// A fresh shared_info page, vCPU 0's slot, and what vCPU 0 scans.
    fn vcpu0() -> (SharedInfoPage, VcpuInfoView, VcpuEvents) {
        let page = SharedInfoPage::new(SharedMem::alloc_leaked(4096)).unwrap();
        let v0 = page.legacy_vcpu_info(0).unwrap();
        let events = VcpuEvents {
            shared: page,
            vcpu_info: v0,
        };
        (page, v0, events)
    }

    #[test]
    fn wrappers_pass_arguments_and_results() {
        let xen = FakeXen::new();
        let port = alloc_unbound(&xen, 3).unwrap();
        assert_eq!(port, 5);
        let local = bind_interdomain(&xen, 3, 17).unwrap();
        assert_eq!(local, 6);
        assert_eq!(bind_interdomain(&xen, 3, 0), Err(XenError::Inval));
        bind_vcpu(&xen, local, 1).unwrap();
        send(&xen, local).unwrap();
        unmask(&xen, local).unwrap();
        close(&xen, port).unwrap();
        let st = status(&xen, local).unwrap();
        assert_eq!(st.vcpu, 1);
        assert_eq!(
            st.state,
            ChannelState::Interdomain {
                remote_dom: 7,
                remote_port: 42
            }
        );
        xen.with(|s| {
            assert_eq!(s.sent, vec![6]);
            assert_eq!(s.unmasked, vec![6]);
            assert_eq!(s.closed_ports, vec![5]);
        });
        assert_eq!(poll(&xen, &[], 0), Err(XenError::Inval));
        assert_eq!(poll(&xen, &[local], 0), Ok(()));
    }

    #[test]
    fn sends_go_with_the_poll_in_one_call_and_one_by_one_where_xen_refuses_it() {
        let xen = FakeXen::new();
        let many: Vec<EvtchnPort> = (10..10 + MAX_SENDS_BEFORE_POLL as u32 + 3).collect();
        poll_after_sends(&xen, &many, &[4], 0).unwrap();
        xen.with(|s| {
            assert_eq!(s.polls_after_sends, 1);
            assert_eq!(s.sent, many, "every send, in order");
            // The three past the multicall's room went alone first.
            assert_eq!(s.calls.iter().filter(|c| c.contains("Send(")).count(), 3);
        });
        assert_eq!(poll_after_sends(&xen, &[1], &[], 0), Err(XenError::Inval));
        // No send owed: the poll alone.
        poll_after_sends(&xen, &[], &[4], 0).unwrap();
        xen.with(|s| {
            assert_eq!(s.polls_after_sends, 1);
            assert!(s.calls.last().unwrap().contains("Poll {"));
        });
        // A Xen without the multicall: the same sends and the poll, one call each.
        xen.with(|s| {
            s.sent.clear();
            s.poll_after_sends_rc = Some(-(crate::abi::errno::ENOSYS as i64));
        });
        poll_after_sends(&xen, &[7, 8], &[4], 0).unwrap();
        xen.with(|s| {
            assert_eq!(s.sent, vec![7, 8]);
            assert!(s.calls.last().unwrap().contains("Poll {"));
        });
        // The poll's failure is the caller's.
        xen.with(|s| s.poll_after_sends_rc = Some(-(crate::abi::errno::EINVAL as i64)));
        assert_eq!(poll_after_sends(&xen, &[7], &[4], 0), Err(XenError::Inval));
    }

    #[test]
    fn port_signal_waits_for_the_port_or_times_out() {
        use crate::xenstore::{RingError, RingSignal};
        let xen = FakeXen::new();
        let (page, v0, _) = vcpu0();
        let clock = Cell::new(1_000u64);
        let mut signal = PortSignal {
            hv: &xen,
            port: 3,
            shared: page,
            now_ns: || {
                clock.set(clock.get() + 400);
                clock.get()
            },
            timeout_ns: 1_000,
        };
        signal.notify();
        page.raise(3, &v0);
        assert_eq!(signal.wait(), Ok(()));
        assert!(!page.is_pending(3), "consumed");
        // Nothing pending: polls until the deadline passes.
        assert_eq!(signal.wait(), Err(RingError::Timeout));
        xen.with(|s| {
            assert_eq!(s.sent, vec![3]);
            let polls = s.calls.iter().filter(|c| c.contains("Poll")).count();
            assert_eq!(polls, 2, "polled until the clock passed the deadline");
        });
    }

    #[test]
    fn scan_dispatches_owned_unmasked_pending_ports_once() {
        let (page, v0, events) = vcpu0();
        let mut owned = PortSet::default();
        for port in [1, 2, 64, 700, 4095] {
            owned.insert(port);
        }
        for port in [1, 64, 700, 4095] {
            page.raise(port, &v0);
        }
        // Port 3 is pending in word 0 but belongs to another vCPU.
        page.raise(3, &page.legacy_vcpu_info(1).unwrap());
        let mut seen = vec![];
        let mut cursor = ScanCursor::default();
        let n = scan_pending(&events, &owned, &mut cursor, |p| seen.push(p));
        assert_eq!(n, 4);
        assert_eq!(seen, vec![1, 64, 700, 4095]);
        for port in [1, 64, 700, 4095] {
            assert!(!page.is_pending(port), "port {port} still pending");
        }
        assert!(page.is_pending(3), "another vCPU's port must stay pending");
        // Nothing new: the selector is empty now.
        assert_eq!(scan_pending(&events, &owned, &mut cursor, |_| panic!()), 0);
    }

    #[test]
    fn concurrent_raises_are_never_lost() {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        use std::sync::Arc;
        use std::time::{Duration, Instant};
        // Another thread plays Xen: it raises every port, then waits until each was
        // dispatched exactly once more before raising again. A lost event stalls it.
        let (page, v0, events) = vcpu0();
        let ports: Vec<EvtchnPort> = (0..96).map(|i| 1 + i * 41).collect();
        let mut owned = PortSet::default();
        for &p in &ports {
            owned.insert(p);
        }
        let counts: Arc<Vec<AtomicU32>> = Arc::new((0..4096).map(|_| AtomicU32::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let consumer = {
            let (counts, stop) = (counts.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut cursor = ScanCursor::default();
                while !stop.load(Ordering::Acquire) {
                    v0.clear_upcall_pending();
                    scan_pending(&events, &owned, &mut cursor, |p| {
                        counts[p as usize].fetch_add(1, Ordering::AcqRel);
                    });
                }
            })
        };
        let rounds = 300;
        let deadline = Instant::now() + Duration::from_secs(15);
        for round in 1..=rounds {
            for &p in &ports {
                page.raise(p, &v0);
            }
            while !ports
                .iter()
                .all(|&p| counts[p as usize].load(Ordering::Acquire) == round)
            {
                assert!(Instant::now() < deadline, "lost an event in round {round}");
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::Release);
        consumer.join().unwrap();
        assert!(ports
            .iter()
            .all(|&p| counts[p as usize].load(Ordering::Acquire) == rounds));
        let others: u32 = (0..4096)
            .filter(|p| !ports.contains(p))
            .map(|p| counts[p as usize].load(Ordering::Acquire))
            .sum();
        assert_eq!(others, 0);
    }

    #[test]
    fn masked_ports_wait_for_unmask() {
        let (page, v0, events) = vcpu0();
        let mut owned = PortSet::default();
        owned.insert(9);
        owned.insert(10);
        page.raise(10, &v0);
        page.mask(9);
        page.raise(9, &v0); // pending while masked: no selector bit of its own
        let mut seen = vec![];
        scan_pending(&events, &owned, &mut ScanCursor::default(), |p| {
            seen.push(p)
        });
        assert_eq!(seen, vec![10]);
        assert!(page.is_pending(9));
    }

    #[test]
    fn event_during_handler_is_seen_next_pass() {
        let (page, v0, events) = vcpu0();
        let mut owned = PortSet::default();
        owned.insert(200);
        page.raise(200, &v0);
        let mut cursor = ScanCursor::default();
        let mut count = 0;
        scan_pending(&events, &owned, &mut cursor, |p| {
            count += 1;
            // The pending bit was cleared before dispatch, so this raise sticks.
            assert!(page.raise(p, &v0) || v0.upcall_pending());
        });
        assert_eq!(count, 1, "one dispatch per pass, even if re-raised");
        assert_eq!(
            scan_pending(&events, &owned, &mut cursor, |_| count += 1),
            1
        );
        assert_eq!(count, 2);
    }

    #[test]
    fn scan_rotates_so_busy_low_ports_do_not_starve_others() {
        // A fake whose ports 0 and 5 are always pending: the cursor must alternate.
        struct AlwaysPending(Cell<u64>);
        impl EventBits for AlwaysPending {
            fn take_selector(&self) -> u64 {
                1
            }
            fn pending_word(&self, word: usize) -> u64 {
                if word == 0 {
                    self.0.get()
                } else {
                    0
                }
            }
            fn mask_word(&self, _: usize) -> u64 {
                0
            }
            fn clear_pending(&self, _: EvtchnPort) {}
        }
        let bits = AlwaysPending(Cell::new(0b10_0001));
        let mut owned = PortSet::default();
        owned.insert(0);
        owned.insert(5);
        let mut cursor = ScanCursor::default();
        let mut order = vec![];
        for _ in 0..3 {
            scan_pending(&bits, &owned, &mut cursor, |p| order.push(p));
        }
        assert_eq!(order, vec![0, 5, 0, 5, 0, 5]);
        // Start in the middle: the pass wraps around to the low bits of the same word.
        let mut cursor = ScanCursor { next_port: 3 };
        let mut order = vec![];
        scan_pending(&bits, &owned, &mut cursor, |p| order.push(p));
        assert_eq!(order, vec![5, 0]);
    }

    #[test]
    fn handler_table_routes_to_registered_handlers() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static HITS: [AtomicUsize; 3] = [
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        ];
        fn count(_port: EvtchnPort, context: usize) {
            HITS[context].fetch_add(1, Ordering::SeqCst);
        }
        let (page, v0, events) = vcpu0();
        let mut table = HandlerTable::new();
        table.register(40, count, 0).unwrap();
        table.register(8, count, 1).unwrap();
        table.register(40, count, 2).unwrap(); // replaces
        assert_eq!(table.register(5000, count, 0), Err(XenError::Inval));
        page.raise(40, &v0);
        page.raise(8, &v0);
        page.raise(9, &v0); // not ours
        assert_eq!(table.dispatch_pending(&events), 2);
        assert_eq!(HITS[0].load(Ordering::SeqCst), 0);
        assert_eq!(HITS[1].load(Ordering::SeqCst), 1);
        assert_eq!(HITS[2].load(Ordering::SeqCst), 1);
        table.unregister(8);
        page.raise(8, &v0);
        assert_eq!(table.dispatch_pending(&events), 0);
        assert!(!table.owned().contains(8));
    }

    /// A fake CPU + Xen for the idle protocol: an event fires at a chosen step; Xen
    /// injects the upcall at once if interrupts are on, otherwise it stays pending in
    /// the LAPIC until `sti`. Halting with nothing deliverable means sleeping forever.
    struct FakeCpu {
        step: Cell<usize>,
        fire_at: usize,
        interrupts_on: Cell<bool>,
        lapic_pending: Cell<bool>,
        upcall_pending: Cell<bool>,
        event_bit: Cell<bool>,
        slept_forever: Cell<bool>,
        handled: RefCell<usize>,
    }

    impl FakeCpu {
        fn new(fire_at: usize) -> Self {
            Self {
                step: Cell::new(0),
                fire_at,
                interrupts_on: Cell::new(true),
                lapic_pending: Cell::new(false),
                upcall_pending: Cell::new(true),
                event_bit: Cell::new(false),
                slept_forever: Cell::new(false),
                handled: RefCell::new(0),
            }
        }
        fn tick(&self) {
            let now = self.step.get();
            self.step.set(now + 1);
            if now == self.fire_at {
                self.event_bit.set(true);
                if !self.upcall_pending.replace(true) {
                    self.lapic_pending.set(true);
                }
                self.deliver();
            }
        }
        fn deliver(&self) {
            if self.interrupts_on.get() && self.lapic_pending.replace(false) {
                // The handler: clear upcall_pending, EOI; the poller scans later.
                self.upcall_pending.set(false);
                *self.handled.borrow_mut() += 1;
            }
        }
    }

    impl CpuIdle for FakeCpu {
        fn disable_interrupts(&self) {
            self.tick();
            self.interrupts_on.set(false);
        }
        fn enable_interrupts(&self) {
            self.interrupts_on.set(true);
            self.deliver();
            self.tick();
        }
        fn enable_interrupts_and_halt(&self) {
            self.interrupts_on.set(true);
            if self.lapic_pending.get() {
                self.deliver(); // halt ends at once
                return;
            }
            self.tick(); // an event while halted wakes us
            if *self.handled.borrow() == 0 || !self.event_bit.get() {
                self.slept_forever.set(true);
            }
        }
    }

    #[test]
    fn idle_wait_never_loses_a_wakeup() {
        // Try the event at every point of the protocol (and never).
        for fire_at in 0..8 {
            let cpu = FakeCpu::new(fire_at);
            let wake = idle_wait(
                &cpu,
                || {
                    cpu.tick();
                    cpu.upcall_pending.set(false);
                },
                || {
                    cpu.tick();
                    cpu.event_bit.get()
                },
            );
            let fired = fire_at < cpu.step.get() || cpu.event_bit.get();
            if fired {
                assert!(
                    !cpu.slept_forever.get(),
                    "lost wake-up with the event at step {fire_at}"
                );
                assert!(cpu.event_bit.get());
            } else {
                assert_eq!(wake, Wake::Halted);
            }
            assert!(cpu.interrupts_on.get());
        }
    }

    #[test]
    fn checking_before_clearing_would_lose_a_wakeup() {
        // The same fake catches the classic bug: check first, clear upcall after.
        let mut lost = false;
        for fire_at in 0..8 {
            let cpu = FakeCpu::new(fire_at);
            cpu.disable_interrupts();
            cpu.tick();
            let work = cpu.event_bit.get();
            cpu.tick();
            cpu.upcall_pending.set(false);
            if !work {
                cpu.enable_interrupts_and_halt();
                lost |= cpu.slept_forever.get() && cpu.event_bit.get();
            }
        }
        assert!(lost, "the fake must be able to detect a lost wake-up");
    }
}
