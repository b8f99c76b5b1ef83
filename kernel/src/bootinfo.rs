// SPDX-License-Identifier: MIT OR Apache-2.0
//! Reads what the PVH loader left for us: `hvm_start_info`, the command line and the
//! memory map, copied into kernel-owned storage before anything can overwrite them.

use boot::start_info::{HvmMemmapEntry, HvmStartInfo, HVM_START_MAGIC};

pub const MAX_MEMMAP_ENTRIES: usize = 128;
pub const MAX_CMDLINE_LEN: usize = 1024;

pub struct BootInfo {
    pub start_info_paddr: u64,
    pub start_info: HvmStartInfo,
    memmap: [HvmMemmapEntry; MAX_MEMMAP_ENTRIES],
    memmap_len: usize,
    /// Entries the loader gave beyond MAX_MEMMAP_ENTRIES (ignored).
    pub memmap_dropped: usize,
    cmdline: [u8; MAX_CMDLINE_LEN],
    cmdline_len: usize,
    pub cmdline_truncated: bool,
}

#[derive(Debug)]
pub enum BootInfoError {
    NotIdentityMapped(u64),
    BadMagic(u32),
}

impl core::fmt::Display for BootInfoError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BootInfoError::NotIdentityMapped(paddr) => {
                write!(f, "address {paddr:#x} is outside the boot identity map")
            }
            BootInfoError::BadMagic(magic) => {
                write!(f, "magic {magic:#x}, expected {HVM_START_MAGIC:#x}")
            }
        }
    }
}

impl core::error::Error for BootInfoError {}

/// Copies `T` from physical address `paddr` (below 4 GiB, so identity mapped).
fn read_phys<T: Copy>(paddr: u64) -> Result<T, BootInfoError> {
    if !crate::physmem::in_identity_map(paddr, core::mem::size_of::<T>()) {
        return Err(BootInfoError::NotIdentityMapped(paddr));
    }
    // SAFETY: the boot loader's structures, which nothing writes; `T` is plain old data
    // (integers only) for which any bit pattern is valid.
    Ok(unsafe { crate::physmem::read_value(paddr) })
}

impl BootInfo {
    pub fn read(start_info_paddr: u64) -> Result<BootInfo, BootInfoError> {
        let start_info: HvmStartInfo = read_phys(start_info_paddr)?;
        if start_info.magic != HVM_START_MAGIC {
            return Err(BootInfoError::BadMagic(start_info.magic));
        }
        let mut info = BootInfo {
            start_info_paddr,
            start_info,
            memmap: [HvmMemmapEntry::default(); MAX_MEMMAP_ENTRIES],
            memmap_len: 0,
            memmap_dropped: 0,
            cmdline: [0; MAX_CMDLINE_LEN],
            cmdline_len: 0,
            cmdline_truncated: false,
        };
        if start_info.version >= 1 && start_info.memmap_paddr != 0 {
            let entries = start_info.memmap_entries as usize;
            info.memmap_len = entries.min(MAX_MEMMAP_ENTRIES);
            info.memmap_dropped = entries - info.memmap_len;
            let entry_size = core::mem::size_of::<HvmMemmapEntry>() as u64;
            for i in 0..info.memmap_len {
                info.memmap[i] = read_phys(start_info.memmap_paddr + i as u64 * entry_size)?;
            }
        }
        if start_info.cmdline_paddr != 0 {
            while info.cmdline_len < MAX_CMDLINE_LEN {
                let byte: u8 = read_phys(start_info.cmdline_paddr + info.cmdline_len as u64)?;
                if byte == 0 {
                    break;
                }
                // Keep the command line printable ASCII; anything else becomes '?'.
                info.cmdline[info.cmdline_len] = if byte.is_ascii_graphic() || byte == b' ' {
                    byte
                } else {
                    b'?'
                };
                info.cmdline_len += 1;
            }
            info.cmdline_truncated = info.cmdline_len == MAX_CMDLINE_LEN;
        }
        Ok(info)
    }

    pub fn memmap(&self) -> &[HvmMemmapEntry] {
        &self.memmap[..self.memmap_len]
    }

    pub fn cmdline(&self) -> &str {
        // Only printable ASCII was stored.
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }
}
