// SPDX-License-Identifier: MIT OR Apache-2.0
//! Base address registers: decoding and sizing.

use crate::{update_command, ConfigAccess, PciAddress, COMMAND_IO_SPACE, COMMAND_MEMORY_SPACE};
use alloc::vec::Vec;

/// One decoded BAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bar {
    Memory {
        address: u64,
        size: u64,
        /// Takes two BAR slots (64-bit address).
        wide: bool,
        prefetchable: bool,
    },
    Io {
        port: u32,
        size: u32,
    },
}

impl Bar {
    pub fn memory_range(&self) -> Option<(u64, u64)> {
        match *self {
            Bar::Memory { address, size, .. } => Some((address, size)),
            Bar::Io { .. } => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarError {
    /// Index past the last BAR of a type-0 header (or a 64-bit BAR in slot 5).
    NoSuchBar(u8),
    /// Memory type 1 (reserved by the spec).
    ReservedType(u8),
    /// The function is a bridge or other header type with other BAR rules.
    NotADevice,
}

impl core::fmt::Display for BarError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BarError::NoSuchBar(index) => write!(f, "no BAR {index}"),
            BarError::ReservedType(index) => write!(f, "BAR {index} has the reserved memory type"),
            BarError::NotADevice => f.write_str("not a type-0 (device) header"),
        }
    }
}

impl core::error::Error for BarError {}

const BAR0: u16 = 0x10;
const BAR_IO: u32 = 1;
const BAR_MEM_TYPE_MASK: u32 = 0b110;
const BAR_MEM_TYPE_64: u32 = 0b100;
const BAR_MEM_PREFETCH: u32 = 1 << 3;

/// Decodes and sizes BAR `index` (0..6). Decoding is off while the BAR is probed with
/// all-ones and back on (as it was) afterwards. Ok(None): the BAR is not implemented.
pub fn read_bar(
    config: &dyn ConfigAccess,
    address: PciAddress,
    index: u8,
) -> Result<Option<Bar>, BarError> {
    if index >= 6 {
        return Err(BarError::NoSuchBar(index));
    }
    if config.read8(address, crate::REG_HEADER + 2) & 0x7f != 0 {
        return Err(BarError::NotADevice);
    }
    let offset = BAR0 + u16::from(index) * 4;
    let original = config.read32(address, offset);
    let wide = original & BAR_IO == 0 && original & BAR_MEM_TYPE_MASK == BAR_MEM_TYPE_64;
    if original & BAR_IO == 0 && original & BAR_MEM_TYPE_MASK == 0b010 {
        return Err(BarError::ReservedType(index));
    }
    if wide && index == 5 {
        return Err(BarError::NoSuchBar(index));
    }
    let command = config.read16(address, crate::REG_COMMAND);
    update_command(config, address, 0, COMMAND_IO_SPACE | COMMAND_MEMORY_SPACE);
    config.write32(address, offset, u32::MAX);
    let low_mask = config.read32(address, offset);
    config.write32(address, offset, original);
    let high = if wide {
        let original_high = config.read32(address, offset + 4);
        config.write32(address, offset + 4, u32::MAX);
        let high_mask = config.read32(address, offset + 4);
        config.write32(address, offset + 4, original_high);
        Some((original_high, high_mask))
    } else {
        None
    };
    config.write32(address, crate::REG_COMMAND, u32::from(command));

    if original & BAR_IO != 0 {
        let mut mask = low_mask & !0x3;
        if mask == 0 {
            return Ok(None);
        }
        // Many devices implement only 16 address bits for I/O; the rest read as zero.
        if mask & 0xffff_0000 == 0 {
            mask |= 0xffff_0000;
        }
        return Ok(Some(Bar::Io {
            port: original & !0x3,
            size: (!mask).wrapping_add(1),
        }));
    }
    let (base, mask) = match high {
        Some((original_high, high_mask)) => (
            (u64::from(original_high) << 32) | u64::from(original & !0xf),
            (u64::from(high_mask) << 32) | u64::from(low_mask & !0xf),
        ),
        None => (
            u64::from(original & !0xf),
            u64::from(low_mask & !0xf) | 0xffff_ffff_0000_0000,
        ),
    };
    if mask == 0 || mask == 0xffff_ffff_0000_0000 {
        return Ok(None);
    }
    Ok(Some(Bar::Memory {
        address: base,
        size: (!mask).wrapping_add(1),
        wide,
        prefetchable: original & BAR_MEM_PREFETCH != 0,
    }))
}

/// The addresses of the assigned memory BARs of the device at `address` (a type-0
/// header), read without sizing them: one read per BAR register, where sizing takes a
/// dozen (each a VM exit on a virtual machine). Unassigned (zero), I/O and reserved-type
/// BARs are left out; a 64-bit BAR's upper half is read with it.
pub fn memory_bar_addresses(config: &dyn ConfigAccess, address: PciAddress) -> Vec<u64> {
    let mut addresses = Vec::new();
    let mut index = 0u16;
    while index < 6 {
        let offset = BAR0 + index * 4;
        let low = config.read32(address, offset);
        let wide = low & BAR_IO == 0 && low & BAR_MEM_TYPE_MASK == BAR_MEM_TYPE_64;
        let base = if low & BAR_IO != 0 || low & BAR_MEM_TYPE_MASK == 0b010 {
            0
        } else if wide && index < 5 {
            (u64::from(config.read32(address, offset + 4)) << 32) | u64::from(low & !0xf)
        } else if wide {
            // A 64-bit BAR in the last slot: read_bar refuses it too.
            0
        } else {
            u64::from(low & !0xf)
        };
        if base != 0 {
            addresses.push(base);
        }
        index += if wide { 2 } else { 1 };
    }
    addresses
}
