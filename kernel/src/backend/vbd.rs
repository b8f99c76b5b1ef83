// SPDX-License-Identifier: MIT OR Apache-2.0
//! One vbd's lifecycle: its blkif negotiation and what its connection holds. On connect
//! each queue's ring is mapped, its event channel bound, and its engine handed to the
//! poller of a vCPU; on disconnect the pollers drain and release them, and the device
//! queues come back to the disk.

use super::adapters::{self, FrontendGrants, Notify, SharedRing};
use super::disk::Disk;
use super::error::ConnectError;
use super::poller::{self, QueueControl, ServedQueue};
use super::space;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use blkback::budget::{GrantBudget, GrantShare};
use blkback::engine::{Busy, Engine, EngineConfig, EngineError};
use blkback::limits::{IoLimits, LimitKeys, QueueUse};
use blkback::negotiate::{BackendParams, BlkifBackend, ConnectionHooks, FrontendConnection};
use blkback::stats::Refusals;
use bootconfig::Config;
use core::sync::atomic::Ordering;
use xen::ring::RingConnection;

use crate::xen_domain;

/// One device: its negotiation and what its connection holds.
pub(super) struct Vbd {
    pub(super) backend: BlkifBackend,
    pub(super) hooks: VbdHooks,
}

pub(super) struct VbdHooks {
    /// `<frontend>/<devid>`, for log lines.
    pub(super) name: String,
    pub(super) disk: Disk,
    /// Each connected queue's control block, with the vCPU that serves it and its
    /// share of the domain's grant budget.
    pub(super) queues: Vec<(usize, Arc<QueueControl>, GrantShare)>,
    /// Leaked pages of earlier connections (unmap failures), for the stats.
    pub(super) leaked_pages: u64,
    /// What the rings of earlier connections refused (a ring's counters go with it).
    pub(super) refusals: Refusals,
    /// `params` as the disk serves it (an operator's rewrite of it asks for a resize).
    pub(super) params: String,
    /// Resizes so far; each connected queue acknowledges the last once its engine
    /// refreshed its capacity.
    pub(super) resize_epoch: u64,
    /// A resize done on the disk, published (sectors) once every queue acknowledged it.
    pub(super) pending_resize: Option<u64>,
    /// The last `params` refused (not refused again while it stays: each refusal
    /// writes nodes whose watch events would bring it back).
    pub(super) refused_params: Option<String>,
    /// The disk's device failed and that is in xenstore (once: it stays failed).
    pub(super) fault_reported: bool,
    /// The vbd's `limit-*` keys and the I/O limits in force, split between the rings
    /// that serve it.
    pub(super) limit_keys: LimitKeys,
    /// Changes of the limits so far; each connected queue's poller takes the latest.
    pub(super) limits_epoch: u64,
    /// Each connected queue's counters when its part of the limits was last split
    /// (`rebalance_limits`).
    pub(super) limit_use: Vec<QueueUse>,
    /// The connection as the frontend negotiated it, since it was last made: what a
    /// live upgrade hands over (with where each ring was left).
    pub(super) connection: Option<FrontendConnection>,
}

// A ring's cache and the grants of its requests in flight (mapped per request) never fill
// more than its map region.
const _: () = assert!(
    blkback::budget::GrantLimits::MAX_PER_RING_LIMIT
        + blkback::budget::InFlightLimits::DEFAULT.per_ring
        <= space::GRANT_PAGES_PER_RING
);

/// A vbd's hooks as its negotiation steps them, with what the control path lends them
/// for the step: the domain's grant budget (every ring joins it when it connects and
/// leaves once released) and the command line's settings.
pub(super) struct Connecting<'a> {
    pub(super) vbd: &'a mut VbdHooks,
    pub(super) budget: &'a mut GrantBudget,
    pub(super) config: &'a Config,
}

