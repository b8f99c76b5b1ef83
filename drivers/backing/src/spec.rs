//! `nvme:<nsid>`, `virtio:<index>`, `ram:<size>`.

/// A backing store named by a disk's `params`/`target` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Namespace `nsid` (1-based) of the first NVMe controller.
    Nvme { nsid: u32 },
    /// The `index`-th virtio-blk device (0-based, in PCI enumeration order).
    Virtio { index: u32 },
    /// A RAM disk of `bytes` bytes (a multiple of 512).
    Ram { bytes: u64 },
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
}

impl core::fmt::Display for SpecError<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        const FORMS: &str = "use nvme:<nsid>, virtio:<index> or ram:<size>[K|M|G]";
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
        }
    }
}

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
            Ok(Backing::Ram {
                bytes: size(argument)?,
            })
        }
        other => Err(SpecError::UnknownKind(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Ok(Backing::Ram { bytes: 64 << 20 })
        );
        assert_eq!(parse_backing("ram:4k"), Ok(Backing::Ram { bytes: 4096 }));
        assert_eq!(parse_backing("ram:1G"), Ok(Backing::Ram { bytes: 1 << 30 }));
        assert_eq!(parse_backing("ram:1536"), Ok(Backing::Ram { bytes: 1536 }));
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
