// SPDX-License-Identifier: MIT OR Apache-2.0
//! virtio-blk over the modern PCI transport: find the capability windows, map their
//! BARs, bring the device up with one virtqueue per CPU (as many as it offers).

use super::error::OpenError;
use super::hal::{DeviceHal, DmaSwitch, MmioWindow};
use super::open::{map_memory_bar, OpenedDisk, PciBus, Queue};
use alloc::boxed::Box;
use alloc::format;
use alloc::vec::Vec;
use cmdslots::RecoveryConfig;
use pci::{Function, VirtioCap, VirtioCapKind};
use virtio::{PciRegions, VirtioBlk};

/// Virtqueue size per CPU: one descriptor per request part with indirect descriptors;
/// without them up to 18 per part, so as many as the device allows.
const QUEUE_SIZE: u16 = 128;
const QUEUE_SIZE_DIRECT: u16 = 1024;

/// Opens the virtio-blk device at `function` with up to `wanted_queues` virtqueues; the
/// device itself is kept by the caller, to recover it (`VirtioBlk::recover`) as
/// `recovery` says when a request times out, and to reset it at shutdown.
pub fn open(
    bus: &mut PciBus,
    function: Function,
    wanted_queues: usize,
    recovery: RecoveryConfig,
) -> Result<(OpenedDisk, VirtioBlk<DeviceHal>), OpenError> {
    let pci = *bus.config();
    let caps: Vec<VirtioCap> = pci::virtio_capabilities(pci.access(), function.address).collect();
    let first = |wanted: fn(&VirtioCapKind) -> bool| caps.iter().find(|c| wanted(&c.kind)).copied();
    let (Some(common), Some(notify), Some(device)) = (
        first(|k| matches!(k, VirtioCapKind::Common)),
        first(|k| matches!(k, VirtioCapKind::Notify { .. })),
        first(|k| matches!(k, VirtioCapKind::Device)),
    ) else {
        return Err(OpenError::VirtioLegacy(function.address));
    };
    // Each window is mapped on its own (map_memory_bar checks it lies in its BAR).
    let mut window = |cap: VirtioCap| -> Result<MmioWindow, OpenError> {
        let offset = u64::from(cap.offset);
        map_memory_bar(bus, &function, cap.bar, offset, u64::from(cap.length))
    };
    let windows = [window(common)?, window(notify)?, window(device)?];
    let regions = PciRegions {
        common: windows[0].address(),
        notify: windows[1].address(),
        notify_multiplier: match notify.kind {
            VirtioCapKind::Notify { multiplier } => multiplier,
            _ => 0,
        },
        device: windows[2].address(),
    };
    pci::enable_memory_and_dma(pci.access(), function.address);
    let fail = |step, error| OpenError::Virtio {
        device: function.address,
        step,
        error,
    };
    let switch = DmaSwitch::new(&pci, function.address);
    let mut blk = VirtioBlk::init(DeviceHal::virtio(windows, switch), regions, recovery)
        .map_err(|e| fail("bring-up", e))?;
    let config = *blk.config();
    super::stopwatch::lap("bring-up");
    let count = wanted_queues.min(usize::from(config.num_queues)).max(1);
    let mut queues: Vec<Queue> = Vec::new();
    for _ in 0..count {
        let size = if blk.indirect() {
            QUEUE_SIZE
        } else {
            QUEUE_SIZE_DIRECT
        };
        let queue = blk.create_queue(size).map_err(|e| fail("virtqueue", e))?;
        queues.push(Box::new(queue));
    }
    blk.start();
    super::stopwatch::lap("queues");
    let disk = OpenedDisk {
        description: format!(
            "virtio-blk {} ({:04x}:{:04x}): {} sectors, block {} B, seg_max {:?}, {} of {} queue(s) of {}, {} descriptors",
            function.address,
            function.vendor_id,
            function.device_id,
            config.capacity,
            config.block_size,
            config.seg_max,
            count,
            config.num_queues,
            queues[0].queue_depth(),
            if blk.indirect() { "indirect" } else { "direct" },
        ),
        queues,
        bounced_bytes: Default::default(),
        device_model: false,
    };
    Ok((disk, blk))
}
