// SPDX-License-Identifier: MIT OR Apache-2.0
//! The frontend's side of the xenbus handshake, written by hand so that any key can be
//! wrong: a virtual block device of this guest (`device/vbd/<id>`, made by the toolstack
//! like any disk; the guest loaded no blkfront, so nobody else drives it), its rings
//! shared through gntalloc, its event channels.

use std::thread::sleep;
use std::time::{Duration, Instant};

use blkback::abi::sring;
use blkback::fake::FrontRing;
use blkback::ring::RingMemory;
use xen::xenstore::{Transaction, XenstoreClient};

use crate::attacks::Peer;
use crate::sys::{Evtchn, Gntalloc, Grants, SharedPages, Xenbus};

/// `enum xenbus_state` values the handshake uses.
pub const INITIALISING: u32 = 1;
pub const INIT_WAIT: u32 = 2;
pub const INITIALISED: u32 = 3;
pub const CONNECTED: u32 = 4;
pub const CLOSING: u32 = 5;
pub const CLOSED: u32 = 6;

/// Frontend keys (relative to the device's directory) and their values.
pub type Keys = Vec<(String, String)>;

/// How long the backend may take to change state.
const STATE_TIMEOUT: Duration = Duration::from_secs(30);

/// The guest's devices and its xenstore connection.
pub struct Guest {
    pub xs: XenstoreClient<Xenbus>,
    pub gntalloc: Gntalloc,
    pub evtchn: Evtchn,
}

/// One of the guest's virtual block devices.
pub struct Vbd {
    /// `device/vbd/<id>`, relative to the guest's home.
    pub fe: String,
    /// The backend's directory (absolute).
    pub be: String,
    pub backend_id: u16,
}

impl Guest {
    pub fn open() -> std::io::Result<Self> {
        Ok(Self {
            xs: XenstoreClient::new(Xenbus::open()?),
            gntalloc: Gntalloc::open()?,
            evtchn: Evtchn::open()?,
        })
    }

    pub fn read(&mut self, path: &str) -> Option<String> {
        self.xs.read_string(Transaction::NONE, path).ok()
    }

    pub fn write(&mut self, path: &str, value: &str) -> Result<(), String> {
        self.xs
            .write(Transaction::NONE, path, value.as_bytes())
            .map_err(|e| format!("write {path}: {e}"))
    }

    /// This guest's virtual block devices.
    pub fn vbds(&mut self) -> Result<Vec<Vbd>, String> {
        let ids = self
            .xs
            .directory(Transaction::NONE, "device/vbd")
            .map_err(|e| format!("device/vbd: {e}"))?;
        ids.iter()
            .map(|id| {
                let fe = format!("device/vbd/{id}");
                let be = self
                    .read(&format!("{fe}/backend"))
                    .ok_or(format!("{fe}/backend missing"))?;
                let backend_id = self
                    .read(&format!("{fe}/backend-id"))
                    .and_then(|id| id.trim().parse().ok())
                    .ok_or(format!("{fe}/backend-id missing"))?;
                Ok(Vbd { fe, be, backend_id })
            })
            .collect()
    }

