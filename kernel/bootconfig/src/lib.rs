// SPDX-License-Identifier: MIT OR Apache-2.0
//! The kernel command line and the configuration read from it.
//!
//! The command line is parsed once, at boot, into a [`Config`]; the kernel hands each
//! part of it to the code it tunes (the pollers, the control path, the rings' engines).
//! Each default and limit lives beside the policy it tunes (`polling`, `blkback`) and is
//! read from there. A bad value is reported ([`BadValue`], with the range it wants) and
//! its default kept; the other keys still apply. [`keys::KEYS`] lists every key, with the
//! test hooks', for README.md.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

pub mod cmdline;
pub mod keys;

pub use cmdline::Cmdline;
pub use keys::{Key, KeyDoc, Role, KEYS};

use blkback::budget::GrantLimits;
use blkback::engine::{
    DEFAULT_DEVICE_TIMEOUT_NS, DEFAULT_NOTIFY_HOLD_NS, MAX_DEVICE_TIMEOUT_NS, MAX_NOTIFY_HOLD_NS,
};
use blkback::negotiate::BackendParams;
use cmdslots::recovery::{DEFAULT_MAX_RESETS, MAX_MAX_RESETS};
use core::fmt;
use log::LevelFilter;
use nvmetcp::Digests;
use polling::idle::PollIdle;
use polling::spin::{MAX_SPELL_NS, MIN_SPELL_NS, SPELL_LIMIT_NS};

/// Everything the command line sets for the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `loglevel=`; `None` keeps the level the kernel starts with (info).
    pub log_level: Option<LevelFilter>,
    pub poller: PollerConfig,
    /// `grants.max-total=`, `grants.max-per-ring=`, `grants.idle-s=`: the domain's grant
    /// budget is made from them.
    pub grants: GrantLimits,
    /// `grants.persistent=`: offer frontends persistent grants.
    pub persistent_grants: bool,
    /// `device.timeout-ms=`, in ns: how long a device command may take before it is
    /// aborted, and its device reset if that does not bring it back (0: forever).
    pub device_timeout_ns: u64,
    /// `device.max-resets=`: resets in a row before a device is given up (0: a device
    /// whose command times out is given up at once).
    pub device_max_resets: u32,
    /// `net.ip=`, `net.gw=`: the storage network's address, static or by DHCP; `None`:
    /// no vif is used.
    pub net: Option<NetSetup>,
    /// `net.hostnqn=`: the NVMe host NQN blkdom connects to targets with.
    pub host_nqn: Option<HostNqn>,
    /// `net.digest=`: the digests every NVMe/TCP connection asks for.
    pub digests: Digests,
}

/// `net.digest=`: `none`, or `header`, `data` or both, `,`-separated, each once.
fn parse_digests(text: &str) -> Option<Digests> {
    let mut digests = Digests::NONE;
    if text == "none" {
        return Some(digests);
    }
    for word in text.split(',') {
        let on = match word {
            "header" => &mut digests.header,
            "data" => &mut digests.data,
            _ => return None,
        };
        if *on {
            return None;
        }
        *on = true;
    }
    Some(digests)
}

/// An NQN as NVMe allows it (up to 223 bytes), starting `nqn.`, printable ASCII other
/// than space and `,`; kept inline so the configuration stays a plain value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HostNqn {
    bytes: [u8; HostNqn::MAX_LEN],
    len: u8,
}

impl HostNqn {
    pub const MAX_LEN: usize = 223;

