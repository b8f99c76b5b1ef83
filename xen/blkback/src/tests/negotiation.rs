// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenbus handshake against an in-memory xenstore, and end to end with engines.

use std::sync::atomic::Ordering;

use blkdev::{BlockDevice, RamDisk, RamDiskQueue};

use super::whole_page;
use crate::abi::{self, Protocol, RSP_EOPNOTSUPP, RSP_ERROR, RSP_OKAY};
use crate::engine::{Busy, Engine, EngineConfig};
use crate::fake::wire::{encode_direct, encode_discard};
use crate::fake::{
    CountingEvents, FrontRing, GrantTable, GuestMemory, MemStore, RingView, ShufflingDevice,
    XenGrants,
};
use crate::grant::{GrantOps, MapRequest, MappedGrant};
use crate::negotiate::{
    BackendParams, BlkifBackend, ConnectionHooks, FrontendConnection, QueueRing, StepOutcome,
    XenbusState, DETACH_GRACE_NS,
};
use xen::abi::grant_table::RawGrantStatus;
use xen::xenbus::error::{errno, Errno};
use xen::xenbus::retry::{earliest, RetrySchedule, RETRY_NS};
use xen::xenbus::{XenStore, NO_TRANSACTION};

pub(super) const BE: &str = "/local/domain/1/backend/vbd/5/51712";
pub(super) const FE: &str = "/local/domain/5/device/vbd/51712";

/// Records calls; answers `Busy` to the first `busy_replies` disconnects, and after a
/// connect it refuses to the next `busy_after_refusal` (rings it handed out before
/// failing, still to be let go).
#[derive(Default)]
pub(super) struct RecordingHooks {
    connects: Vec<FrontendConnection>,
    disconnects: usize,
    busy_replies: usize,
    refuse_connect: bool,
    busy_after_refusal: usize,
    /// The clock `now_ns` reads (tests move it on).
    now: u64,
}

/// What `RecordingHooks` answers a connect it refuses.
#[derive(Debug)]
pub(super) struct GrantMapFailed;

impl core::fmt::Display for GrantMapFailed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("grant map failed")
    }
}

impl core::error::Error for GrantMapFailed {}

impl Errno for GrantMapFailed {
    fn errno(&self) -> i32 {
        errno::EIO
    }
}

impl ConnectionHooks for RecordingHooks {
    type Error = GrantMapFailed;

    fn connect(&mut self, connection: &FrontendConnection) -> Result<(), GrantMapFailed> {
        self.connects.push(connection.clone());
        if self.refuse_connect {
            self.busy_replies = self.busy_after_refusal;
            return Err(GrantMapFailed);
        }
        Ok(())
    }
    fn disconnect(&mut self) -> Result<(), Busy> {
        self.disconnects += 1;
        if self.busy_replies > 0 {
            self.busy_replies -= 1;
            return Err(Busy { in_flight: 1 });
        }
        Ok(())
    }
    fn now_ns(&self) -> u64 {
        self.now
    }
}

pub(super) fn toolstack(store: &mut MemStore) {
    store.set(&format!("{BE}/frontend"), FE);
    store.set(&format!("{BE}/frontend-id"), "5");
    store.set(&format!("{BE}/mode"), "w");
    store.set(&format!("{BE}/state"), "1");
    store.set(&format!("{FE}/state"), "1");
}

pub(super) fn params() -> BackendParams {
    BackendParams::new(2, RamDisk::new(4096).geometry())
}

fn frontend_two_queues(store: &mut MemStore) {
    store.set(&format!("{FE}/multi-queue-num-queues"), "2");
    store.set(&format!("{FE}/ring-page-order"), "1");
    store.set(&format!("{FE}/protocol"), "x86_64-abi");
    store.set(&format!("{FE}/feature-persistent"), "1");
    for q in 0..2 {
        store.set(
            &format!("{FE}/queue-{q}/event-channel"),
            &format!("{}", 20 + q),
        );
        for i in 0..2 {
            store.set(
                &format!("{FE}/queue-{q}/ring-ref{i}"),
                &format!("{}", 100 + 10 * q + i),
            );
        }
    }
}

/// A probed backend whose frontend has written a one-page ring (not yet its state).
fn probed_single_ring() -> (MemStore, BlkifBackend) {
    let mut store = MemStore::new();
    toolstack(&mut store);
    let backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
    store.set(&format!("{FE}/ring-ref"), "8");
    store.set(&format!("{FE}/event-channel"), "9");
    (store, backend)
}

/// A probed one-page-ring backend whose frontend connected (it saw `Connected` and
/// `hooks` one connect), with `online` = 1 written by the toolstack if `online`.
fn connected_with(
    online: bool,
    mut hooks: RecordingHooks,
) -> (MemStore, BlkifBackend, RecordingHooks) {
    let (mut store, mut backend) = probed_single_ring();
    if online {
        store.set(&format!("{BE}/online"), "1");
    }
    store.set(&format!("{FE}/state"), "4");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
    assert_eq!(hooks.connects.len(), 1);
    (store, backend, hooks)
}

/// `connected_with` and hooks that accept everything.
fn connected(online: bool) -> (MemStore, BlkifBackend, RecordingHooks) {
    connected_with(online, RecordingHooks::default())
}

pub(super) fn state(store: &MemStore) -> &str {
    store.get(&format!("{BE}/state")).unwrap()
}

#[test]
fn handshake_publishes_features_then_connects_two_multi_page_queues() {
    let mut store = MemStore::new();
    toolstack(&mut store);
    let mut backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
    let early: Vec<&str> = store
        .writes
        .iter()
        .map(|(k, _)| k.rsplit('/').next().unwrap())
        .collect();
    assert_eq!(
        early,
        [
            "feature-max-indirect-segments",
            "multi-queue-max-queues",
            "max-ring-page-order",
            "hotplug-status",
            "state"
        ]
    );
    assert_eq!(
        store.get(&format!("{BE}/feature-max-indirect-segments")),
        Some("512")
    );
    assert_eq!(
        store.get(&format!("{BE}/multi-queue-max-queues")),
        Some("2")
    );
    assert_eq!(store.get(&format!("{BE}/max-ring-page-order")), Some("4"));
    assert_eq!(
        store.get(&format!("{BE}/hotplug-status")),
        Some("connected")
    );
    assert_eq!(state(&store), "2");
    assert_eq!(
        backend.watched_paths(),
        [format!("{FE}/state"), BE.to_string()]
    );

    let mut hooks = RecordingHooks::default();
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
    frontend_two_queues(&mut store);
    store.set(&format!("{FE}/state"), "3");
    store.refuse_commits = 2; // the device transaction is redone on EAGAIN
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
    assert_eq!(
        hooks.connects,
        [FrontendConnection {
            frontend_id: 5,
            ring_order: 1,
            persistent_grants: true,
            read_only: false,
            discard: true,
            max_indirect_segments: 512,
            protocol: Protocol::X86_64,
            queues: vec![
                QueueRing {
                    ring_refs: vec![100, 101],
                    event_channel: 20,
                    attach_at: None,
                },
                QueueRing {
                    ring_refs: vec![110, 111],
                    event_channel: 21,
                    attach_at: None,
                },
            ],
        }]
    );
    for (key, value) in [
        ("sectors", "4096"),
        ("info", "0"),
        ("sector-size", "512"),
        ("physical-sector-size", "4096"),
        ("feature-flush-cache", "1"),
        ("feature-barrier", "1"),
        ("feature-discard", "1"),
        ("discard-granularity", "512"),
        ("discard-alignment", "0"),
        ("discard-secure", "1"),
        ("feature-persistent", "1"),
        ("mode", "w"),
        ("state", "4"),
    ] {
        assert_eq!(store.get(&format!("{BE}/{key}")), Some(value), "{key}");
    }
    // A second watch firing with the frontend still connected changes nothing.
    store.set(&format!("{FE}/state"), "4");
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
    assert_eq!(hooks.connects.len(), 1);
}

