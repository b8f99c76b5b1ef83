//! The backing store of one vbd, as its `params` (xl's `target=`) names it: a RAM disk,
//! an NVMe namespace or a virtio-blk device. Every ring's engine drives its own device
//! queue through `DeviceQueue`, a boxed `BlockDevice`: one indirect call per submit or
//! poll (nothing next to a device round trip), no allocation and no lock per request,
//! and the engine and pollers stay one type whatever the device (an enum would have to
//! name the drivers' queue types, which live behind `devices`).

use super::error::ConnectError;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use backing::Backing;
use blkdev::{BlockDevice, BufferAccess, Completion, Geometry, IoRequest, RamDisk, SubmitError};
use core::sync::atomic::{AtomicU64, Ordering};

/// One device queue, owned by the poller that serves the ring.
pub struct DeviceQueue(pub(super) Box<dyn BlockDevice + Send>);

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

/// A vbd's backing store. Made by the device registry (`Registry::open`), and handed
/// back to it when the vbd goes (`Registry::release`): a device's queues wait there for
/// the next disk on it.
pub enum Disk {
    /// Each connected ring gets a fresh handle on the shared RAM.
    Ram(RamDisk),
    Device(OpenDevice),
}

/// A real disk's queues, opened once (one per vCPU at most): a ring takes one at
/// connect and gives it back when its poller releases it. While no vbd uses the device
/// they wait in the device registry for the next disk that names it (opening it again
/// would reset a controller whose queues are still live, or find a virtio device marked
/// in use).
pub struct OpenDevice {
    pub(super) backing: Backing,
    pub(super) description: String,
    pub(super) geometry: Geometry,
    pub(super) idle: Vec<DeviceQueue>,
    /// Queues opened (idle or serving).
    pub(super) opened: usize,
    /// Bytes its queues copied through bounce buffers (devices/bounce.rs).
    pub(super) bounced_bytes: Arc<AtomicU64>,
}

impl Drop for OpenDevice {
    /// Only a device with no queues left may go: one with queues goes back to the
    /// registry (`Registry::release`), or the device could never serve a disk again.
    fn drop(&mut self) {
        if !self.idle.is_empty() {
            log::error!(
                "blkback: {}: {} queues dropped instead of parked",
                self.description,
                self.idle.len()
            );
        }
    }
}

impl Disk {
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
