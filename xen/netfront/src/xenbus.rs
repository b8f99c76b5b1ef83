// SPDX-License-Identifier: MIT OR Apache-2.0
//! The frontend's side of a vif's handshake, as Linux netfront does it
//! (`talk_to_netback`, `netback_changed`): read what the toolstack wrote (backend, its
//! domain, our MAC); wait for netback's InitWait; check it copies into our pages
//! (`feature-rx-copy`); make the rings; publish them with the features netback must see
//! (rx copy and notify, scatter-gather and TCPv4 GSO on receive, checksum offload) in
//! one transaction, then Connected; wait for netback's Connected. Every wait is
//! bounded, every value read is checked.

use alloc::format;
use alloc::string::{String, ToString};
use xen::abi::event_channel::EvtchnPort;
use xen::abi::grant_table::GrantRef;
use xen::abi::{DomId, DOMID_FIRST_RESERVED};
use xen::xenbus::keys::{vif, STATE};
use xen::xenbus::{write_in_transaction, StoreError, XenStore, XenbusState, NO_TRANSACTION};

/// How long netback gets for each of its two steps (libxl waits as long for a backend).
pub const BACKEND_WAIT_MS: u64 = 10_000;

/// What the toolstack told us about the vif.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VifInfo {
    pub backend: String,
    pub backend_id: DomId,
    pub mac: [u8; 6],
}

/// What the frontend made, to publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rings {
    pub tx_ref: GrantRef,
    pub rx_ref: GrantRef,
    pub port: EvtchnPort,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VifError {
    Store {
        key: String,
        error: StoreError,
    },
    BadValue {
        key: String,
        value: String,
    },
    /// netback did not reach `wanted` in time; it was at `state`.
    BackendTimeout {
        wanted: XenbusState,
        state: XenbusState,
    },
    /// netback went away or closed during the handshake.
    BackendClosed(XenbusState),
    /// netback does not copy into our pages (`feature-rx-copy` not 1).
    NoRxCopy,
    /// Making the rings failed.
    Rings(String),
}

impl core::fmt::Display for VifError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VifError::Store { key, error } => write!(f, "{key}: {error}"),
            VifError::BadValue { key, value } => write!(f, "{key}: bad value {value:?}"),
            VifError::BackendTimeout { wanted, state } => write!(
                f,
                "netback did not reach {wanted:?} in {BACKEND_WAIT_MS} ms (it is {state:?})"
            ),
            VifError::BackendClosed(state) => write!(f, "netback went to {state:?}"),
            VifError::NoRxCopy => f.write_str("netback does not offer feature-rx-copy"),
            VifError::Rings(why) => write!(f, "rings: {why}"),
        }
    }
}

fn read(store: &mut dyn XenStore, path: String) -> Result<String, VifError> {
    store
        .read(NO_TRANSACTION, &path)
        .map_err(|error| VifError::Store { key: path, error })
}

/// `xx:xx:xx:xx:xx:xx`, hex, a unicast address.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    (parts.next().is_none() && mac[0] & 1 == 0 && mac != [0; 6]).then_some(mac)
}

/// Reads the toolstack's keys of the vif at `dir` (`device/vif/<n>`).
pub fn read_vif(store: &mut dyn XenStore, dir: &str) -> Result<VifInfo, VifError> {
    let backend = read(store, format!("{dir}/{}", vif::BACKEND))?;
    let id_text = read(store, format!("{dir}/{}", vif::BACKEND_ID))?;
    let backend_id = id_text
        .trim()
        .parse::<DomId>()
        .ok()
        .filter(|&id| id < DOMID_FIRST_RESERVED)
        .ok_or_else(|| VifError::BadValue {
            key: vif::BACKEND_ID.into(),
            value: id_text.clone(),
        })?;
    if !backend.starts_with("/local/domain/") || backend.len() > 256 {
        return Err(VifError::BadValue {
            key: vif::BACKEND.into(),
            value: backend,
        });
    }
    let mac_text = read(store, format!("{dir}/{}", vif::MAC))?;
    let mac = parse_mac(&mac_text).ok_or(VifError::BadValue {
        key: vif::MAC.into(),
        value: mac_text,
    })?;
    Ok(VifInfo {
        backend,
        backend_id,
        mac,
    })
}

fn backend_state(store: &mut dyn XenStore, backend: &str) -> XenbusState {
    store
        .read(NO_TRANSACTION, &format!("{backend}/{STATE}"))
        .map_or(XenbusState::Unknown, |v| XenbusState::parse(&v))
}

