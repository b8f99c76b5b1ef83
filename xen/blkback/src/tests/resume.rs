// SPDX-License-Identifier: MIT OR Apache-2.0
//! A live upgrade's re-attach (docs/design.md §4.12): one image drains a connected vbd
//! without a word to xenstore, the next takes it over where the rings were left, from
//! the handover's records, and serves what the frontend pushed meanwhile; and every
//! check that refuses a take-over.

use super::negotiation::{params, state, ConnectedEngine, EngineHooks, BE, FE};
use super::{page_bytes, whole_page};
use crate::abi::{self, sring, Protocol, RSP_OKAY};
use crate::fake::wire::encode_direct;
use crate::fake::PlainRing;
use crate::negotiate::{BlkifBackend, FrontendConnection, StepOutcome, XenbusState};
use crate::ring::{BackRing, RingError, RingMemory};
use xen::xenbus::{XenStore, NO_TRANSACTION};

// ---- the ring ------------------------------------------------------------------------

/// A one-page ring whose frontend produced up to `req_prod` and whose backend published
/// `rsp_prod`.
fn ring_at(req_prod: u32, rsp_prod: u32) -> PlainRing {
    let ring = PlainRing::new(0);
    ring.store_u32(sring::REQ_PROD, req_prod);
    ring.store_u32(sring::RSP_PROD, rsp_prod);
    ring
}

#[test]
fn a_ring_is_reattached_where_it_was_left_across_the_index_wrap() {
    let slots = abi::ring_slots(0);
    for (req_prod, rsp_prod) in [
        (100, 100),
        (100 + slots, 100),
        (5, u32::MAX - 3),
        (u32::MAX, u32::MAX - slots),
    ] {
        let ring = BackRing::reattach(ring_at(req_prod, rsp_prod), 0, Protocol::X86_64, rsp_prod)
            .unwrap_or_else(|e| panic!("{req_prod}/{rsp_prod}: {e}"));
        assert_eq!(ring.req_cons(), rsp_prod);
        assert_eq!(ring.rsp_prod_pvt(), rsp_prod);
        assert_eq!(ring.rsp_prod(), rsp_prod);
        assert_eq!(ring.unconsumed(req_prod), req_prod.wrapping_sub(rsp_prod));
        assert!(!ring.prod_overflows(req_prod));
    }
}

#[test]
fn a_ring_more_than_full_or_not_where_it_was_left_is_refused() {
    let slots = abi::ring_slots(0);
    for protocol in [Protocol::X86_64, Protocol::X86_32] {
        let over = protocol.ring_slots(0) + 1;
        assert_eq!(
            BackRing::reattach(ring_at(7 + over, 7), 0, protocol, 7).err(),
            Some(RingError::Overflowed {
                req_prod: 7 + over,
                rsp_prod: 7
            })
        );
    }
    // Moved back behind rsp_prod reads as far ahead.
    assert!(matches!(
        BackRing::reattach(ring_at(6, 7), 0, Protocol::X86_64, 7),
        Err(RingError::Overflowed { .. })
    ));
    assert_eq!(
        BackRing::reattach(ring_at(7 + slots, 8), 0, Protocol::X86_64, 7).err(),
        Some(RingError::NotWhereLeft {
            shared: 8,
            handed_over: 7
        })
    );
    assert_eq!(
        BackRing::reattach(ring_at(0, 0), 5, Protocol::X86_64, 0).err(),
        Some(RingError::BadOrder(5))
    );
    assert!(matches!(
        BackRing::reattach(ring_at(0, 0), 1, Protocol::X86_64, 0),
        Err(RingError::TooSmall { .. })
    ));
}

// ---- the vbd -------------------------------------------------------------------------

/// What the old image hands over for the connected vbd of `rig` once it has drained:
/// the connection (each queue at the ring's published `rsp_prod`) and the keys it
/// published.
fn drain_for_upgrade(rig: &mut ConnectedEngine) -> (FrontendConnection, Vec<(String, String)>) {
    let writes = rig.store.writes.len();
    let mut connection = rig.backend.read_frontend(&mut rig.store).unwrap();
    let published = rig.backend.published_keys();
    // The drain: the rings stop, answer what they took, unmap everything.
    use crate::negotiate::ConnectionHooks;
    rig.hooks.disconnect().unwrap();
    assert_eq!(
        rig.hooks.table.live_mappings().0,
        0,
        "the old image unmapped all"
    );
    let rsp_prod = rig.hooks.table.memory().load_u32(0, sring::RSP_PROD);
    for queue in &mut connection.queues {
        queue.attach_at = Some(rsp_prod);
    }
    assert_eq!(rig.store.writes.len(), writes, "the drain writes nothing");
    assert_eq!(state(&rig.store), "4");
    (connection, published)
}

