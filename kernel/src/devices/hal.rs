// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the device drivers need from the machine: PCI configuration access (ECAM from
//! the MCFG, or ports 0xCF8/0xCFC), uncached mappings of device registers, DMA memory,
//! and a microsecond clock calibrated against the PIT.

use crate::arch::paging::{self, MapError};
use crate::physmem;
use blkdev::DmaRegion;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use machine::acpi::{self, EcamWindow};
use pci::{ConfigAccess, PciAddress};
use x86_64::instructions::port::Port;
use x86_64::structures::paging::PageTableFlags;

/// Virtual addresses for device registers: ECAM windows first, BARs after.
const ECAM_VIRT: u64 = 0x0000_5000_0000_0000;
const BAR_VIRT: u64 = 0x0000_5001_0000_0000;
static NEXT_BAR_VIRT: AtomicU64 = AtomicU64::new(BAR_VIRT);
pub const PAGE: u64 = 4096;

fn mmio_flags() -> PageTableFlags {
    let mut flags =
        PageTableFlags::WRITABLE | PageTableFlags::NO_CACHE | PageTableFlags::WRITE_THROUGH;
    let efer = x86_64::registers::model_specific::Efer::read();
    if efer.contains(x86_64::registers::model_specific::EferFlags::NO_EXECUTE_ENABLE) {
        flags |= PageTableFlags::NO_EXECUTE;
    }
    flags
}

/// Device registers mapped uncached by [`map_mmio`]: `len` bytes at virtual `base`.
/// Only `map_mmio` makes one, so an access inside a window reaches that device's
/// registers and nothing else.
#[derive(Clone, Copy, Debug)]
pub struct MmioWindow {
    base: u64,
    len: u64,
}

impl MmioWindow {
    const EMPTY: MmioWindow = MmioWindow { base: 0, len: 0 };

    /// Virtual address of the window's first byte.
    pub fn address(&self) -> u64 {
        self.base
    }

    /// Whether the `size`-byte register at virtual `address` lies inside, naturally
    /// aligned.
    fn holds(&self, address: u64, size: u64) -> bool {
        address.is_multiple_of(size)
            && address
                .checked_sub(self.base)
                .and_then(|offset| offset.checked_add(size))
                .is_some_and(|end| end <= self.len)
    }
}

/// Maps `size` bytes of device registers at physical `phys` uncached; returns the
/// window, which starts at the virtual address of `phys`.
pub fn map_mmio(phys: u64, size: u64) -> Result<MmioWindow, MapError> {
    let first = phys & !(PAGE - 1);
    let pages = (phys + size.max(1)).div_ceil(PAGE) - first / PAGE;
    let virt = NEXT_BAR_VIRT.fetch_add((pages + 1) * PAGE, Ordering::Relaxed);
    for page in 0..pages {
        paging::map_page(virt + page * PAGE, first + page * PAGE, mmio_flags())?;
    }
    Ok(MmioWindow {
        base: virt + (phys - first),
        len: size,
    })
}

/// Configuration space through ports 0xCF8/0xCFC (the first 256 bytes only).
#[derive(Clone, Copy)]
pub struct PortConfig;

/// The address/data port pair is one shared register: one access at a time.
static PORT_LOCK: spin::Mutex<()> = spin::Mutex::new(());

/// Configuration-space accesses (reads and writes of 32 bits) since boot: each is a VM
/// exit, and under Xen's HVM a round trip to the device model in dom0.
static CONFIG_ACCESSES: AtomicU64 = AtomicU64::new(0);

/// Configuration-space accesses since boot (`devices::stopwatch` takes differences).
pub fn config_accesses() -> u64 {
    CONFIG_ACCESSES.load(Ordering::Relaxed)
}

/// Device register accesses made on vCPU 0 (the control path's) while a stopwatch runs
/// (`count_registers`). The pollers' doorbells pay one load of a flag, and while it is
/// up one look at which CPU they run on: they are not counted.
static REGISTER_ACCESSES: AtomicU64 = AtomicU64::new(0);
static COUNT_REGISTERS: AtomicBool = AtomicBool::new(false);

/// Starts or stops counting vCPU 0's device register accesses.
pub fn count_registers(on: bool) {
    COUNT_REGISTERS.store(on, Ordering::Relaxed);
}

/// Register accesses counted so far.
pub fn register_accesses() -> u64 {
    REGISTER_ACCESSES.load(Ordering::Relaxed)
}

