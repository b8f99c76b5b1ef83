// SPDX-License-Identifier: MIT OR Apache-2.0
//! blkdom: a Xen block-backend driver domain, as one PVH-bootable image.
//!
//! Boot order: console and log first (so everything after can report), then the
//! descriptor tables and traps (so faults are reported, not silent resets), then memory
//! and the heap, then ACPI power control; then either a test hook (an image built with the
//! `test-hooks` feature: `hooks`) or normal service.
#![no_std]
#![no_main]

extern crate alloc;
// The PVH entry lives in `boot` and is reached only through the linker script's ENTRY.
extern crate boot;

mod arch;
mod backend;
mod bootinfo;
mod console;
mod devices;
mod firmware;
mod handoff;
mod hooks;
mod logger;
mod mm;
#[cfg(feature = "test-hooks")]
mod nettest;
mod physmem;
mod power;
#[cfg(feature = "test-hooks")]
mod selftest;
mod smp;
mod version;
mod xen_domain;

use boot::start_info::memmap_type_name;
use bootconfig::{Cmdline, Config};
use log::{error, info, warn, LevelFilter};
use machine::hypervisor::Hypervisor;
use polling::idle::{PollIdle, EMULATED_PAUSE_NS};
use xen::tsc::Cost;

/// Printed once the kernel is ready; the test runners and the nested rig wait for it.
pub const READY_MARKER: &str = "blkdom: up";

