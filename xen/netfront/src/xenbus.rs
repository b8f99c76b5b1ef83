// SPDX-License-Identifier: MIT OR Apache-2.0
//! The frontend's side of a vif's handshake, as Linux netfront does it
//! (`talk_to_netback`, `netback_changed`): read what the toolstack wrote (backend, its
//! domain, our MAC); wait for netback's InitWait; check it copies into our pages
//! (`feature-rx-copy`); plan the queues (up to `multi-queue-max-queues`, and a control
//! ring with `feature-ctrl-ring`, else one queue); make the rings; publish them with
//! the features netback must see (rx copy and notify, scatter-gather and TCPv4 GSO on
//! receive, checksum offload) in one transaction, then Connected; wait for netback's
//! Connected; read the vif's MTU (the hotplug script's, written by then). Every wait is
//! bounded, every value read is checked.

use crate::hash::MAX_QUEUES;
use crate::queue::{DEFAULT_MTU, ETHERNET_HEADER, MAX_MTU, MIN_MTU};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use xen::abi::event_channel::EvtchnPort;
use xen::abi::grant_table::GrantRef;
use xen::abi::{DomId, DOMID_FIRST_RESERVED, PAGE_SIZE};
use xen::xenbus::keys::{numbered, vif, STATE};
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

/// One queue's rings and event channel, to publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rings {
    pub tx_ref: GrantRef,
    pub rx_ref: GrantRef,
    pub port: EvtchnPort,
}

/// The control ring's page and event channel, to publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtrlRef {
    pub gref: GrantRef,
    pub port: EvtchnPort,
}

/// What to make, from what netback offers and what was wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// 1 to [`MAX_QUEUES`].
    pub queues: u16,
    /// A control ring (only with several queues: it is there to steer between them).
    pub ctrl_ring: bool,
    /// Why one queue and no control ring, when more were wanted.
    pub single_because: Option<&'static str>,
    /// netback takes packets over several slots with a GSO extra slot from us
    /// (`feature-sg` and `feature-gso-tcpv4`): segments are joined on send.
    pub tx_gso: bool,
    /// The MTU to use: the vif's, bounded ([`MtuNote`] says why when not). Read once
    /// netback is Connected ([`connect`]); [`DEFAULT_MTU`] until then.
    pub mtu: u16,
    pub mtu_note: Option<MtuNote>,
}

/// Why the MTU used is not the vif's `mtu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtuNote {
    /// Not a number: [`DEFAULT_MTU`] (what netif.h says when there is none).
    NotANumber,
    /// Below [`MIN_MTU`]: raised to it (a smaller MTU is always safe to send with, and
    /// peers keep to the MSS it announces).
    Raised(u32),
    /// Above [`MAX_MTU`]: lowered to it.
    Lowered(u32),
    /// A frame over a page needs several slots, and netback offers no `feature-sg`:
    /// [`DEFAULT_MTU`].
    NoScatterGather(u32),
}

impl core::fmt::Display for MtuNote {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            MtuNote::NotANumber => write!(f, "the vif's mtu is not a number"),
            MtuNote::Raised(mtu) => write!(f, "the vif's mtu {mtu} is below {MIN_MTU}"),
            MtuNote::Lowered(mtu) => write!(
                f,
                "the vif's mtu {mtu} is above {MAX_MTU}, the largest blkdom sends"
            ),
            MtuNote::NoScatterGather(mtu) => write!(
                f,
                "the vif's mtu {mtu} needs frames over several slots, and netback \
                 offers no feature-sg"
            ),
        }
    }
}

