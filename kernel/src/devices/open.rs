// SPDX-License-Identifier: MIT OR Apache-2.0
//! From a backing-store name to ready device queues.

use super::error::OpenError;
use super::hal::{self, PciConfig};
use super::nvme::NvmeControllers;
use super::stopwatch;
use crate::firmware::Firmware;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use backing::names::{self, ControllerIds, NamespaceIds, NvmeName, VirtioIds, VirtioName};
use backing::{Backing, DeviceId};
use blkdev::BlockDevice;
use core::sync::atomic::AtomicU64;
use pci::{Bar, BarError, Function, Inventory, PciAddress};

pub type Queue = Box<dyn BlockDevice + Send>;

/// An opened disk: one queue per CPU that will drive it (at least one).
pub struct OpenedDisk {
    pub description: String,
    pub queues: Vec<Queue>,
    /// Bytes its device's queues copied through bounce buffers (0 for a device that DMAs
    /// straight to the guests' pages), summed over every open of the device; shown in
    /// `blkdom-stats`.
    pub bounced_bytes: Arc<AtomicU64>,
    /// Under Xen, the device model (qemu-xen in dom0) emulates the device: a command it
    /// holds also holds every grant unmap of this domain (`README`, "Device faults").
    pub device_model: bool,
}

/// Choices a caller may make when opening a disk.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions<'a> {
    /// NVMe: describe data with PRPs only, even where the controller takes SGLs (PRP
    /// breaks are then split into several commands).
    pub nvme_prp_only: bool,
    /// Drive the device through bounce buffers even where it is not needed (tests of
    /// the path emulated devices take under Xen).
    pub bounce: bool,
    /// Under Xen, the devices the toolstack passed through to this domain (where they
    /// sit on our bus); every other device is emulated by the device model.
    pub passed_through: &'a [PciAddress],
}

/// PCI configuration space and what one walk of the bus found (`pci::Inventory`: the
/// functions, and each BAR once read). Made once at boot; the bus is walked on first
/// use, and again only for a device the walk did not find. Every configuration access is
/// a VM exit, under Xen's HVM a round trip to the device model in dom0: a walk of the
/// bus is some sixty, sizing a BAR a dozen.
pub struct PciBus {
    config: PciConfig,
    inventory: Option<Inventory>,
}

impl PciBus {
    /// Clears the bus mastering of the function at `address` and reads it back (the
    /// read-back's completion comes after whatever the function wrote before it: see
    /// `hal::DmaSwitch`); `true` when it reads back off.
    #[allow(
        dead_code,
        reason = "the jump calls it (not built yet: docs/design.md §4.12)"
    )]
    pub fn bus_mastering_off(&self, address: PciAddress) -> bool {
        let access = self.config.access();
        pci::update_command(access, address, 0, pci::COMMAND_BUS_MASTER);
        let command = access.read16(address, pci::REG_COMMAND);
        command != u16::MAX && command & pci::COMMAND_BUS_MASTER == 0
    }

    /// Through the MCFG's ECAM window, or ports 0xCF8/0xCFC without one (says which).
    pub fn new(firmware: &Firmware) -> PciBus {
        PciBus {
            config: PciConfig::from_mcfg(firmware.ecam),
            inventory: None,
        }
    }

    pub fn config(&self) -> &PciConfig {
        &self.config
    }

    /// What the walk found, the bus walked now if it never was.
    fn inventory(&mut self) -> &mut Inventory {
        let config = self.config;
        self.inventory.get_or_insert_with(|| {
            let before = hal::config_accesses();
            let inventory = Inventory::walk(config.access(), config.first_bus());
            log_functions(&inventory);
            log::info!(
                "pci: {} functions on the bus ({} configuration accesses); kept",
                inventory.functions().count(),
                hal::config_accesses() - before
            );
            inventory
        })
    }

    /// The `index`-th function `wanted` accepts, in bus order (bridges followed): from
    /// what the walk found, or, when it has fewer, from one more walk.
    pub fn find(&mut self, wanted: fn(&Function) -> bool, index: usize) -> Option<Function> {
        let config = self.config;
        let inventory = self.inventory();
        let walks = inventory.walks();
        let found = inventory.find(config.access(), wanted, index);
        if inventory.walks() != walks {
            log::info!(
                "pci: walked the bus again for a device the first walk did not find: {}",
                if found.is_some() {
                    "found"
                } else {
                    "not there"
                }
            );
            log_functions(inventory);
        }
        found
    }

    /// BAR `index` of `function`, read and sized once.
    pub fn bar(&mut self, function: &Function, index: u8) -> Result<Option<Bar>, BarError> {
        let config = self.config;
        self.inventory()
            .bar(config.access(), function.address, index)
    }

    /// The address of every assigned memory BAR of every device (read without sizing).
    pub fn memory_bar_addresses(&mut self) -> Vec<u64> {
        let config = self.config;
        self.inventory().memory_bar_addresses(config.access())
    }

    /// Every function found (the bus walked now if it never was).
    pub fn functions(&mut self) -> Vec<Function> {
        self.inventory().functions().copied().collect()
    }
}

