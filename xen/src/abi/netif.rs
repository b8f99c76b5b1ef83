// SPDX-License-Identifier: MIT OR Apache-2.0
//! The netif protocol (`public/io/netif.h`): the slots of a vif's tx and rx rings, their
//! flags and statuses. The rings are `ring.h` rings: a 64-byte header, then slots; one
//! page each holds 256 slots (tx slots are 12 bytes, rx slots 8).

use crate::abi::grant_table::GrantRef;
use crate::abi::sring;

/// `struct netif_tx_request`: one frame (or fragment) to send.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetifTxRequest {
    pub gref: GrantRef,
    pub offset: u16,
    pub flags: u16,
    pub id: u16,
    pub size: u16,
}

/// `struct netif_tx_response`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetifTxResponse {
    pub id: u16,
    pub status: i16,
}

/// `struct netif_rx_request`: a page posted for the backend to copy a frame into.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetifRxRequest {
    pub id: u16,
    pub pad: u16,
    pub gref: GrantRef,
}

/// `struct netif_rx_response`: `status` is the frame's length, or a negative
/// `NETIF_RSP_*`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetifRxResponse {
    pub id: u16,
    pub offset: u16,
    pub flags: u16,
    pub status: i16,
}

/// `NETTXF_*`.
pub const NETTXF_CSUM_BLANK: u16 = 1 << 0;
pub const NETTXF_DATA_VALIDATED: u16 = 1 << 1;
pub const NETTXF_MORE_DATA: u16 = 1 << 2;
pub const NETTXF_EXTRA_INFO: u16 = 1 << 3;

/// `NETRXF_*`.
pub const NETRXF_DATA_VALIDATED: u16 = 1 << 0;
pub const NETRXF_CSUM_BLANK: u16 = 1 << 1;
pub const NETRXF_MORE_DATA: u16 = 1 << 2;
pub const NETRXF_EXTRA_INFO: u16 = 1 << 3;
pub const NETRXF_GSO_PREFIX: u16 = 1 << 4;

/// `struct netif_extra_info` as it sits in an rx response slot (after a packet's first
/// data slot when that has `NETRXF_EXTRA_INFO`): `type`, `flags`, then for GSO
/// `u.gso.size`, `u.gso.type`, a pad byte and `u.gso.features`. It has no id.
pub const EXTRA_TYPE: usize = 0;
pub const EXTRA_FLAGS: usize = 1;
pub const EXTRA_GSO_SIZE: usize = 2;
pub const EXTRA_GSO_TYPE: usize = 4;
/// `u.hash`: `type` (a `_XEN_NETIF_CTRL_HASH_TYPE_*` bit number), `alg`, then the value
/// (four bytes, least significant first).
pub const EXTRA_HASH_TYPE: usize = 2;
pub const EXTRA_HASH_ALG: usize = 3;
pub const EXTRA_HASH_VALUE: usize = 4;

/// `XEN_NETIF_EXTRA_TYPE_*` (`NONE` is never used; a frontend that asked for no XDP
/// headroom can be sent GSO, and HASH once it set a hash up on the control ring).
pub const XEN_NETIF_EXTRA_TYPE_NONE: u8 = 0;
pub const XEN_NETIF_EXTRA_TYPE_GSO: u8 = 1;
/// The packet's hash as netback computed it (`u.hash`: type, algorithm, value).
pub const XEN_NETIF_EXTRA_TYPE_HASH: u8 = 4;
pub const XEN_NETIF_EXTRA_TYPE_MAX: u8 = 6;
/// `XEN_NETIF_EXTRA_FLAG_MORE`: another extra-info slot follows.
pub const XEN_NETIF_EXTRA_FLAG_MORE: u8 = 1 << 0;

/// `XEN_NETIF_GSO_TYPE_*`.
pub const XEN_NETIF_GSO_TYPE_NONE: u8 = 0;
pub const XEN_NETIF_GSO_TYPE_TCPV4: u8 = 1;
pub const XEN_NETIF_GSO_TYPE_TCPV6: u8 = 2;

/// `XEN_NETIF_NR_SLOTS_MIN`: the data slots a packet may span that every frontend must
/// accept (Linux netfront's limit on receive).
pub const XEN_NETIF_NR_SLOTS_MIN: usize = 18;

/// `NETIF_RSP_*`.
pub const NETIF_RSP_DROPPED: i16 = -2;
pub const NETIF_RSP_ERROR: i16 = -1;
pub const NETIF_RSP_OKAY: i16 = 0;
/// The response to an extra-info slot (netback writes it after the first slot's).
pub const NETIF_RSP_NULL: i16 = 1;

/// A tx slot: the union of request (12 bytes) and response.
pub const TX_SLOT: usize = 12;
/// An rx slot: the union of request and response (8 bytes each).
pub const RX_SLOT: usize = 8;

/// `struct xen_netif_ctrl_request`: one control message (`feature-ctrl-ring`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetifCtrlRequest {
    pub id: u16,
    pub kind: u16,
    pub data: [u32; 3],
}

/// `struct xen_netif_ctrl_response`: `id` and `type` echo the request's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetifCtrlResponse {
    pub id: u16,
    pub kind: u16,
    pub status: u32,
    pub data: u32,
}

/// A control ring slot: the union of request (16 bytes) and response (12).
pub const CTRL_SLOT: usize = 16;

