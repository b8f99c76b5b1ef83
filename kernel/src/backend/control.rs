// SPDX-License-Identifier: MIT OR Apache-2.0
//! The control path (on vCPU 0, between polls): discovery of the devices the toolstack
//! creates under our `backend/vbd` directory, their watch events, the statistics
//! published to xenstore every few seconds, and the report an operator asks for.

use super::adapters::{self, Store};
use super::disk::Disk;
use super::error::{AttachError, DiskError, ResizeRefusal};
use super::poller;
use super::registry::Registry;
use super::space;
use super::vbd::{backend_params, Connecting, Vbd, VbdHooks};
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use blkback::budget::GrantBudget;
use blkback::keys::{DEVICES, NET, PARAMS, POLLERS, REMOTES, REPORT, STATS, VBD_DIRECTORY};
use blkback::negotiate::{BlkifBackend, StepOutcome};
use bootconfig::Config;
use core::sync::atomic::Ordering;
use xen::abi::event_channel::EvtchnPort;
use xen::xenbus::error::{self as xenbus_error, Errno};
use xen::xenbus::keys::{
    numbered, pci_backend_directory, DOMID, ERROR, HOTPLUG_ERROR, HOTPLUG_STATUS, NUM_DEVS, VDEVFN,
};
use xen::xenbus::retry::{earliest, RetrySchedule, RETRY_NS};
use xen::xenbus::watch::{WatchRouter, WatchWork};
use xen::xenbus::{XenStore, NO_TRANSACTION};
use xen::xenstore::Transaction;

mod shutdown;
mod upgrade;
#[cfg(feature = "test-hooks")]
pub use upgrade::FAIL_SWITCH;

use crate::devices::open::PciBus;
use crate::devices::stopwatch;
use crate::xen_domain;

/// The token of the watch on the device directory (`VBD_DIRECTORY`, under our home).
const VBD_WATCH_TOKEN: &str = "vbd";
/// How often the control path publishes statistics to xenstore.
const STATS_PERIOD_NS: u64 = 5_000_000_000;
/// How often the I/O limits of a disk with several queues are split again by use
/// (`VbdHooks::rebalance_limits`): the pollers publish their counters every 0.5 s.
const LIMIT_SPLIT_NS: u64 = 500_000_000;
/// The token of the watch on `REPORT`.
const REPORT_TOKEN: &str = "report";

/// The control path: discovery, negotiation, statistics.
pub struct Control {
    domid: u32,
    vbds: BTreeMap<String, Vbd>,
    /// Devices whose configuration failed (kept so they are not retried on every event).
    failed: BTreeMap<String, AttachError>,
    /// Devices whose attach waits for their remote namespace's bring-up (`Net::remote`):
    /// tried again every round until it is live or refused.
    connecting: Vec<String>,
    store_port: Option<EvtchnPort>,
    next_stats: u64,
    /// Remotes whose `data/blkdom-remotes/<n>` was written (bit n), so that a forgotten
    /// remote's node goes.
    remote_nodes: u64,
    /// When the I/O limits of disks with several queues are next split by use.
    next_limit_split: u64,
    /// Devices to step again without a watch event, and when: every 5 ms while a
    /// negotiation waits for in-flight requests, once at its end for a detach's grace.
    retries: RetrySchedule,
    first_round: bool,
    /// Every disk and device opened, and what stays of them between vbds.
    registry: Registry,
    /// The domain's budget of persistent grants, made from `grants.*`: only the control
    /// path takes from it (a ring's poller reads its cap from its `GrantShare`).
    budget: GrantBudget,
    /// The command line's settings, for each vbd and ring made.
    config: Config,
    /// `xl shutdown` or `xl reboot` asked for a clean shutdown, under way.
    shutdown: Option<shutdown::Shutdown>,
    /// Booted from a live upgrade: the vbds the old image served, taken over in the
    /// first round before anything else is looked at.
    handed_over: Vec<handover::block::VbdRecord>,
    /// Handed-over vbds whose remote namespace is being brought up again (`Net::remote`
    /// said connecting, or the bring-up failed and is tried again): taken over once it
    /// is live, and kept out of the scan meanwhile (a scan would probe them as new
    /// devices under a connected frontend).
    resuming: Vec<Resuming>,
    /// A live upgrade's drain, under way.
    upgrade: Option<upgrade::Upgrade>,
}

/// The devices blkdom drives, with their names (`Devices::listing`), to
/// `data/blkdom-devices/<n>` (what `blkdom-stat` lists): written once, at boot, when
/// every device was brought up. A failed write is logged; the console has the lines too.
fn publish_devices(lines: &[String]) {
    let written = xen_domain::store::with(|xs| {
        let _ = xs.rm(Transaction::NONE, DEVICES);
        for (n, line) in lines.iter().enumerate() {
            xs.write(
                Transaction::NONE,
                &format!("{DEVICES}/{n}"),
                line.as_bytes(),
            )?;
        }
        if lines.is_empty() {
            xs.write(Transaction::NONE, DEVICES, b"")?;
        }
        Ok::<(), xen::xenstore::XsError>(())
    });
    if let Some(Err(e)) = written {
        log::warn!("blkback: {DEVICES}: not written: {e:?}");
    }
}