impl ConfigAccess for PortConfig {
    fn read32(&self, address: PciAddress, offset: u16) -> u32 {
        if offset >= 256 {
            return u32::MAX;
        }
        CONFIG_ACCESSES.fetch_add(1, Ordering::Relaxed);
        let _guard = PORT_LOCK.lock();
        // SAFETY: 0xCF8/0xCFC are the PCI configuration mechanism #1 ports; selecting and
        // reading a register has no effect on memory.
        unsafe {
            Port::<u32>::new(0xcf8).write(port_address(address, offset));
            Port::<u32>::new(0xcfc).read()
        }
    }

    fn write32(&self, address: PciAddress, offset: u16, value: u32) {
        if offset >= 256 {
            return;
        }
        CONFIG_ACCESSES.fetch_add(1, Ordering::Relaxed);
        let _guard = PORT_LOCK.lock();
        // SAFETY: as in `read32`; the callers write registers they own (command, BARs).
        unsafe {
            Port::<u32>::new(0xcf8).write(port_address(address, offset));
            Port::<u32>::new(0xcfc).write(value);
        }
    }
}

fn port_address(address: PciAddress, offset: u16) -> u32 {
    0x8000_0000
        | (u32::from(address.bus) << 16)
        | (u32::from(address.device & 31) << 11)
        | (u32::from(address.function & 7) << 8)
        | u32::from(offset & 0xfc)
}

/// Configuration space through an ECAM window; each function's 4 KiB page is mapped
/// uncached the first time it is touched.
#[derive(Clone, Copy)]
pub struct EcamConfig {
    pub window: EcamWindow,
}

impl EcamConfig {
    fn register(&self, address: PciAddress, offset: u16) -> Option<u64> {
        if offset >= 4096 {
            return None;
        }
        let phys = self
            .window
            .function_address(address.bus, address.device, address.function)?;
        let virt = ECAM_VIRT + (phys - self.window.base);
        if paging::translate(virt).is_none() {
            paging::map_page(virt, phys, mmio_flags()).ok()?;
        }
        Some(virt + u64::from(offset & !3))
    }
}

impl ConfigAccess for EcamConfig {
    fn read32(&self, address: PciAddress, offset: u16) -> u32 {
        CONFIG_ACCESSES.fetch_add(1, Ordering::Relaxed);
        match self.register(address, offset) {
            // SAFETY: `register` mapped this function's configuration page uncached.
            Some(virt) => unsafe { core::ptr::read_volatile(virt as *const u32) },
            None => u32::MAX,
        }
    }

    fn write32(&self, address: PciAddress, offset: u16, value: u32) {
        CONFIG_ACCESSES.fetch_add(1, Ordering::Relaxed);
        if let Some(virt) = self.register(address, offset) {
            // SAFETY: as in `read32`.
            unsafe { core::ptr::write_volatile(virt as *mut u32, value) }
        }
    }
}

/// ECAM when the MCFG offers a window, ports otherwise.
#[derive(Clone, Copy)]
pub enum PciConfig {
    Ecam(EcamConfig),
    Port(PortConfig),
}

impl PciConfig {
    /// Through the window the MCFG gave (`Firmware::ecam`), or ports without one.
    pub fn from_mcfg(mcfg: Result<EcamWindow, acpi::AcpiError>) -> Self {
        match mcfg {
            Ok(window) => {
                log::info!(
                    "pci: ECAM at {:#x}, buses {}..={}",
                    window.base,
                    window.start_bus,
                    window.end_bus
                );
                PciConfig::Ecam(EcamConfig { window })
            }
            Err(e) => {
                log::info!("pci: no MCFG ({e:?}); configuration through ports 0xCF8/0xCFC");
                PciConfig::Port(PortConfig)
            }
        }
    }

    pub fn access(&self) -> &dyn ConfigAccess {
        match self {
            PciConfig::Ecam(ecam) => ecam,
            PciConfig::Port(port) => port,
        }
    }

    pub fn first_bus(&self) -> u8 {
        match self {
            PciConfig::Ecam(ecam) => ecam.window.start_bus,
            PciConfig::Port(_) => 0,
        }
    }
}

