// SPDX-License-Identifier: MIT OR Apache-2.0
//! `grant_table_op` and grant entries, v1 (`public/grant_table.h`).

use super::DomId;

pub type GrantRef = u32;
pub type GrantHandle = u32;
/// `int16_t status` of a grant operation: a `GNTST_*` code (0 okay, negative an error),
/// as Xen writes it. [`crate::grant::GrantStatus`] decodes it.
pub type RawGrantStatus = i16;

pub const GNTTABOP_MAP_GRANT_REF: u64 = 0;
pub const GNTTABOP_UNMAP_GRANT_REF: u64 = 1;
pub const GNTTABOP_SETUP_TABLE: u64 = 2;
pub const GNTTABOP_COPY: u64 = 5;
pub const GNTTABOP_QUERY_SIZE: u64 = 6;

/// `struct grant_entry_v1`: 8 bytes, 512 per page.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrantEntryV1 {
    /// `GTF_*`; written last when granting, so the peer never sees a half entry.
    pub flags: u16,
    pub domid: DomId,
    /// Guest frame number the grantee may access.
    pub frame: u32,
}

pub const GRANT_ENTRIES_V1_PER_PAGE: usize = super::PAGE_SIZE / 8;
/// Entries 0..8 are reserved (0 console, 1 xenstore, set up by the toolstack).
pub const GNTTAB_NR_RESERVED_ENTRIES: u32 = 8;

pub const GTF_INVALID: u16 = 0;
pub const GTF_PERMIT_ACCESS: u16 = 1;
pub const GTF_TYPE_MASK: u16 = 3;
pub const GTF_READONLY: u16 = 1 << 2;
/// Set by Xen while the grantee has the frame mapped/in use for reading or writing.
pub const GTF_READING: u16 = 1 << 3;
pub const GTF_WRITING: u16 = 1 << 4;

/// `GNTMAP_*` flags of map requests.
pub const GNTMAP_DEVICE_MAP: u32 = 1 << 0;
pub const GNTMAP_HOST_MAP: u32 = 1 << 1;
pub const GNTMAP_READONLY: u32 = 1 << 2;

/// `struct gnttab_map_grant_ref`. For HVM/PVH callers `host_addr` is the
/// guest-physical address where the granted frame appears.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GnttabMapGrantRef {
    pub host_addr: u64,
    pub flags: u32,
    pub ref_: GrantRef,
    pub dom: DomId,
    /// OUT: `GNTST_*`.
    pub status: RawGrantStatus,
    /// OUT.
    pub handle: GrantHandle,
    /// OUT.
    pub dev_bus_addr: u64,
}

/// `struct gnttab_unmap_grant_ref`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GnttabUnmapGrantRef {
    pub host_addr: u64,
    pub dev_bus_addr: u64,
    pub handle: GrantHandle,
    /// OUT: `GNTST_*`.
    pub status: RawGrantStatus,
}

/// `struct gnttab_setup_table`; `frame_list` is a guest pointer to `u64` frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GnttabSetupTable {
    pub dom: DomId,
    pub nr_frames: u32,
    /// OUT.
    pub status: RawGrantStatus,
    pub frame_list: u64,
}

/// `struct gnttab_query_size`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GnttabQuerySize {
    pub dom: DomId,
    /// OUT: frames in use.
    pub nr_frames: u32,
    /// OUT: the domain's limit.
    pub max_nr_frames: u32,
    /// OUT.
    pub status: RawGrantStatus,
}

/// `struct gnttab_copy_ptr`: `u` is a grant ref (with `GNTCOPY_*_gref`) or a GMFN.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GnttabCopyPtr {
    pub u: u64,
    pub domid: DomId,
    pub offset: u16,
}

pub const GNTCOPY_SOURCE_GREF: u16 = 1 << 0;
pub const GNTCOPY_DEST_GREF: u16 = 1 << 1;

/// `struct gnttab_copy`. Neither side may cross a page boundary.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GnttabCopy {
    pub source: GnttabCopyPtr,
    pub dest: GnttabCopyPtr,
    pub len: u16,
    pub flags: u16,
    /// OUT.
    pub status: RawGrantStatus,
}

