// SPDX-License-Identifier: MIT OR Apache-2.0
//! Bring-up of a PVH/HVM domain: Xen's CPUID leaves, `shared_info`, HVM parameters
//! (xenstore and console rings), event upcall delivery, `vcpu_info` placement, starting
//! secondary vCPUs, and shutdown.

use crate::abi::cpuid::*;
use crate::abi::event_channel::EvtchnPort;
use crate::abi::hvm::*;
use crate::abi::memory::{E820Entry, XenAddToPhysmap, XENMAPSPACE_SHARED_INFO};
use crate::abi::sched::*;
use crate::abi::shared_info::VcpuInfo;
use crate::abi::vcpu::*;
use crate::abi::version::XenFeatureInfo;
use crate::abi::{DomId, DOMID_SELF, PAGE_SIZE};
use crate::error::{check, XenError};
use crate::hypercall::*;
use core::mem::size_of;

/// What Xen's CPUID leaves say about this domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XenCpuid {
    pub base_leaf: u32,
    pub max_leaf: u32,
    pub major: u16,
    pub minor: u16,
    /// `XEN_HVM_CPUID_*` (leaf base+4 EAX), 0 if the leaf is missing.
    pub hvm_features: u32,
    /// Our vCPU id, if Xen reports it.
    pub vcpu_id: Option<u32>,
    /// Our domain id, if Xen reports it.
    pub domid: Option<DomId>,
    /// The rate our TSC counts at in kHz (leaf base+3 ECX), 0 if the leaf is missing
    /// or Xen does not say.
    pub tsc_khz: u32,
}

impl XenCpuid {
    /// Reads the leaves at `base_leaf` (0x40000000 or a later 0x100 step; the kernel's
    /// hypervisor detection finds it) through `cpuid(leaf, subleaf)`. `None` if the
    /// signature there is not Xen's.
    pub fn read(
        base_leaf: u32,
        mut cpuid: impl FnMut(u32, u32) -> (u32, u32, u32, u32),
    ) -> Option<Self> {
        let (max_leaf, ebx, ecx, edx) = cpuid(base_leaf, 0);
        if (ebx, ecx, edx)
            != (
                XEN_CPUID_SIGNATURE_EBX,
                XEN_CPUID_SIGNATURE_ECX,
                XEN_CPUID_SIGNATURE_EDX,
            )
        {
            return None;
        }
        let (version, ..) = cpuid(base_leaf + LEAF_VERSION, 0);
        let (hvm_features, vcpu, domid, _) = if max_leaf >= base_leaf + LEAF_HVM_FEATURES {
            cpuid(base_leaf + LEAF_HVM_FEATURES, 0)
        } else {
            (0, 0, 0, 0)
        };
        let (_, _, tsc_khz, _) = if max_leaf >= base_leaf + LEAF_TIME {
            cpuid(base_leaf + LEAF_TIME, 0)
        } else {
            (0, 0, 0, 0)
        };
        Some(Self {
            base_leaf,
            max_leaf,
            major: (version >> 16) as u16,
            minor: version as u16,
            hvm_features,
            vcpu_id: (hvm_features & XEN_HVM_CPUID_VCPU_ID_PRESENT != 0).then_some(vcpu),
            domid: (hvm_features & XEN_HVM_CPUID_DOMID_PRESENT != 0).then_some(domid as DomId),
            tsc_khz,
        })
    }
}

/// Places the `shared_info` page at guest frame `gpfn` (a page of ours that Xen replaces).
pub fn map_shared_info<H: Hypervisor + ?Sized>(hv: &H, gpfn: u64) -> Result<(), XenError> {
    let mut arg = XenAddToPhysmap {
        domid: DOMID_SELF,
        size: 0,
        space: XENMAPSPACE_SHARED_INFO,
        idx: 0,
        gpfn,
    };
    check(hv.hypercall(Hypercall::Memory(MemoryOp::AddToPhysmap(&mut arg)))).map(drop)
}

/// The domain's memory map as Xen keeps it (`XENMEM_memory_map`); returns the count.
pub fn memory_map<H: Hypervisor + ?Sized>(
    hv: &H,
    entries: &mut [E820Entry],
) -> Result<usize, XenError> {
    check(hv.hypercall(Hypercall::Memory(MemoryOp::MemoryMap(entries)))).map(|n| n as usize)
}

pub fn hvm_get_param<H: Hypervisor + ?Sized>(hv: &H, index: u32) -> Result<u64, XenError> {
    let mut arg = XenHvmParam {
        domid: DOMID_SELF,
        pad: 0,
        index,
        value: 0,
    };
    check(hv.hypercall(Hypercall::Hvm(HvmOp::GetParam(&mut arg))))?;
    Ok(arg.value)
}