impl Control {
    pub fn new(
        bus: PciBus,
        config: &Config,
        net: Result<super::net::Net, String>,
    ) -> Option<Control> {
        let xen = xen_domain::get()?;
        let store_port = xen::domain::store_params(&xen.hv).ok().map(|p| p.evtchn);
        let domid =
            xen_domain::store::with(|xs| xs.read_u64(Transaction::NONE, DOMID))?.ok()? as u32;
        let watched = xen_domain::store::with(|xs| xs.watch(VBD_DIRECTORY, VBD_WATCH_TOKEN))?;
        if let Err(e) = watched {
            log::error!("blkback: cannot watch backend/vbd: {e:?}");
            return None;
        }
        // Under data/, which the toolstack lets a domain write (control/ only has the
        // nodes libxl made); created empty, and an operator's write fires the watch.
        let reportable = xen_domain::store::with(|xs| {
            xs.write(Transaction::NONE, REPORT, b"")?;
            xs.watch(REPORT, REPORT_TOKEN)
        });
        if let Some(Err(e)) = reportable {
            log::warn!("blkback: no statistics on request ({REPORT}): {e:?}");
        }
        let regions = space::available();
        log::info!("blkback: domain {domid} serving vbds; map space for {regions} rings");
        let mut registry =
            Registry::new(bus, crate::devices::recovery(config.device_max_resets), net);
        publish_devices(&registry.device_listing());
        let handed_over = match crate::handoff::booted_from() {
            Some(h) => {
                registry.adopt_ram_disks(&h.ram_disks);
                h.vbds.clone()
            }
            None => Vec::new(),
        };
        Some(Control {
            domid,
            vbds: BTreeMap::new(),
            failed: BTreeMap::new(),
            connecting: Vec::new(),
            store_port,
            next_stats: 0,
            remote_nodes: 0,
            next_limit_split: 0,
            retries: RetrySchedule::new(),
            first_round: true,
            registry,
            budget: GrantBudget::new(config.grants),
            config: *config,
            shutdown: None,
            handed_over,
            resuming: Vec::new(),
            upgrade: None,
        })
    }

    /// Devices under backend/vbd/<frontend>/<devid>.
    fn scan(&mut self, store: &mut Store<'_>) -> Vec<String> {
        let base = format!("/local/domain/{}/{VBD_DIRECTORY}", self.domid);
        let mut found = Vec::new();
        for frontend in store.directory(NO_TRANSACTION, &base).unwrap_or_default() {
            for dev in store
                .directory(NO_TRANSACTION, &format!("{base}/{frontend}"))
                .unwrap_or_default()
            {
                found.push(format!("{base}/{frontend}/{dev}"));
            }
        }
        found
    }

    /// Makes the backing store a device asks for, or says why not; with the `params`
    /// that named it.
    fn open_backing(
        &mut self,
        store: &mut Store<'_>,
        path: &str,
    ) -> Result<(Disk, String), AttachError> {
        let params = store
            .read(NO_TRANSACTION, &format!("{path}/{PARAMS}"))
            .map_err(AttachError::NoParams)?;
        let passed_through = self.passed_through(store);
        stopwatch::lap("xenstore");
        let params = params.trim();
        self.registry
            .open(params, &passed_through)
            .map(|disk| (disk, params.into()))
            .map_err(AttachError::Disk)
    }

    /// The PCI devices the toolstack passed through to this domain, where they sit on our
    /// bus: libxl lists them under dom0's pci backend for us (readable by this domain),
    /// each with the devfn the device model gave it. Empty for a PVH domain or when the
    /// nodes cannot be read (every device is then treated as emulated: bounced, slower,
    /// still correct; `bounced-bytes` in blkdom-stats shows it).
    fn passed_through(&self, store: &mut Store<'_>) -> Vec<pci::PciAddress> {
        let base = pci_backend_directory(self.domid);
        let Ok(count) = store.read(NO_TRANSACTION, &format!("{base}/{NUM_DEVS}")) else {
            return Vec::new();
        };
        let count: u32 = count.trim().parse().unwrap_or(0);
        (0..count.min(256))
            .filter_map(|n| {
                let key = numbered(VDEVFN, n);
                let devfn = store.read(NO_TRANSACTION, &format!("{base}/{key}"));
                let found = devfn
                    .as_deref()
                    .ok()
                    .and_then(pci::PciAddress::from_xen_vdevfn);
                if found.is_none() {
                    log::warn!("blkback: {base}/{key}: {devfn:?}: not a devfn");
                }
                found
            })
            .collect()
    }

    /// What a vbd's negotiation keeps of it besides the backend.
    fn hooks(path: &str, disk: Disk, params: String) -> VbdHooks {
        VbdHooks {
            name: path.rsplit('/').take(2).collect::<Vec<_>>().join("/"),
            disk,
            queues: Vec::new(),
            leaked_pages: 0,
            refusals: Default::default(),
            params,
            resize_epoch: 0,
            pending_resize: None,
            refused_params: None,
            fault_reported: false,
            limit_keys: Default::default(),
            limits_epoch: 0,
            limit_use: Vec::new(),
            connection: None,
        }
    }