/// The new image's hooks: the same grant table and the same RAM disk (handed over).
fn new_image_hooks(rig: &ConnectedEngine) -> EngineHooks {
    EngineHooks {
        table: rig.hooks.table.clone(),
        disk: rig.hooks.disk.clone(),
        engines: Vec::new(),
        hold_device: false,
    }
}

/// The new image takes `rig`'s vbd over from the handover's records.
fn take_over(
    rig: &mut ConnectedEngine,
    connection: &FrontendConnection,
    published: &[(String, String)],
) -> (EngineHooks, BlkifBackend, StepOutcome) {
    let mut hooks = new_image_hooks(rig);
    let (backend, outcome) = BlkifBackend::resume(
        &mut rig.store,
        BE,
        params(),
        connection,
        published,
        &mut hooks,
    )
    .unwrap();
    (hooks, backend, outcome)
}

#[test]
fn the_next_image_serves_from_where_the_last_stopped_and_writes_nothing() {
    let mut rig = ConnectedEngine::new(&[]);
    let table = rig.hooks.table.clone();
    let memory = table.memory().clone();
    table.grant(511, 11, false);
    memory.fill(10, 0x5a);
    assert_eq!(
        rig.answer(&encode_direct(abi::OP_WRITE, 1, 8, &[whole_page(510)])),
        (1, RSP_OKAY)
    );
    let (connection, published) = drain_for_upgrade(&mut rig);
    assert_eq!(connection.queues[0].attach_at, Some(1));

    // While no image serves, the frontend goes on: a write and a read of it.
    memory.fill(10, 0xc3);
    rig.front
        .put_request(&encode_direct(abi::OP_WRITE, 2, 16, &[whole_page(510)]));
    rig.front
        .put_request(&encode_direct(abi::OP_READ, 3, 16, &[whole_page(511)]));
    rig.front.push_requests();

    let writes = rig.store.writes.len();
    let (mut hooks, mut backend, outcome) = take_over(&mut rig, &connection, &published);
    assert_eq!(outcome, StepOutcome::Switched(XenbusState::Connected));
    assert_eq!(backend.state(), XenbusState::Connected);
    assert_eq!(
        rig.store.writes.len(),
        writes,
        "nothing written to xenstore"
    );
    let engine = &mut hooks.engines[0].0;
    assert_eq!(
        engine.stats().notifications,
        1,
        "the frontend is kicked once"
    );
    assert_eq!(engine.ring().req_cons(), 1);
    for _ in 0..100 {
        engine.poll(8);
        if engine.in_flight() == 0 {
            break;
        }
    }
    let mut responses = Vec::new();
    rig.front
        .take_responses(|r| responses.push((r.id, r.status)));
    assert_eq!(responses, [(2, RSP_OKAY), (3, RSP_OKAY)]);
    assert_eq!(page_bytes(&memory, 11), vec![0xc3; 4096]);
    // Sector 8 still holds the old image's write: the disk went across.
    let mut sector8 = vec![0; 512];
    rig.hooks.disk.read_at(8 * 512, &mut sector8);
    assert_eq!(sector8, vec![0x5a; 512]);

    // From here on it is an ordinary connected vbd: a frontend still Connected is
    // nothing to do, and its close is the usual one.
    assert_eq!(
        backend.step(&mut rig.store, &mut hooks),
        Ok(StepOutcome::Idle)
    );
    rig.store.set(&format!("{FE}/state"), "6");
    assert_eq!(
        backend.step(&mut rig.store, &mut hooks),
        Ok(StepOutcome::Switched(XenbusState::Closed))
    );
    assert_eq!(table.live_mappings().0, 0);
}

/// Resumes `rig`'s drained vbd after `tamper` changed what is handed over or the ring;
/// returns the outcome's reason, and checks what a refused take-over leaves: the device
/// Closing with the reason in `error`, nothing mapped.
fn refused(
    rig: &mut ConnectedEngine,
    tamper: impl FnOnce(&mut ConnectedEngine, &mut FrontendConnection, &mut Vec<(String, String)>),
) -> String {
    let (mut connection, mut published) = drain_for_upgrade(rig);
    tamper(rig, &mut connection, &mut published);
    let (hooks, backend, outcome) = take_over(rig, &connection, &published);
    let StepOutcome::Failed(reason) = outcome else {
        panic!("not refused: {outcome:?}");
    };
    assert_eq!(backend.state(), XenbusState::Closing);
    assert_eq!(state(&rig.store), "5");
    assert_eq!(rig.store.get(&format!("{BE}/error")), Some(reason.as_str()));
    assert!(hooks.engines.is_empty());
    assert_eq!(rig.hooks.table.live_mappings().0, 0, "nothing left mapped");
    reason
}

