// SPDX-License-Identifier: MIT OR Apache-2.0
//! CPUs: per-CPU data (reached through GS), starting the other CPUs, and handing them
//! work. Each CPU will run its own poller; this module only brings them up and lets the
//! boot CPU run a function on another CPU (wake-up by IPI, no spinning while idle).

use crate::arch::{ap_boot, apic, gdt, trap};
use alloc::boxed::Box;
use alloc::vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use x86_64::registers::model_specific::Msr;

pub const MAX_CPUS: usize = 64;
const AP_STACK_SIZE: usize = 64 * 1024;
/// IPI vector that wakes an idle CPU to look at its mailbox.
pub const WAKE_VECTOR: u8 = 0xf1;
const IA32_GS_BASE: u32 = 0xc000_0101;
const IA32_EFER: u32 = 0xc000_0080;
/// Lower bound of the TSC rate, for timeouts that must not end early.
const MIN_TSC_HZ: u64 = 1_000_000_000;

/// One CPU's data. GS points at it, so `current()` is a single load.
#[repr(C)]
pub struct PerCpu {
    /// Address of this struct, read back through `gs:[0]`.
    self_addr: AtomicU64,
    pub index: AtomicU32,
    pub apic_id: AtomicU32,
    online: AtomicBool,
    /// A `fn(usize)` for this CPU to run, 0 when empty.
    mailbox: AtomicUsize,
    work_done: AtomicU64,
    wakeups: AtomicU64,
}

impl PerCpu {
    const fn new() -> Self {
        PerCpu {
            self_addr: AtomicU64::new(0),
            index: AtomicU32::new(0),
            apic_id: AtomicU32::new(0),
            online: AtomicBool::new(false),
            mailbox: AtomicUsize::new(0),
            work_done: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
        }
    }
}

static CPUS: [PerCpu; MAX_CPUS] = [const { PerCpu::new() }; MAX_CPUS];
static ONLINE_COUNT: AtomicUsize = AtomicUsize::new(0);

fn install_percpu(index: usize, apic_id: u32) {
    let cpu = &CPUS[index];
    cpu.self_addr
        .store(cpu as *const PerCpu as u64, Ordering::Relaxed);
    cpu.index.store(index as u32, Ordering::Relaxed);
    cpu.apic_id.store(apic_id, Ordering::Relaxed);
    // SAFETY: GS base only affects `gs:`-prefixed accesses, which only `current()` makes,
    // and it points at a 'static PerCpu.
    unsafe { Msr::new(IA32_GS_BASE).write(cpu as *const PerCpu as u64) };
    apic::enable();
    cpu.online.store(true, Ordering::Release);
    ONLINE_COUNT.fetch_add(1, Ordering::AcqRel);
}

/// This CPU's data.
pub fn current() -> &'static PerCpu {
    let addr: u64;
    // SAFETY: every CPU sets GS base to its PerCpu (whose first field holds its own
    // address) before running any code that calls this.
    unsafe {
        core::arch::asm!("mov {}, gs:[0]", out(reg) addr, options(nostack, readonly, preserves_flags))
    };
    // SAFETY: the address is that of an element of the static CPUS array.
    unsafe { &*(addr as *const PerCpu) }
}

pub fn online_count() -> usize {
    ONLINE_COUNT.load(Ordering::Acquire)
}

pub fn cpu(index: usize) -> Option<&'static PerCpu> {
    CPUS.get(index).filter(|c| c.online.load(Ordering::Acquire))
}

fn on_wake(_frame: &mut trap::TrapFrame) {
    current().wakeups.fetch_add(1, Ordering::Relaxed);
    apic::end_of_interrupt();
}

fn on_spurious(_frame: &mut trap::TrapFrame) {}

/// Per-CPU state of the boot CPU (index 0); called once, early.
pub fn init_boot_cpu() {
    trap::set_interrupt_handler(WAKE_VECTOR, on_wake);
    trap::set_interrupt_handler(apic::SPURIOUS_VECTOR, on_spurious);
    install_percpu(0, apic::id());
}

