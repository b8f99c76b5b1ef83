// SPDX-License-Identifier: MIT OR Apache-2.0
//! Writing a GUID partition table, for disks made on the host (the nested rig's disk
//! images: `examples/gpt-image.rs`); blkdom itself never writes one.
//!
//! [`primary_table`] lays out what the parser reads: a protective MBR (LBA 0), the
//! primary header (LBA 1) and an array of 128 entries of 128 bytes from LBA 2, usable
//! LBAs from the block after the array to the last one that leaves room for a backup
//! array and header at the disk's end. The backup table itself is not written: blkdom
//! reads the primary only, and the rig's checks want the disk's end left as it was.

use super::{check_lbas, crc32, GptError, MIN_ENTRY_SIZE, MIN_HEADER_SIZE, NAME_UNITS, SIGNATURE};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// Entries in the array: the usual 128 (UEFI's minimum array is 16 KiB).
pub const ENTRY_COUNT: u32 = 128;
/// GPT revision 1.0.
const REVISION: u32 = 0x0001_0000;
/// "Linux filesystem data", 0FC63DAF-8483-4772-8E79-3D69D8477DE4, as stored (the first
/// three fields little-endian).
pub const LINUX_FILESYSTEM_DATA: [u8; 16] = [
    0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47, 0x7d, 0xe4,
];

/// One partition to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewPartition<'a> {
    /// Its entry, 1-based (Linux's partition number).
    pub number: u32,
    /// Not zero: an entry with a zero type is unused.
    pub type_guid: [u8; 16],
    pub unique_guid: [u8; 16],
    /// Inclusive, within the usable LBAs.
    pub first_lba: u64,
    pub last_lba: u64,
    /// Up to 36 UTF-16 units.
    pub name: &'a str,
}

impl NewPartition<'_> {
    /// Of type "Linux filesystem data", its unique GUID the number's byte 16 times (a
    /// table made of these is the same bytes every time).
    pub fn linux_data(number: u32, first_lba: u64, last_lba: u64, name: &str) -> NewPartition<'_> {
        NewPartition {
            number,
            type_guid: LINUX_FILESYSTEM_DATA,
            unique_guid: [number as u8; 16],
            first_lba,
            last_lba,
            name,
        }
    }
}

/// Why no table was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteError {
    /// The block size is not a power of two of at least 512 bytes.
    BadBlockSize(u32),
    /// The disk cannot hold both tables and a usable block.
    DiskTooSmall { disk_blocks: u64, need: u64 },
    /// The number is 0 or beyond the array's entries.
    NumberOutOfRange { number: u32 },
    /// Two partitions have the number.
    NumberTwice { number: u32 },
    /// The type GUID is zero (the entry would read as unused).
    ZeroType { number: u32 },
    /// What the parser would refuse of the entry: its first LBA after its last
    /// ([`GptError::PartitionInverted`]), or outside the usable LBAs
    /// ([`GptError::PartitionOutsideUsable`]).
    Lbas(GptError),
    /// Two partitions share blocks.
    Overlap { first: u32, second: u32 },
    /// The name takes more than 36 UTF-16 units.
    NameTooLong { number: u32, units: usize },
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPT: ")?;
        match self {
            WriteError::BadBlockSize(size) => {
                write!(f, "block size {size} is not a power of two from 512")
            }
            WriteError::DiskTooSmall { disk_blocks, need } => write!(
                f,
                "a disk of {disk_blocks} blocks is too small for a partition table ({need} blocks at least)"
            ),
            WriteError::NumberOutOfRange { number } => write!(
                f,
                "partition number {number} is not between 1 and {ENTRY_COUNT}"
            ),
            WriteError::NumberTwice { number } => write!(f, "partition {number} is given twice"),
            WriteError::ZeroType { number } => {
                write!(f, "partition {number} has a zero type GUID (an unused entry)")
            }
            // The parser's words, without its "GPT: ".
            WriteError::Lbas(e) => {
                let text = alloc::format!("{e}");
                f.write_str(text.strip_prefix("GPT: ").unwrap_or(&text))
            }
            WriteError::Overlap { first, second } => {
                write!(f, "partitions {first} and {second} overlap")
            }
            WriteError::NameTooLong { number, units } => write!(
                f,
                "partition {number}: the name takes {units} UTF-16 units, more than {NAME_UNITS}"
            ),
        }
    }
}

impl core::error::Error for WriteError {}

/// Where a table goes on a disk of `disk_blocks` blocks of `block_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u32,
    pub disk_blocks: u64,
    /// The block after the primary entry array.
    pub first_usable: u64,
    /// The block before the backup entry array (which ends before the backup header).
    pub last_usable: u64,
}

