// SPDX-License-Identifier: MIT OR Apache-2.0
//! How a `target=` names a device, and which device on the bus that is.
//!
//! Stable names say what does not change when drives are added, removed, fail or move to
//! another PCI slot: an NVMe controller's serial number (Identify Controller bytes 4..23),
//! a namespace's NGUID or EUI-64 (Identify Namespace bytes 104..119 and 120..127), a
//! virtio-blk device's serial (`VIRTIO_BLK_T_GET_ID`). The PCI address (in blkdom's view:
//! where the toolstack or QEMU put the device on blkdom's bus) is stable as long as the
//! configuration is. The positional forms (`nvme:<nsid>`: the first NVMe controller;
//! `virtio:<index>`: the index-th virtio-blk device, in bus order) change meaning when a
//! device is added, removed or fails: a guest could be served another guest's drive.
//!
//! [`resolve_nvme`] and [`resolve_virtio`] take what was read from each device at
//! bring-up ([`ControllerIds`], [`VirtioIds`]) and say which one a name reaches, or why
//! none: nothing matches, or two devices match (two controllers with one serial, a
//! namespace seen through two controllers) and blkdom will not guess.

use crate::inline::{InlineName, NameChars};
use core::fmt;
use pci::PciAddress;

/// A device serial as a `target=` gives it: 1 to 20 printable ASCII characters other
/// than space, `:` and `,` (which the grammar uses). An NVMe serial is 20 bytes, a virtio
/// device id at most 20.
pub type Serial = InlineName<20, SerialChars>;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SerialChars;

impl NameChars for SerialChars {
    fn valid(b: u8) -> bool {
        b.is_ascii_graphic() && b != b':' && b != b','
    }
}

/// The serial an NVMe controller reports (Identify Controller SN, 20 bytes of ASCII
/// padded with spaces), as it is compared with a `target=`'s: without the padding (and
/// without leading spaces, which some drives put in front). `None` if what is left is
/// empty or has bytes a `target=` cannot name.
pub fn nvme_serial(raw: &[u8; 20]) -> Option<&str> {
    let text = core::str::from_utf8(raw).ok()?;
    let text = text.trim_matches(|c| c == ' ' || c == '\0');
    Serial::new(text).map(|_| text)
}

/// The serial a virtio-blk device reports (`VIRTIO_BLK_T_GET_ID`: up to 20 bytes, padded
/// with NULs when shorter), up to its first NUL. `None` if empty or with bytes a
/// `target=` cannot name.
pub fn virtio_serial(raw: &[u8; 20]) -> Option<&str> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let text = core::str::from_utf8(&raw[..end]).ok()?;
    Serial::new(text).map(|_| text)
}

/// A 128-bit NGUID or 64-bit EUI-64 as 32 or 16 hex digits.
fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

/// `N` bytes from exactly `2N` hex digits (either case); dashes between them, as Linux
/// prints an NGUID (`8-4-4-4-12`), are skipped. `None` for anything else, and for all
/// zeros (which the specification uses for "none").
pub fn parse_hex_id<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    let mut digits = 0;
    for b in text.bytes() {
        if b == b'-' {
            continue;
        }
        let value = (b as char).to_digit(16)? as u8;
        if digits >= 2 * N {
            return None;
        }
        out[digits / 2] |= if digits % 2 == 0 { value << 4 } else { value };
        digits += 1;
    }
    let dashes_inside = !text.starts_with('-') && !text.ends_with('-') && !text.contains("--");
    (digits == 2 * N && dashes_inside && out.iter().any(|&b| b != 0)).then_some(out)
}

/// `bb:dd.f` (hex bus, hex device below 32, function below 8): a PCI address in blkdom's
/// view, as `pci::PciAddress` prints it.
pub fn parse_pci_address(text: &str) -> Option<PciAddress> {
    let (bus, rest) = text.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |t: &str, max: u32| {
        (!t.is_empty() && t.len() <= 2 && t.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(t, 16).ok())
            .flatten()
            .filter(|v| *v <= max)
    };
    let function = (function.len() == 1).then(|| hex(function, 7)).flatten()?;
    Some(PciAddress {
        bus: hex(bus, 0xff)? as u8,
        device: hex(device, 31)? as u8,
        function: function as u8,
    })
}