    /// Takes over a vbd the previous image served (a live upgrade): the same backing
    /// store, the rings re-attached where they were left, the same published keys
    /// (`BlkifBackend::resume`), nothing written to the backend's state. A vbd that
    /// cannot be taken over as it was is failed (the reason in `error`, Closing): its
    /// guest sees I/O errors, never another disk or other features.
    /// `waited`: the vbd waited for its remote namespace on an earlier round; `retry`:
    /// its bring-up failed before and is tried again.
    fn resume(
        &mut self,
        store: &mut Store<'_>,
        record: handover::block::VbdRecord,
        waited: bool,
        retry: Option<ResumeRetry>,
    ) {
        let path = record.backend_path.clone();
        let now = xen_domain::now_ns();
        if retry.is_some_and(|r| now < r.next_ns) {
            self.resuming.push(Resuming { record, retry });
            return;
        }
        stopwatch::start();
        // A vbd's own RAM disk comes from the handover; anything else is opened again.
        let opened = match self.registry.take_handed_ram_disk(&path) {
            Some(Ok(disk)) => store
                .read(NO_TRANSACTION, &format!("{path}/{PARAMS}"))
                .map(|params| (disk, params.trim().to_string()))
                .map_err(AttachError::NoParams),
            Some(Err(reason)) => Err(AttachError::HandedOver(format!(
                "its RAM disk was not taken over: {reason}"
            ))),
            None => self.open_backing(store, &path),
        };
        // The remote's bring-up runs on vCPU 0's passes (bounded as an attach's): the
        // rings wait in the frontend's memory meanwhile, as they did through the switch.
        if let Err(AttachError::Disk(DiskError::RemoteConnecting { .. })) = &opened {
            if !waited {
                log::info!("blkback: {path}: waits for its remote namespace to take over");
            }
            self.resuming.push(Resuming { record, retry });
            return;
        }
        // A namespace that does not come up (the target away or refusing during the
        // switch) is held as a loss is, not failed at the first attempt: the guest
        // sees a pause, not the end of its disk. A bad spec is not retried.
        if let Err(AttachError::Disk(DiskError::Remote { reason, errno, .. })) = &opened {
            let times = backing::parse_nvme_tcp(&record.params)
                .ok()
                .map(|target| super::net::reconnect_policy(&target.reconnect));
            if let (Some(times), false) = (times, *errno == xen::xenbus::error::errno::EINVAL) {
                let ms = 1_000_000u64;
                let retry = retry.unwrap_or(ResumeRetry {
                    next_ns: now,
                    delay_ns: times.delay_ms * ms,
                    give_up_ns: now.saturating_add(times.give_up_ms * ms),
                });
                if now < retry.give_up_ns {
                    log::warn!(
                        "blkback: {path}: its remote namespace did not come up ({reason}); \
                         trying again every {} s for up to {} s more, its ring waiting",
                        retry.delay_ns / 1_000_000_000,
                        (retry.give_up_ns - now) / 1_000_000_000
                    );
                    let retry = Some(ResumeRetry {
                        next_ns: now.saturating_add(retry.delay_ns),
                        ..retry
                    });
                    self.resuming.push(Resuming { record, retry });
                    return;
                }
            }
        }
        let opened = opened.and_then(|(disk, params)| {
            if params == record.params {
                Ok((disk, params))
            } else {
                self.registry.release_removed(disk);
                Err(AttachError::HandedOver(format!(
                    "params {params:?}, the previous image served {:?}",
                    record.params
                )))
            }
        });
        let (disk, params) = match opened {
            Ok(opened) => opened,
            Err(reason) => {
                log_attach_cost(&path);
                // The frontend is Connected: only Closing tells it the disk is gone.
                let state = format!("{path}/{}", xen::xenbus::keys::STATE);
                let closing = (xen::xenbus::XenbusState::Closing as u32).to_string();
                let _ = store.write(NO_TRANSACTION, &state, &closing);
                return self.fail(store, path, reason);
            }
        };
        let offer = backend_params(&disk, self.config.persistent_grants);
        let (connection, published) = handover::vbd::connection(&record);
        let mut hooks = Self::hooks(&path, disk, params);
        let mut connecting = Connecting {
            vbd: &mut hooks,
            budget: &mut self.budget,
            config: &self.config,
        };
        match BlkifBackend::resume(
            store,
            &path,
            offer,
            &connection,
            &published,
            &mut connecting,
        ) {
            Ok((backend, outcome)) => {
                for watched in backend.watched_paths() {
                    if let Err(e) = store.0.watch(&watched, &path) {
                        log::error!("blkback: {path}: watch {watched}: {e:?}");
                    }
                }
                log_attach_cost(&path);
                log::info!("blkback: {path}: taken over from the previous image: {outcome:?}");
                self.vbds.insert(path, Vbd { backend, hooks });
            }
            Err(e) => {
                self.registry.release_removed(hooks.disk);
                log_attach_cost(&path);
                self.fail(store, path, AttachError::Probe(e));
            }
        }
    }

