// SPDX-License-Identifier: MIT OR Apache-2.0
//! `event_channel_op` (`public/event_channel.h`).

use super::DomId;

pub type EvtchnPort = u32;

pub const EVTCHNOP_BIND_INTERDOMAIN: u64 = 0;
pub const EVTCHNOP_BIND_VIRQ: u64 = 1;
pub const EVTCHNOP_CLOSE: u64 = 3;
pub const EVTCHNOP_SEND: u64 = 4;
pub const EVTCHNOP_STATUS: u64 = 5;
pub const EVTCHNOP_ALLOC_UNBOUND: u64 = 6;
pub const EVTCHNOP_BIND_IPI: u64 = 7;
pub const EVTCHNOP_BIND_VCPU: u64 = 8;
pub const EVTCHNOP_UNMASK: u64 = 9;

/// `struct evtchn_alloc_unbound`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvtchnAllocUnbound {
    pub dom: DomId,
    pub remote_dom: DomId,
    /// OUT.
    pub port: EvtchnPort,
}

/// `struct evtchn_bind_interdomain`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvtchnBindInterdomain {
    pub remote_dom: DomId,
    pub remote_port: EvtchnPort,
    /// OUT.
    pub local_port: EvtchnPort,
}

/// `struct evtchn_close`, `evtchn_send`, `evtchn_unmask`: just a port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvtchnPortArg {
    pub port: EvtchnPort,
}

/// `struct evtchn_bind_vcpu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvtchnBindVcpu {
    pub port: EvtchnPort,
    pub vcpu: u32,
}

pub const EVTCHNSTAT_CLOSED: u32 = 0;
pub const EVTCHNSTAT_UNBOUND: u32 = 1;
pub const EVTCHNSTAT_INTERDOMAIN: u32 = 2;
pub const EVTCHNSTAT_PIRQ: u32 = 3;
pub const EVTCHNSTAT_VIRQ: u32 = 4;
pub const EVTCHNSTAT_IPI: u32 = 5;

/// `struct evtchn_status`. The union `u` is kept as raw words: `unbound.dom` and
/// `interdomain.dom` are the low 16 bits of `u[0]`, `interdomain.port` is `u[1]`,
/// `pirq`/`virq` are `u[0]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvtchnStatus {
    pub dom: DomId,
    pub port: EvtchnPort,
    /// OUT: `EVTCHNSTAT_*`.
    pub status: u32,
    /// OUT: vCPU the port notifies.
    pub vcpu: u32,
    pub u: [u32; 2],
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn alloc_unbound_layout() {
        assert_eq!(size_of::<EvtchnAllocUnbound>(), 8);
        assert_eq!(offset_of!(EvtchnAllocUnbound, remote_dom), 2);
        assert_eq!(offset_of!(EvtchnAllocUnbound, port), 4);
    }

    #[test]
    fn bind_interdomain_layout() {
        assert_eq!(size_of::<EvtchnBindInterdomain>(), 12);
        assert_eq!(offset_of!(EvtchnBindInterdomain, remote_port), 4);
        assert_eq!(offset_of!(EvtchnBindInterdomain, local_port), 8);
    }

    #[test]
    fn small_op_layouts() {
        // evtchn_close, evtchn_send and evtchn_unmask are all 4 bytes.
        assert_eq!(size_of::<EvtchnPortArg>(), 4);
        assert_eq!(size_of::<EvtchnBindVcpu>(), 8);
        assert_eq!(offset_of!(EvtchnBindVcpu, vcpu), 4);
    }

    #[test]
    fn status_layout() {
        assert_eq!(size_of::<EvtchnStatus>(), 24);
        assert_eq!(offset_of!(EvtchnStatus, port), 4);
        assert_eq!(offset_of!(EvtchnStatus, status), 8);
        assert_eq!(offset_of!(EvtchnStatus, vcpu), 12);
        // u.interdomain.dom at 16, u.interdomain.port at 20.
        assert_eq!(offset_of!(EvtchnStatus, u), 16);
    }
}
