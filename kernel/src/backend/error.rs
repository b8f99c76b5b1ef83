// SPDX-License-Identifier: MIT OR Apache-2.0
//! Why a vbd could not be set up or connected. Their texts go to the vbd's xenstore
//! `hotplug-error`/`error` nodes and to the console, which operators and the tests
//! read: each `Display` keeps the wording it had as a formatted string.

use crate::devices::region::RegionError;
use crate::devices::OpenError;
use alloc::string::String;
use alloc::vec::Vec;
use backing::gpt::GptError;
use backing::{Extent, RamName};
use blkback::negotiate::NegotiationError;
use core::fmt;
use xen::xenbus::error::{errno, Errno};
use xen::xenbus::StoreError;
use xen::XenError;

/// Why connecting a frontend's rings failed (after "connecting rings: " in `error`).
#[derive(Debug)]
pub enum ConnectError {
    /// Not running under Xen (no hypercalls).
    NoXen,
    /// Every map region is serving a ring.
    NoMapSpace,
    /// The ring's grants did not map (none stays mapped, but for `error.leaked`).
    MapRing {
        refs: Vec<u32>,
        error: xen::grant::MapError,
    },
    BindEventChannel {
        port: u32,
        error: XenError,
    },
    /// A real disk's queues are all taken by rings already.
    AllQueuesServing {
        opened: usize,
    },
    /// The mapped ring does not fit what the frontend negotiated, or the ring's engine
    /// does not fit in the heap (`blkback::engine::EngineError` says which).
    Engine(blkback::engine::EngineError),
    /// The domain's budget for grants of requests in flight cannot give another ring
    /// room for one request.
    NoGrantShare(blkback::budget::NoShare),
}

impl ConnectError {
    /// A ring of `refs` that did not connect (`xen::ring::RingConnection::connect`).
    pub fn ring(refs: &[u32], error: xen::ring::RingError) -> Self {
        match error {
            xen::ring::RingError::Map(error) => ConnectError::MapRing {
                refs: refs.to_vec(),
                error,
            },
            xen::ring::RingError::Bind { port, error, .. } => {
                ConnectError::BindEventChannel { port, error }
            }
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::NoXen => f.write_str("no Xen platform"),
            ConnectError::NoMapSpace => {
                f.write_str("no guest-physical map space left for another ring")
            }
            ConnectError::MapRing { refs, error } => {
                write!(f, "mapping ring grants {refs:?}: {error:?}")
            }
            ConnectError::BindEventChannel { port, error } => {
                write!(f, "binding event channel {port}: {error:?}")
            }
            ConnectError::AllQueuesServing { opened } => {
                write!(f, "all {opened} queues of the device are serving rings")
            }
            ConnectError::Engine(blkback::engine::EngineError::Ring(error)) => {
                write!(f, "ring: {error:?}")
            }
            ConnectError::Engine(error) => write!(f, "{error}"),
            ConnectError::NoGrantShare(refused) => write!(f, "{refused}"),
        }
    }
}

impl core::error::Error for ConnectError {}