/// `GNTST_*` per-operation status codes.
pub const GNTST_OKAY: RawGrantStatus = 0;
pub const GNTST_GENERAL_ERROR: RawGrantStatus = -1;
pub const GNTST_BAD_DOMAIN: RawGrantStatus = -2;
pub const GNTST_BAD_GNTREF: RawGrantStatus = -3;
pub const GNTST_BAD_HANDLE: RawGrantStatus = -4;
pub const GNTST_BAD_VIRT_ADDR: RawGrantStatus = -5;
pub const GNTST_BAD_DEV_ADDR: RawGrantStatus = -6;
pub const GNTST_NO_DEVICE_SPACE: RawGrantStatus = -7;
pub const GNTST_PERMISSION_DENIED: RawGrantStatus = -8;
pub const GNTST_BAD_PAGE: RawGrantStatus = -9;
pub const GNTST_BAD_COPY_ARG: RawGrantStatus = -10;
pub const GNTST_ADDRESS_TOO_BIG: RawGrantStatus = -11;
pub const GNTST_EAGAIN: RawGrantStatus = -12;
pub const GNTST_NO_SPACE: RawGrantStatus = -13;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn grant_entry_layout() {
        assert_eq!(size_of::<GrantEntryV1>(), 8);
        assert_eq!(offset_of!(GrantEntryV1, domid), 2);
        assert_eq!(offset_of!(GrantEntryV1, frame), 4);
        assert_eq!(GRANT_ENTRIES_V1_PER_PAGE, 512);
    }

    #[test]
    fn map_grant_ref_layout() {
        assert_eq!(size_of::<GnttabMapGrantRef>(), 32);
        assert_eq!(offset_of!(GnttabMapGrantRef, flags), 8);
        assert_eq!(offset_of!(GnttabMapGrantRef, ref_), 12);
        assert_eq!(offset_of!(GnttabMapGrantRef, dom), 16);
        assert_eq!(offset_of!(GnttabMapGrantRef, status), 18);
        assert_eq!(offset_of!(GnttabMapGrantRef, handle), 20);
        assert_eq!(offset_of!(GnttabMapGrantRef, dev_bus_addr), 24);
    }

    #[test]
    fn unmap_grant_ref_layout() {
        assert_eq!(size_of::<GnttabUnmapGrantRef>(), 24);
        assert_eq!(offset_of!(GnttabUnmapGrantRef, dev_bus_addr), 8);
        assert_eq!(offset_of!(GnttabUnmapGrantRef, handle), 16);
        assert_eq!(offset_of!(GnttabUnmapGrantRef, status), 20);
    }

    #[test]
    fn setup_and_query_layout() {
        assert_eq!(size_of::<GnttabSetupTable>(), 24);
        assert_eq!(offset_of!(GnttabSetupTable, nr_frames), 4);
        assert_eq!(offset_of!(GnttabSetupTable, status), 8);
        assert_eq!(offset_of!(GnttabSetupTable, frame_list), 16);
        assert_eq!(size_of::<GnttabQuerySize>(), 16);
        assert_eq!(offset_of!(GnttabQuerySize, nr_frames), 4);
        assert_eq!(offset_of!(GnttabQuerySize, max_nr_frames), 8);
        assert_eq!(offset_of!(GnttabQuerySize, status), 12);
    }

    #[test]
    fn copy_layout() {
        assert_eq!(size_of::<GnttabCopyPtr>(), 16);
        assert_eq!(offset_of!(GnttabCopyPtr, domid), 8);
        assert_eq!(offset_of!(GnttabCopyPtr, offset), 10);
        assert_eq!(size_of::<GnttabCopy>(), 40);
        assert_eq!(offset_of!(GnttabCopy, dest), 16);
        assert_eq!(offset_of!(GnttabCopy, len), 32);
        assert_eq!(offset_of!(GnttabCopy, flags), 34);
        assert_eq!(offset_of!(GnttabCopy, status), 36);
    }
}
