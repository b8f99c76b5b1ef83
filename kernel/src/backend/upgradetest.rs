// SPDX-License-Identifier: MIT OR Apache-2.0
//! `upgradetest=`'s RAM disk (tier 2, plain QEMU): a named RAM disk whose first block
//! each image checks and rewrites, handed from image to image as a live upgrade hands
//! RAM disks over (its stripes and their ranges in the block), so its contents must
//! survive every switch. With `upgradetest.devices`, an NVMe namespace and a virtio disk
//! go the same way as a switch takes them: flushed and stopped before the jump
//! (`Registry::flush`, `Registry::quiesce`), brought up by the new image's probe.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use handover::block::{Handover, MemRange, RamDiskRecord, RangeKind, Stripe};

use super::registry::Registry;
use super::registrytest::first_block;
use crate::devices::open::PciBus;

/// The disk the test keeps: 1 MiB (16 stripes), named so it can be taken over.
const SPEC: &str = "ram:1M:upgradetest";
const NAME: &str = "upgradetest";

/// The devices `upgradetest.devices` carries across each switch.
const DEVICES: [&str; 2] = ["nvme:1", "virtio:0"];

/// The word image `generation` leaves in the disk's first block.
fn word(generation: u32) -> String {
    format!("upgrade-{generation}")
}

/// Takes the disk over from `booted_from` (or makes it on a cold boot), checks the word
/// the previous image wrote, writes this one's (`generation`, the upgrade it is about to
/// make) and puts the disk in `handover`; with `devices`, does the same on the first
/// block of each of `DEVICES` and then stops them as a switch does. Returns what it saw,
/// for the log.
pub fn carry_ram_disk(
    bus: PciBus,
    booted_from: Option<&Handover>,
    generation: u32,
    handover: &mut Handover,
    devices: bool,
) -> Result<String, String> {
    let mut registry = Registry::new(
        bus,
        cmdslots::RecoveryConfig::NEVER,
        Err("no network in this test".into()),
    );
    if let Some(h) = booted_from {
        if registry.adopt_ram_disks(&h.ram_disks) != 1 {
            return Err("the RAM disk was not taken over".into());
        }
    }
    let mut disk = registry.open(SPEC, &[]).map_err(|e| format!("{e}"))?;
    let mut seen = String::from("a new disk");
    if let Some(h) = booted_from {
        let line = first_block(&mut disk, false, &word(h.generation))?;
        seen = format!("{} {line}", word(h.generation));
        // The disk holds exactly the stripes handed over, where they were.
        let ram = registry.named_ram_disks().next().ok_or("no RAM disk")?;
        let now: Vec<(u64, u64)> = ram
            .stripe_table()
            .iter()
            .map(|s| (s.index, s.address))
            .collect();
        let handed: Vec<(u64, u64)> = h.ram_disks[0]
            .stripes
            .iter()
            .map(|s| (u64::from(s.index), s.paddr))
            .collect();
        if now != handed {
            return Err(format!("stripes {now:x?}, handed over {handed:x?}"));
        }
    }
    first_block(&mut disk, true, &word(generation))?;
    let ram = registry.named_ram_disks().next().ok_or("no RAM disk")?;
    let stripes: Vec<Stripe> = ram
        .stripe_table()
        .iter()
        .map(|s| Stripe {
            index: s.index as u32,
            paddr: s.address,
        })
        .collect();
    for s in &stripes {
        handover.ranges.push(MemRange {
            kind: RangeKind::RamDisk,
            start: s.paddr,
            len: handover::block::STRIPE_SIZE,
        });
    }
    handover.ram_disks.push(RamDiskRecord {
        name: NAME.into(),
        capacity: ram.geometry().sectors * blkdev::SECTOR_SIZE,
        stripes,
    });
    let mut opened = Vec::new();
    if devices {
        for spec in DEVICES {
            let mut device = registry
                .open(spec, &[])
                .map_err(|e| format!("{spec}: {e}"))?;
            if let Some(h) = booted_from {
                let line = first_block(&mut device, false, &word(h.generation))
                    .map_err(|e| format!("{spec}: {e}"))?;
                seen = format!("{seen}; {spec}: {} {line}", word(h.generation));
            }
            first_block(&mut device, true, &word(generation))
                .map_err(|e| format!("{spec}: {e}"))?;
            opened.push(device);
        }
        // As `control::upgrade` does before the jump, with the disks still open (as the
        // vbds keep theirs): every write on the medium, then no device left running
        // into memory the next image reuses.
        let deadline = crate::devices::shutdown::flush_deadline_ns(0);
        let flushed = registry.flush(opened.iter_mut(), deadline);
        let stopped = registry.quiesce();
        if let Some(line) = flushed.given_up.first().or(stopped.given_up.first()) {
            return Err(format!("devices not stopped: {line}"));
        }
        seen = format!("{seen}; {} device(s) stopped", stopped.stopped);
    }
    // The disk stays with the registry (and the registry with this image): nothing is
    // given back before the jump.
    core::mem::forget(disk);
    core::mem::forget(opened);
    core::mem::forget(registry);
    Ok(seen)
}
