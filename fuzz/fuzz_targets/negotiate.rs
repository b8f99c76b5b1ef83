// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenbus state machine against a hostile frontend (and toolstack): arbitrary values
//! in every key it reads, arbitrary state changes, removal of the backend directory, a
//! kernel side that is sometimes busy. It must not panic, and whatever it connects must
//! be within what it advertised.
#![no_main]

use blkback::engine::Busy;
use blkback::fake::MemStore;
use blkback::negotiate::{
    BackendParams, BlkifBackend, ConnectionHooks, FrontendConnection, StepOutcome, XenbusState,
};
use blkdev::RamDisk;
use libfuzzer_sys::fuzz_target;

const BE: &str = "/local/domain/0/backend/vbd/3/768";
const FE: &str = "/local/domain/3/device/vbd/768";
const KEYS: [&str; 12] = [
    "state",
    "ring-page-order",
    "multi-queue-num-queues",
    "protocol",
    "feature-persistent",
    "ring-ref",
    "ring-ref0",
    "ring-ref1",
    "event-channel",
    "queue-0/ring-ref",
    "queue-1/event-channel",
    "queue-0/event-channel",
];

struct Hooks {
    busy: bool,
    connected: bool,
    /// A second passes per step (a detached device's grace runs out after a few).
    now: u64,
}

impl ConnectionHooks for Hooks {
    type Error = core::convert::Infallible;

    fn connect(&mut self, connection: &FrontendConnection) -> Result<(), Self::Error> {
        assert!(!self.connected, "connect without disconnect");
        assert!((1..=2).contains(&connection.queues.len()));
        assert!(connection.ring_order <= 4);
        for queue in &connection.queues {
            assert_eq!(queue.ring_refs.len(), 1 << connection.ring_order);
        }
        self.connected = true;
        Ok(())
    }
    fn disconnect(&mut self) -> Result<(), Busy> {
        if self.busy {
            return Err(Busy { in_flight: 1 });
        }
        self.connected = false;
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        self.now
    }
}

fuzz_target!(|data: &[u8]| {
    let mut store = MemStore::new();
    store.set(&format!("{BE}/frontend"), FE);
    store.set(&format!("{BE}/frontend-id"), "3");
    store.set(&format!("{BE}/state"), "1");
    let Ok(mut backend) = BlkifBackend::probe(
        &mut store,
        BE,
        BackendParams::new(2, RamDisk::new(64).geometry()),
    ) else {
        return;
    };
    let mut hooks = Hooks {
        busy: false,
        connected: false,
        now: 0,
    };
    let mut input = data;
    while let [op, rest @ ..] = input {
        input = rest;
        match op % 4 {
            0 | 1 => {
                let [key, len, rest @ ..] = input else { break };
                let len = usize::from(*len % 12).min(rest.len());
                let value = String::from_utf8_lossy(&rest[..len]).into_owned();
                input = &rest[len..];
                store.set(
                    &format!("{FE}/{}", KEYS[usize::from(*key) % KEYS.len()]),
                    &value,
                );
            }
            2 => hooks.busy = !hooks.busy,
            _ => {
                if op & 0x80 != 0 {
                    store.remove_tree(BE);
                }
                hooks.now += 1_000_000_000;
                match backend.step(&mut store, &mut hooks) {
                    Ok(StepOutcome::Switched(XenbusState::Connected)) => assert!(hooks.connected),
                    Ok(StepOutcome::Removed) => assert!(!hooks.connected),
                    Ok(StepOutcome::Switched(XenbusState::Closed)) => assert!(!hooks.connected),
                    _ => {}
                }
                if backend.state() == XenbusState::Connected {
                    assert!(hooks.connected);
                }
            }
        }
    }
});