pub fn hvm_set_param<H: Hypervisor + ?Sized>(
    hv: &H,
    index: u32,
    value: u64,
) -> Result<(), XenError> {
    let mut arg = XenHvmParam {
        domid: DOMID_SELF,
        pad: 0,
        index,
        value,
    };
    check(hv.hypercall(Hypercall::Hvm(HvmOp::SetParam(&mut arg)))).map(drop)
}

/// Where a PV ring page is and which event channel kicks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingParams {
    pub pfn: u64,
    pub evtchn: EvtchnPort,
}

fn ring_params<H: Hypervisor + ?Sized>(
    hv: &H,
    pfn: u32,
    evtchn: u32,
) -> Result<RingParams, XenError> {
    let pfn = hvm_get_param(hv, pfn)?;
    let evtchn = hvm_get_param(hv, evtchn)?;
    // 0 means "not set up by the toolstack" (e.g. plain QEMU without Xen).
    if pfn == 0 || evtchn == 0 || evtchn > u64::from(u32::MAX) {
        return Err(XenError::NoDev);
    }
    Ok(RingParams {
        pfn,
        evtchn: evtchn as EvtchnPort,
    })
}

/// The xenstore ring (`HVM_PARAM_STORE_PFN`/`STORE_EVTCHN`).
pub fn store_params<H: Hypervisor + ?Sized>(hv: &H) -> Result<RingParams, XenError> {
    ring_params(hv, HVM_PARAM_STORE_PFN, HVM_PARAM_STORE_EVTCHN)
}

/// The PV console ring (`HVM_PARAM_CONSOLE_PFN`/`CONSOLE_EVTCHN`).
pub fn console_params<H: Hypervisor + ?Sized>(hv: &H) -> Result<RingParams, XenError> {
    ring_params(hv, HVM_PARAM_CONSOLE_PFN, HVM_PARAM_CONSOLE_EVTCHN)
}

/// How event upcalls arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpcallMode {
    /// `HVMOP_set_evtchn_upcall_vector`: a LAPIC vector per vCPU; the handler must EOI.
    PerVcpuVector,
    /// `HVM_PARAM_CALLBACK_IRQ` vector type: domain-wide, not through the LAPIC (no
    /// EOI); Xen re-injects while `evtchn_upcall_pending` is set, so the handler must
    /// clear it.
    CallbackVector,
}

/// Routes `vcpu`'s event upcalls to IDT `vector`: the per-vCPU vector if Xen offers it,
/// else the domain-wide callback vector (set once; harmless to repeat).
pub fn setup_upcall<H: Hypervisor + ?Sized>(
    hv: &H,
    vcpu: u32,
    vector: u8,
) -> Result<UpcallMode, XenError> {
    let mut arg = XenHvmEvtchnUpcallVector { vcpu, vector };
    match check(hv.hypercall(Hypercall::Hvm(HvmOp::SetEvtchnUpcallVector(&mut arg)))) {
        Ok(_) => Ok(UpcallMode::PerVcpuVector),
        Err(_) => {
            hvm_set_param(hv, HVM_PARAM_CALLBACK_IRQ, callback_via_vector(vector))?;
            Ok(UpcallMode::CallbackVector)
        }
    }
}

/// Tells the toolstack that this domain takes its control requests (`control/shutdown`)
/// once its vCPUs have per-vCPU upcall vectors: libxl offers `xl shutdown` and `xl
/// reboot` to an HVM domain only when `HVM_PARAM_CALLBACK_IRQ` is not 0, which such a
/// domain otherwise leaves at 0. As Linux (`xen_set_upcall_vector`), it is set to 1: GSI
/// 1, which Xen never raises for events while vCPU 0 has its own vector (and a PVH
/// domain has no IO-APIC to raise it on). Not for the callback-vector mode, whose value
/// is already set.
pub fn announce_pv_control<H: Hypervisor + ?Sized>(hv: &H) -> Result<(), XenError> {
    hvm_set_param(hv, HVM_PARAM_CALLBACK_IRQ, 1)
}

