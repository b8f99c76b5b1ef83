// SPDX-License-Identifier: MIT OR Apache-2.0
//! `hvm_op` (`public/hvm/hvm_op.h`) and HVM parameters (`public/hvm/params.h`).

use super::DomId;

pub const HVMOP_SET_PARAM: u64 = 0;
pub const HVMOP_GET_PARAM: u64 = 1;
pub const HVMOP_SET_EVTCHN_UPCALL_VECTOR: u64 = 23;

/// `struct xen_hvm_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XenHvmParam {
    pub domid: DomId,
    pub pad: u16,
    pub index: u32,
    pub value: u64,
}

/// `struct xen_hvm_evtchn_upcall_vector`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XenHvmEvtchnUpcallVector {
    pub vcpu: u32,
    pub vector: u8,
}

/// How event notifications reach the domain (all vCPUs with the vector type).
pub const HVM_PARAM_CALLBACK_IRQ: u32 = 0;
pub const HVM_PARAM_STORE_PFN: u32 = 1;
pub const HVM_PARAM_STORE_EVTCHN: u32 = 2;
pub const HVM_PARAM_CONSOLE_PFN: u32 = 17;
pub const HVM_PARAM_CONSOLE_EVTCHN: u32 = 18;

/// `HVM_PARAM_CALLBACK_IRQ` value layout: type in bits 63:56.
pub const HVM_PARAM_CALLBACK_TYPE_SHIFT: u32 = 56;
pub const HVM_PARAM_CALLBACK_TYPE_GSI: u64 = 0;
pub const HVM_PARAM_CALLBACK_TYPE_PCI_INTX: u64 = 1;
/// Bits 7:0 are a vector (needs `XENFEAT_hvm_callback_vector`).
pub const HVM_PARAM_CALLBACK_TYPE_VECTOR: u64 = 2;

/// The `HVM_PARAM_CALLBACK_IRQ` value that delivers events through `vector`.
pub const fn callback_via_vector(vector: u8) -> u64 {
    (HVM_PARAM_CALLBACK_TYPE_VECTOR << HVM_PARAM_CALLBACK_TYPE_SHIFT) | vector as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn hvm_param_layout() {
        assert_eq!(size_of::<XenHvmParam>(), 16);
        assert_eq!(offset_of!(XenHvmParam, pad), 2);
        assert_eq!(offset_of!(XenHvmParam, index), 4);
        assert_eq!(offset_of!(XenHvmParam, value), 8);
    }

    #[test]
    fn upcall_vector_layout() {
        assert_eq!(size_of::<XenHvmEvtchnUpcallVector>(), 8);
        assert_eq!(offset_of!(XenHvmEvtchnUpcallVector, vector), 4);
    }

    #[test]
    fn callback_vector_value() {
        assert_eq!(callback_via_vector(0xf3), 0x0200_0000_0000_00f3);
    }
}