/// How a `target=` names an NVMe namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NvmeName {
    /// `nvme:<nsid>`: namespace `nsid` of the first NVMe controller in bus order
    /// (positional: which controller that is changes with the bus).
    First { nsid: u32 },
    /// `nvme:serial=<SN>:<nsid>`: namespace `nsid` of the controller with this serial.
    Serial { serial: Serial, nsid: u32 },
    /// `nvme@<bb:dd.f>:<nsid>`: namespace `nsid` of the controller at this address.
    Pci { address: PciAddress, nsid: u32 },
    /// `nvme:nguid=<32 hex digits>`: the namespace with this NGUID.
    Nguid([u8; 16]),
    /// `nvme:eui64=<16 hex digits>`: the namespace with this EUI-64.
    Eui64([u8; 8]),
}

/// How a `target=` names a virtio-blk device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VirtioName {
    /// `virtio:<index>`: the index-th virtio-blk device in bus order (positional).
    Index(u32),
    /// `virtio:serial=<id>`: the device whose `VIRTIO_BLK_T_GET_ID` answers this.
    Serial(Serial),
    /// `virtio@<bb:dd.f>`: the device at this address.
    Pci(PciAddress),
}

impl NvmeName {
    /// Whether the name depends on the order of devices on the bus.
    pub fn positional(&self) -> bool {
        matches!(self, NvmeName::First { .. })
    }
}

impl VirtioName {
    /// Whether the name depends on the order of devices on the bus.
    pub fn positional(&self) -> bool {
        matches!(self, VirtioName::Index(_))
    }
}

/// As the grammar writes it (`parse_backing` reads it back).
impl fmt::Display for NvmeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvmeName::First { nsid } => write!(f, "nvme:{nsid}"),
            NvmeName::Serial { serial, nsid } => write!(f, "nvme:serial={serial}:{nsid}"),
            NvmeName::Pci { address, nsid } => write!(f, "nvme@{address}:{nsid}"),
            NvmeName::Nguid(id) => {
                f.write_str("nvme:nguid=")?;
                write_hex(f, id)
            }
            NvmeName::Eui64(id) => {
                f.write_str("nvme:eui64=")?;
                write_hex(f, id)
            }
        }
    }
}

/// As the grammar writes it (`parse_backing` reads it back).
impl fmt::Display for VirtioName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VirtioName::Index(index) => write!(f, "virtio:{index}"),
            VirtioName::Serial(serial) => write!(f, "virtio:serial={serial}"),
            VirtioName::Pci(address) => write!(f, "virtio@{address}"),
        }
    }
}

/// A 128-bit NGUID as 32 hex digits (for listings).
pub struct Hex<'a>(pub &'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, self.0)
    }
}

/// What identifies a namespace (Identify Namespace): all-zero ids are absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceIds {
    pub nsid: u32,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
}

/// An NVMe controller on the bus and what its bring-up read.
#[derive(Clone, Copy, Debug)]
pub struct ControllerIds<'a> {
    pub address: PciAddress,
    /// `None`: not identified (its bring-up failed), or a serial a `target=` cannot
    /// name.
    pub serial: Option<&'a str>,
    /// Its active namespaces (empty when not identified).
    pub namespaces: &'a [NamespaceIds],
}

/// A virtio-blk device on the bus and the serial its bring-up read.
#[derive(Clone, Copy, Debug)]
pub struct VirtioIds<'a> {
    pub address: PciAddress,
    /// `None`: not brought up, no answer to GET_ID, or an empty one.
    pub serial: Option<&'a str>,
}

/// Why a name reaches no device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameError {
    /// No device of the kind on the bus at all (`virtio:<index>`: fewer than index+1).
    NoneOnBus { kind: &'static str, found: usize },
    /// No device of the kind at this address.
    NotAt {
        kind: &'static str,
        address: PciAddress,
    },
    /// No device has this serial, NGUID or EUI-64; `unidentified` of the `found` devices
    /// could not be asked.
    NoMatch {
        kind: &'static str,
        found: usize,
        unidentified: usize,
    },
    /// Two devices answer to the name: it is refused rather than guessed.
    Ambiguous {
        kind: &'static str,
        first: PciAddress,
        second: PciAddress,
    },
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            NameError::NoneOnBus { kind, found: 0 } => write!(f, "no {kind} on the PCI bus"),
            NameError::NoneOnBus { kind, found } => {
                write!(f, "only {found} {kind} device(s) on the PCI bus")
            }
            NameError::NotAt { kind, address } => write!(f, "no {kind} at PCI {address}"),
            NameError::NoMatch {
                kind,
                found,
                unidentified,
            } => {
                write!(f, "matches none of the {found} {kind} device(s) on the bus")?;
                if unidentified > 0 {
                    write!(f, " ({unidentified} of them could not be identified)")?;
                }
                f.write_str("; blkdom-stat lists the devices and their names")
            }
            NameError::Ambiguous {
                kind,
                first,
                second,
            } => write!(
                f,
                "matches two {kind} devices, at PCI {first} and {second}: refused rather \
                 than guessed (name it by PCI address, nvme@<bb:dd.f> or virtio@<bb:dd.f>)"
            ),
        }
    }
}