#[test]
fn persistent_grants_withheld_by_the_backend_are_not_used_when_the_frontend_offers_them() {
    let mut store = MemStore::new();
    toolstack(&mut store);
    let params = BackendParams {
        persistent_grants: false,
        ..params()
    };
    let mut backend = BlkifBackend::probe(&mut store, BE, params).unwrap();
    frontend_two_queues(&mut store);
    store.set(&format!("{FE}/state"), "3");
    let mut hooks = RecordingHooks::default();
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
    assert!(!hooks.connects[0].persistent_grants);
    // blkfront copies through persistent pages only when the backend says "1": it
    // offers none.
    assert_eq!(store.get(&format!("{BE}/feature-persistent")), Some("0"));
}

#[test]
fn single_page_ring_uses_ring_ref_and_defaults() {
    let mut store = MemStore::new();
    toolstack(&mut store);
    store.set(&format!("{BE}/mode"), "r");
    let mut backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
    store.set(&format!("{FE}/ring-ref"), "8");
    store.set(&format!("{FE}/event-channel"), "9");
    store.set(&format!("{FE}/state"), "4");
    let mut hooks = RecordingHooks::default();
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
    let connection = &hooks.connects[0];
    assert_eq!(
        (
            connection.ring_order,
            connection.persistent_grants,
            connection.read_only
        ),
        (0, false, true)
    );
    assert_eq!(
        connection.queues,
        [QueueRing {
            ring_refs: vec![8],
            event_channel: 9,
            attach_at: None,
        }]
    );
    assert_eq!(store.get(&format!("{BE}/info")), Some("4"));
    assert_eq!(store.get(&format!("{BE}/feature-discard")), Some("0"));
    // The backend's offer, although this frontend asked for none (not used: above).
    assert_eq!(store.get(&format!("{BE}/feature-persistent")), Some("1"));
}

#[test]
fn an_x86_32_frontend_connects_and_its_abi_reaches_the_engine_config() {
    for (written, expected) in [
        (Some("x86_32-abi"), Protocol::X86_32),
        (Some("x86_64-abi"), Protocol::X86_64),
        (None, Protocol::X86_64),
    ] {
        let (mut store, mut backend) = probed_single_ring();
        if let Some(value) = written {
            store.set(&format!("{FE}/protocol"), value);
        }
        store.set(&format!("{FE}/state"), "3");
        let mut hooks = RecordingHooks::default();
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::Connected)),
            "{written:?}"
        );
        assert_eq!(hooks.connects[0].protocol, expected, "{written:?}");
    }
}

#[test]
fn bad_frontend_keys_fail_with_a_reason_and_close() {
    let cases: [(&str, &str, &str); 5] = [
        ("multi-queue-num-queues", "3", "multi-queue-num-queues 3"),
        ("multi-queue-num-queues", "0", "multi-queue-num-queues 0"),
        ("ring-page-order", "5", "ring-page-order 5 > max 4"),
        (
            "protocol",
            "arm-abi",
            "unknown protocol \"arm-abi\": x86_64-abi and x86_32-abi are served",
        ),
        ("event-channel", "nine", "not a number"),
    ];
    for (key, value, reason) in cases {
        let mut store = MemStore::new();
        toolstack(&mut store);
        let mut backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
        store.set(&format!("{FE}/ring-ref"), "8");
        store.set(&format!("{FE}/event-channel"), "9");
        store.set(&format!("{FE}/{key}"), value);
        store.set(&format!("{FE}/state"), "3");
        let mut hooks = RecordingHooks::default();
        let Ok(StepOutcome::Failed(message)) = backend.step(&mut store, &mut hooks) else {
            panic!("{key}={value} accepted")
        };
        assert!(message.contains(reason), "{message}");
        assert_eq!(store.get(&format!("{BE}/error")), Some(message.as_str()));
        assert_eq!(state(&store), "5");
        assert!(hooks.connects.is_empty());
    }
    // Missing ring refs of a multi-page ring.
    let mut store = MemStore::new();
    toolstack(&mut store);
    let mut backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
    store.set(&format!("{FE}/ring-page-order"), "2");
    store.set(&format!("{FE}/event-channel"), "9");
    for i in [0, 1, 3] {
        store.set(&format!("{FE}/ring-ref{i}"), "8");
    }
    store.set(&format!("{FE}/state"), "3");
    let outcome = backend
        .step(&mut store, &mut RecordingHooks::default())
        .unwrap();
    assert_eq!(
        outcome,
        StepOutcome::Failed(format!("{FE}/ring-ref2 missing"))
    );
    // A hook failure is reported the same way.
    let (mut store, mut backend) = probed_single_ring();
    store.set(&format!("{FE}/state"), "3");
    let mut hooks = RecordingHooks {
        refuse_connect: true,
        ..Default::default()
    };
    let outcome = backend.step(&mut store, &mut hooks).unwrap();
    assert_eq!(
        outcome,
        StepOutcome::Failed("connecting rings: grant map failed".into())
    );
}

/// A frontend whose connection the hooks refuse, their teardown answering `Busy`
/// `busy` times after the refusal.
fn refused_while_busy(busy: usize) -> (MemStore, BlkifBackend, RecordingHooks) {
    let (mut store, mut backend) = probed_single_ring();
    store.set(&format!("{FE}/state"), "3");
    let mut hooks = RecordingHooks {
        refuse_connect: true,
        busy_after_refusal: busy,
        ..Default::default()
    };
    let outcome = backend.step(&mut store, &mut hooks).unwrap();
    assert!(matches!(outcome, StepOutcome::Failed(_)), "{outcome:?}");
    // One before connecting, one after the refusal.
    assert_eq!(hooks.disconnects, 2);
    assert_eq!(backend.releasing(), busy > 0);
    (store, backend, hooks)
}

/// A refused connection whose teardown answers `Busy` is asked again at every step
/// (`Retry` meanwhile) until its hooks let go, whatever the frontend does; then nothing
/// more is asked of them, and the backend stays Closing with its reason.
#[test]
fn a_refused_connection_is_released_as_soon_as_its_hooks_let_go() {
    let (mut store, mut backend, mut hooks) = refused_while_busy(3);
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(hooks.disconnects, 4);
    assert!(backend.releasing());
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
    assert_eq!(hooks.disconnects, 5);
    assert!(!backend.releasing());
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
    assert_eq!(hooks.disconnects, 5, "released once");
    assert_eq!(state(&store), "5");
    assert_eq!(
        store.get(&format!("{BE}/error")),
        Some("connecting rings: grant map failed")
    );
    assert_eq!(hooks.connects.len(), 1, "no new attempt while Closing");
    // The frontend closes and comes back: a fresh attempt, which connects.
    hooks.refuse_connect = false;
    store.set(&format!("{FE}/state"), "6");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    reconnect(&mut store, &mut backend, &mut hooks);
}

/// A frontend that closes while its refused connection is still being released: the
/// backend says Closed only once the hooks let go.
#[test]
fn a_refused_connection_releases_before_the_backend_says_closed() {
    let (mut store, mut backend, mut hooks) = refused_while_busy(2);
    store.set(&format!("{FE}/state"), "6");
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(state(&store), "5");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert!(!backend.releasing());
}

