// SPDX-License-Identifier: MIT OR Apache-2.0
//! Guest pages as atomics (so two threads may share them without undefined behaviour),
//! a grant table over them, and both sides' views of a shared ring.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use blkdev::BufferAccess;

use crate::abi::{sring, x86_32, Protocol, PAGE_SIZE, REQUEST_SIZE, RESPONSE_SIZE};
use crate::grant::{copied_grant, GrantOps, MapRequest, MappedGrant};
use crate::ring::{Response, RingMemory};
use xen::abi::grant_table::{
    RawGrantStatus, GNTST_BAD_GNTREF, GNTST_GENERAL_ERROR, GNTST_PERMISSION_DENIED,
};

const WORDS_PER_PAGE: usize = PAGE_SIZE / 4;

/// A frontend domain's memory: numbered 4 KiB pages.
#[derive(Debug)]
pub struct GuestMemory {
    pages: Vec<Box<[AtomicU32]>>,
}

impl GuestMemory {
    pub fn new(pages: usize) -> Arc<Self> {
        Arc::new(Self {
            pages: (0..pages)
                .map(|_| (0..WORDS_PER_PAGE).map(|_| AtomicU32::new(0)).collect())
                .collect(),
        })
    }

    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// Where a page lives in this process (tests that look at cache lines).
    pub fn page_address(&self, page: usize) -> usize {
        self.pages[page].as_ptr() as usize
    }

    pub fn load_u32(&self, page: usize, offset: usize) -> u32 {
        self.pages[page][offset / 4].load(Ordering::Acquire)
    }

    pub fn store_u32(&self, page: usize, offset: usize, value: u32) {
        self.pages[page][offset / 4].store(value, Ordering::Release);
    }

    /// Copy bytes out of one page. Panics if the range leaves the page.
    pub fn read(&self, page: usize, offset: usize, out: &mut [u8]) {
        assert!(offset + out.len() <= PAGE_SIZE, "read leaves the page");
        read_words(&self.pages[page], offset, out);
    }

    /// Copy bytes into one page. Panics if the range leaves the page.
    pub fn write(&self, page: usize, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= PAGE_SIZE, "write leaves the page");
        write_words(&self.pages[page], offset, data);
    }

    pub fn fill(&self, page: usize, byte: u8) {
        self.write(page, 0, &[byte; PAGE_SIZE]);
    }
}

/// Copy bytes out of memory seen as little-endian words (shared memory: each word is
/// loaded once, relaxed). Panics if the range leaves `words`.
pub fn read_words(words: &[AtomicU32], offset: usize, out: &mut [u8]) {
    if offset.is_multiple_of(4) && out.len().is_multiple_of(4) {
        // Whole words (ring slots, responses, pages): one bounds check.
        let first = offset / 4;
        let words = &words[first..first + out.len() / 4];
        for (chunk, word) in out.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        return;
    }
    let mut at = offset;
    for chunk in out.chunks_mut(4) {
        let bytes = words[at / 4].load(Ordering::Relaxed).to_le_bytes();
        if at.is_multiple_of(4) && chunk.len() == 4 {
            chunk.copy_from_slice(&bytes);
            at += 4;
        } else {
            // Unaligned head or tail: byte by byte.
            for byte in chunk.iter_mut() {
                *byte = words[at / 4].load(Ordering::Relaxed).to_le_bytes()[at % 4];
                at += 1;
            }
        }
    }
}

/// Copy bytes into memory seen as little-endian words (whole words stored, partial ones
/// merged atomically). Panics if the range leaves `words`.
pub fn write_words(words: &[AtomicU32], offset: usize, data: &[u8]) {
    if offset.is_multiple_of(4) && data.len().is_multiple_of(4) {
        let first = offset / 4;
        let words = &words[first..first + data.len() / 4];
        for (chunk, word) in data.chunks_exact(4).zip(words) {
            word.store(
                u32::from_le_bytes(chunk.try_into().expect("4 bytes")),
                Ordering::Relaxed,
            );
        }
        return;
    }
    let mut at = offset;
    let mut rest = data;
    while !rest.is_empty() {
        let in_word = at % 4;
        let take = (4 - in_word).min(rest.len());
        if take == 4 {
            let value = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            words[at / 4].store(value, Ordering::Relaxed);
        } else {
            let _ = words[at / 4].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                let mut bytes = old.to_le_bytes();
                bytes[in_word..in_word + take].copy_from_slice(&rest[..take]);
                Some(u32::from_le_bytes(bytes))
            });
        }
        at += take;
        rest = &rest[take..];
    }
}

