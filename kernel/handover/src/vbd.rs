// SPDX-License-Identifier: MIT OR Apache-2.0
//! A vbd's record in the handover block, from what the old image's `blkback` knew of it,
//! and back to the connection the new image's `BlkifBackend::resume` takes over.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use blkback::abi::Protocol;
use blkback::negotiate::{BlkifBackend, FrontendConnection, QueueRing};

use crate::block::{QueueRecord, VbdRecord, PROTOCOL_X86_32, PROTOCOL_X86_64};

/// Where one queue's ring was left: the old image's port (closed by now) and the
/// `rsp_prod` its drain stopped at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeftAt {
    pub backend_port: u32,
    pub rsp_prod: u32,
}

/// Why a vbd cannot be recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// One `LeftAt` per queue is needed.
    Queues { queues: usize, left: usize },
}

impl core::fmt::Display for RecordError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RecordError::Queues { queues, left } => {
                write!(f, "{queues} queues, {left} drained")
            }
        }
    }
}

/// The record of a drained, connected vbd: `connection` as it was negotiated,
/// `params` the backing store it serves, `left` each queue's end of the drain.
pub fn record(
    backend: &BlkifBackend,
    connection: &FrontendConnection,
    params: &str,
    left: &[LeftAt],
) -> Result<VbdRecord, RecordError> {
    if left.len() != connection.queues.len() {
        return Err(RecordError::Queues {
            queues: connection.queues.len(),
            left: left.len(),
        });
    }
    Ok(VbdRecord {
        backend_path: backend.backend_path().to_string(),
        frontend_path: backend.frontend_path().to_string(),
        frontend_id: connection.frontend_id,
        params: params.to_string(),
        ring_order: connection.ring_order as u8,
        protocol: match connection.protocol {
            Protocol::X86_64 => PROTOCOL_X86_64,
            Protocol::X86_32 => PROTOCOL_X86_32,
        },
        persistent_grants: connection.persistent_grants,
        read_only: connection.read_only,
        discard: connection.discard,
        max_indirect_segments: connection.max_indirect_segments,
        queues: connection
            .queues
            .iter()
            .zip(left)
            .map(|(queue, left)| QueueRecord {
                ring_refs: queue.ring_refs.clone(),
                frontend_port: queue.event_channel,
                backend_port: left.backend_port,
                rsp_prod: left.rsp_prod,
            })
            .collect(),
        published: backend.published_keys(),
    })
}

/// The connection a record hands over, each queue to be re-attached at its `rsp_prod`;
/// with the keys the old image published. The record was checked by
/// `Handover::decode` (ring order, protocol, queue count, ring references).
pub fn connection(record: &VbdRecord) -> (FrontendConnection, Vec<(String, String)>) {
    let connection = FrontendConnection {
        frontend_id: record.frontend_id,
        ring_order: u32::from(record.ring_order),
        persistent_grants: record.persistent_grants,
        read_only: record.read_only,
        discard: record.discard,
        max_indirect_segments: record.max_indirect_segments,
        protocol: if record.protocol == PROTOCOL_X86_32 {
            Protocol::X86_32
        } else {
            Protocol::X86_64
        },
        queues: record
            .queues
            .iter()
            .map(|q| QueueRing {
                ring_refs: q.ring_refs.clone(),
                event_channel: q.frontend_port,
                attach_at: Some(q.rsp_prod),
            })
            .collect(),
    };
    (connection, record.published.clone())
}