fn log_functions(inventory: &Inventory) {
    for function in inventory.functions() {
        log::debug!(
            "pci: {} {:04x}:{:04x} class {:02x}.{:02x}.{:02x}",
            function.address,
            function.vendor_id,
            function.device_id,
            function.class,
            function.subclass,
            function.prog_if
        );
    }
}

/// The PCI devices opened so far, owned by whoever opens disks (the control path's
/// device registry, or the disk test): what must be done once per device is done once.
pub struct Devices {
    pub(super) bus: PciBus,
    /// Brought up once, then shared by every disk on them.
    pub(super) nvme: NvmeControllers,
    /// Virtio devices brought up by `prepare`, their queues waiting for the device's
    /// first disk (without bounce buffers yet: whether it needs them is decided then).
    prepared_virtio: Vec<(PciAddress, OpenedDisk)>,
    /// Virtio devices in use: one disk each (opening one again would reset it).
    virtio_in_use: Vec<PciAddress>,
    /// Every virtio device brought up (prepared or in use): kept to recover it when a
    /// request times out, and to reset it at shutdown.
    pub(super) virtio: Vec<(PciAddress, virtio::VirtioBlk<hal::DeviceHal>)>,
    /// What each virtio device brought up answered GET_ID with (`None`: nothing).
    virtio_ids: Vec<(PciAddress, Option<super::virtio::DeviceId>)>,
    /// Devices whose bring-up at boot failed, and why (for the listing).
    failed: Vec<(PciAddress, String)>,
    /// How a device whose command times out recovers.
    recovery: cmdslots::RecoveryConfig,
    /// Each device's bounce counter, shared by every open of it (an NVMe controller is
    /// opened once per disk on it).
    bounce_counters: Vec<(PciAddress, Arc<AtomicU64>)>,
}

impl Devices {
    /// The devices on `bus`, each to recover as `recovery` says when a command of it
    /// times out (`recover`, run by their owner).
    pub fn new(bus: PciBus, recovery: cmdslots::RecoveryConfig) -> Devices {
        Devices {
            bus,
            nvme: NvmeControllers::new(recovery),
            prepared_virtio: Vec::new(),
            virtio_in_use: Vec::new(),
            virtio: Vec::new(),
            virtio_ids: Vec::new(),
            failed: Vec::new(),
            recovery,
            bounce_counters: Vec::new(),
        }
    }

