// SPDX-License-Identifier: MIT OR Apache-2.0
//! The front end of one `ring.h` ring (`FRONT_RING_*`): our private request producer and
//! response consumer, the shared indices, and the notification arithmetic of
//! `RING_PUSH_REQUESTS_AND_CHECK_NOTIFY` and `RING_FINAL_CHECK_FOR_RESPONSES`. The
//! backend's `rsp_prod` is read once per pass and checked: it may never claim more
//! responses than requests were pushed.

use core::sync::atomic::{fence, Ordering};
use xen::abi::sring;
use xen::SharedMem;

/// A little-endian 16-bit field of a slot copied out of a ring (read once, then decoded).
pub(crate) fn le16(slot: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([slot[at], slot[at + 1]])
}

/// A little-endian 32-bit field of a slot copied out of a ring.
pub(crate) fn le32(slot: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([slot[at], slot[at + 1], slot[at + 2], slot[at + 3]])
}

/// The backend published a response producer past what it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow {
    pub rsp_prod: u32,
    pub rsp_cons: u32,
    pub req_prod: u32,
}

#[derive(Debug)]
pub struct FrontRing {
    mem: SharedMem,
    slot: usize,
    size: u32,
    req_prod_pvt: u32,
    rsp_cons: u32,
}

impl FrontRing {
    /// `SHARED_RING_INIT` + `FRONT_RING_INIT` over `mem` (one page at least) holding
    /// `size` slots (a power of two) of `slot` bytes.
    pub fn init(mem: SharedMem, slot: usize, size: u32) -> Self {
        assert!(size.is_power_of_two() && sring::HEADER_SIZE + slot * size as usize <= mem.len());
        mem.store_u32(sring::REQ_PROD, 0, Ordering::Relaxed);
        mem.store_u32(sring::RSP_PROD, 0, Ordering::Relaxed);
        mem.store_u32(sring::REQ_EVENT, 1, Ordering::Relaxed);
        mem.store_u32(sring::RSP_EVENT, 1, Ordering::Release);
        Self {
            mem,
            slot,
            size,
            req_prod_pvt: 0,
            rsp_cons: 0,
        }
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    /// Requests written but not yet answered (pushed or not).
    pub fn outstanding(&self) -> u32 {
        self.req_prod_pvt.wrapping_sub(self.rsp_cons)
    }

    /// Free request slots (`RING_FREE_REQUESTS`).
    pub fn free_requests(&self) -> u32 {
        self.size - self.outstanding()
    }

    /// Byte offset of ring index `index`'s slot.
    pub fn slot_offset(&self, index: u32) -> usize {
        sring::HEADER_SIZE + (index & (self.size - 1)) as usize * self.slot
    }

    /// The slot for the next request; the caller fills it, then [`Self::produce`].
    pub fn next_request_offset(&self) -> Option<usize> {
        (self.free_requests() > 0).then(|| self.slot_offset(self.req_prod_pvt))
    }

    /// Index the next request takes.
    pub fn req_prod_pvt(&self) -> u32 {
        self.req_prod_pvt
    }

    pub fn produce(&mut self) {
        self.req_prod_pvt = self.req_prod_pvt.wrapping_add(1);
    }

    /// `RING_PUSH_REQUESTS_AND_CHECK_NOTIFY`: publishes what was produced; true when the
    /// backend asked to be told.
    pub fn push_requests(&mut self) -> bool {
        let old = self.mem.load_u32(sring::REQ_PROD, Ordering::Relaxed);
        let new = self.req_prod_pvt;
        if old == new {
            return false;
        }
        self.mem.store_u32(sring::REQ_PROD, new, Ordering::Release);
        fence(Ordering::SeqCst);
        let event = self.mem.load_u32(sring::REQ_EVENT, Ordering::Relaxed);
        new.wrapping_sub(event) < new.wrapping_sub(old)
    }

    /// Responses ready to consume, checked against what was asked.
    pub fn unconsumed_responses(&self) -> Result<u32, Overflow> {
        let rsp_prod = self.mem.load_u32(sring::RSP_PROD, Ordering::Acquire);
        let ready = rsp_prod.wrapping_sub(self.rsp_cons);
        if ready > self.outstanding() {
            return Err(Overflow {
                rsp_prod,
                rsp_cons: self.rsp_cons,
                req_prod: self.req_prod_pvt,
            });
        }
        Ok(ready)
    }

    /// The slot of the next response (only when [`Self::unconsumed_responses`] said so).
    pub fn next_response_offset(&self) -> usize {
        self.slot_offset(self.rsp_cons)
    }

    pub fn rsp_cons(&self) -> u32 {
        self.rsp_cons
    }

    pub fn consume(&mut self) {
        self.rsp_cons = self.rsp_cons.wrapping_add(1);
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES`: asks for an event at the next response, then
    /// says whether one came meanwhile (consume it before sleeping).
    pub fn final_check_for_responses(&self) -> bool {
        self.mem.store_u32(
            sring::RSP_EVENT,
            self.rsp_cons.wrapping_add(1),
            Ordering::Release,
        );
        fence(Ordering::SeqCst);
        self.mem.load_u32(sring::RSP_PROD, Ordering::Acquire) != self.rsp_cons
    }

    pub fn memory(&self) -> &SharedMem {
        &self.mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> FrontRing {
        FrontRing::init(SharedMem::alloc_leaked(4096), 12, 256)
    }

    #[test]
    fn pushes_notify_only_when_the_backend_waits_for_them() {
        let mut r = ring();
        assert!(!r.push_requests(), "nothing produced");
        r.produce();
        assert!(
            r.push_requests(),
            "req_event 1: the first request is waited for"
        );
        // The backend now waits for request 5.
        r.memory().store_u32(sring::REQ_EVENT, 5, Ordering::Relaxed);
        r.produce();
        r.produce();
        assert!(!r.push_requests(), "up to 3");
        r.produce();
        r.produce();
        assert!(r.push_requests(), "5 crossed");
        assert_eq!(r.memory().load_u32(sring::REQ_PROD, Ordering::Relaxed), 5);
    }

    #[test]
    fn a_response_producer_past_the_requests_is_an_overflow() {
        let mut r = ring();
        for _ in 0..3 {
            r.produce();
        }
        r.push_requests();
        r.memory().store_u32(sring::RSP_PROD, 3, Ordering::Relaxed);
        assert_eq!(r.unconsumed_responses(), Ok(3));
        r.memory().store_u32(sring::RSP_PROD, 4, Ordering::Relaxed);
        assert!(r.unconsumed_responses().is_err());
        r.memory()
            .store_u32(sring::RSP_PROD, u32::MAX, Ordering::Relaxed);
        assert!(r.unconsumed_responses().is_err(), "behind is as bad");
    }

    #[test]
    fn the_ring_never_holds_more_than_its_size() {
        let mut r = ring();
        for _ in 0..256 {
            assert!(r.next_request_offset().is_some());
            r.produce();
        }
        assert_eq!(r.next_request_offset(), None);
        assert_eq!(r.slot_offset(256), r.slot_offset(0));
        assert_eq!(r.slot_offset(255), 64 + 255 * 12);
    }

    #[test]
    fn the_final_check_arms_the_event_and_sees_late_responses() {
        let mut r = ring();
        r.produce();
        r.push_requests();
        assert!(!r.final_check_for_responses());
        assert_eq!(r.memory().load_u32(sring::RSP_EVENT, Ordering::Relaxed), 1);
        r.memory().store_u32(sring::RSP_PROD, 1, Ordering::Relaxed);
        assert!(r.final_check_for_responses());
    }
}
