// SPDX-License-Identifier: MIT OR Apache-2.0
//! Online resize: what an operator may change of a served disk's `params` (xl's
//! `target=`). Rewriting `params` with another size asks for the disk to grow (or
//! shrink); everything else about the backing store stays as it is.
//!
//! - `ram:<size>[:<name>]`: a new size, same name (none stays none).
//! - `<dev>:offset=<o>,size=<size>`: a new size, same device and offset.
//! - A whole device (`nvme:1`, `virtio:0`) has the device's size, and a GPT partition
//!   (`part=`) the table's: neither is changed through `params` (blkdom does not rewrite
//!   partition tables).

use alloc::boxed::Box;
use core::fmt;

use crate::spec::{Backing, Region};

/// Why a rewritten `params` is not a resize of the disk it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResizeRefused {
    /// It names another backing store, or changes more than the size (boxed: two
    /// backings are a large error value).
    Other {
        served: Box<Backing>,
        asked: Box<Backing>,
    },
    /// The disk is a whole device.
    WholeDevice { served: Backing },
    /// The disk is a GPT partition.
    Partition { served: Backing },
}

impl fmt::Display for ResizeRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResizeRefused::Other { served, asked } => write!(
                f,
                "params {asked} is not {served} with another size: while a disk is served only \
                 its size may change (ram:<size>[:<name>], or size= of an offset=,size= slice)"
            ),
            ResizeRefused::WholeDevice { served } => write!(
                f,
                "{served} is a whole device: its size is the device's and cannot change"
            ),
            ResizeRefused::Partition { served } => write!(
                f,
                "{served} is a GPT partition: its size is the partition table's, which blkdom \
                 does not change (serve an offset=,size= slice to resize)"
            ),
        }
    }
}

impl core::error::Error for ResizeRefused {}

/// The size in bytes `asked` gives the disk `served` is, if it is `served` with another
/// size; `None` if it is `served` exactly.
pub fn new_size(served: &Backing, asked: &Backing) -> Result<Option<u64>, ResizeRefused> {
    if served == asked {
        return Ok(None);
    }
    let other = || ResizeRefused::Other {
        served: Box::new(*served),
        asked: Box::new(*asked),
    };
    match (*served, *asked) {
        (Backing::Ram { name, .. }, Backing::Ram { bytes, name: asked }) if name == asked => {
            Ok(Some(bytes))
        }
        (Backing::Ram { .. }, _) => Err(other()),
        _ => {
            let (Some((device, region)), Some((asked_device, asked_region))) =
                (served.device(), asked.device())
            else {
                return Err(other());
            };
            match (region, asked_region) {
                (
                    Region::Extent { offset, .. },
                    Region::Extent {
                        offset: asked_offset,
                        size,
                    },
                ) if device == asked_device && offset == asked_offset => Ok(Some(size)),
                (Region::Whole, _) if device == asked_device => {
                    Err(ResizeRefused::WholeDevice { served: *served })
                }
                (Region::Partition(_) | Region::PartitionNamed(_), _) if device == asked_device => {
                    Err(ResizeRefused::Partition { served: *served })
                }
                _ => Err(other()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_backing;

    fn resize(served: &str, asked: &str) -> Result<Option<u64>, ResizeRefused> {
        new_size(
            &parse_backing(served).unwrap(),
            &parse_backing(asked).unwrap(),
        )
    }

    #[test]
    fn only_the_size_of_a_ram_disk_or_an_explicit_slice_changes() {
        assert_eq!(resize("ram:128M", "ram:256M"), Ok(Some(256 << 20)));
        assert_eq!(resize("ram:128M", "ram:64M"), Ok(Some(64 << 20)));
        assert_eq!(resize("ram:128M", "ram:131072K"), Ok(None), "the same size");
        assert_eq!(resize("ram:1G:web", "ram:2G:web"), Ok(Some(2 << 30)));
        assert_eq!(
            resize("nvme:1:offset=1G,size=8G", "nvme:1:offset=1G,size=12G"),
            Ok(Some(12 << 30))
        );
        assert_eq!(
            resize("virtio:0:offset=0,size=512M", "virtio:0:offset=0K,size=1G"),
            Ok(Some(1 << 30))
        );
    }

    #[test]
    fn anything_else_is_refused_with_why() {
        for (served, asked) in [
            ("ram:1G:web", "ram:2G:db"),
            ("ram:1G:web", "ram:2G"),
            ("ram:1G", "ram:2G:web"),
            ("ram:1G", "nvme:1"),
            ("nvme:1:offset=1G,size=8G", "nvme:1:offset=2G,size=8G"),
            ("nvme:1:offset=1G,size=8G", "nvme:2:offset=1G,size=9G"),
            ("nvme:1:offset=1G,size=8G", "virtio:0:offset=1G,size=9G"),
            ("nvme:1:offset=1G,size=8G", "nvme:1:part=2"),
            ("nvme:1", "ram:1G"),
            ("nvme:1", "nvme:2"),
        ] {
            let refused = resize(served, asked).unwrap_err();
            assert!(
                matches!(refused, ResizeRefused::Other { .. }),
                "{served} -> {asked}: {refused:?}"
            );
        }
        let refused = resize("ram:1G:web", "ram:2G:db").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "params ram:2G:db is not ram:1G:web with another size: while a disk is served \
             only its size may change (ram:<size>[:<name>], or size= of an offset=,size= slice)"
        );
        let whole = resize("nvme:1", "nvme:1:offset=0,size=8G").unwrap_err();
        assert!(matches!(whole, ResizeRefused::WholeDevice { .. }));
        assert_eq!(
            whole.to_string(),
            "nvme:1 is a whole device: its size is the device's and cannot change"
        );
        let partition = resize("virtio:0:part=name:web", "virtio:0:offset=0,size=8G").unwrap_err();
        assert!(matches!(partition, ResizeRefused::Partition { .. }));
        assert!(partition
            .to_string()
            .starts_with("virtio:0:part=name:web is a GPT partition"));
    }
}
