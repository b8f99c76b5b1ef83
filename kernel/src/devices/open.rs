//! From a backing-store name to ready device queues.

use super::error::OpenError;
use super::hal::{self, PciConfig};
use super::nvme::NvmeControllers;
use crate::firmware::Firmware;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use backing::Backing;
use blkdev::BlockDevice;
use core::sync::atomic::AtomicU64;
use pci::{Bar, Function, PciAddress};

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

/// The PCI devices opened so far, owned by whoever opens disks (the control path's
/// device registry, or the disk test): what must be done once per device is done once.
pub struct Devices {
    /// Where PCI configuration space is (the MCFG's ECAM window).
    firmware: Firmware,
    /// Brought up once, then shared by every disk on them.
    nvme: NvmeControllers,
    /// Virtio devices in use: one disk each (opening one again would reset it).
    virtio_in_use: Vec<PciAddress>,
    /// Each device's bounce counter, shared by every open of it (an NVMe controller is
    /// opened once per disk on it).
    bounce_counters: Vec<(PciAddress, Arc<AtomicU64>)>,
}

impl Devices {
    pub fn new(firmware: Firmware) -> Devices {
        Devices {
            firmware,
            nvme: NvmeControllers::default(),
            virtio_in_use: Vec::new(),
            bounce_counters: Vec::new(),
        }
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

    /// Opens `backing` with up to `wanted_queues` queues.
    pub fn open(
        &mut self,
        backing: Backing,
        wanted_queues: usize,
        options: OpenOptions<'_>,
    ) -> Result<OpenedDisk, OpenError> {
        let wanted_queues = wanted_queues.max(1);
        match backing {
            Backing::Ram { bytes, .. } => {
                let disk = blkdev::RamDisk::new(bytes / blkdev::SECTOR_SIZE);
                Ok(OpenedDisk {
                    description: format!("RAM disk of {} KiB", bytes / 1024),
                    queues: (0..wanted_queues)
                        .map(|_| Box::new(disk.queue(32)) as Queue)
                        .collect(),
                    bounced_bytes: Arc::default(),
                    device_model: false,
                })
            }
            Backing::Nvme { nsid, .. } => {
                let pci = PciConfig::from_mcfg(self.firmware.ecam);
                let function = find(&pci, Function::is_nvme, 0).ok_or(OpenError::NoNvme)?;
                let emulated = emulated_under_xen(&function, &options);
                let mut disk = self
                    .nvme
                    .open(&pci, function, nsid, wanted_queues, &options)?;
                disk.bounced_bytes = self.bounce_counter(function.address);
                disk.device_model = emulated;
                with_bounce(disk, options.bounce || emulated)
            }
            Backing::Virtio { index, .. } => {
                let pci = PciConfig::from_mcfg(self.firmware.ecam);
                let function = find(&pci, Function::is_virtio_blk, index as usize)
                    .ok_or(OpenError::NoVirtio { index })?;
                let emulated = emulated_under_xen(&function, &options);
                if self.virtio_in_use.contains(&function.address) {
                    return Err(OpenError::VirtioInUse(function.address));
                }
                let mut disk = super::virtio::open(&pci, function, wanted_queues)?;
                self.virtio_in_use.push(function.address);
                disk.bounced_bytes = self.bounce_counter(function.address);
                disk.device_model = emulated;
                with_bounce(disk, options.bounce || emulated)
            }
        }
    }
}

/// Under Xen, whether the device model (qemu-xen) emulates this device rather than the
/// toolstack passing it through. An emulated device's DMA goes through QEMU's map of guest
/// RAM, which covers only the RAM ranges, while foreign grants are mapped in the
/// memory-map hole above RAM (main::grant_map_hole). Measured in the nested rig
/// (tests/xen/blkdom-hvm) without bounce buffers: requests completed, but writes stored
/// whatever QEMU's bounce buffer held and reads landed nowhere. Such a device is driven
/// through bounce buffers in RAM (devices/bounce.rs). A passed-through device DMAs
/// through the IOMMU, whose tables map every guest-physical page of the domain, grant
/// mappings included (tests/xen/blkdom-passthrough): straight to the guest's pages. The
/// device's ids do not tell the two apart (the nested rig passes through the same QEMU
/// NVMe that qemu-xen emulates); where it came from does. (Plain QEMU, no Xen: nothing
/// is grant-mapped; the disk tests drive every device directly.)
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
            super::bounce::BounceQueue::new(queue, bounced_bytes.clone())
                .map(|q| Box::new(q) as Queue)
                .ok_or(OpenError::NoBounceMemory)
        })
        .collect::<Result<Vec<_>, _>>()?;
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

/// The `index`-th function (in bus order, bridges followed) that `wanted` accepts.
fn find(pci: &PciConfig, wanted: fn(&Function) -> bool, index: usize) -> Option<Function> {
    let mut matches = 0;
    let mut found = None;
    pci::enumerate_tree(pci.access(), pci.first_bus(), &mut |function| {
        log::debug!(
            "pci: {} {:04x}:{:04x} class {:02x}.{:02x}.{:02x}",
            function.address,
            function.vendor_id,
            function.device_id,
            function.class,
            function.subclass,
            function.prog_if
        );
        if wanted(&function) {
            if matches == index && found.is_none() {
                found = Some(function);
            }
            matches += 1;
        }
    });
    found
}

/// Every assigned memory BAR of every device (physical address, size): the MMIO that
/// guest-physical space chosen for other uses (grant mappings) must stay clear of. An
/// HVM domain has the device model's devices here; a PVH domain has no PCI bus at all.
pub fn memory_bars(firmware: &Firmware) -> Vec<(u64, u64)> {
    let pci = PciConfig::from_mcfg(firmware.ecam);
    let mut functions = Vec::new();
    pci::enumerate_tree(pci.access(), pci.first_bus(), &mut |function| {
        if function.header_type == 0 {
            functions.push(function);
        }
    });
    let mut bars = Vec::new();
    for function in functions {
        let mut index = 0;
        while index < 6 {
            match pci::read_bar(pci.access(), function.address, index) {
                Ok(Some(Bar::Memory {
                    address,
                    size,
                    wide,
                    ..
                })) => {
                    if address != 0 {
                        bars.push((address, size));
                    }
                    index += if wide { 2 } else { 1 };
                }
                _ => index += 1,
            }
        }
    }
    bars
}

/// Physical address and size of memory BAR `index` of `function`.
pub(super) fn memory_bar(
    pci: &PciConfig,
    function: &Function,
    index: u8,
) -> Result<(u64, u64), OpenError> {
    let device = function.address;
    let bar =
        pci::read_bar(pci.access(), device, index).map_err(|error| OpenError::BarUnreadable {
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
    pci: &PciConfig,
    function: &Function,
    index: u8,
    offset: u64,
    len: u64,
) -> Result<hal::MmioWindow, OpenError> {
    let device = function.address;
    let (address, size) = memory_bar(pci, function, index)?;
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
