// SPDX-License-Identifier: MIT OR Apache-2.0
//! The device registry: every disk and device the control path has made, and what stays
//! of them after their vbd is gone. Owned by `Control` (vCPU 0), handed by `&mut` to the
//! code that opens or releases disks; nothing here is reached from the pollers.
//!
//! - Named RAM disks (`ram:<size>:<name>`) outlive their vbd: the next vbd naming one
//!   gets the same data.
//! - Every NVMe namespace and virtio device opened has a pool of the queues no disk
//!   holds: a removed vbd's queues go back to it, and the next disk on the device, any
//!   part of it, takes them (opening it again would reset a controller whose queues are
//!   still live, or find a virtio device in use).
//! - Several disks can share a device, each on its own range (a slice: a GPT partition or
//!   an explicit extent); ranges on one device must not overlap (two guests would write
//!   the same blocks; Linux's block hotplug script likewise refuses a device another
//!   domain has open for writing), and a whole-device disk overlaps every slice. Nor may
//!   a disk cover the partition table a `part=` disk serving was found by (its guest
//!   could rewrite the table, and the next lookup would find another guest's data), nor
//!   a `part=` disk be found by a table inside a disk serving.
//! - Queues: a disk takes up to one per vCPU. An NVMe disk whose pool is empty gets new
//!   queue pairs from its controller (which grants 4 per vCPU, shared by all its
//!   namespaces); a virtio device makes all its virtqueues (up to 4 per vCPU) at its one
//!   open, so it serves disks until they are all taken.
//! - Each device's bounce counter is kept: their sum is the domain's `bounced-bytes`.
//! - The PCI devices themselves (`devices::open::Devices`): an NVMe controller is
//!   brought up once and then shared by its namespaces, a virtio device opened once.

use super::disk::{DeviceQueue, Disk, OpenDevice, RAM_MEMORY_WANTED};
use super::error::{DiskError, ResizeRefusal};
use crate::devices::open::{Devices, OpenOptions, PciBus, Queue};
use crate::devices::region::{self, TableReader};
use crate::devices::shutdown;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use backing::{
    check_slice, parse_backing, Backing, Conflict, ConflictKind, DeviceId, Extent, RamName, Ranges,
    Region,
};
use blkdev::{BlockDevice, Geometry, RamDisk, SharedCapacity};
use core::sync::atomic::{AtomicU64, Ordering};
use pci::PciAddress;

/// Virtqueues asked of a virtio device at its one open, per vCPU: room for several disks
/// on it (each takes up to one per vCPU), as an NVMe controller's pool.
const VIRTIO_QUEUES_PER_CPU: usize = 4;

/// A device's queues that no disk holds, and what is known of it.
struct Pool {
    device: DeviceId,
    description: String,
    /// The whole device's.
    geometry: Geometry,
    idle: Vec<Queue>,
    /// Queues made for it so far.
    made: usize,
    bounced_bytes: Arc<AtomicU64>,
    /// Emulated by the device model (`OpenedDisk::device_model`).
    device_model: bool,
}

pub struct Registry {
    /// Named RAM disks, kept until blkdom stops.
    ram_disks: BTreeMap<RamName, RamDisk>,
    /// RAM disks a live upgrade handed over that could not be rebuilt, and why.
    lost_ram_disks: BTreeMap<RamName, String>,
    /// A vbd's own RAM disk (no name: the handover names it by the vbd's backend path),
    /// rebuilt by a live upgrade, or why not, until its vbd takes it over.
    handed_by_vbd: BTreeMap<String, Result<RamDisk, String>>,
    /// Every device opened so far, with its idle queues.
    pools: Vec<Pool>,
    /// The ranges of devices serving a disk now, with the spec that asked for each.
    serving: Ranges<DeviceId, String>,
    /// The bounce counter of every device opened so far (one each, shared by its
    /// queues).
    bounce_counters: Vec<Arc<AtomicU64>>,
    devices: Devices,
    tables: TableReader,
    /// The storage network, or why there is none (`nvme-tcp:` disks are refused with it).
    net: Result<super::net::Net, String>,
}

impl Registry {
    /// The registry of the devices on `bus`, brought up now (`Devices::prepare`): an
    /// attach then takes queues, where bringing a device up would cost it a VM exit to
    /// the device model per register access.
    pub fn new(
        bus: PciBus,
        recovery: cmdslots::RecoveryConfig,
        net: Result<super::net::Net, String>,
    ) -> Registry {
        let mut devices = Devices::new(bus, recovery);
        devices.prepare(crate::smp::online_count().max(1) * VIRTIO_QUEUES_PER_CPU);
        Registry {
            ram_disks: BTreeMap::new(),
            lost_ram_disks: BTreeMap::new(),
            handed_by_vbd: BTreeMap::new(),
            pools: Vec::new(),
            serving: Ranges::new(),
            bounce_counters: Vec::new(),
            devices,
            tables: TableReader::default(),
            net,
        }
    }

