// SPDX-License-Identifier: MIT OR Apache-2.0
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
                0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47,
                0x7d, 0xe4,
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
    // 32 KiB of entries from LBA 2.
    t.first_usable = 66;
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
    // 16 KiB of entries from LBA 8160 end at 8192: on the disk (then refused for lying
    // after the usable LBAs' start); one later, not on the disk.
    let mut t = three();
    t.entries_lba = 8160;
    assert_eq!(
        Header::parse(&t.header(0), 512, 8192 * 512),
        Err(GptError::EntriesInUsable {
            lba: 8160,
            end: 8192,
            first_usable: 34
        })
    );
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
fn the_table_lies_before_the_usable_lbas() {
    // (first usable LBA, entry array LBA): the usable LBAs start at or before the
    // array's end (so before the header too), or lie before an array moved after them.
    // Partition 5 lies over the table: in the usable LBAs if those were all checked.
    for (first_usable, lba) in [(0, 2), (1, 2), (2, 2), (33, 2), (2, 8000)] {
        let mut t = three().with(5, 2, 40, "over the table");
        (t.first_usable, t.entries_lba) = (first_usable, lba);
        assert_eq!(
            find_in(&t.image(), 512, Wanted::Number(5)),
            Err(GptError::EntriesInUsable {
                lba,
                end: lba + 32,
                first_usable
            }),
            "first usable {first_usable}, entries at {lba}"
        );
    }
    // Right up to it is fine, and an array moved further in (sgdisk -j) too.
    assert!(find_in(&three().image(), 512, Wanted::Number(1)).is_ok());
    let mut t = three();
    (t.first_usable, t.entries_lba) = (1056, 1024);
    assert_eq!(
        find_in(&t.image(), 512, Wanted::Number(1))
            .unwrap()
            .first_lba,
        2048
    );
    assert!(GptError::EntriesInUsable {
        lba: 2,
        end: 34,
        first_usable: 33
    }
    .to_string()
    .contains("a partition could hold it"));
}

#[test]
fn the_table_extent_is_the_header_and_the_entry_array() {
    let disk = three().image();
    let header = Header::parse(&disk[512..1024], 512, disk.len() as u64).unwrap();
    assert_eq!(
        header.table_extent(),
        Extent::new(512, 512 + 16384).unwrap()
    );
    // Entries further in: the extent runs from the header to their end; a last block
    // the array fills in part counts whole.
    let mut t = Table::new(4096, 1024);
    t.entries_lba = 3;
    t.entry_count = 33;
    t.first_usable = 6;
    let disk = t.image();
    let header = Header::parse(&disk[4096..8192], 4096, disk.len() as u64).unwrap();
    assert_eq!(
        header.table_extent(),
        Extent::new(4096, 4 * 4096).unwrap(),
        "LBAs 1..5"
    );
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
