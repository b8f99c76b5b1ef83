// SPDX-License-Identifier: MIT OR Apache-2.0
//! A 32-bit x86 frontend (`protocol` = `x86_32-abi`): its slots are 108 bytes, `id`
//! 4-byte aligned right after the first four bytes, and its responses 12 bytes. The
//! requests here are written byte by byte at the x86_32 offsets (`blkif.h` as a 32-bit
//! guest compiles it), into slots 108 bytes apart.

use blkdev::RamDiskQueue;

use super::{page_bytes, whole_page, Rig, DISK_SECTORS};
use crate::abi::{self, sring, x86_32, Protocol, RSP_EOPNOTSUPP, RSP_ERROR, RSP_OKAY};
use crate::engine::EngineConfig;
use crate::fake::wire::{encode_indirect, encode_segment, x86_32_of};
use crate::parse::SegmentDesc;
use crate::ring::{Response, RingMemory};

fn rig(order: u32, persistent: bool) -> (Rig<RamDiskQueue>, blkdev::RamDisk) {
    let disk = blkdev::RamDisk::new(DISK_SECTORS);
    let config = EngineConfig {
        protocol: Protocol::X86_32,
        ..EngineConfig::new(order, persistent)
    };
    (Rig::new(config, disk.queue(256)), disk)
}

/// A read/write/flush request as a 32-bit guest lays it out.
fn rw32(operation: u8, id: u64, sector: u64, segments: &[SegmentDesc]) -> [u8; 108] {
    let mut raw = [0u8; 108];
    raw[0] = operation;
    raw[1] = segments.len() as u8;
    raw[2..4].copy_from_slice(&0xca00u16.to_le_bytes());
    raw[4..12].copy_from_slice(&id.to_le_bytes());
    raw[12..20].copy_from_slice(&sector.to_le_bytes());
    for (i, segment) in segments.iter().enumerate() {
        raw[20 + 8 * i..28 + 8 * i].copy_from_slice(&encode_segment(segment));
    }
    raw
}

fn discard32(id: u64, sector: u64, nr_sectors: u64) -> [u8; 108] {
    let mut raw = [0u8; 108];
    raw[0] = abi::OP_DISCARD;
    raw[4..12].copy_from_slice(&id.to_le_bytes());
    raw[12..20].copy_from_slice(&sector.to_le_bytes());
    raw[20..28].copy_from_slice(&nr_sectors.to_le_bytes());
    raw
}

fn send(rig: &mut Rig<RamDiskQueue>, raw: &[u8; 108]) {
    rig.front.put_request_x86_32(raw);
    rig.front.push_requests();
}

fn ok(id: u64, operation: u8) -> Response {
    Response {
        id,
        operation,
        status: RSP_OKAY,
    }
}

#[test]
fn a_32_bit_frontend_writes_reads_flushes_and_discards() {
    let (mut rig, disk) = rig(0, false);
    assert_eq!(rig.engine.ring().slots(), 32);
    let (_, a) = rig.data_page(0xa1);
    let (_, b) = rig.data_page(0xb2);
    // Ids with all 8 bytes set: a backend reading them at the x86_64 offset (8) would
    // see the sector instead.
    let write_id = 0x8877_6655_4433_2211;
    send(
        &mut rig,
        &rw32(abi::OP_WRITE, write_id, 16, &[whole_page(a), whole_page(b)]),
    );
    rig.engine.poll(8);
    assert_eq!(rig.responses(), [ok(write_id, abi::OP_WRITE)]);
    let mut on_disk = vec![0u8; 8192];
    disk.read_at(16 * 512, &mut on_disk);
    assert!(on_disk[..4096].iter().all(|&x| x == 0xa1));
    assert!(on_disk[4096..].iter().all(|&x| x == 0xb2));

    // Read the second page back into a fresh one, half a page at an offset.
    let (page, c) = rig.data_page(0);
    let half = SegmentDesc {
        gref: c,
        first_sect: 4,
        last_sect: 7,
    };
    send(&mut rig, &rw32(abi::OP_READ, 7, 24, &[half]));
    send(&mut rig, &rw32(abi::OP_FLUSH_DISKCACHE, 8, u64::MAX, &[]));
    send(&mut rig, &discard32(9, 16, 8));
    for _ in 0..4 {
        rig.engine.poll(8);
    }
    assert_eq!(
        rig.responses(),
        [
            ok(7, abi::OP_READ),
            ok(8, abi::OP_FLUSH_DISKCACHE),
            ok(9, abi::OP_DISCARD)
        ]
    );
    let read = page_bytes(&rig.memory, page);
    assert!(read[..2048].iter().all(|&x| x == 0));
    assert!(read[2048..].iter().all(|&x| x == 0xb2));
    disk.read_at(16 * 512, &mut on_disk);
    assert!(on_disk[..4096].iter().all(|&x| x == 0), "discarded");
    assert!(on_disk[4096..].iter().all(|&x| x == 0xb2), "kept");
}

