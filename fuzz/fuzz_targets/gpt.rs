// SPDX-License-Identifier: MIT OR Apache-2.0
//! The GPT parser (`backing::gpt`) on arbitrary disks, and the writer against it.
//!
//! Parse mode (the kernel's way in, `kernel/src/devices/region.rs`): read the block
//! `header_location` names, `Header::parse` it, read the entry array (whole blocks) where
//! `entries_location` says, `find` a partition by number or name. The disk is the input's
//! bytes (contiguous from byte 0, or sparse: a header block at LBA 1 and an entry array
//! where that header points), zeros elsewhere, of any size; with a flag the harness
//! fixes both CRC32s first, so the checks behind them are reached. Properties: no panic;
//! every read lies on the disk; an accepted header's fields are in order and on the
//! disk; a partition found is a used entry of the array with those LBAs, within the
//! usable LBAs, its extent on the disk and whole blocks; and a wanted entry that is used
//! and in range (by number, or the one entry of that name) is found.
//!
//! Round-trip mode: `write::primary_table` from fuzzed partitions writes exactly when
//! they are valid (an oracle here says when), and the parser reads back each partition
//! with its LBAs, GUIDs and name, and every other entry as unused.
#![no_main]

use backing::gpt::write::{primary_table, Layout, NewPartition, ENTRY_COUNT};
use backing::gpt::{crc32, header_location, GptError, Header, Wanted, MAX_ENTRY_ARRAY_BYTES};
use backing::{check_slice, PartName, SliceError};
use libfuzzer_sys::fuzz_target;

#[path = "../common/input.rs"]
mod input;
use input::Input;

/// Block sizes a device may have; beyond 64 KiB only `header_location` is checked.
fn block_size(input: &mut Input) -> u32 {
    match input.byte() % 5 {
        0 => 512,
        1 => 4096,
        2 => 1024,
        3 => 2048,
        _ => input.uint(4) as u32,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let flags = input.byte();
    if flags & 0x80 != 0 {
        round_trip(&mut input);
    } else {
        parse(flags, &mut input);
    }
});

/// A disk of `bytes` bytes, zero but for `chunks` (a later one over an earlier one).
struct Disk {
    bytes: u64,
    chunks: Vec<(u64, Vec<u8>)>,
}

impl Disk {
    /// What the disk holds at `at..at + len`, on the disk or not (the harness's reads).
    fn peek(&self, at: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let end = at.saturating_add(len as u64);
        for (start, chunk) in &self.chunks {
            let chunk_end = start.saturating_add(chunk.len() as u64);
            let (from, to) = ((*start).max(at), chunk_end.min(end));
            if from < to {
                let n = (to - from) as usize;
                let src = (from - start) as usize;
                let dst = (from - at) as usize;
                out[dst..dst + n].copy_from_slice(&chunk[src..src + n]);
            }
        }
        out
    }

