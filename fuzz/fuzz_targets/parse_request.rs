// SPDX-License-Identifier: MIT OR Apache-2.0
//! The request parser and the device checks on arbitrary slot bytes: no panic, and
//! whatever is accepted satisfies the rules of design.md §4.
#![no_main]

use blkback::abi::{self, REQUEST_SIZE, RSP_EOPNOTSUPP, RSP_ERROR};
use blkback::parse::{check_data_access, check_discard, parse_request, Request, RequestError};
use blkdev::{DiscardGeometry, Geometry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; REQUEST_SIZE];
    let n = data.len().min(REQUEST_SIZE);
    raw[..n].copy_from_slice(&data[..n]);
    let extra = |i: usize| data.get(REQUEST_SIZE + i).copied().unwrap_or(0);
    let max_indirect = u16::from_le_bytes([extra(0), extra(1)]);
    let geometry = Geometry {
        sectors: u64::from_le_bytes([extra(2), extra(3), extra(4), 0, 0, 0, 0, 0]),
        logical_block_size: 512 << (extra(5) % 4),
        physical_block_size: 4096,
        read_only: extra(6) & 1 != 0,
        flush: true,
        discard: (extra(6) & 2 != 0).then_some(DiscardGeometry {
            granularity: 512,
            alignment: 0,
            secure: extra(6) & 4 != 0,
        }),
    };
    let id = u64::from_le_bytes(raw[8..16].try_into().unwrap());
    match parse_request(&raw, max_indirect) {
        Err(rejected) => {
            assert_eq!(rejected.id, id, "every answer echoes the id");
            let status = rejected.response().status;
            assert!(status == RSP_ERROR || status == RSP_EOPNOTSUPP);
            if rejected.error == RequestError::UnsupportedOperation {
                assert_eq!(status, RSP_EOPNOTSUPP);
            }
        }
        Ok(Request::Direct(request)) => {
            assert_eq!(request.id, id);
            let count = usize::from(request.nr_segments);
            assert!(count <= abi::MAX_SEGMENTS_PER_REQUEST);
            assert!(count > 0 || request.op.code() >= abi::OP_WRITE_BARRIER);
            let segments: Vec<_> = request.segments().collect();
            assert_eq!(segments.len(), count);
            for seg in &segments {
                assert!(seg.first_sect <= seg.last_sect && seg.last_sect < 8);
            }
            if let Ok(nr_sectors) =
                check_data_access(request.op, request.sector, &segments, &geometry)
            {
                assert!(nr_sectors == 0 || request.sector + nr_sectors <= geometry.sectors);
                assert!(!(geometry.read_only && request.op.writes_disk() && count > 0));
            }
        }
        Ok(Request::Indirect(request)) => {
            assert_eq!(request.id, id);
            assert!(request.nr_segments >= 1 && request.nr_segments <= max_indirect.min(4096));
            assert!(request.nr_indirect_pages() <= abi::MAX_INDIRECT_PAGES);
            assert!(matches!(request.op.code(), abi::OP_READ | abi::OP_WRITE));
        }
        Ok(Request::Discard(request)) => {
            assert_eq!(request.id, id);
            if check_discard(&request, &geometry).is_ok() {
                assert!(!geometry.read_only && geometry.discard.is_some());
                assert!(
                    request.nr_sectors == 0
                        || request.sector + request.nr_sectors <= geometry.sectors
                );
            }
        }
    }
});