    /// Runs every device's recovery step (an abort to send, a reset once its queues are
    /// quiet, giving it up), at `now` (ns, the pollers' clock): what a queue asked
    /// since, through `RECOVERY_WANTED`. Returns the earliest time one wants its next
    /// step. Blocks while a device resets.
    pub fn recover(&mut self, now: u64) -> Option<u64> {
        let mut due = self.nvme.recover(now);
        for (address, device) in &mut self.virtio {
            if let Some(at) = super::log_recovery(*address, device.recover(now)) {
                due = Some(due.map_or(at, |d: u64| d.min(at)));
            }
        }
        due
    }

    /// The bounce counter of the device at `address`.
    fn bounce_counter(&mut self, address: PciAddress) -> Arc<AtomicU64> {
        if let Some((_, counter)) = self.bounce_counters.iter().find(|(a, _)| *a == address) {
            return counter.clone();
        }
        let counter = Arc::<AtomicU64>::default();
        self.bounce_counters.push((address, counter.clone()));
        counter
    }

    /// Opens `backing` with up to `wanted_queues` queues (the self-tests' way; the
    /// registry resolves and opens in two steps, sharing a device's pool between names).
    #[cfg(feature = "test-hooks")]
    pub fn open(
        &mut self,
        backing: Backing,
        wanted_queues: usize,
        options: OpenOptions<'_>,
    ) -> Result<OpenedDisk, OpenError> {
        let wanted_queues = wanted_queues.max(1);
        match backing {
            Backing::Ram { bytes, .. } => {
                // The registry opens the vbds' RAM disks itself; this is the self-tests'.
                let sectors = bytes / blkdev::SECTOR_SIZE;
                let disk = blkdev::RamDisk::try_new(
                    blkdev::RamDisk::plain(sectors),
                    sectors,
                    None,
                    Some(&crate::mm::DISK_MEMORY),
                )
                .map_err(|_| OpenError::RamDoesNotFit { bytes })?;
                Ok(OpenedDisk {
                    description: format!("RAM disk of {} KiB", bytes / 1024),
                    queues: (0..wanted_queues)
                        .map(|_| Box::new(disk.queue(32)) as Queue)
                        .collect(),
                    bounced_bytes: Arc::default(),
                    device_model: false,
                })
            }
            Backing::Nvme { .. } | Backing::Virtio { .. } => {
                let device = self.resolve(&backing)?;
                self.open_device(device, wanted_queues, options)
            }
            // The registry opens remote namespaces itself, over the network.
            Backing::NvmeTcp { .. } => Err(OpenError::NoDevice),
        }
    }

    /// The function at `address`, if the walk found one `wanted` accepts there.
    fn function_at(
        &mut self,
        address: PciAddress,
        wanted: fn(&Function) -> bool,
    ) -> Option<Function> {
        self.bus
            .functions()
            .into_iter()
            .find(|f| f.address == address && wanted(f))
    }

