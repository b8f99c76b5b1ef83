// SPDX-License-Identifier: MIT OR Apache-2.0
//! The GUID partition table, as far as finding one partition takes: the primary header
//! (LBA 1) and its entry array, every field that is used checked first. The backup
//! table (at the disk's end) is not read: a damaged primary is refused, not repaired.
//!
//! Use: [`header_location`] says which bytes to read for the header, [`Header::parse`]
//! checks them, [`Header::entries_location`] says which bytes hold the entry array, and
//! [`Header::find`] checks those and finds the partition. [`write`] makes tables on the
//! host (the rig's disk images).

pub mod write;

use crate::extent::Extent;
use crate::spec::PartName;
use core::fmt;

/// "EFI PART".
pub const SIGNATURE: [u8; 8] = *b"EFI PART";
/// The header's fields end here; a header may be longer (up to its block), zero-filled.
pub const MIN_HEADER_SIZE: u32 = 92;
/// The smallest entry (the fields this parser reads); larger ones are 128 x 2^n.
pub const MIN_ENTRY_SIZE: u32 = 128;
/// Most bytes of entry array read: 16 times the usual 128 entries of 128 bytes.
pub const MAX_ENTRY_ARRAY_BYTES: u64 = 256 * 1024;
/// Units of a partition name (72 bytes of UTF-16LE).
const NAME_UNITS: usize = 36;

/// Which partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// Entry `n` of the array (1-based), as Linux numbers partitions.
    Number(u32),
    /// The used entry whose name is these characters (one UTF-16 unit each).
    Name(PartName),
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wanted::Number(n) => write!(f, "partition {n}"),
            Wanted::Name(name) => write!(f, "partition {:?}", name.as_str()),
        }
    }
}

/// Why no partition came out of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GptError {
    /// The block size is not a power of two of at least 512 bytes.
    BadBlockSize(u32),
    /// The disk has no LBA 1.
    DiskTooSmall {
        disk_bytes: u64,
        block_size: u32,
    },
    /// Fewer bytes than the header's size were given.
    ShortHeader {
        have: usize,
        need: usize,
    },
    /// LBA 1 does not start with "EFI PART" (the first 8 bytes found).
    NoSignature([u8; 8]),
    /// The header size is below 92 or beyond its block.
    BadHeaderSize {
        size: u32,
        block_size: u32,
    },
    HeaderCrc {
        stored: u32,
        computed: u32,
    },
    /// The header says it lies elsewhere than LBA 1 (a backup header, at the disk's end).
    NotPrimary {
        my_lba: u64,
    },
    /// first usable LBA > last usable LBA.
    UsableInverted {
        first: u64,
        last: u64,
    },
    /// The last usable LBA is not on the disk.
    UsableBeyondDisk {
        last: u64,
        disk_blocks: u64,
    },
    /// The entry size is below 128 or not 128 x 2^n.
    BadEntrySize(u32),
    NoEntries,
    /// count x size beyond [`MAX_ENTRY_ARRAY_BYTES`].
    EntryArrayTooLarge {
        count: u32,
        size: u32,
    },
    /// The array starts on the protective MBR or the header (LBA 0 or 1).
    EntriesOverHeader {
        lba: u64,
    },
    /// The array does not end on the disk.
    EntriesBeyondDisk {
        lba: u64,
        bytes: u64,
        disk_blocks: u64,
    },
    /// The entry array (LBAs `lba..end`) does not end before the first usable LBA: a
    /// partition could hold it.
    EntriesInUsable {
        lba: u64,
        end: u64,
        first_usable: u64,
    },
    /// Fewer bytes than the entry array were given.
    ShortEntries {
        have: usize,
        need: u64,
    },
    EntriesCrc {
        stored: u32,
        computed: u32,
    },
    /// `part=0` (the parser refuses it before; kept for callers that do not parse).
    ZeroPartition,
    /// The number is beyond the array's entries.
    NoSuchEntry {
        number: u32,
        count: u32,
    },
    /// The entry is unused (its type GUID is zero).
    Unused {
        number: u32,
    },
    /// No used entry has the name.
    NoName {
        name: PartName,
    },
    /// Two used entries have the name (the first two).
    AmbiguousName {
        name: PartName,
        first: u32,
        second: u32,
    },
    /// The entry's first LBA is after its last.
    PartitionInverted {
        number: u32,
        first: u64,
        last: u64,
    },
    /// The entry lies (partly) outside the usable LBAs the header gives.
    PartitionOutsideUsable {
        number: u32,
        first: u64,
        last: u64,
        first_usable: u64,
        last_usable: u64,
    },
}

