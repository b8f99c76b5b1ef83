// SPDX-License-Identifier: MIT OR Apache-2.0
//! The x86_32 ABI (`protocol` = `x86_32-abi`): arbitrary 108-byte slots of a 32-bit
//! frontend, translated (`abi::x86_32::to_native`) and served.
//!
//! For each slot: the translation puts every field of the slot's request type where the
//! x86_64 layout has it (offsets written out here from `blkif.h` as i386 and x86_64
//! compile it, not taken from `abi`), and parsing the translation gives what parsing the
//! same request written natively field by field gives (bytes no field covers play no
//! part). Then two engines, one with an x86_32 ring fed the slots and one with an x86_64
//! ring fed the native requests, over equal disks and guest pages, must answer alike
//! (same responses in the same order), end with equal disks and pages, and the x86_32
//! ring's responses must take 12 bytes of a slot, never the frontend's bytes after them.
#![no_main]

use std::sync::Arc;

use blkback::abi::{self, x86_32, Protocol, REQUEST_SIZE};
use blkback::engine::{Engine, EngineConfig};
use blkback::fake::{
    CountingEvents, FrontRing, GrantTable, GuestMemory, RingView, ShufflingDevice, XenGrants,
};
use blkback::parse::parse_request;
use blkback::ring::Response;
use blkdev::{RamDisk, RamDiskQueue};
use libfuzzer_sys::fuzz_target;

/// A slot of a 32-bit frontend.
type Slot32 = [u8; x86_32::REQUEST_SIZE];

/// Where each field sits, as i386 (4-byte aligned `uint64_t`) and x86_64 lay out
/// `blkif.h`'s request structs: (x86_32 offset, x86_64 offset, length).
const COMMON: [(usize, usize, usize); 4] = [
    (0, 0, 1), // operation
    (1, 1, 1), // nr_segments / flag / indirect_op
    (2, 2, 2), // handle / handle / nr_segments
    (4, 8, 8), // id
];
const SECTOR: (usize, usize, usize) = (12, 16, 8);
/// `blkif_request`: eleven 8-byte segments after the sector.
const RW_SEGMENTS: (usize, usize, usize) = (20, 24, 88);
/// `blkif_request_discard`: `nr_sectors` after the sector.
const DISCARD_NR_SECTORS: (usize, usize, usize) = (20, 24, 8);
/// `blkif_request_indirect`: `handle`, then eight indirect grefs after 2 bytes of pad.
const INDIRECT_HANDLE: (usize, usize, usize) = (20, 24, 2);
const INDIRECT_GREFS: (usize, usize, usize) = (24, 28, 32);

/// The fields of `slot`'s request type (unknown operations: those of `blkif_request`).
fn fields(slot: &Slot32) -> Vec<(usize, usize, usize)> {
    let mut fields = COMMON.to_vec();
    fields.push(SECTOR);
    match slot[0] {
        abi::OP_DISCARD => fields.push(DISCARD_NR_SECTORS),
        abi::OP_INDIRECT => fields.extend([INDIRECT_HANDLE, INDIRECT_GREFS]),
        _ => fields.push(RW_SEGMENTS),
    }
    fields
}

/// The same request as a 64-bit frontend writes it: its fields copied one by one, every
/// other byte zero.
fn written_natively(slot: &Slot32) -> [u8; REQUEST_SIZE] {
    let mut native = [0u8; REQUEST_SIZE];
    for (at32, at64, len) in fields(slot) {
        native[at64..at64 + len].copy_from_slice(&slot[at32..at32 + len]);
    }
    native
}

/// Pages granted to both frontends (grefs 1..=12; odd ones read-only; gref 5 fails).
const DATA_PAGES: usize = 12;
const DISK_SECTORS: u64 = 256;

/// One frontend, its engine and disk.
struct Side {
    memory: Arc<GuestMemory>,
    front: FrontRing,
    engine: Engine<RingView, XenGrants, ShufflingDevice<RamDiskQueue>, CountingEvents>,
    disk: RamDisk,
    ring_pages: usize,
    responses: Vec<Response>,
}

impl Side {
    fn new(protocol: Protocol, order: u32, persistent: bool, seed: u64) -> Side {
        let ring_pages = 1usize << order;
        let memory = GuestMemory::new(ring_pages + DATA_PAGES);
        let table = GrantTable::new(memory.clone());
        for i in 0..DATA_PAGES {
            table.grant(i as u32 + 1, ring_pages + i, i % 2 == 1);
            memory.fill(ring_pages + i, i as u8 + 1);
        }
        table.fail_maps_of(5);
        let disk = RamDisk::new(DISK_SECTORS);
        let pages: Vec<usize> = (0..ring_pages).collect();
        let front = FrontRing::with_protocol(
            RingView::new(memory.clone(), pages.clone()),
            order,
            protocol,
        );
        let config = EngineConfig {
            max_indirect_segments: 64,
            protocol,
            ..EngineConfig::new(order, persistent)
        };
        let engine = Engine::new(
            RingView::new(memory.clone(), pages),
            XenGrants(table),
            ShufflingDevice::new(disk.queue(8), seed, 50),
            CountingEvents::default(),
            config,
        )
        .expect("engine");
        Side {
            memory,
            front,
            engine,
            disk,
            ring_pages,
            responses: Vec::new(),
        }
    }

