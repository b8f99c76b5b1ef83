// SPDX-License-Identifier: MIT OR Apache-2.0
//! The block-device interface the blkif engine drives, two in-memory devices, a
//! slice of a device as a device of its own, and bounce buffers for a device that cannot
//! reach the guests' pages.
//!
//! A device is used through per-queue handles: each poller owns the handle of its own
//! device queue, so submitting and polling completions needs no lock shared between
//! pollers. Data lives in pages the device does not own (mapped grants); a DMA device
//! uses [`DmaSegment::buffer`] as an address, a CPU device (the RAM disk) copies through
//! [`BufferAccess`].
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod bounce;
pub mod dma;
pub mod heap;
mod null;
mod ram;
pub mod shutdown;
mod slice;

pub use dma::{Dma, DmaRegion};
pub use heap::{HeapBudget, NoRoom};
pub use null::NullDisk;
pub use ram::{
    address_of, AdoptError, HandedStripe, Maintenance, OutOfMemory, RamDisk, RamDiskQueue,
    ResizeError, StripeArena, StripeFrames, STRIPE_BYTES,
};
pub use slice::{SharedCapacity, Slice, SliceError};

/// Bytes in the sector unit used for all addressing (`sector` fields, capacities).
pub const SECTOR_SIZE: u64 = 512;

/// What a device offers; sizes in bytes, capacity in 512-byte sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Capacity in 512-byte sectors.
    pub sectors: u64,
    /// Smallest addressable unit in bytes (a multiple of 512).
    pub logical_block_size: u32,
    /// Preferred I/O unit in bytes.
    pub physical_block_size: u32,
    pub read_only: bool,
    /// The device has a volatile cache that `Flush` writes back.
    pub flush: bool,
    pub discard: Option<DiscardGeometry>,
}

/// Discard support parameters, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscardGeometry {
    pub granularity: u32,
    pub alignment: u32,
    /// Secure erase is supported.
    pub secure: bool,
}

/// One contiguous piece of a data buffer. Exactly one per granted page: the engine never
/// merges neighbouring segments, because two grants are never known to be contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DmaSegment {
    /// Address (or handle) of the page holding the data, as the buffer owner names it.
    pub buffer: u64,
    /// Byte offset inside that page.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    /// Write back the volatile cache; carries no data, and its `sector` means nothing
    /// (Linux sends an empty flush with sector -1, blk_rq_init's "no position").
    Flush,
    /// Drop `nr_sectors` sectors starting at `sector`.
    Discard {
        secure: bool,
    },
}

/// A request handed to one device queue. `tag` comes back in the completion.
#[derive(Clone, Copy, Debug)]
pub struct IoRequest<'a> {
    pub tag: u32,
    pub op: IoOp,
    /// First 512-byte sector.
    pub sector: u64,
    /// Length in sectors for `Discard`; for data ops it is the sum of the segment lengths.
    pub nr_sectors: u64,
    /// Flush the cache before this write (a flush request that carries data).
    pub preflush: bool,
    pub segments: &'a [DmaSegment],
}

impl IoRequest<'_> {
    /// Whether the request, covering `nr_sectors`, stays inside a device of `capacity`
    /// sectors. A flush has no range (Linux sends sector -1) and always fits.
    pub fn fits(&self, nr_sectors: u64, capacity: u64) -> bool {
        self.op == IoOp::Flush || range_fits(self.sector, nr_sectors, capacity)
    }
}

/// Outcome of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoStatus {
    Ok,
    Error,
    Unsupported,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub tag: u32,
    pub status: IoStatus,
}

/// Why a submission was refused (the request was not started).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// No room in the device queue right now; retry after polling completions.
    QueueFull,
    /// The request is malformed for this device (outside its capacity, bad buffer).
    Invalid,
}

impl core::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            SubmitError::QueueFull => "the device queue is full",
            SubmitError::Invalid => "the request is invalid for this device",
        })
    }
}

impl core::error::Error for SubmitError {}

/// Why a device queue stopped serving. From then on every request it held, and every
/// request it is given, is answered with an error without the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFault {
    pub kind: FaultKind,
    /// The device was stopped from reaching memory (bus mastering off, confirmed) before
    /// any request it held was answered: nothing it does later lands in a page. `false`:
    /// that could not be confirmed, and whoever mapped the pages it was given must not
    /// reuse their addresses.
    pub dma_stopped: bool,
}

