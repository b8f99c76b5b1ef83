// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore wire format: a 16-byte header (`struct xsd_sockmsg`, little endian on
//! x86) followed by `len <= 4096` payload bytes, mostly NUL-terminated strings.

use crate::abi::xs_wire::*;
use crate::abi::DomId;
use crate::xenstore::ring::RingError;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// A message header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub msg_type: u32,
    pub req_id: u32,
    pub tx_id: u32,
    pub len: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; XSD_SOCKMSG_SIZE] {
        let mut out = [0u8; XSD_SOCKMSG_SIZE];
        for (i, field) in [self.msg_type, self.req_id, self.tx_id, self.len]
            .iter()
            .enumerate()
        {
            out[i * 4..i * 4 + 4].copy_from_slice(&field.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8; XSD_SOCKMSG_SIZE]) -> Self {
        let field = |i: usize| {
            u32::from_le_bytes([
                bytes[i * 4],
                bytes[i * 4 + 1],
                bytes[i * 4 + 2],
                bytes[i * 4 + 3],
            ])
        };
        Self {
            msg_type: field(0),
            req_id: field(1),
            tx_id: field(2),
            len: field(3),
        }
    }
}

/// A whole message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub payload: Vec<u8>,
}

/// Error names xenstored sends in `XS_ERROR` replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XsErrno {
    Einval,
    Eacces,
    Eexist,
    Eisdir,
    Enoent,
    Enomem,
    Enospc,
    Eio,
    Enotempty,
    Enosys,
    Erofs,
    Ebusy,
    Eagain,
    Eisconn,
    E2big,
    Eperm,
    /// oxenstored: a quota was hit.
    Equota,
    /// A name this client does not know.
    Unknown,
}

const ERRNOS: [XsErrno; 16] = [
    XsErrno::Einval,
    XsErrno::Eacces,
    XsErrno::Eexist,
    XsErrno::Eisdir,
    XsErrno::Enoent,
    XsErrno::Enomem,
    XsErrno::Enospc,
    XsErrno::Eio,
    XsErrno::Enotempty,
    XsErrno::Enosys,
    XsErrno::Erofs,
    XsErrno::Ebusy,
    XsErrno::Eagain,
    XsErrno::Eisconn,
    XsErrno::E2big,
    XsErrno::Eperm,
];

impl XsErrno {
    /// From an `XS_ERROR` payload ("ENOENT\0").
    pub fn from_payload(payload: &[u8]) -> Self {
        let name = payload.split(|&b| b == 0).next().unwrap_or(&[]);
        if name == b"EQUOTA" {
            return Self::Equota;
        }
        XSD_ERROR_NAMES
            .iter()
            .position(|known| known.as_bytes() == name)
            .map_or(Self::Unknown, |i| ERRNOS[i])
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Equota => "EQUOTA",
            Self::Unknown => "EUNKNOWN",
            known => XSD_ERROR_NAMES[ERRNOS.iter().position(|e| *e == known).unwrap_or(0)],
        }
    }
}

/// Everything a xenstore operation can fail with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XsError {
    /// xenstored answered `XS_ERROR`.
    Xenstored(XsErrno),
    /// The ring failed (timeout, corrupt indices).
    Ring(RingError),
    /// xenstored sent something malformed.
    Protocol(&'static str),
    /// Rejected locally before sending.
    InvalidPath,
    /// The request payload would exceed `XENSTORE_PAYLOAD_MAX`.
    TooBig,
    /// A value that should be text or a number is not.
    BadValue,
    /// A previous failure left the stream out of sync; the client is unusable.
    Broken,
    /// `transaction` gave up after this many `EAGAIN`s.
    RetriesExhausted(u32),
}

impl XsError {
    pub fn is(&self, errno: XsErrno) -> bool {
        *self == XsError::Xenstored(errno)
    }
}

impl From<RingError> for XsError {
    fn from(e: RingError) -> Self {
        XsError::Ring(e)
    }
}