    fn add(&mut self, store: &mut Store<'_>, path: String) {
        stopwatch::start();
        let opened = self.open_backing(store, &path);
        let waiting = self.connecting.contains(&path);
        let (disk, params) = match opened {
            Ok(opened) => opened,
            // The remote's bring-up runs on vCPU 0's passes; the next round asks again.
            Err(AttachError::Disk(DiskError::RemoteConnecting { .. })) => {
                if !waiting {
                    log::info!("blkback: {path}: waits for its remote namespace");
                    self.connecting.push(path);
                }
                return;
            }
            Err(reason) => {
                self.connecting.retain(|p| *p != path);
                log_attach_cost(&path);
                return self.fail(store, path, reason);
            }
        };
        self.connecting.retain(|p| *p != path);
        let offer = backend_params(&disk, self.config.persistent_grants);
        match BlkifBackend::probe(store, &path, offer) {
            Ok(backend) => {
                for watched in backend.watched_paths() {
                    if let Err(e) = store.0.watch(&watched, &path) {
                        log::error!("blkback: {path}: watch {watched}: {e:?}");
                    }
                }
                stopwatch::lap("probe");
                log::info!(
                    "blkback: {path}: {}, frontend {}, InitWait",
                    disk.describe(),
                    backend.frontend_path()
                );
                log_attach_cost(&path);
                let hooks = Self::hooks(&path, disk, params);
                self.vbds.insert(path, Vbd { backend, hooks });
            }
            Err(e) => {
                self.registry.release_removed(disk);
                log_attach_cost(&path);
                self.fail(store, path, AttachError::Probe(e));
            }
        }
    }

    /// The device at `path` is not served: the reason goes to its `hotplug-error` and
    /// `error` nodes, with its errno to where Linux's `xenbus_dev_fatal` writes it
    /// (`xen::xenbus::error`), and to the console; the device is kept as failed.
    fn fail(&mut self, store: &mut Store<'_>, path: String, reason: AttachError) {
        log::error!("blkback: {path}: {reason}");
        let text = reason.to_string();
        let _ = store.write(NO_TRANSACTION, &format!("{path}/{HOTPLUG_ERROR}"), &text);
        let _ = store.write(NO_TRANSACTION, &format!("{path}/{ERROR}"), &text);
        if let Some(node) = xenbus_error::error_node(&path) {
            let linux = xenbus_error::error_text(reason.errno(), &text);
            let _ = store.write(NO_TRANSACTION, &node, &linux);
        }
        let _ = store.write(NO_TRANSACTION, &format!("{path}/{HOTPLUG_STATUS}"), "error");
        self.failed.insert(path, reason);
    }

    /// One round: new and vanished devices, then every negotiation steps.
    fn reconcile(&mut self, store: &mut Store<'_>) {
        let present = self.scan(store);
        for path in &present {
            let resuming = self.resuming.iter().any(|r| r.record.backend_path == *path);
            if !self.vbds.contains_key(path) && !self.failed.contains_key(path) && !resuming {
                self.add(store, path.clone());
            }
        }
        // A failed device the toolstack removed: its error node under our home goes too
        // (a served device's goes when its negotiation sees it removed).
        self.failed.retain(|path, _| {
            let keep = present.contains(path);
            if !keep {
                if let Some(directory) = xenbus_error::error_directory(path) {
                    let _ = store.rm(NO_TRANSACTION, &directory);
                }
            }
            keep
        });
        let paths: Vec<String> = self.vbds.keys().cloned().collect();
        for path in &paths {
            self.step(store, path);
        }
    }

    /// Steps the negotiation of the device at `path` (if it is still there): notes
    /// when it is to be stepped again (soon while it waits for requests, at the end of a
    /// detach's grace), and forgets it once it is removed.
    fn step(&mut self, store: &mut Store<'_>, path: &str) {
        let Some(vbd) = self.vbds.get_mut(path) else {
            self.retries.set(path, None);
            return;
        };
        let now = xen_domain::now_ns();
        let mut due = None;
        let mut hooks = Connecting {
            vbd: &mut vbd.hooks,
            budget: &mut self.budget,
            config: &self.config,
        };
        match vbd.backend.step(store, &mut hooks) {
            Ok(outcome @ (StepOutcome::Retry | StepOutcome::RetryAt(_))) => {
                due = outcome.retry_due(now)
            }
            Ok(StepOutcome::Removed) => {
                self.retries.set(path, None);
                if let Some(vbd) = self.vbds.remove(path) {
                    for watched in vbd.backend.watched_paths() {
                        let _ = store.0.unwatch(&watched, path);
                    }
                    log::info!("blkback: {path} removed; its backing store is released");
                    self.registry.release_removed(vbd.hooks.disk);
                }
                return;
            }
            Ok(StepOutcome::Idle) => {}
            Ok(outcome) => log::info!("blkback: {}: {outcome:?}", vbd.hooks.name),
            Err(e) => log::error!("blkback: {}: {e:?}", vbd.hooks.name),
        }
        // A refused connection whose rings the pollers still hold: stepped again until
        // they let go, so its device queues and grant shares come back at once.
        if vbd.hooks.limit_keys.step(store, path).is_some() {
            vbd.hooks.apply_limits();
        }
        let soon = vbd.backend.releasing() | self.resize_step(store, path);
        let due = earliest(due, soon.then(|| now.saturating_add(RETRY_NS)));
        self.retries.stepped(path, due, now);
    }