    pub fn backend_state(&mut self, vbd: &Vbd) -> u32 {
        self.read(&format!("{}/state", vbd.be))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Waits until the backend is in one of `states`; the one it reached, or the last
    /// one seen.
    pub fn wait_backend(&mut self, vbd: &Vbd, states: &[u32]) -> Result<u32, u32> {
        let start = Instant::now();
        loop {
            let state = self.backend_state(vbd);
            if states.contains(&state) {
                return Ok(state);
            }
            if start.elapsed() > STATE_TIMEOUT {
                return Err(state);
            }
            sleep(Duration::from_millis(20));
        }
    }

    pub fn set_state(&mut self, vbd: &Vbd, state: u32) -> Result<(), String> {
        self.write(&format!("{}/state", vbd.fe), &state.to_string())
    }

    /// Removes what an earlier attempt wrote (ring keys, queue directories, ...).
    pub fn clear_keys(&mut self, vbd: &Vbd) {
        let mut keys = vec![
            "ring-page-order".to_string(),
            "multi-queue-num-queues".into(),
            "event-channel".into(),
            "ring-ref".into(),
            "protocol".into(),
            "feature-persistent".into(),
        ];
        keys.extend((0..16).map(|i| format!("ring-ref{i}")));
        keys.extend((0..4).map(|q| format!("queue-{q}")));
        for key in keys {
            let _ = self.xs.rm(Transaction::NONE, &format!("{}/{key}", vbd.fe));
        }
    }

    /// Closes whatever the backend holds and waits until it offers a new connection
    /// (InitWait): Closed, then Initialising, each acknowledged.
    pub fn reset(&mut self, vbd: &Vbd) -> Result<(), String> {
        if self.backend_state(vbd) == INIT_WAIT {
            return Ok(());
        }
        self.set_state(vbd, CLOSED)?;
        self.wait_backend(vbd, &[CLOSED])
            .map_err(|s| format!("backend in state {s}, not Closed, after the frontend closed"))?;
        self.set_state(vbd, INITIALISING)?;
        self.wait_backend(vbd, &[INIT_WAIT])
            .map_err(|s| format!("backend in state {s}, not InitWait, after Initialising"))?;
        Ok(())
    }

    /// Writes `keys` (relative to the device), says Initialised, and waits for the
    /// backend to connect or refuse. `Err` holds the backend's `error` node.
    pub fn offer(&mut self, vbd: &Vbd, keys: &[(String, String)]) -> Result<(), String> {
        self.clear_keys(vbd);
        for (key, value) in keys {
            self.write(&format!("{}/{key}", vbd.fe), value)?;
        }
        self.set_state(vbd, INITIALISED)?;
        match self.wait_backend(vbd, &[CONNECTED, CLOSING, CLOSED]) {
            Ok(CONNECTED) => Ok(()),
            Ok(state) => Err(format!(
                "state {state}: {}",
                self.read(&format!("{}/error", vbd.be)).unwrap_or_default()
            )),
            Err(state) => Err(format!("no answer (backend state {state})")),
        }
    }
}

/// What a connection asks for.
#[derive(Clone, Copy, Debug)]
pub struct Offer {
    pub order: u32,
    pub queues: u32,
    pub persistent: bool,
}

/// One queue's ring, its grants and event channel.
pub struct Queue {
    pub ring: FrontRing<SharedPages>,
    pub port: u32,
    grants: Grants,
}

/// A connected device.
pub struct Session {
    pub queues: Vec<Queue>,
    /// The disk's size, as the backend published it.
    pub sectors: u64,
}

/// The keys of a well-formed offer for rings `refs` (per queue) and `ports`.
pub fn keys(offer: Offer, refs: &[Vec<u32>], ports: &[u32]) -> Keys {
    let mut keys = vec![
        ("protocol".to_string(), "x86_64-abi".to_string()),
        (
            "feature-persistent".into(),
            u32::from(offer.persistent).to_string(),
        ),
    ];
    if offer.order > 0 {
        keys.push(("ring-page-order".into(), offer.order.to_string()));
    }
    if offer.queues > 1 {
        keys.push(("multi-queue-num-queues".into(), offer.queues.to_string()));
    }
    for (q, (refs, port)) in refs.iter().zip(ports).enumerate() {
        let dir = if offer.queues > 1 {
            format!("queue-{q}/")
        } else {
            String::new()
        };
        keys.push((format!("{dir}event-channel"), port.to_string()));
        if offer.order == 0 {
            keys.push((format!("{dir}ring-ref"), refs[0].to_string()));
        } else {
            for (i, gref) in refs.iter().enumerate() {
                keys.push((format!("{dir}ring-ref{i}"), gref.to_string()));
            }
        }
    }
    keys
}

impl Guest {
    /// Connects `vbd` as `offer` says; on failure the device is left ready for the next
    /// attempt.
    pub fn connect(&mut self, vbd: &Vbd, offer: Offer) -> Result<Session, String> {
        self.reset(vbd)?;
        let mut queues = Vec::new();
        for _ in 0..offer.queues {
            let (grants, mem) = self
                .gntalloc
                .share(vbd.backend_id, 1 << offer.order, true)
                .map_err(|e| format!("granting a ring: {e}"))?;
            let port = self
                .evtchn
                .bind_unbound(vbd.backend_id)
                .map_err(|e| format!("event channel: {e}"))?;
            debug_assert!(mem.size_bytes() >= sring::HEADER_SIZE);
            queues.push(Queue {
                ring: FrontRing::new(mem, offer.order),
                port,
                grants,
            });
        }
        let refs: Vec<Vec<u32>> = queues.iter().map(|q| q.grants.refs.clone()).collect();
        let ports: Vec<u32> = queues.iter().map(|q| q.port).collect();
        if let Err(e) = self.offer(vbd, &keys(offer, &refs, &ports)) {
            let _ = self.reset(vbd);
            for port in ports {
                self.evtchn.unbind(port);
            }
            return Err(e);
        }
        self.set_state(vbd, CONNECTED)?;
        let sectors = self
            .read(&format!("{}/sectors", vbd.be))
            .and_then(|s| s.trim().parse().ok())
            .ok_or("no sectors from the backend")?;
        Ok(Session { queues, sectors })
    }

    /// Closes a session (the backend lets go of its rings and grants) and leaves the
    /// device ready for the next connection.
    pub fn disconnect(&mut self, vbd: &Vbd, session: Session) -> Result<(), String> {
        let result = self.reset(vbd);
        for queue in session.queues {
            self.evtchn.unbind(queue.port);
        }
        result
    }

    /// The backend of one queue, as the attacks drive it.
    pub fn peer(&self, port: u32) -> GuestPeer<'_> {
        GuestPeer {
            evtchn: &self.evtchn,
            port,
        }
    }
}

/// blkdom behind an event channel: notified with `EVTCHNOP_send`, waited for by sleeping.
pub struct GuestPeer<'a> {
    evtchn: &'a Evtchn,
    port: u32,
}

impl Peer for GuestPeer<'_> {
    fn notify(&mut self) {
        self.evtchn.notify(self.port);
    }
    fn pause(&mut self) {
        sleep(Duration::from_millis(2));
    }
}
