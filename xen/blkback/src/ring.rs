// SPDX-License-Identifier: MIT OR Apache-2.0
//! The back end of a blkif shared ring: request copy-out, response write-out and the
//! index/event arithmetic of Xen's `ring.h` macros (`RING_HAS_UNCONSUMED_REQUESTS`,
//! `RING_REQUEST_PROD_OVERFLOW`, `RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`,
//! `RING_FINAL_CHECK_FOR_REQUESTS`), for either
//! ABI: an x86_32 frontend's slots are 108 bytes, copied out and translated to the
//! x86_64 layout the parser reads, and its responses are written in its own 12 bytes.

use crate::abi::{self, sring, x86_32, Protocol, PAGE_SIZE, REQUEST_SIZE, RESPONSE_SIZE};

/// The mapped ring pages, seen as one contiguous byte range shared with the frontend.
///
/// Every access goes through this trait so that tests can watch and tamper with what the
/// backend reads. Methods take `&self`: the other side writes concurrently anyway.
pub trait RingMemory {
    /// Bytes mapped (ring pages × 4096).
    fn size_bytes(&self) -> usize;
    /// Load an aligned u32 with acquire ordering (producer indices).
    fn load_u32(&self, offset: usize) -> u32;
    /// Store an aligned u32 with release ordering (producer indices, event thresholds).
    fn store_u32(&self, offset: usize, value: u32);
    /// Copy bytes out of the ring.
    fn read_bytes(&self, offset: usize, out: &mut [u8]);
    /// Copy bytes into the ring.
    fn write_bytes(&self, offset: usize, data: &[u8]);
    /// Full memory barrier (`mb()`): orders a store before a later load.
    fn full_fence(&self);
}

/// One response, as written into a ring slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub id: u64,
    pub operation: u8,
    pub status: i16,
}

impl Response {
    /// The 16 wire bytes, padding zeroed (XSA-216).
    pub fn to_bytes(self) -> [u8; RESPONSE_SIZE] {
        zerocopy::transmute!(abi::wire::Response {
            id: self.id.into(),
            operation: self.operation,
            _pad: 0,
            status: self.status.into(),
            _pad2: [0; 4],
        })
    }

    /// The 12 bytes of an x86_32 response: the same fields at the same offsets, without
    /// the x86_64 tail padding (padding zeroed: XSA-216).
    pub fn to_bytes_x86_32(self) -> [u8; x86_32::RESPONSE_SIZE] {
        let mut bytes = [0u8; x86_32::RESPONSE_SIZE];
        bytes.copy_from_slice(&self.to_bytes()[..x86_32::RESPONSE_SIZE]);
        bytes
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Ring order above what was offered.
    BadOrder(u32),
    /// The mapping is smaller than the ring.
    TooSmall { needed: usize, mapped: usize },
    /// Re-attaching (a live upgrade): the ring's published `rsp_prod` is not where the
    /// previous image said it left it.
    NotWhereLeft { shared: u32, handed_over: u32 },
    /// Re-attaching: the frontend claims more unanswered requests than the ring holds
    /// (`req_prod - rsp_prod` above its size), as `BACK_RING_ATTACH`'s callers check.
    Overflowed { req_prod: u32, rsp_prod: u32 },
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RingError::BadOrder(order) => write!(f, "ring order {order} is above the maximum"),
            RingError::TooSmall { needed, mapped } => {
                write!(f, "the ring needs {needed} bytes, {mapped} are mapped")
            }
            RingError::NotWhereLeft {
                shared,
                handed_over,
            } => write!(
                f,
                "the ring's rsp_prod is {shared}, the previous image left it at {handed_over}"
            ),
            RingError::Overflowed { req_prod, rsp_prod } => write!(
                f,
                "req_prod {req_prod} is more than a ring ahead of rsp_prod {rsp_prod}"
            ),
        }
    }
}

impl core::error::Error for RingError {}

/// Backend-private ring state plus the shared memory.
#[derive(Debug)]
pub struct BackRing<M> {
    memory: M,
    protocol: Protocol,
    /// `protocol.entry_size()`, kept at hand for the slot arithmetic.
    entry_size: usize,
    slots: u32,
    req_cons: u32,
    rsp_prod_pvt: u32,
    /// The `rsp_prod` last published (only the backend writes it).
    rsp_prod: u32,
}

impl<M: RingMemory> BackRing<M> {
    /// Attach to a freshly initialised ring of `2^order` pages (`BACK_RING_INIT`: the
    /// frontend zeroed the indices, our private ones start at 0 too), of x86_64 entries.
    pub fn new(memory: M, order: u32) -> Result<Self, RingError> {
        Self::with_protocol(memory, order, Protocol::X86_64)
    }

