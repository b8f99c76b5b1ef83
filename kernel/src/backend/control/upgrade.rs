// SPDX-License-Identifier: MIT OR Apache-2.0
//! A live upgrade's old-image side after the image was checked (docs/design.md §4.12,
//! 3-4), run by the control path on vCPU 0 between polls, as the shutdown's drain is:
//!
//! 1. **Settle.** A vbd negotiating or being torn down is waited for (5 s at most);
//!    still busy then, the upgrade is refused (`vbd <path> busy`).
//! 2. **Drain.** Each connected vbd's rings are let go the way a teardown lets them go
//!    (`detach`: nothing new taken, every request answered and published, every grant
//!    unmapped, the port closed), but the backend is not told: nothing is written to
//!    xenstore and the frontend sees Connected throughout (`VbdHooks::drain_for_upgrade`).
//!    Each ring's `LeftAt` (port, `rsp_prod` = `req_cons`) is kept. At most 5 s or the
//!    device timeout, the longer: requests in flight on a device are answered first.
//! 3. **Prepare.** Every device a disk was opened on is flushed (it goes on serving);
//!    the handover block is built from the live state (`vcpu_info`, ranges, RAM disks'
//!    stripe tables, the vbds with their published keys) and read back with the checks
//!    the next image makes ([`prepare`]). Then [`switch`]: the jump.
//! 4. **Abort.** Whatever failed before the jump (the jump itself included, while it is
//!    not built), every drained ring is re-attached in this image by the path the next
//!    image takes (`BlkifBackend::resume`: the ring at `rsp_prod`, the frontend's port
//!    bound again), and the upgrade is refused with the reason.
//!
//! Watch events that come meanwhile wait in the client's queue: the control path takes
//! them once the upgrade is over.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use blkback::negotiate::{BlkifBackend, FrontendConnection, StepOutcome, XenbusState};
use handover::block::{Handover, Limits, MemRange, RamDiskRecord, Stripe};
use handover::receive::{Answer, Refusal};
use handover::vbd::LeftAt;

use super::Control;
use crate::backend::adapters::Store;
use crate::backend::disk::Disk;
use crate::backend::upgrade::{tell, Staged};
use crate::backend::vbd::{backend_params, Connecting, Vbd};
use crate::xen_domain;

/// How often the control path steps the upgrade.
const STEP_NS: u64 = 1_000_000;
/// How long a vbd negotiating or being torn down is waited for, and the least the rings
/// may take to drain (a device's requests in flight may take up to its timeout).
const WAIT_NS: u64 = 5_000_000_000;
/// The park area the parked vCPUs wait in (the next image's trampoline and tables).
pub const PARK_PAGE: u64 = handover::park::PARK_BASE;

/// What a vbd's drain kept: enough to hand it over, or to re-attach it here.
pub struct Drained {
    pub connection: FrontendConnection,
    /// Every key the backend published at connect, with its value.
    pub published: Vec<(String, String)>,
    /// Where each queue's ring was left (queue order).
    pub left: Vec<LeftAt>,
}

/// Everything the jump needs, made and checked while every ring is drained.
pub struct Prepared {
    /// The handover block as the next image will read it (checked: it decodes, with
    /// the next image's checks, to exactly `handover`).
    pub block: Vec<u8>,
    pub handover: Handover,
    /// The checked image, in blkdom's own memory.
    pub staged: Staged,
}

impl Prepared {
    /// The memory the next image must keep out of its allocators.
    pub fn kept(&self) -> &[MemRange] {
        &self.handover.ranges
    }
}

