// SPDX-License-Identifier: MIT OR Apache-2.0
//! gpt-image FILE DISK_SIZE [NUMBER:FIRST_LBA:LAST_LBA:NAME]...
//!
//! Writes a protective MBR and a primary GUID partition table (`backing::gpt::write`:
//! 512-byte blocks, 128 entries from LBA 2, no backup table) for a disk of DISK_SIZE
//! bytes (a K, M or G suffix counts in 1024s) over the start of FILE, which is created
//! when missing; nothing else in FILE changes. Each partition is of type "Linux
//! filesystem data", its unique GUID the number's byte 16 times, the disk's GUID
//! "blkdom-rig-gpt!!": the same table every time.
//!
//! The nested rig makes its disk images with it (tools/rig/run.sh, a scenario's
//! `rig-gpt:` header): `cargo run --example gpt-image -- disk.img 256M 1:2048:4095:data`.

use backing::gpt::write::{primary_table, NewPartition};
use std::fs::OpenOptions;
use std::io::Write;
use std::process::ExitCode;

const BLOCK_SIZE: u32 = 512;
const DISK_GUID: [u8; 16] = *b"blkdom-rig-gpt!!";
const USAGE: &str = "usage: gpt-image FILE DISK_SIZE [NUMBER:FIRST_LBA:LAST_LBA:NAME]...";

fn size(text: &str) -> Option<u64> {
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 10),
        b'M' => (&text[..text.len() - 1], 20),
        b'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

fn partition(text: &str) -> Option<NewPartition<'_>> {
    let mut fields = text.splitn(4, ':');
    let number = fields.next()?.parse().ok()?;
    let first_lba = fields.next()?.parse().ok()?;
    let last_lba = fields.next()?.parse().ok()?;
    Some(NewPartition::linux_data(
        number,
        first_lba,
        last_lba,
        fields.next()?,
    ))
}

fn run(args: &[String]) -> Result<(), String> {
    let [file, disk_size, parts @ ..] = args else {
        return Err(USAGE.into());
    };
    let disk_bytes = size(disk_size).ok_or_else(|| format!("bad DISK_SIZE {disk_size:?}"))?;
    let parts = parts
        .iter()
        .map(|p| partition(p).ok_or_else(|| format!("bad partition {p:?}\n{USAGE}")))
        .collect::<Result<Vec<_>, _>>()?;
    let table =
        primary_table(BLOCK_SIZE, disk_bytes, DISK_GUID, &parts).map_err(|e| e.to_string())?;
    let mut out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(file)
        .map_err(|e| format!("{file}: {e}"))?;
    // A file longer than the table is the disk itself: the table must describe it.
    let len = out.metadata().map_err(|e| format!("{file}: {e}"))?.len();
    if len > table.len() as u64 && len != disk_bytes {
        return Err(format!(
            "{file} has {len} bytes, not the {disk_bytes} of the disk the table describes"
        ));
    }
    out.write_all(&table).map_err(|e| format!("{file}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpt-image: {e}");
            ExitCode::FAILURE
        }
    }
}