/// `pages` zeroed, page-aligned pages for DMA, from the heap. The heap lies in the
/// identity-mapped low 4 GiB, so its addresses are physical (bus) addresses. Set-up only:
/// never freed. Device queues and bounce pages are a disk's bulk memory: taken only from
/// the room for disks (`mm::DISK_MEMORY`), never the control path's reserve.
pub fn allocate_dma(pages: usize) -> Option<u64> {
    let bytes = pages.max(1).checked_mul(PAGE as usize)?;
    crate::mm::DISK_MEMORY.fits(bytes as u64).ok()?;
    let layout = core::alloc::Layout::from_size_align(bytes, PAGE as usize).ok()?;
    // SAFETY: the layout has a non-zero size.
    let memory = unsafe { alloc::alloc::alloc_zeroed(layout) };
    (!memory.is_null()).then_some(memory as u64)
}

/// TSC ticks per microsecond, once calibrated.
static TSC_PER_US: AtomicU64 = AtomicU64::new(0);

fn rdtsc() -> u64 {
    // SAFETY: RDTSC only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Measures the TSC against 50 ms of PIT channel 2; returns ticks per microsecond.
pub fn calibrate_clock() -> u64 {
    const PIT_HZ: u64 = 1_193_182;
    const WINDOW_MS: u64 = 50;
    let count = (PIT_HZ * WINDOW_MS / 1000) as u16;
    // SAFETY: ports 0x61 (gate/speaker), 0x43 (PIT mode) and 0x42 (channel 2 count) only
    // drive the PC speaker timer, which nothing else uses.
    let elapsed = unsafe {
        let mut gate = Port::<u8>::new(0x61);
        let speaker_off_gate_on = (gate.read() & !0x02) | 0x01;
        gate.write(speaker_off_gate_on & !0x01);
        Port::<u8>::new(0x43).write(0b1011_0000); // channel 2, lo/hi byte, mode 0
        Port::<u8>::new(0x42).write(count as u8);
        Port::<u8>::new(0x42).write((count >> 8) as u8);
        gate.write(speaker_off_gate_on);
        let start = rdtsc();
        // Bounded: without a PIT (bit 5 never rises) give up after ~2^34 ticks.
        while gate.read() & 0x20 == 0 && rdtsc() - start < (1 << 34) {
            core::hint::spin_loop();
        }
        rdtsc() - start
    };
    let per_us = (elapsed / (WINDOW_MS * 1000)).max(1);
    TSC_PER_US.store(per_us, Ordering::Relaxed);
    per_us
}

/// TSC ticks since an arbitrary start (a timeout that needs no clock in ns).
pub fn ticks() -> u64 {
    rdtsc()
}

/// Nanoseconds since an arbitrary start: Xen's system time under Xen (the TSC is not
/// calibrated there), otherwise the TSC calibrated against the PIT (on first use, if the
/// boot did not).
pub fn now_ns() -> u64 {
    if let Some(xen) = crate::xen_domain::get() {
        return xen.now_ns();
    }
    let mut per_us = TSC_PER_US.load(Ordering::Relaxed);
    if per_us == 0 {
        per_us = calibrate_clock();
    }
    (u128::from(rdtsc()) * 1000 / u128::from(per_us)) as u64
}

/// Microseconds since an arbitrary start.
#[cfg(feature = "test-hooks")]
pub fn now_us() -> u64 {
    now_ns() / 1000
}

/// Waits `micros` microseconds (real ones, under Xen too: the drivers' bring-up
/// timeouts count these).
pub fn delay_us(micros: u64) {
    let end = now_ns() + micros * 1000;
    while now_ns() < end {
        core::hint::spin_loop();
    }
}

/// A PCI function's bus mastering, shared by every queue of the device: turned off when
/// a queue of it fails or its driver resets it (`blkdev::Dma::stop_dma`: a command it
/// never completed must not land in a page after its request was answered), and on
/// again once the reset device holds nothing from before (`resume_dma`).
pub struct DmaSwitch {
    address: PciAddress,
    config: PciConfig,
    /// RUNNING, STOPPED (confirmed) or STOP_UNCONFIRMED.
    state: AtomicU8,
}

const RUNNING: u8 = 0;
const STOPPED: u8 = 1;
const STOP_UNCONFIRMED: u8 = 2;

impl DmaSwitch {
    /// The switch of the function at `address` (made once per device, at bring-up,
    /// and never freed: its queues live as long as blkdom).
    pub fn new(config: &PciConfig, address: PciAddress) -> &'static DmaSwitch {
        alloc::boxed::Box::leak(alloc::boxed::Box::new(DmaSwitch {
            address,
            config: *config,
            state: AtomicU8::new(RUNNING),
        }))
    }

    /// Clears bus mastering and reads the command register back. The read-back is a
    /// completion from the function itself, and a PCIe completion does not pass the
    /// writes the function posted before it: once it is here, what the device wrote
    /// before it stopped is in memory, and nothing follows. `true` when the register
    /// reads back with bus mastering off.
    fn stop(&self) -> bool {
        if self.state.load(Ordering::Acquire) == STOPPED {
            return true;
        }
        let access = self.config.access();
        pci::update_command(access, self.address, 0, pci::COMMAND_BUS_MASTER);
        let command = access.read16(self.address, pci::REG_COMMAND);
        let confirmed = command != u16::MAX && command & pci::COMMAND_BUS_MASTER == 0;
        self.state.store(
            if confirmed { STOPPED } else { STOP_UNCONFIRMED },
            Ordering::Release,
        );
        if confirmed {
            log::error!(
                "pci {}: bus mastering off: the device reaches no memory any more",
                self.address
            );
        } else {
            log::error!(
                "pci {}: bus mastering could not be turned off (command register {command:#06x}): the device may still write what it was given",
                self.address
            );
        }
        confirmed
    }

    /// Turns bus mastering back on (its driver reset the device, which holds no command
    /// from before the stop) and reads it back: `true` when it reads back on.
    fn resume(&self) -> bool {
        let access = self.config.access();
        pci::update_command(access, self.address, pci::COMMAND_BUS_MASTER, 0);
        let command = access.read16(self.address, pci::REG_COMMAND);
        let on = command != u16::MAX && command & pci::COMMAND_BUS_MASTER != 0;
        if on {
            self.state.store(RUNNING, Ordering::Release);
            log::info!("pci {}: bus mastering on again", self.address);
        } else {
            log::error!(
                "pci {}: bus mastering could not be turned back on (command register {command:#06x})",
                self.address
            );
        }
        on
    }

    fn stopped(&self) -> Option<bool> {
        match self.state.load(Ordering::Acquire) {
            RUNNING => None,
            state => Some(state == STOPPED),
        }
    }
}

