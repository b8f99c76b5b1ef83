//! What the device drivers need from the machine: PCI configuration access (ECAM from
//! the MCFG, or ports 0xCF8/0xCFC), uncached mappings of device registers, DMA memory,
//! and a microsecond clock calibrated against the PIT.

use crate::arch::paging::{self, MapError};
use core::sync::atomic::{AtomicU64, Ordering};
use machine::acpi::{self, EcamWindow};
use pci::{ConfigAccess, PciAddress};
use x86_64::instructions::port::Port;
use x86_64::structures::paging::PageTableFlags;

/// Virtual addresses for device registers: ECAM windows first, BARs after.
const ECAM_VIRT: u64 = 0x0000_5000_0000_0000;
const BAR_VIRT: u64 = 0x0000_5001_0000_0000;
static NEXT_BAR_VIRT: AtomicU64 = AtomicU64::new(BAR_VIRT);
const PAGE: u64 = 4096;

fn mmio_flags() -> PageTableFlags {
    let mut flags =
        PageTableFlags::WRITABLE | PageTableFlags::NO_CACHE | PageTableFlags::WRITE_THROUGH;
    let efer = x86_64::registers::model_specific::Efer::read();
    if efer.contains(x86_64::registers::model_specific::EferFlags::NO_EXECUTE_ENABLE) {
        flags |= PageTableFlags::NO_EXECUTE;
    }
    flags
}

/// Maps `size` bytes of device registers at physical `phys` uncached; returns the
/// virtual address of `phys`.
pub fn map_mmio(phys: u64, size: u64) -> Result<u64, MapError> {
    let first = phys & !(PAGE - 1);
    let pages = (phys + size.max(1)).div_ceil(PAGE) - first / PAGE;
    let virt = NEXT_BAR_VIRT.fetch_add((pages + 1) * PAGE, Ordering::Relaxed);
    for page in 0..pages {
        paging::map_page(virt + page * PAGE, first + page * PAGE, mmio_flags())?;
    }
    Ok(virt + (phys - first))
}

/// Configuration space through ports 0xCF8/0xCFC (the first 256 bytes only).
pub struct PortConfig;

/// The address/data port pair is one shared register: one access at a time.
static PORT_LOCK: spin::Mutex<()> = spin::Mutex::new(());

impl ConfigAccess for PortConfig {
    fn read32(&self, address: PciAddress, offset: u16) -> u32 {
        if offset >= 256 {
            return u32::MAX;
        }
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
        match self.register(address, offset) {
            // SAFETY: `register` mapped this function's configuration page uncached.
            Some(virt) => unsafe { core::ptr::read_volatile(virt as *const u32) },
            None => u32::MAX,
        }
    }

    fn write32(&self, address: PciAddress, offset: u16, value: u32) {
        if let Some(virt) = self.register(address, offset) {
            // SAFETY: as in `read32`.
            unsafe { core::ptr::write_volatile(virt as *mut u32, value) }
        }
    }
}

/// ECAM when the MCFG offers a window, ports otherwise.
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
/// never freed.
pub fn allocate_dma(pages: usize) -> Option<u64> {
    let layout =
        core::alloc::Layout::from_size_align(pages.max(1) * PAGE as usize, PAGE as usize).ok()?;
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

/// Microseconds since an arbitrary start (after `calibrate_clock`).
pub fn now_us() -> u64 {
    rdtsc() / TSC_PER_US.load(Ordering::Relaxed).max(1)
}

pub fn delay_us(micros: u64) {
    let end = now_us() + micros;
    while now_us() < end {
        core::hint::spin_loop();
    }
}

/// Register and DMA access for the drivers. NVMe registers are offsets into BAR 0,
/// mapped at `registers`; virtio names mapped addresses directly.
#[derive(Clone, Copy)]
pub struct DeviceHal {
    pub registers: u64,
}

impl nvme::Hal for DeviceHal {
    fn read_register(&self, offset: usize) -> u32 {
        // SAFETY: BAR 0 is mapped uncached at `registers` and covers the controller's
        // registers and doorbells (checked against the BAR size when mapping).
        unsafe { core::ptr::read_volatile((self.registers + offset as u64) as *const u32) }
    }

    fn write_register(&self, offset: usize, value: u32) {
        // SAFETY: as in `read_register`.
        unsafe { core::ptr::write_volatile((self.registers + offset as u64) as *mut u32, value) }
    }

    fn read_dma_u32(&self, address: u64) -> u32 {
        // SAFETY: the driver reads only DMA memory it allocated (identity mapped);
        // volatile because the device writes it behind the compiler's back.
        unsafe { core::ptr::read_volatile(address as *const u32) }
    }
}

impl blkdev::Dma for DeviceHal {
    fn allocate_dma(&self, pages: usize) -> Option<u64> {
        allocate_dma(pages)
    }
    fn read_dma(&self, address: u64, out: &mut [u8]) {
        read_physical(address, out)
    }
    fn write_dma(&self, address: u64, data: &[u8]) {
        write_physical(address, data)
    }
    fn delay_us(&self, micros: u64) {
        delay_us(micros)
    }
}

impl virtio::Hal for DeviceHal {
    fn read8(&self, address: u64) -> u8 {
        // SAFETY: `address` lies in a virtio capability window the kernel mapped uncached
        // (see `devices::virtio`), inside the BAR the capability names.
        unsafe { core::ptr::read_volatile(address as *const u8) }
    }
    fn read16(&self, address: u64) -> u16 {
        // SAFETY: as in `read8`.
        unsafe { core::ptr::read_volatile(address as *const u16) }
    }
    fn read32(&self, address: u64) -> u32 {
        // SAFETY: as in `read8`.
        unsafe { core::ptr::read_volatile(address as *const u32) }
    }
    fn write8(&self, address: u64, value: u8) {
        // SAFETY: as in `read8`.
        unsafe { core::ptr::write_volatile(address as *mut u8, value) }
    }
    fn write16(&self, address: u64, value: u16) {
        // SAFETY: as in `read8`.
        unsafe { core::ptr::write_volatile(address as *mut u16, value) }
    }
    fn write32(&self, address: u64, value: u32) {
        // SAFETY: as in `read8`.
        unsafe { core::ptr::write_volatile(address as *mut u32, value) }
    }
    fn read_dma_u16(&self, address: u64) -> u16 {
        // SAFETY: the driver reads only its own identity-mapped DMA memory; volatile
        // because the device writes it behind the compiler's back.
        unsafe { core::ptr::read_volatile(address as *const u16) }
    }
}

/// Copies from identity-mapped physical memory the caller owns.
pub fn read_physical(address: u64, out: &mut [u8]) {
    assert!(address + out.len() as u64 <= paging::IDENTITY_MAPPED_LIMIT);
    // SAFETY: below 4 GiB physical memory is identity mapped; drivers pass only DMA
    // memory they allocated or buffers they were handed for I/O.
    unsafe { core::ptr::copy_nonoverlapping(address as *const u8, out.as_mut_ptr(), out.len()) };
    core::sync::atomic::compiler_fence(Ordering::Acquire);
}

/// Copies into identity-mapped physical memory the caller owns.
pub fn write_physical(address: u64, data: &[u8]) {
    assert!(address + data.len() as u64 <= paging::IDENTITY_MAPPED_LIMIT);
    core::sync::atomic::compiler_fence(Ordering::Release);
    // SAFETY: as in `read_physical`.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), address as *mut u8, data.len()) };
}
