//! The kernel side of the Xen platform layer: it owns the real hypervisor, the mapped
//! `shared_info` page and each vCPU's `vcpu_info`, and wires event-channel upcalls
//! into the trap table. The `xen` crate holds the ABI and the host-tested logic; this
//! module holds only what needs the running kernel (frames, IDT, per-CPU data).

pub mod events;
pub mod vcpus;

use crate::arch::paging::IDENTITY_MAPPED_LIMIT;
use crate::smp::MAX_CPUS;
use xen::abi::hvm::{XenHvmParam, HVM_PARAM_CALLBACK_IRQ};
use xen::abi::memory::{XenAddToPhysmap, XENMAPSPACE_SHARED_INFO};
use xen::abi::sched::{SchedShutdown, SHUTDOWN_CRASH, SHUTDOWN_POWEROFF};
use xen::abi::vcpu::VcpuRegisterVcpuInfo;
use xen::abi::DOMID_SELF;
use xen::error::check;
use xen::hypercall::{HvmOp, MemoryOp, SchedOp, VcpuOp};
use xen::raw::hypercall::NativeHypervisor;
use xen::shared_info::{SharedInfoPage, VcpuInfoView};
use xen::{Hypercall, Hypervisor, SharedMem, XenError};

pub struct Platform {
    pub hv: NativeHypervisor,
    pub shared: SharedInfoPage,
    /// Each vCPU's registered `vcpu_info` (64 bytes in a page of its own).
    vcpu_info: [spin::Once<VcpuInfoView>; MAX_CPUS],
}

static PLATFORM: spin::Once<Platform> = spin::Once::new();

/// The platform, once `init` succeeded (only under Xen).
pub fn get() -> Option<&'static Platform> {
    PLATFORM.get()
}

#[derive(Debug)]
pub enum InitError {
    NoFrame,
    Hypercall(&'static str, XenError),
}

impl core::fmt::Display for InitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InitError::NoFrame => write!(f, "no free frame"),
            InitError::Hypercall(what, e) => write!(f, "{what} failed: {e:?}"),
        }
    }
}

fn hypercall_result(what: &'static str, rc: i64) -> Result<u64, InitError> {
    check(rc).map_err(|e| InitError::Hypercall(what, e))
}

/// A zeroed frame, owned by the platform for good.
fn zeroed_frame() -> Result<u64, InitError> {
    let frame = crate::mm::allocate_frame().map_err(|_| InitError::NoFrame)?;
    debug_assert!(frame + 4096 <= IDENTITY_MAPPED_LIMIT);
    // SAFETY: a fresh frame from the allocator, identity mapped, used by nobody else.
    unsafe { core::ptr::write_bytes(frame as *mut u8, 0, 4096) };
    Ok(frame)
}

/// Maps `shared_info` and registers the boot vCPU's `vcpu_info`. Call once, on the
/// boot CPU, after memory is set up, only under Xen.
pub fn init() -> Result<&'static Platform, InitError> {
    // SAFETY: the caller checked CPUID for Xen; we run at CPL 0 as an HVM/PVH guest,
    // and the instruction matches the CPU vendor.
    let hv = unsafe { NativeHypervisor::detect() };
    let frame = zeroed_frame()?;
    let mut map = XenAddToPhysmap {
        domid: DOMID_SELF,
        size: 0,
        space: XENMAPSPACE_SHARED_INFO,
        idx: 0,
        gpfn: frame >> 12,
    };
    hypercall_result(
        "XENMEM_add_to_physmap(shared_info)",
        hv.hypercall(Hypercall::Memory(MemoryOp::AddToPhysmap(&mut map))),
    )?;
    // SAFETY: the frame is now Xen's shared_info page, identity mapped at `frame`, and
    // only ever accessed through the atomics of SharedMem.
    let shared_mem = unsafe { SharedMem::new(frame as *mut u8, 4096) };
    let shared = SharedInfoPage::new(shared_mem).expect("a page holds shared_info");
    let platform = PLATFORM.call_once(|| Platform {
        hv,
        shared,
        vcpu_info: [const { spin::Once::new() }; MAX_CPUS],
    });
    platform.register_vcpu_info(0)?;
    // Tell the toolstack we take event upcalls (Linux does the same); the delivery itself
    // is per vCPU through HVMOP_set_evtchn_upcall_vector.
    let mut param = XenHvmParam {
        domid: DOMID_SELF,
        pad: 0,
        index: HVM_PARAM_CALLBACK_IRQ,
        value: 1,
    };
    if let Err(e) = check(hv.hypercall(Hypercall::Hvm(HvmOp::SetParam(&mut param)))) {
        log::warn!("xen: HVM_PARAM_CALLBACK_IRQ not set: {e:?}");
    }
    Ok(platform)
}

impl Platform {
    /// Gives `vcpu` its own `vcpu_info` page (any vCPU count, not only the legacy 32).
    pub fn register_vcpu_info(&self, vcpu: u32) -> Result<VcpuInfoView, InitError> {
        let frame = zeroed_frame()?;
        let mut info = VcpuRegisterVcpuInfo {
            mfn: frame >> 12,
            offset: 0,
            rsvd: 0,
        };
        let call = Hypercall::Vcpu(VcpuOp::RegisterVcpuInfo {
            vcpu,
            info: &mut info,
        });
        hypercall_result("VCPUOP_register_vcpu_info", self.hv.hypercall(call))?;
        // SAFETY: Xen now writes this vCPU's vcpu_info into the first 64 bytes of the
        // frame, which we own and touch only through SharedMem's atomics.
        let mem = unsafe { SharedMem::new(frame as *mut u8, 64) };
        let view = VcpuInfoView::new(mem).expect("64-byte aligned vcpu_info");
        Ok(*self.vcpu_info[vcpu as usize].call_once(|| view))
    }

    pub fn vcpu_info(&self, vcpu: usize) -> Option<VcpuInfoView> {
        self.vcpu_info.get(vcpu)?.get().copied()
    }
}

/// Why the domain stops, as Xen records it (`xl list` shows it).
#[derive(Clone, Copy, Debug)]
pub enum ShutdownReason {
    Poweroff,
    Crash,
}

/// `SCHEDOP_shutdown`; returns only if Xen refused (or we are not under Xen).
pub fn shutdown(reason: ShutdownReason) {
    // SAFETY: only called when CPUID showed Xen (see `power`), at CPL 0.
    let hv = unsafe { NativeHypervisor::detect() };
    let mut arg = SchedShutdown {
        reason: match reason {
            ShutdownReason::Poweroff => SHUTDOWN_POWEROFF,
            ShutdownReason::Crash => SHUTDOWN_CRASH,
        },
    };
    let rc = hv.hypercall(Hypercall::Sched(SchedOp::Shutdown(&mut arg)));
    log::error!("SCHEDOP_shutdown({reason:?}) returned {rc}");
}