    /// The device (where it sits) a device `backing` names, by what each device said at
    /// its bring-up (`backing::names`): the positional forms by bus order as before
    /// (the bus walked again for a device the walk did not find), the stable ones by
    /// serial, NGUID, EUI-64 or address. A RAM disk names none.
    pub fn resolve(&mut self, backing: &Backing) -> Result<DeviceId, OpenError> {
        match *backing {
            Backing::Ram { .. } | Backing::NvmeTcp { .. } => Err(OpenError::NoDevice),
            Backing::Nvme {
                name: NvmeName::First { nsid },
                ..
            } => {
                let function = self
                    .bus
                    .find(Function::is_nvme, 0)
                    .ok_or(OpenError::NoNvme)?;
                Ok(DeviceId::Nvme {
                    controller: function.address,
                    nsid,
                })
            }
            Backing::Nvme { name, .. } => {
                let functions = self.functions(Function::is_nvme);
                let known: Vec<(PciAddress, Option<&str>, Vec<NamespaceIds>)> = functions
                    .iter()
                    .map(|&address| match self.nvme.identified(address) {
                        Some((identity, namespaces)) => (
                            address,
                            names::nvme_serial(&identity.serial),
                            namespaces.iter().map(namespace_ids).collect(),
                        ),
                        None => (address, None, Vec::new()),
                    })
                    .collect();
                let controllers: Vec<ControllerIds<'_>> = known
                    .iter()
                    .map(|(address, serial, namespaces)| ControllerIds {
                        address: *address,
                        serial: *serial,
                        namespaces,
                    })
                    .collect();
                let (controller, nsid) =
                    names::resolve_nvme(&name, &controllers).map_err(OpenError::Name)?;
                Ok(DeviceId::Nvme { controller, nsid })
            }
            Backing::Virtio {
                name: VirtioName::Index(index),
                ..
            } => {
                let function = self
                    .bus
                    .find(Function::is_virtio_blk, index as usize)
                    .ok_or(OpenError::NoVirtio { index })?;
                Ok(DeviceId::Virtio {
                    device: function.address,
                })
            }
            Backing::Virtio { name, .. } => {
                let functions = self.functions(Function::is_virtio_blk);
                let devices: Vec<VirtioIds<'_>> = functions
                    .iter()
                    .map(|&address| VirtioIds {
                        address,
                        serial: self
                            .virtio_ids
                            .iter()
                            .find(|(a, _)| *a == address)
                            .and_then(|(_, id)| id.as_ref())
                            .and_then(names::virtio_serial),
                    })
                    .collect();
                let device = names::resolve_virtio(&name, &devices).map_err(OpenError::Name)?;
                Ok(DeviceId::Virtio { device })
            }
        }
    }

    /// The addresses of the functions `wanted` accepts, in bus order.
    fn functions(&mut self, wanted: fn(&Function) -> bool) -> Vec<PciAddress> {
        self.bus
            .functions()
            .iter()
            .filter(|f| wanted(f))
            .map(|f| f.address)
            .collect()
    }

    /// Opens `device` (from `resolve`) with up to `wanted_queues` queues.
    pub fn open_device(
        &mut self,
        device: DeviceId,
        wanted_queues: usize,
        options: OpenOptions<'_>,
    ) -> Result<OpenedDisk, OpenError> {
        let wanted_queues = wanted_queues.max(1);
        match device {
            DeviceId::NvmeTcp { .. } => Err(OpenError::NoDevice),
            DeviceId::Nvme { controller, nsid } => {
                let function =
                    self.function_at(controller, Function::is_nvme)
                        .ok_or(OpenError::Name(names::NameError::NotAt {
                            kind: "NVMe controller",
                            address: controller,
                        }))?;
                stopwatch::lap("scan");
                let emulated = emulated_under_xen(&function, &options);
                let mut disk =
                    self.nvme
                        .open(&mut self.bus, function, nsid, wanted_queues, &options)?;
                disk.bounced_bytes = self.bounce_counter(function.address);
                disk.device_model = emulated;
                with_bounce(disk, options.bounce || emulated)
            }
            DeviceId::Virtio { device } => {
                let function =
                    self.function_at(device, Function::is_virtio_blk)
                        .ok_or(OpenError::Name(names::NameError::NotAt {
                            kind: "virtio-blk",
                            address: device,
                        }))?;
                stopwatch::lap("scan");
                let emulated = emulated_under_xen(&function, &options);
                if self.virtio_in_use.contains(&function.address) {
                    return Err(OpenError::VirtioInUse(function.address));
                }
                let prepared = self
                    .prepared_virtio
                    .iter()
                    .position(|(address, _)| *address == function.address);
                let mut disk = match prepared {
                    Some(at) => self.prepared_virtio.swap_remove(at).1,
                    None => {
                        let (disk, device, id) = super::virtio::open(
                            &mut self.bus,
                            function,
                            wanted_queues,
                            self.recovery,
                        )?;
                        self.virtio.push((function.address, device));
                        self.virtio_ids.push((function.address, id));
                        disk
                    }
                };
                self.virtio_in_use.push(function.address);
                disk.bounced_bytes = self.bounce_counter(function.address);
                disk.device_model = emulated;
                with_bounce(disk, options.bounce || emulated)
            }
        }
    }