impl core::error::Error for NameError {}

const NVME: &str = "NVMe controller";
const VIRTIO: &str = "virtio-blk";

/// The one item of `matches`, or why not.
fn only<I: Iterator<Item = (PciAddress, u32)>>(
    mut matches: I,
    kind: &'static str,
    found: usize,
    unidentified: usize,
) -> Result<(PciAddress, u32), NameError> {
    let first = matches.next().ok_or(NameError::NoMatch {
        kind,
        found,
        unidentified,
    })?;
    match matches.next() {
        Some(second) => Err(NameError::Ambiguous {
            kind,
            first: first.0,
            second: second.0,
        }),
        None => Ok(first),
    }
}

/// The controller (its address) and namespace `name` reaches among `controllers` (every
/// NVMe controller on the bus, in bus order). Whether the namespace exists is for its
/// open to say.
pub fn resolve_nvme(
    name: &NvmeName,
    controllers: &[ControllerIds<'_>],
) -> Result<(PciAddress, u32), NameError> {
    let found = controllers.len();
    let unidentified = controllers.iter().filter(|c| c.serial.is_none()).count();
    match *name {
        NvmeName::First { nsid } => controllers
            .first()
            .map(|c| (c.address, nsid))
            .ok_or(NameError::NoneOnBus { kind: NVME, found }),
        NvmeName::Pci { address, nsid } => controllers
            .iter()
            .find(|c| c.address == address)
            .map(|c| (c.address, nsid))
            .ok_or(NameError::NotAt {
                kind: NVME,
                address,
            }),
        NvmeName::Serial { serial, nsid } => only(
            controllers
                .iter()
                .filter(|c| c.serial == Some(serial.as_str()))
                .map(|c| (c.address, nsid)),
            NVME,
            found,
            unidentified,
        ),
        NvmeName::Nguid(id) => by_namespace(controllers, unidentified, |n| {
            n.nguid == id && id != [0; 16]
        }),
        NvmeName::Eui64(id) => {
            by_namespace(controllers, unidentified, |n| n.eui64 == id && id != [0; 8])
        }
    }
}

/// The one namespace of `controllers` that `matches`, or why not.
fn by_namespace(
    controllers: &[ControllerIds<'_>],
    unidentified: usize,
    matches: impl Fn(&NamespaceIds) -> bool + Copy,
) -> Result<(PciAddress, u32), NameError> {
    only(
        controllers.iter().flat_map(|c| {
            c.namespaces
                .iter()
                .filter(move |n| matches(n))
                .map(move |n| (c.address, n.nsid))
        }),
        NVME,
        controllers.len(),
        unidentified,
    )
}

/// The address of the device `name` reaches among `devices` (every virtio-blk device on
/// the bus, in bus order).
pub fn resolve_virtio(
    name: &VirtioName,
    devices: &[VirtioIds<'_>],
) -> Result<PciAddress, NameError> {
    let found = devices.len();
    match *name {
        VirtioName::Index(index) => {
            devices
                .get(index as usize)
                .map(|d| d.address)
                .ok_or(NameError::NoneOnBus {
                    kind: VIRTIO,
                    found,
                })
        }
        VirtioName::Pci(address) => devices
            .iter()
            .find(|d| d.address == address)
            .map(|d| d.address)
            .ok_or(NameError::NotAt {
                kind: VIRTIO,
                address,
            }),
        VirtioName::Serial(serial) => only(
            devices
                .iter()
                .filter(|d| d.serial == Some(serial.as_str()))
                .map(|d| (d.address, 0)),
            VIRTIO,
            found,
            devices.iter().filter(|d| d.serial.is_none()).count(),
        )
        .map(|(address, _)| address),
    }
}

/// Addresses that appear more than once among `serials` (address, serial) pairs with
/// the same serial: each such pair of devices is reported at bring-up (names by that
/// serial are refused).
pub fn duplicate_serials<'a>(
    serials: &'a [(PciAddress, Option<&'a str>)],
) -> impl Iterator<Item = (&'a str, PciAddress, PciAddress)> + 'a {
    serials.iter().enumerate().flat_map(move |(i, (a, sa))| {
        serials[i + 1..]
            .iter()
            .filter_map(move |(b, sb)| match (sa, sb) {
                (Some(x), Some(y)) if x == y => Some((*x, *a, *b)),
                _ => None,
            })
    })
}

#[cfg(test)]
mod tests;
