// SPDX-License-Identifier: MIT OR Apache-2.0
//! Issuing hypercalls from an HVM/PVH guest: `vmcall` on Intel (and other VMX vendors),
//! `vmmcall` on AMD and Hygon, chosen once from the CPUID vendor string. No hypercall
//! page is needed. ABI: index in RAX, arguments in RDI, RSI, RDX, R10, R8, result in RAX.

use crate::abi::hypercall_nr as nr;
use crate::abi::{event_channel, grant_table, hvm, memory, sched, vcpu, version};
use crate::abi::{memory::XenMemoryMap, sched::MulticallEntry, sched::SchedPoll, CONSOLEIO_WRITE};
use crate::hypercall::*;

/// Which instruction traps into Xen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HypercallInstruction {
    /// Intel VMX (`0f 01 c1`).
    Vmcall,
    /// AMD SVM (`0f 01 d9`).
    Vmmcall,
}

impl HypercallInstruction {
    /// The instruction for a CPUID leaf 0 vendor string (EBX, EDX, ECX order).
    pub fn for_vendor(vendor: &[u8; 12]) -> Self {
        match vendor {
            b"AuthenticAMD" | b"HygonGenuine" => Self::Vmmcall,
            _ => Self::Vmcall,
        }
    }

    /// Reads the vendor with CPUID leaf 0.
    #[cfg(target_arch = "x86_64")]
    pub fn detect() -> Self {
        let leaf0 = core::arch::x86_64::__cpuid(0);
        Self::for_vendor(&vendor_bytes(leaf0.ebx, leaf0.edx, leaf0.ecx))
    }
}

/// CPUID leaf 0 vendor bytes in EBX, EDX, ECX order ("GenuineIntel").
pub fn vendor_bytes(ebx: u32, edx: u32, ecx: u32) -> [u8; 12] {
    let mut vendor = [0u8; 12];
    vendor[0..4].copy_from_slice(&ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&edx.to_le_bytes());
    vendor[8..12].copy_from_slice(&ecx.to_le_bytes());
    vendor
}

/// The real hypervisor: traps into Xen.
#[derive(Clone, Copy, Debug)]
pub struct NativeHypervisor {
    instruction: HypercallInstruction,
}

impl NativeHypervisor {
    /// # Safety
    /// The caller must run as a Xen HVM/PVH guest at CPL 0 (CPUID shows the Xen
    /// signature) with `instruction` matching the CPU; otherwise hypercalls fault.
    pub unsafe fn new(instruction: HypercallInstruction) -> Self {
        Self { instruction }
    }

    /// # Safety
    /// As for [`NativeHypervisor::new`]; the instruction comes from the CPUID vendor.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn detect() -> Self {
        // SAFETY: forwarded contract.
        unsafe { Self::new(HypercallInstruction::detect()) }
    }

    pub fn instruction(&self) -> HypercallInstruction {
        self.instruction
    }

    #[cfg(target_arch = "x86_64")]
    fn raw(&self, op: u64, args: [u64; 5]) -> i64 {
        macro_rules! trap {
            ($insn:literal) => {{
                let ret: u64;
                // SAFETY: the constructor's contract says we are a Xen guest at CPL 0
                // with the right instruction. Every pointer in `args` was derived in
                // `hypercall` from a live Rust reference whose extent covers what Xen
                // reads or writes. Xen may clobber all argument registers (debug builds
                // poison them), hence `=> _`.
                unsafe {
                    core::arch::asm!(
                        $insn,
                        inlateout("rax") op => ret,
                        inlateout("rdi") args[0] => _,
                        inlateout("rsi") args[1] => _,
                        inlateout("rdx") args[2] => _,
                        inlateout("r10") args[3] => _,
                        inlateout("r8") args[4] => _,
                        options(nostack),
                    )
                }
                ret
            }};
        }
        let ret = match self.instruction {
            HypercallInstruction::Vmcall => trap!("vmcall"),
            HypercallInstruction::Vmmcall => trap!("vmmcall"),
        };
        ret as i64
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn raw(&self, _op: u64, _args: [u64; 5]) -> i64 {
        -(crate::abi::errno::ENOSYS as i64)
    }
}

/// Guest pointer to an argument Xen only reads.
fn ptr<T>(r: &T) -> u64 {
    r as *const T as u64
}

/// Guest pointer to an argument Xen may write.
fn ptr_mut<T>(r: &mut T) -> u64 {
    r as *mut T as u64
}

fn len_u32(len: usize) -> Option<u64> {
    u32::try_from(len).ok().map(u64::from)
}

const EINVAL: i64 = -(crate::abi::errno::EINVAL as i64);

/// `struct sched_poll` for `ports` (Xen reads them through the pointer) until
/// `timeout_ns`; `None` past a `u32` of ports.
fn sched_poll(ports: &[event_channel::EvtchnPort], timeout_ns: u64) -> Option<SchedPoll> {
    Some(SchedPoll {
        ports: ports.as_ptr() as u64,
        nr_ports: u32::try_from(ports.len()).ok()?,
        timeout: timeout_ns,
    })
}