    /// Brings up, before any disk names them, the devices a disk can name: the first
    /// NVMe controller (reset, admin queue, identify, the I/O queue pairs it grants; a
    /// namespace's queues are made when a disk opens it) and every virtio-blk device
    /// (with `virtio_queues` virtqueues). Each register and configuration access is a VM
    /// exit, under Xen's HVM a round trip to the device model, so on a loaded host opening
    /// an emulated disk at attach can outlast the 10 s libxl gives a backend to reach
    /// InitWait. Done here, at boot, the attach takes queues. A device that fails here is
    /// left as it was: its first disk opens it again, and fails or not as it always did
    /// (the reason to its vbd's error nodes).
    pub fn prepare(&mut self, virtio_queues: usize) {
        let functions = self.bus.functions();
        for nvme in functions.iter().filter(|f| f.is_nvme()) {
            stopwatch::start();
            let done = self.nvme.prepare(&mut self.bus, nvme);
            if let Err(error) = &done {
                self.failed.push((nvme.address, format!("{error}")));
            }
            log_prepared(nvme, "NVMe controller", done.err());
        }
        for virtio in functions.iter().filter(|f| f.is_virtio_blk()) {
            stopwatch::start();
            match super::virtio::open(&mut self.bus, *virtio, virtio_queues, self.recovery) {
                Ok((disk, device, id)) => {
                    self.prepared_virtio.push((virtio.address, disk));
                    self.virtio.push((virtio.address, device));
                    self.virtio_ids.push((virtio.address, id));
                    log_prepared(virtio, "virtio-blk device", None);
                }
                Err(error) => {
                    self.failed.push((virtio.address, format!("{error}")));
                    log_prepared(virtio, "virtio-blk device", Some(error));
                }
            }
        }
        for line in self.listing() {
            log::info!("device: {line}");
        }
        self.warn_duplicates();
    }

    /// Devices that give the same serial: a name by it reaches neither (refused at the
    /// attach, as ambiguous); said once at boot.
    fn warn_duplicates(&mut self) {
        let nvme: Vec<(PciAddress, Option<&str>)> = self
            .functions(Function::is_nvme)
            .into_iter()
            .map(|a| {
                let serial = self
                    .nvme
                    .identified(a)
                    .and_then(|(identity, _)| names::nvme_serial(&identity.serial));
                (a, serial)
            })
            .collect();
        for (serial, first, second) in names::duplicate_serials(&nvme) {
            log::error!(
                "nvme {first} and {second} both have serial \"{serial}\": nvme:serial={serial} is refused; name them by address (nvme@<bb:dd.f>) or namespace id"
            );
        }
        let virtio: Vec<(PciAddress, Option<&str>)> = self
            .virtio_ids
            .iter()
            .map(|(a, id)| (*a, id.as_ref().and_then(names::virtio_serial)))
            .collect();
        for (serial, first, second) in names::duplicate_serials(&virtio) {
            log::error!(
                "virtio-blk {first} and {second} both have serial \"{serial}\": virtio:serial={serial} is refused; name them by address (virtio@<bb:dd.f>)"
            );
        }
    }

