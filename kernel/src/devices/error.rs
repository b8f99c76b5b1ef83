// SPDX-License-Identifier: MIT OR Apache-2.0
//! Why a disk could not be opened. The texts reach the console and, under Xen, the vbd's
//! `hotplug-error`/`error` nodes (after the disk's name): each `Display` keeps the
//! wording it had as a formatted string.

use crate::arch::paging::MapError;
use core::fmt;
use pci::{Bar, PciAddress};

#[derive(Debug)]
pub enum OpenError {
    /// A RAM disk has no device.
    NoDevice,
    /// A stable name (serial, NGUID, EUI-64, PCI address) reaches no device, or two.
    Name(backing::NameError),
    NoNvme,
    NoVirtio {
        index: u32,
    },
    /// A virtio device serves one disk (opening it again would reset it).
    VirtioInUse(PciAddress),
    NoBounceMemory,
    /// A RAM disk of this many bytes does not fit the memory free for disks.
    #[cfg(feature = "test-hooks")]
    RamDoesNotFit {
        bytes: u64,
    },
    BarUnreadable {
        device: PciAddress,
        bar: u8,
        error: pci::BarError,
    },
    BarUnassigned {
        device: PciAddress,
        bar: u8,
    },
    /// What the BAR is instead (an I/O BAR, or none).
    BarNotMemory {
        device: PciAddress,
        bar: u8,
        found: Option<Bar>,
    },
    /// A register window that does not lie inside its BAR.
    WindowOutsideBar {
        device: PciAddress,
        bar: u8,
        offset: u64,
        len: u64,
        size: u64,
    },
    BarNotMapped {
        device: PciAddress,
        bar: u8,
        error: MapError,
    },
    NvmeBarTooSmall {
        device: PciAddress,
        size: u64,
    },
    /// The NVMe driver failed at `step` (bring-up, namespace, I/O queue, ...).
    Nvme {
        device: PciAddress,
        step: &'static str,
        error: nvme::NvmeError,
    },
    NvmeQueuesInUse(PciAddress),
    /// A queue of the controller failed and stopped it (bus mastering off): it serves
    /// no new disk until blkdom restarts.
    NvmeStopped(PciAddress),
    /// The device is being reset after a command timed out: no new queue now.
    Resetting(PciAddress),
    VirtioLegacy(PciAddress),
    /// The virtio driver failed at `step` (bring-up, virtqueue).
    Virtio {
        device: PciAddress,
        step: &'static str,
        error: virtio::VirtioError,
    },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NoDevice => f.write_str("a RAM disk or a remote namespace is not a PCI device"),
            OpenError::Name(error) => write!(f, "{error}"),
            OpenError::NoNvme => f.write_str("no NVMe controller on the PCI bus"),
            OpenError::NoVirtio { index } => {
                write!(f, "no virtio-blk device number {index} on the PCI bus")
            }
            OpenError::VirtioInUse(device) => write!(f, "virtio-blk {device} is already in use"),
            OpenError::NoBounceMemory => f.write_str("no memory for bounce buffers"),
            #[cfg(feature = "test-hooks")]
            OpenError::RamDoesNotFit { bytes } => {
                write!(f, "ram:{} KiB does not fit the memory free for disks", bytes / 1024)
            }
            OpenError::BarUnreadable { device, bar, error } => {
                write!(f, "{device}: BAR {bar}: {error:?}")
            }
            OpenError::BarUnassigned { device, bar } => {
                write!(f, "{device}: BAR {bar} is unassigned")
            }
            OpenError::BarNotMemory { device, bar, found } => {
                write!(f, "{device}: BAR {bar} is not a memory BAR ({found:?})")
            }
            OpenError::WindowOutsideBar {
                device,
                bar,
                offset,
                len,
                size,
            } => write!(
                f,
                "{device}: {len:#x} bytes at {offset:#x} do not fit BAR {bar} ({size:#x} bytes)"
            ),
            OpenError::BarNotMapped { device, bar, error } => {
                write!(f, "{device}: mapping BAR {bar}: {error:?}")
            }
            OpenError::NvmeBarTooSmall { device, size } => {
                write!(f, "{device}: BAR 0 of {size} bytes is too small")
            }
            OpenError::Nvme {
                device,
                step,
                error,
            } => write!(f, "nvme {device}: {step}: {error}"),
            OpenError::NvmeQueuesInUse(device) => write!(
                f,
                "nvme {device}: every I/O queue the controller granted is in use"
            ),
            OpenError::NvmeStopped(device) => write!(
                f,
                "nvme {device}: the controller failed and was stopped; it serves no disk until blkdom restarts"
            ),
            OpenError::Resetting(device) => write!(
                f,
                "{device}: the device is being reset after a command timed out; try again"
            ),
            OpenError::VirtioLegacy(device) => write!(
                f,
                "virtio {device}: no modern (virtio 1.x) PCI capabilities; legacy devices are not supported"
            ),
            OpenError::Virtio {
                device,
                step,
                error,
            } => write!(f, "virtio {device}: {step}: {error}"),
        }
    }
}

impl core::error::Error for OpenError {}