/// What went wrong with a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A command got no completion within the deadline (`device.timeout-ms`): it waited
    /// this long when it was given up.
    Timeout { waited_ms: u64 },
    /// The device reported a fatal error (NVMe CSTS.CFS, virtio NEEDS_RESET or FAILED).
    Fatal,
    /// Another queue of the same device failed, and the device was stopped.
    Stopped,
    /// A remote target (NVMe/TCP) stayed unreachable this long while its requests
    /// were held: given up, they and every later one fail.
    TargetGone { waited_ms: u64 },
}

impl core::fmt::Display for DeviceFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.kind {
            FaultKind::Timeout { waited_ms } => {
                write!(f, "a command got no completion in {waited_ms} ms")?
            }
            FaultKind::Fatal => f.write_str("the device reported a fatal error")?,
            FaultKind::Stopped => f.write_str("another queue of the device failed")?,
            FaultKind::TargetGone { waited_ms } => {
                return write!(
                    f,
                    "the target stayed unreachable for {} s; every request answered with an error",
                    waited_ms / 1000
                )
            }
        }
        f.write_str(if self.dma_stopped {
            "; device stopped (bus mastering off), every request answered with an error"
        } else {
            "; device could NOT be stopped (bus mastering still on), every request answered with an error"
        })
    }
}

/// A page of another domain that a buffer names without mapping it (a ring that copies
/// its guest's data with the hypervisor instead of mapping grants): a device that
/// bounces copies to and from it with the hypervisor (Xen's `GNTTABOP_copy`), never by
/// address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignPage {
    /// The domain that granted the page.
    pub domain: u16,
    /// Its grant reference.
    pub gref: u32,
}

/// CPU access to the pages that segments name; a DMA device never calls it.
pub trait BufferAccess {
    /// Copy `out.len()` bytes from `buffer` at `offset`. False if the buffer is unknown
    /// or the range leaves the page.
    fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool;
    /// Copy `data` into `buffer` at `offset`. False as for `read_buffer`.
    fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool;
    /// Where the CPU reaches the `len` bytes at `offset` of `buffer` (a physical,
    /// identity-mapped address), after the same check as `read_buffer` and
    /// `write_buffer`: for a device that copies into the buffer after `submit` returned,
    /// when this access is no longer at hand (bounce buffers copy a read's data out on
    /// completion). The address stays valid until the request completes. `None` if the
    /// buffer is unknown, the range leaves the page, or buffers have no address here
    /// (the default).
    fn cpu_address(&self, buffer: u64, offset: usize, len: usize) -> Option<u64> {
        let _ = (buffer, offset, len);
        None
    }
    /// The foreign page `buffer` names when it is not mapped here (no `cpu_address`):
    /// a bounce device copies its data with the hypervisor. `None` for a mapped buffer
    /// or an unknown one (the default).
    fn foreign_page(&self, buffer: u64) -> Option<ForeignPage> {
        let _ = buffer;
        None
    }
}

/// Buffer access that refuses every access: for a request that carries no data (a
/// flush), or one whose segments a DMA device reaches by address alone.
pub struct NoBuffers;

impl BufferAccess for NoBuffers {
    fn read_buffer(&self, _: u64, _: usize, _: &mut [u8]) -> bool {
        false
    }
    fn write_buffer(&self, _: u64, _: usize, _: &[u8]) -> bool {
        false
    }
}

/// One queue of a block device.
pub trait BlockDevice {
    fn geometry(&self) -> Geometry;
    /// Requests this queue can hold at once.
    fn queue_depth(&self) -> usize;
    /// Start a request. The segments are only read during this call.
    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError>;
    /// Report finished requests to `sink`; returns how many.
    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize;
    /// The clock of whoever polls the queue (ns, monotonic), on every pass, and how long
    /// a command may stay with the device (ns; 0: forever). A queue that holds a command
    /// longer fails (`fault`): it stops its device, and every request it holds is
    /// reported with `IoStatus::Error` by the next `poll_completions`. Cheap when nothing
    /// is due. Devices that complete everything themselves (RAM) have nothing to time.
    fn tick(&mut self, now_ns: u64, timeout_ns: u64) {
        let _ = (now_ns, timeout_ns);
    }
    /// Why the queue stopped serving, once it has (then for good).
    fn fault(&self) -> Option<DeviceFault> {
        None
    }
}

