// SPDX-License-Identifier: MIT OR Apache-2.0
//! The backing store of one vbd, as its `params` (xl's `target=`) names it: a RAM disk,
//! an NVMe namespace or a virtio-blk device, whole or a slice of it. Every ring's engine
//! drives its own device queue through `DeviceQueue`, a boxed `BlockDevice` (a slice's
//! wrapped in `blkdev::Slice`): one indirect call per submit or poll (nothing next to a
//! device round trip), no allocation and no lock per request, and the engine and pollers
//! stay one type whatever the device (an enum of every device would have to name the
//! drivers' queue types, which live behind `devices`).

use super::error::ConnectError;
use crate::devices::open::Queue;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use backing::{DeviceId, Extent};
use blkdev::{
    BlockDevice, BufferAccess, Completion, DeviceFault, Geometry, IoRequest, RamDisk,
    SharedCapacity, Slice, SliceError, SubmitError,
};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Set by a RAM disk whose write found no memory (its discards gave stripes back and
/// none is spare), or whose maintenance has work left: the control path is to run
/// `RamDisk::maintain` soon. Every RAM disk is made with it; pollers look at it once a
/// loop.
pub static RAM_MEMORY_WANTED: AtomicBool = AtomicBool::new(false);

/// One device queue, owned by the poller that serves the ring: the device's own, or
/// wrapped as a slice of it (`blkdev::Slice`: requests checked against the slice and
/// moved by its start).
pub struct DeviceQueue(Inner);

enum Inner {
    Whole(Queue),
    Slice(Slice<Queue>),
}

impl DeviceQueue {
    /// `queue` as it is (a whole device or a RAM disk).
    pub(super) fn whole(queue: Queue) -> DeviceQueue {
        DeviceQueue(Inner::Whole(queue))
    }

    /// `queue` as the slice of its device from sector `start`, as long as `capacity`
    /// says (shared by the disk's queues: a resize changes it for all); on error the
    /// queue comes back.
    pub(super) fn slice(
        queue: Queue,
        start: u64,
        capacity: &SharedCapacity,
    ) -> Result<Self, (Queue, SliceError)> {
        Slice::shared(queue, start, capacity).map(|slice| DeviceQueue(Inner::Slice(slice)))
    }

    /// The device's queue again, for any next disk on the device.
    pub(super) fn into_device(self) -> Queue {
        match self.0 {
            Inner::Whole(queue) => queue,
            Inner::Slice(slice) => slice.into_inner(),
        }
    }
}

impl BlockDevice for DeviceQueue {
    fn geometry(&self) -> Geometry {
        match &self.0 {
            Inner::Whole(queue) => queue.geometry(),
            Inner::Slice(slice) => slice.geometry(),
        }
    }

    fn queue_depth(&self) -> usize {
        match &self.0 {
            Inner::Whole(queue) => queue.queue_depth(),
            Inner::Slice(slice) => slice.queue_depth(),
        }
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        match &mut self.0 {
            Inner::Whole(queue) => queue.submit(request, buffers),
            Inner::Slice(slice) => slice.submit(request, buffers),
        }
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        match &mut self.0 {
            Inner::Whole(queue) => queue.poll_completions(sink),
            Inner::Slice(slice) => slice.poll_completions(sink),
        }
    }

    fn tick(&mut self, now_ns: u64, timeout_ns: u64) {
        match &mut self.0 {
            Inner::Whole(queue) => queue.tick(now_ns, timeout_ns),
            Inner::Slice(slice) => slice.tick(now_ns, timeout_ns),
        }
    }

    fn fault(&self) -> Option<DeviceFault> {
        match &self.0 {
            Inner::Whole(queue) => queue.fault(),
            Inner::Slice(slice) => slice.fault(),
        }
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

/// A real disk's queues (one per vCPU at most), taken from its device's in the
/// registry: a ring takes one at connect and gives it back when its poller releases it.
/// When the vbd goes they go back to the registry for the next disk on the device, any
/// part of it (opening it again would reset a controller whose queues are still live, or
/// find a virtio device marked in use).
pub struct OpenDevice {
    pub(super) device: DeviceId,
    /// The bytes of the device this disk serves (all of them for a whole device).
    pub(super) extent: Extent,
    /// A slice's length, shared by its queues (`None`: the whole device).
    pub(super) capacity: Option<SharedCapacity>,
    pub(super) description: String,
    /// The disk's (a slice's is its own).
    pub(super) geometry: Geometry,
    pub(super) idle: Vec<DeviceQueue>,
    /// Queues this disk holds (idle or serving).
    pub(super) opened: usize,
    /// Bytes its device's queues copied through bounce buffers (devices/bounce.rs; all
    /// the disks on the device together).
    pub(super) bounced_bytes: Arc<AtomicU64>,
    /// The device model emulates the device (`devices::open::OpenedDisk::device_model`).
    pub(super) device_model: bool,
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

    /// A namespace reached over the storage network (NVMe/TCP), served by vCPU 0.
    pub fn on_the_network(&self) -> bool {
        matches!(self, Disk::Device(device) if matches!(device.device, DeviceId::NvmeTcp { .. }))
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
            Disk::Ram(disk) => Ok(DeviceQueue::whole(Box::new(disk.queue(depth)))),
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

    /// A RAM disk's memory: bytes held now, and bytes its discards gave back so far.
    pub fn ram_memory(&self) -> Option<(u64, u64)> {
        match self {
            Disk::Ram(disk) => Some((disk.resident_bytes(), disk.freed_bytes())),
            Disk::Device(_) => None,
        }
    }

    /// Bytes the disk's device copied through bounce buffers so far (0: straight DMA).
    pub fn bounced_bytes(&self) -> u64 {
        match self {
            Disk::Ram(_) => 0,
            Disk::Device(device) => device.bounced_bytes.load(Ordering::Relaxed),
        }
    }

    /// Whether the device model (qemu-xen in dom0) emulates the disk's device.
    pub fn in_device_model(&self) -> bool {
        match self {
            Disk::Ram(_) => false,
            Disk::Device(device) => device.device_model,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Disk::Ram(disk) => format!("{} MiB RAM disk", disk.geometry().sectors >> 11),
            Disk::Device(device) => device.description.clone(),
        }
    }
}