    /// Like `new`, for a frontend of the given ABI.
    pub fn with_protocol(memory: M, order: u32, protocol: Protocol) -> Result<Self, RingError> {
        Self::fits(&memory, order)?;
        Ok(Self::attach(memory, order, protocol))
    }

    /// Whether `memory` holds a ring of `2^order` pages (what `with_protocol` checks,
    /// without taking the memory).
    pub fn fits(memory: &M, order: u32) -> Result<(), RingError> {
        if order > abi::MAX_RING_PAGE_ORDER {
            return Err(RingError::BadOrder(order));
        }
        let needed = PAGE_SIZE << order;
        if memory.size_bytes() < needed {
            return Err(RingError::TooSmall {
                needed,
                mapped: memory.size_bytes(),
            });
        }
        Ok(())
    }

    /// `with_protocol` for memory `fits` accepted.
    pub(crate) fn attach(memory: M, order: u32, protocol: Protocol) -> Self {
        Self {
            memory,
            protocol,
            entry_size: protocol.entry_size(),
            slots: protocol.ring_slots(order),
            req_cons: 0,
            rsp_prod_pvt: 0,
            rsp_prod: 0,
        }
    }

    /// Attach to a ring another image served until now (a live upgrade; Xen's
    /// `BACK_RING_ATTACH`), where it left it: every request before `rsp_prod` answered
    /// and published, none after it taken. Refused when the ring's published `rsp_prod`
    /// is not `rsp_prod`, or when the frontend's `req_prod` is more than a ring ahead of
    /// it (as Linux's blkback and netback check after `BACK_RING_ATTACH`).
    pub fn reattach(
        memory: M,
        order: u32,
        protocol: Protocol,
        rsp_prod: u32,
    ) -> Result<Self, RingError> {
        Self::fits(&memory, order)?;
        Self::check_reattach(&memory, order, protocol, rsp_prod)?;
        Ok(Self::attach_at(memory, order, protocol, rsp_prod))
    }

    /// What `reattach` checks, without taking the memory.
    pub fn check_reattach(
        memory: &M,
        order: u32,
        protocol: Protocol,
        rsp_prod: u32,
    ) -> Result<(), RingError> {
        let shared = memory.load_u32(sring::RSP_PROD);
        if shared != rsp_prod {
            return Err(RingError::NotWhereLeft {
                shared,
                handed_over: rsp_prod,
            });
        }
        let req_prod = memory.load_u32(sring::REQ_PROD);
        if req_prod.wrapping_sub(rsp_prod) > protocol.ring_slots(order) {
            return Err(RingError::Overflowed { req_prod, rsp_prod });
        }
        Ok(())
    }