    /// Makes the backing store `params` names, or says why not (the reason goes to the
    /// vbd's `hotplug-error` node and the console). `passed_through`: the PCI devices the
    /// toolstack gave this domain (the rest are emulated and need bounce buffers).
    pub fn open(&mut self, params: &str, passed_through: &[PciAddress]) -> Result<Disk, DiskError> {
        // xl passes a `target=` spec through unchanged; older toolstacks prefix "phy:".
        let spec = params.strip_prefix("phy:").unwrap_or(params);
        let backing = parse_backing(spec).map_err(|e| DiskError::Params {
            params: params.into(),
            reason: e.to_string(),
        })?;
        let region = match backing {
            Backing::Ram { bytes, name } => return self.open_ram(bytes, name).map(Disk::Ram),
            Backing::NvmeTcp { region } => {
                return self.open_remote(spec, region).map(Disk::Device);
            }
            Backing::Nvme { region, .. } | Backing::Virtio { region, .. } => region,
        };
        // Names reach devices by where they sit: two names of one device (its serial, its
        // address, its position) share its pool and its claimed ranges.
        let device = self
            .devices
            .resolve(&backing)
            .map_err(|error| DiskError::Device {
                spec: spec.into(),
                error,
            })?;
        if backing.device().is_some_and(|(name, _)| name.positional()) {
            log::warn!(
                "blkback: {spec} names a device by its position on the bus ({device} now), \
                 which changes when a device is added, removed or fails: name it by serial, \
                 NGUID, EUI-64 or PCI address"
            );
        }
        self.open_on_device(spec, device, region, passed_through)
            .map(Disk::Device)
    }

    /// A disk on a remote namespace: the remote connected (or already), then its
    /// queues as any device's.
    fn open_remote(&mut self, spec: &str, region: Region) -> Result<OpenDevice, DiskError> {
        let refuse = |reason: String, errno: i32| DiskError::Remote {
            spec: spec.into(),
            reason,
            errno,
        };
        let target = backing::parse_nvme_tcp(spec)
            .map_err(|e| refuse(e.to_string(), xen::xenbus::error::errno::EINVAL))?;
        let net = self.net.as_mut().map_err(|why| {
            refuse(
                format!("no storage network: {why}"),
                xen::xenbus::error::errno::ENODEV,
            )
        })?;
        let remote = match net
            .remote(&target)
            .map_err(|(reason, errno)| refuse(reason, errno))?
        {
            super::net::Attach::Ready(remote) => remote,
            super::net::Attach::Connecting => {
                return Err(DiskError::RemoteConnecting { spec: spec.into() })
            }
        };
        let device = DeviceId::NvmeTcp { remote };
        // The disks of a namespace share its association, and so its reconnect times
        // (`Net::remote`): a disk asking for others takes the association over only
        // when no disk is served from it, else it is refused (one disk's guest would
        // wait on a target gone longer, or shorter, than its own times say).
        let wanted = super::net::reconnect_policy(&target.reconnect);
        let policy = net.reconnect_policy(remote).unwrap_or(wanted);
        let served = self.serving.on(&device).next();
        match policy.share(wanted, served.is_some()) {
            nvmetcp::Share::Same => {}
            nvmetcp::Share::Change => net.set_reconnect_policy(remote, wanted),
            nvmetcp::Share::Refuse => {
                let owner = served.map_or("", |claim| claim.owner.as_str());
                return Err(refuse(
                    format!(
                        "{owner} is served from this namespace with reconnect-delay={},\
                         ctrl-loss-tmo={}: disks of one namespace share its connection and its \
                         reconnect times; give the same ones",
                        policy.delay_ms / 1000,
                        policy.give_up_ms / 1000
                    ),
                    xen::xenbus::error::errno::EINVAL,
                ));
            }
        }
        let opened = self.open_on_device(spec, device, region, &[]);
        if opened.is_err() {
            // A first disk that could not open (no such partition, say) leaves nobody.
            self.let_go_of_remote(remote);
        }
        opened
    }

    /// The storage network's statistics (`Net::vif_stats_line`,
    /// `Net::remote_stats_lines`), if blkdom has one.
    pub fn net_stats(&self) -> Option<(String, Vec<(usize, String)>)> {
        let net = self.net.as_ref().ok()?;
        Some((net.vif_stats_line(), net.remote_stats_lines()))
    }

