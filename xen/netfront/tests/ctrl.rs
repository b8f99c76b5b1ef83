// SPDX-License-Identifier: MIT OR Apache-2.0
//! The control ring's client and the hash set-up against a fake netback that answers as
//! Linux's `process_ctrl_request` does, and against backends that answer wrong, refuse,
//! or never answer.

use netfront::ctrl::{set_up_hash, CtrlError, CtrlRing, Waits, CTRL_WAIT_MS};
use netfront::hash::{Steering, KEY, MAPPING_SIZE};
use netfront::Page;
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use xen::abi::netif::*;
use xen::abi::sring;
use xen::SharedMem;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// As Linux netback.
    Netback,
    /// Answers this request type with this status.
    Refuse(u16, u32),
    Silent,
    /// Answers with another id, or another type.
    WrongId,
    WrongType,
    /// Publishes two responses to one request.
    TwoResponses,
    /// Hashes only these types.
    Flags(u32),
}

/// What the fake netback saw set up.
#[derive(Default, Debug)]
struct Seen {
    alg: u32,
    flags: u32,
    key: Vec<u8>,
    size: u32,
    mapping: Vec<u32>,
    kicks: u32,
    requests: Vec<u16>,
}

struct Fake {
    ring: SharedMem,
    page: Page,
    mode: Mode,
    queues: u32,
    max_mapping: u32,
    req_cons: u32,
    rsp_prod: u32,
    seen: Seen,
}

impl Fake {
    fn at(&self, index: u32) -> usize {
        sring::HEADER_SIZE + (index % CTRL_RING_SIZE) as usize * CTRL_SLOT
    }

    /// Answers every request produced, as `xenvif_ctrl_action` does.
    fn step(&mut self) {
        let m = self.ring;
        while m.load_u32(sring::REQ_PROD, Ordering::Acquire) != self.req_cons {
            let at = self.at(self.req_cons);
            self.req_cons += 1;
            let id = m.load_u16(at, Ordering::Relaxed);
            let kind = m.load_u16(at + 2, Ordering::Relaxed);
            let d: Vec<u32> = (0..3)
                .map(|i| m.load_u32(at + 4 + 4 * i, Ordering::Relaxed))
                .collect();
            self.seen.requests.push(kind);
            let (status, data) = match self.mode {
                Mode::Silent => return,
                Mode::Refuse(k, status) if k == kind => (status, 0),
                _ => self.process(kind, &d),
            };
            let (id, kind) = match self.mode {
                Mode::WrongId => (id.wrapping_add(1), kind),
                Mode::WrongType => (id, kind + 1),
                _ => (id, kind),
            };
            let copies = if self.mode == Mode::TwoResponses {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let at = self.at(self.rsp_prod);
                m.store_u16(at, id, Ordering::Relaxed);
                m.store_u16(at + 2, kind, Ordering::Relaxed);
                m.store_u32(at + 4, status, Ordering::Relaxed);
                m.store_u32(at + 8, data, Ordering::Relaxed);
                self.rsp_prod += 1;
            }
            m.store_u32(sring::RSP_PROD, self.rsp_prod, Ordering::Release);
        }
        // netback's `xenvif_ctrl_action`: an event at the next request.
        m.store_u32(sring::REQ_EVENT, self.req_cons + 1, Ordering::Release);
    }

    /// netback's `hash.c`, for the requests blkdom sends.
    fn process(&mut self, kind: u16, d: &[u32]) -> (u32, u32) {
        const OK: u32 = XEN_NETIF_CTRL_STATUS_SUCCESS;
        const BAD: u32 = XEN_NETIF_CTRL_STATUS_INVALID_PARAMETER;
        match kind {
            XEN_NETIF_CTRL_TYPE_SET_HASH_ALGORITHM if d[0] <= 1 => {
                self.seen.alg = d[0];
                (OK, 0)
            }
            XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS if self.seen.alg == 0 => {
                (XEN_NETIF_CTRL_STATUS_NOT_SUPPORTED, 0)
            }
            XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS => match self.mode {
                Mode::Flags(flags) => (OK, flags),
                _ => (OK, 0xf),
            },
            XEN_NETIF_CTRL_TYPE_SET_HASH_FLAGS if d[0] & !0xf == 0 && self.seen.alg != 0 => {
                self.seen.flags = d[0];
                (OK, 0)
            }
            XEN_NETIF_CTRL_TYPE_SET_HASH_KEY if d[1] <= 40 && d[0] == self.page.gref => {
                let mut key = vec![0; d[1] as usize];
                self.page.mem.read_bytes(0, &mut key);
                self.seen.key = key;
                (OK, 0)
            }
            XEN_NETIF_CTRL_TYPE_GET_HASH_MAPPING_SIZE => (OK, self.max_mapping),
            XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING_SIZE if d[0] <= self.max_mapping => {
                self.seen.size = d[0];
                (OK, 0)
            }
            XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING
                if d[0] == self.page.gref && d[2] + d[1] <= self.seen.size =>
            {
                let table: Vec<u32> = (0..d[1] as usize)
                    .map(|i| self.page.mem.load_u32(4 * i, Ordering::Relaxed))
                    .collect();
                if table.iter().any(|&q| q >= self.queues) {
                    return (BAD, 0);
                }
                self.seen.mapping = table;
                (OK, 0)
            }
            _ => (BAD, 0),
        }
    }
}

