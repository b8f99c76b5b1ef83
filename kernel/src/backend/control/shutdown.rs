// SPDX-License-Identifier: MIT OR Apache-2.0
//! A clean shutdown (`xl shutdown`, `xl reboot`), run by the control path on vCPU 0
//! between polls like everything else it does:
//!
//! 1. Every vbd closes the way a frontend's close closes it (`BlkifBackend::shut_down`):
//!    its rings' pollers stop taking requests, answer those in flight, unmap and unbind
//!    everything and let go of the rings (the `detach` a vbd's teardown always used),
//!    while the backend says Closing, then Closed. The control path steps this every
//!    millisecond and returns to vCPU 0's poller in between, which serves its own rings
//!    meanwhile; it connects nothing new and ignores every other watch event.
//! 2. Once every vbd is closed, or at the drain's deadline (what the device timeout
//!    needs to answer every command a device holds, and a second for the releases), the
//!    disks go back to the registry, which flushes every device written through and
//!    tells every device to stop (`Registry::shut_down`), each within its own deadline.
//! 3. Xen is told to power off or reboot, as asked.
//!
//! What does not answer in time is given up and logged; the power-off happens anyway.

use super::Control;
use crate::backend::adapters::Store;
use crate::backend::vbd::Connecting;
use crate::xen_domain;
use alloc::collections::BTreeSet;
use alloc::string::String;
use alloc::vec::Vec;
use blkback::negotiate::StepOutcome;
use xen::domain::ShutdownReason;

/// How often the control path steps the vbds while their requests drain.
const STEP_NS: u64 = 1_000_000;
/// Time for the pollers to let go of a ring once its requests are answered (its grants
/// and ring pages unmapped, its event channel closed).
const RELEASE_NS: u64 = 1_000_000_000;
/// The drain's bound when commands have no deadline (`device.timeout-ms=0`): the
/// default device timeout.
const UNTIMED_NS: u64 = 30_000_000_000;

/// A shutdown under way.
pub(super) struct Shutdown {
    reason: ShutdownReason,
    started: u64,
    /// When vbds still draining are given up.
    drain_deadline: u64,
    /// What each flush may take.
    flush_ns: u64,
    /// The vbds closed so far (their backend paths).
    closed: BTreeSet<String>,
    /// The vbds whose close failed on xenstore once (logged once).
    store_errors: BTreeSet<String>,
}

impl Shutdown {
    /// A shutdown for `reason`, begun at `now`, with commands given up after
    /// `device_timeout_ns` (0: never).
    pub(super) fn new(reason: ShutdownReason, now: u64, device_timeout_ns: u64) -> Shutdown {
        let drain = cmdslots::answered_within(device_timeout_ns).unwrap_or(UNTIMED_NS);
        let flush_ns = crate::devices::shutdown::flush_deadline_ns(device_timeout_ns);
        Shutdown {
            reason,
            started: now,
            drain_deadline: now.saturating_add(drain).saturating_add(RELEASE_NS),
            flush_ns,
            closed: BTreeSet::new(),
            store_errors: BTreeSet::new(),
        }
    }
}

impl Control {
    /// The toolstack asked for `reason`: every vbd starts closing (the rest of the
    /// sequence runs in `shutdown_step`).
    pub(super) fn begin_shutdown(&mut self, reason: ShutdownReason) {
        let now = xen_domain::now_ns();
        let shutdown = Shutdown::new(reason, now, self.config.device_timeout_ns);
        log::info!(
            "blkdom: {reason:?} asked by the toolstack: closing {} disk(s) (their requests answered, nothing new taken; waited for at most {} ms), then flushing and stopping the devices",
            self.vbds.len(),
            (shutdown.drain_deadline - now) / 1_000_000
        );
        self.shutdown = Some(shutdown);
    }

    /// One step of the shutdown: every vbd not closed yet is stepped; once all are (or
    /// the drain's deadline has come), the devices are flushed and stopped and the
    /// domain stops, as asked. Otherwise: when to step again.
    pub(super) fn shutdown_step(&mut self) -> Option<u64> {
        let shutdown = self.shutdown.as_mut()?;
        let (vbds, budget, config) = (&mut self.vbds, &mut self.budget, &self.config);
        xen_domain::store::with(|xs| {
            // Watch events change nothing now (a frontend closing, our own writes).
            while let Ok(Some(_)) = xs.take_watch_event() {}
            let mut store = Store(xs);
            for (path, vbd) in vbds.iter_mut() {
                if shutdown.closed.contains(path) {
                    continue;
                }
                let mut hooks = Connecting {
                    vbd: &mut vbd.hooks,
                    budget: &mut *budget,
                    config,
                };
                match vbd.backend.shut_down(&mut store, &mut hooks) {
                    Ok(StepOutcome::Retry) => {}
                    Ok(outcome) => {
                        log::info!("blkback: {}: closed ({outcome:?})", vbd.hooks.name);
                        shutdown.closed.insert(path.clone());
                    }
                    Err(e) => {
                        if shutdown.store_errors.insert(path.clone()) {
                            log::error!("blkback: {}: closing: {e:?}", vbd.hooks.name);
                        }
                    }
                }
            }
        });
        let now = xen_domain::now_ns();
        if shutdown.closed.len() < self.vbds.len() && now < shutdown.drain_deadline {
            return Some(STEP_NS);
        }
        self.finish_shutdown(now)
    }

    /// The vbds are closed (or given up): the devices are flushed and stopped, and the
    /// domain stops.
    fn finish_shutdown(&mut self, now: u64) -> ! {
        let shutdown = self.shutdown.take().expect("a shutdown under way");
        let waited_ms = now.saturating_sub(shutdown.started) / 1_000_000;
        let open: Vec<String> = self
            .vbds
            .iter()
            .filter(|(path, _)| !shutdown.closed.contains(*path))
            .map(|(_, vbd)| vbd.hooks.name.clone())
            .collect();
        for name in &open {
            log::error!(
                "blkback: {name}: given up: its requests did not drain in {waited_ms} ms (its rings stay mapped)"
            );
        }
        log::info!(
            "blkdom: shutdown: {} of {} disk(s) closed in {waited_ms} ms",
            self.vbds.len() - open.len(),
            self.vbds.len()
        );
        // Every queue a drained ring gave back returns to its device's pool.
        for (_, vbd) in core::mem::take(&mut self.vbds) {
            self.registry.release(vbd.hooks.disk);
        }
        let report = self.registry.shut_down(shutdown.flush_ns);
        let total_ms = xen_domain::now_ns().saturating_sub(shutdown.started) / 1_000_000;
        if open.is_empty() && report.given_up.is_empty() {
            log::info!(
                "blkdom: shutdown done in {total_ms} ms: {} disk(s) closed, {} device cache(s) flushed, {} device(s) stopped",
                shutdown.closed.len(),
                report.flushed,
                report.stopped
            );
        } else {
            log::error!(
                "blkdom: shutdown done in {total_ms} ms, with {} disk(s) and {} device step(s) given up: {} device cache(s) flushed, {} device(s) stopped",
                open.len(),
                report.given_up.len(),
                report.flushed,
                report.stopped
            );
        }
        xen_domain::control::obey(shutdown.reason)
    }
}
