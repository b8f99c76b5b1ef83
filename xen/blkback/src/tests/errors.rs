// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the crate's errors say (they reach the log and xenstore `error` nodes).

use crate::engine::Busy;
use crate::negotiate::NegotiationError;
use crate::parse::{Rejected, RequestError};
use crate::ring::RingError;
use xen::xenbus::error::Errno;
use xen::xenbus::StoreError;

fn text(error: &dyn core::error::Error) -> String {
    error.to_string()
}

#[test]
fn negotiation_errors() {
    assert_eq!(
        text(&NegotiationError::Store(StoreError::NotFound)),
        "xenstore: no such node"
    );
    assert_eq!(
        text(&NegotiationError::Frontend("ring-ref missing".into())),
        "ring-ref missing"
    );
    // The errno that goes with them to Linux's error node.
    assert_eq!(
        NegotiationError::Frontend("ring-page-order 5 > max 4".into()).errno(),
        22
    );
    assert_eq!(NegotiationError::Store(StoreError::NotFound).errno(), 2);
    assert_eq!(
        NegotiationError::Store(StoreError::Failed("EACCES".into())).errno(),
        5
    );
}

#[test]
fn ring_request_and_teardown_errors() {
    assert_eq!(
        text(&RingError::BadOrder(5)),
        "ring order 5 is above the maximum"
    );
    assert_eq!(
        text(&RingError::TooSmall {
            needed: 8192,
            mapped: 4096
        }),
        "the ring needs 8192 bytes, 4096 are mapped"
    );
    assert_eq!(
        text(&RequestError::BadSegment {
            first_sect: 7,
            last_sect: 3
        }),
        "bad segment: sectors 7..=3"
    );
    assert_eq!(
        text(&Rejected {
            id: 0x2a,
            operation: 1,
            error: RequestError::ReadOnly
        }),
        "request 0x2a (operation 1): write to a read-only device"
    );
    assert_eq!(text(&Busy { in_flight: 3 }), "3 requests in flight");
}
