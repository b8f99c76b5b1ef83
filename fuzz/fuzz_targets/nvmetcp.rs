// SPDX-License-Identifier: MIT OR Apache-2.0
//! The NVMe/TCP host queue (`nvmetcp::Queue`) against a hostile target.
//!
//! The input sets the queue up (in-capsule limit, digests, MAXH2CDATA in a valid ICResp:
//! with digests on, every PDU below is sent with valid ones before any mutation), submits
//! up to eight commands (reads, writes, an owned Dataset Management range, flushes),
//! then scripts the connection: transmit into a window of fuzzed size, feed raw bytes,
//! or feed a PDU built from fuzzed fields (CapsuleResp, C2HData, R2T, C2HTermReq) for a
//! command ID the queue used or any other. Properties: no panic; every byte the queue
//! reads or writes through the port is inside the buffer of a command in flight that
//! moves data that way; a read completes successfully only with every byte delivered
//! once, in order; each command completes at most once; after an error the queue sends
//! nothing, takes nothing and keeps reporting the same error, and `drain` hands back
//! exactly the commands that never completed.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use nvmetcp::fake::with_digests;
use nvmetcp::{pdu, sqe, DataPort, Digests, Payload, Queue, QueueKind};

#[path = "../common/input.rs"]
mod input;
use input::Input;

#[derive(Clone, Copy, PartialEq)]
enum Dir {
    None,
    Read,
    Write,
}

struct Command {
    dir: Dir,
    len: u32,
    /// Bytes delivered so far (reads), in order.
    delivered: u32,
    completed: bool,
}

/// The caller's buffers, checking every access the queue makes.
struct Port {
    commands: HashMap<u64, Command>,
}

impl DataPort for Port {
    fn fetch(&mut self, tag: u64, offset: u32, dst: &mut [u8]) {
        let c = self
            .commands
            .get(&tag)
            .expect("fetch for a command that exists");
        assert!(
            c.dir == Dir::Write && !c.completed,
            "fetch for a write in flight"
        );
        assert!(
            u64::from(offset) + dst.len() as u64 <= u64::from(c.len),
            "fetch inside the buffer"
        );
        dst.fill(tag as u8);
    }
    fn deliver(&mut self, tag: u64, offset: u32, src: &[u8]) {
        let c = self
            .commands
            .get_mut(&tag)
            .expect("deliver for a command that exists");
        assert!(
            c.dir == Dir::Read && !c.completed,
            "deliver for a read in flight"
        );
        assert_eq!(offset, c.delivered, "data delivered in order, once");
        assert!(
            u64::from(offset) + src.len() as u64 <= u64::from(c.len),
            "deliver inside the buffer"
        );
        c.delivered += src.len() as u32;
    }
}

