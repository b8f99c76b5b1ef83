// SPDX-License-Identifier: MIT OR Apache-2.0
//! PCI configuration-space logic, independent of how the space is reached: the kernel
//! supplies a [`ConfigAccess`] (port 0xCF8/0xCFC or ECAM), the tests a fake.
//!
//! Enumeration walks every bus in range (function 0 first, the others only for
//! multi-function devices), BARs are sized with decoding switched off, and capability
//! lists are walked with a bound so a looping list cannot hang the walk.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

mod bar;
mod caps;
mod inventory;

pub use bar::{memory_bar_addresses, read_bar, Bar, BarError};
pub use caps::{
    capabilities, find_capability, msix, virtio_capabilities, Capability, MsixInfo, VirtioCap,
    VirtioCapKind, CAP_ID_MSIX, CAP_ID_VENDOR,
};
pub use inventory::Inventory;

/// Bus, device and function of one PCI function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub bus: u8,
    /// 0..32
    pub device: u8,
    /// 0..8
    pub function: u8,
}

impl PciAddress {
    /// The function `devfn` (device << 3 | function) on `bus`.
    pub const fn from_devfn(bus: u8, devfn: u8) -> PciAddress {
        PciAddress {
            bus,
            device: devfn >> 3,
            function: devfn & 7,
        }
    }

    /// Where a device the toolstack passed through appears in an HVM domain: libxl asks
    /// the device model where it put the device and writes its devfn, in hex, to the
    /// domain's pci backend node `vdevfn-<n>` (on the domain's bus 0).
    pub fn from_xen_vdevfn(value: &str) -> Option<PciAddress> {
        let value = value.trim();
        let digits = value.strip_prefix("0x").unwrap_or(value);
        u8::from_str_radix(digits, 16)
            .ok()
            .map(|devfn| PciAddress::from_devfn(0, devfn))
    }
}

impl core::fmt::Display for PciAddress {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:02x}:{:02x}.{}", self.bus, self.device, self.function)
    }
}

/// Reads and writes 32-bit configuration registers. `offset` is 4-byte aligned; the
/// port mechanism only reaches offsets below 256 (the rest reads as all ones).
pub trait ConfigAccess {
    fn read32(&self, address: PciAddress, offset: u16) -> u32;
    fn write32(&self, address: PciAddress, offset: u16, value: u32);

    fn read16(&self, address: PciAddress, offset: u16) -> u16 {
        (self.read32(address, offset & !3) >> ((offset & 2) * 8)) as u16
    }

    fn read8(&self, address: PciAddress, offset: u16) -> u8 {
        (self.read32(address, offset & !3) >> ((offset & 3) * 8)) as u8
    }
}

pub const REG_ID: u16 = 0x00;
pub const REG_COMMAND: u16 = 0x04;
pub const REG_CLASS: u16 = 0x08;
pub const REG_HEADER: u16 = 0x0c;
pub const REG_CAP_POINTER: u16 = 0x34;

/// Command register bits.
pub const COMMAND_IO_SPACE: u16 = 1 << 0;
pub const COMMAND_MEMORY_SPACE: u16 = 1 << 1;
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status register: the capability list is present.
const STATUS_CAP_LIST: u16 = 1 << 4;

/// Class code of an NVM Express controller (mass storage, NVM, NVMe).
pub const CLASS_NVME: (u8, u8, u8) = (0x01, 0x08, 0x02);
pub const VENDOR_VIRTIO: u16 = 0x1af4;
/// Modern (virtio 1.0) block device id; 0x1001 is the transitional one.
pub const DEVICE_VIRTIO_BLK_MODERN: u16 = 0x1042;
pub const DEVICE_VIRTIO_BLK_TRANSITIONAL: u16 = 0x1001;

/// What identifies one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    pub address: PciAddress,
    pub vendor_id: u16,
    pub device_id: u16,
    pub class: u8,
    pub subclass: u8,
    pub prog_if: u8,
    pub revision: u8,
    /// Header type without the multi-function bit (0 = device, 1 = bridge).
    pub header_type: u8,
}

impl Function {
    pub fn class_triple(&self) -> (u8, u8, u8) {
        (self.class, self.subclass, self.prog_if)
    }