#[test]
fn refused_connections_are_counted_across_reconnects() {
    let (mut store, mut backend) = probed_single_ring();
    let mut hooks = RecordingHooks::default();
    let mut refuse = |store: &mut MemStore, backend: &mut BlkifBackend, key: &str, value| {
        store.set(&format!("{FE}/{key}"), value);
        store.set(&format!("{FE}/state"), "3");
        let outcome = backend.step(store, &mut hooks).unwrap();
        assert!(matches!(outcome, StepOutcome::Failed(_)), "{outcome:?}");
        // The frontend gives up on that attempt and starts again.
        store.remove_tree(&format!("{FE}/{key}"));
        store.set(&format!("{FE}/state"), "6");
        backend.step(store, &mut hooks).unwrap();
        store.set(&format!("{FE}/state"), "1");
        backend.step(store, &mut hooks).unwrap();
        assert_eq!(state(store), "2");
    };
    assert_eq!(backend.refused_connections(), 0);
    refuse(&mut store, &mut backend, "ring-page-order", "30");
    refuse(&mut store, &mut backend, "multi-queue-num-queues", "1000");
    assert_eq!(backend.refused_connections(), 2);
    // A refusal of the hooks counts too.
    let mut refusing = RecordingHooks {
        refuse_connect: true,
        ..Default::default()
    };
    store.set(&format!("{FE}/state"), "3");
    let outcome = backend.step(&mut store, &mut refusing).unwrap();
    assert!(matches!(outcome, StepOutcome::Failed(_)));
    assert_eq!(backend.refused_connections(), 3);
    // A good connection after that leaves the count alone.
    store.set(&format!("{FE}/state"), "6");
    backend.step(&mut store, &mut hooks).unwrap();
    store.set(&format!("{FE}/state"), "1");
    backend.step(&mut store, &mut hooks).unwrap();
    store.set(&format!("{FE}/state"), "3");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
    assert_eq!(backend.refused_connections(), 3);
}

#[test]
fn toolstack_detach_closes_then_removes_the_backend_directory() {
    let (mut store, mut backend, mut hooks) = connected(true);
    // xl block-detach: online = 0 and our state = Closing; the frontend follows.
    store.set(&format!("{BE}/online"), "0");
    store.set(&format!("{BE}/state"), "5");
    store.set(&format!("{FE}/state"), "5");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closing))
    );
    assert!(
        store.get(&format!("{BE}/state")).is_some(),
        "not removed while open"
    );
    store.set(&format!("{FE}/state"), "6");
    hooks.busy_replies = 1;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert!(
        store.get(&format!("{BE}/online")).is_some(),
        "not removed while busy"
    );
    // Closed, and left for libxl to read for DETACH_GRACE_NS: it fails the detach if
    // the node it waits on is already gone when its watch fires.
    // Each step in the grace says when it ends: the control path steps it then.
    hooks.now = 1_000;
    let grace_end = Ok(StepOutcome::RetryAt(1_000 + DETACH_GRACE_NS));
    assert_eq!(backend.step(&mut store, &mut hooks), grace_end);
    assert_eq!(state(&store), "6");
    hooks.now += DETACH_GRACE_NS - 1;
    assert_eq!(backend.step(&mut store, &mut hooks), grace_end);
    assert_eq!(state(&store), "6", "still readable within the grace");
    // A frontend starting over meanwhile does not bring a detached device back.
    store.set(&format!("{FE}/state"), "1");
    assert_eq!(backend.step(&mut store, &mut hooks), grace_end);
    assert_eq!(state(&store), "6");
    hooks.now += 1;
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
    assert!(store.get(&format!("{BE}/state")).is_none());
    assert!(
        store
            .directory(NO_TRANSACTION, "/local/domain/1/backend/vbd/5")
            .map_or(true, |children| children.is_empty()),
        "nothing left under the frontend's directory"
    );
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
}

#[test]
fn closed_device_still_online_stays_for_a_reconnect() {
    let (mut store, mut backend, mut hooks) = connected(true);
    store.set(&format!("{FE}/state"), "6");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
    assert_eq!(state(&store), "6");
}

#[test]
fn unreadable_frontend_state_means_the_frontend_is_gone() {
    let (mut store, mut backend, mut hooks) = connected(false);
    // The frontend's domain dies: its nodes turn unreadable before they disappear.
    store.unreadable.push(format!("{FE}/state"));
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(state(&store), "6");
    assert!(hooks.disconnects >= 1, "its rings were released");
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
}

#[test]
fn close_waits_for_in_flight_requests_then_reconnects() {
    let (mut store, mut backend, mut hooks) = connected(false);
    store.set(&format!("{FE}/state"), "5");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closing))
    );
    store.set(&format!("{FE}/state"), "6");
    hooks.busy_replies = 2;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(
        state(&store),
        "5",
        "not Closed while requests are in flight"
    );
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(state(&store), "6");
    // 6 -> 1 -> back to InitWait, then a fresh connection.
    reconnect(&mut store, &mut backend, &mut hooks);
    assert_eq!(hooks.connects.len(), 2);
}

/// A closed frontend comes back: Initialising (the backend says InitWait), then
/// Initialised (the backend connects).
fn reconnect(store: &mut MemStore, backend: &mut BlkifBackend, hooks: &mut impl ConnectionHooks) {
    store.set(&format!("{FE}/state"), "1");
    assert_eq!(
        backend.step(store, hooks),
        Ok(StepOutcome::Switched(XenbusState::InitWait))
    );
    store.set(&format!("{FE}/state"), "3");
    assert_eq!(
        backend.step(store, hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
}

/// Values written to the backend's `state` node since write number `from`.
fn states_written(store: &MemStore, from: usize) -> Vec<&str> {
    store.writes[from..]
        .iter()
        .filter(|(key, _)| *key == format!("{BE}/state"))
        .map(|(_, value)| value.as_str())
        .collect()
}

#[test]
fn close_while_busy_then_reinitialise_reconnects_and_never_shows_a_stale_connected() {
    let (mut store, mut backend, mut hooks) = connected(false);
    let written = store.writes.len();
    // Connected -> Closed with requests in flight: the rings drain...
    store.set(&format!("{FE}/state"), "6");
    hooks.busy_replies = 3;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(state(&store), "5", "not Connected while the rings go away");
    // ... and the frontend is back at once with a new ring (Initialising and Initialised
    // in one watch event).
    store.set(&format!("{FE}/ring-ref"), "18");
    store.set(&format!("{FE}/state"), "3");
    for _ in 0..2 {
        assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
        assert_eq!(state(&store), "5", "still draining: not Connected");
    }
    assert_eq!(
        hooks.connects.len(),
        1,
        "no new rings before the old ones are gone"
    );
    // Drained: Closed, then the new rings, then Connected.
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
    assert_eq!(hooks.connects.len(), 2);
    assert_eq!(hooks.connects[1].queues[0].ring_refs, [18]);
    assert_eq!(states_written(&store, written), ["5", "6", "4"]);
    assert_eq!(backend.state(), XenbusState::Connected);
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
    assert_eq!(hooks.connects.len(), 2);
}

#[test]
fn close_while_busy_then_initialising_waits_for_the_drain_then_inits() {
    let (mut store, mut backend, mut hooks) = connected(false);
    store.set(&format!("{FE}/state"), "6");
    hooks.busy_replies = 2;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    store.set(&format!("{FE}/state"), "1");
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(state(&store), "5");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::InitWait))
    );
    assert_eq!(state(&store), "2");
    // The frontend that went away entirely is closed the same way.
    store.set(&format!("{FE}/state"), "3");
    backend.step(&mut store, &mut hooks).unwrap();
    assert_eq!(state(&store), "4");
    store.unreadable.push(format!("{FE}/state"));
    hooks.busy_replies = 1;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(state(&store), "5");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(state(&store), "6");
}

#[test]
fn a_frontend_back_at_initialising_while_connected_is_closed_and_waited_for() {
    // hostile's state flapping: the frontend writes Closed and then Initialising, and
    // one step reads only the Initialising.
    let (mut store, mut backend, mut hooks) = connected(false);
    assert_eq!(state(&store), "4");
    let written = store.writes.len();
    store.set(&format!("{FE}/state"), "1");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::InitWait))
    );
    assert_eq!(states_written(&store, written), ["6", "2"]);
    assert!(hooks.disconnects >= 1, "the abandoned rings were released");
    // Its new ring connects.
    store.set(&format!("{FE}/ring-ref"), "19");
    store.set(&format!("{FE}/state"), "3");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
    assert_eq!(hooks.connects.len(), 2);
    assert_eq!(hooks.connects[1].queues[0].ring_refs, [19]);
    // With requests still in flight it says Closing until they drain, then InitWait.
    store.set(&format!("{FE}/state"), "1");
    hooks.busy_replies = 1;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(state(&store), "5");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::InitWait))
    );
}

