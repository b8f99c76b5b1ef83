// SPDX-License-Identifier: MIT OR Apache-2.0
//! `registrytest=<step>;<step>;...`: the device registry's decisions, under plain QEMU
//! (tier 2), without Xen. A step `+<spec>` opens a disk as a vbd's `params` would and
//! keeps it; `-<n>` releases the disk of step `n` (counting the `+` steps from 0;
//! `testhooks::registry`). Each outcome is logged (`registrytest: +<spec>: <queues>
//! queue(s), <sectors> sectors: <description>` or `registrytest: +<spec>: refused:
//! <reason>`), then `registrytest: done`, and the domain powers off.

use super::disk::Disk;
use super::registry::Registry;
use crate::devices::open::PciBus;
use crate::devices::stopwatch;
use crate::power;
use alloc::vec::Vec;
use log::{error, info};
use testhooks::registry::Step;

pub fn registry_test(steps: &str, bus: PciBus) -> ! {
    // Opens and releases only: no device is recovered here.
    let mut registry = Registry::new(bus, cmdslots::RecoveryConfig::NEVER);
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
            Step::Bad(step) => {
                error!("registrytest: step {step:?} is neither +<spec> nor -<n>");
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