    /// Online resize of the device at `path`: publishes a resize every ring has taken in,
    /// and starts one when an operator rewrote `params` with another size (or refuses it,
    /// saying why). True while a resize waits for the pollers.
    fn resize_step(&mut self, store: &mut Store<'_>, path: &str) -> bool {
        let Some(vbd) = self.vbds.get_mut(path) else {
            return false;
        };
        if let Some(sectors) = vbd.hooks.pending_resize {
            if !vbd.hooks.resize_acknowledged() {
                return true;
            }
            vbd.hooks.pending_resize = None;
            if let Err(e) = vbd.backend.resized(store, sectors) {
                log::error!("blkback: {}: publishing the new size: {e}", vbd.hooks.name);
            }
        }
        let Ok(asked) = store.read(NO_TRANSACTION, &format!("{path}/{PARAMS}")) else {
            return false;
        };
        let asked = asked.trim();
        if asked == vbd.hooks.params {
            // Written back after a refusal (or never changed): the next change counts.
            vbd.hooks.refused_params = None;
            return false;
        }
        if vbd.hooks.refused_params.as_deref() == Some(asked) {
            return false;
        }
        match resize(&mut self.registry, &mut vbd.hooks, asked) {
            // The same disk in other words (ram:1024K for ram:1M).
            Ok(None) => vbd.hooks.params = asked.into(),
            Ok(Some(sectors)) => {
                log::info!(
                    "blkback: {}: {} is now {asked}: {sectors} sectors",
                    vbd.hooks.name,
                    vbd.hooks.params
                );
                vbd.hooks.params = asked.into();
                vbd.hooks.start_resize(sectors);
                if vbd.hooks.resize_acknowledged() {
                    return self.resize_step(store, path);
                }
                return true;
            }
            Err(refusal) => {
                vbd.hooks.refused_params = Some(asked.into());
                let served = vbd.hooks.params.clone();
                let text = refusal.to_string();
                if let Err(e) = vbd
                    .backend
                    .refuse_resize(store, &served, refusal.errno(), &text)
                {
                    log::error!("blkback: {}: {e}", vbd.hooks.name);
                }
            }
        }
        false
    }

    /// Remote namespaces their targets grew (`Registry::take_remote_growth`): each disk
    /// served from the whole of one grows with it, published as an operator's resize is
    /// (`resize_step`: every ring checks requests against the new size first). A slice
    /// keeps its size; its operator may grow it into the new room.
    fn grow_remote_disks(&mut self, store: &mut Store<'_>) {
        for (device, sectors) in self.registry.take_remote_growth() {
            let grown: Vec<String> = self
                .vbds
                .iter_mut()
                .filter_map(|(path, vbd)| {
                    self.registry
                        .grow_whole(&mut vbd.hooks.disk, device, sectors)
                        .then(|| {
                            log::info!(
                                "blkback: {}: its remote namespace grew: {sectors} sectors",
                                vbd.hooks.name
                            );
                            vbd.hooks.start_resize(sectors);
                            path.clone()
                        })
                })
                .collect();
            for path in grown {
                self.step(store, &path);
            }
        }
    }

    /// A disk whose device failed (a ring's poller saw it): the reason goes to the
    /// backend's `blkdom-fault` node, Linux's error node and the console, once. The
    /// disk stays connected, answering every request with an error, until its frontend
    /// closes; the device serves no new disk.
    fn report_faults(&mut self, store: &mut Store<'_>) {
        for vbd in self.vbds.values_mut() {
            if vbd.hooks.fault_reported {
                continue;
            }
            let Some(fault) = vbd.hooks.device_fault() else {
                continue;
            };
            vbd.hooks.fault_reported = true;
            let reason = format!("{}: {fault}", vbd.hooks.disk.describe());
            if let Err(e) = vbd.backend.device_failed(store, &reason) {
                log::error!(
                    "blkback: {}: reporting the device fault: {e}",
                    vbd.hooks.name
                );
            }
            if vbd.hooks.disk.in_device_model()
                && matches!(fault.kind, blkdev::FaultKind::Timeout { .. })
            {
                // Xen has the device model invalidate its map cache after every grant
                // unmap of an HVM domain, and QEMU first waits for all its block
                // requests (docs/design.md, "Known limits"). This disk's rings map no
                // data grant (they copy); other disks' unmaps and any ring's teardown
                // still wait.
                log::error!(
                    "blkback: {}: the device model still holds the command: until it gives it back, every grant unmap of this domain (a ring's teardown, another disk's grants) waits for it",
                    vbd.hooks.name
                );
            }
        }
    }

    /// Gives back the memory of RAM disk stripes discards emptied, and gives a disk that
    /// asked memory for writes (every RAM disk: the vbds' and the named ones kept).
    fn maintain_ram_disks(&mut self) {
        let disks = self
            .vbds
            .values()
            .filter_map(|vbd| match &vbd.hooks.disk {
                Disk::Ram(disk) => Some(disk),
                Disk::Device(_) => None,
            })
            .chain(self.registry.named_ram_disks());
        for disk in disks {
            let done = disk.maintain();
            // Freeing goes a bounded piece per call (the disk asks for the next one):
            // one line when it ends, not one a call.
            if done.allocated > 0 || (done.freed > 0 && !done.more) {
                log::info!(
                    "blkback: RAM disk of {} MiB: {} KiB freed since it was made, {} KiB taken for writes, {} KiB held",
                    disk.sectors() >> 11,
                    disk.freed_bytes() >> 10,
                    done.allocated >> 10,
                    disk.resident_bytes() >> 10
                );
            }
        }
    }