#[test]
fn detached_device_is_not_reconnected_after_a_busy_close() {
    let (mut store, mut backend, mut hooks) = connected(true);
    store.set(&format!("{FE}/state"), "6");
    hooks.busy_replies = 1;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    store.set(&format!("{BE}/online"), "0");
    store.set(&format!("{FE}/state"), "3");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::RetryAt(DETACH_GRACE_NS))
    );
    hooks.now += DETACH_GRACE_NS;
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
    assert_eq!(hooks.connects.len(), 1);
}

/// The control path's rounds (`kernel/src/backend/control.rs`) over the device, from a
/// watch event at `hooks.now` until it is removed: a round steps the device when a watch
/// event names it or the `RetrySchedule` says it is due, sets its due time from the
/// answer, and the control path sleeps until the next due time or the next of
/// `watch_events` (times, each running `event` first). Returns the steps and when the
/// device was removed.
fn control_rounds_until_removed(
    store: &mut MemStore,
    backend: &mut BlkifBackend,
    hooks: &mut RecordingHooks,
    watch_events: &[u64],
    event: impl Fn(&mut MemStore),
) -> (usize, u64) {
    let mut schedule = RetrySchedule::new();
    let mut events = watch_events.iter().copied().peekable();
    let mut steps = 0;
    let mut woken_by_event = true;
    loop {
        if woken_by_event || schedule.due(hooks.now).any(|path| path == BE) {
            steps += 1;
            assert!(steps < 100_000, "the device is never removed");
            let outcome = backend.step(store, hooks).unwrap();
            if outcome == StepOutcome::Removed {
                schedule.set(BE, None);
                assert!(schedule.is_empty());
                return (steps, hooks.now);
            }
            schedule.set(BE, outcome.retry_due(hooks.now));
        }
        let due = schedule.next_in(hooks.now).map(|wait| hooks.now + wait);
        let next_event = events.peek().copied();
        let wake = earliest(due, next_event).expect("the device is never stepped again");
        woken_by_event = next_event == Some(wake);
        if woken_by_event {
            events.next();
            event(store);
        }
        hooks.now = wake;
    }
}

/// A detached device (closed, `online` = 0) about to wait out its grace from `hooks.now`.
fn detaching() -> (MemStore, BlkifBackend, RecordingHooks) {
    let hooks = RecordingHooks {
        now: 7_000_000_000,
        ..Default::default()
    };
    let (mut store, backend, hooks) = connected_with(true, hooks);
    store.set(&format!("{BE}/online"), "0");
    store.set(&format!("{FE}/state"), "6");
    (store, backend, hooks)
}

#[test]
fn detach_grace_is_stepped_once_at_its_end_not_every_retry() {
    let (mut store, mut backend, mut hooks) = detaching();
    let start = hooks.now;
    let (steps, removed_at) =
        control_rounds_until_removed(&mut store, &mut backend, &mut hooks, &[], |_| {});
    // At 5 ms a step, the grace would cost 600 steps of two xenstore reads each.
    assert!(steps <= 3, "{steps} steps during the grace");
    assert_eq!(
        removed_at,
        start + DETACH_GRACE_NS,
        "removed at the grace's end"
    );
    // Watch events within the grace (a frontend starting over) are each one step more,
    // change nothing, and do not move the grace's end.
    let (mut store, mut backend, mut hooks) = detaching();
    let start = hooks.now;
    let events = [
        start + 1_000_000,
        start + 1_000_000_000,
        start + 2_999_000_000,
    ];
    let (steps, removed_at) =
        control_rounds_until_removed(&mut store, &mut backend, &mut hooks, &events, |store| {
            store.set(&format!("{FE}/state"), "1")
        });
    assert!(steps <= 3 + events.len(), "{steps} steps during the grace");
    assert_eq!(removed_at, start + DETACH_GRACE_NS);
    assert_eq!(hooks.connects.len(), 1, "not reconnected");
}

#[test]
fn retry_keeps_its_cadence_and_the_schedule_says_what_is_due() {
    let (mut store, mut backend, mut hooks) = connected(false);
    store.set(&format!("{FE}/state"), "6");
    hooks.busy_replies = 1;
    hooks.now = 1_000;
    let outcome = backend.step(&mut store, &mut hooks).unwrap();
    assert_eq!(outcome, StepOutcome::Retry);
    let mut schedule = RetrySchedule::new();
    schedule.set(BE, outcome.retry_due(hooks.now));
    assert_eq!(schedule.next_in(hooks.now), Some(RETRY_NS));
    assert_eq!(schedule.due(1_000 + RETRY_NS - 1).count(), 0);
    assert_eq!(schedule.due(1_000 + RETRY_NS).collect::<Vec<_>>(), [BE]);
    assert_eq!(
        schedule.next_in(1_000 + 2 * RETRY_NS),
        Some(0),
        "overdue: now"
    );
    // Another device's later deadline does not delay this one; gone, it is not due.
    schedule.set("other", StepOutcome::RetryAt(9_000_000_000).retry_due(0));
    assert_eq!(schedule.next_in(1_000), Some(RETRY_NS));
    schedule.set(BE, StepOutcome::Idle.retry_due(hooks.now));
    assert_eq!(schedule.next_in(0), Some(9_000_000_000));
    assert_eq!(earliest(Some(2), None), Some(2));
    assert_eq!(earliest(Some(2), Some(1)), Some(1));
    assert_eq!(earliest(None, None), None);
}

#[test]
fn backend_directory_removal_tears_down_once_idle() {
    let (mut store, mut backend, mut hooks) = connected(false);
    store.remove_tree(BE);
    hooks.busy_replies = 1;
    assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
    assert_eq!(backend.state(), XenbusState::Closed);
    let disconnects = hooks.disconnects;
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
    assert_eq!(hooks.disconnects, disconnects, "teardown happens once");
    assert!(
        store.get(&format!("{BE}/state")).is_none(),
        "nothing re-created after removal"
    );
}

pub(super) type TestEngine =
    Engine<RingView, XenGrants, ShufflingDevice<RamDiskQueue>, CountingEvents>;

/// The kernel's job, done with the fake Xen: map ring pages, start one engine per queue,
/// and on disconnect drain, stop and unmap.
pub(super) struct EngineHooks {
    pub(super) table: std::sync::Arc<GrantTable>,
    pub(super) disk: RamDisk,
    pub(super) engines: Vec<(TestEngine, Vec<MappedGrant>)>,
    pub(super) hold_device: bool,
}

/// Why `EngineHooks` could not connect.
#[derive(Debug)]
pub(super) enum EngineHooksError {
    /// A ring page the fake grant table would not map (its status).
    RingMap(RawGrantStatus),
    Ring(crate::engine::EngineError),
}

impl core::fmt::Display for EngineHooksError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineHooksError::RingMap(status) => write!(f, "ring map {status}"),
            EngineHooksError::Ring(e) => write!(f, "{e:?}"),
        }
    }
}

impl core::error::Error for EngineHooksError {}

impl Errno for EngineHooksError {
    fn errno(&self) -> i32 {
        errno::EINVAL
    }
}

impl ConnectionHooks for EngineHooks {
    type Error = EngineHooksError;

    fn connect(&mut self, connection: &FrontendConnection) -> Result<(), EngineHooksError> {
        for queue in &connection.queues {
            let mut grants = XenGrants(self.table.clone());
            let requests: Vec<MapRequest> = queue
                .ring_refs
                .iter()
                .map(|&gref| MapRequest {
                    gref,
                    writable: true,
                })
                .collect();
            let mut results = vec![Err(0); requests.len()];
            grants.map(&requests, &mut results);
            let mapped: Vec<MappedGrant> = results
                .into_iter()
                .collect::<Result<_, _>>()
                .map_err(EngineHooksError::RingMap)?;
            let pages = mapped
                .iter()
                .map(|g| self.table.page_of_mapping(g).unwrap())
                .collect();
            let device = ShufflingDevice::new(self.disk.queue(64), 9, 100);
            device.hold.store(self.hold_device, Ordering::SeqCst);
            let config = EngineConfig {
                read_only: connection.read_only,
                discard: connection.discard,
                max_indirect_segments: connection.max_indirect_segments,
                protocol: connection.protocol,
                attach_at: queue.attach_at,
                ..EngineConfig::new(connection.ring_order, connection.persistent_grants)
            };
            let view = RingView::new(self.table.memory().clone(), pages);
            let engine = match Engine::new(view, grants, device, CountingEvents::default(), config)
            {
                Ok(engine) => engine,
                Err(error) => {
                    // As the kernel's hooks: a ring whose engine did not start is unmapped.
                    let mut results = vec![Ok(()); mapped.len()];
                    XenGrants(self.table.clone()).unmap(&mapped, &mut results);
                    return Err(EngineHooksError::Ring(error));
                }
            };
            self.engines.push((engine, mapped));
        }
        Ok(())
    }