/// Moves `vcpu`'s `vcpu_info` to guest-physical address `gpa` (e.g. its per-CPU area;
/// needed for vCPUs >= 32, which have no slot in `shared_info`). Once per vCPU.
pub fn register_vcpu_info<H: Hypervisor + ?Sized>(
    hv: &H,
    vcpu: u32,
    gpa: u64,
) -> Result<(), XenError> {
    let offset = gpa % PAGE_SIZE as u64;
    if offset + size_of::<VcpuInfo>() as u64 > PAGE_SIZE as u64 || !offset.is_multiple_of(8) {
        return Err(XenError::Inval);
    }
    let mut info = VcpuRegisterVcpuInfo {
        mfn: gpa / PAGE_SIZE as u64,
        offset: offset as u32,
        rsvd: 0,
    };
    check(hv.hypercall(Hypercall::Vcpu(VcpuOp::RegisterVcpuInfo {
        vcpu,
        info: &mut info,
    })))
    .map(drop)
}

/// `XENVER_get_features` submap `index` (`XENFEAT_*` bits).
pub fn features<H: Hypervisor + ?Sized>(hv: &H, index: u32) -> Result<u32, XenError> {
    let mut info = XenFeatureInfo {
        submap_idx: index,
        submap: 0,
    };
    check(hv.hypercall(Hypercall::Version(VersionOp::GetFeatures(&mut info))))?;
    Ok(info.submap)
}

/// Xen's (major, minor) version.
pub fn version<H: Hypervisor + ?Sized>(hv: &H) -> Result<(u16, u16), XenError> {
    let v = check(hv.hypercall(Hypercall::Version(VersionOp::Version)))?;
    Ok(((v >> 16) as u16, v as u16))
}

/// Writes to Xen's own console (`console_io`); shows up as `(d<N>)` lines on the
/// hypervisor serial log if `guest_loglvl` allows. Early debugging only.
pub fn console_io_write<H: Hypervisor + ?Sized>(hv: &H, bytes: &[u8]) -> Result<(), XenError> {
    check(hv.hypercall(Hypercall::ConsoleWrite(bytes))).map(drop)
}

/// `SCHEDOP_yield`: let another vCPU run on this pCPU.
pub fn yield_now<H: Hypervisor + ?Sized>(hv: &H) -> Result<(), XenError> {
    check(hv.hypercall(Hypercall::Sched(SchedOp::Yield))).map(drop)
}

/// `SCHEDOP_block`: sleep until an event is deliverable. Not wake-up safe on its own for
/// HVM/PVH vCPUs: a sleep on upcalls uses `evtchn::idle_wait` (see the `evtchn` module
/// docs).
pub fn block<H: Hypervisor + ?Sized>(hv: &H) -> Result<(), XenError> {
    check(hv.hypercall(Hypercall::Sched(SchedOp::Block))).map(drop)
}

/// Why the domain stops (`SHUTDOWN_*`): what `xl list`/`xl destroy` report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownReason {
    Poweroff,
    Reboot,
    Crash,
}

/// `SCHEDOP_shutdown`: returns only if Xen refused.
pub fn shutdown<H: Hypervisor + ?Sized>(hv: &H, reason: ShutdownReason) -> XenError {
    let reason = match reason {
        ShutdownReason::Poweroff => SHUTDOWN_POWEROFF,
        ShutdownReason::Reboot => SHUTDOWN_REBOOT,
        ShutdownReason::Crash => SHUTDOWN_CRASH,
    };
    let mut arg = SchedShutdown { reason };
    match check(hv.hypercall(Hypercall::Sched(SchedOp::Shutdown(&mut arg)))) {
        Err(e) => e,
        // Xen does not return from a successful shutdown; a fake does.
        Ok(_) => XenError::Other(0),
    }
}

/// Where a secondary vCPU starts, already in long mode: Xen loads flat 64-bit CS/DS/SS/ES
/// and a busy TSS; the entry code loads its own GDT, IDT and TR first thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongModeStart {
    pub rip: u64,
    pub rsp: u64,
    /// Passed in RDI (the System V first argument), e.g. the vCPU's per-CPU block.
    pub arg: u64,
    /// The BSP's CR3/CR0/CR4/EFER (CR0.PG, CR4.PAE and EFER.LME are required).
    pub cr3: u64,
    pub cr0: u64,
    pub cr4: u64,
    pub efer: u64,
}

const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
/// RFLAGS bit 1 is always set; interrupts start disabled.
const RFLAGS_FIXED: u64 = 1 << 1;