impl VbdHooks {
    fn connect_queue(
        &mut self,
        connection: &FrontendConnection,
        q: usize,
        cpu: usize,
        budget: &mut GrantBudget,
        settings: &Config,
    ) -> Result<(), ConnectError> {
        let xen = xen_domain::get().ok_or(ConnectError::NoXen)?;
        let ring = &connection.queues[q];
        let mut config = EngineConfig::new(connection.ring_order, connection.persistent_grants);
        config.max_indirect_segments = connection.max_indirect_segments;
        // A disk the device model emulates goes through bounce buffers (devices/open.rs):
        // its rings copy the guest's data with the hypervisor and map none of it, so no
        // unmap of theirs waits for the device model (devices/bounce.rs).
        config.grant_copy = self.disk.in_device_model();
        // The cache is sized for the most one ring may hold; the ring's share of the
        // domain's budget caps it further while it runs.
        let limits = budget.limits();
        config.persistent_grant_limit = Some(limits.max_per_ring as usize);
        config.idle_release_ns = limits.idle_ns();
        config.read_only = connection.read_only;
        config.discard = connection.discard;
        config.protocol = connection.protocol;
        config.notify_hold_ns = settings.poller.notify_hold_ns;
        config.device_timeout_ns = settings.device_timeout_ns;
        // Set only for a ring a previous image served (a live upgrade).
        config.attach_at = ring.attach_at;
        // The frontend chose the ring's size: refuse it before taking anything if its
        // engine would not fit the room for rings (the heap less the control path's
        // reserve and what RAM disks were promised: `mm::DISK_MEMORY`).
        let needed = config.memory_needed();
        if needed > crate::mm::ring_room() {
            return Err(ConnectError::Engine(EngineError::OutOfMemory {
                slots: blkback::abi::ring_slots(connection.ring_order) as usize,
                needed,
            }));
        }
        let region = space::alloc().ok_or(ConnectError::NoMapSpace)?;
        // Every grant map and unmap goes through the counting hypervisor: whatever fails
        // below, `mapped-pages` follows what Xen holds.
        let hv = adapters::grant_hypervisor(xen.hv);
        let frontend = connection.frontend_id;
        let ring_conn = match RingConnection::connect(
            &hv,
            region.ring_base,
            frontend,
            &ring.ring_refs,
            ring.event_channel,
        ) {
            Ok(ring_conn) => ring_conn,
            Err(error) => {
                // Undone by `connect`, but for pages whose unmap failed too.
                let leaked = error.leaked_pages() as u64;
                space::release(region, leaked);
                self.leaked_pages += leaked;
                return Err(ConnectError::ring(&ring.ring_refs, error));
            }
        };
        let port = ring_conn.port();
        xen.shared.mask(port);
        if let Err(e) = xen::evtchn::bind_vcpu(&xen.hv, port, cpu as u32) {
            log::warn!(
                "blkback: {}: event channel {port} stays on vCPU 0: {e:?}",
                self.name
            );
        }
        // A failure from here on gives back the ring (pages unmapped, port closed) and
        // its region, the same way a disconnected ring goes.
        let mut undo = |ring_conn: RingConnection| {
            self.leaked_pages += poller::release_ring(ring_conn, region, 0, false);
        };
        let ring_bytes = ring.ring_refs.len() * adapters::PAGE_SIZE;
        // SAFETY: the ring pages were just mapped at region.ring_base.. (consecutive,
        // identity mapped); only this engine reaches them, through SharedMem.
        let mem = unsafe { xen::SharedMem::new(region.ring_base as *mut u8, ring_bytes) };
        debug_assert_eq!(region.grant_pages, space::GRANT_PAGES_PER_RING);
        let depth = 1usize << (5 + connection.ring_order);
        let device = match self.disk.take_queue(depth) {
            Ok(device) => device,
            Err(e) => {
                undo(ring_conn);
                return Err(e);
            }
        };
        let engine = Engine::new_within(
            SharedRing { mem },
            FrontendGrants::new(xen.hv, frontend, &region),
            device,
            Notify { hv: xen.hv, port },
            config,
            crate::mm::ring_room(),
        );
        let mut engine = match engine {
            Ok(engine) => engine,
            Err(refused) => {
                // The device queue goes back to the disk's pool (or the disk would
                // serve one queue fewer for good).
                self.disk.give_back(refused.device);
                undo(ring_conn);
                return Err(ConnectError::Engine(refused.error));
            }
        };
        let share = match budget.join(engine.grant_demand()) {
            Ok(share) => share,
            Err(full) => {
                let (_, _, device, _) = engine.into_parts();
                self.disk.give_back(device);
                undo(ring_conn);
                return Err(ConnectError::NoGrantShare(full));
            }
        };
        // Every other ring's shares dropped: their pollers are woken so that they evict
        // down to their cap and give back credit for grants in flight now rather than at
        // their next event.
        poller::ring_all_doorbells();
        engine.set_grant_share(share.clone());
        let limits = self.limit_keys.limits().per_queue(connection.queues.len());
        engine.set_limits(&limits);
        // The engine read the disk's capacity as it is now: nothing to acknowledge.
        let control = Arc::new(QueueControl {
            resize_epoch: self.resize_epoch.into(),
            resize_acked: self.resize_epoch.into(),
            limits: spin::Mutex::new(limits),
            limits_epoch: self.limits_epoch.into(),
            ..QueueControl::default()
        });
        self.queues.push((cpu, control.clone(), share));
        poller::attach(
            cpu,
            ServedQueue {
                engine,
                ring: ring_conn,
                region,
                control,
                resize_seen: self.resize_epoch,
                fault_seen: false,
                limits_seen: self.limits_epoch,
            },
        );
        Ok(())
    }
}