#[test]
fn a_take_over_publishing_other_features_is_refused() {
    let reason = refused(&mut ConnectedEngine::new(&[]), |_, _, published| {
        published
            .iter_mut()
            .find(|(k, _)| k == "sectors")
            .unwrap()
            .1 = "8".into();
    });
    assert!(reason.contains("sectors was \"8\""), "{reason}");
    let reason = refused(&mut ConnectedEngine::new(&[]), |_, _, published| {
        published.retain(|(k, _)| k != "feature-flush-cache");
        published.push(("feature-other".into(), "1".into()));
    });
    assert!(
        reason.contains("feature-flush-cache was not published"),
        "{reason}"
    );
    let reason = refused(&mut ConnectedEngine::new(&[]), |_, _, published| {
        published.push(("feature-other".into(), "1".into()));
    });
    assert!(reason.contains("keys published"), "{reason}");
}

#[test]
fn a_ring_moved_on_or_overflowed_meanwhile_is_refused() {
    let reason = refused(&mut ConnectedEngine::new(&[]), |_, connection, _| {
        connection.queues[0].attach_at = Some(3);
    });
    // (The test hooks give the engine's error in its Debug form.)
    assert!(
        reason.contains("NotWhereLeft { shared: 0, handed_over: 3 }"),
        "{reason}"
    );
    let reason = refused(&mut ConnectedEngine::new(&[]), |rig, _, _| {
        let memory = rig.hooks.table.memory().clone();
        memory.store_u32(0, sring::REQ_PROD, abi::ring_slots(0) + 1);
    });
    assert!(
        reason.contains("Overflowed { req_prod: 33, rsp_prod: 0 }"),
        "{reason}"
    );
}

#[test]
fn a_take_over_failing_on_its_second_queue_lets_go_of_the_first() {
    let reason = refused(&mut ConnectedEngine::new(&[]), |_, connection, _| {
        let mut second = connection.queues[0].clone();
        second.attach_at = Some(9);
        connection.queues.push(second);
    });
    assert!(
        reason.contains("NotWhereLeft { shared: 0, handed_over: 9 }"),
        "{reason}"
    );
}

#[test]
fn a_connection_this_image_would_not_make_is_refused() {
    type Tamper = fn(&mut ConnectedEngine, &mut FrontendConnection, &mut Vec<(String, String)>);
    let cases: [(Tamper, &str); 7] = [
        (|_, c, _| c.frontend_id = 6, "frontend 6 handed over"),
        (|_, c, _| c.read_only = true, "would not make"),
        (|_, c, _| c.discard = false, "would not make"),
        (|_, c, _| c.max_indirect_segments = 8, "would not make"),
        (|_, c, _| c.ring_order = 5, "would not make"),
        (
            |_, c, _| c.queues.extend([c.queues[0].clone(), c.queues[0].clone()]),
            "would not make",
        ),
        (|_, c, _| c.queues[0].attach_at = None, "queue 0"),
    ];
    for (tamper, expected) in cases {
        let reason = refused(&mut ConnectedEngine::new(&[]), tamper);
        assert!(reason.contains(expected), "{reason}");
    }
}

#[test]
fn a_backend_no_longer_connected_is_not_taken_over() {
    let reason = refused(&mut ConnectedEngine::new(&[]), |rig, _, _| {
        rig.store.set(&format!("{BE}/state"), "5");
    });
    assert!(reason.contains("not Connected"), "{reason}");
}

#[test]
fn a_backend_the_toolstack_removed_meanwhile_is_an_error_not_a_take_over() {
    let mut rig = ConnectedEngine::new(&[]);
    let (connection, published) = drain_for_upgrade(&mut rig);
    rig.store
        .rm(NO_TRANSACTION, &format!("{BE}/state"))
        .unwrap();
    let mut hooks = new_image_hooks(&rig);
    assert!(BlkifBackend::resume(
        &mut rig.store,
        BE,
        params(),
        &connection,
        &published,
        &mut hooks
    )
    .is_err());
    assert!(hooks.engines.is_empty());
    assert_eq!(rig.hooks.table.live_mappings().0, 0);
}
