// SPDX-License-Identifier: MIT OR Apache-2.0
//! The capability list: a walk bounded against loops, MSI-X and virtio vendor
//! capabilities.

use crate::{has_capability_list, ConfigAccess, PciAddress, REG_CAP_POINTER};

pub const CAP_ID_VENDOR: u8 = 0x09;
pub const CAP_ID_MSIX: u8 = 0x11;

/// The most capabilities 192 bytes of capability space can hold; a longer walk loops.
const MAX_CAPABILITIES: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Offset of the capability header in configuration space.
    pub offset: u16,
    pub id: u8,
    /// Bytes 2 and 3 of the header, read with it (capability-specific: a vendor
    /// capability's length, then for virtio its `cfg_type`).
    pub info: u16,
}

/// Iterator over a function's capabilities.
pub struct Capabilities<'a> {
    config: &'a dyn ConfigAccess,
    address: PciAddress,
    next: u16,
    seen: usize,
}

impl Iterator for Capabilities<'_> {
    type Item = Capability;

    fn next(&mut self) -> Option<Capability> {
        // Pointers below 0x40 point into the standard header: the list ends (or lies).
        if self.next < 0x40 || self.next > 0xfc || self.seen >= MAX_CAPABILITIES {
            return None;
        }
        self.seen += 1;
        let offset = self.next;
        // One read for the whole header: every access is a VM exit on a virtual machine.
        let header = self.config.read32(self.address, offset);
        self.next = ((header >> 8) & 0xfc) as u16;
        Some(Capability {
            offset,
            id: header as u8,
            info: (header >> 16) as u16,
        })
    }
}

pub fn capabilities(config: &dyn ConfigAccess, address: PciAddress) -> Capabilities<'_> {
    let next = if has_capability_list(config, address) {
        u16::from(config.read8(address, REG_CAP_POINTER) & 0xfc)
    } else {
        0
    };
    Capabilities {
        config,
        address,
        next,
        seen: 0,
    }
}

pub fn find_capability(config: &dyn ConfigAccess, address: PciAddress, id: u8) -> Option<u16> {
    capabilities(config, address)
        .find(|c| c.id == id)
        .map(|c| c.offset)
}

/// Where an MSI-X table lives and how big it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixInfo {
    pub capability_offset: u16,
    pub table_size: u16,
    pub table_bar: u8,
    pub table_offset: u32,
    pub pba_bar: u8,
    pub pba_offset: u32,
    pub enabled: bool,
}

pub fn msix(config: &dyn ConfigAccess, address: PciAddress) -> Option<MsixInfo> {
    let offset = find_capability(config, address, CAP_ID_MSIX)?;
    let control = config.read16(address, offset + 2);
    let table = config.read32(address, offset + 4);
    let pba = config.read32(address, offset + 8);
    Some(MsixInfo {
        capability_offset: offset,
        table_size: (control & 0x7ff) + 1,
        table_bar: (table & 7) as u8,
        table_offset: table & !7,
        pba_bar: (pba & 7) as u8,
        pba_offset: pba & !7,
        enabled: control & (1 << 15) != 0,
    })
}

/// The virtio 1.0 structure a vendor capability points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VirtioCapKind {
    Common,
    /// Queue notifications; doorbell of queue q at `offset + notify_off(q) * multiplier`.
    Notify {
        multiplier: u32,
    },
    Isr,
    Device,
    PciConfig,
}

/// One virtio PCI capability: a window of `length` bytes at `offset` in BAR `bar`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioCap {
    pub kind: VirtioCapKind,
    pub bar: u8,
    pub offset: u32,
    pub length: u32,
}

/// The virtio vendor capabilities of a function, in list order (unknown kinds and
/// truncated capabilities are skipped).
pub fn virtio_capabilities(
    config: &dyn ConfigAccess,
    address: PciAddress,
) -> impl Iterator<Item = VirtioCap> + '_ {
    capabilities(config, address)
        .filter(|c| c.id == CAP_ID_VENDOR)
        .filter_map(move |c| {
            let [cap_len, cfg_type] = c.info.to_le_bytes();
            if cap_len < 16 {
                return None;
            }
            let bar = config.read8(address, c.offset + 4);
            if bar > 5 {
                return None;
            }
            let kind = match cfg_type {
                1 => VirtioCapKind::Common,
                2 if cap_len >= 20 => VirtioCapKind::Notify {
                    multiplier: config.read32(address, c.offset + 16),
                },
                3 => VirtioCapKind::Isr,
                4 => VirtioCapKind::Device,
                5 => VirtioCapKind::PciConfig,
                _ => return None,
            };
            Some(VirtioCap {
                kind,
                bar,
                offset: config.read32(address, c.offset + 8),
                length: config.read32(address, c.offset + 12),
            })
        })
}