    /// One line per device (its backend path, every counter summed over its queues, then
    /// what it refused over all its connections), then one line for the pollers.
    fn stats_lines(&self) -> Vec<(Option<&str>, String)> {
        // Read before this function allocates anything, so the figure leaves out its own
        // strings: with no disk served it is what blkdom keeps for itself (the soak,
        // tests/xen/soak, compares it before and after its guests).
        let (heap_free, heap_used) = crate::mm::heap_usage();
        let mut lines = Vec::with_capacity(self.vbds.len() + 1);
        for (path, vbd) in &self.vbds {
            let mut total = blkback::stats::RingStats::default();
            for (_, control, _) in &vbd.hooks.queues {
                total += &*control.stats.lock();
            }
            let mut refusals = vbd.hooks.refusals;
            refusals.add_ring(&total);
            refusals.connections = vbd.backend.refused_connections();
            let mut line = format!("queues={}", vbd.hooks.queues.len());
            for (name, value) in total.fields() {
                line.push_str(&format!(" {name}={value}"));
            }
            line.push_str(&format!(" leaked-pages={}", vbd.hooks.leaked_pages));
            line.push_str(&format!(
                " bounced-bytes={}",
                vbd.hooks.disk.bounced_bytes()
            ));
            if let Some((resident, freed)) = vbd.hooks.disk.ram_memory() {
                line.push_str(&format!(" resident-bytes={resident} freed-bytes={freed}"));
            }
            for (name, value) in refusals.fields() {
                line.push_str(&format!(" {name}={value}"));
            }
            lines.push((Some(path.as_str()), line));
        }
        let pollers: Vec<String> = (0..crate::smp::online_count())
            .map(|cpu| {
                let c = &poller::POLLERS[cpu].counters;
                format!(
                    "vcpu{cpu}: rings={} loops={} busy={} sleeps={} stray-wakes={} \
                     notifications={} notify-ns={} sends-with-sleep={}",
                    c.rings.load(Ordering::Relaxed),
                    c.loops.load(Ordering::Relaxed),
                    c.busy_loops.load(Ordering::Relaxed),
                    c.sleeps.load(Ordering::Relaxed),
                    c.stray_wakes.load(Ordering::Relaxed),
                    c.notifications.load(Ordering::Relaxed),
                    c.notify_ns.load(Ordering::Relaxed),
                    c.sends_with_sleep.load(Ordering::Relaxed)
                )
            })
            .collect();
        let (limits, grant_rings, grant_share) = (
            self.budget.limits(),
            self.budget.rings(),
            self.budget.share(),
        );
        // mapped-pages stays last (the rig's checks anchor on it).
        lines.push((
            None,
            format!(
                "{}; grant-budget={} grant-max-per-ring={} grant-idle-s={} grant-rings={} \
                 grant-share={}; bounced-bytes={}; heap-free={heap_free} heap-used={heap_used}; \
                 mapped-pages={}",
                pollers.join("; "),
                limits.max_total,
                limits.max_per_ring,
                limits.idle_secs,
                grant_rings,
                grant_share,
                self.registry.bounced_bytes_total(),
                adapters::mapped_pages()
            ),
        ));
        lines
    }

    fn publish_stats(&mut self, store: &mut Store<'_>) {
        for (path, line) in self.stats_lines() {
            let node = match path {
                Some(path) => format!("{path}/{STATS}"),
                None => String::from(POLLERS),
            };
            let _ = store.write(NO_TRANSACTION, &node, &line);
        }
        if let Some((vif, remotes)) = self.registry.net_stats() {
            let _ = store.write(NO_TRANSACTION, NET, &vif);
            let mut written = 0u64;
            for (at, line) in remotes {
                let _ = store.write(NO_TRANSACTION, &format!("{REMOTES}/{at}"), &line);
                written |= 1 << (at % 64);
            }
            let gone = self.remote_nodes & !written;
            for at in (0..64).filter(|at| gone & (1 << at) != 0) {
                let _ = store.0.rm(Transaction::NONE, &format!("{REMOTES}/{at}"));
            }
            self.remote_nodes = written;
        }
    }

    /// An operator wrote `data/blkdom-report`: the statistics go to the console (what
    /// `xl console` and the console log show); the node is emptied as the acknowledgement.
    fn report_if_asked(&mut self, store: &mut Store<'_>) {
        let asked = store
            .0
            .read_string(Transaction::NONE, REPORT)
            .is_ok_and(|value| !value.trim().is_empty());
        if !asked {
            return;
        }
        log::info!(
            "blkdom: report: {} devices, {} failed, heap free {} KiB",
            self.vbds.len(),
            self.failed.len(),
            crate::mm::heap_free() >> 10
        );
        for (path, line) in self.stats_lines() {
            log::info!("blkdom: report: {}: {line}", path.unwrap_or("pollers"));
        }
        if let Some((vif, remotes)) = self.registry.net_stats() {
            log::info!("blkdom: report: vif: {vif}");
            for (at, line) in remotes {
                log::info!("blkdom: report: remote {at}: {line}");
            }
        }
        for (path, reason) in &self.failed {
            log::info!("blkdom: report: {path}: failed: {reason}");
        }
        let _ = store.0.write(Transaction::NONE, REPORT, b"");
    }
}

