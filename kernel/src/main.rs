//! blkdom: a Xen block-backend driver domain, as one PVH-bootable image.
//!
//! Boot order: console and log first (so everything after can report), then the
//! descriptor tables and traps (so faults are reported, not silent resets), then memory
//! and the heap, then ACPI power control; then either the self-tests or normal service.
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
mod logger;
mod mm;
mod physmem;
mod power;
mod selftest;
mod smp;
mod xen_domain;

use boot::start_info::memmap_type_name;
use log::{error, info, warn, LevelFilter};
use machine::cmdline::{Cmdline, PollIdle};
use machine::hypervisor::Hypervisor;
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
        Ok(info) => info,
        Err(e) => {
            error!("no usable hvm_start_info at {start_info_paddr:#x}: {e}");
            power::crash("bad boot information");
        }
    };
    let cmdline = Cmdline::new(info.cmdline());
    match cmdline.log_level() {
        Ok(Some(level)) => log::set_max_level(level),
        Ok(None) => {}
        Err(bad) => {
            warn!("loglevel={bad} not understood (use off|error|warn|info|debug|trace or 0..5)")
        }
    }

    info!("blkdom {} starting", env!("CARGO_PKG_VERSION"));
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
    info!(
        "start info at {:#x}: version {}, {} modules, rsdp {:#x}",
        start_info_paddr,
        info.start_info.version,
        info.start_info.nr_modules,
        info.start_info.rsdp_paddr
    );
    log_memory_map(&info);

    arch::gdt::init_boot_cpu();
    arch::trap::load_idt();
    arch::apic::mask_legacy_pic();
    smp::init_boot_cpu();

    let memory = match mm::init(&info) {
        Ok(report) => report,
        Err(e) => {
            error!("memory set-up failed: {e:?}");
            power::crash("no memory");
        }
    };
    info!(
        "memory: {} MiB RAM, image {:#x}-{:#x} ({} KiB), heap {} MiB at {:#x}, {} MiB free",
        memory.ram_bytes >> 20,
        memory.image.start,
        memory.image.end,
        memory.image.len() / 1024,
        memory.heap_bytes >> 20,
        memory.heap_start,
        mm::free_frame_bytes() >> 20
    );
    arch::copy::calibrate();
    backend::grants::configure(grant_limits(&cmdline));
    devices::set_device_timeout_ns(device_timeout_ns(&cmdline));

    let selftest = cmdline.has("selftest");
    let firmware = firmware::Firmware::read(info.start_info.rsdp_paddr);
    match power::init(&firmware) {
        Ok(power) => info!("acpi: PM1a control at port {:#x}", power.pm1a_control_port),
        Err(e) => info!("acpi: no power-off register ({e:?})"),
    }

    // What a PAUSE costs here (timed at boot): the pollers' default idle.
    let mut pause = Cost::Unknown;
    if hypervisor.is_xen() {
        match xen_domain::init() {
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
            Ok(()) => log_identity(),
            Err(e) => error!("xen: no xenstore: {e}"),
        }
    }
    start_cpus(&hypervisor, &firmware);
    // Configuration space, said once; the bus is walked on first use and kept.
    let mut bus = devices::open::PciBus::new(&firmware);

    if let Some(what) = cmdline.value("crashtest") {
        crash_test(what);
    }
    if let Some(spec) = cmdline.value("disktest") {
        devices::disk_test(spec, &cmdline, bus);
    }
    if let Some(spec) = cmdline.value("faulttest") {
        devices::fault_test(spec, &cmdline, bus);
    }
    if let Some(steps) = cmdline.value("registrytest") {
        backend::registry_test(steps, bus);
    }
    if selftest {
        let expected_cpus = cmdline
            .value("selftest.expect-cpus")
            .and_then(|n| n.parse().ok());
        let (_, failed) = selftest::run(
            cmdline.has("selftest.inject-failure"),
            expected_cpus,
            hypervisor.is_xen(),
            cmdline.has("selftest.await-dom0"),
        );
        power::report_verdict(if failed == 0 {
            power::Verdict::Pass
        } else {
            power::Verdict::Fail
        });
        power::power_off();
    }

    if hypervisor.is_xen() && xen_domain::get().is_some() {
        match grant_map_hole(&info, &mut bus) {
            Some(hole) => {
                match cmdline.spin_window_us() {
                    Ok(Some((min, max))) => backend::poller::set_spin_window(min * 1000, max * 1000),
                    Ok(None) => {}
                    Err(text) => error!(
                        "poll.spin-us={text}: want <min>-<max> microseconds, 0 < min <= max <= {}; using the defaults",
                        machine::cmdline::MAX_SPIN_US
                    ),
                }
                let idle = cmdline.poll_idle().unwrap_or_else(|text| {
                    error!("poll.idle={text}: want auto, pause, yield or spin; using auto");
                    None
                });
                backend::poller::set_idle(idle.unwrap_or_else(|| {
                    let idle = PollIdle::for_pause_cost(pause.ns());
                    info!(
                        "poll.idle: {} (auto: a PAUSE costs {pause} here; above {} ns it is \
                         emulated, and a spinning poller looks again without one)",
                        idle.name(),
                        machine::cmdline::EMULATED_PAUSE_NS
                    );
                    idle
                }));
                match cmdline.persistent_grants() {
                    Ok(Some(offer)) => backend::set_persistent_grants(offer),
                    Ok(None) => {}
                    Err(text) => error!("grants.persistent={text}: want on or off; using on"),
                }
                match cmdline.notify_hold_us() {
                    Ok(Some(us)) => backend::poller::set_notify_hold(us * 1000),
                    Ok(None) => {}
                    Err(text) => error!(
                        "notify.hold-us={text}: want microseconds, 0 (never) to {}; using the default ({} us)",
                        machine::cmdline::MAX_NOTIFY_HOLD_US,
                        machine::cmdline::DEFAULT_NOTIFY_HOLD_US
                    ),
                }
                backend::serve(hole, bus)
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

/// The grant limits (`grants.max-total=`, `grants.max-per-ring=`, `grants.idle-s=`): each
/// bad value is reported and its default kept; the others still apply.
fn grant_limits(cmdline: &Cmdline<'_>) -> blkback::budget::GrantLimits {
    let limits = blkback::budget::GrantLimits::from_command_line(
        |key, max| cmdline.number_up_to(key, max),
        |bad| error!("{bad}"),
    );
    info!(
        "grants: at most {} persistent grants mapped by all rings together, {} by one ring",
        limits.max_total, limits.max_per_ring
    );
    match limits.idle_secs {
        0 => info!("grants: unused persistent grants stay mapped (grants.idle-s=0)"),
        secs => info!("grants: persistent grants unused for {secs} s are unmapped"),
    }
    limits
}

/// The device deadline (`device.timeout-ms=`, ns; 0: none): a bad value is reported and
/// the default kept.
fn device_timeout_ns(cmdline: &Cmdline<'_>) -> u64 {
    let default = blkback::engine::DEFAULT_DEVICE_TIMEOUT_NS;
    let ns = match cmdline.device_timeout_ms() {
        Ok(None) => default,
        Ok(Some(ms)) => ms * 1_000_000,
        Err(text) => {
            error!(
                "device.timeout-ms={text}: want a whole number of milliseconds 0..={}; using {}",
                machine::cmdline::MAX_DEVICE_TIMEOUT_MS,
                default / 1_000_000
            );
            default
        }
    };
    match ns {
        0 => info!("devices: commands have no deadline (device.timeout-ms=0)"),
        ns => info!(
            "devices: a command not completed in {} ms fails and stops its device",
            ns / 1_000_000
        ),
    }
    ns
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
    // Addresses only (one configuration read per BAR register): sizing every BAR of
    // every device took 14 s of a loaded nested rig's boot.
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
        let tx = xen::xenstore::Transaction::NONE;
        (xs.read_string(tx, "domid"), xs.read_string(tx, "name"))
    });
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

/// `crashtest=page-fault|panic|hang`: fail on purpose, so the runners can check that a
/// fault is reported and stops the kernel, and that a hang is cut off by the timeout.
fn crash_test(what: &str) {
    warn!("crashtest={what}: failing on purpose");
    match what {
        "page-fault" => {
            // SAFETY: deliberately reads an address no page table maps; the page-fault
            // handler reports it and stops the kernel, so the read never returns.
            let value = unsafe { core::ptr::read_volatile(0x0000_7fff_0bad_0000 as *const u64) };
            error!("read of an unmapped address returned {value:#x}");
        }
        "panic" => panic!("crashtest panic"),
        "hang" => arch::cpu::halt_forever(),
        other => warn!("crashtest={other} unknown (page-fault|panic|hang); ignored"),
    }
}

#[panic_handler]
fn panic(panic_info: &core::panic::PanicInfo) -> ! {
    error!("panic: {panic_info}");
    power::crash("panic");
}
