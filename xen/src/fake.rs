// SPDX-License-Identifier: MIT OR Apache-2.0
//! A fake Xen for host tests: keeps just enough state to answer the hypercalls the
//! crate issues, records every call, and injects failures on request.

use crate::abi::errno;
use crate::abi::grant_table::*;
use crate::abi::DomId;
use crate::hypercall::*;
use std::collections::{HashMap, HashSet};
use std::string::String;
use std::sync::Mutex;
use std::vec::Vec;

#[derive(Default)]
pub struct FakeState {
    pub calls: Vec<String>,
    pub next_port: u32,
    pub closed_ports: Vec<u32>,
    pub sent: Vec<u32>,
    pub unmasked: Vec<u32>,
    pub vcpu_of_port: HashMap<u32, u32>,
    /// Grants that fail to map/copy with this status; absent = okay.
    pub grant_status: HashMap<(DomId, GrantRef), i16>,
    /// Grants that answer GNTST_eagain this many more times.
    pub grant_eagain: HashMap<(DomId, GrantRef), u32>,
    /// Live mappings by handle.
    pub mapped: HashMap<GrantHandle, (DomId, GrantRef, u64)>,
    pub next_handle: GrantHandle,
    /// Next grant batch processes this many entries, then returns this rc.
    pub grant_batch_failure: Option<(usize, i64)>,
    /// Handles whose unmap fails.
    pub unmap_fails: HashSet<GrantHandle>,
    pub copies: Vec<GnttabCopy>,
    pub params: HashMap<u32, u64>,
    pub upcall_vector_rc: i64,
    pub upcall_vectors: Vec<(u32, u8)>,
    pub physmap: Vec<crate::abi::memory::XenAddToPhysmap>,
    pub grant_frames: (u32, u32),
    pub vcpu_initialise_rc: i64,
    pub vcpus_initialised: Vec<(u32, crate::abi::vcpu::VcpuHvmContext)>,
    pub vcpus_up: Vec<u32>,
    pub vcpu_info_registered: Vec<(u32, crate::abi::vcpu::VcpuRegisterVcpuInfo)>,
    pub shutdown_reason: Option<u32>,
    pub console: Vec<u8>,
    pub yields: usize,
    /// `SchedOp::PollAfterSends` calls taken (their sends go to `sent`), and what the
    /// next ones return instead (-ENOSYS: a Xen that refuses the multicall).
    pub polls_after_sends: usize,
    pub poll_after_sends_rc: Option<i64>,
}

#[derive(Default)]
pub struct FakeXen {
    pub state: Mutex<FakeState>,
}

const ENOSYS: i64 = -(errno::ENOSYS as i64);
const EINVAL: i64 = -(errno::EINVAL as i64);