    pub fn is_nvme(&self) -> bool {
        self.class_triple() == CLASS_NVME
    }

    pub fn is_virtio_blk(&self) -> bool {
        self.vendor_id == VENDOR_VIRTIO
            && matches!(
                self.device_id,
                DEVICE_VIRTIO_BLK_MODERN | DEVICE_VIRTIO_BLK_TRANSITIONAL
            )
    }
}

/// Reads the identity of the function at `address`, or None when nothing answers.
pub fn probe(config: &dyn ConfigAccess, address: PciAddress) -> Option<Function> {
    let id = config.read32(address, REG_ID);
    let vendor_id = id as u16;
    if vendor_id == 0xffff || vendor_id == 0 {
        return None;
    }
    let class = config.read32(address, REG_CLASS);
    Some(Function {
        address,
        vendor_id,
        device_id: (id >> 16) as u16,
        class: (class >> 24) as u8,
        subclass: (class >> 16) as u8,
        prog_if: (class >> 8) as u8,
        revision: class as u8,
        header_type: config.read8(address, REG_HEADER + 2) & 0x7f,
    })
}

/// Calls `visit` for every function on buses `first_bus..=last_bus`.
pub fn enumerate(
    config: &dyn ConfigAccess,
    first_bus: u8,
    last_bus: u8,
    visit: &mut dyn FnMut(Function),
) {
    for bus in first_bus..=last_bus {
        for device in 0..32 {
            let zero = PciAddress {
                bus,
                device,
                function: 0,
            };
            let Some(function0) = probe(config, zero) else {
                continue;
            };
            visit(function0);
            let multi_function = config.read8(zero, REG_HEADER + 2) & 0x80 != 0;
            if multi_function {
                for function in 1..8 {
                    let address = PciAddress { function, ..zero };
                    if let Some(f) = probe(config, address) {
                        visit(f);
                    }
                }
            }
        }
    }
}

/// Secondary bus number of a PCI-to-PCI bridge (type-1 header).
const REG_SECONDARY_BUS: u16 = 0x19;

/// Calls `visit` for every function reachable from `root_bus`: that bus, then the buses
/// behind each bridge found, each bus at most once (a bridge naming a bus already seen,
/// or its own, is not followed again).
pub fn enumerate_tree(config: &dyn ConfigAccess, root_bus: u8, visit: &mut dyn FnMut(Function)) {
    let mut seen = [0u64; 4];
    let mut pending = [0u8; 256];
    let mut pending_len = 1;
    pending[0] = root_bus;
    seen[usize::from(root_bus / 64)] |= 1 << (root_bus % 64);
    while pending_len > 0 {
        pending_len -= 1;
        let bus = pending[pending_len];
        enumerate(config, bus, bus, &mut |function| {
            if function.header_type == 1 {
                let secondary = config.read8(function.address, REG_SECONDARY_BUS);
                let bit = 1u64 << (secondary % 64);
                if seen[usize::from(secondary / 64)] & bit == 0 {
                    seen[usize::from(secondary / 64)] |= bit;
                    pending[pending_len] = secondary;
                    pending_len += 1;
                }
            }
            visit(function);
        });
    }
}

/// Sets `set` and clears `clear` in the command register; returns the new value.
pub fn update_command(config: &dyn ConfigAccess, address: PciAddress, set: u16, clear: u16) -> u16 {
    // The status half is write-one-to-clear: write zeros there so nothing is cleared.
    let command = config.read16(address, REG_COMMAND);
    let new = (command | set) & !clear;
    config.write32(address, REG_COMMAND, u32::from(new));
    new
}

/// Turns on memory decoding and bus mastering (DMA), and masks legacy INTx: the drivers
/// poll.
pub fn enable_memory_and_dma(config: &dyn ConfigAccess, address: PciAddress) -> u16 {
    update_command(
        config,
        address,
        COMMAND_MEMORY_SPACE | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE,
        0,
    )
}

fn has_capability_list(config: &dyn ConfigAccess, address: PciAddress) -> bool {
    config.read16(address, REG_COMMAND + 2) & STATUS_CAP_LIST != 0
}

#[cfg(test)]
pub mod fake;

#[cfg(test)]
mod tests;