    pub fn new(text: &str) -> Option<HostNqn> {
        let valid = |b: u8| (b'!'..=b'~').contains(&b) && b != b',';
        if !text.starts_with("nqn.") || text.len() <= 4 || text.len() > Self::MAX_LEN {
            return None;
        }
        if !text.bytes().all(valid) {
            return None;
        }
        let mut bytes = [0; Self::MAX_LEN];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(HostNqn {
            bytes,
            len: text.len() as u8,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII went in (checked by `new`).
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl core::fmt::Debug for HostNqn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// How blkdom's vif gets its IPv4 address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetSetup {
    /// `net.ip=<a.b.c.d>/<prefix>` (and `net.gw=`).
    Static(NetConfig),
    /// `net.ip=dhcp`: address, prefix and router from a DHCPv4 lease. `net.gw=` is
    /// refused with it: the subnet it must lie in is not known until the lease.
    Dhcp,
}

impl NetSetup {
    /// The static address, if it is one.
    pub fn fixed(&self) -> Option<&NetConfig> {
        match self {
            NetSetup::Static(net) => Some(net),
            NetSetup::Dhcp => None,
        }
    }
}

/// blkdom's static IPv4 configuration on its vif.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfig {
    pub address: [u8; 4],
    pub prefix: u8,
    pub gateway: Option<[u8; 4]>,
}

impl NetConfig {
    fn same_subnet(&self, other: [u8; 4]) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        u32::from_be_bytes(self.address) & mask == u32::from_be_bytes(other) & mask
    }
}

/// Four decimal octets, each 0..=255 without leading zeros (`010` is refused: some
/// tools read it as octal).
pub fn parse_ipv4(text: &str) -> Option<[u8; 4]> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        let digits =
            !part.is_empty() && part.len() <= 3 && part.bytes().all(|b| b.is_ascii_digit());
        if !digits || (part.len() > 1 && part.starts_with('0')) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then_some(octets)
}

/// `<a.b.c.d>/<prefix>`: a unicast host address (not the subnet's own or its broadcast
/// address) with a prefix of 1 to 30.
fn parse_ip_prefix(text: &str) -> Option<NetConfig> {
    let (address, prefix) = text.split_once('/')?;
    let address = parse_ipv4(address)?;
    let canonical = prefix.bytes().all(|b| b.is_ascii_digit()) && !prefix.starts_with('0');
    let prefix = prefix
        .parse::<u8>()
        .ok()
        .filter(|p| canonical && (1..=30).contains(p))?;
    let host = u32::from_be_bytes(address) & (u32::MAX >> prefix);
    let unicast = address[0] != 0 && address[0] != 127 && address[0] < 224;
    (unicast && host != 0 && host != u32::MAX >> prefix).then_some(NetConfig {
        address,
        prefix,
        gateway: None,
    })
}

/// How the pollers run and answer their rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollerConfig {
    /// `poll.spin-us=`: the bounds of a poller's adaptive spin (`polling::spin`), in ns.
    pub spin_min_ns: u64,
    pub spin_max_ns: u64,
    /// `poll.idle=`; `None` for `auto`: the kernel chooses with
    /// [`PollIdle::for_pause_cost`] once it has timed a PAUSE, before any poller starts.
    pub idle: Option<PollIdle>,
    /// `notify.hold-us=`, in ns: how long a ring's engine may hold an event to its
    /// frontend while more responses are on their way (0: never).
    pub notify_hold_ns: u64,
}

impl Config {
    /// Every setting at its default.
    pub const DEFAULT: Config = Config {
        log_level: None,
        poller: PollerConfig {
            spin_min_ns: MIN_SPELL_NS,
            spin_max_ns: MAX_SPELL_NS,
            idle: None,
            notify_hold_ns: DEFAULT_NOTIFY_HOLD_NS,
        },
        grants: GrantLimits::DEFAULT,
        persistent_grants: BackendParams::OFFER_PERSISTENT_GRANTS,
        device_timeout_ns: DEFAULT_DEVICE_TIMEOUT_NS,
        device_max_resets: DEFAULT_MAX_RESETS,
        net: None,
        host_nqn: None,
        digests: Digests::NONE,
    };