/// Waits (bounded) for netback to reach `wanted` (or a later setup state).
fn wait_backend(
    store: &mut dyn XenStore,
    backend: &str,
    wanted: XenbusState,
    now_ms: &mut dyn FnMut() -> u64,
    pause: &mut dyn FnMut(),
) -> Result<(), VifError> {
    let start = now_ms();
    loop {
        let state = backend_state(store, backend);
        match state {
            s if s == wanted => return Ok(()),
            XenbusState::Connected if wanted == XenbusState::InitWait => return Ok(()),
            XenbusState::Closing | XenbusState::Closed => {
                return Err(VifError::BackendClosed(state))
            }
            _ => {}
        }
        if now_ms().saturating_sub(start) >= BACKEND_WAIT_MS {
            return Err(VifError::BackendTimeout { wanted, state });
        }
        pause();
    }
}

/// The whole handshake: `make_rings` is called once netback waits for us, with what the
/// toolstack said; its rings are published, and the call returns once netback is
/// Connected. `now_ms` and `pause` are the clock and the wait between looks.
pub fn connect(
    store: &mut dyn XenStore,
    dir: &str,
    now_ms: &mut dyn FnMut() -> u64,
    pause: &mut dyn FnMut(),
    make_rings: &mut dyn FnMut(&VifInfo) -> Result<Rings, String>,
) -> Result<VifInfo, VifError> {
    let info = read_vif(store, dir)?;
    wait_backend(store, &info.backend, XenbusState::InitWait, now_ms, pause)?;
    let copy = store
        .read(
            NO_TRANSACTION,
            &format!("{}/{}", info.backend, vif::FEATURE_RX_COPY),
        )
        .unwrap_or_default();
    if copy.trim() != "1" {
        return Err(VifError::NoRxCopy);
    }
    let rings = make_rings(&info).map_err(VifError::Rings)?;
    let keys = [
        (vif::TX_RING_REF, rings.tx_ref.to_string()),
        (vif::RX_RING_REF, rings.rx_ref.to_string()),
        (vif::EVENT_CHANNEL, rings.port.to_string()),
        (vif::REQUEST_RX_COPY, "1".to_string()),
        (vif::FEATURE_RX_NOTIFY, "1".to_string()),
        // Scatter-gather and TCPv4 GSO on receive: netback hands over up to 64 KiB
        // in one packet. Its TSO needs checksum offload, so that is on (written, not
        // left out: a key of an earlier connection would stay), and packets may come
        // with a blank checksum, flagged (`phy.rs` checks the others).
        (vif::FEATURE_SG, "1".to_string()),
        (vif::FEATURE_GSO_TCPV4, "1".to_string()),
        (vif::FEATURE_NO_CSUM_OFFLOAD, "0".to_string()),
    ];
    write_in_transaction(store, dir, &keys).map_err(|error| VifError::Store {
        key: dir.into(),
        error,
    })?;
    let state = format!("{dir}/{STATE}");
    let connected = (XenbusState::Connected as u32).to_string();
    store
        .write(NO_TRANSACTION, &state, &connected)
        .map_err(|error| VifError::Store { key: state, error })?;
    wait_backend(store, &info.backend, XenbusState::Connected, now_ms, pause)?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use xen::xenbus::fake::MemStore;

    const DIR: &str = "device/vif/0";
    const BACKEND: &str = "/local/domain/0/backend/vif/5/0";

    fn toolstack() -> MemStore {
        let mut store = MemStore::new();
        store.set(&format!("{DIR}/backend"), BACKEND);
        store.set(&format!("{DIR}/backend-id"), "0");
        store.set(&format!("{DIR}/mac"), "00:16:3e:01:02:03");
        store.set(&format!("{BACKEND}/feature-rx-copy"), "1");
        store
    }

    #[test]
    fn macs_are_six_hex_pairs_of_a_unicast_address() {
        assert_eq!(
            parse_mac("00:16:3e:01:02:0a"),
            Some([0, 0x16, 0x3e, 1, 2, 10])
        );
        assert_eq!(
            parse_mac("00:16:3E:01:02:0A\n"),
            Some([0, 0x16, 0x3e, 1, 2, 10])
        );
        for bad in [
            "",
            "00:16:3e:01:02",
            "00:16:3e:01:02:03:04",
            "0:16:3e:01:02:03",
            "01:16:3e:01:02:03",
            "00:00:00:00:00:00",
            "00:16:3e:01:02:zz",
            "+0:16:3e:01:02:03",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_toolstack_keys_are_checked() {
        let mut store = toolstack();
        assert_eq!(read_vif(&mut store, DIR).unwrap().backend_id, 0);
        store.set(&format!("{DIR}/backend-id"), "32752");
        assert!(matches!(
            read_vif(&mut store, DIR),
            Err(VifError::BadValue { .. })
        ));
        store.set(&format!("{DIR}/backend-id"), "0");
        store.set(&format!("{DIR}/backend"), "elsewhere");
        assert!(matches!(
            read_vif(&mut store, DIR),
            Err(VifError::BadValue { .. })
        ));
        let mut empty = MemStore::new();
        assert!(matches!(
            read_vif(&mut empty, DIR),
            Err(VifError::Store { .. })
        ));
    }

    /// netback steps as the clock advances: InitWait at 5 ms, Connected once our state
    /// is Connected.
    #[test]
    fn the_handshake_publishes_the_rings_and_features_then_waits_for_netback() {
        let store = std::cell::RefCell::new(toolstack());
        let clock = Cell::new(0u64);
        let mut now = || clock.get();
        let mut pause = || {
            clock.set(clock.get() + 1);
            let mut s = store.borrow_mut();
            if clock.get() == 5 {
                s.set(&format!("{BACKEND}/state"), "2");
            }
            if s.get(&format!("{DIR}/state")) == Some("4") {
                s.set(&format!("{BACKEND}/state"), "4");
            }
        };
        let mut made = 0;
        let mut rings = |info: &VifInfo| {
            made += 1;
            assert_eq!(info.mac, [0, 0x16, 0x3e, 1, 2, 3]);
            Ok(Rings {
                tx_ref: 8,
                rx_ref: 9,
                port: 3,
            })
        };
        // The store is borrowed by the pause closure only between calls.
        let mut shim = Shim(&store);
        let info = connect(&mut shim, DIR, &mut now, &mut pause, &mut rings).unwrap();
        assert_eq!(info.backend, BACKEND);
        assert_eq!(made, 1);
        let s = store.borrow();
        for (key, value) in [
            ("tx-ring-ref", "8"),
            ("rx-ring-ref", "9"),
            ("event-channel", "3"),
            ("request-rx-copy", "1"),
            ("feature-rx-notify", "1"),
            ("feature-sg", "1"),
            ("feature-gso-tcpv4", "1"),
            ("feature-no-csum-offload", "0"),
            ("state", "4"),
        ] {
            assert_eq!(s.get(&format!("{DIR}/{key}")), Some(value), "{key}");
        }
        assert_eq!(s.commits, 1, "the rings and features in one transaction");
    }

    #[test]
    fn a_silent_or_closing_or_copyless_backend_fails_the_handshake_in_bounded_time() {
        let clock = Cell::new(0u64);
        let mut now = || clock.get();
        let mut pause = || clock.set(clock.get() + 100);
        let mut rings = |_: &VifInfo| {
            Ok(Rings {
                tx_ref: 8,
                rx_ref: 9,
                port: 3,
            })
        };
        let mut store = toolstack();
        assert_eq!(
            connect(&mut store, DIR, &mut now, &mut pause, &mut rings),
            Err(VifError::BackendTimeout {
                wanted: XenbusState::InitWait,
                state: XenbusState::Unknown
            })
        );
        assert!(clock.get() <= BACKEND_WAIT_MS + 100);
        store.set(&format!("{BACKEND}/state"), "6");
        assert_eq!(
            connect(&mut store, DIR, &mut now, &mut pause, &mut rings),
            Err(VifError::BackendClosed(XenbusState::Closed))
        );
        store.set(&format!("{BACKEND}/state"), "2");
        store.set(&format!("{BACKEND}/feature-rx-copy"), "0");
        assert_eq!(
            connect(&mut store, DIR, &mut now, &mut pause, &mut rings),
            Err(VifError::NoRxCopy)
        );
        store.set(&format!("{BACKEND}/feature-rx-copy"), "1");
        clock.set(0);
        assert_eq!(
            connect(&mut store, DIR, &mut now, &mut pause, &mut rings),
            Err(VifError::BackendTimeout {
                wanted: XenbusState::Connected,
                state: XenbusState::InitWait
            })
        );
        let mut refuse = |_: &VifInfo| Err("no grant".to_string());
        assert_eq!(
            connect(&mut store, DIR, &mut now, &mut pause, &mut refuse),
            Err(VifError::Rings("no grant".into()))
        );
    }

    /// A `XenStore` over a shared `MemStore`, so the test's netback can step it too.
    struct Shim<'a>(&'a std::cell::RefCell<MemStore>);

    impl XenStore for Shim<'_> {
        fn read(&mut self, tx: u32, path: &str) -> Result<String, StoreError> {
            self.0.borrow_mut().read(tx, path)
        }
        fn write(&mut self, tx: u32, path: &str, value: &str) -> Result<(), StoreError> {
            self.0.borrow_mut().write(tx, path, value)
        }
        fn mkdir(&mut self, tx: u32, path: &str) -> Result<(), StoreError> {
            self.0.borrow_mut().mkdir(tx, path)
        }
        fn rm(&mut self, tx: u32, path: &str) -> Result<(), StoreError> {
            self.0.borrow_mut().rm(tx, path)
        }
        fn directory(&mut self, tx: u32, path: &str) -> Result<Vec<String>, StoreError> {
            self.0.borrow_mut().directory(tx, path)
        }
        fn transaction_start(&mut self) -> Result<u32, StoreError> {
            self.0.borrow_mut().transaction_start()
        }
        fn transaction_end(&mut self, tx: u32, commit: bool) -> Result<(), StoreError> {
            self.0.borrow_mut().transaction_end(tx, commit)
        }
    }
}