/// Some pages of guest memory seen as one contiguous range, the way the backend maps a
/// multi-page ring.
#[derive(Clone, Debug)]
pub struct RingView {
    memory: Arc<GuestMemory>,
    pages: Vec<usize>,
}

impl RingView {
    pub fn new(memory: Arc<GuestMemory>, pages: Vec<usize>) -> Self {
        Self { memory, pages }
    }

    /// Where the ring's `index`th page lives in this process.
    pub fn page_address(&self, index: usize) -> usize {
        self.memory.page_address(self.pages[index])
    }

    /// Split `[offset, offset + len)` at page boundaries.
    fn pieces(&self, offset: usize, len: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0;
        while done < len {
            let at = offset + done;
            let in_page = at % PAGE_SIZE;
            let take = (PAGE_SIZE - in_page).min(len - done);
            f(self.pages[at / PAGE_SIZE], in_page, done, take);
            done += take;
        }
    }
}

impl RingMemory for RingView {
    fn size_bytes(&self) -> usize {
        self.pages.len() * PAGE_SIZE
    }
    fn load_u32(&self, offset: usize) -> u32 {
        self.memory
            .load_u32(self.pages[offset / PAGE_SIZE], offset % PAGE_SIZE)
    }
    fn store_u32(&self, offset: usize, value: u32) {
        self.memory
            .store_u32(self.pages[offset / PAGE_SIZE], offset % PAGE_SIZE, value)
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        self.pieces(offset, out.len(), |page, in_page, done, take| {
            self.memory.read(page, in_page, &mut out[done..done + take])
        });
    }
    fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.pieces(offset, data.len(), |page, in_page, done, take| {
            self.memory.write(page, in_page, &data[done..done + take])
        });
    }
    fn full_fence(&self) {
        fence(Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, Debug)]
struct Grant {
    page: usize,
    readonly: bool,
    maps: u32,
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    gref: u32,
    page: usize,
    writable: bool,
}

#[derive(Debug, Default)]
struct Table {
    grants: Vec<Option<Grant>>,
    mappings: Vec<Option<Mapping>>,
    free_handles: Vec<u32>,
    live: usize,
    peak: usize,
    fail_grefs: Vec<u32>,
    map_calls: u64,
    unmap_calls: u64,
    /// Grant copies (`GNTTABOP_copy` entries) made, and grants whose copies fail.
    copies: u64,
    fail_copy_grefs: Vec<u32>,
}

/// The hypervisor's grant table for one frontend: the frontend grants pages, the
/// backend maps them. Tracks live mappings so tests can catch leaks, use after unmap,
/// and a frontend revoking a page the backend still maps.
#[derive(Debug)]
pub struct GrantTable {
    memory: Arc<GuestMemory>,
    table: Mutex<Table>,
}

