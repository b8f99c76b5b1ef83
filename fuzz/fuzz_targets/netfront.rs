// SPDX-License-Identifier: MIT OR Apache-2.0
//! A vif queue (`netfront::NetQueue`) against a hostile netback.
//!
//! The input scripts both sides: the frontend sends frames and GSO packets (over
//! several pages, with an extra slot) of fuzzed length and segment size, reaps,
//! receives and posts; the backend writes tx and rx responses with fuzzed ids, statuses,
//! offsets and flags (so chains of slots, extra-info slots of any type), or publishes
//! any response producer. Properties: no panic; a packet received fits the packet
//! buffer and no more slots than a chain may span were taken; tx ids in flight stay
//! within the ring; once the queue reports a fault it sends nothing, takes nothing and
//! keeps reporting that fault.
#![no_main]

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use netfront::queue::{NetQueue, Offload, Page, SendError, MAX_FRAME, MAX_PACKET, MAX_TX_PACKET};
use xen::abi::sring;
use xen::SharedMem;

#[path = "../common/input.rs"]
mod input;
use input::Input;

/// The rings and pages, made once (a queue re-initialises its rings).
struct Memory {
    tx_ring: SharedMem,
    rx_ring: SharedMem,
    pages: [SharedMem; 512],
}

fn memory() -> &'static Memory {
    static MEMORY: OnceLock<Memory> = OnceLock::new();
    MEMORY.get_or_init(|| Memory {
        tx_ring: SharedMem::alloc_leaked(4096),
        rx_ring: SharedMem::alloc_leaked(4096),
        pages: std::array::from_fn(|_| SharedMem::alloc_leaked(4096)),
    })
}

/// What is sent: only the length matters.
static PACKET: [u8; MAX_TX_PACKET + 64] = [1; MAX_TX_PACKET + 64];

fn slot(index: u32, size: usize) -> usize {
    sring::HEADER_SIZE + (index & 255) as usize * size
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let m = memory();
    let page = |i: usize| Page {
        mem: m.pages[i],
        gref: 8 + i as u32,
    };
    let mut q = NetQueue::new(
        m.tx_ring,
        m.rx_ring,
        Box::new(std::array::from_fn(page)),
        Box::new(std::array::from_fn(|i| page(256 + i))),
    );
    // Half the inputs as after a hash set-up: hash extra slots are taken too.
    if data.first().is_some_and(|b| b & 0x80 != 0) {
        q.accept_hash();
    }
    q.post_rx();
    let (mut tx_rsp, mut rx_rsp) = (0u32, 0u32);
    let mut buf: Box<[u8; MAX_PACKET]> =
        vec![0u8; MAX_PACKET].into_boxed_slice().try_into().unwrap();
    let mut fault = None;
    for _ in 0..256 {
        if input.0.is_empty() {
            break;
        }
        match input.byte() % 7 {
            0 => {
                // A frame, or a GSO packet over several pages with its extra slot.
                let kind = input.byte();
                let (len, offload) = match kind % 3 {
                    0 => (input.uint(2) as usize % (MAX_FRAME + 64), Offload::None),
                    1 => (input.uint(2) as usize % (MAX_FRAME + 64), Offload::Checksum),
                    _ => (
                        input.uint(3) as usize % (MAX_TX_PACKET + 64),
                        Offload::Segments(u16::from(kind / 3)),
                    ),
                };
                match q.send_packet(&PACKET[..len], offload) {
                    Ok(()) => assert!(fault.is_none()),
                    Err(SendError::Failed(f)) => assert_eq!(Some(f), fault),
                    Err(_) => {}
                }
            }
            1 => match q.reap_tx() {
                Ok(_) => assert!(fault.is_none()),
                Err(f) => assert_eq!(*fault.get_or_insert(f), f),
            },
            2 => match q.receive(&mut buf) {
                Ok(Some(packet)) => {
                    assert!(fault.is_none() && (1..=MAX_PACKET).contains(&packet.len))
                }
                Ok(None) => assert!(fault.is_none()),
                Err(f) => assert_eq!(*fault.get_or_insert(f), f),
            },
            3 => {
                // A tx response: any id and status.
                let at = slot(tx_rsp, 12);
                m.tx_ring
                    .store_u16(at, input.uint(2) as u16, Ordering::Relaxed);
                m.tx_ring
                    .store_u16(at + 2, input.uint(2) as u16, Ordering::Relaxed);
                tx_rsp = tx_rsp.wrapping_add(1);
                m.tx_ring
                    .store_u32(sring::RSP_PROD, tx_rsp, Ordering::Release);
            }
            4 => {
                // An rx response: any id, offset, flags, status.
                let at = slot(rx_rsp, 8);
                for field in 0..4 {
                    m.rx_ring
                        .store_u16(at + 2 * field, input.uint(2) as u16, Ordering::Relaxed);
                }
                rx_rsp = rx_rsp.wrapping_add(1);
                m.rx_ring
                    .store_u32(sring::RSP_PROD, rx_rsp, Ordering::Release);
            }
            5 => {
                // Any producer, on either ring.
                let ring = if input.byte() & 1 == 0 {
                    m.tx_ring
                } else {
                    m.rx_ring
                };
                let value = input.uint(4) as u32;
                ring.store_u32(sring::RSP_PROD, value, Ordering::Release);
                tx_rsp = value;
                rx_rsp = value;
            }
            _ => {
                q.post_rx();
                q.take_notify();
            }
        }
        assert!(q.tx_in_flight() <= 256);
        assert_eq!(q.fault(), fault);
    }
});