impl poller::ControlWork for Control {
    fn port(&self) -> Option<EvtchnPort> {
        self.store_port
    }

    fn net_ports(&self) -> &[EvtchnPort] {
        self.registry.net_ports()
    }

    fn poll_net(&mut self) -> Option<super::net::NetPoll> {
        self.registry.net().map(|net| net.poll())
    }

    fn net_waiting(&self) -> bool {
        self.registry.net_waiting()
    }

    fn net_timer_due(&mut self) -> Option<u64> {
        self.registry.net().and_then(|net| net.timer_due_ns())
    }

    fn maintain_memory(&mut self) {
        super::disk::RAM_MEMORY_WANTED.store(false, Ordering::Release);
        poller::RAM_KICK_SENT.store(false, Ordering::Release);
        self.maintain_ram_disks();
    }

    fn run(&mut self) -> Option<u64> {
        // A device a queue asked to recover first: its queues' requests wait meanwhile
        // (during a shutdown too: the drain waits for them).
        crate::devices::RECOVERY_WANTED.store(false, Ordering::Release);
        let now = xen_domain::now_ns();
        let recovery_due = self.registry.recover(now);
        let wait = if self.shutdown.is_some() {
            self.shutdown_step()
        } else if self.upgrade.is_some() {
            self.upgrade_step()
        } else {
            self.run_store()
        };
        match (wait, recovery_due) {
            (Some(wait), Some(due)) => Some(wait.min(due.saturating_sub(xen_domain::now_ns()))),
            (wait, _) => wait,
        }
    }
}

impl Control {
    /// The control path's round on xenstore: watch events, negotiations, faults,
    /// statistics, the report. How soon it wants the next.
    fn run_store(&mut self) -> Option<u64> {
        let home = format!("/local/domain/{}", self.domid);
        let router = WatchRouter {
            home: &home,
            directory: VBD_DIRECTORY,
            directory_token: VBD_WATCH_TOKEN,
            ignored_node: STATS,
        };
        let result = xen_domain::store::with(|xs| {
            // Drain what arrived (the client queued events while waiting for replies too)
            // and note which devices it names: an event about one device steps that
            // device alone (a frontend rewriting its state in a loop costs one step of
            // its own device per event); only the device directory changing above the
            // devices we hold rescans it.
            let mut work = WatchWork {
                rescan: self.first_round,
                ..WatchWork::default()
            };
            let mut control_request = false;
            let mut report_request = false;
            let mut upgrade_request = false;
            while let Ok(Some(event)) = xs.take_watch_event() {
                if event.token == xen_domain::control::SHUTDOWN_TOKEN {
                    control_request = true;
                } else if event.token == xen_domain::control::UPGRADE_TOKEN {
                    upgrade_request = true;
                } else if event.token == REPORT_TOKEN {
                    report_request = true;
                } else {
                    router.route(&mut work, &event.token, &event.path, |path| {
                        self.vbds.contains_key(path)
                    });
                }
            }
            if xs.take_lost_watch_events() {
                // A flood (a guest rewriting its frontend nodes in a loop) overran the
                // client's queue: look at everything the dropped events could have named.
                log::warn!("xenstore: watch events dropped (a flood); rescanning every device");
                work.rescan = true;
                report_request = true;
                control_request |= xs
                    .read_string(Transaction::NONE, xen::xenbus::keys::CONTROL_SHUTDOWN)
                    .is_ok_and(|value| !value.trim().is_empty());
            }
            if control_request {
                // Rescan next round if the request was not one to act on.
                self.first_round |= work.rescan;
                return None;
            }
            self.first_round = false;
            let mut store = Store(xs);
            if !self.handed_over.is_empty()
                || !self.resuming.is_empty()
                || crate::handoff::answer_due()
            {
                for record in core::mem::take(&mut self.handed_over) {
                    self.resume(&mut store, record, false, None);
                }
                for waiting in core::mem::take(&mut self.resuming) {
                    self.resume(&mut store, waiting.record, true, waiting.retry);
                }
                // Done once every handed-over vbd was taken over, failed, or waits for
                // its target as through an outage (the upgrade itself is over).
                if self.resuming.iter().all(|r| r.retry.is_some()) {
                    crate::handoff::answer_done(store.0);
                }
            }
            if work.rescan {
                self.reconcile(&mut store);
            } else {
                // Negotiations whose retry is due are stepped again too (each device
                // once, whether named by an event, due, or both).
                let now = xen_domain::now_ns();
                let round: Vec<String> = self
                    .retries
                    .round(work.devices.iter().map(String::as_str), now)
                    .into_iter()
                    .map(String::from)
                    .collect();
                for path in &round {
                    self.step(&mut store, path);
                }
            }
            // Attaches waiting for a remote namespace (a vbd removed meanwhile is
            // forgotten: its params are gone).
            for path in self.connecting.clone() {
                let present = store
                    .read(NO_TRANSACTION, &format!("{path}/{PARAMS}"))
                    .is_ok();
                if present && !self.vbds.contains_key(&path) && !self.failed.contains_key(&path) {
                    self.add(&mut store, path);
                } else {
                    self.connecting.retain(|p| *p != path);
                }
            }
            self.report_faults(&mut store);
            self.grow_remote_disks(&mut store);
            let now = xen_domain::now_ns();
            let splitting = self.vbds.values().any(|vbd| vbd.hooks.splits_limits());
            if splitting && now >= self.next_limit_split {
                for vbd in self.vbds.values_mut() {
                    vbd.hooks.rebalance_limits();
                }
                self.next_limit_split = now + LIMIT_SPLIT_NS;
            }
            if now >= self.next_stats {
                self.maintain_ram_disks();
                self.publish_stats(&mut store);
                self.next_stats = now + STATS_PERIOD_NS;
            }
            if report_request {
                self.report_if_asked(&mut store);
            }
            if upgrade_request && self.upgrade.is_none() {
                if let Some(staged) = super::upgrade::on_request(store.0) {
                    let remote_busy = match self.resuming.first() {
                        Some(waiting) => Some(format!(
                            "of {} is still being connected for the last upgrade",
                            waiting.record.backend_path
                        )),
                        None => self
                            .registry
                            .net()
                            .and_then(|net| net.not_ready_for_upgrade()),
                    };
                    if let Some(why) = remote_busy {
                        // The next image would get one bounded bring-up for it, not this
                        // image's reconnect times: nothing is given up.
                        let why = format!("remote namespace {why}; ask again once it is connected");
                        // Inside the round's hold of the xenstore client: answered on it.
                        super::upgrade::answer(
                            store.0,
                            &handover::receive::Answer::Refused(
                                handover::receive::Refusal::Switch(why),
                            ),
                        );
                    } else {
                        self.begin_upgrade(staged);
                    }
                }
            }
            // Events that came with the replies of this round's requests lost their kick
            // to the wait for those replies: they are taken at once, not at the next due
            // time (up to the statistics' 5 s away).
            let queued = store.0.has_watch_events();
            let longest = if splitting {
                LIMIT_SPLIT_NS
            } else {
                STATS_PERIOD_NS
            };
            Some(
                self.retries
                    .next_wait(xen_domain::now_ns(), queued, longest),
            )
        })
        .flatten();
        let Some(wait) = result else {
            // A control request arrived (or xenstore is gone): look at it outside the lock.
            if let Some(reason) = xen_domain::control::take_request() {
                self.begin_shutdown(reason);
                return self.shutdown_step();
            }
            return Some(RETRY_NS);
        };
        // An upgrade began this round: its steps are 1 ms apart, not the round's wait.
        if self.upgrade.is_some() {
            return Some(wait.min(1_000_000));
        }
        // An attach or a take-over waiting for a remote asks again soon; one whose
        // bring-up failed, at its next attempt.
        if !self.connecting.is_empty() || self.resuming.iter().any(|r| r.retry.is_none()) {
            return Some(wait.min(RETRY_NS));
        }
        if let Some(next) = self
            .resuming
            .iter()
            .filter_map(|r| r.retry)
            .map(|r| r.next_ns)
            .min()
        {
            let until = next.saturating_sub(xen_domain::now_ns()).max(RETRY_NS);
            return Some(wait.min(until));
        }
        // Woken sooner by any watch event's kick; the statistics are due within 5 s anyway.
        Some(wait)
    }
}

