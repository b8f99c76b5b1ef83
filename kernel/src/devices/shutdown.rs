// SPDX-License-Identifier: MIT OR Apache-2.0
//! The devices' part of a clean shutdown (`xl shutdown`, `xl reboot`; in the test image
//! also `disktest.shutdown`): each device written through is flushed through one of its
//! idle queues (those with a volatile write cache: an NVMe namespace of a controller
//! with VWC, a virtio-blk device with VIRTIO_BLK_F_FLUSH), then every device brought up
//! is told to stop: NVMe's normal shutdown notification (CC.SHN), a virtio reset. Each
//! step asks every device at once and waits for each within its own deadline
//! (`blkdev::shutdown`): a device that does not answer is given up and logged, and
//! holds up no other.

use super::hal;
use super::open::Devices;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use blkdev::shutdown::{self, Outcome, Stop};
use blkdev::BlockDevice;

/// The bound of each flush when commands have no deadline (`device.timeout-ms=0`): the
/// default device timeout.
const UNTIMED_FLUSH_NS: u64 = 30_000_000_000;

/// What a flush at shutdown may take, with commands given up after `device_timeout_ns`
/// (0: never): what any command may.
pub fn flush_deadline_ns(device_timeout_ns: u64) -> u64 {
    if device_timeout_ns > 0 {
        device_timeout_ns
    } else {
        UNTIMED_FLUSH_NS
    }
}

/// The kernel's clock for the shutdown's waits.
struct Clock;

impl shutdown::Clock for Clock {
    fn now_ns(&mut self) -> u64 {
        hal::now_ns()
    }
    fn relax(&mut self) {
        hal::delay_us(10);
    }
}

/// What the devices' shutdown came to.
#[derive(Default)]
pub struct Report {
    /// Flushes done (devices with no volatile write cache not counted).
    pub flushed: usize,
    /// Devices that said they stopped.
    pub stopped: usize,
    /// What did not answer or failed, one line each.
    pub given_up: Vec<String>,
}

impl Devices {
    /// Flushes the queue of each `(name, queue)` in `flush` (idle queues, one per device
    /// or namespace that was written through), giving each `flush_deadline_ns`, then
    /// tells every device brought up to stop, each within its own deadline. Logs every
    /// device's outcome. Nothing may use the devices afterwards.
    pub fn shut_down(
        &mut self,
        flush: Vec<(String, &mut dyn BlockDevice)>,
        flush_deadline_ns: u64,
    ) -> Report {
        let mut report = flush_queues(flush, flush_deadline_ns);
        let (names, mut devices): (Vec<String>, Vec<&mut dyn Stop>) =
            self.stoppable().into_iter().unzip();
        let stopped = shutdown::stop_all(&mut devices, &mut Clock);
        for (name, outcome) in names.iter().zip(stopped) {
            report.stopped += usize::from(report.note(name, outcome));
        }
        report
    }
}

impl Devices {
    /// A live upgrade's stop, just before the jump (docs/design.md §4.12): every device
    /// brought up is stopped without the shutdown notification (NVMe CC.EN = 0, virtio
    /// status 0), each within its own deadline, then its bus mastering is turned off and
    /// read back, so no DMA reaches memory the next image reuses. The next image brings
    /// them up as at boot. Nothing may use the devices afterwards.
    #[allow(
        dead_code,
        reason = "the jump calls it (not built yet: docs/design.md §4.12)"
    )]
    pub fn quiesce(&mut self) -> Report {
        let mut report = Report::default();
        let mut addresses = Vec::new();
        {
            let mut disables: Vec<nvme::Disable<'_, hal::DeviceHal>> = Vec::new();
            let mut names = Vec::new();
            for (address, controller) in self.nvme.iter_mut() {
                names.push(format!("nvme {address}: disable"));
                addresses.push(address);
                disables.push(nvme::Disable(controller));
            }
            let mut devices: Vec<&mut dyn Stop> =
                disables.iter_mut().map(|d| d as &mut dyn Stop).collect();
            for (address, device) in &mut self.virtio {
                names.push(format!("virtio-blk {address}: reset"));
                addresses.push(*address);
                devices.push(device);
            }
            let stopped = shutdown::stop_all(&mut devices, &mut Clock);
            for (name, outcome) in names.iter().zip(stopped) {
                report.stopped += usize::from(report.note(name, outcome));
            }
        }
        for address in addresses {
            if !self.bus.bus_mastering_off(address) {
                report
                    .given_up
                    .push(format!("pci {address}: bus mastering still on"));
            }
        }
        report
    }
}

/// Flushes the queue of each `(name, queue)` in `flush`, giving each
/// `flush_deadline_ns` (a shutdown's first step, and a live upgrade's after its drain:
/// the devices go on serving).
pub fn flush_queues(flush: Vec<(String, &mut dyn BlockDevice)>, flush_deadline_ns: u64) -> Report {
    flush_queues_with(flush, flush_deadline_ns, &mut Clock)
}

/// As [`flush_queues`], with `relax` run between two looks at the queues: what moves a
/// remote namespace's flush on (the network, driven by this vCPU).
pub fn flush_queues_relaxing(
    flush: Vec<(String, &mut dyn BlockDevice)>,
    flush_deadline_ns: u64,
    relax: &mut dyn FnMut(),
) -> Report {
    struct Relaxing<'a>(&'a mut dyn FnMut());
    impl shutdown::Clock for Relaxing<'_> {
        fn now_ns(&mut self) -> u64 {
            hal::now_ns()
        }
        fn relax(&mut self) {
            (self.0)()
        }
    }
    flush_queues_with(flush, flush_deadline_ns, &mut Relaxing(relax))
}

fn flush_queues_with(
    flush: Vec<(String, &mut dyn BlockDevice)>,
    flush_deadline_ns: u64,
    clock: &mut dyn shutdown::Clock,
) -> Report {
    let mut report = Report::default();
    let (names, mut queues): (Vec<String>, Vec<&mut dyn BlockDevice>) = flush.into_iter().unzip();
    let flushed = shutdown::flush_all(&mut queues, flush_deadline_ns, clock);
    for (name, outcome) in names.iter().zip(flushed) {
        report.flushed += usize::from(report.note(&format!("{name}: flush"), outcome));
    }
    report
}

impl Report {
    /// Logs what became of `what`, notes it if given up; whether it was done.
    fn note(&mut self, what: &str, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Done { .. } => {
                log::info!("shutdown: {what} {outcome}");
                return true;
            }
            Outcome::NotNeeded => {
                log::info!("shutdown: {what} not needed (no volatile write cache)")
            }
            Outcome::Failed(_) | Outcome::GivenUp { .. } => {
                log::error!("shutdown: {what} {outcome}");
                self.given_up.push(format!("{what} {outcome}"));
            }
        }
        false
    }
}