    /// The configuration `cmdline` sets, and the values it had to refuse (each keeps its
    /// default). Takes no heap: it runs before memory is set up.
    pub fn parse<'a>(cmdline: &Cmdline<'a>) -> (Config, BadValues<'a>) {
        let mut config = Config::DEFAULT;
        let mut bad = BadValues::default();
        let mut refuse = |key: Key, text: &'a str| bad.push(BadValue { key, text });
        match cmdline.value(Key::LogLevel) {
            None => {}
            Some(text) => match parse_level(text) {
                Some(level) => config.log_level = Some(level),
                None => refuse(Key::LogLevel, text),
            },
        }
        match spin_window_ns(cmdline) {
            Ok(None) => {}
            Ok(Some((min, max))) => {
                config.poller.spin_min_ns = min;
                config.poller.spin_max_ns = max;
            }
            Err(text) => refuse(Key::PollSpinUs, text),
        }
        match cmdline.value(Key::PollIdle) {
            None | Some("auto") => {}
            Some(text) => match PollIdle::from_name(text) {
                Some(idle) => config.poller.idle = Some(idle),
                None => refuse(Key::PollIdle, text),
            },
        }
        match cmdline.number_up_to(Key::NotifyHoldUs, MAX_NOTIFY_HOLD_NS / 1000) {
            Ok(None) => {}
            Ok(Some(us)) => config.poller.notify_hold_ns = us * 1000,
            Err(text) => refuse(Key::NotifyHoldUs, text),
        }
        let grants = &mut config.grants;
        for (key, limit) in [
            (Key::GrantsMaxTotal, &mut grants.max_total),
            (Key::GrantsMaxPerRing, &mut grants.max_per_ring),
            (Key::GrantsIdleS, &mut grants.idle_secs),
        ] {
            let (_, max, _) = grant_bounds(key);
            match cmdline.number_up_to(key, u64::from(max)) {
                Ok(None) => {}
                Ok(Some(value)) => *limit = u32::try_from(value).map_or(max, |v| v.min(max)),
                Err(text) => refuse(key, text),
            }
        }
        match cmdline.value(Key::GrantsPersistent) {
            None => {}
            Some("on") => config.persistent_grants = true,
            Some("off") => config.persistent_grants = false,
            Some(text) => refuse(Key::GrantsPersistent, text),
        }
        match cmdline.number_up_to(Key::DeviceTimeoutMs, MAX_DEVICE_TIMEOUT_NS / 1_000_000) {
            Ok(None) => {}
            Ok(Some(ms)) => config.device_timeout_ns = ms * 1_000_000,
            Err(text) => refuse(Key::DeviceTimeoutMs, text),
        }
        match cmdline.number_up_to(Key::DeviceMaxResets, u64::from(MAX_MAX_RESETS)) {
            Ok(None) => {}
            Ok(Some(resets)) => config.device_max_resets = resets as u32,
            Err(text) => refuse(Key::DeviceMaxResets, text),
        }
        match cmdline.value(Key::NetIp) {
            None => {}
            Some("dhcp") => config.net = Some(NetSetup::Dhcp),
            Some(text) => match parse_ip_prefix(text) {
                Some(net) => config.net = Some(NetSetup::Static(net)),
                None => refuse(Key::NetIp, text),
            },
        }
        let fixed = match config.net.as_mut() {
            Some(NetSetup::Static(net)) => Some(net),
            _ => None,
        };
        match (cmdline.value(Key::NetGw), fixed) {
            (None, _) => {}
            (Some(text), net) => match (parse_ipv4(text), net) {
                (Some(gw), Some(net)) if net.same_subnet(gw) && gw != net.address => {
                    net.gateway = Some(gw)
                }
                _ => refuse(Key::NetGw, text),
            },
        }
        if let Some(text) = cmdline.value(Key::NetHostnqn) {
            match HostNqn::new(text) {
                Some(nqn) => config.host_nqn = Some(nqn),
                None => refuse(Key::NetHostnqn, text),
            }
        }
        if let Some(text) = cmdline.value(Key::NetDigest) {
            match parse_digests(text) {
                Some(digests) => config.digests = digests,
                None => refuse(Key::NetDigest, text),
            }
        }
        (config, bad)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// `poll.spin-us=<min>-<max>` in ns. `Err` holds the text when it is not two numbers of
/// microseconds with 0 < min <= max <= `SPELL_LIMIT_NS`.
fn spin_window_ns<'a>(cmdline: &Cmdline<'a>) -> Result<Option<(u64, u64)>, &'a str> {
    let Some(text) = cmdline.value(Key::PollSpinUs) else {
        return Ok(None);
    };
    let (min, max) = text.split_once('-').ok_or(text)?;
    let (min, max) = (
        min.parse::<u64>().map_err(|_| text)?,
        max.parse::<u64>().map_err(|_| text)?,
    );
    if min == 0 || min > max || max > SPELL_LIMIT_NS / 1000 {
        return Err(text);
    }
    Ok(Some((min * 1000, max * 1000)))
}