impl fmt::Display for XsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XsError::Xenstored(errno) => write!(f, "xenstored: {}", errno.name()),
            other => write!(f, "xenstore: {other:?}"),
        }
    }
}

impl core::error::Error for XsError {}

/// Encodes a request: header plus the concatenated payload parts.
pub fn encode(msg_type: u32, req_id: u32, tx_id: u32, parts: &[&[u8]]) -> Result<Vec<u8>, XsError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > XENSTORE_PAYLOAD_MAX {
        return Err(XsError::TooBig);
    }
    let header = Header {
        msg_type,
        req_id,
        tx_id,
        len: len as u32,
    };
    let mut out = Vec::with_capacity(XSD_SOCKMSG_SIZE + len);
    out.extend_from_slice(&header.encode());
    for part in parts {
        out.extend_from_slice(part);
    }
    Ok(out)
}

/// Splits "a\0b\0" into ["a", "b"]; a missing final NUL is tolerated.
pub fn split_strings(payload: &[u8]) -> Vec<&[u8]> {
    let body = payload.strip_suffix(&[0]).unwrap_or(payload);
    if body.is_empty() {
        return Vec::new();
    }
    body.split(|&b| b == 0).collect()
}

/// Checks a path the way xenstored will: characters `[A-Za-z0-9_@/-]`, no empty
/// components, no trailing '/', length limits (absolute 3072, relative 2048).
/// `@`-paths (`@introduceDomain`, `@releaseDomain`) are only valid as watch paths.
pub fn validate_path(path: &str) -> Result<(), XsError> {
    let max = if path.starts_with('/') {
        XENSTORE_ABS_PATH_MAX
    } else {
        XENSTORE_REL_PATH_MAX
    };
    let ok_chars = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-/_@".contains(&b));
    let shape_ok =
        path == "/" || (!path.is_empty() && !path.ends_with('/') && !path.contains("//"));
    if ok_chars && shape_ok && path.len() <= max {
        Ok(())
    } else {
        Err(XsError::InvalidPath)
    }
}

/// A watch firing: the path that changed and the token given to `watch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub path: String,
    pub token: String,
}

impl WatchEvent {
    pub fn parse(payload: &[u8]) -> Result<Self, XsError> {
        let fields = split_strings(payload);
        let text = |i: usize| {
            fields
                .get(i)
                .and_then(|f| core::str::from_utf8(f).ok())
                .map(String::from)
                .ok_or(XsError::Protocol("malformed watch event"))
        };
        Ok(Self {
            path: text(XS_WATCH_PATH)?,
            token: text(XS_WATCH_TOKEN)?,
        })
    }
}

/// What a domain may do with a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    None,
    Read,
    Write,
    Both,
}

/// One permission entry ("r5": domain 5 may read). The first entry names the owner
/// and the access of every domain not listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    pub domid: DomId,
    pub access: Access,
}

