// SPDX-License-Identifier: MIT OR Apache-2.0
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
pub mod vif;

use crate::arch::paging::IDENTITY_MAPPED_LIMIT;
use crate::smp::MAX_CPUS;
use core::sync::atomic::{AtomicU64, Ordering};
use xen::domain::{self as xd, ShutdownReason, UpcallMode};
use xen::raw::hypercall::NativeHypervisor;
use xen::shared_info::{SharedInfoPage, VcpuInfoView, XenClock};
use xen::tsc::{Cost, TscRate};
use xen::{SharedMem, XenError};

pub struct XenDomain {
    pub hv: NativeHypervisor,
    pub shared: SharedInfoPage,
    /// How upcalls arrive (decided when the boot vCPU's upcall is set up).
    pub upcall_mode: spin::Once<UpcallMode>,
    /// Each vCPU's registered `vcpu_info` (64 bytes at the start of a page of its own).
    vcpu_info: [spin::Once<VcpuInfoView>; MAX_CPUS],
    /// Where `shared_info` and each `vcpu_info` are, for a live upgrade's handover.
    pub shared_info_paddr: u64,
    vcpu_info_paddr: [AtomicU64; MAX_CPUS],
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

/// The TSC when the domain came up, and the Xen system time of that reading (0 until
/// our clock first has a rate): log lines carry the time since then.
static BOOT_TSC: AtomicU64 = AtomicU64::new(0);
static BOOT_NS: AtomicU64 = AtomicU64::new(0);

/// Nanoseconds since the domain came up, once Xen has given our clock a rate: before
/// that, no time rather than a false 0.
pub fn uptime_ns() -> Option<u64> {
    let clock = get()?.clock().filter(XenClock::has_rate)?;
    let tsc = xen::raw::cpu::read_tsc();
    let now = clock.system_time_at(tsc);
    let boot = match BOOT_NS.load(Ordering::Relaxed) {
        0 => {
            // The first reading: boot was the ticks since the boot TSC ago.
            let since = clock.ticks_to_ns(tsc.saturating_sub(BOOT_TSC.load(Ordering::Relaxed)));
            let boot = now.saturating_sub(since).max(1);
            match BOOT_NS.compare_exchange(0, boot, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => boot,
                Err(first) => first,
            }
        }
        boot => boot,
    };
    Some(now.saturating_sub(boot))
}

/// Maps `shared_info`, registers the boot vCPU's `vcpu_info` and routes its upcalls,
/// and starts logging to the Xen console. Once, on the boot CPU, after memory set-up.
/// Booted from a live upgrade (`adopt`: the handed-over `shared_info` and vCPU 0's
/// `vcpu_info`), both are used where the old image left them: Xen refuses a second
/// `VCPUOP_register_vcpu_info`, and `shared_info` added elsewhere would leave a hole.
pub fn init(adopt: Option<(u64, u64)>) -> Result<&'static XenDomain, InitError> {
    BOOT_TSC.store(xen::raw::cpu::read_tsc(), Ordering::Relaxed);
    // SAFETY: the caller checked CPUID for Xen; we run at CPL 0 as an HVM/PVH guest,
    // and the instruction is chosen from the CPU vendor.
    let hv = unsafe { NativeHypervisor::detect() };
    let frame = match adopt {
        Some((shared_info, _)) => shared_info,
        None => {
            let frame = zeroed_frame()?;
            xd::map_shared_info(&hv, frame >> 12)
                .map_err(failed("XENMEM_add_to_physmap(shared_info)"))?;
            frame
        }
    };
    // SAFETY: the frame is now Xen's shared_info page, touched only through SharedMem.
    let shared =
        SharedInfoPage::new(unsafe { shared_page(frame, 4096) }).expect("a page holds shared_info");
    let domain = XEN_DOMAIN.call_once(|| XenDomain {
        hv,
        shared,
        upcall_mode: spin::Once::new(),
        vcpu_info: [const { spin::Once::new() }; MAX_CPUS],
        shared_info_paddr: frame,
        vcpu_info_paddr: [const { AtomicU64::new(0) }; MAX_CPUS],
    });
    // Every port starts masked (as Linux does at boot): a port is unmasked only once a
    // handler owns it, and pollers keep theirs masked.
    for port in 0..xen::abi::shared_info::EVTCHN_2L_NR_CHANNELS as u32 {
        domain.shared.mask(port);
    }
    match adopt {
        Some((_, vcpu_info)) => domain.adopt_vcpu_info(0, vcpu_info)?,
        None => domain.register_vcpu_info(0)?,
    };
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
        self.vcpu_info_paddr[vcpu as usize].store(frame, Ordering::Relaxed);
        Ok(*self.vcpu_info[vcpu as usize].call_once(|| view))
    }

    /// Takes the `vcpu_info` the old image registered for `vcpu` at `paddr` (the
    /// handover checked it lies, 64-byte aligned, in a kept `vcpu_info` range).
    pub fn adopt_vcpu_info(&self, vcpu: u32, paddr: u64) -> Result<VcpuInfoView, InitError> {
        if vcpu as usize >= MAX_CPUS || !crate::physmem::in_identity_map(paddr, 64) {
            return Err(InitError::Hypercall("adopting vcpu_info", XenError::Inval));
        }
        // SAFETY: Xen writes this vCPU's vcpu_info there (the old image registered it,
        // and Xen keeps it for the domain's life); the frame is kept out of the frame
        // allocator, and touched only through SharedMem.
        let view = VcpuInfoView::new(unsafe { shared_page(paddr, 64) })
            .ok_or(InitError::Hypercall("adopting vcpu_info", XenError::Inval))?;
        self.vcpu_info_paddr[vcpu as usize].store(paddr, Ordering::Relaxed);
        Ok(*self.vcpu_info[vcpu as usize].call_once(|| view))
    }

    /// Where vCPU `vcpu`'s `vcpu_info` is (0: not registered).
    pub fn vcpu_info_paddr(&self, vcpu: usize) -> u64 {
        self.vcpu_info_paddr
            .get(vcpu)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }

    pub fn vcpu_info(&self, vcpu: usize) -> Option<VcpuInfoView> {
        self.vcpu_info.get(vcpu)?.get().copied()
    }

    /// This vCPU's `vcpu_time_info` as Xen last wrote it (vCPU 0's before ours is
    /// registered). Xen keeps it in step with the TSC of the pCPU the vCPU last ran on,
    /// which another vCPU's info is not (unless the TSC is invariant).
    fn clock(&self) -> Option<XenClock> {
        let cpu = crate::smp::current().index.load(Ordering::Relaxed) as usize;
        self.vcpu_info(cpu)
            .or_else(|| self.vcpu_info(0))
            .map(|i| i.clock())
    }

    /// Xen system time in ns (the clock of `SCHEDOP_poll` deadlines).
    pub fn now_ns(&self) -> u64 {
        // The TSC after the snapshot, so it is never before the snapshot's timestamp.
        self.clock()
            .map_or(0, |clock| clock.system_time_at(xen::raw::cpu::read_tsc()))
    }
}