    /// One line per device on the bus blkdom drives, with the names that reach it
    /// (`pci=00:04.0 kind=nvme serial=SN ... model=...`; each NVMe namespace on its own
    /// line after its controller's, `ns=<nsid> ...`): what `data/blkdom-devices`
    /// publishes and the console shows at boot.
    pub fn listing(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        for address in self.functions(Function::is_nvme) {
            let failed = self.failed.iter().find(|(a, _)| *a == address);
            match (self.nvme.identified(address), failed) {
                (Some((identity, namespaces)), _) => {
                    let serial = names::nvme_serial(&identity.serial);
                    lines.push(format!(
                        "pci={address} kind=nvme state=up serial={} namespaces={} model={}",
                        serial.unwrap_or("-"),
                        namespaces.len(),
                        identity.model_str()
                    ));
                    for ns in namespaces {
                        let ids = namespace_ids(ns);
                        lines.push(format!(
                            "pci={address} ns={} bytes={} block={} nguid={} eui64={}",
                            ns.nsid,
                            ns.blocks.saturating_mul(u64::from(ns.block_size)),
                            ns.block_size,
                            hex_or_dash(&ids.nguid),
                            hex_or_dash(&ids.eui64)
                        ));
                    }
                }
                (None, Some((_, why))) => lines.push(format!(
                    "pci={address} kind=nvme state=failed serial=- namespaces=0 model=- error={why}"
                )),
                (None, None) => lines.push(format!(
                    "pci={address} kind=nvme state=down serial=- namespaces=0 model=-"
                )),
            }
        }
        for address in self.functions(Function::is_virtio_blk) {
            let id = self.virtio_ids.iter().find(|(a, _)| *a == address);
            let failed = self.failed.iter().find(|(a, _)| *a == address);
            match (id, failed) {
                (Some((_, id)), _) => {
                    let bytes = self
                        .prepared_virtio
                        .iter()
                        .find(|(a, _)| *a == address)
                        .and_then(|(_, disk)| disk.queues.first())
                        .map(|q| q.geometry().sectors * blkdev::SECTOR_SIZE);
                    let bytes = bytes.map_or(String::from("-"), |b| format!("{b}"));
                    lines.push(format!(
                        "pci={address} kind=virtio state=up serial={} bytes={bytes}",
                        id.as_ref().and_then(names::virtio_serial).unwrap_or("-"),
                    ));
                }
                (None, Some((_, why))) => lines.push(format!(
                    "pci={address} kind=virtio state=failed serial=- bytes=- error={why}"
                )),
                (None, None) => lines.push(format!(
                    "pci={address} kind=virtio state=down serial=- bytes=-"
                )),
            }
        }
        lines
    }
}

/// What names a namespace, as `backing::names` compares it.
fn namespace_ids(ns: &nvme::NamespaceIdentity) -> NamespaceIds {
    NamespaceIds {
        nsid: ns.nsid,
        nguid: ns.nguid,
        eui64: ns.eui64,
    }
}

/// An id in hex, or `-` when absent (all zeros).
fn hex_or_dash(id: &[u8]) -> String {
    if id.iter().all(|&b| b == 0) {
        String::from("-")
    } else {
        format!("{}", names::Hex(id))
    }
}

impl Devices {
    /// Every device brought up, named by what stopping it does: NVMe controllers by
    /// their shutdown notification, virtio devices by a reset.
    pub(super) fn stoppable(&mut self) -> Vec<(String, &mut dyn blkdev::shutdown::Stop)> {
        let mut devices: Vec<(String, &mut dyn blkdev::shutdown::Stop)> = Vec::new();
        for (address, controller) in self.nvme.iter_mut() {
            devices.push((format!("nvme {address}: shutdown notification"), controller));
        }
        for (address, device) in &mut self.virtio {
            devices.push((format!("virtio-blk {address}: reset"), device));
        }
        devices
    }
}

/// Says how the bring-up of `function` at boot went (with the stopwatch's figures).
fn log_prepared(function: &Function, what: &str, error: Option<OpenError>) {
    let cost = stopwatch::finish();
    let cost = cost.as_ref().map_or(&"" as &dyn core::fmt::Display, |c| c);
    match error {
        None => log::info!(
            "pci {}: {what} brought up at boot, before any disk: {cost}",
            function.address
        ),
        Some(error) => log::warn!(
            "pci {}: {what} not brought up at boot ({error}): its first disk tries again; {cost}",
            function.address
        ),
    }
}