/// Register and DMA access for the drivers. Registers are reached only inside the
/// windows the device was given (checked per access: a register outside them is a
/// driver bug, and it panics rather than touch whatever lies there).
#[derive(Clone, Copy)]
pub struct DeviceHal {
    windows: [MmioWindow; 3],
    switch: &'static DmaSwitch,
}

impl DeviceHal {
    /// For an NVMe controller: register offsets count from the start of `registers`
    /// (BAR 0 from offset 0).
    pub fn nvme(registers: MmioWindow, switch: &'static DmaSwitch) -> Self {
        DeviceHal {
            windows: [registers, MmioWindow::EMPTY, MmioWindow::EMPTY],
            switch,
        }
    }

    /// For a virtio device: registers are named by address, inside one of its mapped
    /// capability windows (common, notify, device).
    pub fn virtio(windows: [MmioWindow; 3], switch: &'static DmaSwitch) -> Self {
        DeviceHal { windows, switch }
    }

    /// `address` when the `size`-byte register there lies in one of the windows.
    #[inline]
    #[track_caller]
    fn register(&self, address: u64, size: u64) -> u64 {
        if !self.windows.iter().any(|w| w.holds(address, size)) {
            outside_windows(address, size);
        }
        if COUNT_REGISTERS.load(Ordering::Relaxed)
            && crate::smp::current().index.load(Ordering::Relaxed) == 0
        {
            REGISTER_ACCESSES.fetch_add(1, Ordering::Relaxed);
        }
        address
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn outside_windows(address: u64, size: u64) -> ! {
    panic!("device register of {size} bytes at {address:#x} is outside the mapped windows")
}

// SAFETY: register offsets are checked against BAR 0's window (`register`), and the
// completion words are read through `DmaRegion::span` and an alignment check; the
// `blkdev::Dma` promises are kept below.
unsafe impl nvme::Hal for DeviceHal {
    fn read_register(&self, offset: usize) -> u32 {
        let address = self.register(self.windows[0].base.wrapping_add(offset as u64), 4);
        // SAFETY: a register inside the controller's BAR 0 window (checked), which
        // `map_mmio` mapped uncached: the access reaches the device only.
        unsafe { core::ptr::read_volatile(address as *const u32) }
    }

    fn write_register(&self, offset: usize, value: u32) {
        let address = self.register(self.windows[0].base.wrapping_add(offset as u64), 4);
        // SAFETY: as in `read_register`.
        unsafe { core::ptr::write_volatile(address as *mut u32, value) }
    }

    fn read_dma_u32(&self, region: DmaRegion, offset: u64) -> u32 {
        let address = aligned(region.span(offset, 4), 4);
        // SAFETY: 4 aligned bytes inside `region` (checked), DMA memory `allocate_dma`
        // handed out and the driver owns.
        unsafe { physmem::load_u32(address) }
    }
}

/// `address`, which must be a multiple of `size` (for a volatile load of that width).
#[inline]
#[track_caller]
fn aligned(address: u64, size: u64) -> u64 {
    assert!(address.is_multiple_of(size), "unaligned DMA load");
    address
}

// SAFETY: `allocate_dma` hands out fresh zeroed heap pages, contiguous and page-aligned,
// identity mapped below 4 GiB (so the physical address is the bus address), used by
// nothing else and never freed; the copies reach only the bytes `DmaRegion::span`
// allows, through `physmem`, whose fences order them; `delay_us` spins on the TSC;
// `stop_dma` says true only when bus mastering reads back off (`DmaSwitch::stop`), and
// `resume_dma` turns it on again (`DmaSwitch::resume`).
unsafe impl blkdev::Dma for DeviceHal {
    fn allocate_dma(&self, pages: usize) -> Option<DmaRegion> {
        let address = allocate_dma(pages)?;
        // SAFETY: `allocate_dma` just allocated these `pages` (see the impl's comment).
        Some(unsafe { DmaRegion::new(address, pages as u64 * PAGE) })
    }
    fn read_dma(&self, region: DmaRegion, offset: u64, out: &mut [u8]) {
        let address = region.span(offset, out.len() as u64);
        // SAFETY: the bytes lie inside `region` (checked): DMA memory `allocate_dma`
        // handed out, which the driver owns; `out` is its own buffer.
        unsafe { physmem::read(address, out) }
    }
    fn write_dma(&self, region: DmaRegion, offset: u64, data: &[u8]) {
        let address = region.span(offset, data.len() as u64);
        // SAFETY: as in `read_dma`.
        unsafe { physmem::write(address, data) }
    }
    fn delay_us(&self, micros: u64) {
        delay_us(micros)
    }
    fn stop_dma(&self) -> bool {
        self.switch.stop()
    }
    fn dma_stopped(&self) -> Option<bool> {
        self.switch.stopped()
    }
    fn resume_dma(&self) -> bool {
        self.switch.resume()
    }
}

// SAFETY: register addresses are checked against the capability windows (`register`),
// and the used index is read through `DmaRegion::span` and an alignment check; the
// `blkdev::Dma` promises are kept above.
unsafe impl virtio::Hal for DeviceHal {
    fn read8(&self, address: u64) -> u8 {
        let address = self.register(address, 1);
        // SAFETY: a register inside one of the device's capability windows (checked),
        // which `map_mmio` mapped uncached: the access reaches the device only.
        unsafe { core::ptr::read_volatile(address as *const u8) }
    }
    fn read16(&self, address: u64) -> u16 {
        let address = self.register(address, 2);
        // SAFETY: as in `read8`.
        unsafe { core::ptr::read_volatile(address as *const u16) }
    }
    fn read32(&self, address: u64) -> u32 {
        let address = self.register(address, 4);
        // SAFETY: as in `read8`.
        unsafe { core::ptr::read_volatile(address as *const u32) }
    }
    fn write8(&self, address: u64, value: u8) {
        let address = self.register(address, 1);
        // SAFETY: as in `read8`.
        unsafe { core::ptr::write_volatile(address as *mut u8, value) }
    }
    fn write16(&self, address: u64, value: u16) {
        let address = self.register(address, 2);
        // SAFETY: as in `read8`.
        unsafe { core::ptr::write_volatile(address as *mut u16, value) }
    }
    fn write32(&self, address: u64, value: u32) {
        let address = self.register(address, 4);
        // SAFETY: as in `read8`.
        unsafe { core::ptr::write_volatile(address as *mut u32, value) }
    }
    fn read_dma_u16(&self, region: DmaRegion, offset: u64) -> u16 {
        let address = aligned(region.span(offset, 2), 2);
        // SAFETY: 2 aligned bytes inside `region` (checked), DMA memory `allocate_dma`
        // handed out and the driver owns.
        unsafe { physmem::load_u16(address) }
    }
}
