// SPDX-License-Identifier: MIT OR Apache-2.0
//! `hvm_start_info` as Xen's `public/arch-x86/hvm/start_info.h` defines it (version 1).
//!
//! Both Xen's PVH domain builder and QEMU's PVH option ROM hand the kernel this
//! structure; the memory map fields exist from version 1 on.

/// `XEN_HVM_START_MAGIC_VALUE`.
pub const HVM_START_MAGIC: u32 = 0x336e_c578;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HvmStartInfo {
    pub magic: u32,
    pub version: u32,
    pub flags: u32,
    pub nr_modules: u32,
    pub modlist_paddr: u64,
    pub cmdline_paddr: u64,
    pub rsdp_paddr: u64,
    pub memmap_paddr: u64,
    pub memmap_entries: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HvmModlistEntry {
    pub paddr: u64,
    pub size: u64,
    pub cmdline_paddr: u64,
    pub reserved: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HvmMemmapEntry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
    pub reserved: u32,
}

/// `XEN_HVM_MEMMAP_TYPE_*` (the E820 numbering).
pub mod memmap_type {
    pub const RAM: u32 = 1;
    pub const RESERVED: u32 = 2;
    pub const ACPI: u32 = 3;
    pub const NVS: u32 = 4;
    pub const UNUSABLE: u32 = 5;
    pub const DISABLED: u32 = 6;
    pub const PMEM: u32 = 7;
}

/// A readable name for a memory map entry type, for the boot log.
pub fn memmap_type_name(kind: u32) -> &'static str {
    match kind {
        memmap_type::RAM => "ram",
        memmap_type::RESERVED => "reserved",
        memmap_type::ACPI => "acpi",
        memmap_type::NVS => "acpi-nvs",
        memmap_type::UNUSABLE => "unusable",
        memmap_type::DISABLED => "disabled",
        memmap_type::PMEM => "pmem",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    // Offsets and sizes from xen/include/public/arch-x86/hvm/start_info.h.
    #[test]
    fn start_info_layout_matches_xen() {
        assert_eq!(size_of::<HvmStartInfo>(), 56);
        assert_eq!(offset_of!(HvmStartInfo, nr_modules), 12);
        assert_eq!(offset_of!(HvmStartInfo, modlist_paddr), 16);
        assert_eq!(offset_of!(HvmStartInfo, cmdline_paddr), 24);
        assert_eq!(offset_of!(HvmStartInfo, rsdp_paddr), 32);
        assert_eq!(offset_of!(HvmStartInfo, memmap_paddr), 40);
        assert_eq!(offset_of!(HvmStartInfo, memmap_entries), 48);
    }

    #[test]
    fn modlist_and_memmap_layout_matches_xen() {
        assert_eq!(size_of::<HvmModlistEntry>(), 32);
        assert_eq!(offset_of!(HvmModlistEntry, cmdline_paddr), 16);
        assert_eq!(size_of::<HvmMemmapEntry>(), 24);
        assert_eq!(offset_of!(HvmMemmapEntry, kind), 16);
    }

    #[test]
    fn memmap_type_names() {
        assert_eq!(memmap_type_name(memmap_type::RAM), "ram");
        assert_eq!(memmap_type_name(memmap_type::ACPI), "acpi");
        assert_eq!(memmap_type_name(99), "unknown");
    }
}