/// Under Xen, whether the device model (qemu-xen) emulates this device rather than the
/// toolstack passing it through. An emulated device's DMA goes through QEMU's map of guest
/// RAM, which covers only the RAM ranges, while foreign grants are mapped in the
/// memory-map hole above RAM (main::grant_map_hole): without bounce buffers requests
/// complete, but writes store whatever QEMU's bounce buffer held and reads land nowhere
/// (tests/xen/blkdom-hvm). Such a device is driven through bounce buffers in RAM
/// (devices/bounce.rs). A passed-through device DMAs through the IOMMU, whose tables map
/// every guest-physical page of the domain, grant mappings included
/// (tests/xen/blkdom-passthrough): straight to the guest's pages. The device's ids do not
/// tell the two apart (the nested rig passes through the same QEMU NVMe that qemu-xen
/// emulates); where it came from does. (Plain QEMU, no Xen: nothing is grant-mapped; the
/// disk tests drive every device directly.)
fn emulated_under_xen(function: &Function, options: &OpenOptions<'_>) -> bool {
    let emulated =
        crate::xen_domain::get().is_some() && !options.passed_through.contains(&function.address);
    log::info!(
        "pci {} {:04x}:{:04x}: {}",
        function.address,
        function.vendor_id,
        function.device_id,
        if crate::xen_domain::get().is_none() {
            "driven directly (no Xen)"
        } else if emulated {
            "emulated by the device model: through bounce buffers"
        } else {
            "passed through: DMA straight to the guests' granted pages"
        }
    );
    emulated
}

/// Puts every queue of `disk` behind bounce buffers when `bounce` says so.
fn with_bounce(disk: OpenedDisk, bounce: bool) -> Result<OpenedDisk, OpenError> {
    if !bounce {
        return Ok(disk);
    }
    let bounced_bytes = disk.bounced_bytes.clone();
    let queues = disk
        .queues
        .into_iter()
        .map(|queue| {
            super::bounce::new(queue, bounced_bytes.clone())
                .map(|q| Box::new(q) as Queue)
                .ok_or(OpenError::NoBounceMemory)
        })
        .collect::<Result<Vec<_>, _>>()?;
    stopwatch::lap("bounce");
    Ok(OpenedDisk {
        description: format!(
            "{} (emulated by the device model: through bounce buffers, {} KiB per queue)",
            disk.description,
            super::bounce::POOL_PAGES * 4
        ),
        queues,
        bounced_bytes,
        device_model: disk.device_model,
    })
}

/// Physical address and size of memory BAR `index` of `function`.
pub(super) fn memory_bar(
    bus: &mut PciBus,
    function: &Function,
    index: u8,
) -> Result<(u64, u64), OpenError> {
    let device = function.address;
    let bar = bus
        .bar(function, index)
        .map_err(|error| OpenError::BarUnreadable {
            device,
            bar: index,
            error,
        })?;
    match bar {
        Some(Bar::Memory { address: 0, .. }) => {
            Err(OpenError::BarUnassigned { device, bar: index })
        }
        Some(Bar::Memory { address, size, .. }) => Ok((address, size)),
        found => Err(OpenError::BarNotMemory {
            device,
            bar: index,
            found,
        }),
    }
}

/// Maps `len` bytes at `offset` of memory BAR `index` of `function` uncached (only the
/// registers a driver uses: some BARs are huge); returns the virtual address of
/// `offset`.
pub fn map_memory_bar(
    bus: &mut PciBus,
    function: &Function,
    index: u8,
    offset: u64,
    len: u64,
) -> Result<hal::MmioWindow, OpenError> {
    let device = function.address;
    let (address, size) = memory_bar(bus, function, index)?;
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(OpenError::WindowOutsideBar {
            device,
            bar: index,
            offset,
            len,
            size,
        });
    }
    hal::map_mmio(address + offset, len).map_err(|error| OpenError::BarNotMapped {
        device,
        bar: index,
        error,
    })
}