impl VbdHooks {
    /// The first device fault a ring of this disk saw, if one did.
    pub(super) fn device_fault(&self) -> Option<blkdev::DeviceFault> {
        self.queues
            .iter()
            .find_map(|(_, control, _)| *control.fault.lock())
    }

    /// The disk was resized: every connected queue's poller is to refresh its engine's
    /// capacity (woken if it sleeps); `sectors` is published once all did.
    pub(super) fn start_resize(&mut self, sectors: u64) {
        self.resize_epoch += 1;
        self.pending_resize = Some(sectors);
        for (cpu, control, _) in &self.queues {
            control
                .resize_epoch
                .store(self.resize_epoch, Ordering::Release);
            poller::ring_doorbell(*cpu);
        }
    }

    /// The vbd's I/O limits changed: each connected queue enforces its part of them from
    /// its poller's next pass (woken if it sleeps, so a ring waiting under the old
    /// limits is looked at under the new ones).
    pub(super) fn apply_limits(&mut self) {
        let limits = self.limit_keys.limits().per_queue(self.queues.len());
        let parts = alloc::vec![limits; self.queues.len()];
        self.hand_limits(&parts, 0);
        self.limit_use.clear();
    }

    /// Whether the limits are split between queues by use (`rebalance_limits` is due
    /// every `LIMIT_SPLIT_NS`).
    pub(super) fn splits_limits(&self) -> bool {
        self.queues.len() > 1 && !self.limit_keys.limits().is_unlimited()
    }

    /// Splits the limits again between the connected queues, by what each let through
    /// since the last split (`IoLimits::split_by_use`), so that a guest busy on one of
    /// several queues gets nearly the whole limit; a queue's part is handed to it only
    /// if it moved by more than 1/20. Called every `LIMIT_SPLIT_NS` by the control path.
    pub(super) fn rebalance_limits(&mut self) {
        if !self.splits_limits() {
            return;
        }
        let now: Vec<QueueUse> = self
            .queues
            .iter()
            .map(|(_, control, _)| QueueUse::of(&control.stats.lock()))
            .collect();
        let earlier = core::mem::replace(&mut self.limit_use, now);
        if earlier.len() != self.limit_use.len() {
            // Queues came or went since: this is the baseline.
            return;
        }
        let used: Vec<QueueUse> = self
            .limit_use
            .iter()
            .zip(&earlier)
            .map(|(now, earlier)| now.since(*earlier))
            .collect();
        let parts = self.limit_keys.limits().split_by_use(&used);
        self.hand_limits(&parts, 20);
    }

    /// Gives queue i its part `parts[i]` of the limits, through its control block (its
    /// poller takes it at its next pass, woken if it sleeps): every part if `parts_of`
    /// is 0, else only those that moved by more than 1/`parts_of` of a rate.
    fn hand_limits(&mut self, parts: &[IoLimits], parts_of: u64) {
        self.limits_epoch += 1;
        for ((cpu, control, _), part) in self.queues.iter().zip(parts) {
            {
                let mut limits = control.limits.lock();
                if parts_of != 0 && !limits.differs_from(part, parts_of) {
                    continue;
                }
                *limits = *part;
            }
            control
                .limits_epoch
                .store(self.limits_epoch, Ordering::Release);
            poller::ring_doorbell(*cpu);
        }
    }