    /// Remote disks' requests wait for the network, or frames arrived for it.
    pub fn net_waiting(&self) -> bool {
        // Both looks, always: the second arms the vif's events for the sleep.
        self.net
            .as_ref()
            .is_ok_and(|net| net.has_submissions() | net.frames_waiting())
    }

    /// The vif's queues' event channels (none without a vif): vCPU 0 waits on them.
    pub fn net_ports(&self) -> &[xen::abi::event_channel::EvtchnPort] {
        self.net.as_ref().map_or(&[], |net| net.ports())
    }

    /// The storage network, for the poller of vCPU 0.
    pub fn net(&mut self) -> Option<&mut super::net::Net> {
        self.net.as_mut().ok()
    }

    /// Takes back the disk of a vbd that was removed (or failed before it served), as
    /// [`Registry::release`]; a remote namespace no disk is served from any more is then
    /// let go ([`Registry::let_go_of_remote`]).
    pub fn release_removed(&mut self, disk: Disk) {
        let remote = match &disk {
            Disk::Device(OpenDevice {
                device: DeviceId::NvmeTcp { remote },
                ..
            }) => Some(*remote),
            _ => None,
        };
        self.release(disk);
        if let Some(remote) = remote {
            self.let_go_of_remote(remote);
        }
    }

    /// Remote namespace `remote`, unless a disk is served from it: its idle queues
    /// dropped and its association closed (`Net::release`). Not at a shutdown, which
    /// flushes each namespace through an idle queue first, nor in a live upgrade's
    /// drain, whose next image takes the disks over.
    fn let_go_of_remote(&mut self, remote: u32) {
        let device = DeviceId::NvmeTcp { remote };
        if self.serving.on(&device).next().is_some() {
            return;
        }
        self.pools.retain(|pool| pool.device != device);
        if let Ok(net) = self.net.as_mut() {
            net.release(remote);
        }
    }

    /// Takes back the disk of a vbd that is gone: its range is free again, and its
    /// device's queues (all given back by then: rings drain before their release) wait
    /// for the next disk on the device.
    pub fn release(&mut self, disk: Disk) {
        let Disk::Device(mut disk) = disk else {
            return;
        };
        let (idle, opened) = (disk.idle.len(), disk.opened);
        if idle < opened {
            log::warn!(
                "blkback: {}: {} of {opened} queues were not given back",
                disk.description,
                opened - idle
            );
        }
        self.serving.release(&disk.device, disk.extent);
        if let Some(pool) = self.pools.iter_mut().find(|p| p.device == disk.device) {
            pool.idle
                .extend(disk.idle.drain(..).map(DeviceQueue::into_device));
        }
    }

    /// Grows (or, a RAM disk, shrinks) `disk` to `bytes` while it serves: its spec
    /// (`served`) was checked to allow it (`backing::new_size`). A RAM disk's new part must
    /// fit the room for disks (`mm::DISK_MEMORY`) with room to spare; a slice grows only,
    /// inside its device and up to the next range serving a disk (its claim moves with
    /// it), and every queue of the disk sees the new length at its next request. The
    /// caller has each ring's engine refresh its capacity before the new size is
    /// published.
    pub fn resize(
        &mut self,
        served: &str,
        disk: &mut Disk,
        bytes: u64,
    ) -> Result<(), ResizeRefusal> {
        let sectors = bytes / blkdev::SECTOR_SIZE;
        let device = match disk {
            Disk::Ram(disk) => {
                let needed = disk.memory_to_grow(sectors);
                let free = crate::mm::DISK_MEMORY.stripe_room();
                if needed > free {
                    return Err(ResizeRefusal::RamDoesNotFit { needed, free });
                }
                return disk.resize(sectors).map_err(ResizeRefusal::Ram);
            }
            Disk::Device(device) => device,
        };
        let old = device.extent;
        let Some(capacity) = &device.capacity else {
            return Err(ResizeRefusal::NotASlice);
        };
        if bytes < old.len() {
            return Err(ResizeRefusal::SliceShrinks { from: old, bytes });
        }
        let pool = self
            .pools
            .iter()
            .find(|p| p.device == device.device)
            .ok_or(ResizeRefusal::NotASlice)?;
        let device_bytes = pool.geometry.sectors * blkdev::SECTOR_SIZE;
        let new = Extent::new(old.start(), bytes).ok_or(ResizeRefusal::NotASlice)?;
        check_slice(new, device_bytes, pool.geometry.logical_block_size)
            .map_err(ResizeRefusal::Slice)?;
        if let Err(Conflict { kind, claim }) = self.serving.resize(&device.device, old, new) {
            let serving = claim.owner.clone();
            return Err(match (kind, claim.table) {
                (ConflictKind::CoversTable, Some(table)) => ResizeRefusal::CoversTable {
                    spec: served.into(),
                    extent: new,
                    serving,
                    table,
                },
                _ => ResizeRefusal::Overlaps {
                    spec: served.into(),
                    extent: new,
                    serving,
                    serving_extent: claim.extent,
                },
            });
        }
        device.extent = new;
        device.geometry.sectors = sectors;
        device.description = format!("{new} of {}", pool.description);
        capacity.set(sectors);
        Ok(())
    }

