//! The backing store of one vbd, as its `params` (xl's `target=`) names it: a RAM disk,
//! an NVMe namespace or a virtio-blk device. Every ring's engine drives its own device
//! queue through `DeviceQueue`, a boxed `BlockDevice`: one indirect call per submit or
//! poll (nothing next to a device round trip), no allocation and no lock per request,
//! and the engine and pollers stay one type whatever the device (an enum would have to
//! name the drivers' queue types, which live behind `devices`).

use super::error::{ConnectError, DiskError};
use crate::devices::open::{self as device_open, OpenOptions};
use crate::firmware::Firmware;
use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use backing::{parse_backing, Backing, RamName};
use blkdev::{BlockDevice, BufferAccess, Completion, Geometry, IoRequest, RamDisk, SubmitError};
use core::sync::atomic::{AtomicU64, Ordering};
use pci::PciAddress;

/// One device queue, owned by the poller that serves the ring.
pub struct DeviceQueue(Box<dyn BlockDevice + Send>);

impl BlockDevice for DeviceQueue {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }

    fn queue_depth(&self) -> usize {
        self.0.queue_depth()
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        self.0.submit(request, buffers)
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        self.0.poll_completions(sink)
    }
}

/// Room kept free next to a RAM disk for rings and engines (tens of MiB at most).
const RAM_DISK_HEADROOM: u64 = 32 << 20;

/// What firmware's ACPI tables say (PCI config access is found through them).
static FIRMWARE: spin::Once<Firmware> = spin::Once::new();

pub fn set_firmware(firmware: Firmware) {
    FIRMWARE.call_once(|| firmware);
}

/// Named RAM disks (`ram:<size>:<name>`), kept until blkdom stops. Only the control path
/// touches this, at attach.
static NAMED_RAM_DISKS: spin::Mutex<BTreeMap<RamName, RamDisk>> = spin::Mutex::new(BTreeMap::new());