    fn disconnect(&mut self) -> Result<(), Busy> {
        for (engine, _) in &mut self.engines {
            engine.disconnect()?;
        }
        for (engine, ring) in self.engines.drain(..) {
            let (_, mut grants, _, _) = engine.into_parts();
            let mut results = vec![Ok(()); ring.len()];
            grants.unmap(&ring, &mut results);
            assert!(results.iter().all(Result::is_ok));
        }
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        0
    }
}

/// `EngineHooks` as the kernel's hooks behave when `asynchronous`: a disconnect only
/// asks the pollers to let go of their rings and answers `Busy`; a later one finds them
/// released.
struct Detaching {
    inner: EngineHooks,
    asynchronous: bool,
    asked: bool,
}

impl ConnectionHooks for Detaching {
    type Error = EngineHooksError;

    fn connect(&mut self, connection: &FrontendConnection) -> Result<(), EngineHooksError> {
        self.inner.connect(connection)
    }

    fn disconnect(&mut self) -> Result<(), Busy> {
        if self.asynchronous && !self.asked && !self.inner.engines.is_empty() {
            self.asked = true;
            return Err(Busy {
                in_flight: self.inner.engines.len(),
            });
        }
        self.inner.disconnect()?;
        self.asked = false;
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
}

/// A two-queue frontend whose second ring does not map: the first ring, connected just
/// before, is torn down too (at once, or at the next step when the hooks let go
/// asynchronously, before the frontend closes), nothing of the frontend stays mapped, and
/// it connects once it grants its second ring.
#[test]
fn a_connection_failing_on_its_second_queue_unmaps_the_first() {
    for asynchronous in [false, true] {
        let memory = GuestMemory::new(16);
        let table = GrantTable::new(memory);
        let mut store = MemStore::new();
        toolstack(&mut store);
        let mut backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
        frontend_two_queues(&mut store);
        // Queue 0's ring (100, 101) is granted, queue 1's (110, 111) is not.
        table.grant(100, 0, false);
        table.grant(101, 1, false);
        let mut hooks = Detaching {
            inner: EngineHooks {
                table: table.clone(),
                disk: RamDisk::new(4096),
                engines: Vec::new(),
                hold_device: false,
            },
            asynchronous,
            asked: false,
        };
        store.set(&format!("{FE}/state"), "3");
        let outcome = backend.step(&mut store, &mut hooks).unwrap();
        assert!(
            matches!(&outcome, StepOutcome::Failed(reason) if reason.contains("ring map")),
            "{outcome:?}"
        );
        assert_eq!(backend.state(), XenbusState::Closing);
        let left = if asynchronous { 2 } else { 0 };
        assert_eq!(table.live_mappings().0, left, "queue 0's ring pages");
        assert_eq!(backend.releasing(), asynchronous);
        // The control path steps a releasing backend again soon: the hooks have let go
        // by then, and queue 0's ring goes while the frontend still says Initialised.
        assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
        assert!(!backend.releasing());
        assert_eq!(table.live_mappings().0, 0, "asynchronous {asynchronous}");
        assert!(hooks.inner.engines.is_empty());
        assert_eq!(backend.state(), XenbusState::Closing);
        // The frontend sees Closing and closes: whatever was left goes.
        store.set(&format!("{FE}/state"), "6");
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::Closed))
        );
        assert_eq!(table.live_mappings().0, 0, "asynchronous {asynchronous}");
        assert!(hooks.inner.engines.is_empty());
        // Granted, the same rings connect.
        table.grant(110, 2, false);
        table.grant(111, 3, false);
        reconnect(&mut store, &mut backend, &mut hooks);
        assert_eq!(hooks.inner.engines.len(), 2);
        assert_eq!(table.live_mappings().0, 4);
    }
}

#[test]
fn end_to_end_connect_io_close_with_in_flight_and_reconnect() {
    let memory = GuestMemory::new(64);
    let table = GrantTable::new(memory.clone());
    let mut store = MemStore::new();
    toolstack(&mut store);
    let mut backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
    let mut hooks = EngineHooks {
        table: table.clone(),
        disk: RamDisk::new(4096),
        engines: Vec::new(),
        hold_device: true,
    };

    for round in 0..2u32 {
        // The frontend grants a two-page ring and one data page, then says Initialised.
        let gref_base = 1000 * (round + 1);
        for i in 0..2 {
            table.grant(gref_base + i, i as usize, false);
            store.set(&format!("{FE}/ring-ref{i}"), &(gref_base + i).to_string());
        }
        store.set(&format!("{FE}/ring-page-order"), "1");
        store.set(&format!("{FE}/event-channel"), "7");
        store.set(&format!("{FE}/feature-persistent"), "1");
        table.grant(gref_base + 10, 10, false);
        let mut front = FrontRing::new(RingView::new(memory.clone(), vec![0, 1]), 1);
        store.set(&format!("{FE}/state"), "3");
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::Connected))
        );

        front.put_request(&encode_direct(
            abi::OP_WRITE,
            42,
            8,
            &[whole_page(gref_base + 10)],
        ));
        front.push_requests();
        let engine = &mut hooks.engines[0].0;
        engine.poll(8);
        assert_eq!(engine.in_flight(), 1);

        // The frontend closes with the write still in flight: the backend waits.
        store.set(&format!("{FE}/state"), "6");
        assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Retry));
        assert!(!table.end_access(gref_base), "ring still mapped");
        hooks.engines[0]
            .0
            .device()
            .hold
            .store(false, Ordering::SeqCst);
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::Closed))
        );
        let mut responses = Vec::new();
        front.take_responses(|r| responses.push(r));
        assert_eq!(responses.len(), 1);
        assert_eq!((responses[0].id, responses[0].status), (42, RSP_OKAY));
        assert_eq!(table.live_mappings().0, 0, "rings and data pages unmapped");
        for gref in [gref_base, gref_base + 1, gref_base + 10] {
            assert!(table.end_access(gref));
        }
        store.set(&format!("{FE}/state"), "1");
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::InitWait))
        );
    }
}

/// A backend whose toolstack also wrote `backend_keys` (in its directory), connected through engines to a
/// frontend on a one-page ring (grant 500, page 0) with data pages granted as 510
/// (page 10, writable by the backend); the device's requests complete at once.
pub(super) struct ConnectedEngine {
    pub(super) store: MemStore,
    pub(super) backend: BlkifBackend,
    pub(super) hooks: EngineHooks,
    pub(super) front: FrontRing,
}

impl ConnectedEngine {
    pub(super) fn new(backend_keys: &[(&str, &str)]) -> Self {
        Self::with(|store| {
            for (key, value) in backend_keys {
                store.set(&format!("{BE}/{key}"), value);
            }
        })
    }