/// The `vcpu_hvm_context` for [`start_vcpu`], checked the way Xen checks it.
pub fn long_mode_context(start: &LongModeStart) -> Result<VcpuHvmContext, XenError> {
    let canonical = ((start.rip as i64) << 16 >> 16) as u64 == start.rip;
    if !canonical
        || start.cr0 & CR0_PG == 0
        || start.cr4 & CR4_PAE == 0
        || start.efer & EFER_LME == 0
    {
        return Err(XenError::Inval);
    }
    Ok(VcpuHvmContext {
        mode: VCPU_HVM_MODE_64B,
        pad: 0,
        x86_64: VcpuHvmX86_64 {
            rip: start.rip,
            rsp: start.rsp,
            rdi: start.arg,
            rflags: RFLAGS_FIXED,
            cr0: start.cr0,
            cr3: start.cr3,
            cr4: start.cr4,
            efer: start.efer,
            ..Default::default()
        },
        _union_tail: 0,
    })
}

/// Starts secondary vCPU `vcpu` (`VCPUOP_initialise` + `VCPUOP_up`). `Err(Exist)` means
/// the vCPU was already initialised (by the toolstack or an earlier attempt): start it
/// with INIT-SIPI-SIPI instead.
pub fn start_vcpu<H: Hypervisor + ?Sized>(
    hv: &H,
    vcpu: u32,
    start: &LongModeStart,
) -> Result<(), XenError> {
    let context = long_mode_context(start)?;
    check(hv.hypercall(Hypercall::Vcpu(VcpuOp::Initialise {
        vcpu,
        context: &context,
    })))?;
    check(hv.hypercall(Hypercall::Vcpu(VcpuOp::Up(vcpu)))).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::errno;
    use crate::fake::FakeXen;

    fn fake_cpuid(
        base: u32,
        max: u32,
        features: u32,
    ) -> impl FnMut(u32, u32) -> (u32, u32, u32, u32) {
        move |leaf, _sub| match leaf - base {
            0 => (
                max,
                XEN_CPUID_SIGNATURE_EBX,
                XEN_CPUID_SIGNATURE_ECX,
                XEN_CPUID_SIGNATURE_EDX,
            ),
            1 => ((4 << 16) | 17, 0, 0, 0),
            3 => (0, 0, 2_918_400, 1),
            4 => (features, 1, 9, 0),
            _ => (0, 0, 0, 0),
        }
    }

    #[test]
    fn cpuid_leaves_give_version_vcpu_and_domid() {
        let flags = XEN_HVM_CPUID_VCPU_ID_PRESENT
            | XEN_HVM_CPUID_DOMID_PRESENT
            | XEN_HVM_CPUID_UPCALL_VECTOR;
        let info =
            XenCpuid::read(0x4000_0100, fake_cpuid(0x4000_0100, 0x4000_0105, flags)).unwrap();
        assert_eq!((info.major, info.minor), (4, 17));
        assert_eq!(info.vcpu_id, Some(1));
        assert_eq!(info.domid, Some(9));
        assert_ne!(info.hvm_features & XEN_HVM_CPUID_UPCALL_VECTOR, 0);
        assert_eq!(info.tsc_khz, 2_918_400);
        // Old Xen without leaf 5: no ids.
        let old = XenCpuid::read(0x4000_0000, fake_cpuid(0x4000_0000, 0x4000_0002, flags)).unwrap();
        assert_eq!((old.vcpu_id, old.domid, old.hvm_features), (None, None, 0));
        // Nor the time leaf: no TSC rate, not the next block's leaf read as one.
        assert_eq!(old.tsc_khz, 0);
        // Not Xen.
        assert!(XenCpuid::read(0x4000_0000, |_, _| (0x4000_0001, 1, 2, 3)).is_none());
    }

    #[test]
    fn ring_params_come_from_hvm_params() {
        let xen = FakeXen::new();
        assert_eq!(store_params(&xen), Err(XenError::Inval));
        xen.with(|s| {
            s.params.insert(HVM_PARAM_STORE_PFN, 0xfeffc);
            s.params.insert(HVM_PARAM_STORE_EVTCHN, 1);
            s.params.insert(HVM_PARAM_CONSOLE_PFN, 0xfefff);
            s.params.insert(HVM_PARAM_CONSOLE_EVTCHN, 0);
        });
        assert_eq!(
            store_params(&xen),
            Ok(RingParams {
                pfn: 0xfeffc,
                evtchn: 1
            })
        );
        assert_eq!(
            console_params(&xen),
            Err(XenError::NoDev),
            "evtchn 0: not set up"
        );
    }

    #[test]
    fn upcall_prefers_the_per_vcpu_vector_and_falls_back() {
        let xen = FakeXen::new();
        assert_eq!(setup_upcall(&xen, 1, 0xf3), Ok(UpcallMode::PerVcpuVector));
        xen.with(|s| {
            assert_eq!(s.upcall_vectors, [(1, 0xf3)]);
            assert!(!s.params.contains_key(&HVM_PARAM_CALLBACK_IRQ));
            s.upcall_vector_rc = -(errno::ENOSYS as i64);
        });
        assert_eq!(setup_upcall(&xen, 0, 0xf3), Ok(UpcallMode::CallbackVector));
        xen.with(|s| assert_eq!(s.params[&HVM_PARAM_CALLBACK_IRQ], 0x0200_0000_0000_00f3));
    }

    #[test]
    fn pv_control_is_announced_by_a_non_zero_callback_irq() {
        let xen = FakeXen::new();
        setup_upcall(&xen, 0, 0xf3).unwrap();
        announce_pv_control(&xen).unwrap();
        // libxl's libxl__domain_pvcontrol_available: the value is not 0.
        xen.with(|s| assert_eq!(s.params[&HVM_PARAM_CALLBACK_IRQ], 1));
    }

    #[test]
    fn shared_info_and_vcpu_info_placement() {
        let xen = FakeXen::new();
        map_shared_info(&xen, 0x1234).unwrap();
        register_vcpu_info(&xen, 2, 0x5000 + 0xfc0).unwrap();
        assert_eq!(
            register_vcpu_info(&xen, 3, 0x5000 + 0xfc8),
            Err(XenError::Inval),
            "crosses a page"
        );
        assert_eq!(
            register_vcpu_info(&xen, 3, 0x5004),
            Err(XenError::Inval),
            "misaligned"
        );
        xen.with(|s| {
            assert_eq!(s.physmap[0].space, XENMAPSPACE_SHARED_INFO);
            assert_eq!(s.physmap[0].gpfn, 0x1234);
            assert_eq!(
                s.vcpu_info_registered,
                [(
                    2,
                    VcpuRegisterVcpuInfo {
                        mfn: 5,
                        offset: 0xfc0,
                        rsvd: 0
                    }
                )]
            );
        });
    }

    #[test]
    fn secondary_vcpus_start_in_long_mode() {
        let xen = FakeXen::new();
        let start = LongModeStart {
            rip: 0xffff_8000_0010_0000,
            rsp: 0x20_0000,
            arg: 7,
            cr3: 0x1000,
            cr0: 0x8000_0011,
            cr4: 0x20,
            efer: 0x500,
        };
        start_vcpu(&xen, 1, &start).unwrap();
        xen.with(|s| {
            let (vcpu, ctx) = s.vcpus_initialised[0];
            assert_eq!(vcpu, 1);
            assert_eq!((ctx.mode, ctx.pad), (VCPU_HVM_MODE_64B, 0));
            assert_eq!(
                (ctx.x86_64.rip, ctx.x86_64.rsp, ctx.x86_64.rdi),
                (start.rip, start.rsp, 7)
            );
            assert_eq!(ctx.x86_64.rflags, 2, "interrupts off");
            assert_eq!(s.vcpus_up, [1]);
        });
        assert_eq!(
            start_vcpu(
                &xen,
                2,
                &LongModeStart {
                    rip: 0x0000_8000_0000_0000,
                    ..start
                }
            ),
            Err(XenError::Inval)
        );
        assert_eq!(
            start_vcpu(&xen, 2, &LongModeStart { cr0: 0x11, ..start }),
            Err(XenError::Inval)
        );
        xen.with(|s| s.vcpu_initialise_rc = -(errno::EEXIST as i64));
        assert_eq!(start_vcpu(&xen, 3, &start), Err(XenError::Exist));
        xen.with(|s| assert_eq!(s.vcpus_up, [1], "not brought up after a failed initialise"));
    }

    #[test]
    fn version_features_console_and_shutdown() {
        let xen = FakeXen::new();
        assert_eq!(version(&xen), Ok((4, 17)));
        assert_ne!(
            features(&xen, 0).unwrap() & (1 << crate::abi::version::XENFEAT_HVM_CALLBACK_VECTOR),
            0
        );
        console_io_write(&xen, b"early\n").unwrap();
        yield_now(&xen).unwrap();
        block(&xen).unwrap();
        let mut map = [E820Entry::default(); 4];
        assert_eq!(memory_map(&xen, &mut map), Ok(2));
        let _ = shutdown(&xen, ShutdownReason::Crash);
        xen.with(|s| {
            assert_eq!(s.console, b"early\n");
            assert_eq!(s.shutdown_reason, Some(SHUTDOWN_CRASH));
            assert_eq!(s.yields, 1);
            assert!(s.calls.iter().any(|c| c.contains("Block")));
        });
    }
}
