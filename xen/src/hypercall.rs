// SPDX-License-Identifier: MIT OR Apache-2.0
//! Hypercalls as typed requests behind the [`Hypervisor`] trait.
//!
//! Each [`Hypercall`] variant carries Rust references to the ABI structs it passes, so
//! a host-test fake can read and fill them in safe code, while the real implementation
//! (`raw::hypercall::NativeHypervisor`) turns them into guest pointers and issues
//! `vmcall`/`vmmcall`.

use crate::abi::event_channel::*;
use crate::abi::grant_table::*;
use crate::abi::hvm::*;
use crate::abi::memory::*;
use crate::abi::sched::SchedShutdown;
use crate::abi::vcpu::{VcpuHvmContext, VcpuRegisterVcpuInfo};
use crate::abi::version::XenFeatureInfo;
use crate::abi::DomId;

/// One hypercall with its arguments.
#[derive(Debug)]
pub enum Hypercall<'a> {
    Memory(MemoryOp<'a>),
    Hvm(HvmOp<'a>),
    Evtchn(EvtchnOp<'a>),
    Gnttab(GnttabOp<'a>),
    Sched(SchedOp<'a>),
    Vcpu(VcpuOp<'a>),
    /// `console_io(CONSOLEIO_write)`: Xen's own console (debug output).
    ConsoleWrite(&'a [u8]),
    Version(VersionOp<'a>),
}

#[derive(Debug)]
pub enum MemoryOp<'a> {
    AddToPhysmap(&'a mut XenAddToPhysmap),
    RemoveFromPhysmap(&'a mut XenRemoveFromPhysmap),
    /// Returns the number of entries Xen filled in.
    MemoryMap(&'a mut [E820Entry]),
}

#[derive(Debug)]
pub enum HvmOp<'a> {
    SetParam(&'a mut XenHvmParam),
    GetParam(&'a mut XenHvmParam),
    SetEvtchnUpcallVector(&'a mut XenHvmEvtchnUpcallVector),
}

#[derive(Debug)]
pub enum EvtchnOp<'a> {
    AllocUnbound(&'a mut EvtchnAllocUnbound),
    BindInterdomain(&'a mut EvtchnBindInterdomain),
    Send(&'a mut EvtchnPortArg),
    Close(&'a mut EvtchnPortArg),
    Unmask(&'a mut EvtchnPortArg),
    BindVcpu(&'a mut EvtchnBindVcpu),
    Status(&'a mut EvtchnStatus),
}

#[derive(Debug)]
pub enum GnttabOp<'a> {
    /// Batched; per-entry results in `status`/`handle`.
    MapGrantRef(&'a mut [GnttabMapGrantRef]),
    UnmapGrantRef(&'a mut [GnttabUnmapGrantRef]),
    Copy(&'a mut [GnttabCopy]),
    QuerySize(&'a mut GnttabQuerySize),
    /// `nr_frames = frames.len()`; Xen fills `frames` and `status`.
    SetupTable {
        dom: DomId,
        frames: &'a mut [u64],
        status: &'a mut i16,
    },
}

#[derive(Debug)]
pub enum SchedOp<'a> {
    Yield,
    Block,
    Shutdown(&'a mut SchedShutdown),
    /// Returns when one of `ports` is pending (masked or not) or at `timeout_ns`
    /// (absolute Xen system time, 0 = none).
    Poll {
        ports: &'a [EvtchnPort],
        timeout_ns: u64,
    },
    /// An event send on each of `sends` (at most [`MAX_SENDS_BEFORE_POLL`]), then a
    /// [`SchedOp::Poll`], in one trap into Xen (`multicall`): a vCPU about to sleep that
    /// owes frontends their events pays one VM exit, not one per call. Returns the
    /// poll's result (a send's is not reported); -ENOSYS, with nothing done, where Xen
    /// refuses the multicall.
    PollAfterSends {
        sends: &'a [EvtchnPort],
        ports: &'a [EvtchnPort],
        timeout_ns: u64,
    },
}

/// Most sends one [`SchedOp::PollAfterSends`] carries.
pub const MAX_SENDS_BEFORE_POLL: usize = 8;

#[derive(Debug)]
pub enum VcpuOp<'a> {
    Initialise {
        vcpu: u32,
        context: &'a VcpuHvmContext,
    },
    Up(u32),
    Down(u32),
    IsUp(u32),
    StopPeriodicTimer(u32),
    RegisterVcpuInfo {
        vcpu: u32,
        info: &'a mut VcpuRegisterVcpuInfo,
    },
}

#[derive(Debug)]
pub enum VersionOp<'a> {
    /// Returns `major << 16 | minor`.
    Version,
    GetFeatures(&'a mut XenFeatureInfo),
}

/// Something that executes hypercalls: Xen itself, or a fake in tests.
///
/// The return value is Xen's: `>= 0` success (a count or value for some calls),
/// `-errno` failure (see [`crate::error::check`]).
pub trait Hypervisor: Sync {
    fn hypercall(&self, call: Hypercall<'_>) -> i64;
}

impl<H: Hypervisor + ?Sized> Hypervisor for &H {
    fn hypercall(&self, call: Hypercall<'_>) -> i64 {
        (**self).hypercall(call)
    }
}
