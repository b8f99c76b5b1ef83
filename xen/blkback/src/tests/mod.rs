// SPDX-License-Identifier: MIT OR Apache-2.0
//! Engine tests over the fake Xen: one named test per rule of design.md §4, and the
//! threaded fake blkfront against a reference disk.

mod budget;
mod copy;
mod counting;
mod device_faults;
mod errors;
mod fairness;
mod fake_frontend;
mod heap;
mod large;
mod limits;
mod negotiation;
mod notify;
mod notify_guest;
mod resize;
mod resume;
mod rules;
mod x86_32;

use std::sync::Arc;

use blkdev::{BlockDevice, RamDisk, RamDiskQueue};

use crate::abi::{self, PAGE_SIZE};
use crate::engine::{Engine, EngineConfig};
use crate::fake::{CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, XenGrants};
use crate::parse::SegmentDesc;
use crate::ring::{Response, RingMemory};

pub(crate) const DISK_SECTORS: u64 = 2048;

/// One frontend ring wired to an engine, driven step by step from the test thread.
pub(crate) struct Rig<D: BlockDevice, M: RingMemory = RingView> {
    pub memory: Arc<GuestMemory>,
    pub table: Arc<GrantTable>,
    pub front: FrontRing,
    pub events: CountingEvents,
    pub engine: Engine<M, XenGrants, D, CountingEvents>,
    next_page: usize,
    next_gref: u32,
}

impl Rig<RamDiskQueue> {
    pub fn ram(order: u32, persistent: bool) -> (Self, RamDisk) {
        let disk = RamDisk::new(DISK_SECTORS);
        (
            Self::new(EngineConfig::new(order, persistent), disk.queue(1024)),
            disk,
        )
    }
}

impl<D: BlockDevice> Rig<D> {
    pub fn new(config: EngineConfig, device: D) -> Self {
        Self::with_view(config, device, |view| view)
    }
}

impl<D: BlockDevice, M: RingMemory> Rig<D, M> {
    /// Like `new`, with the backend's view of the ring wrapped by `wrap`.
    pub fn with_view(config: EngineConfig, device: D, wrap: impl FnOnce(RingView) -> M) -> Self {
        let ring_pages = 1usize << config.ring_order;
        let memory = GuestMemory::new(ring_pages + 512);
        let table = GrantTable::new(memory.clone());
        let pages: Vec<usize> = (0..ring_pages).collect();
        let front = FrontRing::with_protocol(
            RingView::new(memory.clone(), pages.clone()),
            config.ring_order,
            config.protocol,
        );
        let events = CountingEvents::default();
        let view = wrap(RingView::new(memory.clone(), pages));
        let engine = Engine::new(
            view,
            XenGrants(table.clone()),
            device,
            events.clone(),
            config,
        )
        .expect("engine");
        Rig {
            memory,
            table,
            front,
            events,
            engine,
            next_page: ring_pages,
            next_gref: 8,
        }
    }

    /// Grant a fresh page filled with `fill`.
    pub fn data_page(&mut self, fill: u8) -> (usize, u32) {
        let page = self.next_page;
        self.next_page += 1;
        let gref = self.next_gref;
        self.next_gref += 1;
        self.memory.fill(page, fill);
        self.table.grant(gref, page, false);
        (page, gref)
    }

    /// Queue a raw request and publish it.
    pub fn send(&mut self, raw: &[u8; abi::REQUEST_SIZE]) {
        self.front.put_request(raw);
        self.front.push_requests();
    }

    pub fn responses(&mut self) -> Vec<Response> {
        let mut out = Vec::new();
        self.front.take_responses(|r| out.push(r));
        out
    }
}

pub(crate) fn whole_page(gref: u32) -> SegmentDesc {
    SegmentDesc {
        gref,
        first_sect: 0,
        last_sect: 7,
    }
}

pub(crate) fn page_bytes(memory: &GuestMemory, page: usize) -> Vec<u8> {
    let mut bytes = vec![0; PAGE_SIZE];
    memory.read(page, 0, &mut bytes);
    bytes
}
