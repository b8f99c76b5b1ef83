// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore wire format (`public/io/xs_wire.h`).

/// `enum xsd_sockmsg_type`.
pub mod msg_type {
    pub const CONTROL: u32 = 0;
    pub const DIRECTORY: u32 = 1;
    pub const READ: u32 = 2;
    pub const GET_PERMS: u32 = 3;
    pub const WATCH: u32 = 4;
    pub const UNWATCH: u32 = 5;
    pub const TRANSACTION_START: u32 = 6;
    pub const TRANSACTION_END: u32 = 7;
    pub const INTRODUCE: u32 = 8;
    pub const RELEASE: u32 = 9;
    pub const GET_DOMAIN_PATH: u32 = 10;
    pub const WRITE: u32 = 11;
    pub const MKDIR: u32 = 12;
    pub const RM: u32 = 13;
    pub const SET_PERMS: u32 = 14;
    pub const WATCH_EVENT: u32 = 15;
    pub const ERROR: u32 = 16;
    pub const IS_DOMAIN_INTRODUCED: u32 = 17;
    pub const RESUME: u32 = 18;
    pub const SET_TARGET: u32 = 19;
    pub const RESET_WATCHES: u32 = 21;
    pub const DIRECTORY_PART: u32 = 22;
    pub const GET_FEATURE: u32 = 23;
    pub const SET_FEATURE: u32 = 24;
    pub const GET_QUOTA: u32 = 25;
    pub const SET_QUOTA: u32 = 26;
    pub const TYPE_COUNT: u32 = 27;
    pub const INVALID: u32 = 0xffff;
}

/// `xsd_errors[]`: the error names xenstored sends in `XS_ERROR` payloads, in the
/// header's order (new names are appended there). `EQUOTA` is not in the header but
/// oxenstored sends it when a quota is hit.
pub const XSD_ERROR_NAMES: [&str; 16] = [
    "EINVAL",
    "EACCES",
    "EEXIST",
    "EISDIR",
    "ENOENT",
    "ENOMEM",
    "ENOSPC",
    "EIO",
    "ENOTEMPTY",
    "ENOSYS",
    "EROFS",
    "EBUSY",
    "EAGAIN",
    "EISCONN",
    "E2BIG",
    "EPERM",
];

/// `struct xsd_sockmsg`, followed by `len` payload bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XsdSockmsg {
    pub type_: u32,
    /// Echoed in the reply.
    pub req_id: u32,
    /// Transaction id, 0 outside transactions.
    pub tx_id: u32,
    pub len: u32,
}

pub const XSD_SOCKMSG_SIZE: usize = 16;

/// `enum xs_watch_type`: fields of a watch event payload.
pub const XS_WATCH_PATH: usize = 0;
pub const XS_WATCH_TOKEN: usize = 1;

pub const XENSTORE_RING_SIZE: usize = 1024;
pub const XENSTORE_PAYLOAD_MAX: usize = 4096;
pub const XENSTORE_ABS_PATH_MAX: usize = 3072;
pub const XENSTORE_REL_PATH_MAX: usize = 2048;

/// `struct xenstore_domain_interface`: the shared ring page.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XenstoreDomainInterface {
    /// Requests to xenstored.
    pub req: [u8; XENSTORE_RING_SIZE],
    /// Replies and watch events.
    pub rsp: [u8; XENSTORE_RING_SIZE],
    pub req_cons: u32,
    pub req_prod: u32,
    pub rsp_cons: u32,
    pub rsp_prod: u32,
    pub server_features: u32,
    pub connection: u32,
    pub error: u32,
    pub evtchn_port: u32,
}

pub const XENSTORE_SERVER_FEATURE_RECONNECTION: u32 = 1;
pub const XENSTORE_SERVER_FEATURE_ERROR: u32 = 2;
pub const XENSTORE_CONNECTED: u32 = 0;
pub const XENSTORE_RECONNECT: u32 = 1;
pub const XENSTORE_ERROR_NONE: u32 = 0;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn sockmsg_layout() {
        assert_eq!(size_of::<XsdSockmsg>(), XSD_SOCKMSG_SIZE);
        assert_eq!(offset_of!(XsdSockmsg, req_id), 4);
        assert_eq!(offset_of!(XsdSockmsg, tx_id), 8);
        assert_eq!(offset_of!(XsdSockmsg, len), 12);
    }

    #[test]
    fn domain_interface_layout() {
        assert_eq!(size_of::<XenstoreDomainInterface>(), 2080);
        assert_eq!(offset_of!(XenstoreDomainInterface, rsp), 1024);
        assert_eq!(offset_of!(XenstoreDomainInterface, req_cons), 2048);
        assert_eq!(offset_of!(XenstoreDomainInterface, req_prod), 2052);
        assert_eq!(offset_of!(XenstoreDomainInterface, rsp_cons), 2056);
        assert_eq!(offset_of!(XenstoreDomainInterface, rsp_prod), 2060);
        assert_eq!(offset_of!(XenstoreDomainInterface, server_features), 2064);
        assert_eq!(offset_of!(XenstoreDomainInterface, connection), 2068);
        assert_eq!(offset_of!(XenstoreDomainInterface, error), 2072);
        assert_eq!(offset_of!(XenstoreDomainInterface, evtchn_port), 2076);
    }

    #[test]
    fn message_type_numbers() {
        // Values the C enum assigns (printed from the compiled header).
        assert_eq!(msg_type::READ, 2);
        assert_eq!(msg_type::WRITE, 11);
        assert_eq!(msg_type::WATCH_EVENT, 15);
        assert_eq!(msg_type::ERROR, 16);
        assert_eq!(msg_type::RESET_WATCHES, 21);
        assert_eq!(msg_type::DIRECTORY_PART, 22);
        assert_eq!(msg_type::TYPE_COUNT, 27);
    }
}