/// `XEN_NETIF_CTRL_TYPE_*`.
pub const XEN_NETIF_CTRL_TYPE_INVALID: u16 = 0;
pub const XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS: u16 = 1;
pub const XEN_NETIF_CTRL_TYPE_SET_HASH_FLAGS: u16 = 2;
pub const XEN_NETIF_CTRL_TYPE_SET_HASH_KEY: u16 = 3;
pub const XEN_NETIF_CTRL_TYPE_GET_HASH_MAPPING_SIZE: u16 = 4;
pub const XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING_SIZE: u16 = 5;
pub const XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING: u16 = 6;
pub const XEN_NETIF_CTRL_TYPE_SET_HASH_ALGORITHM: u16 = 7;

/// `XEN_NETIF_CTRL_STATUS_*`.
pub const XEN_NETIF_CTRL_STATUS_SUCCESS: u32 = 0;
pub const XEN_NETIF_CTRL_STATUS_NOT_SUPPORTED: u32 = 1;
pub const XEN_NETIF_CTRL_STATUS_INVALID_PARAMETER: u32 = 2;
pub const XEN_NETIF_CTRL_STATUS_BUFFER_OVERFLOW: u32 = 3;

/// `XEN_NETIF_CTRL_HASH_TYPE_*` (bits of the flags; an extra slot's `type` is the bit's
/// number, `_XEN_NETIF_CTRL_HASH_TYPE_*`).
pub const XEN_NETIF_CTRL_HASH_TYPE_IPV4: u32 = 1 << 0;
pub const XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP: u32 = 1 << 1;
pub const XEN_NETIF_CTRL_HASH_TYPE_IPV6: u32 = 1 << 2;
pub const XEN_NETIF_CTRL_HASH_TYPE_IPV6_TCP: u32 = 1 << 3;
pub const HASH_TYPE_BIT_IPV4_TCP: u8 = 1;

/// `XEN_NETIF_CTRL_HASH_ALGORITHM_*`.
pub const XEN_NETIF_CTRL_HASH_ALGORITHM_NONE: u32 = 0;
pub const XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ: u32 = 1;

/// `__CONST_RING_SIZE` for one page: the largest power of two of slots after the header.
pub const fn ring_size(slot: usize) -> u32 {
    let fit = (crate::abi::PAGE_SIZE - sring::HEADER_SIZE) / slot;
    1 << (usize::BITS - 1 - fit.leading_zeros())
}

/// `NET_TX_RING_SIZE` / `NET_RX_RING_SIZE` for one-page rings.
pub const TX_RING_SIZE: u32 = ring_size(TX_SLOT);
pub const RX_RING_SIZE: u32 = ring_size(RX_SLOT);
/// The control ring's slots in one page.
pub const CTRL_RING_SIZE: u32 = ring_size(CTRL_SLOT);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn netif_layouts() {
        assert_eq!(size_of::<NetifTxRequest>(), TX_SLOT);
        assert_eq!(offset_of!(NetifTxRequest, offset), 4);
        assert_eq!(offset_of!(NetifTxRequest, flags), 6);
        assert_eq!(offset_of!(NetifTxRequest, id), 8);
        assert_eq!(offset_of!(NetifTxRequest, size), 10);
        assert_eq!(size_of::<NetifTxResponse>(), 4);
        assert_eq!(offset_of!(NetifTxResponse, status), 2);
        assert_eq!(size_of::<NetifRxRequest>(), RX_SLOT);
        assert_eq!(offset_of!(NetifRxRequest, gref), 4);
        assert_eq!(size_of::<NetifRxResponse>(), RX_SLOT);
        assert_eq!(offset_of!(NetifRxResponse, offset), 2);
        assert_eq!(offset_of!(NetifRxResponse, flags), 4);
        assert_eq!(offset_of!(NetifRxResponse, status), 6);
        // netif_extra_info: type, flags, u.gso { size, type, pad, features }.
        assert_eq!(
            (EXTRA_TYPE, EXTRA_FLAGS, EXTRA_GSO_SIZE, EXTRA_GSO_TYPE),
            (0, 1, 2, 4)
        );
        // u.hash { type, alg, value[4] }.
        assert_eq!(
            (EXTRA_HASH_TYPE, EXTRA_HASH_ALG, EXTRA_HASH_VALUE),
            (2, 3, 4)
        );
    }

    #[test]
    fn ctrl_ring_layouts() {
        assert_eq!(size_of::<NetifCtrlRequest>(), CTRL_SLOT);
        assert_eq!(offset_of!(NetifCtrlRequest, kind), 2);
        assert_eq!(offset_of!(NetifCtrlRequest, data), 4);
        assert_eq!(size_of::<NetifCtrlResponse>(), 12);
        assert_eq!(offset_of!(NetifCtrlResponse, kind), 2);
        assert_eq!(offset_of!(NetifCtrlResponse, status), 4);
        assert_eq!(offset_of!(NetifCtrlResponse, data), 8);
        // (4096 - 64) / 16 = 252 slots fit: the ring takes 128.
        assert_eq!(CTRL_RING_SIZE, 128);
        assert_eq!(
            1 << HASH_TYPE_BIT_IPV4_TCP,
            XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP
        );
    }

    #[test]
    fn one_page_rings_hold_256_slots() {
        assert_eq!((TX_RING_SIZE, RX_RING_SIZE), (256, 256));
        assert_eq!(ring_size(64), 32);
        assert_eq!(ring_size(112), 32);
    }
}