fn header(out: &mut Vec<u8>, pdu_type: u8, flags: u8, hlen: u8, pdo: u8, plen: u32) {
    out.extend_from_slice(&[pdu_type, flags, hlen, pdo]);
    out.extend_from_slice(&plen.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let setup = input.byte();
    let inline_limit = [0u32, 16, 4096, 8192][usize::from(setup % 4)];
    let digests = Digests {
        header: setup & 4 != 0,
        data: setup & 8 != 0,
    };
    let maxh2cdata = 4096 + 4 * (input.uint(2) as u32 % 4096);
    let mut q = Queue::<8>::new(QueueKind::Io { inline_limit }).with_digests(digests);
    let mut port = Port {
        commands: HashMap::new(),
    };
    let mut out = vec![0u8; 1 << 16];
    assert_eq!(q.transmit(&mut out, &mut port), 128, "ICReq first");
    let mut icresp = vec![0u8; 128];
    icresp[0] = pdu::ICRESP;
    icresp[2] = 128;
    icresp[4..8].copy_from_slice(&128u32.to_le_bytes());
    icresp[11] = digests.bits();
    icresp[12..16].copy_from_slice(&maxh2cdata.to_le_bytes());
    q.receive(&icresp, &mut port).expect("a valid ICResp");

    // Commands, and the command IDs the capsules carried.
    let mut cids: Vec<u16> = Vec::new();
    for tag in 0..u64::from(input.byte() % 9) {
        let len = 1 + (input.uint(2) as u32 % 20000);
        let (payload, dir, len, sqe) = match input.byte() % 4 {
            0 => (
                Payload::ToHost(len),
                Dir::Read,
                len,
                sqe::rw(false, 1, 0, 1),
            ),
            1 => (
                Payload::ToTarget(len),
                Dir::Write,
                len,
                sqe::rw(true, 1, 0, 1),
            ),
            2 => {
                let bytes = sqe::dsm_range(0, 1);
                (
                    Payload::Owned { bytes, len: 16 },
                    Dir::None,
                    16,
                    sqe::deallocate(1),
                )
            }
            _ => (Payload::None, Dir::None, 0, sqe::flush(1)),
        };
        q.submit(tag, sqe, payload).expect("a slot is free");
        // Owned data never reaches the port: the queue keeps it.
        port.commands.insert(
            tag,
            Command {
                dir,
                len,
                delivered: 0,
                completed: false,
            },
        );
    }
    let mut error = None;
    let mut steps = 0;
    while !input.0.is_empty() && steps < 256 {
        steps += 1;
        let op = input.byte();
        let mut bytes = Vec::new();
        match op % 6 {
            0 | 1 => {
                let window = 1 + usize::from(input.byte()) * (1 + usize::from(op >> 4));
                let n = q.transmit(&mut out[..window.min(1 << 16)], &mut port);
                // Learn the command IDs from capsule headers that start a window.
                if n >= 12 && out[0] == pdu::CAPSULE_CMD {
                    cids.push(u16::from_le_bytes([out[10], out[11]]));
                }
                if error.is_some() {
                    assert_eq!(n, 0, "a failed queue sends nothing");
                }
                continue;
            }
            2 => {
                let n = usize::from(input.byte());
                bytes.extend_from_slice(input.take(n));
            }
            3 => {
                let cid = pick_cid(&mut input, &cids);
                let status = input.uint(2) as u16 & 0x7fff;
                header(&mut bytes, pdu::CAPSULE_RESP, 0, 24, 0, 24);
                bytes.extend_from_slice(&input.uint(8).to_le_bytes());
                bytes.extend_from_slice(&[0; 4]);
                bytes.extend_from_slice(&cid.to_le_bytes());
                bytes.extend_from_slice(&(status << 1).to_le_bytes());
            }
            4 => {
                let cid = pick_cid(&mut input, &cids);
                let flags = input.byte() & 0x0c;
                let offset = input.uint(2) as u32;
                let len = input.uint(2) as u32 % 4096 + u32::from(input.byte() & 1);
                header(&mut bytes, pdu::C2H_DATA, flags, 24, 24, 24 + len);
                bytes.extend_from_slice(&cid.to_le_bytes());
                bytes.extend_from_slice(&[0; 2]);
                bytes.extend_from_slice(&offset.to_le_bytes());
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(&[0; 4]);
                bytes.resize(bytes.len() + len as usize, 0xa5);
            }
            _ => {
                let cid = pick_cid(&mut input, &cids);
                let offset = input.uint(2) as u32;
                let len = input.uint(3) as u32;
                header(&mut bytes, pdu::R2T, 0, 24, 0, 24);
                bytes.extend_from_slice(&cid.to_le_bytes());
                bytes.extend_from_slice(&input.uint(2).to_le_bytes()[..2]);
                bytes.extend_from_slice(&offset.to_le_bytes());
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(&[0; 4]);
            }
        }
        if op % 6 != 2 {
            bytes = with_digests(&bytes, digests);
        }
        // Mutate one byte now and then, so headers break in every field.
        if op & 0x80 != 0 && !bytes.is_empty() {
            let at = usize::from(input.byte()) % bytes.len();
            bytes[at] ^= input.byte() | 1;
        }
        let cut = 1 + usize::from(input.byte());
        for piece in bytes.chunks(cut) {
            let r = q.receive(piece, &mut port);
            match (error, r) {
                (Some(e), r) => assert_eq!(r, Err(e), "the first error sticks"),
                (None, Err(e)) => error = Some(e),
                (None, Ok(())) => {}
            }
        }
        while let Some(c) = q.next_completion() {
            let cmd = port
                .commands
                .get_mut(&c.tag)
                .expect("completion for a submitted tag");
            assert!(!cmd.completed, "one completion per command");
            cmd.completed = true;
            if c.status.is_success() && cmd.dir == Dir::Read {
                assert_eq!(cmd.delivered, cmd.len, "a successful read has all its data");
            }
        }
    }
    if let Some(e) = error {
        assert_eq!(q.error(), Some(e));
        let mut held = Vec::new();
        q.drain(|tag| held.push(tag));
        held.sort_unstable();
        let mut open: Vec<u64> = port
            .commands
            .iter()
            .filter(|(_, c)| !c.completed)
            .map(|(&t, _)| t)
            .collect();
        open.sort_unstable();
        // Completions popped above are gone; the rest are either drained or still in the
        // completion ring (popped next).
        while let Some(c) = q.next_completion() {
            open.retain(|&t| t != c.tag);
        }
        assert_eq!(held, open, "drain hands back what never completed");
    }
});

/// A command ID the queue used, or any.
fn pick_cid(input: &mut Input, cids: &[u16]) -> u16 {
    let b = input.byte();
    match cids.get(usize::from(b % 16)) {
        Some(&cid) if b & 0x80 == 0 => cid,
        _ => input.uint(2) as u16,
    }
}