impl Hypervisor for NativeHypervisor {
    fn hypercall(&self, call: Hypercall<'_>) -> i64 {
        match call {
            Hypercall::Memory(op) => match op {
                MemoryOp::AddToPhysmap(arg) => self.raw(
                    nr::MEMORY_OP,
                    [memory::XENMEM_ADD_TO_PHYSMAP, ptr_mut(arg), 0, 0, 0],
                ),
                MemoryOp::RemoveFromPhysmap(arg) => self.raw(
                    nr::MEMORY_OP,
                    [memory::XENMEM_REMOVE_FROM_PHYSMAP, ptr_mut(arg), 0, 0, 0],
                ),
                MemoryOp::MemoryMap(entries) => {
                    let Ok(nr_entries) = u32::try_from(entries.len()) else {
                        return EINVAL;
                    };
                    let mut map = XenMemoryMap {
                        nr_entries,
                        buffer: entries.as_mut_ptr() as u64,
                    };
                    let rc = self.raw(
                        nr::MEMORY_OP,
                        [memory::XENMEM_MEMORY_MAP, ptr_mut(&mut map), 0, 0, 0],
                    );
                    if rc < 0 {
                        rc
                    } else {
                        i64::from(map.nr_entries.min(nr_entries))
                    }
                }
            },
            Hypercall::Hvm(op) => {
                let (cmd, arg) = match op {
                    HvmOp::SetParam(arg) => (hvm::HVMOP_SET_PARAM, ptr_mut(arg)),
                    HvmOp::GetParam(arg) => (hvm::HVMOP_GET_PARAM, ptr_mut(arg)),
                    HvmOp::SetEvtchnUpcallVector(arg) => {
                        (hvm::HVMOP_SET_EVTCHN_UPCALL_VECTOR, ptr_mut(arg))
                    }
                };
                self.raw(nr::HVM_OP, [cmd, arg, 0, 0, 0])
            }
            Hypercall::Evtchn(op) => {
                use event_channel::*;
                let (cmd, arg) = match op {
                    EvtchnOp::AllocUnbound(arg) => (EVTCHNOP_ALLOC_UNBOUND, ptr_mut(arg)),
                    EvtchnOp::BindInterdomain(arg) => (EVTCHNOP_BIND_INTERDOMAIN, ptr_mut(arg)),
                    EvtchnOp::Send(arg) => (EVTCHNOP_SEND, ptr_mut(arg)),
                    EvtchnOp::Close(arg) => (EVTCHNOP_CLOSE, ptr_mut(arg)),
                    EvtchnOp::Unmask(arg) => (EVTCHNOP_UNMASK, ptr_mut(arg)),
                    EvtchnOp::BindVcpu(arg) => (EVTCHNOP_BIND_VCPU, ptr_mut(arg)),
                    EvtchnOp::Status(arg) => (EVTCHNOP_STATUS, ptr_mut(arg)),
                };
                self.raw(nr::EVENT_CHANNEL_OP, [cmd, arg, 0, 0, 0])
            }
            Hypercall::Gnttab(op) => {
                use grant_table::*;
                let (cmd, arg, count) = match op {
                    GnttabOp::MapGrantRef(ops) => (
                        GNTTABOP_MAP_GRANT_REF,
                        ops.as_mut_ptr() as u64,
                        len_u32(ops.len()),
                    ),
                    GnttabOp::UnmapGrantRef(ops) => (
                        GNTTABOP_UNMAP_GRANT_REF,
                        ops.as_mut_ptr() as u64,
                        len_u32(ops.len()),
                    ),
                    GnttabOp::Copy(ops) => {
                        (GNTTABOP_COPY, ops.as_mut_ptr() as u64, len_u32(ops.len()))
                    }
                    GnttabOp::QuerySize(arg) => (GNTTABOP_QUERY_SIZE, ptr_mut(arg), Some(1)),
                    GnttabOp::SetupTable {
                        dom,
                        frames,
                        status,
                    } => {
                        let Some(nr_frames) = len_u32(frames.len()) else {
                            return EINVAL;
                        };
                        let mut setup = GnttabSetupTable {
                            dom,
                            nr_frames: nr_frames as u32,
                            status: GNTST_GENERAL_ERROR,
                            frame_list: frames.as_mut_ptr() as u64,
                        };
                        let rc = self.raw(
                            nr::GRANT_TABLE_OP,
                            [GNTTABOP_SETUP_TABLE, ptr_mut(&mut setup), 1, 0, 0],
                        );
                        *status = setup.status;
                        return rc;
                    }
                };
                let Some(count) = count else {
                    return EINVAL;
                };
                self.raw(nr::GRANT_TABLE_OP, [cmd, arg, count, 0, 0])
            }
            Hypercall::Sched(op) => match op {
                SchedOp::Yield => self.raw(nr::SCHED_OP, [sched::SCHEDOP_YIELD, 0, 0, 0, 0]),
                SchedOp::Block => self.raw(nr::SCHED_OP, [sched::SCHEDOP_BLOCK, 0, 0, 0, 0]),
                SchedOp::Shutdown(arg) => self.raw(
                    nr::SCHED_OP,
                    [sched::SCHEDOP_SHUTDOWN, ptr_mut(arg), 0, 0, 0],
                ),
                SchedOp::Poll { ports, timeout_ns } => {
                    let Some(mut poll) = sched_poll(ports, timeout_ns) else {
                        return EINVAL;
                    };
                    self.raw(
                        nr::SCHED_OP,
                        [sched::SCHEDOP_POLL, ptr_mut(&mut poll), 0, 0, 0],
                    )
                }
                SchedOp::PollAfterSends {
                    sends,
                    ports,
                    timeout_ns,
                } => {
                    let (Some(mut poll), true) = (
                        sched_poll(ports, timeout_ns),
                        sends.len() <= MAX_SENDS_BEFORE_POLL,
                    ) else {
                        return EINVAL;
                    };
                    let mut send_args =
                        [event_channel::EvtchnPortArg { port: 0 }; MAX_SENDS_BEFORE_POLL];
                    let mut calls = [MulticallEntry::default(); MAX_SENDS_BEFORE_POLL + 1];
                    for ((call, arg), &port) in calls.iter_mut().zip(&mut send_args).zip(sends) {
                        arg.port = port;
                        call.op = nr::EVENT_CHANNEL_OP;
                        call.args[0] = event_channel::EVTCHNOP_SEND;
                        call.args[1] = ptr_mut(arg);
                    }
                    let n = sends.len();
                    calls[n].op = nr::SCHED_OP;
                    calls[n].args[0] = sched::SCHEDOP_POLL;
                    calls[n].args[1] = ptr_mut(&mut poll);
                    let rc = self.raw(
                        nr::MULTICALL,
                        [calls.as_mut_ptr() as u64, n as u64 + 1, 0, 0, 0],
                    );
                    if rc < 0 {
                        rc
                    } else {
                        calls[n].result as i64
                    }
                }
            },
            Hypercall::Vcpu(op) => {
                use vcpu::*;
                let (cmd, id, arg) = match op {
                    VcpuOp::Initialise { vcpu, context } => (VCPUOP_INITIALISE, vcpu, ptr(context)),
                    VcpuOp::Up(vcpu) => (VCPUOP_UP, vcpu, 0),
                    VcpuOp::Down(vcpu) => (VCPUOP_DOWN, vcpu, 0),
                    VcpuOp::IsUp(vcpu) => (VCPUOP_IS_UP, vcpu, 0),
                    VcpuOp::StopPeriodicTimer(vcpu) => (VCPUOP_STOP_PERIODIC_TIMER, vcpu, 0),
                    VcpuOp::RegisterVcpuInfo { vcpu, info } => {
                        (VCPUOP_REGISTER_VCPU_INFO, vcpu, ptr_mut(info))
                    }
                };
                self.raw(nr::VCPU_OP, [cmd, u64::from(id), arg, 0, 0])
            }
            Hypercall::ConsoleWrite(bytes) => {
                let Some(count) = len_u32(bytes.len()) else {
                    return EINVAL;
                };
                self.raw(
                    nr::CONSOLE_IO,
                    [CONSOLEIO_WRITE, count, bytes.as_ptr() as u64, 0, 0],
                )
            }
            Hypercall::Version(op) => match op {
                VersionOp::Version => {
                    self.raw(nr::XEN_VERSION, [version::XENVER_VERSION, 0, 0, 0, 0])
                }
                VersionOp::GetFeatures(arg) => self.raw(
                    nr::XEN_VERSION,
                    [version::XENVER_GET_FEATURES, ptr_mut(arg), 0, 0, 0],
                ),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instruction_follows_vendor() {
        assert_eq!(
            HypercallInstruction::for_vendor(b"GenuineIntel"),
            HypercallInstruction::Vmcall
        );
        assert_eq!(
            HypercallInstruction::for_vendor(b"AuthenticAMD"),
            HypercallInstruction::Vmmcall
        );
        assert_eq!(
            HypercallInstruction::for_vendor(b"HygonGenuine"),
            HypercallInstruction::Vmmcall
        );
        assert_eq!(
            HypercallInstruction::for_vendor(b"CentaurHauls"),
            HypercallInstruction::Vmcall
        );
    }

    #[test]
    fn vendor_bytes_use_ebx_edx_ecx_order() {
        // "GenuineIntel": EBX "Genu", EDX "ineI", ECX "ntel".
        let v = vendor_bytes(0x756e_6547, 0x4965_6e69, 0x6c65_746e);
        assert_eq!(&v, b"GenuineIntel");
    }
}
