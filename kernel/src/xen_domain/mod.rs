//! The kernel side of Xen domain bring-up (`xen::domain`). The `xen` crate holds the
//! ABI and the host-tested logic (hypercall wrappers, event scan, xenstore client,
//! console ring); this module holds what needs the running kernel: frames for
//! `shared_info` and `vcpu_info`, the IDT vector for upcalls, per-CPU state, the console
//! sink.

pub mod console;
pub mod control;
pub mod events;
pub mod store;
pub mod vcpus;

use crate::arch::paging::IDENTITY_MAPPED_LIMIT;
use crate::smp::MAX_CPUS;
use core::sync::atomic::{AtomicU64, Ordering};
use xen::domain::{self as xd, ShutdownReason, UpcallMode};
use xen::raw::hypercall::NativeHypervisor;
use xen::shared_info::{SharedInfoPage, VcpuInfoView};
use xen::{SharedMem, XenError};

pub struct XenDomain {
    pub hv: NativeHypervisor,
    pub shared: SharedInfoPage,
    /// How upcalls arrive (decided when the boot vCPU's upcall is set up).
    pub upcall_mode: spin::Once<UpcallMode>,
    /// Each vCPU's registered `vcpu_info` (64 bytes at the start of a page of its own).
    vcpu_info: [spin::Once<VcpuInfoView>; MAX_CPUS],
}

static XEN_DOMAIN: spin::Once<XenDomain> = spin::Once::new();

/// The domain, once `init` succeeded (only under Xen).
pub fn get() -> Option<&'static XenDomain> {
    XEN_DOMAIN.get()
}

/// Xen's system time in nanoseconds (0 before the domain is set up).
pub fn now_ns() -> u64 {
    get().map_or(0, |p| p.now_ns())
}

#[derive(Debug)]
pub enum InitError {
    NoFrame,
    NotInitialised,
    Hypercall(&'static str, XenError),
}

impl core::fmt::Display for InitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InitError::NoFrame => write!(f, "no free frame"),
            InitError::NotInitialised => write!(f, "the Xen platform is not initialised"),
            InitError::Hypercall(what, e) => write!(f, "{what} failed: {e:?}"),
        }
    }
}

impl core::error::Error for InitError {}

fn failed(what: &'static str) -> impl FnOnce(XenError) -> InitError {
    move |e| InitError::Hypercall(what, e)
}

/// A zeroed frame, owned by the domain for good.
fn zeroed_frame() -> Result<u64, InitError> {
    let frame = crate::mm::allocate_frame().map_err(|_| InitError::NoFrame)?;
    // SAFETY: a fresh frame from the allocator, used by nobody else.
    unsafe { crate::physmem::zero(frame, 4096) };
    Ok(frame)
}

/// A shared page at physical (= virtual, identity map) address `paddr`.
///
/// # Safety
/// `paddr` must be a page below 4 GiB that Xen or another domain shares with us and that
/// nothing else in the kernel accesses except through the returned `SharedMem`.
unsafe fn shared_page(paddr: u64, len: usize) -> SharedMem {
    debug_assert!(paddr + len as u64 <= IDENTITY_MAPPED_LIMIT);
    // SAFETY: forwarded contract.
    unsafe { SharedMem::new(paddr as *mut u8, len) }
}

/// Maps `shared_info`, registers the boot vCPU's `vcpu_info` and routes its upcalls,
/// and starts logging to the Xen console. Once, on the boot CPU, after memory set-up.
/// Xen system time when the domain came up: log lines carry the time since then.
static BOOT_NS: AtomicU64 = AtomicU64::new(0);

/// Nanoseconds since the domain came up, once Xen's clock is readable.
pub fn uptime_ns() -> Option<u64> {
    let boot = BOOT_NS.load(Ordering::Relaxed);
    (boot != 0).then(|| get().map(|xen| xen.now_ns().saturating_sub(boot)))?
}

