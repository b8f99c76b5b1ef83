// SPDX-License-Identifier: MIT OR Apache-2.0
//! `nvme-tcp:<ipv4>:<port>:<nsid>:nqn=<subsystem NQN>[,<slice>]`: a namespace of a
//! remote NVMe/TCP subsystem (in progress: parsed here, not yet served; see
//! docs/design.md, "NVMe over TCP").
//!
//! NQNs contain `:` (`nqn.2014-08.org.nvmexpress:uuid:...`), so the NQN is not a
//! `:`-field but the first option, running to the first `,`; the slice options
//! (`part=`, `offset=,size=`) follow it as for `nvme:`.

use core::fmt;

use super::{number, region, Region, SpecError};

/// A subsystem NQN: 5 to 223 bytes (NVMe's NQN limit), starting `nqn.`, printable ASCII
/// other than space and `,`. Stored inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Nqn {
    bytes: [u8; Nqn::MAX_LEN],
    len: u8,
}

impl Nqn {
    pub const MAX_LEN: usize = 223;

    pub fn new(text: &str) -> Option<Nqn> {
        let valid = |b: u8| (b'!'..=b'~').contains(&b) && b != b',';
        if !text.starts_with("nqn.")
            || text.len() <= 4
            || text.len() > Self::MAX_LEN
            || !text.bytes().all(valid)
        {
            return None;
        }
        let mut bytes = [0; Self::MAX_LEN];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(Nqn {
            bytes,
            len: text.len() as u8,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII went in (checked by `new`).
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for Nqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl fmt::Display for Nqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a remote namespace is and which part of it a disk serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmeTcpTarget {
    pub addr: [u8; 4],
    pub port: u16,
    pub nsid: u32,
    pub subsystem: Nqn,
    pub region: Region,
}

impl fmt::Display for NvmeTcpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.addr;
        write!(
            f,
            "nvme-tcp:{a}.{b}.{c}.{d}:{}:{}:nqn={}",
            self.port, self.nsid, self.subsystem
        )?;
        // The region writes itself as `:<options>`; here options follow the NQN.
        match self.region {
            Region::Whole => Ok(()),
            region => {
                let mut text = [0u8; 96];
                let mut w = Cursor {
                    buf: &mut text,
                    len: 0,
                };
                fmt::write(&mut w, format_args!("{region}"))?;
                let len = w.len;
                let options = core::str::from_utf8(&text[1..len]).map_err(|_| fmt::Error)?;
                write!(f, ",{options}")
            }
        }
    }
}

/// A fixed buffer to format into without allocating.
struct Cursor<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl fmt::Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self
            .len
            .checked_add(s.len())
            .filter(|&e| e <= self.buf.len())
            .ok_or(fmt::Error)?;
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmeTcpError<'a> {
    /// Not `nvme-tcp:...`, or fewer than four `:`-fields.
    Form,
    /// Not a dotted-quad IPv4 address (four numbers 0 to 255, no leading zeros).
    BadAddress(&'a str),
    /// Not a port number 1 to 65535.
    BadPort(&'a str),
    /// Not a namespace id (1 to 2^32 - 2; 2^32 - 1 means "all namespaces").
    BadNamespace(&'a str),
    /// The options do not start with `nqn=`.
    MissingNqn,
    BadNqn(&'a str),
    /// The slice after the NQN.
    Slice(SpecError<'a>),
}

impl fmt::Display for NvmeTcpError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FORM: &str = "use nvme-tcp:<ipv4>:<port>:<nsid>:nqn=<subsystem NQN>[,<slice>]";
        match self {
            NvmeTcpError::Form => f.write_str(FORM),
            NvmeTcpError::BadAddress(a) => write!(f, "nvme-tcp: {a:?} is not an IPv4 address; {FORM}"),
            NvmeTcpError::BadPort(p) => write!(f, "nvme-tcp: port {p:?} is not 1 to 65535"),
            NvmeTcpError::BadNamespace(n) => {
                write!(f, "nvme-tcp: namespace {n:?} is not 1 to 4294967294")
            }
            NvmeTcpError::MissingNqn => write!(f, "nvme-tcp: the options start with nqn=; {FORM}"),
            NvmeTcpError::BadNqn(n) => write!(
                f,
                "nvme-tcp: {n:?} is not a subsystem NQN (nqn.<...>, up to {} printable ASCII characters other than ',')",
                Nqn::MAX_LEN
            ),
            NvmeTcpError::Slice(e) => e.fmt(f),
        }
    }
}

impl core::error::Error for NvmeTcpError<'_> {}

/// `a.b.c.d`, each 0 to 255 written without leading zeros (`010` could mean 8 or 10).
fn ipv4(text: &str) -> Option<[u8; 4]> {
    let mut addr = [0u8; 4];
    let mut parts = text.split('.');
    for byte in &mut addr {
        let part = parts.next()?;
        // Digits only (`parse` would take `+1`), no leading zero; empty or above 255
        // fails `parse`.
        let canonical = part == "0" || !part.starts_with('0');
        if !canonical || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *byte = part.parse().ok()?;
    }
    parts.next().is_none().then_some(addr)
}

/// Parses an `nvme-tcp:` target.
pub fn parse_nvme_tcp(text: &str) -> Result<NvmeTcpTarget, NvmeTcpError<'_>> {
    let rest = text.strip_prefix("nvme-tcp:").ok_or(NvmeTcpError::Form)?;
    let (addr, rest) = rest.split_once(':').ok_or(NvmeTcpError::Form)?;
    let (port, rest) = rest.split_once(':').ok_or(NvmeTcpError::Form)?;
    let (nsid, options) = rest.split_once(':').ok_or(NvmeTcpError::Form)?;
    let addr = ipv4(addr).ok_or(NvmeTcpError::BadAddress(addr))?;
    let port_text = port;
    let port = number("nvme-tcp", port)
        .ok()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)
        .ok_or(NvmeTcpError::BadPort(port_text))?;
    let nsid_text = nsid;
    let nsid = number("nvme-tcp", nsid)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n != 0 && n != u32::MAX)
        .ok_or(NvmeTcpError::BadNamespace(nsid_text))?;
    let options = options
        .strip_prefix("nqn=")
        .ok_or(NvmeTcpError::MissingNqn)?;
    let (nqn, slice) = match options.split_once(',') {
        Some((nqn, slice)) => (nqn, Some(slice)),
        None => (options, None),
    };
    let subsystem = Nqn::new(nqn).ok_or(NvmeTcpError::BadNqn(nqn))?;
    let region = match slice {
        None => Region::Whole,
        Some("") => return Err(NvmeTcpError::Slice(SpecError::EmptyOption("nvme-tcp"))),
        Some(slice) => region("nvme-tcp", slice).map_err(NvmeTcpError::Slice)?,
    };
    Ok(NvmeTcpTarget {
        addr,
        port,
        nsid,
        subsystem,
        region,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:2b6f8e1c-0f0e-4d6b-9c1e-3a2b1c0d9e8f";

    #[test]
    fn whole_namespace_and_slices() {
        let t =
            parse_nvme_tcp("nvme-tcp:10.0.0.2:4420:1:nqn=nqn.2026-01.org.example:disk1").unwrap();
        assert_eq!((t.addr, t.port, t.nsid), ([10, 0, 0, 2], 4420, 1));
        assert_eq!(t.subsystem.as_str(), "nqn.2026-01.org.example:disk1");
        assert_eq!(t.region, Region::Whole);
        let text = format!("nvme-tcp:192.168.100.1:4420:7:nqn={NQN},offset=1G,size=8G");
        let t = parse_nvme_tcp(&text).unwrap();
        assert_eq!(
            t.region,
            Region::Extent {
                offset: 1 << 30,
                size: 8 << 30
            }
        );
        assert_eq!(t.subsystem.as_str(), NQN);
        assert_eq!(t.to_string(), text, "Display reads back as the same text");
        let text = "nvme-tcp:0.0.0.0:65535:4294967294:nqn.x:y,part=name:a:b c";
        let text = text.replace("nqn.x", "nqn=nqn.x");
        let t = parse_nvme_tcp(&text).unwrap();
        assert!(matches!(t.region, Region::PartitionNamed(n) if n.as_str() == "a:b c"));
        assert_eq!(t.to_string(), text);
        let t = parse_nvme_tcp("nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,part=3").unwrap();
        assert_eq!(t.region, Region::Partition(3));
        assert_eq!(t.to_string(), "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,part=3");
    }

    #[test]
    fn bad_targets_say_what_is_wrong() {
        use NvmeTcpError as E;
        let cases: &[(&str, E<'static>)] = &[
            ("nvme:1", E::Form),
            ("nvme-tcp:", E::Form),
            ("nvme-tcp:10.0.0.2:4420:1", E::Form),
            ("nvme-tcp:10.0.0.2:4420", E::Form),
            ("nvme-tcp:10.0.0:4420:1:nqn=nqn.a", E::BadAddress("10.0.0")),
            (
                "nvme-tcp:10.0.0.2.5:4420:1:nqn=nqn.a",
                E::BadAddress("10.0.0.2.5"),
            ),
            (
                "nvme-tcp:10.0.0.256:4420:1:nqn=nqn.a",
                E::BadAddress("10.0.0.256"),
            ),
            (
                "nvme-tcp:10.0.0.010:4420:1:nqn=nqn.a",
                E::BadAddress("10.0.0.010"),
            ),
            (
                "nvme-tcp:10.0..2:4420:1:nqn=nqn.a",
                E::BadAddress("10.0..2"),
            ),
            (
                "nvme-tcp:10.0.0.+2:4420:1:nqn=nqn.a",
                E::BadAddress("10.0.0.+2"),
            ),
            ("nvme-tcp:host:4420:1:nqn=nqn.a", E::BadAddress("host")),
            ("nvme-tcp:10.0.0.2:0:1:nqn=nqn.a", E::BadPort("0")),
            ("nvme-tcp:10.0.0.2:65536:1:nqn=nqn.a", E::BadPort("65536")),
            ("nvme-tcp:10.0.0.2::1:nqn=nqn.a", E::BadPort("")),
            ("nvme-tcp:10.0.0.2:4420:0:nqn=nqn.a", E::BadNamespace("0")),
            (
                "nvme-tcp:10.0.0.2:4420:4294967295:nqn=nqn.a",
                E::BadNamespace("4294967295"),
            ),
            ("nvme-tcp:10.0.0.2:4420:x:nqn=nqn.a", E::BadNamespace("x")),
            ("nvme-tcp:10.0.0.2:4420:1:nqn.a", E::MissingNqn),
            ("nvme-tcp:10.0.0.2:4420:1:part=1,nqn=nqn.a", E::MissingNqn),
            ("nvme-tcp:10.0.0.2:4420:1:nqn=", E::BadNqn("")),
            ("nvme-tcp:10.0.0.2:4420:1:nqn=nqn.", E::BadNqn("nqn.")),
            (
                "nvme-tcp:10.0.0.2:4420:1:nqn=iqn.2001-04.com.example",
                E::BadNqn("iqn.2001-04.com.example"),
            ),
            ("nvme-tcp:10.0.0.2:4420:1:nqn=nqn.a b", E::BadNqn("nqn.a b")),
            (
                "nvme-tcp:10.0.0.2:4420:1:nqn=nqn.a,",
                E::Slice(SpecError::EmptyOption("nvme-tcp")),
            ),
            (
                "nvme-tcp:10.0.0.2:4420:1:nqn=nqn.a,part=0",
                E::Slice(SpecError::ZeroPartition("nvme-tcp")),
            ),
            (
                "nvme-tcp:10.0.0.2:4420:1:nqn=nqn.a,offset=1G",
                E::Slice(SpecError::MissingOption("nvme-tcp", "size")),
            ),
            (
                "nvme-tcp:10.0.0.2:4420:1:nqn=nqn.a,nqn=nqn.b",
                E::Slice(SpecError::UnknownOption("nvme-tcp", "nqn=nqn.b")),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_nvme_tcp(text), Err(*want), "{text}");
            assert!(!want.to_string().is_empty());
        }
        let long = format!("nqn.{}", "a".repeat(Nqn::MAX_LEN - 4));
        assert!(parse_nvme_tcp(&format!("nvme-tcp:1.2.3.4:1:1:nqn={long}")).is_ok());
        let too_long = format!("{long}a");
        let text = format!("nvme-tcp:1.2.3.4:1:1:nqn={too_long}");
        assert_eq!(parse_nvme_tcp(&text), Err(NvmeTcpError::BadNqn(&too_long)));
        assert!(NvmeTcpError::Form
            .to_string()
            .contains("nqn=<subsystem NQN>"));
    }
}