/// What the instructions a poll loop may use cost here (the mean over a burst): under
/// nesting, RDTSC or PAUSE that Xen intercepts, and every hypercall, are VM exits that an
/// emulated CPU pays dearly for; the poller's design follows these numbers.
pub struct InstructionCosts {
    pub rdtsc: Cost,
    pub pause: Cost,
    pub hypercall: Cost,
    /// What converted TSC ticks to ns; `None`: every cost is unknown.
    pub rate: Option<TscRate>,
}

/// What Xen's CPUID leaves at `base_leaf` (from hypervisor detection) say about us.
pub fn cpuid(base_leaf: u32) -> Option<xd::XenCpuid> {
    xd::XenCpuid::read(base_leaf, |leaf, subleaf| {
        let r = crate::arch::cpu::cpuid(leaf, subleaf);
        (r.eax, r.ebx, r.ecx, r.edx)
    })
}

/// Times each burst with the raw TSC, so the figures do not depend on Xen having
/// written our time info yet; `tsc_khz` is Xen's CPUID time leaf (0: not given).
pub fn measure_costs(xen: &XenDomain, tsc_khz: u32) -> InstructionCosts {
    const ROUNDS: u64 = 200;
    let rate = TscRate::choose(tsc_khz, xen.clock());
    let per_op = |f: &dyn Fn()| {
        let start = xen::raw::cpu::read_tsc();
        for _ in 0..ROUNDS {
            f();
        }
        // A TSC that went backwards (another pCPU's) gives 0 ticks: unknown.
        let ticks = xen::raw::cpu::read_tsc().saturating_sub(start);
        Cost::per_op(ticks, ROUNDS, rate)
    };
    InstructionCosts {
        rdtsc: per_op(&|| {
            core::hint::black_box(xen::raw::cpu::read_tsc());
        }),
        pause: per_op(&core::hint::spin_loop),
        hypercall: per_op(&|| {
            let _ = core::hint::black_box(xd::version(&xen.hv));
        }),
        rate,
    }
}

/// `SCHEDOP_shutdown`; returns only if Xen refused (or we are not under Xen).
pub fn shutdown(reason: ShutdownReason) {
    // SAFETY: only called when CPUID showed Xen (see `power`), at CPL 0.
    let hv = unsafe { NativeHypervisor::detect() };
    let refused = xd::shutdown(&hv, reason);
    log::error!("SCHEDOP_shutdown({reason:?}) refused: {refused:?}");
}