fn read_tsc() -> u64 {
    #[allow(unused_unsafe)]
    // SAFETY: RDTSC only reads the time-stamp counter.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

/// Spins until `done()` or about `millis` ms (at least; longer on fast TSCs).
pub fn wait_until(millis: u64, mut done: impl FnMut() -> bool) -> bool {
    let start = read_tsc();
    let budget = MIN_TSC_HZ / 1000 * millis;
    while read_tsc().wrapping_sub(start) < budget {
        if done() {
            return true;
        }
        core::hint::spin_loop();
    }
    done()
}

/// What a CPU-starting method needs to launch CPU `index`.
pub struct ApStart {
    pub index: usize,
    /// 16-byte aligned top of the CPU's boot stack.
    pub stack_top: u64,
    /// `extern "C" fn(index: u64) -> !`, to be entered as if called.
    pub entry: u64,
    pub cr3: u64,
    pub efer: u64,
}

pub fn is_online(index: usize) -> bool {
    CPUS.get(index)
        .is_some_and(|c| c.online.load(Ordering::Acquire))
}

/// Gives CPU `index` a stack, lets `launch` start it, and waits up to `timeout_ms` for it
/// to come online. CPUs are numbered densely: the caller passes the next free index.
pub fn start_ap(index: usize, timeout_ms: u64, launch: impl FnOnce(&ApStart)) -> bool {
    if index == 0 || index >= MAX_CPUS {
        return false;
    }
    let stack = Box::leak(vec![0u8; AP_STACK_SIZE].into_boxed_slice());
    let (level_4, _) = x86_64::registers::control::Cr3::read();
    let start = ApStart {
        index,
        stack_top: (stack.as_ptr_range().end as u64) & !0xf,
        entry: ap_entry as *const () as u64,
        cr3: level_4.start_address().as_u64(),
        // SAFETY: reading EFER has no side effects.
        efer: unsafe { Msr::new(IA32_EFER).read() },
    };
    launch(&start);
    wait_until(timeout_ms, || is_online(index))
}

/// Starts the CPUs with these APIC ids (the boot CPU's is skipped) the PC way: INIT and
/// start-up IPIs into the real-mode trampoline. Returns how many came online.
pub fn start_aps_with_sipi(apic_ids: impl Iterator<Item = u32>) -> usize {
    let boot_apic = CPUS[0].apic_id.load(Ordering::Relaxed);
    let mut next = 1;
    for apic_id in apic_ids.filter(|id| *id != boot_apic) {
        if next >= MAX_CPUS {
            log::warn!("cpu: more than {MAX_CPUS} CPUs; APIC {apic_id} and later stay off");
            break;
        }
        let started = start_ap(next, 1000, |start| launch_with_sipi(apic_id, start));
        if started {
            next += 1;
        } else {
            log::error!("cpu: APIC {apic_id} did not come up within 1 s");
        }
    }
    next - 1
}

/// INIT, then start-up IPIs into the real-mode trampoline, which climbs to `start`'s
/// long-mode entry (a `start_ap` launcher).
pub fn launch_with_sipi(apic_id: u32, start: &ApStart) {
    ap_boot::install(ap_boot::TrampolineData {
        cr3: start.cr3,
        stack_top: start.stack_top,
        entry: start.entry,
        cpu_index: start.index as u64,
        efer_bits: start.efer & ((1 << 8) | (1 << 11)),
    });
    let page = (ap_boot::TRAMPOLINE_PADDR >> 12) as u8;
    apic::send_init(apic_id);
    wait_until(10, || false);
    apic::send_startup(apic_id, page);
    if !wait_until(1, || is_online(start.index)) {
        apic::send_startup(apic_id, page);
    }
}

/// Where a started CPU enters Rust, on its own stack, with the boot CPU's page tables.
extern "C" fn ap_entry(index: u64) -> ! {
    let index = index as usize;
    // Own descriptor tables: the TSS names this CPU's own interrupt stacks.
    let stacks = Box::leak(vec![0u8; core::mem::size_of::<gdt::IstStacks>()].into_boxed_slice());
    let tss = Box::leak(Box::new(gdt::new_tss(
        stacks.as_ptr().cast::<gdt::IstStacks>(),
    )));
    let (table, selectors) = gdt::new_gdt(tss);
    let table = Box::leak(Box::new(table));
    gdt::load(table, &selectors);
    trap::load_idt();
    install_percpu(index, apic::id());
    log::info!("cpu {index} up (APIC id {})", apic::id());
    idle_loop()
}

/// Runs mailbox work, otherwise halts until an interrupt (a wake IPI) arrives.
fn idle_loop() -> ! {
    let me = current();
    loop {
        x86_64::instructions::interrupts::disable();
        let work = me.mailbox.swap(0, Ordering::AcqRel);
        if work != 0 {
            x86_64::instructions::interrupts::enable();
            // SAFETY: only `run_on` fills the mailbox, with a `fn(usize)` address.
            let work: fn(usize) = unsafe { core::mem::transmute::<usize, fn(usize)>(work) };
            work(me.index.load(Ordering::Relaxed) as usize);
            me.work_done.fetch_add(1, Ordering::AcqRel);
            continue;
        }
        // `sti; hlt` is atomic: a wake IPI between the check and the halt still wakes us.
        x86_64::instructions::interrupts::enable_and_hlt();
    }
}

#[derive(Debug)]
pub enum RunError {
    NoSuchCpu,
    Busy,
    #[cfg(feature = "test-hooks")]
    Timeout,
}

impl core::fmt::Display for RunError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RunError::NoSuchCpu => "no such CPU online",
            RunError::Busy => "the CPU is busy",
            #[cfg(feature = "test-hooks")]
            RunError::Timeout => "the CPU did not finish in time",
        })
    }
}

impl core::error::Error for RunError {}

/// Runs `work(cpu_index)` on CPU `index` and waits (up to `timeout_ms`) for it to finish.
#[cfg(feature = "test-hooks")]
pub fn run_on(index: usize, work: fn(usize), timeout_ms: u64) -> Result<(), RunError> {
    let cpu = cpu(index).ok_or(RunError::NoSuchCpu)?;
    if index == current().index.load(Ordering::Relaxed) as usize {
        work(index);
        return Ok(());
    }
    let done_before = cpu.work_done.load(Ordering::Acquire);
    start_on(index, work)?;
    if wait_until(timeout_ms, || {
        cpu.work_done.load(Ordering::Acquire) != done_before
    }) {
        Ok(())
    } else {
        Err(RunError::Timeout)
    }
}

/// Hands `work(cpu_index)` to CPU `index` without waiting for it (for work that runs
/// for good, like a poller).
pub fn start_on(index: usize, work: fn(usize)) -> Result<(), RunError> {
    let cpu = cpu(index).ok_or(RunError::NoSuchCpu)?;
    cpu.mailbox
        .compare_exchange(0, work as usize, Ordering::AcqRel, Ordering::Acquire)
        .map_err(|_| RunError::Busy)?;
    apic::send_fixed(cpu.apic_id.load(Ordering::Relaxed), WAKE_VECTOR);
    Ok(())
}

#[cfg(feature = "test-hooks")]
pub fn wakeups(index: usize) -> u64 {
    CPUS.get(index)
        .map_or(0, |c| c.wakeups.load(Ordering::Relaxed))
}