/// A handed-over vbd waiting for its remote namespace (`Control::resuming`).
struct Resuming {
    record: handover::block::VbdRecord,
    /// Set once a bring-up failed: the namespace is tried again as a lost connection is,
    /// every `reconnect-delay`, until `ctrl-loss-tmo` after the first failure; the ring
    /// waits meanwhile (blkfront has no request timeout) and the guest sees a pause, as
    /// through any outage of the target.
    retry: Option<ResumeRetry>,
}

#[derive(Clone, Copy)]
struct ResumeRetry {
    next_ns: u64,
    delay_ns: u64,
    give_up_ns: u64,
}

/// Logs where the time of the attach of the device at `path` went (the stopwatch `add`
/// started).
fn log_attach_cost(path: &str) {
    if let Some(cost) = stopwatch::finish() {
        log::info!("blkback: {path}: attach took {cost}");
    }
}

/// What an operator's new `params` does to the served disk: nothing (the same disk),
/// a resize (the new size in sectors, done on the disk; its rings are yet to learn it),
/// or a refusal.
fn resize(
    registry: &mut Registry,
    hooks: &mut VbdHooks,
    asked: &str,
) -> Result<Option<u64>, ResizeRefusal> {
    let spec = |params: &str| {
        let text = params.strip_prefix("phy:").unwrap_or(params);
        backing::parse_backing(text).map_err(|e| ResizeRefusal::Params {
            params: params.into(),
            reason: e.to_string(),
        })
    };
    let served = spec(&hooks.params)?;
    let Some(bytes) = backing::new_size(&served, &spec(asked)?).map_err(ResizeRefusal::Spec)?
    else {
        return Ok(None);
    };
    registry.resize(&hooks.params, &mut hooks.disk, bytes)?;
    Ok(Some(bytes / blkdev::SECTOR_SIZE))
}