impl FakeXen {
    pub fn new() -> Self {
        let fake = Self::default();
        {
            let mut s = fake.state.lock().unwrap();
            s.next_port = 5;
            s.next_handle = 100;
            s.grant_frames = (1, 32);
        }
        fake
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    fn grant_result(s: &mut FakeState, dom: DomId, gref: GrantRef) -> i16 {
        if let Some(left) = s.grant_eagain.get_mut(&(dom, gref)) {
            if *left > 0 {
                *left -= 1;
                return GNTST_EAGAIN;
            }
        }
        s.grant_status
            .get(&(dom, gref))
            .copied()
            .unwrap_or(GNTST_OKAY)
    }

    fn batch_limit(s: &mut FakeState, len: usize) -> (usize, i64) {
        match s.grant_batch_failure.take() {
            Some((done, rc)) => (done.min(len), rc),
            None => (len, 0),
        }
    }
}

impl Hypervisor for FakeXen {
    fn hypercall(&self, call: Hypercall<'_>) -> i64 {
        let mut guard = self.state.lock().unwrap();
        let s = &mut *guard;
        s.calls
            .push(std::format!("{call:?}").chars().take(60).collect());
        match call {
            Hypercall::Evtchn(op) => match op {
                EvtchnOp::AllocUnbound(arg) => {
                    arg.port = s.next_port;
                    s.next_port += 1;
                    0
                }
                EvtchnOp::BindInterdomain(arg) => {
                    if arg.remote_port == 0 {
                        return EINVAL;
                    }
                    arg.local_port = s.next_port;
                    s.next_port += 1;
                    0
                }
                EvtchnOp::Send(arg) => {
                    s.sent.push(arg.port);
                    0
                }
                EvtchnOp::Close(arg) => {
                    s.closed_ports.push(arg.port);
                    0
                }
                EvtchnOp::Unmask(arg) => {
                    s.unmasked.push(arg.port);
                    0
                }
                EvtchnOp::BindVcpu(arg) => {
                    s.vcpu_of_port.insert(arg.port, arg.vcpu);
                    0
                }
                EvtchnOp::Status(arg) => {
                    arg.status = crate::abi::event_channel::EVTCHNSTAT_INTERDOMAIN;
                    arg.vcpu = s.vcpu_of_port.get(&arg.port).copied().unwrap_or(0);
                    arg.u = [7, 42];
                    0
                }
            },
            Hypercall::Gnttab(op) => match op {
                GnttabOp::MapGrantRef(ops) => {
                    let (limit, rc) = Self::batch_limit(s, ops.len());
                    for op in ops.iter_mut().take(limit) {
                        let status = Self::grant_result(s, op.dom, op.ref_);
                        op.status = status;
                        if status == GNTST_OKAY {
                            op.handle = s.next_handle;
                            s.next_handle += 1;
                            s.mapped.insert(op.handle, (op.dom, op.ref_, op.host_addr));
                        }
                    }
                    rc
                }
                GnttabOp::UnmapGrantRef(ops) => {
                    let (limit, rc) = Self::batch_limit(s, ops.len());
                    for op in ops.iter_mut().take(limit) {
                        op.status = if s.unmap_fails.contains(&op.handle) {
                            GNTST_GENERAL_ERROR
                        } else if s.mapped.remove(&op.handle).is_some() {
                            GNTST_OKAY
                        } else {
                            GNTST_BAD_HANDLE
                        };
                    }
                    rc
                }
                GnttabOp::Copy(ops) => {
                    let (limit, rc) = Self::batch_limit(s, ops.len());
                    for op in ops.iter_mut().take(limit) {
                        let (dom, gref) = if op.flags & GNTCOPY_SOURCE_GREF != 0 {
                            (op.source.domid, op.source.u as GrantRef)
                        } else {
                            (op.dest.domid, op.dest.u as GrantRef)
                        };
                        op.status = if usize::from(op.source.offset) + usize::from(op.len) > 4096
                            || usize::from(op.dest.offset) + usize::from(op.len) > 4096
                        {
                            GNTST_BAD_COPY_ARG
                        } else {
                            Self::grant_result(s, dom, gref)
                        };
                        s.copies.push(*op);
                    }
                    rc
                }
                GnttabOp::QuerySize(arg) => {
                    arg.nr_frames = s.grant_frames.0;
                    arg.max_nr_frames = s.grant_frames.1;
                    arg.status = GNTST_OKAY;
                    0
                }
                GnttabOp::SetupTable { .. } => ENOSYS,
            },
            Hypercall::Hvm(op) => match op {
                HvmOp::GetParam(arg) => match s.params.get(&arg.index) {
                    Some(value) => {
                        arg.value = *value;
                        0
                    }
                    None => EINVAL,
                },
                HvmOp::SetParam(arg) => {
                    s.params.insert(arg.index, arg.value);
                    0
                }
                HvmOp::SetEvtchnUpcallVector(arg) => {
                    if s.upcall_vector_rc == 0 {
                        s.upcall_vectors.push((arg.vcpu, arg.vector));
                    }
                    s.upcall_vector_rc
                }
            },
            Hypercall::Memory(op) => match op {
                MemoryOp::AddToPhysmap(arg) => {
                    s.physmap.push(*arg);
                    0
                }
                MemoryOp::RemoveFromPhysmap(_) => 0,
                MemoryOp::MemoryMap(entries) => {
                    let n = entries.len().min(2);
                    for (i, e) in entries.iter_mut().take(n).enumerate() {
                        *e = crate::abi::memory::E820Entry {
                            addr: (i as u64) << 20,
                            size: 1 << 20,
                            kind: 1,
                        };
                    }
                    n as i64
                }
            },
            Hypercall::Sched(op) => match op {
                SchedOp::Yield => {
                    s.yields += 1;
                    0
                }
                SchedOp::Shutdown(arg) => {
                    s.shutdown_reason = Some(arg.reason);
                    0
                }
                SchedOp::Block | SchedOp::Poll { .. } => 0,
                SchedOp::PollAfterSends { sends, .. } => {
                    if let Some(rc) = s.poll_after_sends_rc {
                        return rc;
                    }
                    s.polls_after_sends += 1;
                    s.sent.extend_from_slice(sends);
                    0
                }
            },
            Hypercall::Vcpu(op) => match op {
                VcpuOp::Initialise { vcpu, context } => {
                    if s.vcpu_initialise_rc == 0 {
                        s.vcpus_initialised.push((vcpu, *context));
                    }
                    s.vcpu_initialise_rc
                }
                VcpuOp::Up(vcpu) => {
                    s.vcpus_up.push(vcpu);
                    0
                }
                VcpuOp::RegisterVcpuInfo { vcpu, info } => {
                    s.vcpu_info_registered.push((vcpu, *info));
                    0
                }
                VcpuOp::IsUp(vcpu) => i64::from(s.vcpus_up.contains(&vcpu)),
                VcpuOp::Down(_) | VcpuOp::StopPeriodicTimer(_) => 0,
            },
            Hypercall::ConsoleWrite(bytes) => {
                s.console.extend_from_slice(bytes);
                0
            }
            Hypercall::Version(op) => match op {
                VersionOp::Version => (4 << 16) | 17,
                VersionOp::GetFeatures(arg) => {
                    arg.submap = if arg.submap_idx == 0 {
                        1 << 8 | 1 << 2
                    } else {
                        0
                    };
                    0
                }
            },
        }
    }
}
