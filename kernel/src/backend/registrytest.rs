// SPDX-License-Identifier: MIT OR Apache-2.0
//! `registrytest=<step>;<step>;...`: the device registry's decisions, under plain QEMU
//! (tier 2), without Xen. A step `+<spec>` opens a disk as a vbd's `params` would and
//! keeps it; `-<n>` releases the disk of step `n` (counting the `+` steps from 0;
//! `testhooks::registry`). Each outcome is logged (`registrytest: +<spec>: <queues>
//! queue(s), <sectors> sectors: <description>` or `registrytest: +<spec>: refused:
//! <reason>`), then `registrytest: done`, and the domain powers off. `w<n>=<word>` and
//! `r<n>=<word>` write a word to the first block of a disk kept and check it is there
//! (`registrytest: r<n>=<word>: matches`, or `differs: ...`, which fails the test).

use super::disk::Disk;
use super::registry::Registry;
use crate::devices::open::PciBus;
use crate::devices::stopwatch;
use crate::power;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use blkdev::IoOp;
use log::{error, info};
use testhooks::registry::Step;

/// Writes `word` to the first block of `disk` (`write`), or checks the block holds it.
pub(super) fn first_block(
    disk: &mut Disk,
    write: bool,
    word: &str,
) -> Result<&'static str, String> {
    let mut queue = disk.take_queue(1).map_err(|e| format!("{e}"))?;
    let mut block = testhooks::registry::block_of(word);
    let op = if write { IoOp::Write } else { IoOp::Read };
    let done = crate::devices::region::first_block(&mut queue, op, &mut block);
    disk.give_back(queue);
    done?;
    if write {
        return Ok("written");
    }
    if block == testhooks::registry::block_of(word) {
        return Ok("matches");
    }
    let end = block.iter().position(|&b| b == 0).unwrap_or(64).min(64);
    Err(format!(
        "differs: the block holds {:?}",
        String::from_utf8_lossy(&block[..end])
    ))
}

pub fn registry_test(steps: &str, bus: PciBus) -> ! {
    // Opens and releases only: no device is recovered here.
    let mut registry = Registry::new(
        bus,
        cmdslots::RecoveryConfig::NEVER,
        Err("no network in this test".into()),
    );
    let mut disks: Vec<Option<Disk>> = Vec::new();
    let mut verdict = power::Verdict::Pass;
    for step in testhooks::registry::steps(steps) {
        match step {
            Step::Open(spec) => {
                stopwatch::start();
                let opened = registry.open(spec, &[]);
                if let Some(cost) = stopwatch::finish() {
                    // Not this module's target: tier 2 counts the lines naming it.
                    info!(target: "backend::registry", "registry: +{spec} took {cost}");
                }
                match opened {
                    Ok(disk) => {
                        info!(
                            "registrytest: +{spec}: {} queue(s), {} sectors: {}",
                            disk.max_queues(usize::MAX),
                            disk.geometry().sectors,
                            disk.describe()
                        );
                        disks.push(Some(disk));
                    }
                    Err(reason) => {
                        info!("registrytest: +{spec}: refused: {reason}");
                        disks.push(None);
                    }
                }
            }
            Step::Release(n) => match disks.get_mut(n).and_then(Option::take) {
                Some(disk) => {
                    registry.release(disk);
                    info!("registrytest: -{n}: released");
                }
                None => info!("registrytest: -{n}: no disk to release"),
            },
            Step::Write(n, word) | Step::Check(n, word) => {
                let write = matches!(step, Step::Write(..));
                let letter = if write { 'w' } else { 'r' };
                let Some(Some(disk)) = disks.get_mut(n) else {
                    error!("registrytest: {letter}{n}={word}: no disk {n}");
                    verdict = power::Verdict::Fail;
                    continue;
                };
                match first_block(disk, write, word) {
                    Ok(line) => info!("registrytest: {letter}{n}={word}: {line}"),
                    Err(why) => {
                        error!("registrytest: {letter}{n}={word}: {why}");
                        verdict = power::Verdict::Fail;
                    }
                }
            }
            Step::Bad(step) => {
                error!("registrytest: step {step:?} is neither +<spec>, -<n>, w<n>=<word> nor r<n>=<word>");
                verdict = power::Verdict::Fail;
            }
        }
    }
    for disk in disks.into_iter().flatten() {
        registry.release(disk);
    }
    info!("registrytest: done");
    power::report_verdict(verdict);
    power::power_off()
}
