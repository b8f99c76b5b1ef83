//! `nvme:<nsid>`, `virtio:<index>`, `ram:<size>[:<name>]`.

/// A backing store named by a disk's `params`/`target` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Namespace `nsid` (1-based) of the first NVMe controller.
    Nvme { nsid: u32 },
    /// The `index`-th virtio-blk device (0-based, in PCI enumeration order).
    Virtio { index: u32 },
    /// A RAM disk of `bytes` bytes (a multiple of 512). Unnamed, it lives as long as the
    /// disk that asked for it; named, it outlives it (a guest that reboots, or a disk
    /// detached and attached again, finds its data).
    Ram { bytes: u64, name: Option<RamName> },
}

/// The name of a RAM disk: 1 to 32 of `A-Z a-z 0-9 - _ .` (stored inline, so `Backing`
/// stays a small `Copy` value).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RamName {
    bytes: [u8; RamName::MAX_LEN],
    len: u8,
}

impl RamName {
    pub const MAX_LEN: usize = 32;

    pub fn new(text: &str) -> Option<RamName> {
        let valid = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
        if text.is_empty() || text.len() > Self::MAX_LEN || !text.bytes().all(valid) {
            return None;
        }
        let mut bytes = [0; Self::MAX_LEN];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(RamName {
            bytes,
            len: text.len() as u8,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII went in (checked by `new`).
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl core::fmt::Debug for RamName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl core::fmt::Display for RamName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
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
}

impl core::fmt::Display for SpecError<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        const FORMS: &str = "use nvme:<nsid>, virtio:<index> or ram:<size>[K|M|G][:<name>]";
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

fn size(text: &str) -> Result<u64, SpecError<'_>> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value = number("ram", digits).map_err(|_| SpecError::BadSize(text))?;
    let bytes = value
        .checked_mul(1 << shift)
        .ok_or(SpecError::BadSize(text))?;
    if bytes == 0 || !bytes.is_multiple_of(512) {
        return Err(SpecError::BadSize(text));
    }
    Ok(bytes)
}

/// Parses a backing store name. Surrounding whitespace is not accepted: names come from
/// xenstore or the command line already split.
pub fn parse_backing(text: &str) -> Result<Backing, SpecError<'_>> {
    if text.is_empty() {
        return Err(SpecError::Empty);
    }
    let (kind, argument) = match text.split_once(':') {
        Some((kind, argument)) => (kind, Some(argument).filter(|a| !a.is_empty())),
        None => (text, None),
    };
    match kind {
        "nvme" => {
            let argument = argument.ok_or(SpecError::MissingArgument("nvme"))?;
            let nsid = number("nvme", argument)?;
            let nsid = u32::try_from(nsid).map_err(|_| SpecError::BadNumber("nvme", argument))?;
            if nsid == 0 {
                return Err(SpecError::ZeroNamespace);
            }
            Ok(Backing::Nvme { nsid })
        }
        "virtio" => {
            let argument = argument.ok_or(SpecError::MissingArgument("virtio"))?;
            let index = number("virtio", argument)?;
            let index =
                u32::try_from(index).map_err(|_| SpecError::BadNumber("virtio", argument))?;
            Ok(Backing::Virtio { index })
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A RAM disk's size and name, if `text` names one.
    fn ram(text: &str) -> Option<(u64, Option<String>)> {
        match parse_backing(text) {
            Ok(Backing::Ram { bytes, name }) => Some((bytes, name.map(|n| n.to_string()))),
            _ => None,
        }
    }

    #[test]
    fn ram_disk_names_are_checked() {
        let long = "n".repeat(RamName::MAX_LEN);
        assert_eq!(
            ram(&format!("ram:1M:{long}")),
            Some((1 << 20, Some(long.clone())))
        );
        let too_long = format!("ram:1M:{long}x");
        assert_eq!(
            parse_backing(&too_long),
            Err(SpecError::BadName(&too_long[7..]))
        );
        for bad in [
            "ram:1M:",
            "ram:1M:a/b",
            "ram:1M:a b",
            "ram:1M:a:b",
            "ram:1M:\u{e9}",
        ] {
            assert!(
                matches!(parse_backing(bad), Err(SpecError::BadName(_))),
                "{bad}"
            );
        }
        assert_eq!(parse_backing("ram:0:x"), Err(SpecError::BadSize("0")));
        assert!(SpecError::BadName("a b")
            .to_string()
            .contains("A-Z a-z 0-9"));
    }

    /// The texts reach a vbd's `hotplug-error` node and the disk test's verdict line.
    #[test]
    fn errors_display_their_cause() {
        let text = |e: &dyn core::error::Error| e.to_string();
        assert_eq!(
            text(&SpecError::UnknownKind("scsi")),
            "unknown backing store \"scsi\"; use nvme:<nsid>, virtio:<index> or ram:<size>[K|M|G][:<name>]"
        );
        assert_eq!(
            text(&SpecError::BadNumber("virtio", "x")),
            "virtio: \"x\" is not a number"
        );
        assert_eq!(
            text(&SpecError::ZeroNamespace),
            "nvme: namespace ids start at 1"
        );
    }

    #[test]
    fn parses_the_three_kinds() {
        assert_eq!(parse_backing("nvme:1"), Ok(Backing::Nvme { nsid: 1 }));
        assert_eq!(
            parse_backing("nvme:4294967295"),
            Ok(Backing::Nvme { nsid: u32::MAX })
        );
        assert_eq!(parse_backing("virtio:0"), Ok(Backing::Virtio { index: 0 }));
        assert_eq!(parse_backing("virtio:3"), Ok(Backing::Virtio { index: 3 }));
        assert_eq!(
            parse_backing("ram:64M"),
            Ok(Backing::Ram {
                bytes: 64 << 20,
                name: None
            })
        );
        assert_eq!(ram("ram:4k"), Some((4096, None)));
        assert_eq!(ram("ram:1G"), Some((1 << 30, None)));
        assert_eq!(ram("ram:1536"), Some((1536, None)));
        assert_eq!(
            ram("ram:128M:guest-1_disk.a"),
            Some((128 << 20, Some("guest-1_disk.a".into())))
        );
    }

    #[test]
    fn malformed_names_say_what_is_wrong() {
        assert_eq!(parse_backing(""), Err(SpecError::Empty));
        assert_eq!(parse_backing("scsi:1"), Err(SpecError::UnknownKind("scsi")));
        assert_eq!(parse_backing("NVME:1"), Err(SpecError::UnknownKind("NVME")));
        assert_eq!(
            parse_backing("nvme"),
            Err(SpecError::MissingArgument("nvme"))
        );
        assert_eq!(
            parse_backing("nvme:"),
            Err(SpecError::MissingArgument("nvme"))
        );
        assert_eq!(
            parse_backing("virtio"),
            Err(SpecError::MissingArgument("virtio"))
        );
        assert_eq!(parse_backing("nvme:0"), Err(SpecError::ZeroNamespace));
        assert_eq!(
            parse_backing("nvme:-1"),
            Err(SpecError::BadNumber("nvme", "-1"))
        );
        assert_eq!(
            parse_backing("nvme:+1"),
            Err(SpecError::BadNumber("nvme", "+1"))
        );
        assert_eq!(
            parse_backing("nvme: 1"),
            Err(SpecError::BadNumber("nvme", " 1"))
        );
        assert_eq!(
            parse_backing("nvme:4294967296"),
            Err(SpecError::BadNumber("nvme", "4294967296"))
        );
        assert_eq!(
            parse_backing("virtio:x"),
            Err(SpecError::BadNumber("virtio", "x"))
        );
        assert_eq!(parse_backing("ram:0"), Err(SpecError::BadSize("0")));
        assert_eq!(parse_backing("ram:100"), Err(SpecError::BadSize("100")));
        assert_eq!(parse_backing("ram:M"), Err(SpecError::BadSize("M")));
        assert_eq!(
            parse_backing("ram:99999999999999999999G"),
            Err(SpecError::BadSize("99999999999999999999G"))
        );
        assert_eq!(
            parse_backing("ram:17179869184G"),
            Err(SpecError::BadSize("17179869184G"))
        );
        let message = format!("{}", parse_backing("disk:1").unwrap_err());
        assert!(message.contains("nvme:<nsid>"), "{message}");
    }
}
