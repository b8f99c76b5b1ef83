// SPDX-License-Identifier: MIT OR Apache-2.0
//! `nvme-tcp:<ipv4>:<port>:<nsid>:nqn=<subsystem NQN>[,<option>...]`: a namespace of a
//! remote NVMe/TCP subsystem (docs/design.md §5.9).
//!
//! NQNs contain `:` (`nqn.2014-08.org.nvmexpress:uuid:...`), so the NQN is not a
//! `:`-field but the first option, running to the first `,`. The options after it, in
//! any order: the slice (`part=`, `offset=,size=`, as for `nvme:`) and the reconnect
//! times, named as Linux's `nvme connect` names them (`reconnect-delay=`,
//! `ctrl-loss-tmo=`, in seconds), and further portals of the same subsystem
//! (`portal=<ipv4>:<port>`, up to [`MAX_ALTERNATES`]), which a lost association fails
//! over to in turn.

use core::fmt;

use super::{number, slice_options, Region, SpecError};

/// How a remote namespace's loss is ridden out, in seconds: an attempt every `delay_s`,
/// and I/O held for `ctrl_loss_tmo_s` from the loss before every held request fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReconnectTimes {
    /// `reconnect-delay=`.
    pub delay_s: u32,
    /// `ctrl-loss-tmo=`.
    pub ctrl_loss_tmo_s: u32,
}

impl ReconnectTimes {
    /// Linux's `ctrl_loss_tmo`; a delay half of Linux's 10 s: an outage ends sooner.
    pub const DEFAULT: ReconnectTimes = ReconnectTimes {
        delay_s: 5,
        ctrl_loss_tmo_s: 600,
    };
    /// Beyond a minute between attempts, a target back long since still waits for one.
    pub const MAX_DELAY_S: u32 = 60;
    /// Linux's blkfront has no request timeout: the guest waits as long as blkdom holds,
    /// so holding is bounded (Linux's `-1`, forever, is not offered).
    pub const MAX_CTRL_LOSS_TMO_S: u32 = 3600;

    pub fn delay_ms(&self) -> u64 {
        u64::from(self.delay_s) * 1000
    }

    pub fn ctrl_loss_tmo_ms(&self) -> u64 {
        u64::from(self.ctrl_loss_tmo_s) * 1000
    }
}

// Any delay goes with the default give-up time.
const _: () = assert!(ReconnectTimes::MAX_DELAY_S <= ReconnectTimes::DEFAULT.ctrl_loss_tmo_s);

/// The option keys after the NQN that are not the slice's.
const RECONNECT_DELAY: &str = "reconnect-delay";
const CTRL_LOSS_TMO: &str = "ctrl-loss-tmo";
const PORTAL: &str = "portal";

/// Portals a target may name besides its first (`portal=`).
pub const MAX_ALTERNATES: usize = 3;

/// Where a subsystem listens: an IPv4 address and a TCP port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Portal {
    pub addr: [u8; 4],
    pub port: u16,
}

impl fmt::Display for Portal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.addr;
        write!(f, "{a}.{b}.{c}.{d}:{}", self.port)
    }
}

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
    pub reconnect: ReconnectTimes,
    /// Further portals of the subsystem (`portal=`), in the order given.
    pub alternates: [Option<Portal>; MAX_ALTERNATES],
    pub region: Region,
}

impl NvmeTcpTarget {
    /// The first portal (`<ipv4>:<port>`).
    pub fn first_portal(&self) -> Portal {
        Portal {
            addr: self.addr,
            port: self.port,
        }
    }

    /// Every portal: the first, then the alternates.
    pub fn portals(&self) -> impl Iterator<Item = Portal> + '_ {
        core::iter::once(self.first_portal()).chain(self.alternates.iter().flatten().copied())
    }
}