/// The MTU to use, from the vif's `asked` (the frontend's `mtu`: libxl writes xl's `mtu=`
/// or 1500, then Xen's hotplug script the MTU it gave dom0's end of the vif, xl's or
/// else the bridge's) and whether netback takes frames over several slots.
pub fn choose_mtu(asked: Option<&str>, backend_sg: bool) -> (u16, Option<MtuNote>) {
    const DEFAULT: u16 = DEFAULT_MTU as u16;
    let Some(text) = asked else {
        return (DEFAULT, None);
    };
    let Ok(mtu) = text.trim().parse::<u32>() else {
        return (DEFAULT, Some(MtuNote::NotANumber));
    };
    if mtu < MIN_MTU as u32 {
        (MIN_MTU as u16, Some(MtuNote::Raised(mtu)))
    } else if mtu as usize + ETHERNET_HEADER > PAGE_SIZE && !backend_sg {
        (DEFAULT, Some(MtuNote::NoScatterGather(mtu)))
    } else if mtu > MAX_MTU as u32 {
        (MAX_MTU as u16, Some(MtuNote::Lowered(mtu)))
    } else {
        (mtu as u16, None)
    }
}

/// What the frontend made, to publish: `queues` as many as the plan said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Made {
    pub queues: Vec<Rings>,
    pub ctrl: Option<CtrlRef>,
}

/// What netback offers (its InitWait keys) and what the frontend takes of it: up to
/// `wanted` queues (at most `multi-queue-max-queues`), a control ring when netback has
/// `feature-ctrl-ring`; one queue and no control ring when either is missing (queues
/// blkdom cannot steer between are of no use to it) or one was wanted.
pub fn plan(store: &mut dyn XenStore, backend: &str, wanted: u16) -> (Plan, Option<u32>) {
    let mut key = |name: &str| {
        store
            .read(NO_TRANSACTION, &format!("{backend}/{name}"))
            .ok()
    };
    // Linux netfront writes `multi-queue-num-queues` when the key exists, and reads an
    // unparsable value as 1 (`xenbus_read_unsigned`'s default).
    let max = key(vif::MULTI_QUEUE_MAX_QUEUES)
        .map(|v| v.trim().parse::<u32>().ok().filter(|&n| n > 0).unwrap_or(1));
    let ctrl = key(vif::FEATURE_CTRL_RING).is_some_and(|v| v.trim() == "1");
    let tx_gso = [vif::FEATURE_SG, vif::FEATURE_GSO_TCPV4]
        .iter()
        .all(|name| key(name).is_some_and(|v| v.trim() == "1"));
    let (mtu, mtu_note) = (DEFAULT_MTU as u16, None);
    let wanted = wanted.clamp(1, MAX_QUEUES as u16);
    let offered = max.unwrap_or(1).min(MAX_QUEUES as u32) as u16;
    let single_because = if wanted == 1 {
        None
    } else if offered < 2 {
        Some("netback offers one queue (multi-queue-max-queues)")
    } else if !ctrl {
        Some("netback has no control ring (feature-ctrl-ring)")
    } else {
        None
    };
    let plan = match single_because {
        None if wanted > 1 => Plan {
            queues: wanted.min(offered),
            ctrl_ring: true,
            single_because: None,
            tx_gso,
            mtu,
            mtu_note,
        },
        _ => Plan {
            queues: 1,
            ctrl_ring: false,
            single_because,
            tx_gso,
            mtu,
            mtu_note,
        },
    };
    (plan, max)
}

/// The keys that publish `made`, as Linux netfront's `talk_to_netback` writes them:
/// `multi-queue-num-queues` when netback offers queues, one queue's keys flat and
/// several queues' under `queue-N/`, the control ring's, then the features.
pub fn keys(made: &Made, max_offered: bool) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut key = |name: &str, value: String| keys.push((name.to_string(), value));
    if max_offered {
        key(vif::MULTI_QUEUE_NUM_QUEUES, made.queues.len().to_string());
    }
    if let [only] = made.queues.as_slice() {
        key(vif::TX_RING_REF, only.tx_ref.to_string());
        key(vif::RX_RING_REF, only.rx_ref.to_string());
        key(vif::EVENT_CHANNEL, only.port.to_string());
    } else {
        for (n, q) in made.queues.iter().enumerate() {
            let n = n as u32;
            key(&numbered(vif::QUEUE_TX_RING_REF, n), q.tx_ref.to_string());
            key(&numbered(vif::QUEUE_RX_RING_REF, n), q.rx_ref.to_string());
            key(&numbered(vif::QUEUE_EVENT_CHANNEL, n), q.port.to_string());
        }
    }
    if let Some(ctrl) = made.ctrl {
        key(vif::CTRL_RING_REF, ctrl.gref.to_string());
        key(vif::EVENT_CHANNEL_CTRL, ctrl.port.to_string());
    }
    key(vif::REQUEST_RX_COPY, "1".to_string());
    key(vif::FEATURE_RX_NOTIFY, "1".to_string());
    // Scatter-gather and TCPv4 GSO on receive: netback hands over up to 64 KiB
    // in one packet. Its TSO needs checksum offload, so that is on (written, not
    // left out: a key of an earlier connection would stay), and packets may come
    // with a blank checksum, flagged (`phy.rs` checks the others).
    key(vif::FEATURE_SG, "1".to_string());
    key(vif::FEATURE_GSO_TCPV4, "1".to_string());
    key(vif::FEATURE_NO_CSUM_OFFLOAD, "0".to_string());
    keys
}

