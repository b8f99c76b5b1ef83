// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xen_version` hypercall (`public/version.h`, `public/features.h`).

pub const XENVER_VERSION: u64 = 0;
pub const XENVER_GET_FEATURES: u64 = 6;

/// `struct xen_feature_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XenFeatureInfo {
    /// IN: which 32-bit submap.
    pub submap_idx: u32,
    /// OUT: the submap.
    pub submap: u32,
}

pub const XENFEAT_AUTO_TRANSLATED_PHYSMAP: u32 = 2;
pub const XENFEAT_GNTTAB_MAP_AVAIL_BITS: u32 = 7;
pub const XENFEAT_HVM_CALLBACK_VECTOR: u32 = 8;
pub const XENFEAT_HVM_SAFE_PVCLOCK: u32 = 9;
pub const XENFEAT_HVM_PIRQS: u32 = 10;
pub const XENFEAT_DOM0: u32 = 11;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn feature_info_layout() {
        assert_eq!(size_of::<XenFeatureInfo>(), 8);
        assert_eq!(offset_of!(XenFeatureInfo, submap), 4);
    }
}