    /// As `new`, with the toolstack's keys written by `toolstack_keys`.
    fn with(toolstack_keys: impl FnOnce(&mut MemStore)) -> Self {
        let memory = GuestMemory::new(16);
        let table = GrantTable::new(memory.clone());
        let mut store = MemStore::new();
        toolstack(&mut store);
        toolstack_keys(&mut store);
        let mut backend = BlkifBackend::probe(&mut store, BE, params()).unwrap();
        let mut hooks = EngineHooks {
            table: table.clone(),
            disk: RamDisk::new(4096),
            engines: Vec::new(),
            hold_device: false,
        };
        table.grant(500, 0, false);
        table.grant(510, 10, false);
        store.set(&format!("{FE}/ring-ref"), "500");
        store.set(&format!("{FE}/event-channel"), "7");
        let front = FrontRing::new(RingView::new(memory, vec![0]), 0);
        store.set(&format!("{FE}/state"), "4");
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::Connected))
        );
        Self {
            store,
            backend,
            hooks,
            front,
        }
    }

    fn key(&self, key: &str) -> Option<&str> {
        self.store.get(&format!("{BE}/{key}"))
    }

    /// Sends one request and returns its response's (id, status).
    pub(super) fn answer(&mut self, raw: &[u8; abi::REQUEST_SIZE]) -> (u64, i16) {
        self.front.put_request(raw);
        self.front.push_requests();
        let engine = &mut self.hooks.engines[0].0;
        for _ in 0..100 {
            engine.poll(8);
            if engine.in_flight() == 0 {
                break;
            }
        }
        let mut responses = Vec::new();
        self.front
            .take_responses(|r| responses.push((r.id, r.status)));
        assert_eq!(responses.len(), 1, "one response per request");
        responses[0]
    }
}

#[test]
fn discard_enable_0_offers_no_discard_and_refuses_one_sent_anyway() {
    let mut rig = ConnectedEngine::new(&[("discard-enable", "0")]);
    assert_eq!(rig.key("feature-discard"), Some("0"));
    for key in ["discard-granularity", "discard-alignment", "discard-secure"] {
        assert_eq!(rig.key(key), None, "{key}");
    }
    assert!(!rig.hooks.engines.is_empty());
    let discard = encode_discard(3, 0, 8, false);
    assert_eq!(rig.answer(&discard), (3, RSP_EOPNOTSUPP));
    // Reads and writes still work.
    let write = encode_direct(abi::OP_WRITE, 4, 0, &[whole_page(510)]);
    assert_eq!(rig.answer(&write), (4, RSP_OKAY));
}

#[test]
fn discard_enable_1_or_absent_offers_the_devices_discard() {
    for keys in [&[("discard-enable", "1")][..], &[]] {
        let mut rig = ConnectedEngine::new(keys);
        assert_eq!(rig.key("feature-discard"), Some("1"), "{keys:?}");
        assert_eq!(rig.key("discard-granularity"), Some("512"), "{keys:?}");
        let discard = encode_discard(3, 0, 8, false);
        assert_eq!(rig.answer(&discard), (3, RSP_OKAY), "{keys:?}");
    }
}

#[test]
fn device_type_cdrom_is_a_read_only_cdrom_whatever_the_mode() {
    // xl's devtype=cdrom writes device-type in the backend directory (and the
    // frontend's, which Linux reads): either says so.
    for (dir, path) in [("backend", BE), ("frontend", FE)] {
        let mut rig = ConnectedEngine::with(|store| {
            store.set(&format!("{BE}/mode"), "w");
            store.set(&format!("{path}/device-type"), "cdrom");
        });
        assert_eq!(
            rig.key("info"),
            Some("5"),
            "VDISK_CDROM | VDISK_READONLY ({dir})"
        );
        assert_eq!(rig.key("feature-discard"), Some("0"), "{dir}");
        let write = encode_direct(abi::OP_WRITE, 1, 0, &[whole_page(510)]);
        assert_eq!(rig.answer(&write), (1, RSP_ERROR), "writes refused ({dir})");
        let read = encode_direct(abi::OP_READ, 2, 0, &[whole_page(510)]);
        assert_eq!(rig.answer(&read), (2, RSP_OKAY), "reads served ({dir})");
    }
    let mut disk = ConnectedEngine::new(&[("device-type", "disk")]);
    assert_eq!(disk.key("info"), Some("0"));
    let write = encode_direct(abi::OP_WRITE, 1, 0, &[whole_page(510)]);
    assert_eq!(disk.answer(&write), (1, RSP_OKAY));
}

#[test]
fn mode_with_a_w_is_writable_anything_else_read_only() {
    // "w!" is xl's writable disk shared by force; an unknown mode fails closed, as in
    // Linux (writable only if the mode has a 'w').
    for (mode, info, write_status) in [
        ("w", "0", RSP_OKAY),
        ("w!", "0", RSP_OKAY),
        ("r", "4", RSP_ERROR),
        ("x", "4", RSP_ERROR),
    ] {
        let mut rig = ConnectedEngine::new(&[("mode", mode)]);
        assert_eq!(rig.key("info"), Some(info), "mode {mode}");
        let write = encode_direct(abi::OP_WRITE, 1, 0, &[whole_page(510)]);
        assert_eq!(rig.answer(&write), (1, write_status), "mode {mode}");
        let read = encode_direct(abi::OP_READ, 2, 0, &[whole_page(510)]);
        assert_eq!(rig.answer(&read), (2, RSP_OKAY), "mode {mode}");
    }
}

/// Where Linux's `xenbus_dev_fatal` leaves the error of the device at `BE`.
const LINUX_ERROR: &str = "/local/domain/1/error/backend/vbd/5/51712/error";

#[test]
fn failures_are_also_written_where_linux_writes_them_with_an_errno() {
    // A bad frontend key: EINVAL.
    let (mut store, mut backend) = probed_single_ring();
    store.set(&format!("{FE}/ring-page-order"), "5");
    store.set(&format!("{FE}/state"), "3");
    let outcome = backend.step(&mut store, &mut RecordingHooks::default());
    assert_eq!(
        outcome,
        Ok(StepOutcome::Failed("ring-page-order 5 > max 4".into()))
    );
    assert_eq!(store.get(LINUX_ERROR), Some("22 ring-page-order 5 > max 4"));
    // The hooks' error brings its own errno.
    let (mut store, mut backend) = probed_single_ring();
    store.set(&format!("{FE}/state"), "3");
    let mut hooks = RecordingHooks {
        refuse_connect: true,
        ..Default::default()
    };
    backend.step(&mut store, &mut hooks).unwrap();
    assert_eq!(
        store.get(LINUX_ERROR),
        Some("5 connecting rings: grant map failed")
    );
}