impl Layout {
    pub fn new(block_size: u32, disk_bytes: u64) -> Result<Layout, WriteError> {
        if block_size < 512 || !block_size.is_power_of_two() {
            return Err(WriteError::BadBlockSize(block_size));
        }
        let block = u64::from(block_size);
        let entry_blocks = (u64::from(ENTRY_COUNT) * u64::from(MIN_ENTRY_SIZE)).div_ceil(block);
        let disk_blocks = disk_bytes / block;
        // MBR, header, array; one usable block; the backup's array and header.
        let need = 2 + entry_blocks + 1 + entry_blocks + 1;
        if disk_blocks < need {
            return Err(WriteError::DiskTooSmall { disk_blocks, need });
        }
        Ok(Layout {
            block_size,
            disk_blocks,
            first_usable: 2 + entry_blocks,
            last_usable: disk_blocks - 2 - entry_blocks,
        })
    }
}

/// The first `first_usable` blocks of a disk of `disk_bytes` bytes in blocks of
/// `block_size`, with `partitions` in a GPT whose disk GUID is `disk_guid`: the protective
/// MBR (one partition of type 0xEE over the disk), the primary header and the entry array
/// (entries not given are zero). Written over the disk's start, they make the table
/// `Header::parse` and `Header::find` read.
pub fn primary_table(
    block_size: u32,
    disk_bytes: u64,
    disk_guid: [u8; 16],
    partitions: &[NewPartition<'_>],
) -> Result<Vec<u8>, WriteError> {
    let layout = Layout::new(block_size, disk_bytes)?;
    let block = block_size as usize;
    let mut disk = vec![0u8; layout.first_usable as usize * block];

    // The entry array, from LBA 2.
    let entry_size = MIN_ENTRY_SIZE as usize;
    let entries_at = 2 * block;
    for (i, p) in partitions.iter().enumerate() {
        check(&layout, p)?;
        if let Some(other) = partitions[..i].iter().find(|o| o.number == p.number) {
            return Err(WriteError::NumberTwice {
                number: other.number,
            });
        }
        if let Some(other) = partitions[..i]
            .iter()
            .find(|o| o.first_lba <= p.last_lba && p.first_lba <= o.last_lba)
        {
            return Err(WriteError::Overlap {
                first: other.number,
                second: p.number,
            });
        }
        let at = entries_at + (p.number as usize - 1) * entry_size;
        let entry = &mut disk[at..at + entry_size];
        entry[..16].copy_from_slice(&p.type_guid);
        entry[16..32].copy_from_slice(&p.unique_guid);
        entry[32..40].copy_from_slice(&p.first_lba.to_le_bytes());
        entry[40..48].copy_from_slice(&p.last_lba.to_le_bytes());
        // Attributes (48..56) none; the name from 56, zero-padded.
        for (unit, field) in p.name.encode_utf16().zip(entry[56..].chunks_exact_mut(2)) {
            field.copy_from_slice(&unit.to_le_bytes());
        }
    }
    let entries_len = ENTRY_COUNT as usize * entry_size;
    let entries_crc = crc32(&disk[entries_at..entries_at + entries_len]);

    // The primary header, LBA 1; the rest of its block zero.
    let h = &mut disk[block..block + MIN_HEADER_SIZE as usize];
    h[..8].copy_from_slice(&SIGNATURE);
    h[8..12].copy_from_slice(&REVISION.to_le_bytes());
    h[12..16].copy_from_slice(&MIN_HEADER_SIZE.to_le_bytes());
    // 16..20: the header's CRC, computed below over the header with this field zero.
    h[24..32].copy_from_slice(&1u64.to_le_bytes());
    h[32..40].copy_from_slice(&(layout.disk_blocks - 1).to_le_bytes());
    h[40..48].copy_from_slice(&layout.first_usable.to_le_bytes());
    h[48..56].copy_from_slice(&layout.last_usable.to_le_bytes());
    h[56..72].copy_from_slice(&disk_guid);
    h[72..80].copy_from_slice(&2u64.to_le_bytes());
    h[80..84].copy_from_slice(&ENTRY_COUNT.to_le_bytes());
    h[84..88].copy_from_slice(&MIN_ENTRY_SIZE.to_le_bytes());
    h[88..92].copy_from_slice(&entries_crc.to_le_bytes());
    let header_crc = crc32(h);
    h[16..20].copy_from_slice(&header_crc.to_le_bytes());

    // The protective MBR: one partition of type 0xEE from LBA 1 over the rest of the disk
    // (as many blocks as 32 bits hold), CHS fields as UEFI gives them.
    let mbr = &mut disk[446..446 + 16];
    mbr[..8].copy_from_slice(&[0x00, 0x00, 0x02, 0x00, 0xee, 0xff, 0xff, 0xff]);
    mbr[8..12].copy_from_slice(&1u32.to_le_bytes());
    let blocks = u32::try_from(layout.disk_blocks - 1).unwrap_or(u32::MAX);
    mbr[12..16].copy_from_slice(&blocks.to_le_bytes());
    disk[510..512].copy_from_slice(&[0x55, 0xaa]);
    Ok(disk)
}

/// One partition on its own: number, type, LBAs and name.
fn check(layout: &Layout, p: &NewPartition<'_>) -> Result<(), WriteError> {
    let number = p.number;
    if !(1..=ENTRY_COUNT).contains(&number) {
        return Err(WriteError::NumberOutOfRange { number });
    }
    if p.type_guid == [0; 16] {
        return Err(WriteError::ZeroType { number });
    }
    check_lbas(
        number,
        p.first_lba,
        p.last_lba,
        layout.first_usable,
        layout.last_usable,
    )
    .map_err(WriteError::Lbas)?;
    let units = p.name.encode_utf16().count();
    if units > NAME_UNITS {
        return Err(WriteError::NameTooLong { number, units });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent::Extent;
    use crate::gpt::{header_location, GptError, Header, Partition, Wanted};
    use crate::spec::PartName;

    const GUID: [u8; 16] = *b"blkdom-rig-gpt!!";

    fn part(number: u32, first_lba: u64, last_lba: u64, name: &str) -> NewPartition<'_> {
        NewPartition::linux_data(number, first_lba, last_lba, name)
    }

    /// The parser's way in, on a disk of `disk_bytes` whose start is `table`.
    fn find(
        table: &[u8],
        block_size: u32,
        disk_bytes: u64,
        wanted: Wanted,
    ) -> Result<Partition, GptError> {
        let (at, len) = header_location(block_size, disk_bytes)?;
        let header = Header::parse(&table[at as usize..][..len], block_size, disk_bytes)?;
        let (at, len) = header.entries_location();
        header.find(&table[at as usize..][..len], wanted)
    }

    fn name(text: &str) -> Wanted {
        Wanted::Name(PartName::new(text).unwrap())
    }

    #[test]
    fn the_parser_finds_what_was_written() {
        // The rig's namespace (tests/xen/blkdom-operator): 256 MiB, partitions at 100M
        // and 228M, 16 MiB each.
        let disk = 256 << 20;
        let parts = [
            part(1, 204800, 237567, "p1-data"),
            part(2, 466944, 499711, "guest7"),
        ];
        let table = primary_table(512, disk, GUID, &parts).unwrap();
        assert_eq!(table.len(), 34 * 512);
        let p = find(&table, 512, disk, Wanted::Number(1)).unwrap();
        assert_eq!(p.extent, Extent::new(100 << 20, 16 << 20).unwrap());
        let p = find(&table, 512, disk, name("guest7")).unwrap();
        assert_eq!((p.number, p.first_lba, p.last_lba), (2, 466944, 499711));
        assert_eq!(p.extent, Extent::new(228 << 20, 16 << 20).unwrap());
        assert_eq!(find(&table, 512, disk, name("p1-data")).unwrap().number, 1);
        assert_eq!(
            find(&table, 512, disk, Wanted::Number(3)),
            Err(GptError::Unused { number: 3 })
        );
        let header = Header::parse(&table[512..1024], 512, disk).unwrap();
        assert_eq!(
            (header.first_usable, header.last_usable, header.disk_blocks),
            (34, 524254, 524288)
        );
    }

    #[test]
    fn the_bytes_are_the_specifications() {
        let disk = 8192 * 512;
        let table = primary_table(512, disk, GUID, &[part(4, 2048, 8158, "Linux")]).unwrap();
        // Protective MBR: not bootable, CHS 0/0/2, type 0xEE, CHS end max, LBA 1, the rest.
        assert_eq!(&table[..446], &[0; 446][..]);
        assert_eq!(
            &table[446..462],
            &[0, 0, 2, 0, 0xee, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0xff, 0x1f, 0, 0]
        );
        assert_eq!(&table[462..510], &[0; 48][..]);
        assert_eq!(&table[510..512], &[0x55, 0xaa]);
        // Header: revision 1.0, 92 bytes, the alternate at the last LBA, the disk GUID.
        let h = &table[512..1024];
        assert_eq!(&h[..16], b"EFI PART\0\0\x01\0\x5c\0\0\0");
        assert_eq!(&h[20..24], &[0; 4]);
        assert_eq!(h[32..40], 8191u64.to_le_bytes());
        assert_eq!(&h[56..72], b"blkdom-rig-gpt!!");
        assert_eq!(&h[92..], &[0; 420][..]);
        let mut zeroed = h[..92].to_vec();
        zeroed[16..20].fill(0);
        assert_eq!(h[16..20], crc32(&zeroed).to_le_bytes());
        // Entry 4: type, unique GUID, LBAs, no attributes, the name in UTF-16LE.
        let e = &table[1024 + 3 * 128..1024 + 4 * 128];
        assert_eq!(e[..16], LINUX_FILESYSTEM_DATA);
        assert_eq!(e[16..32], [4; 16]);
        assert_eq!(e[32..40], 2048u64.to_le_bytes());
        assert_eq!(e[40..48], 8158u64.to_le_bytes());
        assert_eq!(e[48..56], [0; 8]);
        assert_eq!(&e[56..66], b"L\0i\0n\0u\0x\0");
        assert_eq!(&e[66..], &[0; 62][..]);
        // Every other entry is zero, and so is what follows the array.
        let entries = &table[1024..1024 + 16384];
        assert!(entries[..3 * 128].iter().all(|b| *b == 0));
        assert!(entries[4 * 128..].iter().all(|b| *b == 0));
        assert_eq!(table.len(), 1024 + 16384);
        assert_eq!(h[88..92], crc32(entries).to_le_bytes());
    }

    #[test]
    fn other_block_sizes_and_large_disks() {
        // 4 KiB blocks: the array takes 4 blocks, usable from LBA 6.
        let disk = 1024 * 4096;
        let table = primary_table(4096, disk, GUID, &[part(1, 256, 767, "data")]).unwrap();
        assert_eq!(table.len(), 6 * 4096);
        let p = find(&table, 4096, disk, name("data")).unwrap();
        assert_eq!(p.extent, Extent::new(1 << 20, 2 << 20).unwrap());
        let header = Header::parse(&table[4096..8192], 4096, disk).unwrap();
        assert_eq!((header.first_usable, header.last_usable), (6, 1018));
        // Beyond 2 TiB of 512-byte blocks the protective MBR's size saturates.
        let disk = 4u64 << 40;
        let table = primary_table(512, disk, GUID, &[]).unwrap();
        assert_eq!(table[458..462], u32::MAX.to_le_bytes());
        let header = Header::parse(&table[512..1024], 512, disk).unwrap();
        assert_eq!(header.last_usable, (disk >> 9) - 34);
        // The smallest disk: one usable block.
        let table = primary_table(512, 68 * 512, GUID, &[part(1, 34, 34, "one")]).unwrap();
        assert_eq!(
            find(&table, 512, 68 * 512, Wanted::Number(1))
                .unwrap()
                .extent
                .len(),
            512
        );
    }

    #[test]
    fn what_cannot_be_written_is_refused() {
        let disk = 8192 * 512;
        let write = |parts: &[NewPartition<'_>]| primary_table(512, disk, GUID, parts);
        assert_eq!(
            primary_table(1000, disk, GUID, &[]),
            Err(WriteError::BadBlockSize(1000))
        );
        assert_eq!(
            primary_table(512, 67 * 512, GUID, &[]),
            Err(WriteError::DiskTooSmall {
                disk_blocks: 67,
                need: 68
            })
        );
        for number in [0, 129] {
            assert_eq!(
                write(&[part(number, 100, 200, "x")]),
                Err(WriteError::NumberOutOfRange { number })
            );
        }
        assert_eq!(
            write(&[part(1, 100, 200, "x"), part(1, 300, 400, "y")]),
            Err(WriteError::NumberTwice { number: 1 })
        );
        let mut untyped = part(1, 100, 200, "x");
        untyped.type_guid = [0; 16];
        assert_eq!(write(&[untyped]), Err(WriteError::ZeroType { number: 1 }));
        assert_eq!(
            write(&[part(1, 201, 200, "x")]),
            Err(WriteError::Lbas(GptError::PartitionInverted {
                number: 1,
                first: 201,
                last: 200
            }))
        );
        for (first, last) in [(33, 100), (100, 8159)] {
            assert_eq!(
                write(&[part(2, first, last, "x")]),
                Err(WriteError::Lbas(GptError::PartitionOutsideUsable {
                    number: 2,
                    first,
                    last,
                    first_usable: 34,
                    last_usable: 8158
                }))
            );
        }
        assert_eq!(
            write(&[part(1, 100, 200, "x"), part(2, 200, 300, "y")]),
            Err(WriteError::Overlap {
                first: 1,
                second: 2
            })
        );
        // Adjacent partitions do not overlap; 36 units fill the name field.
        assert!(write(&[part(1, 100, 199, "x"), part(2, 200, 300, &"n".repeat(36))]).is_ok());
        assert_eq!(
            write(&[part(1, 100, 200, &"n".repeat(37))]),
            Err(WriteError::NameTooLong {
                number: 1,
                units: 37
            })
        );
        assert_eq!(
            WriteError::Overlap {
                first: 1,
                second: 2
            }
            .to_string(),
            "GPT: partitions 1 and 2 overlap"
        );
        assert_eq!(
            write(&[part(1, 201, 200, "x")]).unwrap_err().to_string(),
            "GPT: partition 1: first LBA 201 is after last LBA 200"
        );
    }
}
