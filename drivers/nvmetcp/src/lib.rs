// SPDX-License-Identifier: MIT OR Apache-2.0
//! The host side of NVMe over TCP (the NVMe-oF TCP transport binding, TP 8000), as a
//! state machine over a byte stream: no sockets, no clocks, no allocation.
//!
//! The caller owns the TCP connection (smoltcp in the image, a byte pipe in the tests)
//! and moves bytes: [`Queue::transmit`] fills the caller's send window,
//! [`Queue::receive`] eats what the target sent, and completions come out of
//! [`Queue::next_completion`]. Command data never passes through this crate's own
//! memory: it is copied between the stream and the caller's buffers through
//! [`DataPort`], named by the tag the caller gave the command.
//!
//! Layers:
//! - [`pdu`]: the wire format, and the checks every PDU from the target passes.
//! - [`Queue`]: one NVMe queue on one TCP connection: ICReq/ICResp, command capsules
//!   (in-capsule data up to the negotiated size), R2T -> H2CData (at most MAXH2CDATA
//!   per PDU), C2HData (with the SUCCESS short cut), CapsuleResp.
//! - [`sqe`]: the commands: Fabrics Connect, Property Get/Set, Identify, Keep Alive,
//!   Read, Write, Flush, Dataset Management.
//! - [`AdminSession`]: the admin queue from connect to a live controller (CAP, CC.EN,
//!   CSTS.RDY, Identify controller and namespace) and keep-alive afterwards;
//!   [`IoSession`]: one I/O queue (Connect with the admin queue's controller ID, then
//!   block I/O).
//! - [`ana`]: the ANA log page, read in bring-up and on each ANA change notice: whether
//!   a controller can serve the namespace at all.
//! - [`reconnect`]: when to try again after the target went away, and when to stop.
//!
//! Everything the target sends is untrusted: a PDU that breaks the protocol fails its
//! connection with a [`ProtocolError`]; nothing here panics on the target's input.
#![cfg_attr(not(any(test, feature = "fake")), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod ana;
pub mod crc32c;
pub mod pdu;
mod queue;
pub mod reconnect;
pub mod remote;
mod session;
pub mod sqe;

pub use ana::{AnaPath, AnaState};
pub use pdu::Digests;
pub use queue::{Completion, DataPort, Payload, Queue, QueueKind, SubmitError, MAX_DATA_LEN};
pub use reconnect::{Action, Reconnect, ReconnectPolicy, Share};
pub use session::{
    AdminSession, ControllerInfo, HostIdentity, IoSession, NamespaceInfo, SessionState,
    ADMIN_QUEUE_SLOTS,
};
pub use sqe::Status;

/// A broken rule of the protocol, found in what the target sent. The connection it came
/// on is finished; the values say what was wrong, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// A PDU type a host never receives (or not at this point).
    UnexpectedPduType(u8),
    /// Flags that the PDU type does not have, or digest flags without digests.
    BadFlags {
        pdu_type: u8,
        flags: u8,
    },
    BadHeaderLength {
        pdu_type: u8,
        hlen: u8,
    },
    BadDataOffset {
        pdu_type: u8,
        pdo: u8,
    },
    BadPduLength {
        pdu_type: u8,
        plen: u32,
    },
    /// ICResp: a PDU format version other than 1.0.
    BadVersion(u16),
    /// ICResp: the target wants data aligned (CPDA), which this host does not do.
    UnsupportedAlignment(u8),
    /// ICResp: digests other than those the host asked for (its DGST field).
    DigestMismatch(u8),
    /// A PDU header whose header digest does not match it: its fields cannot be trusted,
    /// so neither can the stream after it.
    HeaderDigest {
        pdu_type: u8,
    },
    /// ICResp: MAXH2CDATA below 4096 or not a multiple of 4.
    BadMaxH2cData(u32),
    /// A command identifier that names no command in flight.
    UnknownCommand(u16),
    /// Data or an R2T for a command that moves data the other way (or none).
    WrongDirection(u16),
    /// Data outside the command's buffer, or not where the previous PDU ended.
    DataOutOfOrder {
        cid: u16,
        expected: u32,
        offset: u32,
        len: u32,
    },
    /// An R2T asking for nothing, past the end, out of order, or while one is active.
    BadR2t {
        cid: u16,
        offset: u32,
        len: u32,
    },
    /// SUCCESS without LAST_PDU in a C2HData PDU.
    SuccessWithoutLast(u16),
    /// LAST_PDU on a C2HData PDU that does not end the transfer, or missing on the one
    /// that does.
    BadLastFlag(u16),
    /// A successful completion before all the data of a read arrived.
    ShortRead {
        cid: u16,
        received: u32,
        expected: u32,
    },
    /// A completion for a command whose data the host is still sending.
    ResponseDuringTransfer(u16),
    /// The target ended the connection (C2HTermReq); its fatal error status.
    Terminated {
        fes: u16,
    },
    /// Not a broken rule: the TCP connection under the queue closed, was reset or could
    /// not be made (reported by the caller).
    ConnectionLost,
}