#[test]
fn the_linux_error_node_goes_with_the_device() {
    // The toolstack removes the backend directory.
    let (mut store, mut backend) = probed_single_ring();
    store.set(&format!("{FE}/ring-page-order"), "5");
    store.set(&format!("{FE}/state"), "3");
    let mut hooks = RecordingHooks::default();
    backend.step(&mut store, &mut hooks).unwrap();
    assert!(store.get(LINUX_ERROR).is_some());
    store.remove_tree(BE);
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
    assert_eq!(store.get(LINUX_ERROR), None);
    // The toolstack detaches it and blkdom removes its own directory.
    let (mut store, mut backend) = probed_single_ring();
    store.set(&format!("{FE}/ring-page-order"), "5");
    store.set(&format!("{FE}/state"), "3");
    backend.step(&mut store, &mut hooks).unwrap();
    assert!(store.get(LINUX_ERROR).is_some());
    store.set(&format!("{BE}/online"), "0");
    store.set(&format!("{FE}/state"), "6");
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::RetryAt(hooks.now + DETACH_GRACE_NS))
    );
    hooks.now += DETACH_GRACE_NS;
    assert_eq!(
        backend.step(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
    assert_eq!(store.get(LINUX_ERROR), None);
    assert_eq!(store.get(&format!("{BE}/state")), None);
}

/// Rings a poller holds a moment after their connection: the first disconnect after
/// each connect answers `Busy` (the kernel's detach is handed to the poller).
#[derive(Default)]
struct PollerHeld {
    held: bool,
    now: u64,
}

impl ConnectionHooks for PollerHeld {
    type Error = GrantMapFailed;

    fn connect(&mut self, _: &FrontendConnection) -> Result<(), GrantMapFailed> {
        self.held = true;
        Ok(())
    }
    fn disconnect(&mut self) -> Result<(), Busy> {
        if core::mem::take(&mut self.held) {
            return Err(Busy { in_flight: 0 });
        }
        Ok(())
    }
    fn now_ns(&self) -> u64 {
        self.now
    }
}

/// How long one round of the control path's xenstore requests takes in the replay.
const ROUND_NS: u64 = 1_000_000;
/// How long the control path sleeps with nothing due (its statistics period).
const IDLE_NS: u64 = 5_000_000_000;

/// Replays the control path's loop (`kernel/src/backend/control.rs` with
/// `poller::run`) over one device while the frontend writes `writes` (time, state) to
/// its `state`: a round drains the watch events, steps the devices
/// `RetrySchedule::round` names, then spends `ROUND_NS` on xenstore requests. An event
/// that comes while a round runs is read off the ring with a reply and queued in the
/// client, its kick consumed by the wait for that reply; one that comes while the
/// control path sleeps kicks it awake. Returns, for each write, when its device was
/// next stepped (`None`: not before `until`).
fn replay_control_loop(
    store: &mut MemStore,
    backend: &mut BlkifBackend,
    hooks: &mut PollerHeld,
    writes: &[(u64, &str)],
    until: u64,
) -> Vec<Option<u64>> {
    let mut schedule = RetrySchedule::new();
    let mut stepped_at = vec![None; writes.len()];
    let mut events = 0; // events queued (in the ring or the client) since the last drain
    let mut next = 0;
    let mut wake = writes[0].0;
    let apply = |store: &mut MemStore, next: &mut usize, events: &mut usize, to: u64| {
        while *next < writes.len() && writes[*next].0 <= to {
            store.set(&format!("{FE}/state"), writes[*next].1);
            *next += 1;
            *events += 1;
        }
    };
    while wake <= until {
        hooks.now = wake;
        apply(store, &mut next, &mut events, wake);
        let named = (core::mem::take(&mut events) > 0).then_some(BE);
        let round: Vec<String> = schedule
            .round(named, wake)
            .into_iter()
            .map(String::from)
            .collect();
        for path in round {
            assert_eq!(path, BE);
            let outcome = backend.step(store, hooks).unwrap();
            for at in stepped_at[..next].iter_mut().filter(|at| at.is_none()) {
                *at = Some(wake);
            }
            schedule.stepped(BE, outcome.retry_due(wake), wake);
        }
        let end = wake + ROUND_NS;
        apply(store, &mut next, &mut events, end);
        let due = end + schedule.next_wait(end, events > 0, IDLE_NS);
        let kick = writes.get(next).map(|&(at, _)| at);
        wake = earliest(Some(due), kick).unwrap();
    }
    stepped_at
}

#[test]
fn state_flapping_under_the_control_loop_steps_every_event_promptly_and_settles() {
    // hostile's state-flapping attack (tools/hostile/src/main.rs): valid keys, then
    // 110 frontend states written back to back (100 us apart, ten writes to a round),
    // ending at Initialising; then its reset: Closed, and Initialising once the
    // backend says Closed.
    let (mut store, mut backend) = probed_single_ring();
    let mut hooks = PollerHeld::default();
    let flaps = ["3", "6", "1", "3", "5", "6", "1", "3", "4", "6", "1"];
    let start = 1_000_000_000;
    let mut writes: Vec<(u64, &str)> = (0..10)
        .flat_map(|_| flaps)
        .enumerate()
        .map(|(i, state)| (start + 100_000 * i as u64, state))
        .collect();
    let flapped = writes.last().unwrap().0;
    writes.push((flapped + 20_000_000, "6"));
    let reset = flapped + 60_000_000;
    writes.push((reset, "1"));
    let stepped_at = replay_control_loop(&mut store, &mut backend, &mut hooks, &writes, reset - 1);
    assert_eq!(
        state(&store),
        "6",
        "the backend followed the frontend to Closed"
    );
    let stepped_at_end = replay_control_loop(
        &mut store,
        &mut backend,
        &mut hooks,
        &writes[111..],
        reset + 50_000_000,
    );
    assert_eq!(
        state(&store),
        "2",
        "InitWait after the frontend's Initialising"
    );
    for ((at, state), stepped) in writes
        .iter()
        .zip(stepped_at[..111].iter().chain(&stepped_at_end))
    {
        let stepped = stepped.unwrap_or_else(|| panic!("state {state} at {at}: never stepped"));
        assert!(
            stepped - at <= 2 * ROUND_NS,
            "state {state} written at {at} stepped {} us later",
            (stepped - at) / 1000
        );
    }
}

#[test]
fn shutting_down_says_closing_while_requests_drain_then_closed_and_never_reconnects() {
    let (mut store, mut backend, mut hooks) = connected(false);
    let written = store.writes.len();
    hooks.busy_replies = 2;
    assert_eq!(
        backend.shut_down(&mut store, &mut hooks),
        Ok(StepOutcome::Retry)
    );
    assert_eq!(state(&store), "5", "Closing while requests drain");
    assert_eq!(
        backend.shut_down(&mut store, &mut hooks),
        Ok(StepOutcome::Retry)
    );
    assert_eq!(
        backend.shut_down(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(states_written(&store, written), ["5", "6"]);
    // The frontend still says Connected (or closes, or starts over): nothing connects.
    for frontend in ["4", "6", "1", "3"] {
        store.set(&format!("{FE}/state"), frontend);
        assert_eq!(backend.step(&mut store, &mut hooks), Ok(StepOutcome::Idle));
    }
    assert_eq!(hooks.connects.len(), 1);
    assert_eq!(states_written(&store, written), ["5", "6"]);
}

#[test]
fn shutting_down_a_device_whose_frontend_never_connected_says_closing_then_closed() {
    let (mut store, mut backend) = probed_single_ring();
    let mut hooks = RecordingHooks::default();
    let written = store.writes.len();
    assert_eq!(
        backend.shut_down(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(states_written(&store, written), ["5", "6"]);
    // A device closed already writes nothing more.
    assert_eq!(
        backend.shut_down(&mut store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(states_written(&store, written), ["5", "6"]);
}

#[test]
fn shutting_down_a_device_the_toolstack_removed_meanwhile_writes_nothing() {
    let (mut store, mut backend, mut hooks) = connected(false);
    hooks.busy_replies = 1;
    assert_eq!(
        backend.shut_down(&mut store, &mut hooks),
        Ok(StepOutcome::Retry)
    );
    store.rm(NO_TRANSACTION, BE).unwrap();
    // An error node of an earlier refusal goes with the device, as `step` removes it.
    store.set(LINUX_ERROR, "5 an earlier refusal");
    let written = store.writes.len();
    assert_eq!(
        backend.shut_down(&mut store, &mut hooks),
        Ok(StepOutcome::Removed)
    );
    assert_eq!(store.writes.len(), written);
    assert!(store.get(&format!("{BE}/state")).is_none());
    assert!(store.get(LINUX_ERROR).is_none());
}

#[test]
fn a_shutdown_answers_the_requests_in_flight_takes_no_new_one_and_unmaps_everything() {
    let mut rig = ConnectedEngine::new(&[]);
    let table = rig.hooks.table.clone();
    table.grant(511, 11, false);
    let hold = |rig: &mut ConnectedEngine, on| {
        let engine = &mut rig.hooks.engines[0].0;
        engine.device().hold.store(on, Ordering::SeqCst);
    };
    hold(&mut rig, true);
    rig.front
        .put_request(&encode_direct(abi::OP_WRITE, 42, 8, &[whole_page(510)]));
    rig.front.push_requests();
    rig.hooks.engines[0].0.poll(8);
    assert_eq!(rig.hooks.engines[0].0.in_flight(), 1);

    let ConnectedEngine {
        store,
        backend,
        hooks,
        ..
    } = &mut rig;
    assert_eq!(backend.shut_down(store, hooks), Ok(StepOutcome::Retry));
    assert_eq!(state(store), "5");
    // Pushed after the shutdown began: not taken.
    rig.front
        .put_request(&encode_direct(abi::OP_WRITE, 43, 16, &[whole_page(511)]));
    rig.front.push_requests();
    assert_eq!(
        rig.backend.shut_down(&mut rig.store, &mut rig.hooks),
        Ok(StepOutcome::Retry)
    );
    hold(&mut rig, false);
    assert_eq!(
        rig.backend.shut_down(&mut rig.store, &mut rig.hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(state(&rig.store), "6");
    let mut responses = Vec::new();
    rig.front
        .take_responses(|r| responses.push((r.id, r.status)));
    assert_eq!(responses, [(42, RSP_OKAY)]);
    assert_eq!(table.live_mappings().0, 0, "ring and data pages unmapped");
}

/// A backend serving a disk of `geometry`, offering persistent grants or not, probed,
/// its frontend's one-page ring written (not yet its state).
fn probed_on(geometry: blkdev::Geometry, persistent: bool) -> (MemStore, BlkifBackend) {
    let mut store = MemStore::new();
    toolstack(&mut store);
    let params = BackendParams {
        persistent_grants: persistent,
        ..BackendParams::new(2, geometry)
    };
    let backend = BlkifBackend::probe(&mut store, BE, params).unwrap();
    store.set(&format!("{FE}/ring-ref"), "8");
    store.set(&format!("{FE}/event-channel"), "9");
    (store, backend)
}

/// 64 MiB of 4 KiB logical blocks (`sectors` still counts 512-byte units).
fn four_k_disk() -> blkdev::Geometry {
    blkdev::Geometry {
        logical_block_size: 4096,
        ..RamDisk::plain(131072)
    }
}

#[test]
fn a_large_sector_frontend_on_a_disk_of_4k_blocks_is_refused_with_the_reason() {
    for flag in ["1", "2"] {
        let (mut store, mut backend) = probed_on(four_k_disk(), true);
        store.set(&format!("{FE}/feature-large-sector-size"), flag);
        store.set(&format!("{FE}/state"), "3");
        let mut hooks = RecordingHooks::default();
        let Ok(StepOutcome::Failed(reason)) = backend.step(&mut store, &mut hooks) else {
            panic!("feature-large-sector-size={flag} on 4 KiB blocks was connected")
        };
        assert!(
            reason.starts_with("feature-large-sector-size: the frontend counts sectors in units of sector-size (4096 bytes)"),
            "{reason}"
        );
        // Never connected: no ring was mapped, no request can reach a wrong sector.
        assert!(hooks.connects.is_empty());
        assert_eq!(state(&store), "5");
        assert_eq!(store.get(&format!("{BE}/error")), Some(reason.as_str()));
        assert_eq!(
            store.get(LINUX_ERROR),
            Some(format!("{} {reason}", errno::EINVAL).as_str())
        );
        assert_eq!(backend.refused_connections(), 1);
    }
}

#[test]
fn frontends_counting_512_byte_sectors_connect_to_a_disk_of_4k_blocks() {
    // Linux's blkfront never writes the key (and blkif.h says none should): sectors
    // are 512-byte units, sector-size the logical block size it aligns requests to.
    for flag in [None, Some("0")] {
        let (mut store, mut backend) = probed_on(four_k_disk(), true);
        if let Some(flag) = flag {
            store.set(&format!("{FE}/feature-large-sector-size"), flag);
        }
        store.set(&format!("{FE}/state"), "3");
        let mut hooks = RecordingHooks::default();
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::Connected)),
            "{flag:?}"
        );
        assert_eq!(store.get(&format!("{BE}/sector-size")), Some("4096"));
        assert_eq!(store.get(&format!("{BE}/sectors")), Some("131072"));
    }
    // With 512-byte blocks both ways of counting agree: served.
    let (mut store, mut backend) = probed_on(RamDisk::plain(4096), true);
    store.set(&format!("{FE}/feature-large-sector-size"), "1");
    store.set(&format!("{FE}/state"), "3");
    assert_eq!(
        backend.step(&mut store, &mut RecordingHooks::default()),
        Ok(StepOutcome::Switched(XenbusState::Connected))
    );
}

/// How a blkfront decides on persistent grants from what it wrote and what the backend
/// wrote in `feature-persistent`.
#[derive(Clone, Copy, Debug)]
enum Blkfront {
    /// Linux before 5.10's `feature_persistent` parameter (and MiniOS-like frontends
    /// that always want them): writes 1, takes the backend's key as the result.
    Always,
    /// Linux 5.10 on, and since 2022 writing its parameter whatever it negotiated
    /// before: uses persistent grants when it offered them and the backend says 1.
    Offers(bool),
    /// A frontend that writes no key: never.
    Silent,
}

impl Blkfront {
    fn written(self) -> Option<&'static str> {
        match self {
            Blkfront::Always | Blkfront::Offers(true) => Some("1"),
            Blkfront::Offers(false) => Some("0"),
            Blkfront::Silent => None,
        }
    }

    fn uses(self, backend_key: &str) -> bool {
        match self {
            Blkfront::Always => backend_key == "1",
            Blkfront::Offers(offer) => offer && backend_key == "1",
            Blkfront::Silent => false,
        }
    }
}

#[test]
fn feature_persistent_says_the_backends_offer_and_both_blkfront_generations_agree() {
    let frontends = [
        Blkfront::Always,
        Blkfront::Offers(true),
        Blkfront::Offers(false),
        Blkfront::Silent,
    ];
    for offer in [true, false] {
        for frontend in frontends {
            let (mut store, mut backend) = probed_on(RamDisk::plain(4096), offer);
            if let Some(value) = frontend.written() {
                store.set(&format!("{FE}/feature-persistent"), value);
            }
            store.set(&format!("{FE}/state"), "3");
            let mut hooks = RecordingHooks::default();
            assert_eq!(
                backend.step(&mut store, &mut hooks),
                Ok(StepOutcome::Switched(XenbusState::Connected))
            );
            let published = store.get(&format!("{BE}/feature-persistent")).unwrap();
            // What blkdom offers, whatever the frontend wrote (Linux since 2022).
            assert_eq!(published, if offer { "1" } else { "0" }, "{frontend:?}");
            // Both ends decide the same: the backend caches mappings exactly when
            // the frontend keeps its grants.
            let backend_uses = hooks.connects[0].persistent_grants;
            assert_eq!(
                backend_uses,
                frontend.uses(published),
                "offer {offer}, {frontend:?}"
            );
            assert_eq!(
                backend_uses,
                offer && frontend.written() == Some("1"),
                "offer {offer}, {frontend:?}"
            );
        }
    }
}

#[test]
fn a_slices_discard_alignment_is_where_the_devices_granules_start_in_it() {
    // A device discarding in 4 KiB granules; a slice from sector 2053 (5 sectors into a
    // granule): the first whole granule starts 3 sectors into the slice. Linux's block
    // layer reads `discard-alignment` so (queue_limit_discard_alignment, as for a
    // partition), and so does blkfront's disk.
    let device = blkdev::Geometry {
        discard: Some(blkdev::DiscardGeometry {
            granularity: 4096,
            alignment: 0,
            secure: false,
        }),
        ..RamDisk::plain(1 << 20)
    };
    for (start, alignment) in [(2053u64, 1536u64), (2048, 0), (2055, 512)] {
        let slice = blkdev::Slice::new(RamDisk::with_geometry(device).queue(4), start, 16384)
            .unwrap_or_else(|_| panic!("slice at {start}"));
        let (mut store, mut backend) = probed_on(slice.geometry(), true);
        store.set(&format!("{FE}/state"), "3");
        assert_eq!(
            backend.step(&mut store, &mut RecordingHooks::default()),
            Ok(StepOutcome::Switched(XenbusState::Connected))
        );
        let published: u64 = store
            .get(&format!("{BE}/discard-alignment"))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(published, alignment, "slice at {start}");
        // A granule of the device starts there.
        assert_eq!((start * 512 + published) % 4096, 0, "slice at {start}");
        assert_eq!(
            store.get(&format!("{BE}/discard-granularity")),
            Some("4096")
        );
    }
}