impl fmt::Display for GptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPT: ")?;
        match self {
            GptError::BadBlockSize(size) => write!(f, "block size {size} is not a power of two from 512"),
            GptError::DiskTooSmall { disk_bytes, block_size } => write!(
                f,
                "a disk of {disk_bytes} bytes has no LBA 1 (blocks of {block_size} bytes)"
            ),
            GptError::ShortHeader { have, need } => {
                write!(f, "{have} bytes of header read, {need} needed")
            }
            GptError::NoSignature(found) => write!(
                f,
                "no partition table: LBA 1 starts with {:?}, not \"EFI PART\"",
                core::str::from_utf8(found).unwrap_or("(bytes that are not text)")
            ),
            GptError::BadHeaderSize { size, block_size } => write!(
                f,
                "header size {size} is not between {MIN_HEADER_SIZE} and the block size {block_size}"
            ),
            GptError::HeaderCrc { stored, computed } => write!(
                f,
                "header CRC32 is {stored:#010x}, its bytes give {computed:#010x}: damaged"
            ),
            GptError::NotPrimary { my_lba } => {
                write!(f, "the header at LBA 1 says it is at LBA {my_lba}")
            }
            GptError::UsableInverted { first, last } => write!(
                f,
                "first usable LBA {first} is after last usable LBA {last}"
            ),
            GptError::UsableBeyondDisk { last, disk_blocks } => write!(
                f,
                "last usable LBA {last} is beyond the disk's {disk_blocks} blocks"
            ),
            GptError::BadEntrySize(size) => write!(
                f,
                "partition entry size {size} is not 128 x 2^n bytes"
            ),
            GptError::NoEntries => f.write_str("the partition entry array has no entries"),
            GptError::EntryArrayTooLarge { count, size } => write!(
                f,
                "{count} entries of {size} bytes are more than the {MAX_ENTRY_ARRAY_BYTES} bytes read"
            ),
            GptError::EntriesOverHeader { lba } => write!(
                f,
                "the entry array at LBA {lba} lies over the protective MBR or the header"
            ),
            GptError::EntriesBeyondDisk {
                lba,
                bytes,
                disk_blocks,
            } => write!(
                f,
                "the entry array ({bytes} bytes at LBA {lba}) ends beyond the disk's {disk_blocks} blocks"
            ),
            GptError::EntriesInUsable {
                lba,
                end,
                first_usable,
            } => write!(
                f,
                "the entry array (LBAs {lba}..{end}) does not end before the first usable LBA {first_usable}: a partition could hold it"
            ),
            GptError::ShortEntries { have, need } => {
                write!(f, "{have} bytes of entry array read, {need} needed")
            }
            GptError::EntriesCrc { stored, computed } => write!(
                f,
                "entry array CRC32 is {stored:#010x}, its bytes give {computed:#010x}: damaged"
            ),
            GptError::ZeroPartition => f.write_str("partitions are numbered from 1"),
            GptError::NoSuchEntry { number, count } => write!(
                f,
                "no partition {number}: the table has {count} entries"
            ),
            GptError::Unused { number } => write!(f, "partition {number} is unused"),
            GptError::NoName { name } => {
                write!(f, "no partition is named {:?}", name.as_str())
            }
            GptError::AmbiguousName {
                name,
                first,
                second,
            } => write!(
                f,
                "partitions {first} and {second} are both named {:?}; name it by number",
                name.as_str()
            ),
            GptError::PartitionInverted {
                number,
                first,
                last,
            } => write!(
                f,
                "partition {number}: first LBA {first} is after last LBA {last}"
            ),
            GptError::PartitionOutsideUsable {
                number,
                first,
                last,
                first_usable,
                last_usable,
            } => write!(
                f,
                "partition {number}: LBAs {first}..={last} leave the usable LBAs {first_usable}..={last_usable}"
            ),
        }
    }
}

impl core::error::Error for GptError {}