/// Why the backing store a vbd's `params` names could not be made.
#[derive(Debug)]
pub enum DiskError {
    /// `params` names no backing store (`reason`: the parser's words).
    Params {
        params: String,
        reason: String,
    },
    RamSizeMismatch {
        name: RamName,
        have_bytes: u64,
        want_bytes: u64,
    },
    RamInUse(RamName),
    /// A live upgrade handed this RAM disk over and it could not be rebuilt (the
    /// reason): its contents are gone, and an empty disk of that name is never made in
    /// its place.
    RamLost {
        name: RamName,
        reason: String,
    },
    RamDoesNotFit {
        bytes: u64,
        free_bytes: u64,
    },
    /// Bytes of the device serve another disk now (the whole device, or an overlapping
    /// slice).
    Overlaps {
        spec: String,
        extent: Extent,
        /// `extent` is the whole device.
        whole: bool,
        /// The spec of the disk serving, and its range.
        serving: String,
        serving_extent: Extent,
        serving_whole: bool,
    },
    /// The disk's range covers the partition table a disk serving was found by.
    CoversTable {
        spec: String,
        extent: Extent,
        /// The spec of the disk serving, and the table's bytes.
        serving: String,
        table: Extent,
    },
    /// The partition table the disk was found by lies in the range of a disk serving.
    TableCovered {
        spec: String,
        table: Extent,
        serving: String,
        serving_extent: Extent,
    },
    /// Every virtqueue of the virtio device serves another disk.
    NoQueueLeft {
        spec: String,
        made: usize,
    },
    /// Every queue a remote namespace serves at most is another disk's.
    NoRemoteQueueLeft {
        spec: String,
        made: usize,
    },
    /// The disk's region does not fit the device, or its partition was not found.
    Region {
        spec: String,
        error: RegionError,
    },
    /// A queue could not be made a slice of its device.
    Slice {
        spec: String,
        error: blkdev::SliceError,
    },
    Device {
        spec: String,
        error: OpenError,
    },
    NoQueue {
        spec: String,
    },
    /// A queue of the device failed, and the device was stopped.
    DeviceFailed {
        spec: String,
        fault: blkdev::DeviceFault,
    },
    /// A remote namespace (`nvme-tcp:`) could not be reached or used: why, and the
    /// errno (ETIMEDOUT no answer, ECONNREFUSED refused, ENODEV no such subsystem or
    /// namespace, EACCES this host not allowed).
    Remote {
        spec: String,
        reason: String,
        errno: i32,
    },
    /// Not a failure: the remote namespace's bring-up runs and the attach asks again
    /// (`Net::remote`); an attach still waiting at [`Control`]'s shutdown or upgrade
    /// fails with it.
    ///
    /// [`Control`]: super::control::Control
    RemoteConnecting {
        spec: String,
    },
}

impl fmt::Display for DiskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskError::Params { params, reason } => write!(f, "params {params:?}: {reason}"),
            DiskError::RamSizeMismatch {
                name,
                have_bytes,
                want_bytes,
            } => write!(
                f,
                "RAM disk {name} exists with {} KiB, not {} KiB",
                have_bytes >> 10,
                want_bytes >> 10
            ),
            DiskError::RamInUse(name) => write!(f, "RAM disk {name} is in use by another disk"),
            DiskError::RamLost { name, reason } => write!(
                f,
                "RAM disk {name} was handed over by the previous image but not taken over \
                 ({reason}): its contents are lost"
            ),
            DiskError::RamDoesNotFit { bytes, free_bytes } => write!(
                f,
                "ram:{} MiB does not fit: {} MiB of memory free for disks",
                bytes >> 20,
                free_bytes >> 20
            ),
            DiskError::Overlaps {
                spec,
                extent,
                whole,
                serving,
                serving_extent,
                serving_whole,
            } => {
                let part = |whole: bool| if whole { "the whole device, " } else { "" };
                write!(
                    f,
                    "{spec} overlaps {serving}, which serves another disk: {}{extent} against {}{serving_extent}",
                    part(*whole),
                    part(*serving_whole)
                )
            }
            DiskError::CoversTable {
                spec,
                extent,
                serving,
                table,
            } => write!(
                f,
                "{spec} ({extent}) covers the partition table ({table}) that {serving}, which serves another disk, was found by: its guest could rewrite the table"
            ),
            DiskError::TableCovered {
                spec,
                table,
                serving,
                serving_extent,
            } => write!(
                f,
                "{spec}: the partition table it is found by ({table}) lies in {serving} ({serving_extent}), which serves another disk: that guest could rewrite the table"
            ),
            DiskError::NoQueueLeft { spec, made } => write!(
                f,
                "{spec}: all {made} virtqueues of the device serve other disks (each disk takes up to one per vCPU; a device with more queues serves more disks)"
            ),
            DiskError::NoRemoteQueueLeft { spec, made } => write!(
                f,
                "{spec}: all {made} queues of the remote namespace serve other disks (each disk takes up to one per vCPU)"
            ),
            DiskError::Region { spec, error } => write!(f, "{spec}: {error}"),
            DiskError::Slice { spec, error } => write!(f, "{spec}: {error}"),
            DiskError::Device { spec, error } => write!(f, "{spec}: {error}"),
            DiskError::NoQueue { spec } => write!(f, "{spec}: the device gave no queue"),
            DiskError::DeviceFailed { spec, fault } => write!(
                f,
                "{spec}: the device failed ({fault}); it serves no disk until blkdom restarts"
            ),
            DiskError::Remote { spec, reason, .. } => write!(f, "{spec}: {reason}"),
            DiskError::RemoteConnecting { spec } => {
                write!(f, "{spec}: still connecting to the target")
            }
        }
    }
}