#[no_mangle]
pub extern "C" fn kernel_main(start_info_paddr: u64) -> ! {
    let hypervisor = arch::cpu::detect_hypervisor();
    console::init(hypervisor.is_xen());
    power::set_under_xen(hypervisor.is_xen());
    logger::init(LevelFilter::Info);

    let info = match bootinfo::BootInfo::read(start_info_paddr) {
        Ok(info) => bootinfo::keep(info),
        Err(e) => {
            error!("no usable hvm_start_info at {start_info_paddr:#x}: {e}");
            power::crash("bad boot information");
        }
    };
    // The command line, read once: from here on each setting goes to the code it tunes.
    let cmdline = Cmdline::new(info.cmdline());
    let (mut config, bad_values) = Config::parse(&cmdline);
    if let Some(level) = config.log_level {
        log::set_max_level(level);
    }

    match version::build_id() {
        Some(id) => info!("blkdom {} build {id} starting", env!("CARGO_PKG_VERSION")),
        None => info!(
            "blkdom {} starting (no build id)",
            env!("CARGO_PKG_VERSION")
        ),
    }
    log_hypervisor(&hypervisor);
    info!(
        "command line: \"{}\"{}",
        cmdline.as_str(),
        if info.cmdline_truncated {
            " (truncated)"
        } else {
            ""
        }
    );
    // Each refused value keeps its default; the others apply.
    for bad in bad_values.iter() {
        if bad.is_warning() {
            warn!("{bad}");
        } else {
            error!("{bad}");
        }
    }
    info!(
        "start info at {:#x}: version {}, {} modules, rsdp {:#x}",
        start_info_paddr,
        info.start_info.version,
        info.start_info.nr_modules,
        info.start_info.rsdp_paddr
    );
    log_memory_map(info);

    arch::gdt::init_boot_cpu();
    arch::trap::load_idt();
    arch::apic::mask_legacy_pic();
    smp::init_boot_cpu();

    // Booted from a live upgrade: the old image's handover block, one of our modules.
    let handover_module = handoff::find_module(info);
    let memory = match mm::init(info, handover_module) {
        Ok(report) => report,
        Err(e) => {
            error!("memory set-up failed: {e:?}");
            power::crash("no memory");
        }
    };
    info!(
        "memory: {} MiB RAM, image {:#x}-{:#x} ({} KiB), heap {} MiB at {:#x}, \
         RAM disk stripes {} MiB, {} MiB free",
        memory.ram_bytes >> 20,
        memory.image.start,
        memory.image.end,
        memory.image.len() / 1024,
        memory.heap_bytes >> 20,
        memory.heap_start,
        memory.stripe_bytes >> 20,
        mm::free_frame_bytes() >> 20
    );
    info!(
        "memory: {:#x}-{:#x} kept free for a live upgrade's next image",
        memory.image.end, memory.load_window.end
    );
    if let Some((ranges, bytes)) = memory.kept {
        info!(
            "memory: {ranges} ranges ({} KiB) kept as the handover lists them",
            bytes / 1024
        );
    }
    let handover = match (handover_module, memory.kept) {
        (Some(module), Some(_)) => handoff::adopt(info, module, smp::MAX_CPUS),
        _ => None,
    };
    if let Some(h) = handover {
        let bytes = mm::add_handed_stripes(h);
        if bytes > 0 {
            info!(
                "memory: {} MiB of handed-over RAM disk stripes",
                bytes >> 20
            );
        }
    }
    arch::copy::calibrate();
    log_grant_limits(&config.grants);
    log_device_timeout(config.device_timeout_ns, config.device_max_resets);

    let firmware = firmware::Firmware::read(info.start_info.rsdp_paddr);
    match power::init(&firmware) {
        Ok(power) => info!("acpi: PM1a control at port {:#x}", power.pm1a_control_port),
        Err(e) => info!("acpi: no power-off register ({e:?})"),
    }

    // What a PAUSE costs here (timed at boot): the pollers' default idle.
    let mut pause = Cost::Unknown;
    if hypervisor.is_xen() {
        let adopt = handover
            .filter(|h| !h.vcpu_info.is_empty())
            .map(|h| (h.shared_info, h.vcpu_info[0]));
        if handover.is_some() && adopt.is_none() {
            error!("upgrade: the handover has no vcpu_info under Xen; registering afresh");
        }
        match xen_domain::init(adopt) {
            Ok(xen) => {
                info!(
                    "xen: shared_info mapped, vcpu_info registered, event upcalls on vector {:#x} ({:?})",
                    xen_domain::events::UPCALL_VECTOR,
                    xen.upcall_mode.get()
                );
                let tsc_khz = match hypervisor {
                    Hypervisor::Xen { base_leaf, .. } => {
                        xen_domain::cpuid(base_leaf).map_or(0, |leaves| leaves.tsc_khz)
                    }
                    _ => 0,
                };
                let costs = xen_domain::measure_costs(xen, tsc_khz);
                pause = costs.pause;
                match costs.rate {
                    Some(rate) => info!(
                        "xen: costs: rdtsc {}, pause {}, hypercall {} ({rate})",
                        costs.rdtsc, costs.pause, costs.hypercall
                    ),
                    None => warn!(
                        "xen: costs: rdtsc, pause and hypercall unknown (Xen's CPUID time \
                         leaf gives 0 kHz and our vcpu_time_info no rate yet)"
                    ),
                }
            }
            Err(e) => error!("xen: platform set-up failed: {e}"),
        }
        match xen_domain::store::init() {
            Ok(()) if handover.is_some() => {
                // The old image's watches are xenstored's until dropped; ours come later.
                match xen_domain::store::with(|xs| xs.reset_watches()) {
                    Some(Ok(n)) => info!(
                        "upgrade: the previous image's xenstore watches dropped ({n} of their \
                         events forgotten)"
                    ),
                    Some(Err(e)) => error!("upgrade: XS_RESET_WATCHES failed: {e:?}"),
                    None => {}
                }
                log_identity()
            }
            Ok(()) => log_identity(),
            Err(e) => error!("xen: no xenstore: {e}"),
        }
    }
    match handover {
        Some(h) => {
            handoff::release_parked(h);
            info!("cpu: {} CPUs online", smp::online_count());
        }
        None => start_cpus(&hypervisor, &firmware),
    }
    // Configuration space, said once; the bus is walked on first use and kept.
    #[allow(unused_mut)] // the test image's network test borrows it
    let mut bus = devices::open::PciBus::new(&firmware);

    // A test hook named on the command line runs instead of the service, and powers off.
    #[cfg(feature = "test-hooks")]
    if let Some(spec) = cmdline.value(bootconfig::Key::Nettest) {
        match grant_map_hole(info, &mut bus) {
            Some(hole) => nettest::run(spec, &cmdline, &config, hole.start),
            None => error!("nettest: no hole in the memory map for the grant table"),
        }
    }
    let mut bus = hooks::run(&cmdline, &config, hypervisor.is_xen(), bus);

    if hypervisor.is_xen() && xen_domain::get().is_some() {
        match grant_map_hole(info, &mut bus) {
            Some(hole) => {
                // `auto` is settled here, before any poller starts: by what a PAUSE costs.
                config.poller.idle.get_or_insert_with(|| {
                    let idle = PollIdle::for_pause_cost(pause.ns());
                    info!(
                        "poll.idle: {} (auto: a PAUSE costs {pause} here; above \
                         {EMULATED_PAUSE_NS} ns it is emulated, and a spinning poller looks \
                         again without one)",
                        idle.name(),
                    );
                    idle
                });
                backend::serve(hole, bus, &config)
            }
            None => error!("blkback: no hole in the memory map for grant mappings"),
        }
    }
    info!("{READY_MARKER}");
    if hypervisor.is_xen() {
        info!("not serving (see the errors above); idle");
        loop {
            x86_64::instructions::interrupts::enable_and_hlt();
        }
    }
    power::power_off();
}