impl GrantTable {
    pub fn new(memory: Arc<GuestMemory>) -> Arc<Self> {
        Arc::new(Self {
            memory,
            // Room for many mappings up front, so the fake hypervisor does not allocate
            // while the engine polls (the no-allocation test counts every allocation).
            table: Mutex::new(Table {
                mappings: Vec::with_capacity(4096),
                free_handles: Vec::with_capacity(4096),
                ..Table::default()
            }),
        })
    }

    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.memory
    }

    /// Frontend: grant `page` under reference `gref`.
    pub fn grant(&self, gref: u32, page: usize, readonly: bool) {
        let mut table = self.table.lock().unwrap();
        let index = gref as usize;
        if table.grants.len() <= index {
            table.grants.resize(index + 1, None);
        }
        assert!(table.grants[index].is_none(), "gref {gref} granted twice");
        table.grants[index] = Some(Grant {
            page,
            readonly,
            maps: 0,
        });
    }

    /// Frontend: revoke a grant (`gnttab_end_foreign_access_ref`). False, and the grant
    /// stays, while the backend still maps it.
    pub fn end_access(&self, gref: u32) -> bool {
        let mut table = self.table.lock().unwrap();
        match table.grants.get(gref as usize).copied().flatten() {
            Some(grant) if grant.maps == 0 => {
                table.grants[gref as usize] = None;
                true
            }
            _ => false,
        }
    }

    /// Make maps of `gref` fail from now on.
    pub fn fail_maps_of(&self, gref: u32) {
        self.table.lock().unwrap().fail_grefs.push(gref);
    }

    /// Make grant copies to or from `gref` fail from now on.
    pub fn fail_copies_of(&self, gref: u32) {
        self.table.lock().unwrap().fail_copy_grefs.push(gref);
    }

    /// Grant copies (entries) made so far, failed ones included.
    pub fn copies(&self) -> u64 {
        self.table.lock().unwrap().copies
    }

    /// One grant copy of `len` bytes at `offset` of the page `gref` grants (to the guest
    /// when `to_guest`), as Xen checks it: a known grant, writable if written, inside
    /// its page. The guest page, or false.
    fn copy_page(&self, gref: u32, offset: usize, len: usize, to_guest: bool) -> Option<usize> {
        let mut table = self.table.lock().unwrap();
        table.copies += 1;
        if table.fail_copy_grefs.contains(&gref) || offset + len > PAGE_SIZE {
            return None;
        }
        let grant = table.grants.get(gref as usize).copied().flatten()?;
        (!to_guest || !grant.readonly).then_some(grant.page)
    }

    /// Mappings alive now, and the most ever alive at once.
    pub fn live_mappings(&self) -> (usize, usize) {
        let table = self.table.lock().unwrap();
        (table.live, table.peak)
    }

    /// Mappings of one grant alive now.
    pub fn maps_of(&self, gref: u32) -> u32 {
        let table = self.table.lock().unwrap();
        table
            .grants
            .get(gref as usize)
            .copied()
            .flatten()
            .map_or(0, |g| g.maps)
    }

    /// Map and unmap hypercalls issued.
    pub fn calls(&self) -> (u64, u64) {
        let table = self.table.lock().unwrap();
        (table.map_calls, table.unmap_calls)
    }

    fn map_one(table: &mut Table, request: &MapRequest) -> Result<MappedGrant, RawGrantStatus> {
        if table.fail_grefs.contains(&request.gref) {
            return Err(GNTST_GENERAL_ERROR);
        }
        let grant = table
            .grants
            .get_mut(request.gref as usize)
            .and_then(Option::as_mut)
            .ok_or(GNTST_BAD_GNTREF)?;
        if request.writable && grant.readonly {
            return Err(GNTST_PERMISSION_DENIED);
        }
        grant.maps += 1;
        let mapping = Mapping {
            gref: request.gref,
            page: grant.page,
            writable: request.writable,
        };
        let handle = match table.free_handles.pop() {
            Some(handle) => {
                table.mappings[handle as usize] = Some(mapping);
                handle
            }
            None => {
                table.mappings.push(Some(mapping));
                table.mappings.len() as u32 - 1
            }
        };
        table.live += 1;
        table.peak = table.peak.max(table.live);
        Ok(MappedGrant {
            handle,
            buffer: u64::from(handle),
        })
    }

    /// The guest page behind a live mapping (how the backend addresses a mapped ring).
    pub fn page_of_mapping(&self, grant: &MappedGrant) -> Option<usize> {
        self.mapped_page(grant.buffer, false)
    }

    /// The page behind a live mapping, if the access is allowed.
    fn mapped_page(&self, buffer: u64, write: bool) -> Option<usize> {
        let table = self.table.lock().unwrap();
        let mapping = table
            .mappings
            .get(usize::try_from(buffer).ok()?)
            .copied()
            .flatten()?;
        (!write || mapping.writable).then_some(mapping.page)
    }
}