/// The handshake's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connected {
    pub info: VifInfo,
    pub plan: Plan,
    /// netback's `multi-queue-max-queues` (`None`: not offered).
    pub max_queues: Option<u32>,
    /// The keys written under the frontend's directory (relative), for [`disconnect`].
    pub published: Vec<String>,
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

/// Looks at netback's state until `settle` says how the wait ends (`None`: look again,
/// after `pause`), at most [`BACKEND_WAIT_MS`]; then a timeout naming `wanted`.
fn poll_backend(
    store: &mut dyn XenStore,
    backend: &str,
    wanted: XenbusState,
    now_ms: &mut dyn FnMut() -> u64,
    pause: &mut dyn FnMut(),
    settle: &dyn Fn(XenbusState) -> Option<Result<(), VifError>>,
) -> Result<(), VifError> {
    let start = now_ms();
    loop {
        let state = backend_state(store, backend);
        if let Some(end) = settle(state) {
            return end;
        }
        if now_ms().saturating_sub(start) >= BACKEND_WAIT_MS {
            return Err(VifError::BackendTimeout { wanted, state });
        }
        pause();
    }
}

/// Waits (bounded) for netback to reach `wanted` (or a later setup state). netback at
/// Closing or Closed fails the wait, except Closed while `reconnecting` (it stays there
/// until it sees our Initialising).
fn wait_backend(
    store: &mut dyn XenStore,
    backend: &str,
    wanted: XenbusState,
    reconnecting: bool,
    now_ms: &mut dyn FnMut() -> u64,
    pause: &mut dyn FnMut(),
) -> Result<(), VifError> {
    poll_backend(
        store,
        backend,
        wanted,
        now_ms,
        pause,
        &|state| match state {
            s if s == wanted => Some(Ok(())),
            XenbusState::Connected if wanted == XenbusState::InitWait => Some(Ok(())),
            XenbusState::Closed if reconnecting => None,
            XenbusState::Closing | XenbusState::Closed => Some(Err(VifError::BackendClosed(state))),
            _ => None,
        },
    )
}