impl fmt::Display for NvmeTcpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nvme-tcp:{}:{}:nqn={}",
            self.first_portal(),
            self.nsid,
            self.subsystem
        )?;
        // The defaults are not written: the text reads back as the same target.
        let defaults = ReconnectTimes::DEFAULT;
        if self.reconnect.delay_s != defaults.delay_s {
            write!(f, ",{RECONNECT_DELAY}={}", self.reconnect.delay_s)?;
        }
        if self.reconnect.ctrl_loss_tmo_s != defaults.ctrl_loss_tmo_s {
            write!(f, ",{CTRL_LOSS_TMO}={}", self.reconnect.ctrl_loss_tmo_s)?;
        }
        for portal in self.alternates.iter().flatten() {
            write!(f, ",{PORTAL}={portal}")?;
        }
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
    /// An option after the NQN that is neither a slice's nor a reconnect time.
    UnknownOption(&'a str),
    /// `reconnect-delay=` not 1 to [`ReconnectTimes::MAX_DELAY_S`].
    BadReconnectDelay(&'a str),
    /// `ctrl-loss-tmo=` not from the reconnect delay (the second field: the disk would
    /// give up before its second attempt) to [`ReconnectTimes::MAX_CTRL_LOSS_TMO_S`].
    BadCtrlLossTmo(&'a str, u32),
    /// `portal=` not `<ipv4>:<port>`.
    BadPortal(&'a str),
    /// A portal named twice (the first one included).
    DuplicatePortal(&'a str),
    /// More than [`MAX_ALTERNATES`] `portal=` options.
    TooManyPortals,
    /// An option after the NQN, in the slice's words: empty, twice, without a value, or
    /// a slice that does not parse.
    Slice(SpecError<'a>),
}

impl fmt::Display for NvmeTcpError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FORM: &str = "use nvme-tcp:<ipv4>:<port>:<nsid>:nqn=<subsystem NQN>\
             [,reconnect-delay=<s>][,ctrl-loss-tmo=<s>][,portal=<ipv4>:<port>...][,<slice>]";
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
            NvmeTcpError::UnknownOption(o) => write!(
                f,
                "nvme-tcp: unknown option {o:?}; after nqn=<NQN> come reconnect-delay=<s>, \
                 ctrl-loss-tmo=<s>, portal=<ipv4>:<port> and a slice (part=<n>, part=name:<label> or \
                 offset=<size>,size=<size>)"
            ),
            NvmeTcpError::BadReconnectDelay(t) => write!(
                f,
                "nvme-tcp: {RECONNECT_DELAY}={t:?} must be 1 to {} seconds",
                ReconnectTimes::MAX_DELAY_S
            ),
            NvmeTcpError::BadCtrlLossTmo(t, min) => write!(
                f,
                "nvme-tcp: {CTRL_LOSS_TMO}={t:?} must be {min} to {} seconds (no less than \
                 {RECONNECT_DELAY}, {} unless given)",
                ReconnectTimes::MAX_CTRL_LOSS_TMO_S,
                ReconnectTimes::DEFAULT.delay_s
            ),
            NvmeTcpError::BadPortal(p) => write!(
                f,
                "nvme-tcp: {PORTAL}={p:?} is not <ipv4>:<port> (a dotted quad, a port 1 to 65535)"
            ),
            NvmeTcpError::DuplicatePortal(p) => {
                write!(f, "nvme-tcp: portal {p} is named twice")
            }
            NvmeTcpError::TooManyPortals => write!(
                f,
                "nvme-tcp: at most {MAX_ALTERNATES} {PORTAL}= options (the first portal and \
                 {MAX_ALTERNATES} more)"
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
    let (nqn, rest) = match options.split_once(',') {
        Some((nqn, rest)) => (nqn, Some(rest)),
        None => (options, None),
    };
    let subsystem = Nqn::new(nqn).ok_or(NvmeTcpError::BadNqn(nqn))?;
    let first = Portal { addr, port };
    let (reconnect, alternates, region) = match rest {
        None => (
            ReconnectTimes::DEFAULT,
            [None; MAX_ALTERNATES],
            Region::Whole,
        ),
        Some(rest) => after_nqn(rest, first)?,
    };
    Ok(NvmeTcpTarget {
        addr,
        port,
        nsid,
        subsystem,
        reconnect,
        alternates,
        region,
    })
}

/// `<ipv4>:<port>`.
fn portal(text: &str) -> Option<Portal> {
    let (addr, port) = text.split_once(':')?;
    let port = number("nvme-tcp", port)
        .ok()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)?;
    Some(Portal {
        addr: ipv4(addr)?,
        port,
    })
}

/// What `after_nqn` makes of the options.
type AfterNqn = (ReconnectTimes, [Option<Portal>; MAX_ALTERNATES], Region);

/// The options after `nqn=<NQN>,`: the reconnect times, the other portals (`first`
/// being the target's own) and the slice.
fn after_nqn(options: &str, first: Portal) -> Result<AfterNqn, NvmeTcpError<'_>> {
    const KIND: &str = "nvme-tcp";
    let is_ours = |option: &str| {
        let key = option.split_once('=').map_or(option, |(key, _)| key);
        key == RECONNECT_DELAY || key == CTRL_LOSS_TMO || key == PORTAL
    };
    let (mut delay, mut tmo, mut slice) = (None, None, false);
    let mut alternates = [None; MAX_ALTERNATES];
    let mut named = 0;
    for option in options.split(',') {
        if option.is_empty() {
            return Err(NvmeTcpError::Slice(SpecError::EmptyOption(KIND)));
        }
        let (key, value) = option.split_once('=').unwrap_or((option, ""));
        if key == PORTAL {
            let portal = portal(value).ok_or(NvmeTcpError::BadPortal(value))?;
            if portal == first || alternates.contains(&Some(portal)) {
                return Err(NvmeTcpError::DuplicatePortal(value));
            }
            *alternates
                .get_mut(named)
                .ok_or(NvmeTcpError::TooManyPortals)? = Some(portal);
            named += 1;
            continue;
        }
        let (key, slot) = match key {
            RECONNECT_DELAY => (RECONNECT_DELAY, &mut delay),
            CTRL_LOSS_TMO => (CTRL_LOSS_TMO, &mut tmo),
            "part" | "offset" | "size" => {
                // Checked with the rest of the slice, below.
                slice = true;
                continue;
            }
            _ => return Err(NvmeTcpError::UnknownOption(option)),
        };
        if slot.is_some() {
            return Err(NvmeTcpError::Slice(SpecError::DuplicateOption(KIND, key)));
        }
        if value.is_empty() {
            return Err(NvmeTcpError::Slice(SpecError::MissingValue(KIND, key)));
        }
        *slot = Some(value);
    }
    let seconds = |text: &str, min: u32, max: u32| {
        number(KIND, text)
            .ok()
            .and_then(|s| u32::try_from(s).ok())
            .filter(|s| (min..=max).contains(s))
    };
    let defaults = ReconnectTimes::DEFAULT;
    let delay_s = match delay {
        None => defaults.delay_s,
        Some(text) => seconds(text, 1, ReconnectTimes::MAX_DELAY_S)
            .ok_or(NvmeTcpError::BadReconnectDelay(text))?,
    };
    let ctrl_loss_tmo_s = match tmo {
        None => defaults.ctrl_loss_tmo_s,
        Some(text) => seconds(text, delay_s, ReconnectTimes::MAX_CTRL_LOSS_TMO_S)
            .ok_or(NvmeTcpError::BadCtrlLossTmo(text, delay_s))?,
    };
    let region = if slice {
        slice_options(KIND, options.split(',').filter(|o| !is_ours(o)))
            .map_err(NvmeTcpError::Slice)?
    } else {
        Region::Whole
    };
    Ok((
        ReconnectTimes {
            delay_s,
            ctrl_loss_tmo_s,
        },
        alternates,
        region,
    ))
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
    fn other_portals_of_the_subsystem() {
        let text = format!(
            "nvme-tcp:10.0.0.2:4420:1:nqn={NQN},ctrl-loss-tmo=30,portal=10.0.0.3:4420,\
             portal=10.0.0.2:4421,offset=0,size=1G"
        );
        let t = parse_nvme_tcp(&text).unwrap();
        let portals: Vec<String> = t.portals().map(|p| p.to_string()).collect();
        assert_eq!(portals, ["10.0.0.2:4420", "10.0.0.3:4420", "10.0.0.2:4421"]);
        assert_eq!(t.reconnect.ctrl_loss_tmo_s, 30);
        assert_eq!(
            t.region,
            Region::Extent {
                offset: 0,
                size: 1 << 30
            }
        );
        assert_eq!(t.to_string(), text, "Display reads back as the same text");
        let whole = parse_nvme_tcp("nvme-tcp:1.2.3.4:1:1:nqn=nqn.a").unwrap();
        assert_eq!(whole.portals().count(), 1);
        let three = "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,portal=1.2.3.4:2,portal=1.2.3.4:3,\
                     portal=1.2.3.5:1";
        assert_eq!(parse_nvme_tcp(three).unwrap().portals().count(), 4);
        use NvmeTcpError as E;
        for (text, want) in [
            (format!("{three},portal=1.2.3.6:1"), E::TooManyPortals),
            (
                "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,portal=1.2.3.4:1".into(),
                E::DuplicatePortal("1.2.3.4:1"),
            ),
            (
                "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,portal=1.2.3.5:1,portal=1.2.3.5:1".into(),
                E::DuplicatePortal("1.2.3.5:1"),
            ),
            (
                "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,portal=1.2.3.5".into(),
                E::BadPortal("1.2.3.5"),
            ),
            (
                "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,portal=1.2.3.5:0".into(),
                E::BadPortal("1.2.3.5:0"),
            ),
            (
                "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,portal=host:4420".into(),
                E::BadPortal("host:4420"),
            ),
            (
                "nvme-tcp:1.2.3.4:1:1:nqn=nqn.a,portal=".into(),
                E::BadPortal(""),
            ),
        ] {
            assert_eq!(parse_nvme_tcp(&text), Err(want), "{text}");
            assert!(!want.to_string().is_empty());
        }
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
                E::UnknownOption("nqn=nqn.b"),
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

    #[test]
    fn reconnect_times_go_among_the_slice_options() {
        let parse = |options: &str| {
            parse_nvme_tcp(&format!("nvme-tcp:10.9.0.1:4420:1:nqn=nqn.x:y{options}"))
                .map(|t| (t.reconnect, t.region))
                .map_err(|e| e.to_string())
        };
        let times = |delay_s, ctrl_loss_tmo_s| ReconnectTimes {
            delay_s,
            ctrl_loss_tmo_s,
        };
        let slice = Region::Extent {
            offset: 64 << 20,
            size: 64 << 20,
        };
        assert_eq!(parse(""), Ok((ReconnectTimes::DEFAULT, Region::Whole)));
        assert_eq!(ReconnectTimes::DEFAULT, times(5, 600));
        assert_eq!(
            parse(",ctrl-loss-tmo=30"),
            Ok((times(5, 30), Region::Whole))
        );
        assert_eq!(
            parse(",ctrl-loss-tmo=30,offset=64M,size=64M"),
            Ok((times(5, 30), slice))
        );
        assert_eq!(
            parse(",offset=64M,reconnect-delay=2,size=64M,ctrl-loss-tmo=20"),
            Ok((times(2, 20), slice)),
            "any order, the slice's options around the times"
        );
        assert_eq!(
            parse(",reconnect-delay=60"),
            Ok((times(60, 600), Region::Whole))
        );
        assert_eq!(
            parse(",reconnect-delay=1,ctrl-loss-tmo=1"),
            Ok((times(1, 1), Region::Whole)),
            "the least of each"
        );
        assert_eq!(
            parse(",ctrl-loss-tmo=3600,reconnect-delay=7,part=2"),
            Ok((times(7, 3600), Region::Partition(2)))
        );
        assert_eq!(parse(",ctrl-loss-tmo=5"), Ok((times(5, 5), Region::Whole)));
        let text = "nvme-tcp:10.9.0.1:4420:1:nqn=nqn.x:y,reconnect-delay=2,ctrl-loss-tmo=30,\
                    offset=64M,size=64M";
        let t = parse_nvme_tcp(text).unwrap();
        assert_eq!(t.to_string(), text, "Display reads back as the same text");
        let t = parse_nvme_tcp("nvme-tcp:10.9.0.1:4420:1:nqn=nqn.x:y,reconnect-delay=5").unwrap();
        assert_eq!(t.to_string(), "nvme-tcp:10.9.0.1:4420:1:nqn=nqn.x:y");
        assert_eq!(
            (t.reconnect.delay_ms(), t.reconnect.ctrl_loss_tmo_ms()),
            (5_000, 600_000)
        );
    }

    #[test]
    fn bad_reconnect_times_say_what_is_wrong() {
        use NvmeTcpError as E;
        let cases: &[(&str, E<'static>)] = &[
            (",reconnect-delay=0", E::BadReconnectDelay("0")),
            (",reconnect-delay=61", E::BadReconnectDelay("61")),
            (
                ",reconnect-delay=4294967301",
                E::BadReconnectDelay("4294967301"),
            ),
            (
                ",reconnect-delay=99999999999999999999999",
                E::BadReconnectDelay("99999999999999999999999"),
            ),
            (",reconnect-delay=5s", E::BadReconnectDelay("5s")),
            (",reconnect-delay=+5", E::BadReconnectDelay("+5")),
            (",reconnect-delay=-1", E::BadReconnectDelay("-1")),
            (",ctrl-loss-tmo=0", E::BadCtrlLossTmo("0", 5)),
            (",ctrl-loss-tmo=-1", E::BadCtrlLossTmo("-1", 5)),
            (",ctrl-loss-tmo=4", E::BadCtrlLossTmo("4", 5)),
            (",ctrl-loss-tmo=3601", E::BadCtrlLossTmo("3601", 5)),
            (
                ",ctrl-loss-tmo=4294967897",
                E::BadCtrlLossTmo("4294967897", 5),
            ),
            (
                ",reconnect-delay=30,ctrl-loss-tmo=20",
                E::BadCtrlLossTmo("20", 30),
            ),
            (
                ",ctrl-loss-tmo=20,reconnect-delay=30",
                E::BadCtrlLossTmo("20", 30),
            ),
            (
                ",reconnect-delay=61,ctrl-loss-tmo=0",
                E::BadReconnectDelay("61"),
            ),
            (
                ",reconnect-delay=5,reconnect-delay=5",
                E::Slice(SpecError::DuplicateOption("nvme-tcp", "reconnect-delay")),
            ),
            (
                ",ctrl-loss-tmo=30,offset=0,ctrl-loss-tmo=30,size=1M",
                E::Slice(SpecError::DuplicateOption("nvme-tcp", "ctrl-loss-tmo")),
            ),
            (
                ",ctrl-loss-tmo=",
                E::Slice(SpecError::MissingValue("nvme-tcp", "ctrl-loss-tmo")),
            ),
            (
                ",reconnect-delay",
                E::Slice(SpecError::MissingValue("nvme-tcp", "reconnect-delay")),
            ),
            (
                ",ctrl-loss-tmo=30,,offset=0,size=1M",
                E::Slice(SpecError::EmptyOption("nvme-tcp")),
            ),
            (
                ",ctrl-loss-tmo=30,",
                E::Slice(SpecError::EmptyOption("nvme-tcp")),
            ),
            (",ctrl_loss_tmo=30", E::UnknownOption("ctrl_loss_tmo=30")),
            (",keep-alive-tmo=30", E::UnknownOption("keep-alive-tmo=30")),
            (
                ",size=1M,ctrl-loss-tmo=30,size=2M,offset=0",
                E::Slice(SpecError::DuplicateOption("nvme-tcp", "size")),
            ),
            (
                ",ctrl-loss-tmo=30,offset=0",
                E::Slice(SpecError::MissingOption("nvme-tcp", "size")),
            ),
            (
                ",part=1,ctrl-loss-tmo=30,offset=0",
                E::Slice(SpecError::PartitionWithExtent("nvme-tcp")),
            ),
        ];
        for (options, want) in cases {
            let text = format!("nvme-tcp:10.9.0.1:4420:1:nqn=nqn.a{options}");
            assert_eq!(parse_nvme_tcp(&text), Err(*want), "{text}");
        }
        let said = |e: E<'_>| e.to_string();
        assert_eq!(
            said(E::BadReconnectDelay("0")),
            "nvme-tcp: reconnect-delay=\"0\" must be 1 to 60 seconds"
        );
        assert_eq!(
            said(E::BadCtrlLossTmo("20", 30)),
            "nvme-tcp: ctrl-loss-tmo=\"20\" must be 30 to 3600 seconds (no less than \
             reconnect-delay, 5 unless given)"
        );
        assert!(said(E::UnknownOption("x=1")).contains("reconnect-delay=<s>, ctrl-loss-tmo=<s>"));
        assert!(said(E::Form).contains("[,ctrl-loss-tmo=<s>]"));
    }
}