/// The backend's handle on a [`GrantTable`] (what `GrantOps` is in the kernel).
#[derive(Clone, Debug)]
pub struct XenGrants(pub Arc<GrantTable>);

// Out of line for tools/engine-passes.sh, so the fake hypervisor's share is counted as
// its own (the "grant ops (fake Xen)" column) and not as part of the engine's pass.
impl GrantOps for XenGrants {
    #[cfg_attr(feature = "profile-passes", inline(never))]
    fn map(
        &mut self,
        requests: &[MapRequest],
        results: &mut [Result<MappedGrant, RawGrantStatus>],
    ) {
        let mut table = self.0.table.lock().unwrap();
        table.map_calls += 1;
        for (request, result) in requests.iter().zip(results.iter_mut()) {
            *result = GrantTable::map_one(&mut table, request);
        }
    }

    #[cfg_attr(feature = "profile-passes", inline(never))]
    fn unmap(&mut self, grants: &[MappedGrant], results: &mut [Result<(), RawGrantStatus>]) {
        let mut table = self.0.table.lock().unwrap();
        table.unmap_calls += 1;
        for (grant, result) in grants.iter().zip(results.iter_mut()) {
            let Some(mapping) = table
                .mappings
                .get_mut(grant.handle as usize)
                .and_then(Option::take)
            else {
                *result = Err(GNTST_GENERAL_ERROR);
                continue;
            };
            table.free_handles.push(grant.handle);
            table.live -= 1;
            if let Some(g) = table.grants[mapping.gref as usize].as_mut() {
                g.maps -= 1;
            }
            *result = Ok(());
        }
    }
}

/// A buffer that names a grant (a ring that copies: `grant::copy_buffer`) is read and
/// written with a grant copy each, as the kernel does with `GNTTABOP_copy`.
impl BufferAccess for XenGrants {
    fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
        if let Some(gref) = copied_grant(buffer) {
            let Some(page) = self.0.copy_page(gref, offset, out.len(), false) else {
                return false;
            };
            self.0.memory.read(page, offset, out);
            return true;
        }
        match self.0.mapped_page(buffer, false) {
            Some(page) if offset + out.len() <= PAGE_SIZE => {
                self.0.memory.read(page, offset, out);
                true
            }
            _ => false,
        }
    }

    fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
        if let Some(gref) = copied_grant(buffer) {
            let Some(page) = self.0.copy_page(gref, offset, data.len(), true) else {
                return false;
            };
            self.0.memory.write(page, offset, data);
            return true;
        }
        match self.0.mapped_page(buffer, true) {
            Some(page) if offset + data.len() <= PAGE_SIZE => {
                self.0.memory.write(page, offset, data);
                true
            }
            _ => false,
        }
    }
}

/// The frontend's side of a ring (`FRONT_RING_*` macros), over the same pages (or, for
/// `tools/hostile`, over a real ring page shared with gntalloc).
#[derive(Debug)]
pub struct FrontRing<V = RingView> {
    view: V,
    protocol: Protocol,
    slots: u32,
    req_prod_pvt: u32,
    rsp_cons: u32,
}

impl<V: RingMemory> FrontRing<V> {
    /// `SHARED_RING_INIT` + `FRONT_RING_INIT`: zero the header, events at 1.
    pub fn new(view: V, order: u32) -> Self {
        Self::with_protocol(view, order, Protocol::X86_64)
    }

    /// A frontend of the given ABI: an x86_32 one lays out 108-byte slots and reads
    /// 12-byte responses.
    pub fn with_protocol(view: V, order: u32, protocol: Protocol) -> Self {
        view.write_bytes(0, &[0; sring::HEADER_SIZE]);
        view.store_u32(sring::REQ_EVENT, 1);
        view.store_u32(sring::RSP_EVENT, 1);
        Self {
            view,
            protocol,
            slots: protocol.ring_slots(order),
            req_prod_pvt: 0,
            rsp_cons: 0,
        }
    }