/// Writes the [`BlockDevice`] methods named after the field that pass straight to the
/// queue in that field, inside an `impl BlockDevice for …` block, so a wrapper writes
/// only the methods it changes: `blkdev::forward_to!(inner: geometry, queue_depth);`.
/// Any of `geometry`, `queue_depth`, `submit`, `poll_completions`, `tick`, `fault`; a
/// method left out keeps the wrapper's own (or the trait's default). Plain calls: no
/// allocation, no lock.
#[macro_export]
macro_rules! forward_to {
    ($field:tt: $($method:ident),+ $(,)?) => {
        $($crate::forward_to!(@ $field $method);)+
    };
    (@ $field:tt geometry) => {
        fn geometry(&self) -> $crate::Geometry {
            self.$field.geometry()
        }
    };
    (@ $field:tt queue_depth) => {
        fn queue_depth(&self) -> usize {
            self.$field.queue_depth()
        }
    };
    (@ $field:tt submit) => {
        fn submit(
            &mut self,
            request: &$crate::IoRequest<'_>,
            buffers: &dyn $crate::BufferAccess,
        ) -> Result<(), $crate::SubmitError> {
            self.$field.submit(request, buffers)
        }
    };
    (@ $field:tt poll_completions) => {
        fn poll_completions(&mut self, sink: &mut dyn FnMut($crate::Completion)) -> usize {
            self.$field.poll_completions(sink)
        }
    };
    (@ $field:tt tick) => {
        fn tick(&mut self, now_ns: u64, timeout_ns: u64) {
            self.$field.tick(now_ns, timeout_ns)
        }
    };
    (@ $field:tt fault) => {
        fn fault(&self) -> Option<$crate::DeviceFault> {
            self.$field.fault()
        }
    };
}

/// A boxed queue is a queue (the kernel holds its device queues as
/// `Box<dyn BlockDevice + Send>`, and wraps them, e.g. in a [`Slice`]).
impl<T: BlockDevice + ?Sized> BlockDevice for alloc::boxed::Box<T> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }

    fn queue_depth(&self) -> usize {
        (**self).queue_depth()
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        (**self).submit(request, buffers)
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        (**self).poll_completions(sink)
    }

    fn tick(&mut self, now_ns: u64, timeout_ns: u64) {
        (**self).tick(now_ns, timeout_ns)
    }

    fn fault(&self) -> Option<DeviceFault> {
        (**self).fault()
    }
}

/// Fixed-capacity FIFO of completions, allocated once.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    entries: alloc::vec::Vec<Completion>,
    head: usize,
    len: usize,
}

impl CompletionQueue {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let filler = Completion {
            tag: 0,
            status: IoStatus::Ok,
        };
        Self {
            entries: alloc::vec![filler; capacity.max(1)],
            head: 0,
            len: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len == self.entries.len()
    }

    /// Completions held, not yet drained.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn push(&mut self, completion: Completion) -> Result<(), SubmitError> {
        if self.is_full() {
            return Err(SubmitError::QueueFull);
        }
        // Wrap by comparison: no division on the hot path.
        let mut tail = self.head + self.len;
        if tail >= self.entries.len() {
            tail -= self.entries.len();
        }
        self.entries[tail] = completion;
        self.len += 1;
        Ok(())
    }

    pub(crate) fn drain(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let drained = self.len;
        while self.len > 0 {
            let completion = self.entries[self.head];
            self.head += 1;
            if self.head == self.entries.len() {
                self.head = 0;
            }
            self.len -= 1;
            sink(completion);
        }
        drained
    }
}

/// Checks that `nr_sectors` from `sector` stay inside a device of `capacity` sectors.
pub fn range_fits(sector: u64, nr_sectors: u64, capacity: u64) -> bool {
    sector
        .checked_add(nr_sectors)
        .is_some_and(|end| end <= capacity)
}

#[cfg(test)]
mod tests {
    use super::SubmitError;

    #[test]
    fn submit_errors_display_their_cause() {
        let text = |e: &dyn core::error::Error| e.to_string();
        assert_eq!(text(&SubmitError::QueueFull), "the device queue is full");
        assert_eq!(
            text(&SubmitError::Invalid),
            "the request is invalid for this device"
        );
    }

    #[test]
    fn device_faults_say_what_happened_and_whether_the_device_stopped() {
        use super::{DeviceFault, FaultKind};
        let fault = |kind, dma_stopped| DeviceFault { kind, dma_stopped }.to_string();
        assert_eq!(
            fault(FaultKind::Timeout { waited_ms: 30_000 }, true),
            "a command got no completion in 30000 ms; device stopped (bus mastering off), \
             every request answered with an error"
        );
        assert!(fault(FaultKind::Fatal, false)
            .starts_with("the device reported a fatal error; device could NOT be stopped"));
        assert!(fault(FaultKind::Stopped, true).starts_with("another queue of the device failed;"));
    }
}