/// The whole handshake: `make_rings` is called once netback waits for us, with what the
/// toolstack said and the [`plan`] for up to `wanted` queues; what it made is
/// published, and the call returns once netback is Connected. `now_ms` and `pause` are
/// the clock and the wait between looks.
pub fn connect(
    store: &mut dyn XenStore,
    dir: &str,
    wanted: u16,
    now_ms: &mut dyn FnMut() -> u64,
    pause: &mut dyn FnMut(),
    make_rings: &mut dyn FnMut(&VifInfo, &Plan) -> Result<Made, String>,
) -> Result<Connected, VifError> {
    let info = read_vif(store, dir)?;
    // A vif a previous image closed ([`disconnect`]): netback waits at Closed for our
    // Initialising, then offers InitWait again (its "prepare for reconnect").
    let state = format!("{dir}/{STATE}");
    let reconnecting = store
        .read(NO_TRANSACTION, &state)
        .is_ok_and(|v| XenbusState::parse(&v) == XenbusState::Closed);
    if reconnecting {
        let initialising = (XenbusState::Initialising as u32).to_string();
        store
            .write(NO_TRANSACTION, &state, &initialising)
            .map_err(|error| VifError::Store {
                key: state.clone(),
                error,
            })?;
    }
    wait_backend(
        store,
        &info.backend,
        XenbusState::InitWait,
        reconnecting,
        now_ms,
        pause,
    )?;
    let copy = store
        .read(
            NO_TRANSACTION,
            &format!("{}/{}", info.backend, vif::FEATURE_RX_COPY),
        )
        .unwrap_or_default();
    if copy.trim() != "1" {
        return Err(VifError::NoRxCopy);
    }
    let (mut plan, max_queues) = plan(store, &info.backend, wanted);
    let made = make_rings(&info, &plan).map_err(VifError::Rings)?;
    if made.queues.len() != usize::from(plan.queues) || made.ctrl.is_some() != plan.ctrl_ring {
        return Err(VifError::Rings(format!(
            "{} queues made for {} planned",
            made.queues.len(),
            plan.queues
        )));
    }
    let keys = keys(&made, max_queues.is_some());
    let published: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
    let keys: Vec<(&str, String)> = keys.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    write_in_transaction(store, dir, &keys).map_err(|error| VifError::Store {
        key: dir.into(),
        error,
    })?;
    let connected = (XenbusState::Connected as u32).to_string();
    store
        .write(NO_TRANSACTION, &state, &connected)
        .map_err(|error| VifError::Store { key: state, error })?;
    wait_backend(
        store,
        &info.backend,
        XenbusState::Connected,
        false,
        now_ms,
        pause,
    )?;
    // netback goes Connected only once the hotplug script is done (libxl has it wait for
    // `hotplug-status`), and the script writes our `mtu` last: read it now. Absent (no
    // libxl): netif.h's 1500.
    let asked = store
        .read(NO_TRANSACTION, &format!("{dir}/{}", vif::MTU))
        .ok();
    let sg = store
        .read(
            NO_TRANSACTION,
            &format!("{}/{}", info.backend, vif::FEATURE_SG),
        )
        .is_ok_and(|v| v.trim() == "1");
    (plan.mtu, plan.mtu_note) = choose_mtu(asked.as_deref(), sg);
    Ok(Connected {
        info,
        plan,
        max_queues,
        published,
    })
}