    /// Whether every connected queue's engine checks against the latest resize.
    pub(super) fn resize_acknowledged(&self) -> bool {
        self.queues
            .iter()
            .all(|(_, c, _)| c.resize_acked.load(Ordering::Acquire) == self.resize_epoch)
    }
}

impl ConnectionHooks for Connecting<'_> {
    type Error = ConnectError;

    fn connect(&mut self, connection: &FrontendConnection) -> Result<(), ConnectError> {
        self.vbd.connection = Some(connection.clone());
        let cpus = crate::smp::online_count().max(1);
        // Devices start on the least loaded poller (single-queue frontends would
        // otherwise all share one vCPU). A remote namespace's first ring goes to vCPU 0,
        // which runs the network and completes its requests: on another vCPU every
        // request would cost two doorbells and two wake-ups between them.
        let first = if self.vbd.disk.on_the_network() {
            0
        } else {
            poller::least_loaded(cpus)
        };
        for q in 0..connection.queues.len() {
            let cpu = serving_cpu(first, q, cpus);
            self.vbd
                .connect_queue(connection, q, cpu, self.budget, self.config)?;
        }
        Ok(())
    }

    fn disconnect(&mut self) -> Result<(), Busy> {
        self.vbd.disconnect(self.budget)
    }

    fn now_ns(&self) -> u64 {
        xen_domain::now_ns()
    }
}

impl VbdHooks {
    /// A live upgrade's drain: `disconnect`, and once every ring is released, where
    /// each was left (in queue order). The backend is not told: nothing is written to
    /// xenstore and the frontend still sees Connected.
    pub(super) fn drain_for_upgrade(
        &mut self,
        budget: &mut GrantBudget,
    ) -> Result<Vec<handover::vbd::LeftAt>, Busy> {
        for (cpu, control, _) in &self.queues {
            if !control.detach.swap(true, Ordering::AcqRel) {
                poller::ring_doorbell(*cpu);
            }
        }
        let left: Option<Vec<_>> = self
            .queues
            .iter()
            .map(|(_, control, _)| {
                if control.detached.load(Ordering::Acquire) {
                    *control.left_at.lock()
                } else {
                    None
                }
            })
            .collect();
        let Some(left) = left else {
            return Err(Busy {
                in_flight: self.queues.len(),
            });
        };
        self.disconnect(budget)?;
        Ok(left)
    }

    /// Has the pollers release every ring; once they all have, gives back what the
    /// connection held (device queues, grant shares).
    fn disconnect(&mut self, budget: &mut GrantBudget) -> Result<(), Busy> {
        for (cpu, control, _) in &self.queues {
            if !control.detach.swap(true, Ordering::AcqRel) {
                poller::ring_doorbell(*cpu);
            }
        }
        if self
            .queues
            .iter()
            .any(|(_, c, _)| !c.detached.load(Ordering::Acquire))
        {
            return Err(Busy {
                in_flight: self.queues.len(),
            });
        }
        for (_, control, share) in self.queues.drain(..) {
            // Its grants are unmapped and its credit given back: the other rings may
            // have more.
            budget.leave(&share);
            self.leaked_pages += control.leaked_pages.load(Ordering::Acquire);
            self.refusals.add_ring(&control.stats.lock());
            if let Some(device) = control.device.lock().take() {
                self.disk.give_back(device);
            }
        }
        Ok(())
    }
}

/// The vCPU that serves queue `q` of a device whose first queue went to `first`:
/// consecutive vCPUs from there, so a device's queues spread over the pollers.
fn serving_cpu(first: usize, q: usize, cpus: usize) -> usize {
    (first + q) % cpus
}

/// What the backend offers a frontend for `disk` (`persistent_grants`: whether it offers
/// persistent grants, `grants.persistent=`; never for a disk whose rings copy instead of
/// mapping, where a grant kept mapped would save nothing).
pub(super) fn backend_params(disk: &Disk, persistent_grants: bool) -> BackendParams {
    let queues = disk.max_queues(crate::smp::online_count().max(1));
    BackendParams {
        persistent_grants: persistent_grants && !disk.in_device_model(),
        ..BackendParams::new(queues as u32, disk.geometry())
    }
}
