// SPDX-License-Identifier: MIT OR Apache-2.0
//! `nvme:<nsid>[:<slice>]`, `nvme:serial=<SN>:<nsid>[:<slice>]`,
//! `nvme:nguid=<hex>[:<slice>]`, `nvme:eui64=<hex>[:<slice>]`, `nvme@<bb:dd.f>:<nsid>[:<slice>]`,
//! `virtio:<index>[:<slice>]`, `virtio:serial=<id>[:<slice>]`, `virtio@<bb:dd.f>[:<slice>]`,
//! `ram:<size>[:<name>]` (the device names: `names`).
//!
//! A slice is one range of the device: `part=<n>` (GPT partition number, from 1),
//! `part=name:<label>` (the GPT partition of that name) or `offset=<size>,size=<size>`
//! (an explicit byte range). Without one the disk is the whole device.

use crate::inline::{InlineName, NameChars};
use crate::names::{parse_hex_id, parse_pci_address, NvmeName, Serial, VirtioName};
use core::fmt;
use pci::PciAddress;

/// Slices start at a multiple of this many bytes: a guest's 4 KiB I/O then stays aligned
/// on the device (and on a 4 KiB-block NVMe namespace anything else cannot be addressed).
pub const SLICE_ALIGN: u64 = 4096;

/// A backing store named by a disk's `params`/`target` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// An NVMe namespace, or a slice of it.
    Nvme { name: NvmeName, region: Region },
    /// A virtio-blk device, or a slice of it.
    Virtio { name: VirtioName, region: Region },
    /// A RAM disk of `bytes` bytes (a multiple of 512). Unnamed, it lives as long as the
    /// disk that asked for it; named, it outlives it (a guest that reboots, or a disk
    /// detached and attached again, finds its data).
    Ram { bytes: u64, name: Option<RamName> },
    /// A namespace of a remote NVMe/TCP subsystem, or a slice of it: where it is, with
    /// its subsystem NQN, is `parse_nvme_tcp`'s (kept out of here, which stays small).
    NvmeTcp { region: Region },
}

/// How a `target=` names a device (several names can reach one device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceName {
    Nvme(NvmeName),
    Virtio(VirtioName),
}

/// A device several disks can share, each on its own region: where it is, whatever name
/// reached it (`names::resolve_nvme`, `names::resolve_virtio`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceId {
    Nvme {
        controller: PciAddress,
        nsid: u32,
    },
    Virtio {
        device: PciAddress,
    },
    /// A remote namespace, by its place among the ones blkdom connected to.
    NvmeTcp {
        remote: u32,
    },
}

/// Which part of a device a disk serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// All of it.
    Whole,
    /// GPT partition number `n` (1-based, the entry's index in the partition array).
    Partition(u32),
    /// The GPT partition with this name.
    PartitionNamed(PartName),
    /// `size` bytes at byte `offset`: `offset` a multiple of [`SLICE_ALIGN`], `size` a
    /// non-zero multiple of 512, and `offset + size` within 64 bits (checked by the
    /// parser; whether it fits the device is checked when the device is open).
    Extent { offset: u64, size: u64 },
}

impl Backing {
    /// The device and region, for the kinds that have them (not RAM disks).
    pub fn device(&self) -> Option<(DeviceName, Region)> {
        match *self {
            Backing::Nvme { name, region } => Some((DeviceName::Nvme(name), region)),
            Backing::Virtio { name, region } => Some((DeviceName::Virtio(name), region)),
            Backing::Ram { .. } | Backing::NvmeTcp { .. } => None,
        }
    }
}

impl Region {
    /// Whether the region is known only after reading the device's partition table.
    pub fn needs_partition_table(&self) -> bool {
        matches!(self, Region::Partition(_) | Region::PartitionNamed(_))
    }
}

