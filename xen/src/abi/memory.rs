// SPDX-License-Identifier: MIT OR Apache-2.0
//! `memory_op` (`public/memory.h`).

use super::DomId;

pub const XENMEM_ADD_TO_PHYSMAP: u64 = 7;
pub const XENMEM_MEMORY_MAP: u64 = 9;
pub const XENMEM_REMOVE_FROM_PHYSMAP: u64 = 15;

/// `XENMAPSPACE_*`: what `add_to_physmap` maps.
pub const XENMAPSPACE_SHARED_INFO: u32 = 0;
pub const XENMAPSPACE_GRANT_TABLE: u32 = 1;
pub const XENMAPSPACE_GMFN: u32 = 2;
pub const XENMAPSPACE_GMFN_RANGE: u32 = 3;
/// Or'ed into `idx` with `XENMAPSPACE_grant_table` to map a (v2) status frame.
pub const XENMAPIDX_GRANT_TABLE_STATUS: u64 = 0x8000_0000;

/// `struct xen_add_to_physmap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XenAddToPhysmap {
    pub domid: DomId,
    /// Pages for `XENMAPSPACE_gmfn_range`.
    pub size: u16,
    pub space: u32,
    pub idx: u64,
    /// Guest frame where the page appears.
    pub gpfn: u64,
}

/// `struct xen_remove_from_physmap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XenRemoveFromPhysmap {
    pub domid: DomId,
    pub gpfn: u64,
}

/// `struct xen_memory_map`: `buffer` is a guest pointer to `E820Entry`s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XenMemoryMap {
    pub nr_entries: u32,
    pub buffer: u64,
}

/// Xen's `struct e820entry` (packed, 20 bytes: `xen/arch/x86/include/asm/e820.h`), the
/// format `XENMEM_memory_map` fills in.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn add_to_physmap_layout() {
        assert_eq!(size_of::<XenAddToPhysmap>(), 24);
        assert_eq!(offset_of!(XenAddToPhysmap, size), 2);
        assert_eq!(offset_of!(XenAddToPhysmap, space), 4);
        assert_eq!(offset_of!(XenAddToPhysmap, idx), 8);
        assert_eq!(offset_of!(XenAddToPhysmap, gpfn), 16);
    }

    #[test]
    fn remove_from_physmap_layout() {
        assert_eq!(size_of::<XenRemoveFromPhysmap>(), 16);
        assert_eq!(offset_of!(XenRemoveFromPhysmap, gpfn), 8);
    }

    #[test]
    fn memory_map_layout() {
        assert_eq!(size_of::<XenMemoryMap>(), 16);
        assert_eq!(offset_of!(XenMemoryMap, buffer), 8);
        assert_eq!(size_of::<E820Entry>(), 20);
        assert_eq!(offset_of!(E820Entry, size), 8);
        assert_eq!(offset_of!(E820Entry, kind), 16);
    }
}
