// SPDX-License-Identifier: MIT OR Apache-2.0
//! Xen's CPUID leaves (`public/arch-x86/cpuid.h`). The base leaf is 0x40000000 or, when
//! Viridian leaves are offered, the next free 0x100 boundary; `kernel/machine`'s
//! hypervisor detection finds it, these offsets are relative to it.

pub const XEN_CPUID_FIRST_LEAF: u32 = 0x4000_0000;
/// "XenVMMXenVMM" in EBX, ECX, EDX.
pub const XEN_CPUID_SIGNATURE_EBX: u32 = 0x566e_6558;
pub const XEN_CPUID_SIGNATURE_ECX: u32 = 0x6558_4d4d;
pub const XEN_CPUID_SIGNATURE_EDX: u32 = 0x4d4d_566e;

/// Leaf base+1: EAX = major << 16 | minor.
pub const LEAF_VERSION: u32 = 1;
/// Leaf base+3, the time leaf. Subleaf 0: EAX = vtsc / TSC safe / RDTSCP flags, EBX =
/// `tsc_mode`, ECX = the domain's TSC frequency in kHz (`d->arch.tsc_khz`: the rate the
/// domain's RDTSC counts at, emulated, scaled or native), EDX = incarnation.
pub const LEAF_TIME: u32 = 3;
/// Leaf base+4: HVM features (EAX), vCPU id (EBX), domid (ECX).
pub const LEAF_HVM_FEATURES: u32 = 4;

pub const XEN_HVM_CPUID_APIC_ACCESS_VIRT: u32 = 1 << 0;
pub const XEN_HVM_CPUID_X2APIC_VIRT: u32 = 1 << 1;
pub const XEN_HVM_CPUID_IOMMU_MAPPINGS: u32 = 1 << 2;
pub const XEN_HVM_CPUID_VCPU_ID_PRESENT: u32 = 1 << 3;
pub const XEN_HVM_CPUID_DOMID_PRESENT: u32 = 1 << 4;
pub const XEN_HVM_CPUID_EXT_DEST_ID: u32 = 1 << 5;
/// Per-vCPU upcall vectors also work for physical IRQs bound to event channels.
pub const XEN_HVM_CPUID_UPCALL_VECTOR: u32 = 1 << 6;