/// Runs the hash set-up for `queues` queues against a fake in `mode`: its result, what
/// the fake saw, and the time it took on the fake clock.
fn set_up(mode: Mode, queues: u16, max_mapping: u32) -> (Result<Steering, CtrlError>, Seen, u64) {
    let ring = SharedMem::alloc_leaked(4096);
    let page = Page {
        mem: SharedMem::alloc_leaked(4096),
        gref: 77,
    };
    let mut ctrl = CtrlRing::new(ring);
    let fake = RefCell::new(Fake {
        ring,
        page,
        mode,
        queues: u32::from(queues),
        max_mapping,
        req_cons: 0,
        rsp_prod: 0,
        seen: Seen::default(),
    });
    let clock = Cell::new(0u64);
    let mut now = || clock.get();
    // netback answers a little later, on its interrupt thread.
    let mut pause = || {
        clock.set(clock.get() + 1);
        fake.borrow_mut().step();
    };
    let mut kick = || fake.borrow_mut().seen.kicks += 1;
    let mut waits = Waits {
        now_ms: &mut now,
        pause: &mut pause,
        kick: &mut kick,
    };
    let result = set_up_hash(&mut ctrl, queues, &page, &mut waits);
    // A ring that broke stays broken.
    if matches!(
        result,
        Err(CtrlError::Timeout { .. } | CtrlError::Garbage { .. } | CtrlError::Overflow(_))
    ) {
        let again = ctrl.request(XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS, [0; 3], &mut waits);
        assert_eq!(again, Err(CtrlError::Broken));
    }
    (result, fake.into_inner().seen, clock.get())
}

#[test]
fn netback_is_set_up_for_toeplitz_over_ipv4_tcp_with_our_key_and_table() {
    for queues in [2u16, 3, 8] {
        let (result, seen, _) = set_up(Mode::Netback, queues, 128);
        let steering = result.unwrap();
        assert_eq!(steering, Steering::new(queues, MAPPING_SIZE));
        assert_eq!(seen.alg, XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ);
        assert_eq!(seen.flags, XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP);
        assert_eq!(seen.key, KEY);
        assert_eq!(seen.size, 128);
        let expected: Vec<u32> = (0..128).map(|i| i % u32::from(queues)).collect();
        assert_eq!(seen.mapping, expected);
        assert_eq!(
            seen.requests,
            [7, 1, 2, 3, 4, 5, 6],
            "algorithm, flags asked then set, key, table size asked then set, table"
        );
        // One request out at a time: netback waits for each (req_event), so each is
        // an event.
        assert_eq!(seen.kicks, 7);
    }
}

#[test]
fn a_smaller_table_is_taken_and_none_when_it_cannot_hold_the_queues() {
    let (result, seen, _) = set_up(Mode::Netback, 4, 16);
    assert_eq!(result.unwrap(), Steering::new(4, 16));
    assert_eq!(seen.mapping.len(), 16);
    let (result, seen, _) = set_up(Mode::Netback, 4, 2);
    assert_eq!(result.unwrap(), Steering::new(4, 0), "hash % queues");
    assert_eq!(seen.size, 0);
    assert!(seen.mapping.is_empty());
    assert_eq!(*seen.requests.last().unwrap(), 5, "no table sent");
}

#[test]
fn each_refusal_fails_the_set_up_with_its_request_and_status() {
    for kind in 1..=7u16 {
        let (result, seen, _) = set_up(Mode::Refuse(kind, 2), 2, 128);
        assert_eq!(result, Err(CtrlError::Status { kind, status: 2 }), "{kind}");
        assert_eq!(*seen.requests.last().unwrap(), kind, "nothing after it");
        let text = result.unwrap_err().to_string();
        assert!(text.contains("invalid parameter"), "{text}");
    }
    // A netback that hashes no IPv4/TCP.
    let (result, seen, _) = set_up(Mode::Flags(XEN_NETIF_CTRL_HASH_TYPE_IPV4), 2, 128);
    assert_eq!(result, Err(CtrlError::NoTcpHash { flags: 1 }));
    assert_eq!(seen.requests, [7, 1]);
}

#[test]
fn silence_is_a_timeout_in_bounded_time_and_garbage_breaks_the_ring() {
    let (result, seen, took) = set_up(Mode::Silent, 2, 128);
    assert_eq!(
        result,
        Err(CtrlError::Timeout {
            kind: XEN_NETIF_CTRL_TYPE_SET_HASH_ALGORITHM
        })
    );
    assert_eq!(seen.requests.len(), 1);
    assert!((CTRL_WAIT_MS..=CTRL_WAIT_MS + 1).contains(&took), "{took}");
    let (result, _, _) = set_up(Mode::WrongId, 2, 128);
    assert!(matches!(
        result,
        Err(CtrlError::Garbage { sent: 0, id: 1, .. })
    ));
    let (result, _, _) = set_up(Mode::WrongType, 2, 128);
    assert!(matches!(result, Err(CtrlError::Garbage { got: 8, .. })));
    let (result, _, _) = set_up(Mode::TwoResponses, 2, 128);
    assert!(matches!(result, Err(CtrlError::Overflow(_))), "{result:?}");
}