/// `upgradetest.fail-switch` (test image): the next switch fails on purpose once the vif
/// was closed, before anything stops, so the rig sees the network come back.
#[cfg(feature = "test-hooks")]
pub static FAIL_SWITCH: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The jump to the prepared image: the storage network closed, the devices stopped (no
/// DMA may reach memory the next image reuses), then `handoff::jump`, the point of no
/// return. Returns only when it did not jump; the vif is then connected again and the
/// caller re-attaches every drained ring.
fn switch(registry: &mut crate::backend::registry::Registry, prepared: Prepared) -> Refusal {
    log::info!(
        "upgrade: switching to {} bytes of build {}, keeping {} range(s)",
        prepared.staged.bytes.len(),
        prepared.staged.image.build_id,
        prepared.kept().len()
    );
    let Some(net) = registry.net() else {
        return stop_and_jump(registry, prepared);
    };
    let started = xen_domain::now_ns();
    let refusal = match net.close_for_upgrade() {
        Ok(reset) => {
            log::info!(
                "upgrade: vif closed for the switch in {} ms ({reset} NVMe/TCP connection(s) reset)",
                xen_domain::now_ns().saturating_sub(started) / 1_000_000
            );
            stop_and_jump(registry, prepared)
        }
        Err(e) => {
            log::error!("upgrade: the vif did not close: {e}");
            Refusal::Switch(format!("vif close: {e}"))
        }
    };
    if let Some(net) = registry.net() {
        match net.reopen_after_upgrade() {
            Ok(()) => log::info!(
                "upgrade: the switch failed; the vif is connected again and the NVMe/TCP \
                 disks reconnect"
            ),
            Err(e) => log::error!(
                "upgrade: the switch failed and the vif did not connect again: {e}; its \
                 NVMe/TCP disks hold their requests until their ctrl-loss-tmo"
            ),
        }
    }
    refusal
}

/// The devices stopped, then the jump; returns only when it did not jump.
fn stop_and_jump(registry: &mut crate::backend::registry::Registry, prepared: Prepared) -> Refusal {
    #[cfg(feature = "test-hooks")]
    if FAIL_SWITCH.swap(false, core::sync::atomic::Ordering::Relaxed) {
        return Refusal::Switch("upgradetest.fail-switch: failed on purpose (test image)".into());
    }
    let report = registry.quiesce();
    if let Some(line) = report.given_up.first() {
        return Refusal::Switch(format!("device stop: {line}"));
    }
    let jump = crate::handoff::jump(crate::handoff::Prepared {
        staged: prepared.staged.bytes,
        image: prepared.staged.image,
        handover: prepared.handover,
    });
    match jump {
        Err(e) => Refusal::Switch(format!("{e}")),
        Ok(never) => match never {},
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Settle,
    Drain,
    Abort,
}

/// An upgrade under way.
pub(in crate::backend) struct Upgrade {
    staged: Option<Staged>,
    started: u64,
    phase: Phase,
    /// When the current phase gives up.
    deadline: u64,
    /// When the first ring was told to let go (0: none yet): the guests' pause runs
    /// from here to the last re-attach.
    drain_started: u64,
    /// Connected vbds whose drain began (their connection and keys as they were).
    draining: BTreeMap<String, (FrontendConnection, Vec<(String, String)>)>,
    drained: BTreeMap<String, Drained>,
    /// Why it will not go on (set when it turns to `Abort`).
    refusal: Option<Refusal>,
    /// What each device's flush may take.
    flush_ns: u64,
    /// How long the rings may take to drain: a ring lets go once its requests in flight
    /// are answered, which a device may take up to its timeout over.
    drain_ns: u64,
}

/// Whether a vbd is in a state an upgrade can take: connected with its rings, or
/// holding no ring and not mid-negotiation.
fn settled(vbd: &Vbd) -> bool {
    match vbd.backend.state() {
        XenbusState::Connected => {
            !vbd.hooks.queues.is_empty()
                && vbd.hooks.connection.is_some()
                && vbd.hooks.pending_resize.is_none()
        }
        XenbusState::Initialising | XenbusState::InitWait | XenbusState::Closed => {
            vbd.hooks.queues.is_empty()
        }
        _ => false,
    }
}

impl Control {
    /// A checked image: the upgrade begins (stepped by `upgrade_step`). Called inside
    /// the control path's xenstore round: nothing here touches xenstore.
    pub(in crate::backend) fn begin_upgrade(&mut self, staged: Staged) {
        let now = xen_domain::now_ns();
        log::info!(
            "upgrade: draining {} vbd(s) for build {}",
            self.vbds.len(),
            staged.image.build_id
        );
        self.upgrade = Some(Upgrade {
            staged: Some(staged),
            started: now,
            phase: Phase::Settle,
            deadline: now.saturating_add(WAIT_NS),
            drain_started: 0,
            draining: BTreeMap::new(),
            drained: BTreeMap::new(),
            refusal: None,
            flush_ns: crate::devices::shutdown::flush_deadline_ns(self.config.device_timeout_ns),
            drain_ns: WAIT_NS.max(self.config.device_timeout_ns),
        });
    }

    /// One step of the upgrade; when to step again (`None` never: it ends by clearing
    /// `self.upgrade`, and the control path's rounds go on).
    pub(in crate::backend) fn upgrade_step(&mut self) -> Option<u64> {
        let now = xen_domain::now_ns();
        let upgrade = self.upgrade.as_mut()?;
        match upgrade.phase {
            Phase::Settle => {
                match self.vbds.iter().find(|(_, vbd)| !settled(vbd)) {
                    None => {
                        log::info!(
                            "upgrade: every vbd settled in {} ms",
                            now.saturating_sub(upgrade.started) / 1_000_000
                        );
                        upgrade.phase = Phase::Drain;
                        upgrade.deadline = now.saturating_add(upgrade.drain_ns);
                        upgrade.drain_started = now;
                    }
                    Some((path, _)) if now >= upgrade.deadline => {
                        upgrade.refusal = Some(Refusal::Busy(path.clone()));
                        upgrade.phase = Phase::Abort;
                    }
                    Some(_) => {}
                }
                Some(STEP_NS)
            }
            Phase::Drain => {
                self.drain_step();
                let upgrade = self.upgrade.as_mut()?;
                let all = upgrade.drained.len() == upgrade.draining.len();
                if all {
                    let drained_ms = now.saturating_sub(upgrade.drain_started) / 1_000_000;
                    log::info!(
                        "upgrade: {} vbd(s) drained in {drained_ms} ms",
                        upgrade.drained.len()
                    );
                    let refusal = match self.prepare() {
                        Ok(prepared) => {
                            log::info!(
                                "upgrade: handover block of {} bytes checked ({} vbd(s), {} RAM disk(s), {} range(s))",
                                prepared.block.len(),
                                prepared.handover.vbds.len(),
                                prepared.handover.ram_disks.len(),
                                prepared.handover.ranges.len()
                            );
                            switch(&mut self.registry, prepared)
                        }
                        Err(refusal) => refusal,
                    };
                    let upgrade = self.upgrade.as_mut()?;
                    upgrade.refusal = Some(refusal);
                    upgrade.phase = Phase::Abort;
                } else if now >= upgrade.deadline {
                    let late = upgrade
                        .draining
                        .keys()
                        .find(|path| !upgrade.drained.contains_key(*path))
                        .cloned()
                        .unwrap_or_default();
                    upgrade.refusal = Some(Refusal::Drain(format!(
                        "vbd {late} did not drain in {} ms",
                        upgrade.drain_ns / 1_000_000
                    )));
                    upgrade.phase = Phase::Abort;
                }
                Some(STEP_NS)
            }
            Phase::Abort => {
                // Rings whose drain began are let go first (a ring re-attaches only
                // from where its poller left it).
                self.drain_step();
                let upgrade = self.upgrade.as_ref()?;
                if upgrade.drained.len() < upgrade.draining.len() {
                    return Some(STEP_NS);
                }
                self.reattach_all();
                let upgrade = self.upgrade.take()?;
                let refusal = upgrade
                    .refusal
                    .unwrap_or(Refusal::Drain("abandoned".to_string()));
                if upgrade.drain_started != 0 {
                    log::info!(
                        "upgrade: every drained ring re-attached; rings away for {} ms at most",
                        xen_domain::now_ns().saturating_sub(upgrade.drain_started) / 1_000_000
                    );
                }
                tell(&Answer::Refused(refusal));
                Some(STEP_NS)
            }
        }
    }

    /// Starts (once) and steps the drain of every connected vbd, keeping what each
    /// drained one left.
    fn drain_step(&mut self) {
        let Some(upgrade) = self.upgrade.as_mut() else {
            return;
        };
        let abort = upgrade.phase == Phase::Abort;
        for (path, vbd) in self.vbds.iter_mut() {
            if upgrade.drained.contains_key(path) {
                continue;
            }
            if !upgrade.draining.contains_key(path) {
                // Aborting: nothing more is drained.
                if abort || vbd.backend.state() != XenbusState::Connected {
                    continue;
                }
                let Some(connection) = vbd.hooks.connection.clone() else {
                    continue;
                };
                upgrade
                    .draining
                    .insert(path.clone(), (connection, vbd.backend.published_keys()));
            }
            if let Ok(left) = vbd.hooks.drain_for_upgrade(&mut self.budget) {
                let Some((connection, published)) = upgrade.draining.get(path) else {
                    continue;
                };
                upgrade.drained.insert(
                    path.clone(),
                    Drained {
                        connection: connection.clone(),
                        published: published.clone(),
                        left,
                    },
                );
            }
        }
    }

    /// The handover block from the live state (every ring drained), read back with the
    /// next image's checks; devices flushed first.
    fn prepare(&mut self) -> Result<Prepared, Refusal> {
        let flush_ns = self.upgrade.as_ref().map_or(0, |u| u.flush_ns);
        let disks = self.vbds.values_mut().map(|vbd| &mut vbd.hooks.disk);
        let report = self.registry.flush(disks, flush_ns);
        if let Some(line) = report.given_up.first() {
            return Err(Refusal::Drain(format!("device flush: {line}")));
        }
        let upgrade = self.upgrade.as_mut().ok_or(Refusal::Drain("gone".into()))?;
        let staged = upgrade
            .staged
            .take()
            .ok_or(Refusal::Drain("no image".into()))?;
        let drained = core::mem::take(&mut upgrade.drained);
        let handover = self.handover(&drained);
        if let Some(upgrade) = self.upgrade.as_mut() {
            upgrade.drained = drained;
        }
        let handover = handover?;
        let block = handover.encode();
        let ram = crate::mm::ram_ranges();
        let limits = Limits {
            ram: &ram,
            vcpus: crate::smp::MAX_CPUS,
            max_queues: crate::smp::MAX_CPUS,
        };
        match Handover::decode(&block, &limits) {
            Ok(read) if read == handover => Ok(Prepared {
                block,
                handover,
                staged,
            }),
            Ok(_) => Err(Refusal::Drain(
                "the handover block does not read back as written".into(),
            )),
            Err(e) => Err(Refusal::Drain(format!("handover block: {e}"))),
        }
    }

    /// The handover as the live state says it.
    fn handover(&self, drained: &BTreeMap<String, Drained>) -> Result<Handover, Refusal> {
        let xen = xen_domain::get().ok_or(Refusal::Drain("no Xen".into()))?;
        let old_build_id =
            crate::version::build_id().ok_or(Refusal::Drain("no build id".into()))?;
        let vcpu_info: Vec<u64> = (0..crate::smp::online_count().max(1))
            .filter_map(|n| xen.vcpu_info(n).map(|view| view.address()))
            .collect();
        // RAM disks: the registry's named ones, and each vbd's own (named by its path).
        let mut disks: Vec<(String, blkdev::RamDisk)> = self
            .registry
            .ram_disks_by_name()
            .map(|(name, disk)| (name, disk.clone()))
            .collect();
        for (path, vbd) in &self.vbds {
            if let Disk::Ram(disk) = &vbd.hooks.disk {
                if !disks.iter().any(|(_, d)| d.same(disk)) {
                    disks.push((path.clone(), disk.clone()));
                }
            }
        }
        let mut ram_disks = Vec::new();
        let mut stripes: Vec<u64> = Vec::new();
        for (name, disk) in &disks {
            let table = disk.stripe_table();
            stripes.extend(table.iter().map(|s| s.address));
            ram_disks.push(RamDiskRecord {
                name: name.clone(),
                capacity: disk.sectors() * blkdev::SECTOR_SIZE,
                stripes: table
                    .iter()
                    .map(|s| Stripe {
                        index: s.index as u32,
                        paddr: s.address,
                    })
                    .collect(),
            });
        }
        let ranges = handover::ranges::kept_ranges(&vcpu_info, PARK_PAGE, &stripes);
        let mut vbds = Vec::new();
        for (path, drained) in drained {
            let Some(vbd) = self.vbds.get(path) else {
                continue;
            };
            let record = handover::vbd::record(
                &vbd.backend,
                &drained.connection,
                &vbd.hooks.params,
                &drained.left,
            )
            .map_err(|e| Refusal::Drain(format!("vbd {path}: {e}")))?;
            vbds.push(record);
        }
        let mut handover = Handover {
            old_build_id,
            generation: 0,
            vcpus: crate::smp::online_count() as u32,
            shared_info: xen.shared_info_paddr,
            vcpu_info,
            park_page: PARK_PAGE,
            ranges,
            ram_disks,
            vbds,
        };
        // The domain's part, as the jump will write it: the block checked in `prepare`
        // is the one the next image reads.
        crate::handoff::domain_fields(&mut handover).map_err(|e| Refusal::Drain(format!("{e}")))?;
        Ok(handover)
    }

    /// Every drained vbd re-attached here, the way the next image would take it over.
    fn reattach_all(&mut self) {
        let Some(upgrade) = self.upgrade.as_mut() else {
            return;
        };
        let drained = core::mem::take(&mut upgrade.drained);
        let (vbds, budget, config) = (&mut self.vbds, &mut self.budget, &self.config);
        xen_domain::store::with(|xs| {
            let mut store = Store(xs);
            for (path, drained) in &drained {
                let Some(vbd) = vbds.get_mut(path) else {
                    continue;
                };
                reattach(&mut store, path, vbd, drained, budget, config);
            }
        });
    }
}

/// Re-attaches one drained vbd (`BlkifBackend::resume`, as the next image would).
fn reattach(
    store: &mut Store<'_>,
    path: &str,
    vbd: &mut Vbd,
    drained: &Drained,
    budget: &mut blkback::budget::GrantBudget,
    config: &bootconfig::Config,
) {
    let mut connection = drained.connection.clone();
    for (queue, left) in connection.queues.iter_mut().zip(&drained.left) {
        queue.attach_at = Some(left.rsp_prod);
    }
    let offer = backend_params(&vbd.hooks.disk, config.persistent_grants);
    let mut hooks = Connecting {
        vbd: &mut vbd.hooks,
        budget,
        config,
    };
    match BlkifBackend::resume(
        store,
        path,
        offer,
        &connection,
        &drained.published,
        &mut hooks,
    ) {
        Ok((backend, StepOutcome::Switched(XenbusState::Connected))) => {
            vbd.backend = backend;
        }
        Ok((backend, outcome)) => {
            log::error!("upgrade: {path}: not re-attached ({outcome:?}): its disk fails");
            vbd.backend = backend;
        }
        Err(e) => log::error!("upgrade: {path}: not re-attached: {e:?}"),
    }
}
