// SPDX-License-Identifier: MIT OR Apache-2.0
//! NVMe: bring a controller up once (reset, admin queue, the I/O queue pairs it grants),
//! then give every disk on it (each namespace, each open) I/O queues from that pool.

use super::error::OpenError;
use super::hal::{DeviceHal, DmaSwitch};
use super::open::{map_memory_bar, memory_bar, OpenOptions, OpenedDisk, PciBus, Queue};
use alloc::boxed::Box;
use alloc::format;
use alloc::sync::Arc;
use alloc::vec::Vec;
use cmdslots::RecoveryConfig;
use pci::{Function, PciAddress};

/// Bytes of NVMe BAR 0 mapped.
const NVME_REGISTER_WINDOW: u64 = 64 * 1024;
/// NVMe submission/completion queue depth per CPU.
const NVME_QUEUE_ENTRIES: u16 = 256;
/// I/O queue pairs asked of each NVMe controller: room for several disks per CPU.
const NVME_QUEUES_PER_CPU: usize = 4;

/// Controllers brought up so far: a controller is reset once, then every disk on it
/// (each namespace, each open) takes I/O queues from the pool it granted. A controller
/// whose command times out is recovered (`recover`) as `recovery` says.
pub struct NvmeControllers {
    controllers: Vec<(PciAddress, nvme::Controller<DeviceHal>)>,
    recovery: RecoveryConfig,
}

/// Resets the controller at `function` and asks it for I/O queue pairs.
fn bring_up(
    bus: &mut PciBus,
    function: &Function,
    recovery: RecoveryConfig,
) -> Result<nvme::Controller<DeviceHal>, OpenError> {
    let (_, size) = memory_bar(bus, function, 0)?;
    if size < 0x2000 {
        return Err(OpenError::NvmeBarTooSmall {
            device: function.address,
            size,
        });
    }
    // Registers and doorbells: 64 KiB holds the doorbells of 8192 queues at the
    // smallest stride, far more than we ask for.
    let window = size.min(NVME_REGISTER_WINDOW);
    let registers = map_memory_bar(bus, function, 0, 0, window)?;
    let pci = bus.config();
    pci::enable_memory_and_dma(pci.access(), function.address);
    let fail = |step, error| OpenError::Nvme {
        device: function.address,
        step,
        error,
    };
    let switch = DmaSwitch::new(pci, function.address);
    let mut controller = nvme::Controller::init(
        DeviceHal::nvme(registers, switch),
        nvme::InitConfig {
            recovery,
            ..nvme::InitConfig::default()
        },
    )
    .map_err(|e| fail("bring-up", e))?;
    let wanted = (crate::smp::online_count() * NVME_QUEUES_PER_CPU).min(usize::from(u16::MAX - 1));
    controller
        .request_io_queues(wanted as u16)
        .map_err(|e| fail("number of queues", e))?;
    Ok(controller)
}

impl NvmeControllers {
    pub fn new(recovery: RecoveryConfig) -> Self {
        NvmeControllers {
            controllers: Vec::new(),
            recovery,
        }
    }

    /// The index of the controller at `function`, brought up now if it never was.
    fn up(&mut self, bus: &mut PciBus, function: &Function) -> Result<usize, OpenError> {
        let controllers = &mut self.controllers;
        if let Some(index) = controllers.iter().position(|(a, _)| *a == function.address) {
            return Ok(index);
        }
        let controller = bring_up(bus, function, self.recovery)?;
        super::stopwatch::lap("bring-up");
        controllers.push((function.address, controller));
        Ok(controllers.len() - 1)
    }

    /// Each controller's recovery step (`nvme::Controller::recover`); the earliest time
    /// one wants the next.
    pub fn recover(&mut self, now: u64) -> Option<u64> {
        let mut due = None;
        for (address, controller) in &mut self.controllers {
            if let Some(at) = super::log_recovery(*address, controller.recover(now)) {
                due = Some(due.map_or(at, |d: u64| d.min(at)));
            }
        }
        due
    }

    /// Every controller brought up, with where it sits.
    pub fn iter_mut(
        &mut self,
    ) -> impl Iterator<Item = (PciAddress, &mut nvme::Controller<DeviceHal>)> {
        self.controllers
            .iter_mut()
            .map(|(address, controller)| (*address, controller))
    }

    /// Brings the controller at `function` up before any disk names it.
    pub fn prepare(&mut self, bus: &mut PciBus, function: &Function) -> Result<(), OpenError> {
        self.up(bus, function).map(|_| ())
    }

    /// Namespace `nsid` of the controller at `function` (brought up on its first open,
    /// unless `prepare` did), with up to `wanted_queues` I/O queues.
    pub fn open(
        &mut self,
        bus: &mut PciBus,
        function: Function,
        nsid: u32,
        wanted_queues: usize,
        options: &OpenOptions<'_>,
    ) -> Result<OpenedDisk, OpenError> {
        let index = self.up(bus, &function)?;
        let controller = &mut self.controllers[index].1;
        if controller.is_stopped() {
            // Its admin queue would not answer either (no DMA).
            return Err(OpenError::NvmeStopped(function.address));
        }
        if controller.is_resetting() {
            return Err(OpenError::Resetting(function.address));
        }
        let fail = |step, error| OpenError::Nvme {
            device: function.address,
            step,
            error,
        };
        let mut namespace = controller
            .namespace(nsid)
            .map_err(|e| fail("namespace", e))?;
        namespace.sgl &= !options.nvme_prp_only;
        super::stopwatch::lap("namespace");
        let count = wanted_queues.min(usize::from(controller.io_queues_left()));
        if count == 0 {
            return Err(OpenError::NvmeQueuesInUse(function.address));
        }
        let mut queues: Vec<Queue> = Vec::new();
        for _ in 0..count {
            let queue = controller
                .create_io_queue(&namespace, NVME_QUEUE_ENTRIES)
                .map_err(|e| fail("I/O queue", e))?;
            queues.push(Box::new(queue));
        }
        super::stopwatch::lap("queues");
        let granted = count;
        let identity = controller.identity();
        let version = controller.version();
        Ok(OpenedDisk {
            description: format!(
                "nvme {} \"{}\" (NVMe {}.{}, serial \"{}\") namespace {}: {} blocks of {} B, {} queue(s) of {}, data by {}",
                function.address,
                identity.model_str(),
                version.major,
                version.minor,
                identity.serial_str(),
                nsid,
                namespace.blocks,
                namespace.block_size,
                granted,
                NVME_QUEUE_ENTRIES - 1,
                if namespace.sgl { "PRP and SGL" } else { "PRP only" },
            ),
            queues,
            bounced_bytes: Arc::default(),
            device_model: false,
        })
    }
}