impl core::error::Error for DiskError {}

/// Why a served disk keeps its size when an operator rewrote its `params` (the reason
/// goes to the backend's `blkdom-resize` node, Linux's error node and the console).
#[derive(Debug)]
pub enum ResizeRefusal {
    /// The new `params` does not parse.
    Params { params: String, reason: String },
    /// It is not the served disk with another size (`backing::new_size`).
    Spec(backing::ResizeRefused),
    /// The RAM disk refused (too large, memory, or data beyond a smaller end).
    Ram(blkdev::ResizeError),
    /// Growing the RAM disk would leave too little memory.
    RamDoesNotFit { needed: u64, free: u64 },
    /// Only a slice of a device is resized (cannot happen after `Spec`'s checks).
    NotASlice,
    /// A slice only grows: blkdom cannot tell which of its blocks hold the guest's data.
    SliceShrinks { from: Extent, bytes: u64 },
    /// The grown slice does not fit its device.
    Slice(backing::SliceError),
    /// The grown slice would reach bytes serving another disk.
    Overlaps {
        spec: String,
        extent: Extent,
        serving: String,
        serving_extent: Extent,
    },
    /// The grown slice would cover the partition table a disk serving was found by.
    CoversTable {
        spec: String,
        extent: Extent,
        serving: String,
        table: Extent,
    },
}

impl fmt::Display for ResizeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResizeRefusal::Params { params, reason } => write!(f, "params {params:?}: {reason}"),
            ResizeRefusal::Spec(refused) => write!(f, "{refused}"),
            ResizeRefusal::Ram(error) => write!(f, "{error}"),
            ResizeRefusal::RamDoesNotFit { needed, free } => write!(
                f,
                "growing needs {} MiB of memory, {} MiB are free for disks",
                needed.div_ceil(1 << 20),
                free >> 20
            ),
            ResizeRefusal::NotASlice => f.write_str("only a RAM disk or a slice is resized"),
            ResizeRefusal::SliceShrinks { from, bytes } => write!(
                f,
                "a slice only grows ({from} asked to be {bytes} bytes): any of its blocks may                  hold the guest's data"
            ),
            ResizeRefusal::Slice(error) => write!(f, "{error}"),
            ResizeRefusal::Overlaps {
                spec,
                extent,
                serving,
                serving_extent,
            } => write!(
                f,
                "{spec} grown to {extent} would overlap {serving}, which serves another disk \
                 ({serving_extent})"
            ),
            ResizeRefusal::CoversTable {
                spec,
                extent,
                serving,
                table,
            } => write!(
                f,
                "{spec} grown to {extent} would cover the partition table ({table}) that \
                 {serving}, which serves another disk, was found by"
            ),
        }
    }
}

impl core::error::Error for ResizeRefusal {}

/// EINVAL for a `params` that asks what cannot be done, EBUSY for data or another disk
/// in the way, ENOMEM for memory, ENOSPC for a slice past its device.
impl Errno for ResizeRefusal {
    fn errno(&self) -> i32 {
        match self {
            ResizeRefusal::Params { .. }
            | ResizeRefusal::Spec(_)
            | ResizeRefusal::NotASlice
            | ResizeRefusal::Ram(blkdev::ResizeError::Empty) => errno::EINVAL,
            ResizeRefusal::Ram(blkdev::ResizeError::InUse { .. })
            | ResizeRefusal::SliceShrinks { .. }
            | ResizeRefusal::Overlaps { .. }
            | ResizeRefusal::CoversTable { .. } => errno::EBUSY,
            ResizeRefusal::Ram(blkdev::ResizeError::OutOfMemory { .. })
            | ResizeRefusal::RamDoesNotFit { .. } => errno::ENOMEM,
            ResizeRefusal::Ram(blkdev::ResizeError::TooLarge { .. }) | ResizeRefusal::Slice(_) => {
                errno::ENOSPC
            }
        }
    }
}

