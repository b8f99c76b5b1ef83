// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shared_info` and `vcpu_info` (`public/xen.h`, `public/arch-x86/xen*.h`), x86_64.
//!
//! These structs describe the page Xen shares with the domain. blkdom never holds a
//! Rust reference to that page (Xen writes it concurrently); `crate::shared_info`
//! reads it through atomics at the offsets these types define.

/// `XEN_LEGACY_MAX_VCPUS` on x86: `vcpu_info` slots inside `shared_info`.
pub const XEN_LEGACY_MAX_VCPUS: usize = 32;
/// Bits in an `xen_ulong_t` (64 on x86_64).
pub const BITS_PER_XEN_ULONG: usize = 64;
/// 2-level event channel ABI: words in `evtchn_pending`/`evtchn_mask`.
pub const EVTCHN_2L_WORDS: usize = BITS_PER_XEN_ULONG;
/// `EVTCHN_2L_NR_CHANNELS`: 4096 ports on x86_64.
pub const EVTCHN_2L_NR_CHANNELS: usize = EVTCHN_2L_WORDS * BITS_PER_XEN_ULONG;

/// `struct vcpu_time_info` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VcpuTimeInfo {
    pub version: u32,
    pub pad0: u32,
    pub tsc_timestamp: u64,
    pub system_time: u64,
    pub tsc_to_system_mul: u32,
    pub tsc_shift: i8,
    pub flags: u8,
    pub pad1: [u8; 2],
}

/// `struct arch_vcpu_info` (x86_64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ArchVcpuInfo {
    pub cr2: u64,
    pub pad: u64,
}

/// `struct vcpu_info` (64 bytes on x86).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VcpuInfo {
    /// Written non-zero by Xen when an event is pending for this vCPU; the guest clears
    /// it *before* scanning, so a new event after the scan re-raises it.
    pub evtchn_upcall_pending: u8,
    /// PV only; HVM/PVH vCPUs are masked by RFLAGS.IF instead.
    pub evtchn_upcall_mask: u8,
    /// One bit per word of `shared_info.evtchn_pending` with something pending for us.
    pub evtchn_pending_sel: u64,
    pub arch: ArchVcpuInfo,
    pub time: VcpuTimeInfo,
}

/// `struct arch_shared_info` (x86_64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ArchSharedInfo {
    pub max_pfn: u64,
    pub pfn_to_mfn_frame_list_list: u64,
    pub nmi_reason: u64,
    pub p2m_cr3: u64,
    pub p2m_vaddr: u64,
    pub p2m_generation: u64,
}

/// `struct shared_info` (3136 bytes on x86_64; Xen says not to rely on the size).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SharedInfo {
    pub vcpu_info: [VcpuInfo; XEN_LEGACY_MAX_VCPUS],
    pub evtchn_pending: [u64; EVTCHN_2L_WORDS],
    pub evtchn_mask: [u64; EVTCHN_2L_WORDS],
    pub wc_version: u32,
    pub wc_sec: u32,
    pub wc_nsec: u32,
    pub wc_sec_hi: u32,
    pub arch: ArchSharedInfo,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn vcpu_time_info_layout() {
        assert_eq!(size_of::<VcpuTimeInfo>(), 32);
        assert_eq!(offset_of!(VcpuTimeInfo, tsc_timestamp), 8);
        assert_eq!(offset_of!(VcpuTimeInfo, system_time), 16);
        assert_eq!(offset_of!(VcpuTimeInfo, tsc_to_system_mul), 24);
        assert_eq!(offset_of!(VcpuTimeInfo, tsc_shift), 28);
        assert_eq!(offset_of!(VcpuTimeInfo, flags), 29);
    }

    #[test]
    fn vcpu_info_layout() {
        assert_eq!(size_of::<ArchVcpuInfo>(), 16);
        assert_eq!(size_of::<VcpuInfo>(), 64);
        assert_eq!(offset_of!(VcpuInfo, evtchn_upcall_pending), 0);
        assert_eq!(offset_of!(VcpuInfo, evtchn_upcall_mask), 1);
        assert_eq!(offset_of!(VcpuInfo, evtchn_pending_sel), 8);
        assert_eq!(offset_of!(VcpuInfo, arch), 16);
        assert_eq!(offset_of!(VcpuInfo, time), 32);
    }

    #[test]
    fn shared_info_layout() {
        assert_eq!(size_of::<ArchSharedInfo>(), 48);
        assert_eq!(offset_of!(ArchSharedInfo, nmi_reason), 16);
        assert_eq!(offset_of!(ArchSharedInfo, p2m_generation), 40);
        assert_eq!(size_of::<SharedInfo>(), 3136);
        assert_eq!(offset_of!(SharedInfo, vcpu_info), 0);
        assert_eq!(offset_of!(SharedInfo, evtchn_pending), 2048);
        assert_eq!(offset_of!(SharedInfo, evtchn_mask), 2560);
        assert_eq!(offset_of!(SharedInfo, wc_version), 3072);
        assert_eq!(offset_of!(SharedInfo, wc_sec), 3076);
        assert_eq!(offset_of!(SharedInfo, wc_nsec), 3080);
        assert_eq!(offset_of!(SharedInfo, wc_sec_hi), 3084);
        assert_eq!(offset_of!(SharedInfo, arch), 3088);
        assert_eq!(EVTCHN_2L_NR_CHANNELS, 4096);
    }
}