/// As a `target=` by PCI address names it (`nvme@00:04.0:1`, `virtio@00:05.0`).
impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Nvme { controller, nsid } => write!(f, "nvme@{controller}:{nsid}"),
            DeviceId::Virtio { device } => write!(f, "virtio@{device}"),
            DeviceId::NvmeTcp { remote } => write!(f, "nvme-tcp remote {remote}"),
        }
    }
}

impl DeviceName {
    /// Whether the name depends on the order of devices on the bus.
    pub fn positional(&self) -> bool {
        match self {
            DeviceName::Nvme(name) => name.positional(),
            DeviceName::Virtio(name) => name.positional(),
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Nvme(name) => name.fmt(f),
            DeviceName::Virtio(name) => name.fmt(f),
        }
    }
}

/// A byte count the way the grammar writes it: with the largest suffix that divides it.
pub(crate) struct Bytes(pub(crate) u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match n {
            0 => f.write_str("0"),
            _ if n.is_multiple_of(1 << 30) => write!(f, "{}G", n >> 30),
            _ if n.is_multiple_of(1 << 20) => write!(f, "{}M", n >> 20),
            _ if n.is_multiple_of(1 << 10) => write!(f, "{}K", n >> 10),
            _ => write!(f, "{n}"),
        }
    }
}

/// The region as it is written after the device (`:part=2`; nothing for the whole
/// device).
impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Region::Whole => Ok(()),
            Region::Partition(n) => write!(f, ":part={n}"),
            Region::PartitionNamed(name) => write!(f, ":part=name:{name}"),
            Region::Extent { offset, size } => {
                write!(f, ":offset={},size={}", Bytes(*offset), Bytes(*size))
            }
        }
    }
}

