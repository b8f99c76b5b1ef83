// SPDX-License-Identifier: MIT OR Apache-2.0
//! A disk resized while its rings run: the engine checks against the new capacity once
//! refreshed, and the backend publishes it as Linux's `xen_vbd_resize` does.

use blkdev::{BlockDevice, RamDisk};

use super::{whole_page, Rig};
use crate::abi::{self, RSP_ERROR, RSP_OKAY};
use crate::engine::EngineConfig;
use crate::fake::wire::encode_direct;
use crate::fake::MemStore;
use crate::keys::{FAULT, RESIZE};
use crate::negotiate::{BackendParams, BlkifBackend, XenbusState};
use crate::ring::Response;
use xen::xenbus::error::errno;

#[test]
fn an_engine_serves_the_grown_part_once_refreshed() {
    let disk = RamDisk::try_new(RamDisk::plain(2048), 4096, None, None).unwrap();
    let mut rig = Rig::new(EngineConfig::new(0, false), disk.queue(64));
    let (_, gref) = rig.data_page(0x3c);
    let write = |id| encode_direct(abi::OP_WRITE, id, 2048, &[whole_page(gref)]);
    let status = |rig: &mut Rig<_>, id| {
        rig.send(&write(id));
        rig.engine.poll(4);
        rig.responses()
    };
    let answer = |id, status| Response {
        id,
        operation: abi::OP_WRITE,
        status,
    };
    assert_eq!(status(&mut rig, 1), [answer(1, RSP_ERROR)]);
    disk.resize(4096).unwrap();
    assert_eq!(rig.engine.device().geometry().sectors, 4096);
    // The engine still checks against what it knew: refused before the device sees it.
    assert_eq!(status(&mut rig, 2), [answer(2, RSP_ERROR)]);
    rig.engine.refresh_capacity();
    assert_eq!(rig.engine.capacity(), 4096);
    assert_eq!(status(&mut rig, 3), [answer(3, RSP_OKAY)]);
    let mut written = vec![0u8; 4096];
    disk.read_at(2048 * 512, &mut written);
    assert!(written.iter().all(|&b| b == 0x3c));
}

const BE: &str = "/local/domain/1/backend/vbd/5/51712";
const FE: &str = "/local/domain/5/device/vbd/51712";

fn connected() -> (MemStore, BlkifBackend) {
    let mut store = MemStore::new();
    store.set(&format!("{BE}/frontend"), FE);
    store.set(&format!("{BE}/frontend-id"), "5");
    store.set(&format!("{BE}/params"), "ram:1M");
    store.set(&format!("{FE}/state"), "1");
    let params = BackendParams::new(1, RamDisk::new(2048).geometry());
    let mut backend = BlkifBackend::probe(&mut store, BE, params).unwrap();
    store.set(&format!("{FE}/ring-ref"), "8");
    store.set(&format!("{FE}/event-channel"), "9");
    store.set(&format!("{FE}/state"), "4");
    let mut hooks = super::negotiation::RecordingHooks::default();
    backend.step(&mut store, &mut hooks).unwrap();
    assert_eq!(backend.state(), XenbusState::Connected);
    (store, backend)
}

#[test]
fn a_resize_is_published_as_linux_does_sectors_and_state_in_one_transaction() {
    let (mut store, mut backend) = connected();
    store.writes.clear();
    let transactions = store.commits;
    backend.resized(&mut store, 4096).unwrap();
    assert_eq!(store.get(&format!("{BE}/sectors")), Some("4096"));
    assert_eq!(store.get(&format!("{BE}/{RESIZE}")), Some("4096 sectors"));
    // `state` rewritten (Connected again): the frontend's watch fires and blkfront
    // reads `sectors` anew.
    let written: Vec<&str> = store.writes.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        written.contains(&format!("{BE}/state").as_str()),
        "{written:?}"
    );
    assert_eq!(store.get(&format!("{BE}/state")), Some("4"));
    assert_eq!(store.commits, transactions + 1, "one transaction");
    // A reconnect publishes the new size too.
    store.set(&format!("{FE}/state"), "6");
    let mut hooks = super::negotiation::RecordingHooks::default();
    backend.step(&mut store, &mut hooks).unwrap();
    store.set(&format!("{BE}/sectors"), "0");
    store.set(&format!("{FE}/state"), "1");
    backend.step(&mut store, &mut hooks).unwrap();
    store.set(&format!("{FE}/state"), "4");
    backend.step(&mut store, &mut hooks).unwrap();
    assert_eq!(store.get(&format!("{BE}/sectors")), Some("4096"));
}

#[test]
fn a_resize_while_not_connected_leaves_the_state_alone() {
    let mut store = MemStore::new();
    store.set(&format!("{BE}/frontend"), FE);
    store.set(&format!("{BE}/frontend-id"), "5");
    store.set(&format!("{FE}/state"), "1");
    let params = BackendParams::new(1, RamDisk::new(2048).geometry());
    let mut backend = BlkifBackend::probe(&mut store, BE, params).unwrap();
    store.writes.clear();
    backend.resized(&mut store, 8192).unwrap();
    let written: Vec<&str> = store.writes.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        !written.contains(&format!("{BE}/state").as_str()),
        "{written:?}"
    );
    assert_eq!(store.get(&format!("{BE}/state")), Some("2"));
    assert_eq!(store.get(&format!("{BE}/sectors")), Some("8192"));
}

#[test]
fn a_refused_resize_says_why_and_puts_params_back() {
    let (mut store, backend) = connected();
    store.set(&format!("{BE}/params"), "ram:512K");
    backend
        .refuse_resize(
            &mut store,
            "ram:1M",
            errno::EBUSY,
            "sector 1000 holds data beyond the new end",
        )
        .unwrap();
    assert_eq!(store.get(&format!("{BE}/params")), Some("ram:1M"));
    assert_eq!(
        store.get(&format!("{BE}/{RESIZE}")),
        Some("refused: sector 1000 holds data beyond the new end")
    );
    assert_eq!(
        store.get("/local/domain/1/error/backend/vbd/5/51712/error"),
        Some("16 resize refused: sector 1000 holds data beyond the new end")
    );
    assert_eq!(
        store.get(&format!("{BE}/state")),
        Some("4"),
        "still serving"
    );
    // A later resize that succeeds clears the error node.
    let mut backend = backend;
    backend.resized(&mut store, 4096).unwrap();
    assert_eq!(
        store.get("/local/domain/1/error/backend/vbd/5/51712/error"),
        None
    );
}

#[test]
fn a_failed_device_is_reported_and_the_vbd_stays_connected() {
    let (mut store, backend) = connected();
    backend
        .device_failed(&mut store, "a command got no completion in 30000 ms")
        .unwrap();
    assert_eq!(
        store.get(&format!("{BE}/{FAULT}")),
        Some("a command got no completion in 30000 ms")
    );
    assert_eq!(
        store.get("/local/domain/1/error/backend/vbd/5/51712/error"),
        Some("5 device failed: a command got no completion in 30000 ms")
    );
    assert_eq!(store.get(&format!("{BE}/state")), Some("4"));
}
