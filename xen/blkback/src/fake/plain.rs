// SPDX-License-Identifier: MIT OR Apache-2.0
//! Plain-memory stand-ins for one thread: a ring whose slot copies are `memcpy`s and
//! guest pages behind a grant table whose mapped pages are read and written with
//! `memcpy`, as the kernel's are (`FrontendGrants`: a check that the page holds a
//! mapping, then a copy). The atomics of [`super::memory`] copy word by word, which
//! would swamp what a benchmark of large requests means to measure: the engine's cost
//! per segment and the device's copies.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{fence, Ordering};

use blkdev::BufferAccess;

use crate::abi::PAGE_SIZE;
use crate::grant::{GrantOps, MapRequest, MappedGrant};
use crate::ring::RingMemory;
use xen::abi::grant_table::{RawGrantStatus, GNTST_BAD_GNTREF};

/// A ring in plain memory for one thread.
#[derive(Clone, Debug)]
pub struct PlainRing(pub Rc<RefCell<Vec<u8>>>);

impl PlainRing {
    /// A zeroed ring of `2^order` pages.
    pub fn new(order: u32) -> Self {
        Self(Rc::new(RefCell::new(vec![0u8; PAGE_SIZE << order])))
    }
}

impl RingMemory for PlainRing {
    fn size_bytes(&self) -> usize {
        self.0.borrow().len()
    }
    fn load_u32(&self, offset: usize) -> u32 {
        let bytes = self.0.borrow();
        u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
    }
    fn store_u32(&self, offset: usize, value: u32) {
        self.0.borrow_mut()[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        out.copy_from_slice(&self.0.borrow()[offset..offset + out.len()]);
    }
    fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.0.borrow_mut()[offset..offset + data.len()].copy_from_slice(data);
    }
    fn full_fence(&self) {
        fence(Ordering::SeqCst);
    }
}

/// Where mapped grants appear: page `i` of the map area is buffer `MAP_BASE + i * 4096`
/// (like the kernel's guest-physical map space; 0 is never a buffer).
const MAP_BASE: u64 = 1 << 32;

/// A frontend's pages and grant table, and the backend's map area over them, in plain
/// memory. Grant `gref` names page `gref` (granted with [`PlainGrants::grant`]).
#[derive(Debug)]
pub struct PlainGrants {
    pages: Vec<RefCell<Box<[u8]>>>,
    /// Per grant reference: granted, and read-only.
    granted: Vec<Option<bool>>,
    /// Per page of the map area: the guest page mapped there (and whether writable).
    area: Vec<Option<(usize, bool)>>,
    free: Vec<u32>,
    /// Map and unmap calls (hypercalls on Xen), and entries in them.
    pub map_calls: Cell<u64>,
    pub unmap_calls: Cell<u64>,
    pub maps: Cell<u64>,
    pub unmaps: Cell<u64>,
}

impl PlainGrants {
    /// `pages` zeroed guest pages; room to map `area` grants at once.
    pub fn new(pages: usize, area: usize) -> Self {
        Self {
            pages: (0..pages)
                .map(|_| RefCell::new(vec![0u8; PAGE_SIZE].into_boxed_slice()))
                .collect(),
            granted: vec![None; pages],
            area: vec![None; area],
            free: (0..area as u32).rev().collect(),
            map_calls: Cell::new(0),
            unmap_calls: Cell::new(0),
            maps: Cell::new(0),
            unmaps: Cell::new(0),
        }
    }

    /// Grant page `gref` to the backend.
    pub fn grant(&mut self, gref: u32, readonly: bool) {
        self.granted[gref as usize] = Some(readonly);
    }

    /// The frontend's view of page `page`.
    pub fn page(&self, page: usize) -> std::cell::Ref<'_, Box<[u8]>> {
        self.pages[page].borrow()
    }

    /// The frontend writes page `page`.
    pub fn page_mut(&self, page: usize) -> std::cell::RefMut<'_, Box<[u8]>> {
        self.pages[page].borrow_mut()
    }

    /// Pages mapped now.
    pub fn mapped(&self) -> usize {
        self.area.len() - self.free.len()
    }

    /// The guest page behind `buffer` if it is mapped (writable if `write`), and the
    /// `len` bytes at `offset` stay in it.
    fn page_of(&self, buffer: u64, offset: usize, len: usize, write: bool) -> Option<usize> {
        let index = buffer.checked_sub(MAP_BASE)? / PAGE_SIZE as u64;
        if !buffer.is_multiple_of(PAGE_SIZE as u64) || offset + len > PAGE_SIZE {
            return None;
        }
        match self.area.get(index as usize)? {
            Some((page, writable)) if *writable || !write => Some(*page),
            _ => None,
        }
    }
}

impl BufferAccess for PlainGrants {
    fn read_buffer(&self, buffer: u64, offset: usize, out: &mut [u8]) -> bool {
        let Some(page) = self.page_of(buffer, offset, out.len(), false) else {
            return false;
        };
        out.copy_from_slice(&self.pages[page].borrow()[offset..offset + out.len()]);
        true
    }

    fn write_buffer(&self, buffer: u64, offset: usize, data: &[u8]) -> bool {
        let Some(page) = self.page_of(buffer, offset, data.len(), true) else {
            return false;
        };
        self.pages[page].borrow_mut()[offset..offset + data.len()].copy_from_slice(data);
        true
    }
}

impl GrantOps for PlainGrants {
    fn map(
        &mut self,
        requests: &[MapRequest],
        results: &mut [Result<MappedGrant, RawGrantStatus>],
    ) {
        self.map_calls.set(self.map_calls.get() + 1);
        self.maps.set(self.maps.get() + requests.len() as u64);
        for (request, result) in requests.iter().zip(results.iter_mut()) {
            let readonly = self.granted.get(request.gref as usize).copied().flatten();
            *result = match (readonly, self.free.pop()) {
                (Some(readonly), Some(index)) if !(readonly && request.writable) => {
                    self.area[index as usize] = Some((request.gref as usize, request.writable));
                    Ok(MappedGrant {
                        handle: index,
                        buffer: MAP_BASE + u64::from(index) * PAGE_SIZE as u64,
                    })
                }
                (_, index) => {
                    if let Some(index) = index {
                        self.free.push(index);
                    }
                    Err(GNTST_BAD_GNTREF)
                }
            };
        }
    }

    fn unmap(&mut self, grants: &[MappedGrant], results: &mut [Result<(), RawGrantStatus>]) {
        self.unmap_calls.set(self.unmap_calls.get() + 1);
        self.unmaps.set(self.unmaps.get() + grants.len() as u64);
        for (grant, result) in grants.iter().zip(results.iter_mut()) {
            let slot = self.area.get_mut(grant.handle as usize);
            *result = match slot {
                Some(mapped @ Some(_)) => {
                    *mapped = None;
                    self.free.push(grant.handle);
                    Ok(())
                }
                _ => Err(GNTST_BAD_GNTREF),
            };
        }
    }
}