    /// Remote namespaces their targets grew (`Net::take_growth`), their pools' geometry
    /// following, so that a slice may grow into the new room: (device, sectors).
    pub fn take_remote_growth(&mut self) -> Vec<(DeviceId, u64)> {
        let Ok(net) = self.net.as_mut() else {
            return Vec::new();
        };
        let grown = net.take_growth();
        grown
            .into_iter()
            .filter_map(|(remote, sectors)| {
                let device = DeviceId::NvmeTcp {
                    remote: u32::try_from(remote).ok()?,
                };
                if let Some(pool) = self.pools.iter_mut().find(|p| p.device == device) {
                    pool.geometry.sectors = sectors;
                }
                Some((device, sectors))
            })
            .collect()
    }

    /// A disk serving the whole of `device`, grown to `sectors`: its claim and geometry
    /// follow (its queues read the new size from the device). False, and nothing
    /// changes, for any other disk (a slice keeps its size).
    pub fn grow_whole(&mut self, disk: &mut Disk, device: DeviceId, sectors: u64) -> bool {
        let Disk::Device(open) = disk else {
            return false;
        };
        if open.device != device || open.capacity.is_some() {
            return false;
        }
        let old = open.extent;
        let Some(new) = Extent::new(old.start(), sectors * blkdev::SECTOR_SIZE) else {
            return false;
        };
        if new.len() <= old.len() || self.serving.resize(&device, old, new).is_err() {
            return false;
        }
        open.extent = new;
        open.geometry.sectors = sectors;
        true
    }

    /// Every device's recovery step (`Devices::recover`); the earliest time one wants
    /// its next.
    pub fn recover(&mut self, now: u64) -> Option<u64> {
        self.devices.recover(now)
    }

    /// The devices' part of blkdom's shutdown, once the vbds' disks are back here: every
    /// device a disk was opened on (an NVMe namespace, a virtio device) is flushed
    /// through one of its idle queues, each within `flush_deadline_ns`, then every device
    /// brought up is told to stop (`Devices::shut_down`). A device whose queues are all
    /// still held by rings that did not drain cannot be flushed, and is reported so.
    pub fn shut_down(&mut self, flush_deadline_ns: u64) -> shutdown::Report {
        let mut remote = self.flush_remote(flush_deadline_ns);
        let (notified, confirmed) = self.close_remotes();
        let (flush, unflushed) = Self::idle_queues(&mut self.pools, Vec::new(), "shutdown");
        let mut report = self.devices.shut_down(flush, flush_deadline_ns);
        report.given_up.extend(unflushed);
        report.flushed += remote.flushed;
        report.given_up.append(&mut remote.given_up);
        report.stopped += confirmed;
        if confirmed < notified {
            report.given_up.push(format!(
                "{} of {notified} remote controller(s) did not confirm their shutdown",
                notified - confirmed
            ));
        }
        report
    }

    /// At a shutdown, once the remote namespaces are flushed: every association closed,
    /// its controller told of its shutdown (`Net::close_all`), for at most
    /// `nvmetcp::remote::SHUTDOWN_MS` and a second more for the network. Returns the
    /// controllers told, and those that confirmed.
    fn close_remotes(&mut self) -> (usize, usize) {
        let Ok(net) = self.net.as_mut() else {
            return (0, 0);
        };
        let deadline =
            crate::xen_domain::now_ns() + (nvmetcp::remote::SHUTDOWN_MS + 1_000) * 1_000_000;
        net.close_all(deadline, &mut core::hint::spin_loop)
    }

    /// Remote namespaces' flushes (through one idle queue of each), with the network
    /// driven while they wait: nothing else on this vCPU moves it meanwhile.
    fn flush_remote(&mut self, flush_deadline_ns: u64) -> shutdown::Report {
        let Ok(net) = self.net.as_mut() else {
            return shutdown::Report::default();
        };
        let flush: Vec<(String, &mut dyn BlockDevice)> = self
            .pools
            .iter_mut()
            .filter(|pool| matches!(pool.device, DeviceId::NvmeTcp { .. }))
            .filter_map(|pool| {
                let name = pool.description.clone();
                pool.idle
                    .last_mut()
                    .map(|q| (name, q as &mut dyn BlockDevice))
            })
            .collect();
        if flush.is_empty() {
            return shutdown::Report::default();
        }
        crate::devices::shutdown::flush_queues_relaxing(flush, flush_deadline_ns, &mut || {
            net.poll();
        })
    }

