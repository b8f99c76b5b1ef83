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
    /// primary (at LBA 1), the usable LBAs (in order, on the disk), the entry size and
    /// count, and that the entry array lies on the disk after the header.
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
        if entries_lba
            .checked_add(blocks)
            .is_none_or(|end| end > disk_blocks)
        {
            return Err(GptError::EntriesBeyondDisk {
                lba: entries_lba,
                bytes,
                disk_blocks,
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
mod tests {
    use super::*;

    /// A GPT written the way the UEFI specification lays it out (what sgdisk and parted
    /// write): header at LBA 1, entries from `entries_lba`; every field can be spoiled.
    #[derive(Clone)]
    struct Table {
        block_size: u32,
        disk_blocks: u64,
        header_size: u32,
        my_lba: u64,
        first_usable: u64,
        last_usable: u64,
        entries_lba: u64,
        entry_count: u32,
        entry_size: u32,
        /// (number, first LBA, last LBA, name as UTF-16 units)
        partitions: Vec<(u32, u64, u64, Vec<u16>)>,
    }

    impl Table {
        /// 128 entries of 128 bytes at LBA 2, usable LBAs between them and the backup.
        fn new(block_size: u32, disk_blocks: u64) -> Table {
            let entry_blocks = 16384 / u64::from(block_size);
            Table {
                block_size,
                disk_blocks,
                header_size: 92,
                my_lba: 1,
                first_usable: 2 + entry_blocks,
                last_usable: disk_blocks - 2 - entry_blocks,
                entries_lba: 2,
                entry_count: 128,
                entry_size: 128,
                partitions: Vec::new(),
            }
        }

        fn with(mut self, number: u32, first: u64, last: u64, name: &str) -> Table {
            self.partitions
                .push((number, first, last, name.encode_utf16().collect()));
            self
        }

        fn entries(&self) -> Vec<u8> {
            let size = self.entry_size as usize;
            let mut entries = vec![0u8; self.entry_count as usize * size];
            for (number, first, last, name) in &self.partitions {
                let at = (*number as usize - 1) * size;
                let entry = &mut entries[at..at + size];
                // Linux filesystem data: 0FC63DAF-8483-4772-8E79-3D69D8477DE4.
                entry[..16].copy_from_slice(&[
                    0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8,
                    0x47, 0x7d, 0xe4,
                ]);
                entry[16..32].copy_from_slice(&[*number as u8; 16]);
                entry[32..40].copy_from_slice(&first.to_le_bytes());
                entry[40..48].copy_from_slice(&last.to_le_bytes());
                for (i, unit) in name.iter().enumerate() {
                    entry[56 + 2 * i..58 + 2 * i].copy_from_slice(&unit.to_le_bytes());
                }
            }
            entries
        }

        /// The header block for entries with CRC32 `entries_crc`.
        fn header(&self, entries_crc: u32) -> Vec<u8> {
            let mut h = vec![0u8; self.block_size as usize];
            h[..8].copy_from_slice(b"EFI PART");
            h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
            h[12..16].copy_from_slice(&self.header_size.to_le_bytes());
            h[24..32].copy_from_slice(&self.my_lba.to_le_bytes());
            h[32..40].copy_from_slice(&(self.disk_blocks - 1).to_le_bytes());
            h[40..48].copy_from_slice(&self.first_usable.to_le_bytes());
            h[48..56].copy_from_slice(&self.last_usable.to_le_bytes());
            h[56..72].copy_from_slice(&[0x42; 16]);
            h[72..80].copy_from_slice(&self.entries_lba.to_le_bytes());
            h[80..84].copy_from_slice(&self.entry_count.to_le_bytes());
            h[84..88].copy_from_slice(&self.entry_size.to_le_bytes());
            h[88..92].copy_from_slice(&entries_crc.to_le_bytes());
            let size = (self.header_size as usize).min(h.len());
            let crc = crc32(&h[..size]);
            h[16..20].copy_from_slice(&crc.to_le_bytes());
            h
        }

        /// The disk: protective MBR signature, header, entries.
        fn image(&self) -> Vec<u8> {
            let block = self.block_size as usize;
            let mut disk = vec![0u8; self.disk_blocks as usize * block];
            disk[510] = 0x55;
            disk[511] = 0xaa;
            let entries = self.entries();
            let header = self.header(crc32(&entries));
            disk[block..2 * block].copy_from_slice(&header);
            let at = self.entries_lba as usize * block;
            if at + entries.len() <= disk.len() {
                disk[at..at + entries.len()].copy_from_slice(&entries);
            }
            disk
        }
    }

    /// What the kernel does: read LBA 1, check it, read the entries, find the partition.
    fn find_in(disk: &[u8], block_size: u32, wanted: Wanted) -> Result<Partition, GptError> {
        let (at, len) = header_location(block_size, disk.len() as u64)?;
        let header = Header::parse(
            &disk[at as usize..at as usize + len],
            block_size,
            disk.len() as u64,
        )?;
        let (at, len) = header.entries_location();
        header.find(&disk[at as usize..at as usize + len], wanted)
    }

    fn name(text: &str) -> Wanted {
        Wanted::Name(PartName::new(text).unwrap())
    }

    /// A 4 MiB disk of 512-byte blocks with three partitions and a gap at entry 3.
    fn three() -> Table {
        Table::new(512, 8192)
            .with(1, 2048, 4095, "EFI system")
            .with(2, 4096, 6143, "root")
            .with(4, 6144, 8158, "Linux filesystem")
    }

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(&[0; 32]), 0x190a_55ad);
    }

    #[test]
    fn finds_partitions_by_number_and_by_name() {
        let disk = three().image();
        let p = find_in(&disk, 512, Wanted::Number(2)).unwrap();
        assert_eq!((p.number, p.first_lba, p.last_lba), (2, 4096, 6143));
        assert_eq!(p.extent, Extent::new(4096 * 512, 2048 * 512).unwrap());
        assert_eq!(find_in(&disk, 512, name("root")).unwrap(), p);
        // The last usable LBA is usable; an odd number of blocks is fine.
        let p = find_in(&disk, 512, name("Linux filesystem")).unwrap();
        assert_eq!((p.number, p.first_lba, p.last_lba), (4, 6144, 8158));
        assert_eq!(p.extent.len(), 2015 * 512);
        assert_eq!(
            find_in(&disk, 512, Wanted::Number(1))
                .unwrap()
                .extent
                .start(),
            1 << 20
        );
    }

    #[test]
    fn blocks_of_4096_bytes() {
        let disk = Table::new(4096, 1024).with(1, 256, 767, "data").image();
        let p = find_in(&disk, 4096, name("data")).unwrap();
        assert_eq!(p.extent, Extent::new(1 << 20, 2 << 20).unwrap());
        // Read as 512-byte blocks, LBA 1 is not the header.
        assert!(matches!(
            find_in(&disk, 512, Wanted::Number(1)),
            Err(GptError::NoSignature(_))
        ));
    }

    #[test]
    fn larger_entries_and_headers_are_read() {
        let mut t = three();
        t.entry_size = 256;
        t.header_size = 512;
        let disk = t.image();
        assert_eq!(
            find_in(&disk, 512, Wanted::Number(4)).unwrap().first_lba,
            6144
        );
    }

    #[test]
    fn names_match_exactly() {
        let disk = three()
            .with(5, 2048, 2048, "ro\u{f6}t")
            .with(6, 2048, 2048, &"n".repeat(36))
            .image();
        // Case, length and non-ASCII units all count.
        assert_eq!(
            find_in(&disk, 512, name("Root")),
            Err(GptError::NoName {
                name: PartName::new("Root").unwrap()
            })
        );
        assert!(find_in(&disk, 512, name("roo")).is_err());
        assert!(find_in(&disk, 512, name("rootx")).is_err());
        assert_eq!(find_in(&disk, 512, name("root")).unwrap().number, 2);
        // A name filling all 36 units has no terminating zero.
        assert_eq!(
            find_in(&disk, 512, name(&"n".repeat(36))).unwrap().number,
            6
        );
        assert!(find_in(&disk, 512, name(&"n".repeat(35))).is_err());
    }

    #[test]
    fn a_name_on_two_partitions_is_ambiguous() {
        let disk = three().with(7, 2048, 2048, "root").image();
        assert_eq!(
            find_in(&disk, 512, name("root")),
            Err(GptError::AmbiguousName {
                name: PartName::new("root").unwrap(),
                first: 2,
                second: 7
            })
        );
        // An unused entry's name does not count.
        let mut entries = Table::new(512, 8192).entries();
        for (i, c) in b"root".iter().enumerate() {
            entries[6 * 128 + 56 + 2 * i] = *c;
        }
        let header = Header {
            block_size: 512,
            disk_blocks: 8192,
            first_usable: 34,
            last_usable: 8158,
            entries_lba: 2,
            entry_count: 128,
            entry_size: 128,
            entries_crc: crc32(&entries),
        };
        assert_eq!(
            header.find(&entries, name("root")),
            Err(GptError::NoName {
                name: PartName::new("root").unwrap()
            })
        );
    }

    #[test]
    fn missing_unused_and_bad_entries_are_refused() {
        let disk = three().image();
        assert_eq!(
            find_in(&disk, 512, Wanted::Number(3)),
            Err(GptError::Unused { number: 3 })
        );
        assert_eq!(
            find_in(&disk, 512, Wanted::Number(129)),
            Err(GptError::NoSuchEntry {
                number: 129,
                count: 128
            })
        );
        assert_eq!(
            find_in(&disk, 512, Wanted::Number(0)),
            Err(GptError::ZeroPartition)
        );
        let disk = three().with(5, 5000, 4999, "x").image();
        assert_eq!(
            find_in(&disk, 512, Wanted::Number(5)),
            Err(GptError::PartitionInverted {
                number: 5,
                first: 5000,
                last: 4999
            })
        );
        for (first, last) in [(33, 100), (8100, 8159), (0, 8191), (8159, 8159)] {
            let disk = three().with(5, first, last, "x").image();
            assert_eq!(
                find_in(&disk, 512, Wanted::Number(5)),
                Err(GptError::PartitionOutsideUsable {
                    number: 5,
                    first,
                    last,
                    first_usable: 34,
                    last_usable: 8158
                }),
                "{first}..={last}"
            );
        }
        // A partition beyond the disk is refused even where the header's usable range
        // is stretched to match it: the usable range must lie on the disk.
        let mut t = three().with(5, 8000, 9000, "x");
        t.last_usable = 9000;
        assert_eq!(
            find_in(&t.image(), 512, Wanted::Number(5)),
            Err(GptError::UsableBeyondDisk {
                last: 9000,
                disk_blocks: 8192
            })
        );
    }

    #[test]
    fn damaged_tables_are_refused() {
        let good = three().image();
        // A flipped bit in the header, or in the entries.
        let mut disk = good.clone();
        disk[512 + 40] ^= 1;
        assert!(matches!(
            find_in(&disk, 512, Wanted::Number(1)),
            Err(GptError::HeaderCrc { .. })
        ));
        let mut disk = good.clone();
        disk[1024 + 128 + 33] ^= 0x80;
        assert!(matches!(
            find_in(&disk, 512, Wanted::Number(1)),
            Err(GptError::EntriesCrc { .. })
        ));
        // A changed byte after the entry array's end is not the table's.
        let mut disk = good.clone();
        disk[1024 + 16384] ^= 0xff;
        assert!(find_in(&disk, 512, Wanted::Number(1)).is_ok());
        // The CRC fields themselves.
        let mut disk = good.clone();
        disk[512 + 16] ^= 1;
        let Err(GptError::HeaderCrc { stored, computed }) = find_in(&disk, 512, Wanted::Number(1))
        else {
            panic!("a wrong header CRC is refused");
        };
        assert_eq!(stored ^ computed, 1);
        // Header bytes beyond header_size are not covered.
        let mut disk = good.clone();
        disk[512 + 200] = 7;
        assert!(find_in(&disk, 512, Wanted::Number(1)).is_ok());
        // No table at all.
        let blank = vec![0u8; 8192 * 512];
        assert_eq!(
            find_in(&blank, 512, Wanted::Number(1)),
            Err(GptError::NoSignature([0; 8]))
        );
        let text = find_in(&blank, 512, Wanted::Number(1))
            .unwrap_err()
            .to_string();
        assert!(text.starts_with("GPT: no partition table"), "{text}");
    }

    #[test]
    fn every_header_field_is_checked() {
        let check = |t: Table| find_in(&t.image(), 512, Wanted::Number(1));
        let mut t = three();
        t.header_size = 91;
        assert_eq!(
            check(t.clone()),
            Err(GptError::BadHeaderSize {
                size: 91,
                block_size: 512
            })
        );
        t.header_size = 513;
        assert_eq!(
            check(t),
            Err(GptError::BadHeaderSize {
                size: 513,
                block_size: 512
            })
        );
        let mut t = three();
        t.my_lba = 8191;
        assert_eq!(check(t), Err(GptError::NotPrimary { my_lba: 8191 }));
        let mut t = three();
        t.first_usable = 5000;
        t.last_usable = 4999;
        assert_eq!(
            check(t),
            Err(GptError::UsableInverted {
                first: 5000,
                last: 4999
            })
        );
        let mut t = three();
        t.last_usable = 8192;
        assert_eq!(
            check(t),
            Err(GptError::UsableBeyondDisk {
                last: 8192,
                disk_blocks: 8192
            })
        );
        for size in [0, 64, 127, 129, 192, 384] {
            let mut t = three();
            t.entry_size = size;
            // A size the builder cannot lay entries out with: check the header alone.
            let header = t.header(0);
            assert_eq!(
                Header::parse(&header, 512, 8192 * 512),
                Err(GptError::BadEntrySize(size)),
                "{size}"
            );
        }
        let mut t = three();
        t.partitions.clear();
        t.entry_count = 0;
        assert_eq!(check(t), Err(GptError::NoEntries));
        let mut t = three();
        t.entry_count = 4096;
        t.entry_size = 128;
        assert_eq!(
            Header::parse(&t.header(0), 512, 8192 * 512),
            Err(GptError::EntryArrayTooLarge {
                count: 4096,
                size: 128
            })
        );
        for lba in [0, 1] {
            let mut t = three();
            t.entries_lba = lba;
            assert_eq!(
                Header::parse(&t.header(0), 512, 8192 * 512),
                Err(GptError::EntriesOverHeader { lba })
            );
        }
        // 16 KiB of entries from LBA 8160 end at 8192: on the disk; one later, not.
        let mut t = three();
        t.entries_lba = 8160;
        assert!(check(t.clone()).is_ok());
        t.entries_lba = 8161;
        assert_eq!(
            Header::parse(&t.header(0), 512, 8192 * 512),
            Err(GptError::EntriesBeyondDisk {
                lba: 8161,
                bytes: 16384,
                disk_blocks: 8192
            })
        );
        t.entries_lba = u64::MAX;
        assert!(matches!(
            Header::parse(&t.header(0), 512, 8192 * 512),
            Err(GptError::EntriesBeyondDisk { .. })
        ));
    }

    #[test]
    fn sizes_given_are_checked() {
        assert_eq!(header_location(512, 1024), Ok((512, 512)));
        assert_eq!(header_location(4096, 1 << 20), Ok((4096, 4096)));
        assert_eq!(header_location(0, 1 << 20), Err(GptError::BadBlockSize(0)));
        assert_eq!(
            header_location(1000, 1 << 20),
            Err(GptError::BadBlockSize(1000))
        );
        assert_eq!(
            header_location(256, 1 << 20),
            Err(GptError::BadBlockSize(256))
        );
        assert_eq!(
            header_location(512, 1023),
            Err(GptError::DiskTooSmall {
                disk_bytes: 1023,
                block_size: 512
            })
        );
        let disk = three().image();
        assert_eq!(
            Header::parse(&disk[512..560], 512, disk.len() as u64),
            Err(GptError::ShortHeader { have: 48, need: 92 })
        );
        let header = Header::parse(&disk[512..1024], 512, disk.len() as u64).unwrap();
        assert_eq!(header.entries_location(), (1024, 16384));
        assert_eq!(
            header.find(&disk[1024..2048], Wanted::Number(1)),
            Err(GptError::ShortEntries {
                have: 1024,
                need: 16384
            })
        );
    }

    #[test]
    fn errors_read_well() {
        assert_eq!(
            GptError::Unused { number: 3 }.to_string(),
            "GPT: partition 3 is unused"
        );
        assert_eq!(
            GptError::NoSuchEntry {
                number: 200,
                count: 128
            }
            .to_string(),
            "GPT: no partition 200: the table has 128 entries"
        );
        assert_eq!(
            GptError::NoName {
                name: PartName::new("swap").unwrap()
            }
            .to_string(),
            "GPT: no partition is named \"swap\""
        );
        assert_eq!(
            GptError::NoSignature(*b"\0\0\0\0\0\0\0\0").to_string(),
            "GPT: no partition table: LBA 1 starts with \"\\0\\0\\0\\0\\0\\0\\0\\0\", not \"EFI PART\""
        );
        assert_eq!(
            GptError::HeaderCrc {
                stored: 1,
                computed: 2
            }
            .to_string(),
            "GPT: header CRC32 is 0x00000001, its bytes give 0x00000002: damaged"
        );
        assert_eq!(Wanted::Number(2).to_string(), "partition 2");
        assert_eq!(name("root").to_string(), "partition \"root\"");
    }
}