/// Says what the grant limits (`grants.*`) allow.
fn log_grant_limits(limits: &blkback::budget::GrantLimits) {
    info!(
        "grants: at most {} persistent grants mapped by all rings together, {} by one ring",
        limits.max_total, limits.max_per_ring
    );
    let in_flight = blkback::budget::InFlightLimits::DEFAULT;
    info!(
        "grants: at most {} grants mapped for requests in flight by all rings together, {} by \
         one ring (a ring at its share leaves requests waiting in its ring)",
        in_flight.total, in_flight.per_ring
    );
    match limits.idle_secs {
        0 => info!("grants: unused persistent grants stay mapped (grants.idle-s=0)"),
        secs => info!("grants: persistent grants unused for {secs} s are unmapped"),
    }
}

/// Says what the device deadline (`device.timeout-ms=`) and recovery
/// (`device.max-resets=`) do.
fn log_device_timeout(ns: u64, max_resets: u32) {
    match (ns, max_resets) {
        (0, _) => info!("devices: commands have no deadline (device.timeout-ms=0)"),
        (ns, 0) => info!(
            "devices: a command not completed in {} ms fails and stops its device \
             (device.max-resets=0)",
            ns / 1_000_000
        ),
        (ns, resets) => info!(
            "devices: a command not completed in {} ms is aborted, and its device reset if \
             that does not bring it back; a device given up after {resets} resets in a row",
            ns / 1_000_000
        ),
    }
}

/// Where foreign grants get mapped: the largest stretch below 4 GiB (identity mapped)
/// that the memory map does not use, at or above 1 GiB so RAM growth cannot meet it.
fn grant_map_hole(
    info: &bootinfo::BootInfo,
    bus: &mut devices::open::PciBus,
) -> Option<machine::frames::PhysRange> {
    use machine::frames::{largest_hole, PhysRange};
    let used: alloc::vec::Vec<PhysRange> = info
        .memmap()
        .iter()
        .map(|e| PhysRange::new(e.addr, e.addr.saturating_add(e.size)))
        .collect();
    let ram_end = info
        .memmap()
        .iter()
        .filter(|e| e.kind == boot::start_info::memmap_type::RAM && e.addr < (1 << 32))
        .map(|e| e.addr.saturating_add(e.size))
        .fold(0, u64::max);
    let low = ram_end.max(1 << 30);
    // Stay clear of the 0xF0000000+ area where Xen and firmware put special pages, and,
    // booted as HVM, of the PCI hole: the memory map leaves it out, so only the BARs
    // show where it starts (hvmloader lowers it from 0xF0000000 when BARs need room).
    // Addresses only (one configuration read per BAR register): sizing a BAR takes
    // several accesses, each a VM exit, too many for every BAR of every device at boot.
    let bars = bus.memory_bar_addresses();
    let lowest_bar = bars
        .iter()
        .copied()
        .filter(|&address| address < (1 << 32))
        .min();
    let high = lowest_bar.map_or(0xf000_0000, |bar| bar.min(0xf000_0000));
    if !bars.is_empty() {
        info!(
            "blkback: {} PCI memory BARs, the lowest at {:#x}: map space ends there",
            bars.len(),
            lowest_bar.unwrap_or(0)
        );
    }
    largest_hole(&used, low, high, 2 << 20)
}