    pub fn view(&self) -> &V {
        &self.view
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Slots free for new requests (`RING_FULL` when 0). A hostile script that moved
    /// the producer index by hand can leave the indices inconsistent: then 0.
    pub fn free_slots(&self) -> u32 {
        self.slots
            .saturating_sub(self.req_prod_pvt.wrapping_sub(self.rsp_cons))
    }

    pub fn req_prod_pvt(&self) -> u32 {
        self.req_prod_pvt
    }

    fn slot_offset(&self, index: u32) -> usize {
        sring::HEADER_SIZE + (index & (self.slots - 1)) as usize * self.protocol.entry_size()
    }

    /// Write an x86_64 request into the next slot (not yet visible).
    pub fn put_request(&mut self, raw: &[u8; REQUEST_SIZE]) {
        assert_eq!(self.protocol, Protocol::X86_64, "an x86_64 request");
        self.put_slot(raw);
    }

    /// Write an x86_32 request into the next slot (not yet visible).
    pub fn put_request_x86_32(&mut self, raw: &[u8; x86_32::REQUEST_SIZE]) {
        assert_eq!(self.protocol, Protocol::X86_32, "an x86_32 request");
        self.put_slot(raw);
    }

    fn put_slot(&mut self, raw: &[u8]) {
        assert!(self.free_slots() > 0, "frontend overran its ring");
        self.view
            .write_bytes(self.slot_offset(self.req_prod_pvt), raw);
        self.req_prod_pvt = self.req_prod_pvt.wrapping_add(1);
    }

    /// Write a request at an arbitrary index without the ring-full check (hostile).
    pub fn put_request_at(&mut self, index: u32, raw: &[u8; REQUEST_SIZE]) {
        self.view.write_bytes(self.slot_offset(index), raw);
    }

    /// The raw bytes of slot `index` (as many as one entry of the ABI holds).
    pub fn slot_bytes(&self, index: u32) -> Vec<u8> {
        let mut bytes = vec![0; self.protocol.entry_size()];
        self.view.read_bytes(self.slot_offset(index), &mut bytes);
        bytes
    }

    /// `RING_PUSH_REQUESTS_AND_CHECK_NOTIFY`.
    pub fn push_requests(&mut self) -> bool {
        let old = self.view.load_u32(sring::REQ_PROD);
        let new = self.req_prod_pvt;
        self.view.store_u32(sring::REQ_PROD, new);
        self.view.full_fence();
        let event = self.view.load_u32(sring::REQ_EVENT);
        new.wrapping_sub(event) < new.wrapping_sub(old)
    }

    /// Publish any producer index, valid or not (hostile frontends).
    pub fn set_req_prod(&mut self, value: u32) {
        self.view.store_u32(sring::REQ_PROD, value);
    }

    /// Take every published response.
    pub fn take_responses(&mut self, mut f: impl FnMut(Response)) -> usize {
        let rsp_prod = self.view.load_u32(sring::RSP_PROD);
        let mut taken = 0;
        while self.rsp_cons != rsp_prod {
            // An x86_32 response is the first 12 bytes of an x86_64 one's layout.
            let mut bytes = [0u8; RESPONSE_SIZE];
            let size = self.protocol.response_size();
            self.view
                .read_bytes(self.slot_offset(self.rsp_cons), &mut bytes[..size]);
            f(super::wire::decode_response(&bytes));
            self.rsp_cons = self.rsp_cons.wrapping_add(1);
            taken += 1;
        }
        taken
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES`: ask for an event on the next response.
    pub fn arm_response_event(&mut self) {
        self.view
            .store_u32(sring::RSP_EVENT, self.rsp_cons.wrapping_add(1));
        self.view.full_fence();
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES`: arm, then say whether responses came
    /// meanwhile (take them, and check again).
    pub fn final_check_for_responses(&mut self) -> bool {
        self.arm_response_event();
        self.view.load_u32(sring::RSP_PROD) != self.rsp_cons
    }

    pub fn set_rsp_event(&mut self, value: u32) {
        self.view.store_u32(sring::RSP_EVENT, value);
    }
}
