// SPDX-License-Identifier: MIT OR Apache-2.0
//! Byte ranges of a device: whether a slice fits its device, and which ranges serve
//! disks now (two disks on one device must not overlap: two guests would write the same
//! blocks).

use crate::spec::{Bytes, SLICE_ALIGN};
use alloc::vec::Vec;
use core::fmt;

/// `len` bytes from byte `start` of a device; `start + len` fits 64 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    start: u64,
    len: u64,
}

impl Extent {
    /// None if `start + len` does not fit 64 bits.
    pub const fn new(start: u64, len: u64) -> Option<Extent> {
        match start.checked_add(len) {
            Some(_) => Some(Extent { start, len }),
            None => None,
        }
    }

    pub const fn start(&self) -> u64 {
        self.start
    }

    pub const fn len(&self) -> u64 {
        self.len
    }

    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte.
    pub const fn end(&self) -> u64 {
        self.start + self.len
    }

    /// Whether the two share a byte (an empty extent shares none).
    pub fn overlaps(&self, other: &Extent) -> bool {
        !self.is_empty()
            && !other.is_empty()
            && self.start < other.end()
            && other.start < self.end()
    }

    /// First sector and sectors (of 512 bytes), if both ends are whole sectors.
    pub fn sectors(&self) -> Option<(u64, u64)> {
        (self.start.is_multiple_of(512) && self.len.is_multiple_of(512))
            .then_some((self.start / 512, self.len / 512))
    }
}

/// `bytes 1048576..9437184 (8M at 1M)`: exact, and readable.
impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bytes {}..{} ({} at {})",
            self.start,
            self.end(),
            Bytes(self.len),
            Bytes(self.start)
        )
    }
}

/// Why a slice does not fit its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceError {
    /// It ends beyond the device.
    BeyondDevice { extent: Extent, device_bytes: u64 },
    /// It does not start at a multiple of [`SLICE_ALIGN`] (an explicit offset cannot be
    /// written so; a partition can).
    Misaligned { extent: Extent },
    /// It is not whole logical blocks of the device.
    NotWholeBlocks { extent: Extent, block_size: u32 },
    /// It is empty (a partition of no blocks cannot be; a zero size does not parse).
    Empty,
}

impl fmt::Display for SliceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SliceError::BeyondDevice {
                extent,
                device_bytes,
            } => write!(
                f,
                "the slice ({extent}) ends beyond the device ({device_bytes} bytes, {})",
                Bytes(*device_bytes)
            ),
            SliceError::Misaligned { extent } => write!(
                f,
                "the slice ({extent}) does not start at a multiple of {SLICE_ALIGN} bytes"
            ),
            SliceError::NotWholeBlocks { extent, block_size } => write!(
                f,
                "the slice ({extent}) is not whole blocks of the device's {block_size} bytes"
            ),
            SliceError::Empty => f.write_str("the slice is empty"),
        }
    }
}

impl core::error::Error for SliceError {}

/// Checks that a slice `extent` fits a device of `device_bytes` addressed in blocks of
/// `block_size` bytes: it starts at a multiple of [`SLICE_ALIGN`], is whole blocks (start
/// and length) and ends inside the device.
pub fn check_slice(extent: Extent, device_bytes: u64, block_size: u32) -> Result<(), SliceError> {
    if extent.is_empty() {
        return Err(SliceError::Empty);
    }
    if !extent.start().is_multiple_of(SLICE_ALIGN) {
        return Err(SliceError::Misaligned { extent });
    }
    let block = u64::from(block_size.max(512));
    if !extent.start().is_multiple_of(block) || !extent.len().is_multiple_of(block) {
        return Err(SliceError::NotWholeBlocks { extent, block_size });
    }
    if extent.end() > device_bytes {
        return Err(SliceError::BeyondDevice {
            extent,
            device_bytes,
        });
    }
    Ok(())
}

/// One range serving a disk: the device, its bytes, and who holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim<K, T> {
    pub device: K,
    pub extent: Extent,
    /// Bytes of the device outside `extent` that the disk was found by (a `part=`
    /// disk's partition table): no other disk may cover them while this one serves,
    /// or its guest could rewrite them and have the next lookup find another range.
    pub table: Option<Extent>,
    pub owner: T,
}

/// How a range meets a claim on its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictKind {
    /// The range shares a byte with the claim's.
    Overlaps,
    /// The range covers bytes of the table the claim's disk was found by.
    CoversTable,
    /// The table the new disk was found by lies (partly) in the claim's range.
    TableCovered,
}

/// Why a range cannot serve a disk: the claim in its way, and how.
#[derive(Debug, PartialEq, Eq)]
pub struct Conflict<'a, K, T> {
    pub kind: ConflictKind,
    pub claim: &'a Claim<K, T>,
}