/// Why a vbd the toolstack created is not served (kept, and shown in the report).
#[derive(Debug)]
pub enum AttachError {
    /// Its `params` node could not be read.
    NoParams(StoreError),
    Disk(DiskError),
    /// The blkif negotiation could not start.
    Probe(NegotiationError),
    /// A live upgrade handed the vbd over, and this image cannot take it over as it was.
    HandedOver(String),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::NoParams(error) => write!(f, "no params: {error:?}"),
            AttachError::Disk(error) => write!(f, "{error}"),
            AttachError::Probe(error) => write!(f, "{error:?}"),
            AttachError::HandedOver(why) => write!(f, "live upgrade: {why}"),
        }
    }
}

impl core::error::Error for AttachError {}

/// The errno before each message in Linux's error node
/// (`xen::xenbus::error`): EINVAL for configuration that cannot work, ENODEV for a
/// device or partition that is not there, EBUSY for one that serves another disk,
/// ENOMEM/ENOSPC for memory or map space, EIO for the rest.
impl Errno for AttachError {
    fn errno(&self) -> i32 {
        match self {
            AttachError::NoParams(error) => error.errno(),
            AttachError::Disk(error) => error.errno(),
            AttachError::Probe(error) => error.errno(),
            AttachError::HandedOver(_) => errno::EINVAL,
        }
    }
}

impl Errno for DiskError {
    fn errno(&self) -> i32 {
        match self {
            DiskError::Params { .. } | DiskError::RamSizeMismatch { .. } => errno::EINVAL,
            DiskError::Slice { .. } => errno::EINVAL,
            DiskError::RamInUse(_)
            | DiskError::Overlaps { .. }
            | DiskError::CoversTable { .. }
            | DiskError::TableCovered { .. } => errno::EBUSY,
            DiskError::NoQueueLeft { .. }
            | DiskError::NoRemoteQueueLeft { .. }
            | DiskError::NoQueue { .. } => errno::EBUSY,
            DiskError::RamDoesNotFit { .. } => errno::ENOMEM,
            DiskError::DeviceFailed { .. } | DiskError::RamLost { .. } => errno::EIO,
            DiskError::Remote { errno, .. } => *errno,
            DiskError::RemoteConnecting { .. } => errno::EAGAIN,
            DiskError::Region { error, .. } => match error {
                RegionError::Gpt(
                    GptError::NoSuchEntry { .. }
                    | GptError::Unused { .. }
                    | GptError::NoName { .. },
                ) => errno::ENODEV,
                RegionError::Gpt(_) | RegionError::Slice(_) => errno::EINVAL,
                RegionError::NoQueue => errno::EBUSY,
                RegionError::Read { .. } => errno::EIO,
            },
            DiskError::Device { error, .. } => match error {
                OpenError::NoNvme | OpenError::NoVirtio { .. } => errno::ENODEV,
                // Two devices answer to the name: configuration to fix, not a device
                // missing.
                OpenError::Name(backing::NameError::Ambiguous { .. }) => errno::EINVAL,
                OpenError::Name(_) => errno::ENODEV,
                OpenError::VirtioInUse(_)
                | OpenError::NvmeQueuesInUse(_)
                | OpenError::Resetting(_) => errno::EBUSY,
                OpenError::NoBounceMemory => errno::ENOMEM,
                _ => errno::EIO,
            },
        }
    }
}

impl Errno for ConnectError {
    fn errno(&self) -> i32 {
        match self {
            ConnectError::NoXen => errno::ENODEV,
            ConnectError::NoMapSpace | ConnectError::NoGrantShare(_) => errno::ENOSPC,
            // The frontend's grants or event channel: what it wrote does not work.
            ConnectError::MapRing { .. } | ConnectError::BindEventChannel { .. } => errno::EINVAL,
            ConnectError::AllQueuesServing { .. } => errno::EBUSY,
            ConnectError::Engine(blkback::engine::EngineError::OutOfMemory { .. }) => errno::ENOMEM,
            ConnectError::Engine(blkback::engine::EngineError::Ring(_)) => errno::EINVAL,
        }
    }
}