/// A new RAM disk, or the named one again if it exists and no other disk uses it.
fn open_ram(bytes: u64, name: Option<RamName>) -> Result<RamDisk, DiskError> {
    let mut named = NAMED_RAM_DISKS.lock();
    if let Some((name, disk)) = name.and_then(|name| Some((name, named.get(&name)?))) {
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
    let room = crate::mm::heap_free() as u64;
    if bytes + RAM_DISK_HEADROOM > room {
        return Err(DiskError::RamDoesNotFit {
            bytes,
            free_bytes: room,
        });
    }
    let disk = RamDisk::new(bytes / blkdev::SECTOR_SIZE);
    if let Some(name) = name {
        log::info!(
            "blkback: RAM disk {name} made ({} MiB); it stays until blkdom stops",
            bytes >> 20
        );
        named.insert(name, disk.clone());
    }
    Ok(disk)
}

pub enum Disk {
    /// Each connected ring gets a fresh handle on the shared RAM.
    Ram(RamDisk),
    Device(OpenDevice),
}

/// A real disk's queues, opened once (one per vCPU at most): a ring takes one at
/// connect and gives it back when its poller releases it. While no vbd uses the device
/// they wait in `PARKED_DEVICES` for the next disk that names it (opening it again
/// would reset a controller whose queues are still live, or find a virtio device marked
/// in use).
pub struct OpenDevice {
    backing: Backing,
    description: String,
    geometry: Geometry,
    idle: Vec<DeviceQueue>,
    /// Queues opened (idle or serving).
    opened: usize,
    /// Bytes its queues copied through bounce buffers (devices/bounce.rs).
    bounced_bytes: Arc<AtomicU64>,
}

/// The bounce counters of every device opened so far (one each, shared by its queues):
/// their sum is the domain's `bounced-bytes` in `data/blkdom-pollers`. Control path only.
static BOUNCE_COUNTERS: spin::Mutex<Vec<Arc<AtomicU64>>> = spin::Mutex::new(Vec::new());

/// Bytes copied through bounce buffers by every device since blkdom started.
pub fn bounced_bytes_total() -> u64 {
    BOUNCE_COUNTERS
        .lock()
        .iter()
        .map(|counter| counter.load(Ordering::Relaxed))
        .sum()
}

/// Devices no vbd uses, with their queues. Control path only.
static PARKED_DEVICES: spin::Mutex<Vec<OpenDevice>> = spin::Mutex::new(Vec::new());

/// Devices serving a disk now (a second disk on the same namespace or virtio device
/// would let two guests write the same blocks: refused, as Linux's block hotplug script
/// refuses a device another domain has open for writing). Control path only.
static SERVING: spin::Mutex<Vec<Backing>> = spin::Mutex::new(Vec::new());

/// The parked device `backing` names, if a removed disk left it.
fn unpark(backing: Backing) -> Option<OpenDevice> {
    let mut parked = PARKED_DEVICES.lock();
    let at = parked.iter().position(|p| p.backing == backing)?;
    Some(parked.swap_remove(at))
}

impl Drop for Disk {
    /// A removed vbd's device queues (all given back by then: rings drain before their
    /// release) wait for the next disk on the same device.
    fn drop(&mut self) {
        let Disk::Device(device) = self else {
            return;
        };
        let (idle, opened) = (device.idle.len(), device.opened);
        if idle < opened {
            log::warn!(
                "blkback: {}: {} of {opened} queues were not given back",
                device.description,
                opened - idle
            );
        }
        SERVING.lock().retain(|serving| *serving != device.backing);
        if idle > 0 {
            PARKED_DEVICES.lock().push(OpenDevice {
                backing: device.backing,
                description: core::mem::take(&mut device.description),
                geometry: device.geometry,
                idle: core::mem::take(&mut device.idle),
                opened: idle,
                bounced_bytes: device.bounced_bytes.clone(),
            });
        }
    }
}

impl Disk {
    /// Makes the backing store `params` names, or says why not (the reason goes to the
    /// vbd's `hotplug-error` node and the console). `passed_through`: the PCI devices the
    /// toolstack gave this domain (the rest are emulated and need bounce buffers).
    pub fn open(params: &str, passed_through: &[PciAddress]) -> Result<Disk, DiskError> {
        // xl passes a `target=` spec through unchanged; older toolstacks prefix "phy:".
        let spec = params.strip_prefix("phy:").unwrap_or(params);
        let backing = parse_backing(spec).map_err(|e| DiskError::Params {
            params: params.into(),
            reason: e.to_string(),
        })?;
        if let Backing::Ram { bytes, name } = backing {
            return open_ram(bytes, name).map(Disk::Ram);
        }
        if SERVING.lock().contains(&backing) {
            return Err(DiskError::AlreadyServing { spec: spec.into() });
        }
        let device = Self::open_device(spec, backing, passed_through)?;
        SERVING.lock().push(backing);
        Ok(Disk::Device(device))
    }

    /// The device `backing` names: parked by an earlier disk, or opened now.
    fn open_device(
        spec: &str,
        backing: Backing,
        passed_through: &[PciAddress],
    ) -> Result<OpenDevice, DiskError> {
        if let Some(device) = unpark(backing) {
            // The description goes last: log lines are cut at a fixed length.
            log::info!(
                "blkback: {spec} reused ({} queues opened before): {}",
                device.opened,
                device.description
            );
            return Ok(device);
        }
        let cpus = crate::smp::online_count().max(1);
        let opened = device_open::open(
            backing,
            FIRMWARE.get().expect("set before serving"),
            cpus,
            OpenOptions {
                passed_through,
                ..OpenOptions::default()
            },
        )
        .map_err(|error| DiskError::Device {
            spec: spec.into(),
            error,
        })?;
        BOUNCE_COUNTERS.lock().push(opened.bounced_bytes.clone());
        let geometry = opened
            .queues
            .first()
            .map(|q| q.geometry())
            .ok_or_else(|| DiskError::NoQueue { spec: spec.into() })?;
        Ok(OpenDevice {
            backing,
            description: opened.description,
            geometry,
            opened: opened.queues.len(),
            idle: opened.queues.into_iter().map(DeviceQueue).collect(),
            bounced_bytes: opened.bounced_bytes,
        })
    }

    pub fn geometry(&self) -> Geometry {
        match self {
            Disk::Ram(disk) => disk.geometry(),
            Disk::Device(device) => device.geometry,
        }
    }

    /// Queues a frontend may connect at once (advertised as multi-queue-max-queues).
    pub fn max_queues(&self, cpus: usize) -> usize {
        match self {
            Disk::Ram(_) => cpus,
            Disk::Device(device) => device.opened.min(cpus),
        }
    }

    /// A queue for a ring of `depth` slots.
    pub fn take_queue(&mut self, depth: usize) -> Result<DeviceQueue, ConnectError> {
        match self {
            Disk::Ram(disk) => Ok(DeviceQueue(Box::new(disk.queue(depth)))),
            Disk::Device(device) => device.idle.pop().ok_or(ConnectError::AllQueuesServing {
                opened: device.opened,
            }),
        }
    }

    /// A queue a released ring hands back.
    pub fn give_back(&mut self, queue: DeviceQueue) {
        if let Disk::Device(device) = self {
            device.idle.push(queue);
        }
    }

    /// Bytes the disk's device copied through bounce buffers so far (0: straight DMA).
    pub fn bounced_bytes(&self) -> u64 {
        match self {
            Disk::Ram(_) => 0,
            Disk::Device(device) => device.bounced_bytes.load(Ordering::Relaxed),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Disk::Ram(disk) => format!("{} MiB RAM disk", disk.geometry().sectors >> 11),
            Disk::Device(device) => device.description.clone(),
        }
    }
}