#[test]
fn a_32_bit_frontend_gets_12_byte_responses_and_refusals_echo_its_ids() {
    let (mut rig, _disk) = rig(0, false);
    // Slot 0: an unknown operation; slot 1: a bad segment; slot 2: past the end.
    let (_, g) = rig.data_page(1);
    let mut unknown = rw32(0x42, 0x0102_0304_0506_0708, 0, &[]);
    unknown[100..108].copy_from_slice(&[0xff; 8]);
    let bad = SegmentDesc {
        gref: g,
        first_sect: 5,
        last_sect: 2,
    };
    send(&mut rig, &unknown);
    send(&mut rig, &rw32(abi::OP_READ, 0x11, 0, &[bad]));
    send(
        &mut rig,
        &rw32(abi::OP_WRITE, 0x12, DISK_SECTORS, &[whole_page(g)]),
    );
    // The frontend's own bytes after where a 12-byte response ends.
    let marker = 0x5a5a_5a5a_u32;
    for slot in 0..3usize {
        let at = sring::HEADER_SIZE + slot * x86_32::REQUEST_SIZE + 12;
        rig.front.view().write_bytes(at, &marker.to_le_bytes());
    }
    rig.engine.poll(8);
    assert_eq!(
        rig.responses(),
        [
            Response {
                id: 0x0102_0304_0506_0708,
                operation: 0x42,
                status: RSP_EOPNOTSUPP
            },
            Response {
                id: 0x11,
                operation: abi::OP_READ,
                status: RSP_ERROR
            },
            Response {
                id: 0x12,
                operation: abi::OP_WRITE,
                status: RSP_ERROR
            },
        ]
    );
    for slot in 0..3u32 {
        let bytes = rig.front.slot_bytes(slot);
        // Written: id, operation, a zero pad byte, status; the rest is the frontend's.
        assert_eq!(bytes[9], 0, "padding zeroed");
        assert_eq!(bytes[12..16], marker.to_le_bytes(), "slot {slot}");
    }
    // Slot 1's response sits 108 bytes into the ring, where a 32-bit frontend reads it.
    assert_eq!(rig.front.slot_bytes(1)[..8], 0x11u64.to_le_bytes());
}

#[test]
fn a_32_bit_frontend_sends_indirect_requests() {
    let (mut rig, disk) = rig(1, true);
    assert_eq!(rig.engine.ring().slots(), 64);
    let grefs: Vec<u32> = (0..20).map(|i| rig.data_page(i as u8 + 1).1).collect();
    let (indirect_page, indirect_gref) = rig.data_page(0);
    for (i, &gref) in grefs.iter().enumerate() {
        rig.memory
            .write(indirect_page, i * 8, &encode_segment(&whole_page(gref)));
    }
    let raw = x86_32_of(&encode_indirect(
        abi::OP_WRITE,
        0xfeed_0000_0000_0001,
        8,
        20,
        &[indirect_gref],
    ));
    // The x86_32 slot as a 32-bit guest has it: handle at 20, grefs from 24.
    assert_eq!(raw[2..4], 20u16.to_le_bytes());
    assert_eq!(raw[24..28], indirect_gref.to_le_bytes());
    send(&mut rig, &raw);
    rig.engine.poll(8);
    assert_eq!(rig.responses(), [ok(0xfeed_0000_0000_0001, abi::OP_WRITE)]);
    let mut on_disk = vec![0u8; 20 * 4096];
    disk.read_at(8 * 512, &mut on_disk);
    for (i, block) in on_disk.chunks(4096).enumerate() {
        assert!(block.iter().all(|&x| x == i as u8 + 1), "page {i}");
    }
    assert_eq!(rig.engine.stats().indirect, 1);
}
