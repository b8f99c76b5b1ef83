// SPDX-License-Identifier: MIT OR Apache-2.0
//! `vcpu_op` (`public/vcpu.h`) and the HVM/PVH vCPU start context
//! (`public/hvm/hvm_vcpu.h`).

pub const VCPUOP_INITIALISE: u64 = 0;
pub const VCPUOP_UP: u64 = 1;
pub const VCPUOP_DOWN: u64 = 2;
pub const VCPUOP_IS_UP: u64 = 3;
pub const VCPUOP_STOP_PERIODIC_TIMER: u64 = 7;
pub const VCPUOP_REGISTER_VCPU_INFO: u64 = 10;

/// `struct vcpu_register_vcpu_info`. `mfn` is a guest frame for HVM/PVH callers; the
/// 64-byte `vcpu_info` must not cross a page boundary.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuRegisterVcpuInfo {
    pub mfn: u64,
    pub offset: u32,
    pub rsvd: u32,
}

pub const VCPU_HVM_MODE_32B: u32 = 0;
pub const VCPU_HVM_MODE_64B: u32 = 1;

/// `struct vcpu_hvm_x86_32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuHvmX86_32 {
    pub eax: u32,
    pub ecx: u32,
    pub edx: u32,
    pub ebx: u32,
    pub esp: u32,
    pub ebp: u32,
    pub esi: u32,
    pub edi: u32,
    pub eip: u32,
    pub eflags: u32,
    pub cr0: u32,
    pub cr3: u32,
    pub cr4: u32,
    pub pad1: u32,
    pub efer: u64,
    pub cs_base: u32,
    pub ds_base: u32,
    pub ss_base: u32,
    pub es_base: u32,
    pub tr_base: u32,
    pub cs_limit: u32,
    pub ds_limit: u32,
    pub ss_limit: u32,
    pub es_limit: u32,
    pub tr_limit: u32,
    pub cs_ar: u16,
    pub ds_ar: u16,
    pub ss_ar: u16,
    pub es_ar: u16,
    pub tr_ar: u16,
    pub pad2: [u16; 3],
}

/// `struct vcpu_hvm_x86_64`. Xen loads flat 64-bit CS/DS/SS/ES and a busy TSS itself;
/// the new vCPU must load its own GDT/IDT/TR before relying on them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuHvmX86_64 {
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rbx: u64,
    pub rsp: u64,
    pub rbp: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rip: u64,
    pub rflags: u64,
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
}

/// `struct vcpu_hvm_context` with the 64-bit register set (the union's larger member is
/// the 32-bit one, 120 bytes; `_union_tail` pads the 112-byte 64-bit view to it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuHvmContext {
    pub mode: u32,
    /// Must be 0 (Xen returns -EINVAL otherwise).
    pub pad: u32,
    pub x86_64: VcpuHvmX86_64,
    pub _union_tail: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn register_vcpu_info_layout() {
        assert_eq!(size_of::<VcpuRegisterVcpuInfo>(), 16);
        assert_eq!(offset_of!(VcpuRegisterVcpuInfo, offset), 8);
        assert_eq!(offset_of!(VcpuRegisterVcpuInfo, rsvd), 12);
    }

    #[test]
    fn hvm_context_layouts() {
        assert_eq!(size_of::<VcpuHvmX86_32>(), 120);
        assert_eq!(offset_of!(VcpuHvmX86_32, efer), 56);
        assert_eq!(offset_of!(VcpuHvmX86_32, cs_base), 64);
        assert_eq!(offset_of!(VcpuHvmX86_32, cs_limit), 84);
        assert_eq!(offset_of!(VcpuHvmX86_32, cs_ar), 104);
        assert_eq!(offset_of!(VcpuHvmX86_32, tr_ar), 112);
        assert_eq!(offset_of!(VcpuHvmX86_32, pad2), 114);
        assert_eq!(size_of::<VcpuHvmX86_64>(), 112);
        assert_eq!(offset_of!(VcpuHvmX86_64, rip), 64);
        assert_eq!(offset_of!(VcpuHvmX86_64, rflags), 72);
        assert_eq!(offset_of!(VcpuHvmX86_64, cr0), 80);
        assert_eq!(offset_of!(VcpuHvmX86_64, cr3), 88);
        assert_eq!(offset_of!(VcpuHvmX86_64, cr4), 96);
        assert_eq!(offset_of!(VcpuHvmX86_64, efer), 104);
        assert_eq!(size_of::<VcpuHvmContext>(), 128);
        assert_eq!(offset_of!(VcpuHvmContext, pad), 4);
        assert_eq!(offset_of!(VcpuHvmContext, x86_64), 8);
    }
}
