// SPDX-License-Identifier: MIT OR Apache-2.0
//! Encoders for the frontend side of the wire format (what Linux blkfront writes), used
//! by the fake frontend, fuzzers and benchmarks; and what a 32-bit x86 frontend writes
//! (`x86_32_*`), field by field at its own offsets.

use crate::abi::{
    self, discard, indirect, request, segment, x86_32, MAX_INDIRECT_PAGES, REQUEST_SIZE,
    RESPONSE_SIZE, SEGMENT_SIZE,
};
use crate::parse::SegmentDesc;
use crate::ring::Response;

pub fn encode_segment(seg: &SegmentDesc) -> [u8; SEGMENT_SIZE] {
    let mut bytes = [0u8; SEGMENT_SIZE];
    bytes[segment::GREF..segment::GREF + 4].copy_from_slice(&seg.gref.to_le_bytes());
    bytes[segment::FIRST_SECT] = seg.first_sect;
    bytes[segment::LAST_SECT] = seg.last_sect;
    bytes
}

fn header(operation: u8, id: u64, sector: u64) -> [u8; REQUEST_SIZE] {
    let mut raw = [0u8; REQUEST_SIZE];
    raw[request::OPERATION] = operation;
    raw[request::ID..request::ID + 8].copy_from_slice(&id.to_le_bytes());
    raw[request::SECTOR..request::SECTOR + 8].copy_from_slice(&sector.to_le_bytes());
    raw
}

/// A read/write/flush/barrier request with its segments in the slot. The segment count
/// byte is `segments.len()` (callers may pass more than 11 to build bad requests; only
/// the first 11 are stored).
pub fn encode_direct(
    operation: u8,
    id: u64,
    sector: u64,
    segments: &[SegmentDesc],
) -> [u8; REQUEST_SIZE] {
    let mut raw = header(operation, id, sector);
    raw[request::NR_SEGMENTS] = segments.len() as u8;
    for (i, seg) in segments
        .iter()
        .take(abi::MAX_SEGMENTS_PER_REQUEST)
        .enumerate()
    {
        let start = request::SEGMENTS + i * SEGMENT_SIZE;
        raw[start..start + SEGMENT_SIZE].copy_from_slice(&encode_segment(seg));
    }
    raw
}

pub fn encode_indirect(
    indirect_op: u8,
    id: u64,
    sector: u64,
    nr_segments: u16,
    indirect_grefs: &[u32],
) -> [u8; REQUEST_SIZE] {
    let mut raw = header(abi::OP_INDIRECT, id, sector);
    raw[indirect::INDIRECT_OP] = indirect_op;
    raw[indirect::NR_SEGMENTS..indirect::NR_SEGMENTS + 2]
        .copy_from_slice(&nr_segments.to_le_bytes());
    for (i, gref) in indirect_grefs.iter().take(MAX_INDIRECT_PAGES).enumerate() {
        let at = indirect::INDIRECT_GREFS + 4 * i;
        raw[at..at + 4].copy_from_slice(&gref.to_le_bytes());
    }
    raw
}

pub fn encode_discard(id: u64, sector: u64, nr_sectors: u64, secure: bool) -> [u8; REQUEST_SIZE] {
    let mut raw = header(abi::OP_DISCARD, id, sector);
    raw[discard::FLAG] = if secure { abi::DISCARD_SECURE } else { 0 };
    raw[discard::NR_SECTORS..discard::NR_SECTORS + 8].copy_from_slice(&nr_sectors.to_le_bytes());
    raw
}

pub fn decode_response(bytes: &[u8; RESPONSE_SIZE]) -> Response {
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[abi::response::ID..abi::response::ID + 8]);
    Response {
        id: u64::from_le_bytes(id),
        operation: bytes[abi::response::OPERATION],
        status: i16::from_le_bytes([
            bytes[abi::response::STATUS],
            bytes[abi::response::STATUS + 1],
        ]),
    }
}

/// The x86_32 slot of the same request as the x86_64 slot `raw` (as built by the encoders
/// above): each field read at its x86_64 offset and written at its x86_32 one, by
/// operation, as a 32-bit frontend lays it out (`blkif.h` compiled for i386).
pub fn x86_32_of(raw: &[u8; REQUEST_SIZE]) -> [u8; x86_32::REQUEST_SIZE] {
    let mut out = [0u8; x86_32::REQUEST_SIZE];
    let mut copy = |from: usize, to: usize, len: usize| {
        out[to..to + len].copy_from_slice(&raw[from..from + len]);
    };
    // operation, then nr_segments/flag/indirect_op, then handle/nr_segments: unmoved.
    copy(0, 0, 4);
    copy(request::ID, x86_32::request::ID, 8);
    copy(request::SECTOR, x86_32::request::SECTOR, 8);
    match raw[request::OPERATION] {
        abi::OP_DISCARD => copy(discard::NR_SECTORS, x86_32::discard::NR_SECTORS, 8),
        abi::OP_INDIRECT => {
            copy(indirect::HANDLE, x86_32::indirect::HANDLE, 2);
            copy(
                indirect::INDIRECT_GREFS,
                x86_32::indirect::INDIRECT_GREFS,
                4 * MAX_INDIRECT_PAGES,
            );
        }
        _ => copy(
            request::SEGMENTS,
            x86_32::request::SEGMENTS,
            abi::MAX_SEGMENTS_PER_REQUEST * SEGMENT_SIZE,
        ),
    }
    out
}