/// Brings up every CPU the MADT lists as enabled.
fn start_cpus(hypervisor: &Hypervisor, firmware: &firmware::Firmware) {
    let madt = firmware
        .rsdp
        .and_then(|rsdp| firmware::madt::<{ smp::MAX_CPUS }>(&rsdp));
    let madt = match madt {
        Ok(madt) => madt,
        Err(e) => {
            warn!("cpu: no MADT ({e:?}); running on the boot CPU only");
            return;
        }
    };
    arch::apic::set_base(madt.local_apic_address);
    let listed = madt.enabled_cpus().count();
    let started = if hypervisor.is_xen() {
        let apic_ids: alloc::vec::Vec<u32> = madt.enabled_cpus().map(|c| c.apic_id).collect();
        xen_domain::vcpus::start(&apic_ids)
    } else {
        smp::start_aps_with_sipi(madt.enabled_cpus().map(|c| c.apic_id))
    };
    info!("cpu: {} of {} CPUs online", smp::online_count(), listed);
    if started + 1 < listed {
        warn!("cpu: {} CPUs did not start", listed - started - 1);
    }
}

/// Our domain id and name, as xenstore has them.
fn log_identity() {
    let identity = xen_domain::store::with(|xs| {
        use xen::xenbus::keys::{DOMID, NAME};
        let tx = xen::xenstore::Transaction::NONE;
        (xs.read_string(tx, DOMID), xs.read_string(tx, NAME))
    });
    let build = match version::build_id() {
        Some(id) => alloc::format!("{} {id}", env!("CARGO_PKG_VERSION")),
        None => alloc::format!("{} unknown", env!("CARGO_PKG_VERSION")),
    };
    let tx = xen::xenstore::Transaction::NONE;
    if let Some(Err(e)) =
        xen_domain::store::with(|xs| xs.write(tx, blkback::keys::BUILD, build.as_bytes()))
    {
        warn!("xen: {} not written: {e:?}", blkback::keys::BUILD);
    }
    match identity {
        Some((Ok(domid), Ok(name))) => info!("xen: this is domain {domid}, named \"{name}\""),
        Some((domid, name)) => warn!("xen: identity from xenstore: domid {domid:?}, name {name:?}"),
        None => {}
    }
}

fn log_hypervisor(hypervisor: &Hypervisor) {
    let vendor = arch::cpu::vendor();
    let vendor = core::str::from_utf8(&vendor).unwrap_or("?");
    match hypervisor {
        Hypervisor::Xen {
            base_leaf,
            max_leaf,
        } => {
            let version = arch::cpu::cpuid(base_leaf + 1, 0).eax;
            info!(
                "hypervisor: Xen {}.{} (CPUID leaves {:#x}..={:#x}), cpu {}",
                version >> 16,
                version & 0xffff,
                base_leaf,
                max_leaf,
                vendor
            );
        }
        other => info!(
            "hypervisor: {} (plain QEMU or bare metal: no Xen services), cpu {}",
            other.name(),
            vendor
        ),
    }
}

fn log_memory_map(info: &bootinfo::BootInfo) {
    info!("memory map: {} entries", info.memmap().len());
    for entry in info.memmap() {
        info!(
            "  {:#014x}-{:#014x} {:>9} KiB {}",
            entry.addr,
            entry.addr.saturating_add(entry.size),
            entry.size / 1024,
            memmap_type_name(entry.kind)
        );
    }
    if info.memmap_dropped > 0 {
        warn!(
            "memory map: {} entries beyond the first {} ignored",
            info.memmap_dropped,
            info.memmap().len()
        );
    }
}

#[panic_handler]
fn panic(panic_info: &core::panic::PanicInfo) -> ! {
    error!("panic: {panic_info}");
    power::crash("panic");
}
