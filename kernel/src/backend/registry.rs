//! The device registry: every disk and device the control path has made, and what stays
//! of them after their vbd is gone. Owned by `Control` (vCPU 0), handed by `&mut` to the
//! code that opens or releases disks; nothing here is reached from the pollers.
//!
//! - Named RAM disks (`ram:<size>:<name>`) outlive their vbd: the next vbd naming one
//!   gets the same data.
//! - A removed vbd's device queues are parked, and the next disk on the same device
//!   takes them (opening it again would reset a controller whose queues are still live,
//!   or find a virtio device in use).
//! - A device serving one disk refuses a second (two guests would write the same blocks;
//!   Linux's block hotplug script likewise refuses a device another domain has open for
//!   writing).
//! - Each device's bounce counter is kept: their sum is the domain's `bounced-bytes`.
//! - The PCI devices themselves (`devices::open::Devices`): an NVMe controller is
//!   brought up once and then shared by its namespaces, a virtio device opened once.

use super::disk::{DeviceQueue, Disk, OpenDevice};
use super::error::DiskError;
use crate::devices::open::{Devices, OpenOptions};
use crate::firmware::Firmware;
use alloc::collections::BTreeMap;
use alloc::string::ToString;
use alloc::sync::Arc;
use alloc::vec::Vec;
use backing::{parse_backing, Backing, RamName, Region};
use blkdev::RamDisk;
use core::sync::atomic::{AtomicU64, Ordering};
use pci::PciAddress;

/// Room kept free next to a RAM disk for rings and engines (tens of MiB at most).
const RAM_DISK_HEADROOM: u64 = 32 << 20;

pub struct Registry {
    /// Named RAM disks, kept until blkdom stops.
    ram_disks: BTreeMap<RamName, RamDisk>,
    /// Devices no vbd uses, with their queues.
    parked: Vec<OpenDevice>,
    /// Devices serving a disk now.
    serving: Vec<Backing>,
    /// The bounce counter of every device opened so far (one each, shared by its
    /// queues).
    bounce_counters: Vec<Arc<AtomicU64>>,
    devices: Devices,
}

impl Registry {
    pub fn new(firmware: Firmware) -> Registry {
        Registry {
            ram_disks: BTreeMap::new(),
            parked: Vec::new(),
            serving: Vec::new(),
            bounce_counters: Vec::new(),
            devices: Devices::new(firmware),
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
        if let Backing::Ram { bytes, name } = backing {
            return self.open_ram(bytes, name).map(Disk::Ram);
        }
        if backing
            .device()
            .is_some_and(|(_, region)| region != Region::Whole)
        {
            return Err(DiskError::Params {
                params: params.into(),
                reason: "slices of a device are not served yet".into(),
            });
        }
        if self.serving.contains(&backing) {
            return Err(DiskError::AlreadyServing { spec: spec.into() });
        }
        let device = self.open_device(spec, backing, passed_through)?;
        self.serving.push(backing);
        Ok(Disk::Device(device))
    }

    /// Takes back the disk of a vbd that is gone. A device's queues (all given back by
    /// then: rings drain before their release) wait for the next disk on the same
    /// device.
    pub fn release(&mut self, disk: Disk) {
        let Disk::Device(mut device) = disk else {
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
        self.serving.retain(|serving| *serving != device.backing);
        if idle > 0 {
            device.opened = idle;
            self.parked.push(device);
        }
    }

    /// Bytes copied through bounce buffers by every device since blkdom started.
    pub fn bounced_bytes_total(&self) -> u64 {
        self.bounce_counters
            .iter()
            .map(|counter| counter.load(Ordering::Relaxed))
            .sum()
    }

    /// A new RAM disk, or the named one again if it exists and no other disk uses it.
    fn open_ram(&mut self, bytes: u64, name: Option<RamName>) -> Result<RamDisk, DiskError> {
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
            self.ram_disks.insert(name, disk.clone());
        }
        Ok(disk)
    }

    /// The device `backing` names: parked by an earlier disk, or opened now.
    fn open_device(
        &mut self,
        spec: &str,
        backing: Backing,
        passed_through: &[PciAddress],
    ) -> Result<OpenDevice, DiskError> {
        if let Some(at) = self.parked.iter().position(|p| p.backing == backing) {
            let device = self.parked.swap_remove(at);
            // The description goes last: log lines are cut at a fixed length.
            log::info!(
                "blkback: {spec} reused ({} queues opened before): {}",
                device.opened,
                device.description
            );
            return Ok(device);
        }
        let cpus = crate::smp::online_count().max(1);
        let opened = self
            .devices
            .open(
                backing,
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
        self.bounce_counters.push(opened.bounced_bytes.clone());
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
}
