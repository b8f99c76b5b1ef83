// SPDX-License-Identifier: MIT OR Apache-2.0
//! Reads what the PVH loader left for us: `hvm_start_info`, the command line and the
//! memory map, copied into kernel-owned storage before anything can overwrite them.

use boot::start_info::{HvmMemmapEntry, HvmModlistEntry, HvmStartInfo, HVM_START_MAGIC};

pub const MAX_MEMMAP_ENTRIES: usize = 128;
pub const MAX_CMDLINE_LEN: usize = 1024;
/// Modules kept (blkdom takes none but a live upgrade's handover block; a test may give
/// the next image as one), and the longest module command line kept.
pub const MAX_MODULES: usize = 8;
pub const MAX_MODULE_CMDLINE: usize = 64;

/// A module the loader listed: where, how long, and its command line (truncated to
/// `MAX_MODULE_CMDLINE`, so a longer one never equals a name we look for).
#[derive(Clone, Copy)]
pub struct BootModule {
    pub paddr: u64,
    pub size: u64,
    cmdline: [u8; MAX_MODULE_CMDLINE],
    cmdline_len: usize,
    cmdline_truncated: bool,
}

impl BootModule {
    pub fn cmdline(&self) -> &[u8] {
        if self.cmdline_truncated {
            // Not a name anyone looks for: nothing matches it.
            return b"\0truncated";
        }
        &self.cmdline[..self.cmdline_len]
    }

    pub fn as_triple(&self) -> (u64, u64, &[u8]) {
        (self.paddr, self.size, self.cmdline())
    }
}

/// The boot information, kept for a live upgrade's new `hvm_start_info`.
static KEPT: spin::Once<BootInfo> = spin::Once::new();

/// Keeps `info` for good (once, at boot).
pub fn keep(info: BootInfo) -> &'static BootInfo {
    KEPT.call_once(|| info)
}

pub fn get() -> Option<&'static BootInfo> {
    KEPT.get()
}

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
    modules: [BootModule; MAX_MODULES],
    modules_len: usize,
    /// Modules beyond MAX_MODULES (ignored, but their memory is kept out all the same).
    pub modules_dropped: usize,
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
            modules: [BootModule {
                paddr: 0,
                size: 0,
                cmdline: [0; MAX_MODULE_CMDLINE],
                cmdline_len: 0,
                cmdline_truncated: false,
            }; MAX_MODULES],
            modules_len: 0,
            modules_dropped: 0,
        };
        let entry_size = core::mem::size_of::<HvmModlistEntry>() as u64;
        for i in 0..start_info.nr_modules as usize {
            if i >= MAX_MODULES {
                info.modules_dropped += 1;
                continue;
            }
            let entry: HvmModlistEntry =
                read_phys(start_info.modlist_paddr + i as u64 * entry_size)?;
            let module = &mut info.modules[i];
            module.paddr = entry.paddr;
            module.size = entry.size;
            if entry.cmdline_paddr != 0 {
                loop {
                    let byte: u8 = read_phys(entry.cmdline_paddr + module.cmdline_len as u64)?;
                    if byte == 0 {
                        break;
                    }
                    if module.cmdline_len == MAX_MODULE_CMDLINE {
                        module.cmdline_truncated = true;
                        break;
                    }
                    module.cmdline[module.cmdline_len] = byte;
                    module.cmdline_len += 1;
                }
            }
            info.modules_len += 1;
        }
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

    pub fn modules(&self) -> &[BootModule] {
        &self.modules[..self.modules_len]
    }

    /// RAM below the identity map's end, as the memory map says (no heap needed).
    pub fn ram(&self) -> ([core::ops::Range<u64>; MAX_MEMMAP_ENTRIES], usize) {
        let mut ram = core::array::from_fn(|_| 0..0);
        let mut n = 0;
        for e in self
            .memmap()
            .iter()
            .filter(|e| e.kind == boot::start_info::memmap_type::RAM)
        {
            let end = e
                .addr
                .saturating_add(e.size)
                .min(crate::arch::paging::IDENTITY_MAPPED_LIMIT);
            if e.addr < end {
                ram[n] = e.addr..end;
                n += 1;
            }
        }
        (ram, n)
    }

    pub fn memmap(&self) -> &[HvmMemmapEntry] {
        &self.memmap[..self.memmap_len]
    }

    pub fn cmdline(&self) -> &str {
        // Only printable ASCII was stored.
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }
}