impl Permission {
    pub fn parse(field: &[u8]) -> Result<Self, XsError> {
        let (&kind, digits) = field
            .split_first()
            .ok_or(XsError::Protocol("empty permission"))?;
        let access = match kind {
            b'n' => Access::None,
            b'r' => Access::Read,
            b'w' => Access::Write,
            b'b' => Access::Both,
            _ => return Err(XsError::Protocol("bad permission type")),
        };
        let domid = core::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse().ok())
            .ok_or(XsError::Protocol("bad permission domid"))?;
        Ok(Self { domid, access })
    }

    pub fn encode(&self) -> String {
        let kind = match self.access {
            Access::None => 'n',
            Access::Read => 'r',
            Access::Write => 'w',
            Access::Both => 'b',
        };
        alloc::format!("{kind}{}", self.domid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    #[test]
    fn header_round_trips_little_endian() {
        let h = Header {
            msg_type: msg_type::WRITE,
            req_id: 0x0102_0304,
            tx_id: 9,
            len: 300,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[0..4], &[11, 0, 0, 0]);
        assert_eq!(&bytes[4..8], &[4, 3, 2, 1]);
        assert_eq!(&bytes[12..16], &[44, 1, 0, 0]);
        assert_eq!(Header::decode(&bytes), h);
    }

    #[test]
    fn encode_concatenates_and_limits_payload() {
        let msg = encode(msg_type::WRITE, 1, 0, &[b"a/b", b"\0", b"val"]).unwrap();
        assert_eq!(msg.len(), 16 + 7);
        assert_eq!(&msg[16..], b"a/b\0val");
        assert_eq!(Header::decode(msg[..16].try_into().unwrap()).len, 7);
        let big = vec![b'x'; 4096];
        assert!(encode(msg_type::WRITE, 1, 0, &[&big]).is_ok());
        assert_eq!(
            encode(msg_type::WRITE, 1, 0, &[&big, b"\0"]),
            Err(XsError::TooBig)
        );
    }

    #[test]
    fn error_names_map_both_ways() {
        assert_eq!(XsErrno::from_payload(b"ENOENT\0"), XsErrno::Enoent);
        assert_eq!(XsErrno::from_payload(b"EAGAIN\0"), XsErrno::Eagain);
        assert_eq!(XsErrno::from_payload(b"EQUOTA\0"), XsErrno::Equota);
        assert_eq!(XsErrno::from_payload(b"EPERM"), XsErrno::Eperm);
        assert_eq!(XsErrno::from_payload(b"EWHAT\0"), XsErrno::Unknown);
        for (i, name) in XSD_ERROR_NAMES.iter().enumerate() {
            assert_eq!(ERRNOS[i].name(), *name);
            assert_eq!(XsErrno::from_payload(name.as_bytes()), ERRNOS[i]);
        }
    }

    #[test]
    fn strings_split_on_nul() {
        assert_eq!(split_strings(b"a\0bc\0"), vec![&b"a"[..], b"bc"]);
        assert_eq!(split_strings(b"a\0bc"), vec![&b"a"[..], b"bc"]);
        assert!(split_strings(b"").is_empty());
        assert!(split_strings(b"\0").is_empty());
        // An empty value in the middle survives.
        assert_eq!(split_strings(b"a\0\0b\0"), vec![&b"a"[..], b"", b"b"]);
    }

    #[test]
    fn paths_are_checked_like_xenstored() {
        for good in [
            "/",
            "/local/domain/1",
            "device/vbd/51712",
            "@releaseDomain",
            "a-b_c",
        ] {
            assert_eq!(validate_path(good), Ok(()), "{good}");
        }
        for bad in ["", "a//b", "a/", "a b", "a\0b", "/x/ü"] {
            assert_eq!(validate_path(bad), Err(XsError::InvalidPath), "{bad:?}");
        }
        let long = "a".repeat(2049);
        assert_eq!(validate_path(&long), Err(XsError::InvalidPath));
        assert_eq!(
            validate_path(&std::format!("/{}", "a".repeat(3071))),
            Ok(())
        );
    }

    #[test]
    fn watch_events_and_permissions_parse() {
        let ev = WatchEvent::parse(b"/local/domain/0/x\0tok1\0").unwrap();
        assert_eq!(
            ev,
            WatchEvent {
                path: "/local/domain/0/x".into(),
                token: "tok1".into()
            }
        );
        assert!(WatchEvent::parse(b"only-path\0").is_err());
        assert_eq!(
            Permission::parse(b"r5"),
            Ok(Permission {
                domid: 5,
                access: Access::Read
            })
        );
        assert_eq!(Permission::parse(b"b0").unwrap().access, Access::Both);
        assert!(Permission::parse(b"x5").is_err());
        assert!(Permission::parse(b"r").is_err());
        assert!(Permission::parse(b"r99999").is_err());
        assert_eq!(
            Permission {
                domid: 12,
                access: Access::Write
            }
            .encode(),
            "w12"
        );
    }
}