/// Undoes a connection the way Linux netfront leaves a backend (`xenbus_frontend_closed`
/// after Closing): our Closing, then netback's Closing or Closed (it has let the rings
/// go: unmapped, event channels unbound), our Closed, netback's Closed; then the keys
/// the connection `published` are removed, so the next [`connect`] (this image's or a
/// later one's) starts from the toolstack's keys alone: a stale
/// `multi-queue-num-queues` would have netback look for queues that are not there.
/// netback gets [`BACKEND_WAIT_MS`] for each step. Only once this returns Ok may the
/// pages granted to netback be taken back.
pub fn disconnect(
    store: &mut dyn XenStore,
    dir: &str,
    backend: &str,
    published: &[String],
    now_ms: &mut dyn FnMut() -> u64,
    pause: &mut dyn FnMut(),
) -> Result<(), VifError> {
    let state = format!("{dir}/{STATE}");
    // netback answers our Closing with Closing (or straight Closed), our Closed with
    // Closed.
    for ours in [XenbusState::Closing, XenbusState::Closed] {
        store
            .write(NO_TRANSACTION, &state, &(ours as u32).to_string())
            .map_err(|error| VifError::Store {
                key: state.clone(),
                error,
            })?;
        poll_backend(store, backend, ours, now_ms, pause, &|theirs| {
            (theirs == ours || theirs == XenbusState::Closed).then_some(Ok(()))
        })?;
    }
    // netback has let go: what is left is tidying, and a key that will not go is
    // written again by the next connect (all but `multi-queue-num-queues`, which only
    // a netback that stopped offering queues would misread).
    for key in published {
        let _ = store.rm(NO_TRANSACTION, &format!("{dir}/{key}"));
        if let Some((queue_dir, _)) = key.split_once('/') {
            let _ = store.rm(NO_TRANSACTION, &format!("{dir}/{queue_dir}"));
        }
    }
    Ok(())
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
        let mut rings = |info: &VifInfo, plan: &Plan| {
            made += 1;
            assert_eq!(info.mac, [0, 0x16, 0x3e, 1, 2, 3]);
            assert_eq!(plan.queues, 1);
            Ok(one_queue())
        };
        // The store is borrowed by the pause closure only between calls.
        let mut shim = Shim(&store);
        let connected = connect(&mut shim, DIR, 2, &mut now, &mut pause, &mut rings).unwrap();
        assert_eq!(connected.info.backend, BACKEND);
        assert_eq!(
            connected.plan.single_because,
            Some("netback offers one queue (multi-queue-max-queues)")
        );
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
        for absent in [
            "multi-queue-num-queues",
            "queue-0/tx-ring-ref",
            "ctrl-ring-ref",
        ] {
            assert_eq!(s.get(&format!("{DIR}/{absent}")), None, "{absent}");
        }
    }

    fn one_queue() -> Made {
        Made {
            queues: vec![Rings {
                tx_ref: 8,
                rx_ref: 9,
                port: 3,
            }],
            ctrl: None,
        }
    }

    /// Makes what the plan says: queue i's rings 10i+1 and 10i+2, port 10i+3; the
    /// control ring's 99 and port 98.
    fn made_for(plan: &Plan) -> Made {
        Made {
            queues: (0..plan.queues as u32)
                .map(|i| Rings {
                    tx_ref: 10 * i + 1,
                    rx_ref: 10 * i + 2,
                    port: 10 * i + 3,
                })
                .collect(),
            ctrl: plan.ctrl_ring.then_some(CtrlRef { gref: 99, port: 98 }),
        }
    }

    /// netback at InitWait with `max` queues and a control ring or not; it is Connected
    /// as soon as we are.
    fn offer(max: Option<&str>, ctrl: Option<&str>) -> std::cell::RefCell<MemStore> {
        let mut store = toolstack();
        store.set(&format!("{BACKEND}/state"), "2");
        if let Some(max) = max {
            store.set(&format!("{BACKEND}/multi-queue-max-queues"), max);
        }
        if let Some(ctrl) = ctrl {
            store.set(&format!("{BACKEND}/feature-ctrl-ring"), ctrl);
        }
        std::cell::RefCell::new(store)
    }

    fn run(store: &std::cell::RefCell<MemStore>, wanted: u16) -> Connected {
        let mut now = || 0;
        let mut pause = || {
            let mut s = store.borrow_mut();
            if s.get(&format!("{DIR}/state")) == Some("4") {
                s.set(&format!("{BACKEND}/state"), "4");
            }
        };
        let mut rings = |_: &VifInfo, plan: &Plan| Ok(made_for(plan));
        let mut shim = Shim(store);
        connect(&mut shim, DIR, wanted, &mut now, &mut pause, &mut rings).unwrap()
    }

    #[test]
    fn segments_are_joined_on_send_only_when_netback_takes_sg_and_gso() {
        for (sg, gso, joined) in [
            (Some("1"), Some("1"), true),
            (Some("1"), None, false),
            (None, Some("1"), false),
            (Some("1"), Some("0"), false),
        ] {
            let store = offer(None, None);
            for (key, value) in [("feature-sg", sg), ("feature-gso-tcpv4", gso)] {
                if let Some(value) = value {
                    store.borrow_mut().set(&format!("{BACKEND}/{key}"), value);
                }
            }
            assert_eq!(run(&store, 1).plan.tx_gso, joined, "sg {sg:?}, gso {gso:?}");
        }
    }

    #[test]
    fn the_toolstacks_mtu_is_used_within_bounds_and_with_scatter_gather_past_a_page() {
        for (asked, sg, mtu, note) in [
            (None, Some("1"), 1500, None),
            (Some("1500"), Some("1"), 1500, None),
            (Some(" 9000\n"), Some("1"), 9000, None),
            (Some("4082"), None, 4082, None),
            (
                Some("4083"),
                None,
                1500,
                Some(MtuNote::NoScatterGather(4083)),
            ),
            (
                Some("9000"),
                Some("0"),
                1500,
                Some(MtuNote::NoScatterGather(9000)),
            ),
            (
                Some("65535"),
                Some("1"),
                9000,
                Some(MtuNote::Lowered(65535)),
            ),
            (Some("575"), Some("1"), 576, Some(MtuNote::Raised(575))),
            (Some("576"), None, 576, None),
            (Some("jumbo"), Some("1"), 1500, Some(MtuNote::NotANumber)),
            (Some("-1"), Some("1"), 1500, Some(MtuNote::NotANumber)),
        ] {
            let store = offer(None, None);
            if let Some(asked) = asked {
                store.borrow_mut().set(&format!("{DIR}/mtu"), asked);
            }
            if let Some(sg) = sg {
                store.borrow_mut().set(&format!("{BACKEND}/feature-sg"), sg);
            }
            let plan = run(&store, 1).plan;
            assert_eq!(
                (plan.mtu, plan.mtu_note),
                (mtu, note),
                "{asked:?}, sg {sg:?}"
            );
        }
        assert_eq!(
            MtuNote::NoScatterGather(9000).to_string(),
            "the vif's mtu 9000 needs frames over several slots, and netback offers no \
             feature-sg"
        );
    }

    #[test]
    fn the_mtu_is_read_once_netback_is_connected_after_the_hotplug_script_wrote_it() {
        // libxl's 1500 first; the hotplug script's 9000 (the bridge's) before netback
        // goes Connected.
        let store = offer(None, None);
        store.borrow_mut().set(&format!("{DIR}/mtu"), "1500");
        store
            .borrow_mut()
            .set(&format!("{BACKEND}/feature-sg"), "1");
        let mut now = || 0;
        let mut pause = || {
            let mut s = store.borrow_mut();
            if s.get(&format!("{DIR}/state")) == Some("4") {
                s.set(&format!("{DIR}/mtu"), "9000");
                s.set(&format!("{BACKEND}/state"), "4");
            }
        };
        let mut rings = |_: &VifInfo, plan: &Plan| Ok(made_for(plan));
        let mut shim = Shim(&store);
        let connected = connect(&mut shim, DIR, 1, &mut now, &mut pause, &mut rings).unwrap();
        assert_eq!((connected.plan.mtu, connected.plan.mtu_note), (9000, None));
    }

    #[test]
    fn several_queues_are_published_under_queue_n_with_the_control_ring() {
        let store = offer(Some("4"), Some("1"));
        let connected = run(&store, 2);
        assert_eq!(
            connected.plan,
            Plan {
                queues: 2,
                ctrl_ring: true,
                single_because: None,
                tx_gso: false,
                mtu: 1500,
                mtu_note: None,
            }
        );
        assert_eq!(connected.max_queues, Some(4));
        let s = store.borrow();
        for (key, value) in [
            ("multi-queue-num-queues", "2"),
            ("queue-0/tx-ring-ref", "1"),
            ("queue-0/rx-ring-ref", "2"),
            ("queue-0/event-channel", "3"),
            ("queue-1/tx-ring-ref", "11"),
            ("queue-1/rx-ring-ref", "12"),
            ("queue-1/event-channel", "13"),
            ("ctrl-ring-ref", "99"),
            ("event-channel-ctrl", "98"),
            ("request-rx-copy", "1"),
            ("feature-sg", "1"),
            ("state", "4"),
        ] {
            assert_eq!(s.get(&format!("{DIR}/{key}")), Some(value), "{key}");
        }
        // Netfront's rule: no flat ring keys with several queues.
        for absent in [
            "tx-ring-ref",
            "rx-ring-ref",
            "event-channel",
            "queue-2/tx-ring-ref",
        ] {
            assert_eq!(s.get(&format!("{DIR}/{absent}")), None, "{absent}");
        }
        assert_eq!(s.commits, 1);
        // netback's maximum bounds the count; ours too.
        let store = offer(Some("3"), Some("1"));
        assert_eq!(run(&store, 8).plan.queues, 3);
        let store = offer(Some("64"), Some("1"));
        assert_eq!(run(&store, 64).plan.queues, MAX_QUEUES as u16);
    }

    #[test]
    fn without_queues_or_a_control_ring_one_queue_is_published_flat() {
        for (max, ctrl, wanted, because) in [
            (
                Some("4"),
                None,
                2,
                Some("netback has no control ring (feature-ctrl-ring)"),
            ),
            (
                Some("4"),
                Some("0"),
                2,
                Some("netback has no control ring (feature-ctrl-ring)"),
            ),
            (
                Some("1"),
                Some("1"),
                2,
                Some("netback offers one queue (multi-queue-max-queues)"),
            ),
            (
                Some("many"),
                Some("1"),
                2,
                Some("netback offers one queue (multi-queue-max-queues)"),
            ),
            (
                None,
                Some("1"),
                2,
                Some("netback offers one queue (multi-queue-max-queues)"),
            ),
            (Some("4"), Some("1"), 1, None),
        ] {
            let store = offer(max, ctrl);
            let connected = run(&store, wanted);
            let what = format!("{max:?} {ctrl:?} {wanted}");
            assert_eq!(connected.plan.queues, 1, "{what}");
            assert!(!connected.plan.ctrl_ring, "{what}");
            assert_eq!(connected.plan.single_because, because, "{what}");
            let s = store.borrow();
            assert_eq!(s.get(&format!("{DIR}/tx-ring-ref")), Some("1"), "{what}");
            assert_eq!(s.get(&format!("{DIR}/event-channel")), Some("3"), "{what}");
            assert_eq!(s.get(&format!("{DIR}/queue-0/tx-ring-ref")), None, "{what}");
            assert_eq!(s.get(&format!("{DIR}/ctrl-ring-ref")), None, "{what}");
            // Netfront writes the count when netback offers queues at all.
            let count = s.get(&format!("{DIR}/multi-queue-num-queues"));
            assert_eq!(count, max.map(|_| "1"), "{what}");
        }
    }

    #[test]
    fn rings_other_than_planned_fail_the_handshake() {
        let store = offer(Some("4"), Some("1"));
        let mut now = || 0;
        let mut pause = || {};
        let mut rings = |_: &VifInfo, _: &Plan| Ok(one_queue());
        let mut shim = Shim(&store);
        assert!(matches!(
            connect(&mut shim, DIR, 2, &mut now, &mut pause, &mut rings),
            Err(VifError::Rings(_))
        ));
    }

    #[test]
    fn a_silent_or_closing_or_copyless_backend_fails_the_handshake_in_bounded_time() {
        let clock = Cell::new(0u64);
        let mut now = || clock.get();
        let mut pause = || clock.set(clock.get() + 100);
        let mut rings = |_: &VifInfo, _: &Plan| Ok(one_queue());
        let mut store = toolstack();
        assert_eq!(
            connect(&mut store, DIR, 1, &mut now, &mut pause, &mut rings),
            Err(VifError::BackendTimeout {
                wanted: XenbusState::InitWait,
                state: XenbusState::Unknown
            })
        );
        assert!(clock.get() <= BACKEND_WAIT_MS + 100);
        store.set(&format!("{BACKEND}/state"), "6");
        assert_eq!(
            connect(&mut store, DIR, 1, &mut now, &mut pause, &mut rings),
            Err(VifError::BackendClosed(XenbusState::Closed))
        );
        store.set(&format!("{BACKEND}/state"), "2");
        store.set(&format!("{BACKEND}/feature-rx-copy"), "0");
        assert_eq!(
            connect(&mut store, DIR, 1, &mut now, &mut pause, &mut rings),
            Err(VifError::NoRxCopy)
        );
        store.set(&format!("{BACKEND}/feature-rx-copy"), "1");
        clock.set(0);
        assert_eq!(
            connect(&mut store, DIR, 1, &mut now, &mut pause, &mut rings),
            Err(VifError::BackendTimeout {
                wanted: XenbusState::Connected,
                state: XenbusState::InitWait
            })
        );
        let mut refuse = |_: &VifInfo, _: &Plan| Err("no grant".to_string());
        assert_eq!(
            connect(&mut store, DIR, 1, &mut now, &mut pause, &mut refuse),
            Err(VifError::Rings("no grant".into()))
        );
    }

    /// netback following our state as Linux's `frontend_changed` does: our Initialising
    /// (after a close) takes it to InitWait, Connected to Connected, Closing to Closing,
    /// Closed to Closed.
    fn follow(s: &mut MemStore) {
        let next = match s.get(&format!("{DIR}/state")) {
            Some("1") => "2",
            Some("4") => "4",
            Some("5") => "5",
            Some("6") => "6",
            _ => return,
        };
        s.set(&format!("{BACKEND}/state"), next);
    }

    #[test]
    fn a_closed_vif_lets_netback_go_and_connects_again_from_the_toolstacks_keys() {
        let store = offer(Some("4"), Some("1"));
        let clock = Cell::new(0u64);
        let mut now = || clock.get();
        let mut pause = || {
            clock.set(clock.get() + 1);
            follow(&mut store.borrow_mut());
        };
        let mut rings = |_: &VifInfo, plan: &Plan| Ok(made_for(plan));
        let mut shim = Shim(&store);
        let first = connect(&mut shim, DIR, 2, &mut now, &mut pause, &mut rings).unwrap();
        assert_eq!(first.plan.queues, 2);
        assert!(first.published.contains(&"queue-1/tx-ring-ref".to_string()));
        assert!(first
            .published
            .contains(&"multi-queue-num-queues".to_string()));
        disconnect(
            &mut shim,
            DIR,
            BACKEND,
            &first.published,
            &mut now,
            &mut pause,
        )
        .unwrap();
        {
            let s = store.borrow();
            assert_eq!(s.get(&format!("{DIR}/state")), Some("6"));
            assert_eq!(s.get(&format!("{BACKEND}/state")), Some("6"));
            for gone in &first.published {
                assert_eq!(s.get(&format!("{DIR}/{gone}")), None, "{gone}");
            }
            assert_eq!(s.get(&format!("{DIR}/queue-0")), None);
            assert_eq!(s.get(&format!("{DIR}/mac")), Some("00:16:3e:01:02:03"));
        }
        // netback stopped offering queues meanwhile: the next connection is one flat
        // queue, with no queue count left over from the first.
        store
            .borrow_mut()
            .rm(NO_TRANSACTION, &format!("{BACKEND}/multi-queue-max-queues"))
            .unwrap();
        let again = connect(&mut shim, DIR, 2, &mut now, &mut pause, &mut rings).unwrap();
        assert_eq!(again.plan.queues, 1);
        let s = store.borrow();
        assert_eq!(s.get(&format!("{DIR}/state")), Some("4"));
        assert_eq!(s.get(&format!("{BACKEND}/state")), Some("4"));
        assert_eq!(s.get(&format!("{DIR}/tx-ring-ref")), Some("1"));
        assert_eq!(s.get(&format!("{DIR}/multi-queue-num-queues")), None);
        assert_eq!(s.get(&format!("{DIR}/queue-1/tx-ring-ref")), None);
    }

    #[test]
    fn a_netback_that_does_not_let_go_fails_the_close_in_bounded_time() {
        let store = offer(None, None);
        let connected = run(&store, 1);
        let clock = Cell::new(0u64);
        let mut now = || clock.get();
        let mut pause = || clock.set(clock.get() + 100);
        let mut shim = Shim(&store);
        assert_eq!(
            disconnect(
                &mut shim,
                DIR,
                BACKEND,
                &connected.published,
                &mut now,
                &mut pause
            ),
            Err(VifError::BackendTimeout {
                wanted: XenbusState::Closing,
                state: XenbusState::Connected
            })
        );
        assert!(clock.get() <= BACKEND_WAIT_MS + 100);
        // Not let go: the rings' keys stay.
        assert_eq!(store.borrow().get(&format!("{DIR}/tx-ring-ref")), Some("1"));
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