    /// A live upgrade's flush, once its drain gave every ring's queue back: every
    /// device a disk was opened on is flushed through one of its idle queues, each
    /// within `flush_deadline_ns`; the devices go on serving. The vbds keep their
    /// `disks` (an abandoned upgrade re-attaches them), so a device whose queues are all
    /// opened by disks is flushed through a queue its drained ring gave back to one.
    /// Remote namespaces are flushed apart (`flush_remote`).
    pub fn flush<'a>(
        &'a mut self,
        disks: impl Iterator<Item = &'a mut Disk>,
        flush_deadline_ns: u64,
    ) -> shutdown::Report {
        let mut remote = self.flush_remote(flush_deadline_ns);
        let mut held: Vec<(DeviceId, &'a mut DeviceQueue)> = Vec::new();
        for disk in disks {
            if let Disk::Device(disk) = disk {
                let device = disk.device;
                if held.iter().all(|(d, _)| *d != device) {
                    if let Some(queue) = disk.idle.last_mut() {
                        held.push((device, queue));
                    }
                }
            }
        }
        let (flush, unflushed) = Self::idle_queues(&mut self.pools, held, "upgrade");
        let mut report = crate::devices::shutdown::flush_queues(flush, flush_deadline_ns);
        report.given_up.extend(unflushed);
        report.flushed += remote.flushed;
        report.given_up.append(&mut remote.given_up);
        report
    }

    /// A live upgrade's last step before the jump: every device stopped without the
    /// shutdown notification and its bus mastering off (`Devices::quiesce`). Nothing may
    /// use the devices afterwards: past this the upgrade cannot be abandoned.
    pub fn quiesce(&mut self) -> shutdown::Report {
        self.devices.quiesce()
    }

    /// One idle queue of each device pool, to flush through (with its name): the pool's
    /// own, else one of `held` (queues of the same device that disks keep); and a line,
    /// logged under `context`, for each pool with neither (all held by rings).
    #[allow(clippy::type_complexity)]
    fn idle_queues<'a>(
        pools: &'a mut [Pool],
        mut held: Vec<(DeviceId, &'a mut DeviceQueue)>,
        context: &str,
    ) -> (Vec<(String, &'a mut dyn BlockDevice)>, Vec<String>) {
        let mut flush: Vec<(String, &mut dyn BlockDevice)> = Vec::new();
        let mut unflushed = Vec::new();
        // Remote namespaces are flushed apart (`flush_remote`).
        for pool in pools
            .iter_mut()
            .filter(|pool| !matches!(pool.device, DeviceId::NvmeTcp { .. }))
        {
            let name = pool.device.to_string();
            if let Some(queue) = pool.idle.last_mut() {
                flush.push((name, queue));
            } else if let Some(at) = held.iter().position(|(d, _)| *d == pool.device) {
                flush.push((name, held.swap_remove(at).1));
            } else {
                unflushed.push(format!(
                    "{name}: flush not sent: every queue of it is held by a ring that did not drain"
                ));
            }
        }
        for line in &unflushed {
            log::error!("{context}: {line}");
        }
        (flush, unflushed)
    }

    /// The devices on the bus and their names (`Devices::listing`).
    pub fn device_listing(&mut self) -> Vec<String> {
        self.devices.listing()
    }

    /// Every named RAM disk (kept here between their vbds).
    pub fn named_ram_disks(&self) -> impl Iterator<Item = &RamDisk> {
        self.ram_disks.values()
    }

    /// Every named RAM disk with its name.
    pub fn ram_disks_by_name(&self) -> impl Iterator<Item = (String, &RamDisk)> {
        self.ram_disks
            .iter()
            .map(|(name, disk)| (alloc::string::ToString::to_string(name), disk))
    }

    /// Bytes copied through bounce buffers by every device since blkdom started.
    pub fn bounced_bytes_total(&self) -> u64 {
        self.bounce_counters
            .iter()
            .map(|counter| counter.load(Ordering::Relaxed))
            .sum()
    }

    /// Rebuilds the RAM disks a live upgrade handed over from their stripe tables
    /// (`mm::add_handed_stripes` put their stripes in the arena), before any disk is
    /// opened. A disk that cannot be rebuilt is remembered as lost: its name never gets
    /// an empty disk in its place. Returns how many were rebuilt.
    pub fn adopt_ram_disks(&mut self, records: &[handover::block::RamDiskRecord]) -> usize {
        let most = crate::mm::STRIPES.total_bytes();
        let mut adopted = 0;
        for record in records {
            let name = RamName::new(&record.name);
            let table: Vec<blkdev::HandedStripe> = record
                .stripes
                .iter()
                .map(|s| blkdev::HandedStripe {
                    index: u64::from(s.index),
                    address: s.paddr,
                })
                .collect();
            let disk = RamDisk::adopt(
                RamDisk::plain(record.capacity / blkdev::SECTOR_SIZE),
                most / blkdev::SECTOR_SIZE,
                Some(&RAM_MEMORY_WANTED),
                Some(&crate::mm::DISK_MEMORY),
                &table,
            );
            match &disk {
                Ok(_) => {
                    log::info!(
                        "upgrade: RAM disk {} taken over ({} MiB, {} stripes resident)",
                        record.name,
                        record.capacity >> 20,
                        record.stripes.len()
                    );
                    adopted += 1;
                }
                Err(e) => log::error!("upgrade: RAM disk {} not taken over: {e:?}", record.name),
            }
            let disk = disk.map_err(|e| alloc::format!("{e:?}"));
            match (name, disk) {
                (Some(name), Ok(disk)) => {
                    self.ram_disks.insert(name, disk);
                }
                (Some(name), Err(reason)) => {
                    self.lost_ram_disks.insert(name, reason);
                }
                (None, disk) => {
                    self.handed_by_vbd.insert(record.name.clone(), disk);
                }
            }
        }
        adopted
    }

    /// The RAM disk of the vbd at `path` (one without a name) a live upgrade handed
    /// over, rebuilt or why not; `None` when there was none.
    pub fn take_handed_ram_disk(&mut self, path: &str) -> Option<Result<Disk, String>> {
        self.handed_by_vbd
            .remove(path)
            .map(|disk| disk.map(Disk::Ram))
    }

    /// A new RAM disk, or the named one again if it exists and no other disk uses it.
    fn open_ram(&mut self, bytes: u64, name: Option<RamName>) -> Result<RamDisk, DiskError> {
        if let Some((name, reason)) =
            name.and_then(|name| Some((name, self.lost_ram_disks.get(&name)?)))
        {
            return Err(DiskError::RamLost {
                name,
                reason: reason.clone(),
            });
        }
        if let Some((name, disk)) = name.and_then(|name| Some((name, self.ram_disks.get(&name)?))) {
            let have = disk.geometry().sectors * blkdev::SECTOR_SIZE;
            if have != bytes {
                return Err(DiskError::RamSizeMismatch {
                    name,
                    have_bytes: have,
                    want_bytes: bytes,
                });
            }
            if disk.handles() > 1 {
                return Err(DiskError::RamInUse(name));
            }
            return Ok(disk.clone());
        }
        // Stripe memory, not what discarded RAM disks gave back and will want again for
        // their guests' writes (their tables come from the heap's room: checked by
        // `try_new`).
        let room = crate::mm::DISK_MEMORY.stripe_room();
        if bytes > room {
            return Err(DiskError::RamDoesNotFit {
                bytes,
                free_bytes: room,
            });
        }
        // It may grow to what the arena could ever hold (a note bit per 64 KiB).
        let most = crate::mm::STRIPES.total_bytes();
        let disk = RamDisk::try_new(
            RamDisk::plain(bytes / blkdev::SECTOR_SIZE),
            most / blkdev::SECTOR_SIZE,
            Some(&RAM_MEMORY_WANTED),
            Some(&crate::mm::DISK_MEMORY),
        )
        .map_err(|_| DiskError::RamDoesNotFit {
            bytes,
            free_bytes: room,
        })?;
        if let Some(name) = name {
            log::info!(
                "blkback: RAM disk {name} made ({} MiB); it stays until blkdom stops",
                bytes >> 20
            );
            self.ram_disks.insert(name, disk.clone());
        }
        Ok(disk)
    }

    /// `region`'s extent on `device` from its partition table (`TableReader::locate`).
    /// A remote namespace's table comes over the network, which this path drives: the
    /// network pass runs while each read waits (vCPU 0's rings wait meanwhile, at most
    /// the read timeout).
    fn locate_on(
        &mut self,
        device: DeviceId,
        region: Region,
        queues: &mut Vec<Queue>,
    ) -> Result<(Extent, Option<Extent>), region::RegionError> {
        let mut net = match device {
            DeviceId::NvmeTcp { .. } => self.net.as_mut().ok(),
            _ => None,
        };
        self.tables.locate(region, queues, &mut || {
            if let Some(net) = net.as_deref_mut() {
                net.poll();
            }
        })
    }

    /// A disk on `region` of `device`: its range checked against the ranges serving
    /// (before any queue moves where no partition table has to be read), its queues
    /// from the device's pool.
    fn open_on_device(
        &mut self,
        spec: &str,
        device: DeviceId,
        region: Region,
        passed_through: &[PciAddress],
    ) -> Result<OpenDevice, DiskError> {
        let (at, fresh) = self.pool(spec, device, passed_through)?;
        // A device that failed stays stopped: its queues would answer nothing but errors.
        if let Some(fault) = self.pools[at].idle.iter().find_map(|q| q.fault()) {
            return Err(DiskError::DeviceFailed {
                spec: spec.into(),
                fault,
            });
        }
        let geometry = self.pools[at].geometry;
        let known = match region::without_table(region, &geometry) {
            Some(Ok(extent)) => Some(extent),
            Some(Err(error)) => {
                return Err(DiskError::Region {
                    spec: spec.into(),
                    error,
                })
            }
            None => None,
        };
        if let Some(extent) = known {
            self.check_free(spec, device, extent, None)?;
        }
        let mut queues = self.take_queues(at, fresh, spec, device, passed_through)?;
        let placed = match known {
            Some(extent) => Ok((extent, None)),
            None => self
                .locate_on(device, region, &mut queues)
                .map_err(|error| DiskError::Region {
                    spec: spec.into(),
                    error,
                })
                .and_then(|(extent, table)| {
                    self.check_free(spec, device, extent, table)
                        .map(|()| (extent, table))
                }),
        };
        if known.is_none() {
            crate::devices::stopwatch::lap("table");
        }
        let (extent, table) = match placed {
            Ok(placed) => placed,
            Err(error) => {
                self.pools[at].idle.append(&mut queues);
                return Err(error);
            }
        };
        let pool = &mut self.pools[at];
        let window = match region {
            Region::Whole => None,
            // check_slice put it on whole blocks (whole sectors, then).
            _ => extent
                .sectors()
                .map(|(start, sectors)| (start, SharedCapacity::new(sectors))),
        };
        let mut idle = Vec::with_capacity(queues.len());
        for queue in queues {
            let queue = match &window {
                None => Ok(DeviceQueue::whole(queue)),
                Some((start, capacity)) => DeviceQueue::slice(queue, *start, capacity),
            };
            match queue {
                Ok(queue) => idle.push(queue),
                Err((queue, error)) => {
                    pool.idle.push(queue);
                    pool.idle
                        .extend(idle.into_iter().map(DeviceQueue::into_device));
                    return Err(DiskError::Slice {
                        spec: spec.into(),
                        error,
                    });
                }
            }
        }
        let description = match region {
            Region::Whole => pool.description.clone(),
            _ => format!("{extent} of {}", pool.description),
        };
        let bounced_bytes = pool.bounced_bytes.clone();
        let device_model = pool.device_model;
        let geometry = idle.first().map_or(geometry, |q| q.geometry());
        if let Err(error) = self.claim(spec, device, extent, table) {
            self.pools[at]
                .idle
                .extend(idle.into_iter().map(DeviceQueue::into_device));
            return Err(error);
        }
        Ok(OpenDevice {
            device,
            extent,
            capacity: window.map(|(_, capacity)| capacity),
            description,
            geometry,
            opened: idle.len(),
            idle,
            bounced_bytes,
            device_model,
        })
    }

    /// Claims `extent` of `device` for the disk `spec` names (found by the partition
    /// table in `table`), unless another disk is in its way (`check_free`).
    fn claim(
        &mut self,
        spec: &str,
        device: DeviceId,
        extent: Extent,
        table: Option<Extent>,
    ) -> Result<(), DiskError> {
        self.check_free(spec, device, extent, table)?;
        // Nothing is in the way (checked just now): the claim holds.
        let claimed = self
            .serving
            .claim(device, extent, table, spec.into())
            .is_ok();
        debug_assert!(claimed);
        Ok(())
    }

    /// Refuses `extent` of `device` (found by the partition table in `table`) if a disk
    /// serves bytes of it, or of its table, or it covers the table a disk serving was
    /// found by (a guest there could rewrite the table, and the next lookup of a
    /// partition would find whatever it says: another guest's data).
    fn check_free(
        &self,
        spec: &str,
        device: DeviceId,
        extent: Extent,
        table: Option<Extent>,
    ) -> Result<(), DiskError> {
        let Some(Conflict { kind, claim }) = self.serving.conflict(&device, extent, table) else {
            return Ok(());
        };
        let serving = claim.owner.clone();
        Err(match (kind, claim.table, table) {
            (ConflictKind::CoversTable, Some(table), _) => DiskError::CoversTable {
                spec: spec.into(),
                extent,
                serving,
                table,
            },
            (ConflictKind::TableCovered, _, Some(table)) => DiskError::TableCovered {
                spec: spec.into(),
                table,
                serving,
                serving_extent: claim.extent,
            },
            _ => {
                let device_bytes = self
                    .pools
                    .iter()
                    .find(|p| p.device == device)
                    .map_or(0, |p| {
                        p.geometry.sectors.saturating_mul(blkdev::SECTOR_SIZE)
                    });
                let whole = |e: Extent| e.start() == 0 && e.len() == device_bytes;
                DiskError::Overlaps {
                    spec: spec.into(),
                    extent,
                    whole: whole(extent),
                    serving,
                    serving_extent: claim.extent,
                    serving_whole: whole(claim.extent),
                }
            }
        })
    }

    /// The pool of `device`, which is opened now if it never was (then `true`).
    fn pool(
        &mut self,
        spec: &str,
        device: DeviceId,
        passed_through: &[PciAddress],
    ) -> Result<(usize, bool), DiskError> {
        if let Some(at) = self.pools.iter().position(|p| p.device == device) {
            return Ok((at, false));
        }
        let cpus = crate::smp::online_count().max(1);
        let wanted = match device {
            DeviceId::Nvme { .. } | DeviceId::NvmeTcp { .. } => cpus,
            DeviceId::Virtio { .. } => cpus * VIRTIO_QUEUES_PER_CPU,
        };
        let opened = self.open_queues(spec, device, wanted, passed_through)?;
        let geometry = opened
            .queues
            .first()
            .map(|q| q.geometry())
            .ok_or_else(|| DiskError::NoQueue { spec: spec.into() })?;
        self.pools.push(Pool {
            device,
            description: opened.description,
            geometry,
            made: opened.queues.len(),
            idle: opened.queues,
            bounced_bytes: opened.bounced_bytes,
            device_model: opened.device_model,
        });
        Ok((self.pools.len() - 1, true))
    }

    /// Up to one queue per vCPU of pool `at`: idle ones (`fresh`: just made), or new
    /// ones from an NVMe controller when there are none.
    fn take_queues(
        &mut self,
        at: usize,
        fresh: bool,
        spec: &str,
        device: DeviceId,
        passed_through: &[PciAddress],
    ) -> Result<Vec<Queue>, DiskError> {
        let cpus = crate::smp::online_count().max(1);
        let pool = &self.pools[at];
        if pool.idle.is_empty() {
            if let DeviceId::Virtio { .. } = pool.device {
                return Err(DiskError::NoQueueLeft {
                    spec: spec.into(),
                    made: pool.made,
                });
            }
            let opened = self.open_queues(spec, device, cpus, passed_through)?;
            let pool = &mut self.pools[at];
            pool.made += opened.queues.len();
            pool.idle.extend(opened.queues);
        } else if !fresh {
            // The description goes last: log lines are cut at a fixed length.
            log::info!(
                "blkback: {spec} reused ({} idle queue(s) of {} made): {}",
                pool.idle.len(),
                pool.made,
                pool.description
            );
        }
        let idle = &mut self.pools[at].idle;
        Ok(idle.split_off(idle.len() - cpus.min(idle.len())))
    }

    /// `wanted` queues of `device`, opened now.
    fn open_queues(
        &mut self,
        spec: &str,
        device: DeviceId,
        wanted: usize,
        passed_through: &[PciAddress],
    ) -> Result<crate::devices::open::OpenedDisk, DiskError> {
        if let DeviceId::NvmeTcp { remote } = device {
            let net = self
                .net
                .as_mut()
                .map_err(|_| DiskError::NoQueue { spec: spec.into() })?;
            let queues = net.queues(remote, wanted);
            if queues.is_empty() {
                return Err(DiskError::NoRemoteQueueLeft {
                    spec: spec.into(),
                    made: nvmetcp::remote::MAX_CHANNELS,
                });
            }
            return Ok(crate::devices::open::OpenedDisk {
                description: net.describe(remote),
                queues,
                bounced_bytes: Arc::default(),
                device_model: false,
            });
        }
        let opened = self
            .devices
            .open_device(
                device,
                wanted,
                OpenOptions {
                    passed_through,
                    ..OpenOptions::default()
                },
            )
            .map_err(|error| DiskError::Device {
                spec: spec.into(),
                error,
            })?;
        if !self
            .bounce_counters
            .iter()
            .any(|c| Arc::ptr_eq(c, &opened.bounced_bytes))
        {
            self.bounce_counters.push(opened.bounced_bytes.clone());
        }
        Ok(opened)
    }
}