    fn poll(&mut self, budget: usize) {
        self.engine.poll(budget);
        let responses = &mut self.responses;
        self.front.take_responses(|r| responses.push(r));
    }

    fn data(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; DISK_SECTORS as usize * 512];
        self.disk.read_at(0, &mut bytes);
        for page in 0..DATA_PAGES {
            let mut out = vec![0u8; abi::PAGE_SIZE];
            self.memory.read(self.ring_pages + page, 0, &mut out);
            bytes.extend_from_slice(&out);
        }
        bytes
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, mut script)) = data.split_first() else {
        return;
    };
    let order = u32::from(setup % 2);
    let persistent = setup & 2 != 0;
    let seed = u64::from(setup >> 2);
    let mut side32 = Side::new(Protocol::X86_32, order, persistent, seed);
    let mut side64 = Side::new(Protocol::X86_64, order, persistent, seed);
    assert_eq!(side32.front.slots(), side64.front.slots());
    // The slot each request went into, by ring index, to check responses leave the rest.
    let mut sent: Vec<Slot32> = Vec::new();

    while let Some((&action, rest)) = script.split_first() {
        script = rest;
        match action % 4 {
            // A request: check its translation, then send it to both.
            0 | 1 => {
                let Some(slot) = script.get(..x86_32::REQUEST_SIZE) else {
                    break;
                };
                let slot: Slot32 = slot.try_into().unwrap();
                script = &script[x86_32::REQUEST_SIZE..];
                let translated = x86_32::to_native(&slot);
                for (at32, at64, len) in fields(&slot) {
                    assert_eq!(
                        translated[at64..at64 + len],
                        slot[at32..at32 + len],
                        "the field at x86_32 offset {at32} lands at x86_64 offset {at64}"
                    );
                }
                let native = written_natively(&slot);
                let max = u16::from(action >> 2) * 9;
                assert_eq!(
                    parse_request(&translated, max),
                    parse_request(&native, max),
                    "the translation parses as the request written natively"
                );
                if side32.front.free_slots() > 0 {
                    side32.front.put_request_x86_32(&slot);
                    side32.front.push_requests();
                    side64.front.put_request(&native);
                    side64.front.push_requests();
                    sent.push(slot);
                }
            }
            // Both frontends scribble the same bytes over a data page (indirect pages).
            2 => {
                let Some(bytes) = script.get(..18) else { break };
                script = &script[18..];
                let page = usize::from(bytes[0]) % DATA_PAGES;
                let offset = usize::from(bytes[1]) * 16 % abi::PAGE_SIZE;
                for side in [&side32, &side64] {
                    side.memory
                        .write(side.ring_pages + page, offset, &bytes[2..]);
                }
            }
            _ => {
                let budget = usize::from(action >> 2) % 40;
                let before = side32.responses.len();
                side32.poll(budget);
                side64.poll(budget);
                assert_eq!(
                    side32.responses, side64.responses,
                    "the two ABIs answer alike"
                );
                check_slots(&side32, &sent, before);
            }
        }
    }
    // Everything answered, on both.
    for _ in 0..64 {
        if side32.responses.len() == sent.len() && side64.responses.len() == sent.len() {
            break;
        }
        let before = side32.responses.len();
        side32.poll(64);
        side64.poll(64);
        check_slots(&side32, &sent, before);
    }
    assert_eq!(side32.responses.len(), sent.len(), "every request answered");
    assert_eq!(
        side32.responses, side64.responses,
        "the two ABIs answer alike"
    );
    assert!(
        side32.data() == side64.data(),
        "the disks and pages end equal"
    );
    for side in [&mut side32, &mut side64] {
        let mut attempts = 0;
        while side.engine.disconnect().is_err() {
            attempts += 1;
            assert!(attempts < 64, "teardown never finishes");
        }
    }
});

/// The responses from index `from` on were written in the first 12 bytes of their
/// slots: what follows is still the frontend's request.
fn check_slots(side: &Side, sent: &[Slot32], from: usize) {
    for (index, request) in sent
        .iter()
        .enumerate()
        .take(side.responses.len())
        .skip(from)
    {
        let slot = side.front.slot_bytes(index as u32);
        assert_eq!(
            slot[x86_32::RESPONSE_SIZE..],
            request[x86_32::RESPONSE_SIZE..],
            "a response wrote past its 12 bytes into slot {index}"
        );
    }
}