/// The backing store in the grammar's words (sizes with the largest suffix that divides
/// them): `parse_backing` reads it back as the same value, but for `nvme-tcp:`, whose
/// address and NQN it does not keep (`nvme-tcp:...` and the slice).
impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backing::Nvme { name, region } => write!(f, "{name}{region}"),
            Backing::Virtio { name, region } => write!(f, "{name}{region}"),
            Backing::NvmeTcp { region } => write!(f, "nvme-tcp:...{region}"),
            Backing::Ram { bytes, name } => {
                write!(f, "ram:{}", Bytes(*bytes))?;
                match name {
                    Some(name) => write!(f, ":{name}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The name of a RAM disk: 1 to 32 of `A-Z a-z 0-9 - _ .`.
pub type RamName = InlineName<32, RamNameChars>;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RamNameChars;

impl NameChars for RamNameChars {
    fn valid(b: u8) -> bool {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
    }
}

/// A GPT partition name as `part=name:<label>` gives it: 1 to 36 printable ASCII
/// characters (space to `~`) other than `,`, which separates options. GPT stores names as
/// up to 36 UTF-16 code units (72 bytes); a name matches when its units are these
/// characters, one each, case and all.
pub type PartName = InlineName<36, PartNameChars>;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartNameChars;

impl NameChars for PartNameChars {
    fn valid(b: u8) -> bool {
        (b' '..=b'~').contains(&b) && b != b','
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecError<'a> {
    Empty,
    /// Not one of nvme, virtio, ram.
    UnknownKind(&'a str),
    /// `kind` without `:<argument>`, or with an empty one.
    MissingArgument(&'static str),
    BadNumber(&'static str, &'a str),
    /// Namespace ids start at 1.
    ZeroNamespace,
    /// RAM size zero, not whole sectors, or overflowing.
    BadSize(&'a str),
    /// A RAM disk name that is empty, too long, or has other characters.
    BadName(&'a str),
    /// `nvme:1:` with nothing after the second colon.
    NoSlice(&'static str),
    /// An empty option: two commas in a row, or a comma at either end.
    EmptyOption(&'static str),
    /// An option other than part, offset and size.
    UnknownOption(&'static str, &'a str),
    /// `part`, `offset` or `size` without `=<value>`, or with an empty one.
    MissingValue(&'static str, &'static str),
    /// The same option twice.
    DuplicateOption(&'static str, &'static str),
    /// `part=0`: partitions are numbered from 1.
    ZeroPartition(&'static str),
    /// `part=` neither a number (1 to 2^32-1) nor `name:<label>`.
    BadPartition(&'static str, &'a str),
    /// A partition name that is empty, too long, or has other characters.
    BadPartitionName(&'static str, &'a str),
    /// `part=` together with `offset=` or `size=`.
    PartitionWithExtent(&'static str),
    /// `offset=` without `size=`, or the other way round (the missing one).
    MissingOption(&'static str, &'static str),
    /// `offset=` not a size, or not a multiple of [`SLICE_ALIGN`].
    BadOffset(&'static str, &'a str),
    /// `size=` not a size, zero, or not a multiple of 512.
    BadSliceSize(&'static str, &'a str),
    /// `offset + size` does not fit 64 bits.
    SliceOverflows(&'static str),
    /// `serial=` empty, too long, or with other characters.
    BadSerial(&'static str, &'a str),
    /// `nguid=` not 32 hex digits, or all zero (which means "none").
    BadNguid(&'a str),
    /// `eui64=` not 16 hex digits, or all zero.
    BadEui64(&'a str),
    /// `nvme@` or `virtio@` not followed by `bb:dd.f`.
    BadPciAddress(&'static str, &'a str),
    /// `nvme:serial=<SN>` or `nvme@<address>` without `:<nsid>` after it.
    MissingNamespace(&'static str),
    /// `nvme:<key>=...` or `virtio:<key>=...` with another key.
    UnknownName(&'static str, &'a str),
    /// An `nvme-tcp:` target whose address, port, namespace or NQN does not parse
    /// (`NvmeTcpError`'s words; its slice errors are this type's own).
    NvmeTcp(NvmeTcpField, &'a str),
}

/// Which part of an `nvme-tcp:` target is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmeTcpField {
    Form,
    Address,
    Port,
    Namespace,
    MissingNqn,
    Nqn,
    UnknownOption,
    ReconnectDelay,
    /// With the least it may be: the reconnect delay.
    CtrlLossTmo(u32),
    Portal,
    DuplicatePortal,
    TooManyPortals,
}

impl fmt::Display for SpecError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FORMS: &str = "use nvme:serial=<SN>:<nsid>, nvme:nguid=<hex>, nvme:eui64=<hex>, \
             nvme@<bb:dd.f>:<nsid>, virtio:serial=<id>, virtio@<bb:dd.f> (each [:<slice>]), \
             nvme:<nsid>, virtio:<index>, ram:<size>[K|M|G][:<name>] or \
             nvme-tcp:<ipv4>:<port>:<nsid>:nqn=<subsystem NQN>[,<option>...]";
        const SLICES: &str = "part=<n>, part=name:<label> or offset=<size>,size=<size>";
        match self {
            SpecError::Empty => write!(f, "empty backing store name; {FORMS}"),
            SpecError::UnknownKind(kind) => write!(f, "unknown backing store {kind:?}; {FORMS}"),
            SpecError::MissingArgument(kind) => write!(f, "{kind}: needs an argument; {FORMS}"),
            SpecError::BadNumber(kind, text) => write!(f, "{kind}: {text:?} is not a number"),
            SpecError::ZeroNamespace => write!(f, "nvme: namespace ids start at 1"),
            SpecError::BadSize(text) => write!(
                f,
                "ram: size {text:?} must be a non-zero multiple of 512 bytes (suffix K, M or G)"
            ),
            SpecError::BadName(text) => write!(
                f,
                "ram: name {text:?} must be 1 to {} of A-Z a-z 0-9 - _ .",
                RamName::MAX_LEN
            ),
            SpecError::NoSlice(kind) => {
                write!(f, "{kind}: nothing after the second ':'; a slice is {SLICES}")
            }
            SpecError::EmptyOption(kind) => write!(
                f,
                "{kind}: an empty option (a ',' at an end or two in a row); a slice is {SLICES}"
            ),
            SpecError::UnknownOption(kind, option) => {
                write!(f, "{kind}: unknown option {option:?}; a slice is {SLICES}")
            }
            SpecError::MissingValue(kind, key) => write!(f, "{kind}: {key}= needs a value"),
            SpecError::DuplicateOption(kind, key) => write!(f, "{kind}: {key}= given twice"),
            SpecError::ZeroPartition(kind) => {
                write!(f, "{kind}: part=0: partitions are numbered from 1")
            }
            SpecError::BadPartition(kind, text) => write!(
                f,
                "{kind}: part={text:?} is neither a partition number (from 1) nor name:<label>"
            ),
            SpecError::BadPartitionName(kind, text) => write!(
                f,
                "{kind}: partition name {text:?} must be 1 to {} printable ASCII characters other than ','",
                PartName::MAX_LEN
            ),
            SpecError::PartitionWithExtent(kind) => write!(
                f,
                "{kind}: part= names the slice alone; it cannot go with offset= or size="
            ),
            SpecError::MissingOption(kind, key) => {
                write!(f, "{kind}: offset= and size= go together; {key}= is missing")
            }
            SpecError::BadOffset(kind, text) => write!(
                f,
                "{kind}: offset={text:?} must be a multiple of {SLICE_ALIGN} bytes (suffix K, M or G)"
            ),
            SpecError::BadSliceSize(kind, text) => write!(
                f,
                "{kind}: size={text:?} must be a non-zero multiple of 512 bytes (suffix K, M or G)"
            ),
            SpecError::SliceOverflows(kind) => {
                write!(f, "{kind}: offset= plus size= is beyond 2^64 bytes")
            }
            SpecError::BadSerial(kind, text) => write!(
                f,
                "{kind}: serial={text:?} must be 1 to {} printable ASCII characters other than \
                 space, ':' and ','",
                Serial::MAX_LEN
            ),
            SpecError::BadNguid(text) => write!(
                f,
                "nvme: nguid={text:?} must be 32 hex digits (dashes between them allowed), not all zero"
            ),
            SpecError::BadEui64(text) => write!(
                f,
                "nvme: eui64={text:?} must be 16 hex digits (dashes between them allowed), not all zero"
            ),
            SpecError::BadPciAddress(kind, text) => write!(
                f,
                "{kind}@{text}: a PCI address is bb:dd.f (hex bus 00 to ff, device 00 to 1f, function 0 to 7)"
            ),
            SpecError::MissingNamespace(form) => {
                write!(f, "{form} needs :<nsid> after it (namespace ids start at 1)")
            }
            SpecError::UnknownName(kind, text) => write!(
                f,
                "{kind}: unknown name {text:?}; {FORMS}"
            ),
            SpecError::NvmeTcp(field, text) => {
                let e = match field {
                    NvmeTcpField::Form => NvmeTcpError::Form,
                    NvmeTcpField::Address => NvmeTcpError::BadAddress(text),
                    NvmeTcpField::Port => NvmeTcpError::BadPort(text),
                    NvmeTcpField::Namespace => NvmeTcpError::BadNamespace(text),
                    NvmeTcpField::MissingNqn => NvmeTcpError::MissingNqn,
                    NvmeTcpField::Nqn => NvmeTcpError::BadNqn(text),
                    NvmeTcpField::UnknownOption => NvmeTcpError::UnknownOption(text),
                    NvmeTcpField::ReconnectDelay => NvmeTcpError::BadReconnectDelay(text),
                    NvmeTcpField::CtrlLossTmo(min) => NvmeTcpError::BadCtrlLossTmo(text, *min),
                    NvmeTcpField::Portal => NvmeTcpError::BadPortal(text),
                    NvmeTcpField::DuplicatePortal => NvmeTcpError::DuplicatePortal(text),
                    NvmeTcpField::TooManyPortals => NvmeTcpError::TooManyPortals,
                };
                e.fmt(f)
            }
        }
    }
}

impl core::error::Error for SpecError<'_> {}

fn number<'a>(kind: &'static str, text: &'a str) -> Result<u64, SpecError<'a>> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SpecError::BadNumber(kind, text));
    }
    text.parse().map_err(|_| SpecError::BadNumber(kind, text))
}

/// `<digits>[K|M|G]` in bytes, if it is one and fits 64 bits.
fn bytes(text: &str) -> Option<u64> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value = number("", digits).ok()?;
    value.checked_mul(1 << shift)
}

fn size(text: &str) -> Result<u64, SpecError<'_>> {
    match bytes(text) {
        Some(bytes) if bytes != 0 && bytes.is_multiple_of(512) => Ok(bytes),
        _ => Err(SpecError::BadSize(text)),
    }
}

/// The slice options after `<kind>:<id>:`.
fn region<'a>(kind: &'static str, options: &'a str) -> Result<Region, SpecError<'a>> {
    if options.is_empty() {
        return Err(SpecError::NoSlice(kind));
    }
    slice_options(kind, options.split(','))
}

/// The slice a list of options names (none of them empty or unknown, none twice).
fn slice_options<'a>(
    kind: &'static str,
    options: impl Iterator<Item = &'a str>,
) -> Result<Region, SpecError<'a>> {
    let (mut part, mut offset, mut size) = (None, None, None);
    for option in options {
        if option.is_empty() {
            return Err(SpecError::EmptyOption(kind));
        }
        let (key, value) = match option.split_once('=') {
            Some((key, value)) => (key, value),
            None => (option, ""),
        };
        let (key, slot) = match key {
            "part" => ("part", &mut part),
            "offset" => ("offset", &mut offset),
            "size" => ("size", &mut size),
            _ => return Err(SpecError::UnknownOption(kind, option)),
        };
        if slot.is_some() {
            return Err(SpecError::DuplicateOption(kind, key));
        }
        if value.is_empty() {
            return Err(SpecError::MissingValue(kind, key));
        }
        *slot = Some(value);
    }
    match (part, offset, size) {
        (Some(part), None, None) => partition(kind, part),
        (Some(_), _, _) => Err(SpecError::PartitionWithExtent(kind)),
        (None, Some(_), None) => Err(SpecError::MissingOption(kind, "size")),
        (None, None, Some(_)) => Err(SpecError::MissingOption(kind, "offset")),
        (None, Some(offset), Some(size)) => {
            let offset = bytes(offset)
                .filter(|o| o.is_multiple_of(SLICE_ALIGN))
                .ok_or(SpecError::BadOffset(kind, offset))?;
            let size = bytes(size)
                .filter(|s| *s != 0 && s.is_multiple_of(512))
                .ok_or(SpecError::BadSliceSize(kind, size))?;
            offset
                .checked_add(size)
                .ok_or(SpecError::SliceOverflows(kind))?;
            Ok(Region::Extent { offset, size })
        }
        (None, None, None) => Err(SpecError::NoSlice(kind)),
    }
}

/// `part=<n>` or `part=name:<label>`.
fn partition<'a>(kind: &'static str, text: &'a str) -> Result<Region, SpecError<'a>> {
    if let Some(label) = text.strip_prefix("name:") {
        return PartName::new(label)
            .map(Region::PartitionNamed)
            .ok_or(SpecError::BadPartitionName(kind, label));
    }
    let n = number(kind, text)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or(SpecError::BadPartition(kind, text))?;
    if n == 0 {
        return Err(SpecError::ZeroPartition(kind));
    }
    Ok(Region::Partition(n))
}

/// `<id>[:<slice>]` of a device kind: the id and the region.
fn device<'a>(kind: &'static str, argument: &'a str) -> Result<(u64, Region), SpecError<'a>> {
    let (id, options) = match argument.split_once(':') {
        Some((id, options)) => (id, Some(options)),
        None => (argument, None),
    };
    let id_text = id;
    let id = number(kind, id_text)?;
    u32::try_from(id).map_err(|_| SpecError::BadNumber(kind, id_text))?;
    let region = match options {
        Some(options) => region(kind, options)?,
        None => Region::Whole,
    };
    Ok((id, region))
}

/// `<nsid>[:<slice>]` after an NVMe controller's name.
fn namespace<'a>(form: &'static str, text: &'a str) -> Result<(u32, Region), SpecError<'a>> {
    if text.is_empty() {
        return Err(SpecError::MissingNamespace(form));
    }
    let (nsid, region) = device("nvme", text)?;
    if nsid == 0 {
        return Err(SpecError::ZeroNamespace);
    }
    Ok((nsid as u32, region))
}

/// `[:<slice>]` after a name that has no number: the region.
fn optional_region<'a>(
    kind: &'static str,
    options: Option<&'a str>,
) -> Result<Region, SpecError<'a>> {
    options.map_or(Ok(Region::Whole), |options| region(kind, options))
}

/// `bb:dd.f` and what follows it after `kind@`.
fn at_address<'a>(
    kind: &'static str,
    text: &'a str,
) -> Result<(PciAddress, Option<&'a str>), SpecError<'a>> {
    let bus = text
        .split_once(':')
        .map_or(text.len(), |(bus, _)| bus.len());
    let end = text[(bus + 1).min(text.len())..]
        .find(':')
        .map_or(text.len(), |at| bus + 1 + at);
    let address = &text[..end];
    let address = parse_pci_address(address).ok_or(SpecError::BadPciAddress(kind, address))?;
    Ok((address, text.get(end + 1..)))
}

fn nvme(argument: &str) -> Result<Backing, SpecError<'_>> {
    if let Some(rest) = argument.strip_prefix("serial=") {
        let (serial, after) = rest.split_once(':').unwrap_or((rest, ""));
        let serial = Serial::new(serial).ok_or(SpecError::BadSerial("nvme", serial))?;
        let (nsid, region) = namespace("nvme:serial=<SN>", after)?;
        return Ok(Backing::Nvme {
            name: NvmeName::Serial { serial, nsid },
            region,
        });
    }
    let hex_id = |key: &str| {
        argument
            .strip_prefix(key)
            .map(|rest| match rest.split_once(':') {
                Some((id, options)) => (id, Some(options)),
                None => (rest, None),
            })
    };
    if let Some((id, options)) = hex_id("nguid=") {
        let id = parse_hex_id::<16>(id).ok_or(SpecError::BadNguid(id))?;
        return Ok(Backing::Nvme {
            name: NvmeName::Nguid(id),
            region: optional_region("nvme", options)?,
        });
    }
    if let Some((id, options)) = hex_id("eui64=") {
        let id = parse_hex_id::<8>(id).ok_or(SpecError::BadEui64(id))?;
        return Ok(Backing::Nvme {
            name: NvmeName::Eui64(id),
            region: optional_region("nvme", options)?,
        });
    }
    if let Some((key, _)) = argument.split_once('=').filter(|(k, _)| !k.contains(':')) {
        return Err(SpecError::UnknownName("nvme", key));
    }
    let (nsid, region) = namespace("nvme", argument)?;
    Ok(Backing::Nvme {
        name: NvmeName::First { nsid },
        region,
    })
}

fn virtio(argument: &str) -> Result<Backing, SpecError<'_>> {
    if let Some(rest) = argument.strip_prefix("serial=") {
        let (serial, options) = match rest.split_once(':') {
            Some((serial, options)) => (serial, Some(options)),
            None => (rest, None),
        };
        let serial = Serial::new(serial).ok_or(SpecError::BadSerial("virtio", serial))?;
        return Ok(Backing::Virtio {
            name: VirtioName::Serial(serial),
            region: optional_region("virtio", options)?,
        });
    }
    if let Some((key, _)) = argument.split_once('=').filter(|(k, _)| !k.contains(':')) {
        return Err(SpecError::UnknownName("virtio", key));
    }
    let (index, region) = device("virtio", argument)?;
    Ok(Backing::Virtio {
        name: VirtioName::Index(index as u32),
        region,
    })
}

/// Parses a backing store name. Surrounding whitespace is not accepted: names come from
/// xenstore or the command line already split.
pub fn parse_backing(text: &str) -> Result<Backing, SpecError<'_>> {
    if text.is_empty() {
        return Err(SpecError::Empty);
    }
    if text.starts_with("nvme-tcp:") {
        return parse_nvme_tcp(text)
            .map(|target| Backing::NvmeTcp {
                region: target.region,
            })
            .map_err(|e| match e {
                // The slice's own words, as for nvme:.
                NvmeTcpError::Slice(e) => e,
                NvmeTcpError::Form => SpecError::NvmeTcp(NvmeTcpField::Form, ""),
                NvmeTcpError::BadAddress(t) => SpecError::NvmeTcp(NvmeTcpField::Address, t),
                NvmeTcpError::BadPort(t) => SpecError::NvmeTcp(NvmeTcpField::Port, t),
                NvmeTcpError::BadNamespace(t) => SpecError::NvmeTcp(NvmeTcpField::Namespace, t),
                NvmeTcpError::MissingNqn => SpecError::NvmeTcp(NvmeTcpField::MissingNqn, ""),
                NvmeTcpError::BadNqn(t) => SpecError::NvmeTcp(NvmeTcpField::Nqn, t),
                NvmeTcpError::UnknownOption(t) => {
                    SpecError::NvmeTcp(NvmeTcpField::UnknownOption, t)
                }
                NvmeTcpError::BadReconnectDelay(t) => {
                    SpecError::NvmeTcp(NvmeTcpField::ReconnectDelay, t)
                }
                NvmeTcpError::BadCtrlLossTmo(t, min) => {
                    SpecError::NvmeTcp(NvmeTcpField::CtrlLossTmo(min), t)
                }
                NvmeTcpError::BadPortal(t) => SpecError::NvmeTcp(NvmeTcpField::Portal, t),
                NvmeTcpError::DuplicatePortal(t) => {
                    SpecError::NvmeTcp(NvmeTcpField::DuplicatePortal, t)
                }
                NvmeTcpError::TooManyPortals => {
                    SpecError::NvmeTcp(NvmeTcpField::TooManyPortals, "")
                }
            });
    }
    if let Some(rest) = text.strip_prefix("nvme@") {
        let (controller, after) = at_address("nvme", rest)?;
        let (nsid, region) = namespace("nvme@<bb:dd.f>", after.unwrap_or(""))?;
        return Ok(Backing::Nvme {
            name: NvmeName::Pci {
                address: controller,
                nsid,
            },
            region,
        });
    }
    if let Some(rest) = text.strip_prefix("virtio@") {
        let (device, options) = at_address("virtio", rest)?;
        return Ok(Backing::Virtio {
            name: VirtioName::Pci(device),
            region: optional_region("virtio", options)?,
        });
    }
    let (kind, argument) = match text.split_once(':') {
        Some((kind, argument)) => (kind, Some(argument).filter(|a| !a.is_empty())),
        None => (text, None),
    };
    match kind {
        "nvme" => nvme(argument.ok_or(SpecError::MissingArgument("nvme"))?),
        "virtio" => virtio(argument.ok_or(SpecError::MissingArgument("virtio"))?),
        "ram" => {
            let argument = argument.ok_or(SpecError::MissingArgument("ram"))?;
            let (bytes, name) = match argument.split_once(':') {
                Some((bytes, name)) => (
                    bytes,
                    Some(RamName::new(name).ok_or(SpecError::BadName(name))?),
                ),
                None => (argument, None),
            };
            Ok(Backing::Ram {
                bytes: size(bytes)?,
                name,
            })
        }
        other => Err(SpecError::UnknownKind(other)),
    }
}

mod nvme_tcp;
pub use nvme_tcp::{parse_nvme_tcp, Nqn, NvmeTcpError, NvmeTcpTarget, Portal, ReconnectTimes};

#[cfg(test)]
mod tests;