fn parse_level(text: &str) -> Option<LevelFilter> {
    let by_number = [
        LevelFilter::Off,
        LevelFilter::Error,
        LevelFilter::Warn,
        LevelFilter::Info,
        LevelFilter::Debug,
        LevelFilter::Trace,
    ];
    if let Ok(n) = text.parse::<usize>() {
        return by_number.get(n).copied();
    }
    by_number
        .into_iter()
        .find(|level| level.as_str().eq_ignore_ascii_case(text))
}

/// A key of [`GrantLimits`]: its default, its maximum and what it counts.
fn grant_bounds(key: Key) -> (u32, u32, &'static str) {
    let default = GrantLimits::DEFAULT;
    match key {
        Key::GrantsMaxTotal => (
            default.max_total,
            GrantLimits::MAX_TOTAL_LIMIT,
            "persistent grants mapped by all rings together",
        ),
        Key::GrantsMaxPerRing => (
            default.max_per_ring,
            GrantLimits::MAX_PER_RING_LIMIT,
            "persistent grants mapped by one ring",
        ),
        _ => (
            default.idle_secs,
            GrantLimits::MAX_IDLE_SECS,
            "seconds before an unused persistent grant is unmapped, 0 never",
        ),
    }
}

/// A value the command line gave that its key does not take. Shown as the console says
/// it: the key, the value, what the key wants and what is used instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadValue<'a> {
    pub key: Key,
    pub text: &'a str,
}

impl BadValue<'_> {
    /// A bad log level only warns (the log goes on at its level); every other bad value
    /// is an error.
    pub fn is_warning(&self) -> bool {
        self.key == Key::LogLevel
    }
}

impl fmt::Display for BadValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (key, text) = (self.key.name(), self.text);
        match self.key {
            Key::LogLevel => write!(
                f,
                "{key}={text} not understood (use off|error|warn|info|debug|trace or 0..5)"
            ),
            Key::PollSpinUs => write!(
                f,
                "{key}={text}: want <min>-<max> microseconds, 0 < min <= max <= {}; using \
                 the defaults",
                SPELL_LIMIT_NS / 1000
            ),
            Key::PollIdle => write!(
                f,
                "{key}={text}: want auto, pause, yield or spin; using auto"
            ),
            Key::NotifyHoldUs => write!(
                f,
                "{key}={text}: want microseconds, 0 (never) to {}; using the default ({} us)",
                MAX_NOTIFY_HOLD_NS / 1000,
                DEFAULT_NOTIFY_HOLD_NS / 1000
            ),
            Key::GrantsPersistent => write!(f, "{key}={text}: want on or off; using on"),
            Key::NetIp => write!(
                f,
                "{key}={text}: want dhcp or <a.b.c.d>/<prefix 1-30>, a host address; no vif \
                 is used"
            ),
            Key::NetGw => write!(
                f,
                "{key}={text}: want <a.b.c.d> inside net.ip's subnet, with a static net.ip \
                 (with net.ip=dhcp the lease's router is used); ignored"
            ),
            Key::NetHostnqn => write!(
                f,
                "{key}={text}: want nqn.<...>, up to {} printable ASCII characters other \
                 than ','; no nvme-tcp: disk is served",
                HostNqn::MAX_LEN
            ),
            Key::NetDigest => write!(
                f,
                "{key}={text}: want none, header, data or header,data; using none"
            ),
            Key::DeviceTimeoutMs => write!(
                f,
                "{key}={text}: want a whole number of milliseconds 0..={}; using {}",
                MAX_DEVICE_TIMEOUT_NS / 1_000_000,
                DEFAULT_DEVICE_TIMEOUT_NS / 1_000_000
            ),
            Key::DeviceMaxResets => write!(
                f,
                "{key}={text}: want a whole number of resets 0..={MAX_MAX_RESETS}; using \
                 {DEFAULT_MAX_RESETS}"
            ),
            grant => {
                let (default, max, meaning) = grant_bounds(grant);
                write!(
                    f,
                    "{key}={text}: want a whole number 0..={max} ({meaning}); using {default}"
                )
            }
        }
    }
}