/// The CRC-32 table of the reflected IEEE 802.3 polynomial.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// The CRC register after `data`, from `register` (no inversions: chain pieces).
fn crc32_register(register: u32, data: &[u8]) -> u32 {
    data.iter().fold(register, |c, &b| {
        CRC_TABLE[usize::from((c as u8) ^ b)] ^ (c >> 8)
    })
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's `crc32` and the UEFI specification use).
pub fn crc32(data: &[u8]) -> u32 {
    !crc32_register(!0, data)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// The byte offset and length of the header's block (LBA 1) on a disk of `disk_bytes`
/// addressed in blocks of `block_size`.
pub fn header_location(block_size: u32, disk_bytes: u64) -> Result<(u64, usize), GptError> {
    if block_size < 512 || !block_size.is_power_of_two() {
        return Err(GptError::BadBlockSize(block_size));
    }
    let block = u64::from(block_size);
    if disk_bytes / block < 2 {
        return Err(GptError::DiskTooSmall {
            disk_bytes,
            block_size,
        });
    }
    Ok((block, block_size as usize))
}

/// A checked primary header: what finding a partition needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub block_size: u32,
    /// Whole blocks on the disk.
    pub disk_blocks: u64,
    pub first_usable: u64,
    pub last_usable: u64,
    pub entries_lba: u64,
    pub entry_count: u32,
    pub entry_size: u32,
    pub entries_crc: u32,
}

/// A partition found: its number, LBAs (inclusive) and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub number: u32,
    pub first_lba: u64,
    pub last_lba: u64,
    pub extent: Extent,
}

impl Header {
    /// Checks the header in `block` (the bytes of LBA 1) of a disk of `disk_bytes` in
    /// blocks of `block_size`: signature, header size, header CRC32, that it is the
    /// primary (at LBA 1), the usable LBAs (in order, on the disk, after the header),
    /// the entry size and count, and that the entry array lies on the disk after the
    /// header and before the usable LBAs: no partition holds any of the table.
    pub fn parse(block: &[u8], block_size: u32, disk_bytes: u64) -> Result<Header, GptError> {
        header_location(block_size, disk_bytes)?;
        let disk_blocks = disk_bytes / u64::from(block_size);
        if block.len() < MIN_HEADER_SIZE as usize {
            return Err(GptError::ShortHeader {
                have: block.len(),
                need: MIN_HEADER_SIZE as usize,
            });
        }
        let mut signature = [0; 8];
        signature.copy_from_slice(&block[..8]);
        if signature != SIGNATURE {
            return Err(GptError::NoSignature(signature));
        }
        let size = u32_at(block, 12);
        if !(MIN_HEADER_SIZE..=block_size).contains(&size) {
            return Err(GptError::BadHeaderSize { size, block_size });
        }
        if block.len() < size as usize {
            return Err(GptError::ShortHeader {
                have: block.len(),
                need: size as usize,
            });
        }
        let stored = u32_at(block, 16);
        // The CRC covers the header with its own CRC field zero.
        let computed = {
            let header = &block[..size as usize];
            let register = crc32_register(!0, &header[..16]);
            let register = crc32_register(register, &[0; 4]);
            !crc32_register(register, &header[20..])
        };
        if stored != computed {
            return Err(GptError::HeaderCrc { stored, computed });
        }
        let my_lba = u64_at(block, 24);
        if my_lba != 1 {
            return Err(GptError::NotPrimary { my_lba });
        }
        let (first_usable, last_usable) = (u64_at(block, 40), u64_at(block, 48));
        if first_usable > last_usable {
            return Err(GptError::UsableInverted {
                first: first_usable,
                last: last_usable,
            });
        }
        if last_usable >= disk_blocks {
            return Err(GptError::UsableBeyondDisk {
                last: last_usable,
                disk_blocks,
            });
        }
        let entries_lba = u64_at(block, 72);
        let entry_count = u32_at(block, 80);
        let entry_size = u32_at(block, 84);
        if !entry_size.is_multiple_of(MIN_ENTRY_SIZE)
            || !(entry_size / MIN_ENTRY_SIZE).is_power_of_two()
        {
            return Err(GptError::BadEntrySize(entry_size));
        }
        if entry_count == 0 {
            return Err(GptError::NoEntries);
        }
        let bytes = u64::from(entry_count) * u64::from(entry_size);
        if bytes > MAX_ENTRY_ARRAY_BYTES {
            return Err(GptError::EntryArrayTooLarge {
                count: entry_count,
                size: entry_size,
            });
        }
        if entries_lba < 2 {
            return Err(GptError::EntriesOverHeader { lba: entries_lba });
        }
        let blocks = bytes.div_ceil(u64::from(block_size));
        let Some(end) = entries_lba
            .checked_add(blocks)
            .filter(|end| *end <= disk_blocks)
        else {
            return Err(GptError::EntriesBeyondDisk {
                lba: entries_lba,
                bytes,
                disk_blocks,
            });
        };
        // As the UEFI specification lays it out: the array ends before the first usable
        // LBA, so no partition (each checked to lie in the usable LBAs) holds it, nor
        // the header before it.
        if end > first_usable {
            return Err(GptError::EntriesInUsable {
                lba: entries_lba,
                end,
                first_usable,
            });
        }
        Ok(Header {
            block_size,
            disk_blocks,
            first_usable,
            last_usable,
            entries_lba,
            entry_count,
            entry_size,
            entries_crc: u32_at(block, 88),
        })
    }