    /// `reattach` for memory `fits` and `check_reattach` accepted.
    pub(crate) fn attach_at(memory: M, order: u32, protocol: Protocol, rsp_prod: u32) -> Self {
        Self {
            req_cons: rsp_prod,
            rsp_prod_pvt: rsp_prod,
            rsp_prod,
            ..Self::attach(memory, order, protocol)
        }
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    pub fn memory(&self) -> &M {
        &self.memory
    }

    pub fn req_cons(&self) -> u32 {
        self.req_cons
    }

    pub fn rsp_prod_pvt(&self) -> u32 {
        self.rsp_prod_pvt
    }

    fn slot_offset(&self, index: u32) -> usize {
        sring::HEADER_SIZE + (index & (self.slots - 1)) as usize * self.entry_size
    }

    /// The frontend's producer index (acquire: slot contents are visible after it).
    pub fn req_prod(&self) -> u32 {
        self.memory.load_u32(sring::REQ_PROD)
    }

    /// `RING_REQUEST_PROD_OVERFLOW`: the frontend claims more requests than it can have
    /// outstanding, or moved its producer index back behind what was already consumed.
    /// Such a ring must not be processed further.
    pub fn prod_overflows(&self, req_prod: u32) -> bool {
        let produced = req_prod.wrapping_sub(self.rsp_prod_pvt);
        produced > self.slots || produced < self.outstanding()
    }

    /// `RING_HAS_UNCONSUMED_REQUESTS` against a given producer index.
    pub fn unconsumed(&self, req_prod: u32) -> u32 {
        let requests = req_prod.wrapping_sub(self.req_cons);
        let room = self
            .slots
            .wrapping_sub(self.req_cons.wrapping_sub(self.rsp_prod_pvt));
        requests.min(room)
    }

    /// Copy the next request out of its slot (one read of the slot) and consume it, in
    /// the x86_64 layout (an x86_32 slot is translated on the copy).
    pub fn take_request(&mut self) -> [u8; REQUEST_SIZE] {
        let mut raw = [0u8; REQUEST_SIZE];
        self.take_request_into(&mut raw);
        raw
    }

    /// `take_request` into `raw` (the engine's copy, reused from request to request).
    #[cfg_attr(feature = "profile-passes", inline(never))]
    pub fn take_request_into(&mut self, raw: &mut [u8; REQUEST_SIZE]) {
        let offset = self.slot_offset(self.req_cons);
        self.req_cons = self.req_cons.wrapping_add(1);
        match self.protocol {
            Protocol::X86_64 => self.memory.read_bytes(offset, raw),
            Protocol::X86_32 => {
                let mut slot = [0u8; x86_32::REQUEST_SIZE];
                self.memory.read_bytes(offset, &mut slot);
                *raw = x86_32::to_native(&slot);
            }
        }
    }

    /// Requests consumed whose responses have not been produced yet.
    pub fn outstanding(&self) -> u32 {
        self.req_cons.wrapping_sub(self.rsp_prod_pvt)
    }

    /// Write one response into the next response slot (not yet visible to the frontend).
    #[inline(always)]
    pub fn put_response(&mut self, response: Response) {
        debug_assert!(self.outstanding() > 0, "response without a request");
        let offset = self.slot_offset(self.rsp_prod_pvt);
        match self.protocol {
            Protocol::X86_64 => self.memory.write_bytes(offset, &response.to_bytes()),
            Protocol::X86_32 => self.memory.write_bytes(offset, &response.to_bytes_x86_32()),
        }
        self.rsp_prod_pvt = self.rsp_prod_pvt.wrapping_add(1);
    }

    /// `RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`: publish the responses written so far and
    /// say whether the frontend asked to be told (its `rsp_event` lies in the new batch).
    pub fn push_responses(&mut self) -> bool {
        self.publish_responses()
            .is_some_and(|old| self.notify_wanted_since(old))
    }

    /// The first half of `RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`: make the responses
    /// written so far visible (`rsp_prod`, release). Returns the `rsp_prod` they follow,
    /// `None` when there was nothing new.
    pub fn publish_responses(&mut self) -> Option<u32> {
        let old = self.rsp_prod;
        if old == self.rsp_prod_pvt {
            return None;
        }
        self.rsp_prod = self.rsp_prod_pvt;
        self.memory.store_u32(sring::RSP_PROD, self.rsp_prod);
        Some(old)
    }

    /// The second half, over every response published after `since`: a full fence (the
    /// `rsp_prod` store before the `rsp_event` load), then whether the frontend's
    /// `rsp_event` lies in `(since, rsp_prod]`, i.e. it asked to be told of one of them.
    /// A frontend that has meanwhile taken them all and re-armed past them is not.
    pub fn notify_wanted_since(&self, since: u32) -> bool {
        self.memory.full_fence();
        let event = self.memory.load_u32(sring::RSP_EVENT);
        self.rsp_prod.wrapping_sub(event) < self.rsp_prod.wrapping_sub(since)
    }

    /// The published `rsp_prod`.
    pub fn rsp_prod(&self) -> u32 {
        self.rsp_prod
    }

    /// Requests the frontend has produced and not yet taken the responses of, as far as
    /// its `rsp_event` shows (`req_prod - (rsp_event - 1)`: a frontend arms `rsp_event`
    /// at `rsp_cons + 1` once it has taken every response). 1 for a frontend that waits
    /// for each answer before the next request; capped at the ring size, which is also
    /// what a stale or hostile `rsp_event` reads as.
    pub fn frontend_outstanding(&self, req_prod: u32) -> u32 {
        let taken = self.memory.load_u32(sring::RSP_EVENT).wrapping_sub(1);
        req_prod.wrapping_sub(taken).min(self.slots)
    }

    /// `RING_FINAL_CHECK_FOR_REQUESTS`: re-arm `req_event` so the frontend notifies on
    /// the next request, then look again. True means work arrived: do not sleep.
    pub fn final_check_for_requests(&mut self) -> bool {
        if self.unconsumed(self.req_prod()) > 0 {
            return true;
        }
        self.memory
            .store_u32(sring::REQ_EVENT, self.req_cons.wrapping_add(1));
        self.memory.full_fence();
        self.unconsumed(self.req_prod()) > 0
    }

    /// Give the memory back (teardown).
    pub fn into_memory(self) -> M {
        self.memory
    }
}
