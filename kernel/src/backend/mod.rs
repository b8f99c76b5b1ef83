// SPDX-License-Identifier: MIT OR Apache-2.0
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
pub mod net;
pub mod poller;
mod registry;
#[cfg(feature = "test-hooks")]
mod registrytest;
pub mod space;
mod upgrade;
mod vbd;

use bootconfig::{Config, PollerConfig};
use control::Control;
#[cfg(feature = "test-hooks")]
pub use registrytest::registry_test;
#[cfg(feature = "test-hooks")]
mod upgradetest;
#[cfg(feature = "test-hooks")]
pub use control::FAIL_SWITCH;
#[cfg(feature = "test-hooks")]
pub use upgradetest::carry_ram_disk;

use crate::xen_domain;

/// How the pollers of the other vCPUs run: set once, from the command line, before they
/// start. `smp::start_on` hands a vCPU a bare function (its mailbox holds one word), so
/// they find it here rather than as an argument.
static POLLER_CONFIG: spin::Once<PollerConfig> = spin::Once::new();

/// Starts a poller on every other vCPU and runs vCPU 0's (with the control path), as
/// `config` says.
pub fn serve(
    mut hole: machine::frames::PhysRange,
    bus: crate::devices::open::PciBus,
    config: &Config,
) -> ! {
    // The vif's grant table frames come out of the map hole before the rings take it.
    let net = storage_network(&mut hole, config);
    let rings = space::init(hole);
    log::info!(
        "blkback: map space {:#x}-{:#x} ({} MiB, {} rings)",
        hole.start,
        hole.end,
        hole.len() >> 20,
        rings
    );
    let pollers = POLLER_CONFIG.call_once(|| config.poller);
    for cpu in 1..crate::smp::online_count() {
        if crate::smp::start_on(cpu, start_poller).is_err() {
            log::error!("blkback: vCPU {cpu} did not take its poller");
        }
    }
    xen_domain::control::listen();
    let mut control = Control::new(bus, config, net);
    if control.is_none() {
        log::error!("blkback: no xenstore control path: serving nothing");
    }
    log::info!("{}", crate::READY_MARKER);
    poller::run(
        0,
        control.as_mut().map(|c| c as &mut dyn poller::ControlWork),
        pollers,
    )
}

/// How long boot waits for a first DHCP lease (`net.ip=dhcp`) before it serves on
/// without: `nvme-tcp:` disks are refused until one comes.
pub const FIRST_LEASE_MS: u64 = 5_000;

/// The vif and its stack, when the command line gives blkdom an address (`net.ip`), or
/// why there is none: what `nvme-tcp:` disks are refused with.
fn storage_network(
    hole: &mut machine::frames::PhysRange,
    config: &Config,
) -> Result<net::Net, alloc::string::String> {
    let Some(address) = config.net else {
        return Err("no net.ip= on blkdom's command line".into());
    };
    // Carved on a 2 MiB boundary so the rings' regions keep theirs.
    const CARVE: u64 = 2 << 20;
    if hole.len() < 4 * CARVE {
        return Err("no room in the map hole for the vif's grant table".into());
    }
    let grant_gpa = hole.start;
    *hole = machine::frames::PhysRange::new(hole.start + CARVE, hole.end);
    let started = xen_domain::vif::Vif::now_ms();
    let vcpus = crate::smp::online_count();
    match xen_domain::vif::bring_up(&address, grant_gpa, vcpus) {
        Ok(mut vif) => {
            let nqn = config
                .host_nqn
                .as_ref()
                .map_or("none (net.hostnqn=)", |n| n.as_str());
            let took = xen_domain::vif::Vif::now_ms() - started;
            match address.fixed() {
                Some(fixed) => {
                    let [a, b, c, d] = fixed.address;
                    log::info!(
                        "net: vif connected to {} in {took} ms; {}; {a}.{b}.{c}.{d}/{}; host NQN {nqn}",
                        vif.info.backend,
                        vif.describe_queues(),
                        fixed.prefix,
                    );
                }
                None => {
                    log::info!(
                        "net: vif connected to {} in {took} ms; {}; address by DHCP; host NQN {nqn}",
                        vif.info.backend,
                        vif.describe_queues(),
                    );
                    // The lease line is logged by the vif's poll when it comes.
                    if !vif.await_address(FIRST_LEASE_MS) {
                        log::warn!(
                            "net: no DHCP lease within {} s: serving on; nvme-tcp: disks are \
                             refused until one comes (the client keeps asking)",
                            FIRST_LEASE_MS / 1000
                        );
                    }
                }
            }
            let digests = config.digests;
            if digests != nvmetcp::Digests::NONE {
                log::info!("net: NVMe/TCP connections ask for {digests} (CRC32C)");
                crate::arch::crc32c::calibrate();
            }
            Ok(net::Net::new(vif, config.host_nqn, digests))
        }
        Err(e) => {
            log::error!("net: the vif did not come up: {e}; nvme-tcp: disks are refused");
            Err(alloc::format!("the vif did not come up: {e}"))
        }
    }
}

fn start_poller(cpu: usize) {
    let config = POLLER_CONFIG
        .get()
        .expect("serve sets it before it starts pollers");
    poller::run(cpu, None, config)
}