    /// A read the parser asked for: it must lie on the disk.
    fn read(&self, at: u64, len: usize) -> Vec<u8> {
        assert!(
            at.checked_add(len as u64)
                .is_some_and(|end| end <= self.bytes),
            "read of {len} bytes at {at} leaves a disk of {} bytes",
            self.bytes
        );
        self.peek(at, len)
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Rewrites the header at LBA 1 so both its CRC32s match: the entry array's (where the
/// header says it is, if it is not too large to read) and then the header's own.
fn fix_crcs(disk: &mut Disk, block_size: u32) {
    let block = u64::from(block_size);
    let mut header = disk.peek(block, block_size as usize);
    let (lba, count, size) = (
        u64_at(&header, 72),
        u32_at(&header, 80),
        u32_at(&header, 84),
    );
    let bytes = u64::from(count) * u64::from(size);
    if let Some(at) = lba.checked_mul(block) {
        if bytes <= MAX_ENTRY_ARRAY_BYTES {
            let crc = crc32(&disk.peek(at, bytes as usize));
            header[88..92].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let header_size = u32_at(&header, 12) as usize;
    if (92..=header.len()).contains(&header_size) {
        header[16..20].fill(0);
        let crc = crc32(&header[..header_size]);
        header[16..20].copy_from_slice(&crc.to_le_bytes());
    }
    disk.chunks.push((block, header));
}

/// The entry fields the parser reads, by number (1-based), from the array's bytes.
struct Entry<'a>(&'a [u8]);

impl Entry<'_> {
    fn used(&self) -> bool {
        self.0[..16].iter().any(|b| *b != 0)
    }
    fn lbas(&self) -> (u64, u64) {
        (u64_at(self.0, 32), u64_at(self.0, 40))
    }
    /// The name's UTF-16 units, to the first zero one.
    fn name(&self) -> Vec<u16> {
        self.0[56..128]
            .chunks_exact(2)
            .map(|u| u16::from_le_bytes([u[0], u[1]]))
            .take_while(|u| *u != 0)
            .collect()
    }
}

fn parse(flags: u8, input: &mut Input) {
    let block_size = block_size(input);
    let disk_bytes = input.uint(8);
    let wanted = if flags & 0x10 != 0 {
        let len = usize::from(input.byte() % 40);
        let text = String::from_utf8_lossy(input.take(len)).into_owned();
        match PartName::new(&text) {
            Some(name) => Wanted::Name(name),
            None => Wanted::Number(len as u32),
        }
    } else {
        // Mostly the first entries, sometimes anything.
        match input.byte() {
            255 => Wanted::Number(input.uint(4) as u32),
            n => Wanted::Number(u32::from(n)),
        }
    };
    let (at, len) = match header_location(block_size, disk_bytes) {
        Ok(location) => location,
        Err(GptError::BadBlockSize(size)) => {
            assert!(size < 512 || !size.is_power_of_two());
            return;
        }
        Err(GptError::DiskTooSmall { .. }) => {
            assert!(disk_bytes / u64::from(block_size) < 2);
            return;
        }
        Err(e) => panic!("header_location: {e}"),
    };
    assert!(block_size >= 512 && block_size.is_power_of_two());
    assert_eq!((at, len), (u64::from(block_size), block_size as usize));
    assert!(at + len as u64 <= disk_bytes);
    if block_size > 65536 {
        return;
    }
    let block = u64::from(block_size);
    let mut disk = Disk {
        bytes: disk_bytes,
        chunks: Vec::new(),
    };
    if flags & 0x08 != 0 {
        // Sparse: a header block, and the entry array where it points.
        let header_len = input.uint(2) as usize;
        let header = input.take(header_len).to_vec();
        let lba = if header.len() >= 80 {
            u64_at(&header, 72)
        } else {
            2
        };
        disk.chunks.push((block, header));
        if let Some(at) = lba.checked_mul(block) {
            disk.chunks.push((at, input.0.to_vec()));
        }
    } else {
        disk.chunks.push((0, input.0.to_vec()));
    }
    if flags & 0x04 != 0 {
        fix_crcs(&mut disk, block_size);
    }

    let Ok(header) = Header::parse(&disk.read(at, len), block_size, disk_bytes) else {
        return;
    };
    let disk_blocks = disk_bytes / block;
    assert_eq!(header.block_size, block_size);
    assert_eq!(header.disk_blocks, disk_blocks);
    assert!(header.first_usable <= header.last_usable);
    assert!(header.last_usable < disk_blocks);
    assert!(header.entries_lba >= 2);
    assert!(header.entry_count >= 1);
    assert!(header.entry_size >= 128 && (header.entry_size / 128).is_power_of_two());
    assert!(header.entry_size % 128 == 0);
    let (entries_at, entries_len) = header.entries_location();
    assert!(entries_len as u64 <= MAX_ENTRY_ARRAY_BYTES);
    assert_eq!(entries_at, header.entries_lba * block);
    assert_eq!(
        entries_len as u64,
        u64::from(header.entry_count) * u64::from(header.entry_size)
    );
    // As the kernel reads it: whole blocks.
    let whole = entries_len.div_ceil(block_size as usize) * block_size as usize;
    let entries = disk.read(entries_at, whole);

    let result = header.find(&entries, wanted);
    let entries = &entries[..entries_len];
    let entry = |n: u32| {
        let at = (n as usize - 1) * header.entry_size as usize;
        Entry(&entries[at..at + 128])
    };
    if let Ok(p) = result {
        assert!((1..=header.entry_count).contains(&p.number));
        let e = entry(p.number);
        assert!(e.used(), "partition {} is an unused entry", p.number);
        assert_eq!(e.lbas(), (p.first_lba, p.last_lba));
        assert!(header.first_usable <= p.first_lba);
        assert!(p.first_lba <= p.last_lba);
        assert!(p.last_lba <= header.last_usable);
        assert_eq!(p.extent.start(), p.first_lba * block);
        assert_eq!(p.extent.len(), (p.last_lba - p.first_lba + 1) * block);
        assert!(
            p.extent.end() <= disk_bytes,
            "the partition leaves the disk"
        );
        // The kernel's slice check may refuse only the alignment.
        match check_slice(p.extent, disk_bytes, block_size) {
            Ok(()) | Err(SliceError::Misaligned { .. }) => {}
            Err(e) => panic!("a partition found fails the slice check: {e}"),
        }
        match wanted {
            Wanted::Number(n) => assert_eq!(p.number, n),
            Wanted::Name(name) => {
                let units: Vec<u16> = name.as_bytes().iter().map(|&c| u16::from(c)).collect();
                assert_eq!(e.name(), units, "partition {} has another name", p.number);
            }
        }
    }
    // What must be found: the entry asked for, used, its LBAs in order and usable (the
    // array's CRC matching).
    if crc32(entries) != header.entries_crc {
        assert!(matches!(result, Err(GptError::EntriesCrc { .. })));
        return;
    }
    let number = match wanted {
        Wanted::Number(n) if (1..=header.entry_count).contains(&n) && entry(n).used() => n,
        Wanted::Number(_) => {
            assert!(result.is_err());
            return;
        }
        Wanted::Name(name) => {
            let units: Vec<u16> = name.as_bytes().iter().map(|&c| u16::from(c)).collect();
            let named: Vec<u32> = (1..=header.entry_count)
                .filter(|&n| entry(n).used() && entry(n).name() == units)
                .collect();
            if named.len() != 1 {
                assert!(result.is_err(), "{} entries are named so", named.len());
                return;
            }
            named[0]
        }
    };
    let (first, last) = entry(number).lbas();
    if header.first_usable <= first && first <= last && last <= header.last_usable {
        let p = result.unwrap_or_else(|e| panic!("partition {number} is valid, yet {e}"));
        assert_eq!(p.number, number);
    } else {
        assert!(result.is_err());
    }
}

/// Writes a table of fuzzed partitions and reads it back.
fn round_trip(input: &mut Input) {
    let block_size = 512 << (input.byte() % 4);
    let disk_bytes = input.uint(6);
    let disk_guid: [u8; 16] = [input.byte(); 16];
    let count = usize::from(input.byte() % 8);
    let mut names = Vec::new();
    let mut fields = Vec::new();
    for _ in 0..count {
        let number = u32::from(input.byte());
        let type_byte = input.byte();
        let unique_byte = input.byte();
        let first_lba = input.uint(6);
        // Mostly a short partition after its start, sometimes anything.
        let last_lba = match input.byte() {
            255 => input.uint(6),
            n => first_lba.wrapping_add(u64::from(n)),
        };
        let len = usize::from(input.byte() % 48);
        names.push(String::from_utf8_lossy(input.take(len)).into_owned());
        fields.push((number, type_byte, unique_byte, first_lba, last_lba));
    }
    let partitions: Vec<NewPartition<'_>> = fields
        .iter()
        .zip(&names)
        .map(
            |(&(number, t, u, first_lba, last_lba), name)| NewPartition {
                number,
                type_guid: [t; 16],
                unique_guid: [u; 16],
                first_lba,
                last_lba,
                name,
            },
        )
        .collect();

    let layout = Layout::new(block_size, disk_bytes);
    let written = primary_table(block_size, disk_bytes, disk_guid, &partitions);
    // The oracle: what a valid table is.
    let valid = layout.is_ok_and(|l| {
        partitions.iter().enumerate().all(|(i, p)| {
            (1..=ENTRY_COUNT).contains(&p.number)
                && p.type_guid != [0; 16]
                && l.first_usable <= p.first_lba
                && p.first_lba <= p.last_lba
                && p.last_lba <= l.last_usable
                && p.name.encode_utf16().count() <= 36
                && partitions[..i].iter().all(|o| {
                    o.number != p.number && (o.last_lba < p.first_lba || p.last_lba < o.first_lba)
                })
        })
    });
    let table = match written {
        Ok(table) => {
            assert!(valid, "an invalid table was written: {partitions:?}");
            table
        }
        Err(e) => {
            assert!(!valid, "a valid table was refused ({e}): {partitions:?}");
            return;
        }
    };
    let layout = layout.unwrap();
    assert_eq!(
        table.len() as u64,
        layout.first_usable * u64::from(block_size)
    );
    let disk = Disk {
        bytes: disk_bytes,
        chunks: vec![(0, table)],
    };
    let (at, len) = header_location(block_size, disk_bytes).expect("header location");
    let header = Header::parse(&disk.read(at, len), block_size, disk_bytes)
        .unwrap_or_else(|e| panic!("the written header does not parse: {e}"));
    assert_eq!(
        (header.first_usable, header.last_usable, header.disk_blocks),
        (layout.first_usable, layout.last_usable, layout.disk_blocks)
    );
    let (at, len) = header.entries_location();
    let entries = disk.read(at, len);
    let entry = |number: u32| Entry(&entries[(number as usize - 1) * 128..][..128]);
    // A name as stored: to its first zero unit.
    let stored = |name: &str| -> Vec<u16> { name.encode_utf16().take_while(|u| *u != 0).collect() };
    // Every entry not written is zero; two of them are looked up.
    let mut unused = (1..=ENTRY_COUNT).filter(|n| partitions.iter().all(|p| p.number != *n));
    for number in unused.clone() {
        assert!(
            entry(number).0.iter().all(|b| *b == 0),
            "entry {number} not zero"
        );
    }
    for number in unused.by_ref().take(2) {
        assert_eq!(
            header.find(&entries, Wanted::Number(number)),
            Err(GptError::Unused { number })
        );
    }
    for p in &partitions {
        let number = p.number;
        let found = header
            .find(&entries, Wanted::Number(number))
            .unwrap_or_else(|e| panic!("partition {number} written, not read: {e}"));
        assert_eq!((found.first_lba, found.last_lba), (p.first_lba, p.last_lba));
        let e = entry(number);
        assert_eq!(e.0[..16], p.type_guid);
        assert_eq!(e.0[16..32], p.unique_guid);
        assert_eq!(e.name(), stored(p.name));
        // By name, when the name is one `part=` can give: the one partition stored with
        // it, or ambiguous.
        if let Some(name) = PartName::new(p.name) {
            let found = header.find(&entries, Wanted::Name(name));
            if partitions
                .iter()
                .filter(|o| stored(o.name) == stored(p.name))
                .count()
                == 1
            {
                assert_eq!(found.map(|f| f.number), Ok(number));
            } else {
                assert!(matches!(found, Err(GptError::AmbiguousName { .. })));
            }
        }
    }
}