/// The settings' keys: each is refused at most once.
const SETTINGS: usize = {
    let mut count = 0;
    let mut at = 0;
    while at < Key::ALL.len() {
        if matches!(Key::ALL[at].role(), Role::Setting) {
            count += 1;
        }
        at += 1;
    }
    count
};

/// The values [`Config::parse`] refused, in the order it read their keys.
#[derive(Clone, Copy, Debug, Default)]
pub struct BadValues<'a> {
    values: [Option<BadValue<'a>>; SETTINGS],
}

impl<'a> BadValues<'a> {
    fn push(&mut self, value: BadValue<'a>) {
        if let Some(slot) = self.values.iter_mut().find(|slot| slot.is_none()) {
            *slot = Some(value);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &BadValue<'a>> {
        self.values.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> (Config, Vec<String>) {
        let (config, bad) = Config::parse(&Cmdline::new(line));
        (config, bad.iter().map(ToString::to_string).collect())
    }

    fn parse_good(line: &str) -> Config {
        let (config, bad) = parse(line);
        assert!(bad.is_empty(), "{line}: {bad:?}");
        config
    }

    /// The one value `line` gives for `key`, refused: its message, and that every setting
    /// kept its default.
    fn refused(key: &str, value: &str) -> String {
        let line = format!("{key}={value}");
        let (config, bad) = parse(&line);
        assert_eq!(config, Config::DEFAULT, "{line}");
        assert_eq!(bad.len(), 1, "{line}: {bad:?}");
        assert!(bad[0].starts_with(&line), "{line}: {bad:?}");
        bad[0].clone()
    }

    #[test]
    fn the_storage_network_address_is_a_host_in_its_subnet() {
        assert_eq!(parse_good("").net, None);
        let net = parse_good("net.ip=10.9.0.2/24 net.gw=10.9.0.1")
            .net
            .unwrap();
        assert_eq!(
            net,
            NetSetup::Static(NetConfig {
                address: [10, 9, 0, 2],
                prefix: 24,
                gateway: Some([10, 9, 0, 1])
            })
        );
        assert_eq!(
            parse_good("net.ip=192.168.1.6/30")
                .net
                .unwrap()
                .fixed()
                .unwrap()
                .gateway,
            None
        );
        for bad in [
            "10.9.0.2",
            "10.9.0.2/",
            "10.9.0.2/0",
            "10.9.0.2/31",
            "10.9.0.2/33",
            "10.9.0.2/+8",
            "10.9.0.2/024",
            "10.9.0/24",
            "10.9.0.2.1/24",
            "10.9.0.256/24",
            "10.09.0.2/24",
            "10.9.0.0/24",
            "10.9.0.255/24",
            "0.9.0.2/8",
            "127.0.0.2/8",
            "224.0.0.2/8",
            "10.9.0.-2/24",
            "",
        ] {
            let message = refused("net.ip", bad);
            assert!(message.contains("no vif is used"), "{message}");
        }
        for gw in ["10.9.1.1", "10.9.0.2", "x", "10.9.0.1/24"] {
            let (config, bad) = parse(&format!("net.ip=10.9.0.2/24 net.gw={gw}"));
            assert_eq!(config.net.unwrap().fixed().unwrap().gateway, None, "{gw}");
            assert_eq!(bad.len(), 1, "{gw}: {bad:?}");
        }
        let (config, bad) = parse("net.gw=10.9.0.1");
        assert_eq!(
            (config.net, bad.len()),
            (None, 1),
            "a router without an address"
        );
    }

    #[test]
    fn dhcp_is_asked_for_by_name_and_takes_no_router() {
        assert_eq!(parse_good("net.ip=dhcp").net, Some(NetSetup::Dhcp));
        assert_eq!(NetSetup::Dhcp.fixed(), None);
        for bad in ["dhcpx", "DHCP", "dhcp/24", "dhc"] {
            let message = refused("net.ip", bad);
            assert!(message.contains("want dhcp or"), "{message}");
        }
        let (config, bad) = parse("net.ip=dhcp net.gw=10.9.0.1");
        assert_eq!(config.net, Some(NetSetup::Dhcp), "the lease still applies");
        assert_eq!(bad.len(), 1, "{bad:?}");
        let message = &bad[0];
        assert!(
            message.starts_with("net.gw=10.9.0.1:") && message.contains("lease's router"),
            "{message}"
        );
    }

    #[test]
    fn digests_are_none_header_data_or_both() {
        let both = Digests {
            header: true,
            data: true,
        };
        for (text, want) in [
            ("none", Digests::NONE),
            (
                "header",
                Digests {
                    header: true,
                    data: false,
                },
            ),
            (
                "data",
                Digests {
                    header: false,
                    data: true,
                },
            ),
            ("header,data", both),
            ("data,header", both),
        ] {
            assert_eq!(parse_good(&format!("net.digest={text}")).digests, want);
        }
        for bad in [
            "",
            "both",
            "header,",
            "header,header",
            "none,data",
            "HEADER",
            "crc32c",
        ] {
            let (config, refused) = parse(&format!("net.digest={bad}"));
            assert_eq!((config.digests, refused.len()), (Digests::NONE, 1), "{bad}");
            let message = refused[0].to_string();
            assert!(message.contains("want none, header, data"), "{message}");
        }
    }

    #[test]
    fn the_host_nqn_is_an_nqn() {
        let nqn = "nqn.2014-08.org.nvmexpress:uuid:b1cd0000-0000-4000-8000-000000000001";
        let config = parse_good(&format!("net.hostnqn={nqn}"));
        assert_eq!(config.host_nqn.unwrap().as_str(), nqn);
        let long = format!("nqn.{}", "a".repeat(HostNqn::MAX_LEN - 4));
        assert_eq!(
            parse_good(&format!("net.hostnqn={long}"))
                .host_nqn
                .unwrap()
                .as_str(),
            long
        );
        for bad in [
            "nqn.",
            "iqn.2001-04.com.example",
            "nqn.a,b",
            &format!("{long}a"),
        ] {
            let (config, refused) = parse(&format!("net.hostnqn={bad}"));
            assert_eq!((config.host_nqn, refused.len()), (None, 1), "{bad}");
        }
    }

    #[test]
    fn nothing_given_is_every_default() {
        assert_eq!(parse_good(""), Config::DEFAULT);
        assert_eq!(parse_good("selftest disktest=nvme:1 x=y"), Config::DEFAULT);
    }

    #[test]
    fn log_levels_by_name_and_number() {
        let level = |line: &str| parse_good(line).log_level;
        assert_eq!(level("loglevel=WARN"), Some(LevelFilter::Warn));
        assert_eq!(level("loglevel=5"), Some(LevelFilter::Trace));
        assert_eq!(level("loglevel=off"), Some(LevelFilter::Off));
        assert_eq!(
            level("loglevel=info loglevel=debug"),
            Some(LevelFilter::Debug)
        );
        for bad in ["loud", "6", ""] {
            assert_eq!(
                refused("loglevel", bad),
                format!(
                    "loglevel={bad} not understood (use off|error|warn|info|debug|trace or 0..5)"
                )
            );
        }
        let (_, bad) = Config::parse(&Cmdline::new("loglevel=loud poll.idle=x"));
        let warnings: Vec<bool> = bad.iter().map(BadValue::is_warning).collect();
        assert_eq!(warnings, [true, false]);
    }

    #[test]
    fn spin_window_is_two_ordered_bounds() {
        let window = |line: &str| {
            let poller = parse_good(line).poller;
            (poller.spin_min_ns, poller.spin_max_ns)
        };
        assert_eq!(window("poll.spin-us=50-1000"), (50_000, 1_000_000));
        assert_eq!(window("poll.spin-us=7-7"), (7_000, 7_000));
        assert_eq!(window("poll.spin-us=1-100000"), (1_000, 100_000_000));
        for bad in ["0-10", "10-5", "5", "a-9", "1-100001", "-5", "5-"] {
            assert_eq!(
                refused("poll.spin-us", bad),
                format!(
                    "poll.spin-us={bad}: want <min>-<max> microseconds, 0 < min <= max <= \
                     100000; using the defaults"
                )
            );
        }
    }

    #[test]
    fn poll_idle_is_auto_pause_yield_or_spin() {
        let cases = [
            ("x", None),
            ("poll.idle=yield", Some(PollIdle::Yield)),
            ("poll.idle=yield poll.idle=pause", Some(PollIdle::Pause)),
            ("poll.idle=spin", Some(PollIdle::Spin)),
            ("poll.idle=spin poll.idle=auto", None),
        ];
        for (line, idle) in cases {
            assert_eq!(parse_good(line).poller.idle, idle, "{line}");
        }
        for bad in ["", "spinning", "Yield", "yield,pause"] {
            assert_eq!(
                refused("poll.idle", bad),
                format!("poll.idle={bad}: want auto, pause, yield or spin; using auto")
            );
        }
    }

    #[test]
    fn notify_hold_is_microseconds_up_to_the_cap() {
        let hold = |line: &str| parse_good(line).poller.notify_hold_ns;
        assert_eq!(hold("notify.hold-us=0"), 0);
        assert_eq!(hold("notify.hold-us=200 notify.hold-us=20000"), 20_000_000);
        for bad in ["", "-1", "20001", "5us", "1.5"] {
            assert_eq!(
                refused("notify.hold-us", bad),
                format!(
                    "notify.hold-us={bad}: want microseconds, 0 (never) to 20000; using the \
                     default (5000 us)"
                )
            );
        }
    }

    #[test]
    fn persistent_grants_are_on_or_off() {
        assert!(!parse_good("grants.persistent=off").persistent_grants);
        assert!(parse_good("grants.persistent=off grants.persistent=on").persistent_grants);
        for bad in ["", "0", "Off", "no"] {
            assert_eq!(
                refused("grants.persistent", bad),
                format!("grants.persistent={bad}: want on or off; using on")
            );
        }
    }

    #[test]
    fn device_timeout_is_milliseconds_up_to_an_hour() {
        let timeout = |line: &str| parse_good(line).device_timeout_ns;
        assert_eq!(timeout("device.timeout-ms=2500"), 2_500_000_000);
        assert_eq!(timeout("device.timeout-ms=0"), 0);
        assert_eq!(timeout("device.timeout-ms=3600000"), MAX_DEVICE_TIMEOUT_NS);
        for bad in ["3600001", "-1", "30s", "", "1e3"] {
            assert_eq!(
                refused("device.timeout-ms", bad),
                format!(
                    "device.timeout-ms={bad}: want a whole number of milliseconds \
                     0..=3600000; using 30000"
                )
            );
        }
    }

    #[test]
    fn device_resets_are_a_count_up_to_a_hundred() {
        let resets = |line: &str| parse_good(line).device_max_resets;
        assert_eq!(resets(""), 3);
        assert_eq!(resets("device.max-resets=0"), 0);
        assert_eq!(resets("device.max-resets=100"), 100);
        for bad in ["101", "-1", "three", ""] {
            assert_eq!(
                refused("device.max-resets", bad),
                format!("device.max-resets={bad}: want a whole number of resets 0..=100; using 3")
            );
        }
    }

    #[test]
    fn grant_limits_are_checked_and_bad_ones_keep_the_default() {
        let limits = parse_good("grants.max-total=4096 grants.max-per-ring=0 grants.idle-s=0");
        assert_eq!(
            limits.grants,
            GrantLimits {
                max_total: 4096,
                max_per_ring: 0,
                idle_secs: 0
            }
        );
        for (key, value) in [
            ("grants.max-total", "lots"),
            ("grants.max-total", "-1"),
            ("grants.max-total", "4194305"),
            ("grants.max-total", "99999999999999999999"),
            ("grants.max-per-ring", "16385"),
            ("grants.max-per-ring", ""),
            ("grants.idle-s", "86401"),
            ("grants.idle-s", "1.5"),
        ] {
            refused(key, value);
        }
        // A bad value keeps its default; the good ones apply.
        let (config, bad) =
            parse("grants.max-per-ring=99999 grants.max-total=2048 grants.idle-s=x");
        assert_eq!(
            config.grants,
            GrantLimits {
                max_total: 2048,
                ..GrantLimits::default()
            }
        );
        assert_eq!(
            bad,
            [
                "grants.max-per-ring=99999: want a whole number 0..=16384 (persistent grants \
                 mapped by one ring); using 8448",
                "grants.idle-s=x: want a whole number 0..=86400 (seconds before an unused \
                 persistent grant is unmapped, 0 never); using 60"
            ]
        );
        // The limits exactly at their bounds are taken.
        let limits =
            parse_good("grants.max-total=4194304 grants.max-per-ring=16384 grants.idle-s=86400");
        assert_eq!(
            limits.grants,
            GrantLimits {
                max_total: GrantLimits::MAX_TOTAL_LIMIT,
                max_per_ring: GrantLimits::MAX_PER_RING_LIMIT,
                idle_secs: GrantLimits::MAX_IDLE_SECS,
            }
        );
    }

    #[test]
    fn every_bad_setting_is_reported_and_the_good_ones_apply() {
        let line = "loglevel=loud poll.spin-us=9-1 poll.idle=nap notify.hold-us=x \
                    grants.max-total=y grants.max-per-ring=z grants.idle-s=w \
                    grants.persistent=maybe device.timeout-ms=never device.max-resets=lots \
                    net.ip=10.0.0.0/24 net.gw=10.0.0.1 net.hostnqn=iqn.x net.digest=crc";
        let (config, bad) = parse(line);
        assert_eq!(config, Config::DEFAULT);
        assert_eq!(bad.len(), SETTINGS);
        let (config, bad) = parse("grants.idle-s=w notify.hold-us=7 device.timeout-ms=never");
        assert_eq!(config.poller.notify_hold_ns, 7_000);
        assert_eq!(bad.len(), 2);
    }

    /// The list's defaults and ranges for the settings are the ones the parser uses.
    #[test]
    fn the_key_list_says_the_defaults_and_limits_in_use() {
        let d = Config::DEFAULT;
        let expected = [
            (Key::LogLevel, "info".to_string(), "0 to 5".to_string()),
            (
                Key::PollSpinUs,
                format!(
                    "{}-{}",
                    d.poller.spin_min_ns / 1000,
                    d.poller.spin_max_ns / 1000
                ),
                format!("<= {}", SPELL_LIMIT_NS / 1000),
            ),
            (Key::PollIdle, "auto".into(), "spin".into()),
            (
                Key::GrantsMaxTotal,
                d.grants.max_total.to_string(),
                format!("to {}", GrantLimits::MAX_TOTAL_LIMIT),
            ),
            (
                Key::GrantsMaxPerRing,
                d.grants.max_per_ring.to_string(),
                format!("to {}", GrantLimits::MAX_PER_RING_LIMIT),
            ),
            (
                Key::GrantsIdleS,
                d.grants.idle_secs.to_string(),
                format!("to {} seconds", GrantLimits::MAX_IDLE_SECS),
            ),
            (Key::GrantsPersistent, "on".into(), "on, off".into()),
            (
                Key::NotifyHoldUs,
                (d.poller.notify_hold_ns / 1000).to_string(),
                format!("to {} microseconds", MAX_NOTIFY_HOLD_NS / 1000),
            ),
            (
                Key::DeviceTimeoutMs,
                (d.device_timeout_ns / 1_000_000).to_string(),
                format!("to {} milliseconds", MAX_DEVICE_TIMEOUT_NS / 1_000_000),
            ),
            (
                Key::DeviceMaxResets,
                d.device_max_resets.to_string(),
                format!("to {MAX_MAX_RESETS}"),
            ),
            (Key::NetIp, "none".into(), "prefix 1 to 30".into()),
            (Key::NetGw, "none".into(), "inside net.ip's subnet".into()),
            (Key::NetHostnqn, "none".into(), "up to 223".into()),
            (Key::NetDigest, "none".into(), "header,data".into()),
        ];
        assert_eq!(d.digests, Digests::NONE);
        assert!(d.persistent_grants);
        assert_eq!(expected.len(), SETTINGS);
        for (key, default, range) in expected {
            let doc = key.doc();
            assert_eq!(doc.role, Role::Setting, "{}", doc.name);
            assert_eq!(doc.default, default, "{}", doc.name);
            assert!(doc.range.contains(&range), "{}: {:?}", doc.name, doc.range);
        }
    }
}
