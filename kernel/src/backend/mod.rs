//! The block backend service. The control path (on vCPU 0, between polls) watches our
//! `backend/vbd` directory in xenstore; for each device the toolstack creates it parses
//! `params`, makes the backing store, and runs the blkif negotiation from the `blkback`
//! crate. On connect each queue's ring is mapped, its event channel bound, and its
//! engine handed to the poller of vCPU `q mod n`; on disconnect the pollers drain and
//! release them. A device whose configuration is wrong fails alone: the reason goes to
//! its `hotplug-error`/`error` nodes and the console, and the others keep serving.

pub mod adapters;
mod control;
pub mod disk;
mod error;
pub mod grants;
pub mod poller;
mod registry;
mod registrytest;
pub mod space;
mod vbd;
pub use vbd::set_persistent_grants;

use control::Control;
pub use registrytest::registry_test;

use crate::xen_domain;

/// Starts a poller on every other vCPU and runs vCPU 0's (with the control path).
pub fn serve(hole: machine::frames::PhysRange, bus: crate::devices::open::PciBus) -> ! {
    let rings = space::init(hole);
    log::info!(
        "blkback: map space {:#x}-{:#x} ({} MiB, {} rings)",
        hole.start,
        hole.end,
        hole.len() >> 20,
        rings
    );
    for cpu in 1..crate::smp::online_count() {
        if crate::smp::start_on(cpu, start_poller).is_err() {
            log::error!("blkback: vCPU {cpu} did not take its poller");
        }
    }
    xen_domain::control::listen();
    let mut control = Control::new(bus);
    if control.is_none() {
        log::error!("blkback: no xenstore control path: serving nothing");
    }
    log::info!("{}", crate::READY_MARKER);
    poller::run(
        0,
        control.as_mut().map(|c| c as &mut dyn poller::ControlWork),
    )
}

fn start_poller(cpu: usize) {
    poller::run(cpu, None)
}