    /// The byte offset and length of the entry array (on the disk: `parse` checked it).
    pub fn entries_location(&self) -> (u64, usize) {
        let bytes = u64::from(self.entry_count) * u64::from(self.entry_size);
        (
            self.entries_lba * u64::from(self.block_size),
            bytes as usize,
        )
    }

    /// The bytes of the table this parser reads, from the header's block to the entry
    /// array's end (on the disk, before the usable LBAs: `parse` checked it). A disk
    /// that can write them could point a partition found here somewhere else the next
    /// time it is looked up.
    pub fn table_extent(&self) -> Extent {
        let (at, len) = self.entries_location();
        let block = u64::from(self.block_size);
        let end = (at + len as u64).div_ceil(block) * block;
        Extent::new(block, end - block).expect("inside the disk, whose size fits 64 bits")
    }

    /// Checks the entry array `entries` (the bytes at `entries_location`) against the
    /// header's CRC32 and finds the partition `wanted`: used, first LBA <= last LBA, both
    /// within the usable LBAs.
    pub fn find(&self, entries: &[u8], wanted: Wanted) -> Result<Partition, GptError> {
        let (_, len) = self.entries_location();
        let Some(entries) = entries.get(..len) else {
            return Err(GptError::ShortEntries {
                have: entries.len(),
                need: len as u64,
            });
        };
        let computed = crc32(entries);
        if computed != self.entries_crc {
            return Err(GptError::EntriesCrc {
                stored: self.entries_crc,
                computed,
            });
        }
        let entry = |number: u32| {
            let at = (number as usize - 1) * self.entry_size as usize;
            &entries[at..at + MIN_ENTRY_SIZE as usize]
        };
        let used = |entry: &[u8]| entry[..16].iter().any(|b| *b != 0);
        let number = match wanted {
            Wanted::Number(0) => return Err(GptError::ZeroPartition),
            Wanted::Number(number) if number > self.entry_count => {
                return Err(GptError::NoSuchEntry {
                    number,
                    count: self.entry_count,
                })
            }
            Wanted::Number(number) => {
                if !used(entry(number)) {
                    return Err(GptError::Unused { number });
                }
                number
            }
            Wanted::Name(name) => {
                let mut matches = (1..=self.entry_count)
                    .filter(|n| used(entry(*n)) && name_is(&entry(*n)[56..128], name));
                let first = matches.next().ok_or(GptError::NoName { name })?;
                if let Some(second) = matches.next() {
                    return Err(GptError::AmbiguousName {
                        name,
                        first,
                        second,
                    });
                }
                first
            }
        };
        let entry = entry(number);
        let (first, last) = (u64_at(entry, 32), u64_at(entry, 40));
        check_lbas(number, first, last, self.first_usable, self.last_usable)?;
        // last <= last_usable < disk_blocks, and the disk's bytes fit 64 bits.
        let block = u64::from(self.block_size);
        let extent = Extent::new(first * block, (last - first + 1) * block)
            .expect("inside the disk, whose size fits 64 bits");
        Ok(Partition {
            number,
            first_lba: first,
            last_lba: last,
            extent,
        })
    }
}

/// Partition `number`'s LBAs (inclusive) are in order and within the usable LBAs: what
/// the parser accepts of an entry and the writer (`write`) writes.
fn check_lbas(
    number: u32,
    first: u64,
    last: u64,
    first_usable: u64,
    last_usable: u64,
) -> Result<(), GptError> {
    if first > last {
        return Err(GptError::PartitionInverted {
            number,
            first,
            last,
        });
    }
    if first < first_usable || last > last_usable {
        return Err(GptError::PartitionOutsideUsable {
            number,
            first,
            last,
            first_usable,
            last_usable,
        });
    }
    Ok(())
}

/// A GPT name field (72 bytes of UTF-16LE, ended by a zero unit or the field's end) is
/// `name` when its units are `name`'s characters, one each.
fn name_is(field: &[u8], name: PartName) -> bool {
    let units = field
        .chunks_exact(2)
        .take(NAME_UNITS)
        .map(|u| u16::from_le_bytes([u[0], u[1]]))
        .take_while(|u| *u != 0);
    let mut wanted = name.as_bytes().iter();
    for unit in units {
        match wanted.next() {
            Some(&c) if u16::from(c) == unit => {}
            _ => return false,
        }
    }
    wanted.next().is_none()
}

#[cfg(test)]
mod tests;