/// Why a session is not (or no longer) usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    Protocol(ProtocolError),
    /// The target refused Connect (admin or I/O queue).
    ConnectRefused(ConnectRefusal),
    /// A bring-up command failed; `what` names it.
    Command {
        what: &'static str,
        status: Status,
    },
    /// The namespace does not exist (Identify Namespace returned an all-zero size).
    NamespaceMissing(u32),
    /// The controller does not offer what this host needs.
    Unsupported(&'static str),
    /// CSTS.CFS: the controller reported a fatal status.
    ControllerFatal,
    /// A bug on this side (reported rather than hidden).
    Internal(&'static str),
    /// `what` did not finish in time (CSTS.RDY after CC.EN, a keep-alive response, the
    /// bring-up as a whole).
    Timeout(&'static str),
    /// The controller reports the namespace's ANA group inaccessible (or in persistent
    /// loss) through it: another portal of the subsystem, or this one later, may serve.
    PathUnusable(AnaPath),
}

/// Why a target refused Connect, from its status and, for invalid parameters, the
/// attribute and byte offset it names (Connect response dword 0: IATTR bit 16, IPO bits
/// 0..16; Linux's nvmf_log_connect_error reads them the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectRefusal {
    /// The subsystem NQN names no subsystem on that port (Linux nvmet: Connect Invalid
    /// Parameters pointing at SUBNQN in the data).
    UnknownSubsystem,
    /// The host NQN is not among the subsystem's allowed hosts (Connect Invalid Host).
    HostNotAllowed,
    /// An I/O queue's controller ID is unknown to the target (the association is gone).
    UnknownController,
    /// Connect Controller Busy.
    Busy,
    /// Another invalid parameter: in the data (`data`) or the command, at byte `offset`.
    InvalidParameter {
        data: bool,
        offset: u16,
    },
    Other(Status),
}

impl ConnectRefusal {
    /// Offsets in Connect's data (struct nvmf_connect_data).
    const DATA_CNTLID: u16 = 16;
    const DATA_SUBNQN: u16 = 256;

    pub fn from_completion(status: Status, result: u64) -> Self {
        let (data, offset) = (result & (1 << 16) != 0, result as u16);
        match (status.code_type(), status.code()) {
            (1, 0x82) if data && offset == Self::DATA_SUBNQN => ConnectRefusal::UnknownSubsystem,
            (1, 0x82) if data && offset == Self::DATA_CNTLID => ConnectRefusal::UnknownController,
            (1, 0x82) => ConnectRefusal::InvalidParameter { data, offset },
            (1, 0x84) => ConnectRefusal::HostNotAllowed,
            (1, 0x81) => ConnectRefusal::Busy,
            _ => ConnectRefusal::Other(status),
        }
    }
}

impl core::fmt::Display for ConnectRefusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConnectRefusal::UnknownSubsystem => {
                f.write_str("the target has no subsystem of that NQN")
            }
            ConnectRefusal::HostNotAllowed => {
                f.write_str("the subsystem does not allow this host NQN (its allowed hosts)")
            }
            ConnectRefusal::UnknownController => {
                f.write_str("the target does not know the controller ID")
            }
            ConnectRefusal::Busy => f.write_str("the controller is busy"),
            ConnectRefusal::InvalidParameter { data, offset } => write!(
                f,
                "invalid parameter at byte {offset} of the Connect {}",
                if *data { "data" } else { "command" }
            ),
            ConnectRefusal::Other(status) => write!(f, "{status}"),
        }
    }
}

impl From<ProtocolError> for Error {
    fn from(e: ProtocolError) -> Self {
        Error::Protocol(e)
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Protocol(ProtocolError::ConnectionLost) => {
                f.write_str("the TCP connection to the target was lost")
            }
            Error::Protocol(ProtocolError::DigestMismatch(dgst)) => write!(
                f,
                "the target did not turn on the digests asked for (its ICResp DGST {dgst:#x})"
            ),
            Error::Protocol(e) => write!(f, "NVMe/TCP protocol error: {e:?}"),
            Error::ConnectRefused(why) => write!(f, "Connect refused: {why}"),
            Error::Command { what, status } => write!(f, "{what} failed: {status}"),
            Error::NamespaceMissing(nsid) => write!(f, "namespace {nsid} does not exist"),
            Error::Unsupported(what) => write!(f, "target does not support {what}"),
            Error::ControllerFatal => write!(f, "controller fatal status (CSTS.CFS)"),
            Error::Internal(what) => write!(f, "internal error: {what}"),
            Error::Timeout(what) => write!(f, "timed out waiting for {what}"),
            Error::PathUnusable(AnaPath { group, state }) => write!(
                f,
                "the namespace's ANA group {group} is {state} through this controller"
            ),
        }
    }
}

#[cfg(any(test, feature = "fake"))]
pub mod fake;
#[cfg(test)]
mod tests;