pub fn init() -> Result<&'static XenDomain, InitError> {
    // SAFETY: the caller checked CPUID for Xen; we run at CPL 0 as an HVM/PVH guest,
    // and the instruction is chosen from the CPU vendor.
    let hv = unsafe { NativeHypervisor::detect() };
    let frame = zeroed_frame()?;
    xd::map_shared_info(&hv, frame >> 12).map_err(failed("XENMEM_add_to_physmap(shared_info)"))?;
    // SAFETY: the frame is now Xen's shared_info page, touched only through SharedMem.
    let shared =
        SharedInfoPage::new(unsafe { shared_page(frame, 4096) }).expect("a page holds shared_info");
    let domain = XEN_DOMAIN.call_once(|| XenDomain {
        hv,
        shared,
        upcall_mode: spin::Once::new(),
        vcpu_info: [const { spin::Once::new() }; MAX_CPUS],
    });
    // Every port starts masked (as Linux does at boot): a port is unmasked only once a
    // handler owns it, and pollers keep theirs masked.
    for port in 0..xen::abi::shared_info::EVTCHN_2L_NR_CHANNELS as u32 {
        domain.shared.mask(port);
    }
    domain.register_vcpu_info(0)?;
    BOOT_NS.store(domain.now_ns(), Ordering::Relaxed);
    events::init_vcpu(0)?;
    console::init(domain);
    Ok(domain)
}

impl XenDomain {
    /// Gives `vcpu` its own `vcpu_info` page (any vCPU count, not only the legacy 32).
    pub fn register_vcpu_info(&self, vcpu: u32) -> Result<VcpuInfoView, InitError> {
        let frame = zeroed_frame()?;
        xd::register_vcpu_info(&self.hv, vcpu, frame)
            .map_err(failed("VCPUOP_register_vcpu_info"))?;
        // SAFETY: Xen writes this vCPU's vcpu_info into the first 64 bytes of the frame,
        // which we own and touch only through SharedMem.
        let view = VcpuInfoView::new(unsafe { shared_page(frame, 64) }).expect("aligned vcpu_info");
        Ok(*self.vcpu_info[vcpu as usize].call_once(|| view))
    }

    pub fn vcpu_info(&self, vcpu: usize) -> Option<VcpuInfoView> {
        self.vcpu_info.get(vcpu)?.get().copied()
    }

    /// Xen system time in ns (the clock of `SCHEDOP_poll` deadlines).
    pub fn now_ns(&self) -> u64 {
        // This vCPU's own time info: Xen keeps it in step with the TSC of the pCPU the
        // vCPU last ran on, which another vCPU's info is not (unless the TSC is invariant).
        let cpu = crate::smp::current().index.load(Ordering::Relaxed) as usize;
        let Some(clock) = self
            .vcpu_info(cpu)
            .or_else(|| self.vcpu_info(0))
            .map(|i| i.clock())
        else {
            return 0;
        };
        // The TSC after the snapshot, so it is never before the snapshot's timestamp.
        clock.system_time_at(xen::raw::cpu::read_tsc())
    }
}

/// What the instructions a poll loop may use cost here, in ns each (averaged over a
/// burst): under nesting, RDTSC or PAUSE that Xen intercepts, and every hypercall, are VM
/// exits that an emulated CPU pays dearly for; the poller's design follows these numbers.
pub struct InstructionCosts {
    pub rdtsc_ns: u64,
    pub pause_ns: u64,
    pub hypercall_ns: u64,
}

pub fn measure_costs(xen: &XenDomain) -> InstructionCosts {
    const ROUNDS: u64 = 200;
    let per_round = |f: &dyn Fn()| {
        let start = xen.now_ns();
        for _ in 0..ROUNDS {
            f();
        }
        xen.now_ns().saturating_sub(start) / ROUNDS
    };
    InstructionCosts {
        rdtsc_ns: per_round(&|| {
            core::hint::black_box(xen::raw::cpu::read_tsc());
        }),
        pause_ns: per_round(&core::hint::spin_loop),
        hypercall_ns: per_round(&|| {
            let _ = core::hint::black_box(xd::version(&xen.hv));
        }),
    }
}

/// `SCHEDOP_shutdown`; returns only if Xen refused (or we are not under Xen).
pub fn shutdown(reason: ShutdownReason) {
    // SAFETY: only called when CPUID showed Xen (see `power`), at CPL 0.
    let hv = unsafe { NativeHypervisor::detect() };
    let refused = xd::shutdown(&hv, reason);
    log::error!("SCHEDOP_shutdown({reason:?}) refused: {refused:?}");
}