/// The ranges of devices (named by `K`) that serve disks now, each with its owner `T`
/// (e.g. the spec that asked for it). No two on one device overlap, and none covers
/// the table another was found by.
#[derive(Clone, Debug)]
pub struct Ranges<K, T> {
    claims: Vec<Claim<K, T>>,
}

impl<K, T> Default for Ranges<K, T> {
    fn default() -> Self {
        Ranges { claims: Vec::new() }
    }
}

impl<K: PartialEq, T> Ranges<K, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The first claim on `device` other than the one at `skip` that a disk on
    /// `extent`, found by `table`, may not serve next to: one it overlaps, then one whose
    /// table it covers, then one holding its table.
    fn conflict_at(
        &self,
        device: &K,
        extent: Extent,
        table: Option<Extent>,
        skip: Option<usize>,
    ) -> Option<(usize, ConflictKind)> {
        let others = || {
            self.claims
                .iter()
                .enumerate()
                .filter(move |(i, c)| Some(*i) != skip && c.device == *device)
        };
        let meets = |kind, hit: &dyn Fn(&Claim<K, T>) -> bool| {
            others().find(|(_, c)| hit(c)).map(|(i, _)| (i, kind))
        };
        meets(ConflictKind::Overlaps, &|c| c.extent.overlaps(&extent))
            .or_else(|| {
                meets(ConflictKind::CoversTable, &|c| {
                    c.table.is_some_and(|t| t.overlaps(&extent))
                })
            })
            .or_else(|| {
                let table = table?;
                meets(ConflictKind::TableCovered, &|c| c.extent.overlaps(&table))
            })
    }

    fn conflict_with(&self, (at, kind): (usize, ConflictKind)) -> Conflict<'_, K, T> {
        Conflict {
            kind,
            claim: &self.claims[at],
        }
    }

    /// What keeps a disk on `extent` of `device`, found by `table`, from serving: the
    /// claim it overlaps, whose table it covers, or that holds its table.
    pub fn conflict(
        &self,
        device: &K,
        extent: Extent,
        table: Option<Extent>,
    ) -> Option<Conflict<'_, K, T>> {
        self.conflict_at(device, extent, table, None)
            .map(|found| self.conflict_with(found))
    }

    /// Claims `extent` of `device` (and keeps others off `table`, the bytes the disk
    /// was found by) for `owner`, or returns what is in the way ([`Ranges::conflict`]).
    pub fn claim(
        &mut self,
        device: K,
        extent: Extent,
        table: Option<Extent>,
        owner: T,
    ) -> Result<(), Conflict<'_, K, T>> {
        if let Some(found) = self.conflict_at(&device, extent, table, None) {
            return Err(self.conflict_with(found));
        }
        self.claims.push(Claim {
            device,
            extent,
            table,
            owner,
        });
        Ok(())
    }

    /// Gives back the claim of exactly `extent` on `device`; its owner, if it was held.
    pub fn release(&mut self, device: &K, extent: Extent) -> Option<T> {
        let at = self
            .claims
            .iter()
            .position(|c| c.device == *device && c.extent == extent)?;
        Some(self.claims.swap_remove(at).owner)
    }

    /// Moves the claim of exactly `old` on `device` to `new` (a disk that grows or
    /// shrinks), unless `new` meets another claim on the device as [`Ranges::conflict`]
    /// says: then that claim. `Ok(false)` if no claim of `old` is held.
    pub fn resize(
        &mut self,
        device: &K,
        old: Extent,
        new: Extent,
    ) -> Result<bool, Conflict<'_, K, T>> {
        let Some(at) = self
            .claims
            .iter()
            .position(|c| c.device == *device && c.extent == old)
        else {
            return Ok(false);
        };
        let table = self.claims[at].table;
        if let Some(found) = self.conflict_at(device, new, table, Some(at)) {
            return Err(self.conflict_with(found));
        }
        self.claims[at].extent = new;
        Ok(true)
    }

    /// The claims on `device`.
    pub fn on<'a>(&'a self, device: &'a K) -> impl Iterator<Item = &'a Claim<K, T>> + 'a {
        self.claims.iter().filter(move |c| c.device == *device)
    }

    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(start: u64, len: u64) -> Extent {
        Extent::new(start, len).unwrap()
    }

    #[test]
    fn extents_overlap_when_they_share_a_byte() {
        let a = e(4096, 4096);
        assert!(a.overlaps(&a));
        assert!(a.overlaps(&e(0, 4097)));
        assert!(a.overlaps(&e(8191, 1)));
        assert!(a.overlaps(&e(0, u64::MAX)));
        assert!(e(5000, 10).overlaps(&a) && a.overlaps(&e(5000, 10)));
        // Touching is not overlapping.
        assert!(!a.overlaps(&e(0, 4096)));
        assert!(!a.overlaps(&e(8192, 4096)));
        assert!(!e(0, 4096).overlaps(&a));
        // Nothing overlaps an empty extent, even inside.
        assert!(!a.overlaps(&e(5000, 0)));
        assert!(!e(5000, 0).overlaps(&a));
        assert_eq!(Extent::new(u64::MAX, 1), None);
        assert_eq!(Extent::new(1, u64::MAX), None);
        assert_eq!(e(u64::MAX, 0).end(), u64::MAX);
        assert_eq!(e(4096, 8192).sectors(), Some((8, 16)));
        assert_eq!(e(4096, 100).sectors(), None);
        assert_eq!(e(100, 512).sectors(), None);
    }

    #[test]
    fn extents_print_exactly_and_readably() {
        assert_eq!(
            e(1 << 20, 8 << 20).to_string(),
            "bytes 1048576..9437184 (8M at 1M)"
        );
        assert_eq!(e(0, 1536).to_string(), "bytes 0..1536 (1536 at 0)");
    }

    #[test]
    fn slices_must_fit_their_device() {
        let mib = 1 << 20;
        assert_eq!(check_slice(e(mib, 8 * mib), 64 * mib, 512), Ok(()));
        assert_eq!(check_slice(e(0, 64 * mib), 64 * mib, 4096), Ok(()));
        // An odd number of sectors on a 512-byte-block device is fine; not on 4 KiB.
        assert_eq!(check_slice(e(mib, 1536), 64 * mib, 512), Ok(()));
        assert_eq!(
            check_slice(e(mib, 1536), 64 * mib, 4096),
            Err(SliceError::NotWholeBlocks {
                extent: e(mib, 1536),
                block_size: 4096
            })
        );
        assert_eq!(
            check_slice(e(8192, 4096), 64 * mib, 16384),
            Err(SliceError::NotWholeBlocks {
                extent: e(8192, 4096),
                block_size: 16384
            })
        );
        assert_eq!(
            check_slice(e(60 * mib, 8 * mib), 64 * mib, 512),
            Err(SliceError::BeyondDevice {
                extent: e(60 * mib, 8 * mib),
                device_bytes: 64 * mib
            })
        );
        assert_eq!(
            check_slice(e(64 * mib, 512), 64 * mib, 512),
            Err(SliceError::BeyondDevice {
                extent: e(64 * mib, 512),
                device_bytes: 64 * mib
            })
        );
        assert_eq!(
            check_slice(e(34 * 512, mib), 64 * mib, 512),
            Err(SliceError::Misaligned {
                extent: e(34 * 512, mib)
            })
        );
        assert_eq!(check_slice(e(0, 0), 64 * mib, 512), Err(SliceError::Empty));
        assert_eq!(
            check_slice(e(60 * mib, 8 * mib), 64 * mib, 512)
                .unwrap_err()
                .to_string(),
            "the slice (bytes 62914560..71303168 (8M at 60M)) ends beyond the device (67108864 bytes, 64M)"
        );
        assert!(check_slice(e(34 * 512, mib), 64 * mib, 512)
            .unwrap_err()
            .to_string()
            .contains("does not start at a multiple of 4096 bytes"));
    }

    /// The owner of what keeps a plain disk (no table) off `extent` of `device`.
    fn in_the_way(
        ranges: &Ranges<u32, &'static str>,
        device: u32,
        extent: Extent,
    ) -> Option<&'static str> {
        ranges
            .conflict(&device, extent, None)
            .map(|c| c.claim.owner)
    }

    #[test]
    fn ranges_refuse_overlaps_on_one_device_only() {
        let mut ranges: Ranges<u32, &str> = Ranges::new();
        assert!(ranges.is_empty());
        assert_eq!(ranges.claim(1, e(0, 4096), None, "a"), Ok(()));
        assert_eq!(ranges.claim(1, e(4096, 4096), None, "b"), Ok(()));
        // Another device: the same bytes are other bytes.
        assert_eq!(ranges.claim(2, e(0, 1 << 30), None, "whole 2"), Ok(()));
        assert_eq!(ranges.len(), 3);
        let refused = ranges.claim(1, e(2048, 4096), None, "c").unwrap_err();
        assert_eq!(refused.kind, ConflictKind::Overlaps);
        assert_eq!(
            (refused.claim.extent, refused.claim.owner),
            (e(0, 4096), "a")
        );
        // A whole device overlaps any slice on it, and a slice the whole device.
        let refused = ranges.claim(1, e(0, 1 << 30), None, "whole 1").unwrap_err();
        assert_eq!(refused.claim.owner, "a");
        assert_eq!(in_the_way(&ranges, 2, e(8192, 512)), Some("whole 2"));
        assert_eq!(in_the_way(&ranges, 1, e(8192, 512)), None);
        assert_eq!(ranges.on(&1).count(), 2);
        // Released, the range is free again; releasing what is not held changes nothing.
        assert_eq!(ranges.release(&1, e(0, 4096)), Some("a"));
        assert_eq!(ranges.release(&1, e(0, 4096)), None);
        assert_eq!(ranges.release(&1, e(4096, 8192)), None);
        assert_eq!(ranges.claim(1, e(2048, 2048), None, "c"), Ok(()));
        assert_eq!(ranges.len(), 3);
        assert_eq!(ranges.release(&2, e(0, 1 << 30)), Some("whole 2"));
        assert_eq!(ranges.on(&2).count(), 0);
    }

    #[test]
    fn a_claim_grows_up_to_its_neighbour_only() {
        let mut ranges: Ranges<u32, &str> = Ranges::new();
        ranges.claim(1, e(0, 4096), None, "a").unwrap();
        ranges.claim(1, e(16384, 4096), None, "b").unwrap();
        ranges
            .claim(2, e(4096, 4096), None, "other device")
            .unwrap();
        // Up to b's first byte: fine (the other device's claim is no neighbour).
        assert_eq!(ranges.resize(&1, e(0, 4096), e(0, 16384)), Ok(true));
        assert_eq!(in_the_way(&ranges, 1, e(8192, 1)), Some("a"));
        // One byte into b: refused, naming b; a keeps its range.
        let refused = ranges.resize(&1, e(0, 16384), e(0, 16385)).unwrap_err();
        assert_eq!(
            (refused.claim.owner, refused.claim.extent),
            ("b", e(16384, 4096))
        );
        assert_eq!(in_the_way(&ranges, 1, e(0, 16384)), Some("a"));
        assert_eq!(ranges.release(&1, e(0, 16384)), Some("a"));
        // A claim not held is not resized.
        assert_eq!(ranges.resize(&1, e(0, 16384), e(0, 4096)), Ok(false));
        // Shrinking never meets anyone.
        assert_eq!(ranges.resize(&1, e(16384, 4096), e(16384, 512)), Ok(true));
    }

    #[test]
    fn no_disk_covers_the_table_another_was_found_by() {
        let mib = 1 << 20;
        // A partition at 1 MiB found by a table in bytes 512..17408 (header and entries).
        let table = e(512, 16896);
        let mut ranges: Ranges<u32, &str> = Ranges::new();
        ranges.claim(1, e(mib, mib), Some(table), "part=1").unwrap();
        // A slice over the table is refused (its guest could rewrite the table), one
        // past it is not, and another device's bytes are other bytes.
        let refused = ranges
            .claim(1, e(0, 64 * 1024), None, "offset=0")
            .unwrap_err();
        assert_eq!(
            (refused.kind, refused.claim.owner),
            (ConflictKind::CoversTable, "part=1")
        );
        assert_eq!(ranges.claim(1, e(4 * mib, mib), None, "offset=4M"), Ok(()));
        assert_eq!(ranges.claim(2, e(0, mib), None, "other device"), Ok(()));
        // A second partition found by the same table: tables may share bytes.
        assert_eq!(
            ranges.claim(1, e(2 * mib, mib), Some(table), "part=2"),
            Ok(())
        );
        // While either partition serves; once both are gone the bytes are free.
        ranges.release(&1, e(mib, mib));
        assert_eq!(in_the_way(&ranges, 1, e(8192, 4096)), Some("part=2"));
        ranges.release(&1, e(2 * mib, mib));
        assert_eq!(ranges.claim(1, e(0, 64 * 1024), None, "offset=0"), Ok(()));
        // The other way round: a partition whose table lies in a slice serving now.
        let refused = ranges
            .claim(1, e(mib, mib), Some(table), "part=1")
            .unwrap_err();
        assert_eq!(
            (refused.kind, refused.claim.owner),
            (ConflictKind::TableCovered, "offset=0")
        );
        // A slice grown into a table is refused too (tables here need not lie at the
        // device's start, as a GPT's does).
        let mut ranges: Ranges<u32, &str> = Ranges::new();
        ranges
            .claim(1, e(mib, mib), Some(e(4 * mib, 16384)), "part=1")
            .unwrap();
        ranges
            .claim(1, e(3 * mib, 4096), None, "offset=3M")
            .unwrap();
        let refused = ranges
            .resize(&1, e(3 * mib, 4096), e(3 * mib, 2 * mib))
            .unwrap_err();
        assert_eq!(refused.kind, ConflictKind::CoversTable);
        assert_eq!(
            ranges.resize(&1, e(3 * mib, 4096), e(3 * mib, mib)),
            Ok(true)
        );
    }
}
