// SPDX-License-Identifier: MIT OR Apache-2.0
//! Backend side of the xenbus handshake for one virtual block device, as a state
//! machine over [`XenStore`]. The kernel calls [`BlkifBackend::probe`] once, then
//! [`BlkifBackend::step`] whenever a watch on the frontend's `state` or on the backend
//! directory fires (and again soon after a `Retry`, or at a `RetryAt`'s time). Rings and
//! engines are created and destroyed through [`ConnectionHooks`].

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use blkdev::Geometry;

use crate::abi::{Protocol, MAX_INDIRECT_SEGMENTS, MAX_RING_PAGE_ORDER};
use crate::engine::Busy;
use crate::keys::{
    self, numbered, DEVICE_TYPE, DISCARD_ALIGNMENT, DISCARD_ENABLE, DISCARD_GRANULARITY,
    DISCARD_SECURE, EVENT_CHANNEL, FAULT, FEATURE_BARRIER, FEATURE_DISCARD, FEATURE_FLUSH_CACHE,
    FEATURE_LARGE_SECTOR_SIZE, FEATURE_MAX_INDIRECT_SEGMENTS, FEATURE_PERSISTENT, INFO, MODE,
    MULTI_QUEUE_MAX_QUEUES, MULTI_QUEUE_NUM_QUEUES, PARAMS, PHYSICAL_SECTOR_SIZE, PROTOCOL,
    QUEUE_N, RESIZE, RING_PAGE_ORDER, RING_REF, RING_REF_N, SECTORS, SECTOR_SIZE,
};
use xen::xenbus::error::{self as xenbus_error, errno, Errno};
use xen::xenbus::keys::{ERROR, FRONTEND, FRONTEND_ID, HOTPLUG_STATUS, ONLINE, STATE};
use xen::xenbus::retry::RETRY_NS;
use xen::xenbus::{StoreError, XenStore, NO_TRANSACTION};

/// The state `step` switches to, and [`BlkifBackend::state`].
pub use xen::xenbus::XenbusState;

/// `info` bits (`VDISK_*` in blkif.h).
pub const VDISK_CDROM: u32 = 1;
pub const VDISK_READONLY: u32 = 4;

/// What this backend offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendParams {
    /// `multi-queue-max-queues`: the vCPUs that serve rings.
    pub max_queues: u32,
    pub max_ring_page_order: u32,
    pub max_indirect_segments: u16,
    /// Offer `feature-persistent`.
    pub persistent_grants: bool,
    pub geometry: Geometry,
}

impl BackendParams {
    /// Frontends are offered persistent grants unless the kernel command line says
    /// `grants.persistent=off`.
    pub const OFFER_PERSISTENT_GRANTS: bool = true;

    pub fn new(max_queues: u32, geometry: Geometry) -> Self {
        Self {
            max_queues,
            max_ring_page_order: MAX_RING_PAGE_ORDER,
            max_indirect_segments: MAX_INDIRECT_SEGMENTS,
            persistent_grants: Self::OFFER_PERSISTENT_GRANTS,
            geometry,
        }
    }
}

/// One queue's ring as the frontend granted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueRing {
    /// One grant per ring page, in order.
    pub ring_refs: Vec<u32>,
    pub event_channel: u32,
    /// Where a previous blkdom image left the ring (a live upgrade, [`BlkifBackend::resume`]):
    /// its `rsp_prod`, every request before it answered. `None` for a ring the
    /// frontend initialised (from its keys).
    pub attach_at: Option<u32>,
}

/// Everything the frontend negotiated; enough to map rings and start engines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendConnection {
    pub frontend_id: u16,
    pub ring_order: u32,
    pub persistent_grants: bool,
    /// The device is read-only, or the toolstack's `mode` has no `w`, or its
    /// `device-type` is "cdrom".
    pub read_only: bool,
    /// Discards are served if the device can: the toolstack's `discard-enable` is not 0.
    pub discard: bool,
    pub max_indirect_segments: u16,
    /// The frontend's ABI (`protocol`: x86_64, or x86_32 translated).
    pub protocol: Protocol,
    pub queues: Vec<QueueRing>,
}

/// What the kernel does when the handshake says so.
pub trait ConnectionHooks {
    /// Why a connection failed; its text goes to the backend's `error` node, after
    /// "connecting rings: ", and with its errno to Linux's error node.
    type Error: core::error::Error + Errno;
    /// Map every ring, bind every event channel, start the engines.
    fn connect(&mut self, connection: &FrontendConnection) -> Result<(), Self::Error>;
    /// Stop and free everything of the current connection; `Busy` while requests are in
    /// flight (then it is called again). Must be idempotent: also called with nothing
    /// connected.
    fn disconnect(&mut self) -> Result<(), Busy>;
    /// A monotonic clock in nanoseconds (how long a detached device has said Closed).
    fn now_ns(&self) -> u64;
}

/// How long a device the toolstack detached says Closed before blkdom removes its
/// directory. libxl in dom0 waits for `state` = Closed, then for the directory to go;
/// when its watch fires it reads `state`, and a node already removed by then reads as
/// "backend wanted state 6 but it was removed", which fails `xl block-detach` (seen in a
/// loaded soak). Nothing tells the driver domain that libxl has read it, so the
/// directory stays this long; libxl's wait for the removal allows 10 s.
pub const DETACH_GRACE_NS: u64 = 3_000_000_000;

// `Busy` lives with the engine; it is an error here, where teardown answers it.
impl core::fmt::Display for Busy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} requests in flight", self.in_flight)
    }
}

impl core::error::Error for Busy {}

/// What `step` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// Nothing to do for the current states.
    Idle,
    /// Moved to this state.
    Switched(XenbusState),
    /// Waiting for in-flight requests to drain: call `step` again soon (the control
    /// path does every 5 ms).
    Retry,
    /// Nothing to do before this time ([`ConnectionHooks::now_ns`]'s clock): call `step`
    /// again then (or at the next watch event, which may come earlier). A detached device
    /// waiting out [`DETACH_GRACE_NS`] answers it with the grace's end, so it is stepped
    /// once when the grace is over, not every few milliseconds of it.
    RetryAt(u64),
    /// Negotiation failed; the reason is in the backend's `error` node, state Closing.
    Failed(String),
    /// The backend directory is gone: everything is torn down, drop this object.
    Removed,
}

impl StepOutcome {
    /// When, asked at `now`, this answer wants the next step; `None`: only at the next
    /// watch event.
    pub fn retry_due(&self, now: u64) -> Option<u64> {
        match *self {
            StepOutcome::Retry => Some(now.saturating_add(RETRY_NS)),
            StepOutcome::RetryAt(deadline) => Some(deadline),
            _ => None,
        }
    }
}

/// Errors while probing or reading the frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NegotiationError {
    Store(StoreError),
    /// A frontend key is missing or invalid.
    Frontend(String),
}

impl core::fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NegotiationError::Store(e) => write!(f, "xenstore: {e}"),
            NegotiationError::Frontend(reason) => f.write_str(reason),
        }
    }
}

impl core::error::Error for NegotiationError {}

impl Errno for NegotiationError {
    fn errno(&self) -> i32 {
        match self {
            NegotiationError::Store(error) => error.errno(),
            // Linux's connect_ring answers a bad frontend key with EINVAL.
            NegotiationError::Frontend(_) => errno::EINVAL,
        }
    }
}

impl From<StoreError> for NegotiationError {
    fn from(error: StoreError) -> Self {
        NegotiationError::Store(error)
    }
}

/// The backend of one vbd (`/local/domain/<us>/backend/vbd/<fe>/<dev>`).
#[derive(Debug)]
pub struct BlkifBackend {
    backend_path: String,
    frontend_path: String,
    frontend_id: u16,
    params: BackendParams,
    read_only: bool,
    /// The toolstack's `discard-enable` is not 0 (xl's `no-discard` writes 0).
    discard: bool,
    /// `device-type` is "cdrom": `info` says `VDISK_CDROM` (and the disk is read-only).
    cdrom: bool,
    state: XenbusState,
    removed: bool,
    /// The frontend closed (or vanished) while requests were in flight: the connection
    /// is being torn down. Meanwhile the backend says Closing, never Connected; once the
    /// hooks report the teardown done it says Closed and reacts to whatever state the
    /// frontend is in by then (it may already be reconnecting).
    tearing_down: bool,
    /// A refused connection's teardown answered `Busy` (rings of it its hooks had
    /// already handed out and not got back yet): every step asks the hooks again, and
    /// answers `Retry`, until they let go of everything. Meanwhile the backend says
    /// Closing, as it does after any refusal; what the failed connection took (device
    /// queues, shares of the grant budget) is released once the hooks report it done,
    /// not only when the frontend closes.
    releasing: bool,
    /// Connections refused so far (each `Failed`): a frontend retrying bad keys shows
    /// here, not only in the last `error`.
    refused_connections: u64,
    /// When the backend first said Closed to a toolstack that had detached the device:
    /// from then on it only waits out [`DETACH_GRACE_NS`] and removes its directory.
    closed_for_toolstack_at: Option<u64>,
    /// blkdom is shutting down (`shut_down`): the device closes whatever the frontend
    /// does, and `step` connects nothing again.
    shutting_down: bool,
}

fn read_u32(store: &mut dyn XenStore, path: &str) -> Result<Option<u32>, NegotiationError> {
    match store.read(NO_TRANSACTION, path) {
        Ok(value) => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| NegotiationError::Frontend(format!("{path}: not a number: {value:?}"))),
        Err(StoreError::NotFound) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

fn required_u32(store: &mut dyn XenStore, path: &str) -> Result<u32, NegotiationError> {
    read_u32(store, path)?.ok_or_else(|| NegotiationError::Frontend(format!("{path} missing")))
}

impl BlkifBackend {
    /// Read where the frontend lives, publish the features a frontend needs before it
    /// starts, mark the device hot-plugged, and enter InitWait.
    pub fn probe(
        store: &mut dyn XenStore,
        backend_path: &str,
        params: BackendParams,
    ) -> Result<Self, NegotiationError> {
        let mut backend = Self::read_toolstack_keys(store, backend_path, params)?;
        let early = [
            (
                FEATURE_MAX_INDIRECT_SEGMENTS,
                params.max_indirect_segments.to_string(),
            ),
            (MULTI_QUEUE_MAX_QUEUES, params.max_queues.to_string()),
            (
                keys::MAX_RING_PAGE_ORDER,
                params.max_ring_page_order.to_string(),
            ),
            // No hotplug script runs for us: say the device is ready ourselves.
            (HOTPLUG_STATUS, "connected".to_string()),
        ];
        for (key, value) in &early {
            store.write(NO_TRANSACTION, &backend.key(key), value)?;
        }
        backend.switch(store, XenbusState::InitWait)?;
        Ok(backend)
    }

    /// The backend as the toolstack's keys describe it (where the frontend is, the mode,
    /// the device type, discard), writing nothing; state Initialising.
    fn read_toolstack_keys(
        store: &mut dyn XenStore,
        backend_path: &str,
        params: BackendParams,
    ) -> Result<Self, NegotiationError> {
        let frontend_path = store.read(NO_TRANSACTION, &format!("{backend_path}/{FRONTEND}"))?;
        let frontend_id = required_u32(store, &format!("{backend_path}/{FRONTEND_ID}"))?;
        let frontend_id = u16::try_from(frontend_id).map_err(|_| {
            NegotiationError::Frontend(format!("{FRONTEND_ID} {frontend_id} out of range"))
        })?;
        let mode = store
            .read(NO_TRANSACTION, &format!("{backend_path}/{MODE}"))
            .ok();
        // Linux's rule (`!strchr(mode, 'w')`): writable when `mode` has a `w` ("w", or
        // "w!" for a disk shared writable by force); "r", or anything else, is read-only.
        // Absent, the disk is writable (as the device allows).
        let mode_read_only = mode.as_deref().is_some_and(|m| !m.contains('w'));
        // xl's `devtype=cdrom` writes `device-type` = "cdrom" in both directories; Linux
        // reads the frontend's. Either makes a CD-ROM, served read-only whatever `mode`
        // says (a CD is not written; xl makes them read-only too).
        let cdrom = [backend_path, frontend_path.trim()].iter().any(|dir| {
            store
                .read(NO_TRANSACTION, &format!("{dir}/{DEVICE_TYPE}"))
                .is_ok_and(|kind| kind.trim() == "cdrom")
        });
        let read_only = params.geometry.read_only || mode_read_only || cdrom;
        // As Linux's `xenbus_read_unsigned(.., "discard-enable", 1)`: only a number 0
        // turns discard off; absent or unreadable leaves it on.
        let discard = store
            .read(NO_TRANSACTION, &format!("{backend_path}/{DISCARD_ENABLE}"))
            .map_or(true, |value| value.trim().parse::<u32>() != Ok(0));
        Ok(Self {
            backend_path: backend_path.to_string(),
            frontend_path: frontend_path.trim().to_string(),
            frontend_id,
            params,
            read_only,
            discard,
            cdrom,
            state: XenbusState::Initialising,
            removed: false,
            tearing_down: false,
            releasing: false,
            refused_connections: 0,
            closed_for_toolstack_at: None,
            shutting_down: false,
        })
    }

    /// Takes over a vbd a previous blkdom image served until a live upgrade
    /// (docs/design.md §4.12): its frontend is Connected and saw nothing. Reads the
    /// toolstack's keys as `probe` does and writes nothing to xenstore. The backend must
    /// still say Connected, and `connection` (the handover's, every queue with its
    /// `attach_at`) must be one this backend could have accepted; the keys the old image
    /// published (`published`) must be exactly what this one would publish, since
    /// blkfront never reads them again. Then the hooks re-attach the rings (`connect`,
    /// each engine at its `attach_at`) and the device serves: `Switched(Connected)`.
    /// Otherwise the device is failed as a refused connection is (`Failed`: the reason
    /// in `error`, Closing): its guest sees I/O errors, never different features.
    pub fn resume<H: ConnectionHooks + ?Sized>(
        store: &mut dyn XenStore,
        backend_path: &str,
        params: BackendParams,
        connection: &FrontendConnection,
        published: &[(String, String)],
        hooks: &mut H,
    ) -> Result<(Self, StepOutcome), NegotiationError> {
        let mut backend = Self::read_toolstack_keys(store, backend_path, params)?;
        let state = store.read(NO_TRANSACTION, &backend.key(STATE))?;
        backend.state = XenbusState::parse(&state);
        if backend.state != XenbusState::Connected {
            let reason = format!("live upgrade: the backend says {state:?}, not Connected");
            let outcome = backend.fail(store, errno::EINVAL, reason)?;
            return Ok((backend, outcome));
        }
        if let Err(reason) = backend.check_resumed(connection, published) {
            let outcome = backend.fail(store, errno::EINVAL, format!("live upgrade: {reason}"))?;
            return Ok((backend, outcome));
        }
        if let Err(error) = hooks.connect(connection) {
            backend.releasing = hooks.disconnect().is_err();
            let reason = format!("live upgrade: re-attaching rings: {error}");
            let outcome = backend.fail(store, error.errno(), reason)?;
            return Ok((backend, outcome));
        }
        log::info!(
            "blkback: {} re-attached: {} queue(s) at rsp_prod {:?}",
            backend.backend_path,
            connection.queues.len(),
            connection
                .queues
                .iter()
                .map(|q| q.attach_at.unwrap_or(0))
                .collect::<Vec<_>>()
        );
        Ok((backend, StepOutcome::Switched(XenbusState::Connected)))
    }

    /// Why `connection` and `published` are not what this backend would have connected
    /// and published, if they are not.
    fn check_resumed(
        &self,
        connection: &FrontendConnection,
        published: &[(String, String)],
    ) -> Result<(), String> {
        let c = connection;
        let p = &self.params;
        if c.frontend_id != self.frontend_id {
            return Err(format!(
                "frontend {} handed over, the toolstack says {}",
                c.frontend_id, self.frontend_id
            ));
        }
        if c.ring_order > p.max_ring_page_order
            || c.queues.is_empty()
            || c.queues.len() > p.max_queues as usize
            || (c.persistent_grants && !p.persistent_grants)
            || c.max_indirect_segments != p.max_indirect_segments
            || c.read_only != self.read_only
            || c.discard != self.discard
        {
            return Err(format!("a connection this image would not make: {c:?}"));
        }
        for (q, queue) in c.queues.iter().enumerate() {
            if queue.ring_refs.len() != 1 << c.ring_order || queue.attach_at.is_none() {
                return Err(format!("queue {q}: {queue:?}"));
            }
        }
        let ours = self.device_keys();
        if ours.len() != published.len() {
            return Err(format!(
                "{} keys published, this image would publish {}",
                published.len(),
                ours.len()
            ));
        }
        for (key, value) in &ours {
            match published.iter().find(|(k, _)| k == key) {
                Some((_, theirs)) if theirs == value => {}
                Some((_, theirs)) => {
                    return Err(format!(
                        "{key} was {theirs:?}, this image would say {value:?}"
                    ))
                }
                None => return Err(format!("{key} was not published")),
            }
        }
        Ok(())
    }

    /// What this backend publishes at connect, key and value (the offers, whatever the
    /// connection negotiated): what a live upgrade hands over, so that the next image can
    /// check it would publish the same.
    pub fn published_keys(&self) -> Vec<(String, String)> {
        self.device_keys()
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect()
    }

    pub fn state(&self) -> XenbusState {
        self.state
    }

    /// Whether a refused connection is still being released (its teardown waits for
    /// the hooks): `step` is to be called again soon, as after `Retry`.
    pub fn releasing(&self) -> bool {
        self.releasing
    }

    /// Connections refused since the probe (negotiation failures: bad frontend keys, or
    /// rings that could not be connected).
    pub fn refused_connections(&self) -> u64 {
        self.refused_connections
    }

    pub fn frontend_path(&self) -> &str {
        &self.frontend_path
    }

    pub fn backend_path(&self) -> &str {
        &self.backend_path
    }

    /// Paths whose watches should call `step`.
    pub fn watched_paths(&self) -> [String; 2] {
        [
            format!("{}/{STATE}", self.frontend_path),
            self.backend_path.clone(),
        ]
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{}", self.backend_path, name)
    }

    fn switch(&mut self, store: &mut dyn XenStore, state: XenbusState) -> Result<(), StoreError> {
        store.write(
            NO_TRANSACTION,
            &self.key(STATE),
            &(state as u32).to_string(),
        )?;
        self.state = state;
        Ok(())
    }

    /// React to the current frontend state (and to removal of our directory).
    pub fn step<H: ConnectionHooks + ?Sized>(
        &mut self,
        store: &mut dyn XenStore,
        hooks: &mut H,
    ) -> Result<StepOutcome, NegotiationError> {
        if self.removed {
            return Ok(StepOutcome::Removed);
        }
        if self.shutting_down {
            if self.state == XenbusState::Closed {
                return Ok(StepOutcome::Idle);
            }
            return self.shut_down(store, hooks);
        }
        if self.removed_by_toolstack(store) {
            // The toolstack removed the device: tear down, then forget it.
            if hooks.disconnect().is_err() {
                return Ok(StepOutcome::Retry);
            }
            return Ok(self.forget_removed(store));
        }
        if self.releasing {
            if hooks.disconnect().is_err() {
                return Ok(StepOutcome::Retry);
            }
            self.releasing = false;
        }
        let frontend_state =
            match store.read(NO_TRANSACTION, &format!("{}/{STATE}", self.frontend_path)) {
                Ok(value) => XenbusState::parse(&value),
                // Gone, or no longer ours to read: xenstored refuses reads of a dying
                // domain's nodes (EACCES) before the toolstack removes them. Either way the
                // frontend is not there any more (Linux reads it as XenbusStateUnknown).
                Err(StoreError::NotFound | StoreError::Failed(_)) => XenbusState::Unknown,
                Err(error) => return Err(error.into()),
            };
        if self.tearing_down {
            if hooks.disconnect().is_err() {
                return Ok(StepOutcome::Retry);
            }
            self.tearing_down = false;
            self.switch(store, XenbusState::Closed)?;
            return Ok(match self.react(store, hooks, frontend_state)? {
                StepOutcome::Idle => StepOutcome::Switched(XenbusState::Closed),
                outcome => outcome,
            });
        }
        self.react(store, hooks, frontend_state)
    }

    /// The step for `frontend_state`, with no teardown pending.
    fn react<H: ConnectionHooks + ?Sized>(
        &mut self,
        store: &mut dyn XenStore,
        hooks: &mut H,
        frontend_state: XenbusState,
    ) -> Result<StepOutcome, NegotiationError> {
        if self.state == XenbusState::Closed && self.closed_for_toolstack_at.is_some() {
            // Detached: whatever the frontend does now, the device only goes away.
            return self.remove_once_seen(store, hooks);
        }
        match frontend_state {
            XenbusState::Initialising if self.state == XenbusState::Closed => {
                // 6 -> 1: the frontend reconnects.
                self.switch(store, XenbusState::InitWait)?;
                Ok(StepOutcome::Switched(XenbusState::InitWait))
            }
            XenbusState::Initialising if self.state == XenbusState::Connected => {
                // The frontend started over without our seeing it close (its Closed and
                // Initialising were read by one step): close as for Closed, then wait for
                // it again. Left Connected, the backend would keep the abandoned rings
                // and take the frontend's next Initialised for the connection it has.
                match self.close_for_frontend(store, hooks)? {
                    StepOutcome::Switched(XenbusState::Closed) => {
                        self.switch(store, XenbusState::InitWait)?;
                        Ok(StepOutcome::Switched(XenbusState::InitWait))
                    }
                    outcome => Ok(outcome),
                }
            }
            XenbusState::Initialised | XenbusState::Connected => {
                match self.state {
                    // Two watches in quick succession can both land here: connect once.
                    // (Connected always means the rings are connected: a close that
                    // has to wait for requests leaves it at once, see `tearing_down`.)
                    XenbusState::Connected => return Ok(StepOutcome::Idle),
                    // A failed negotiation, or a frontend that said Closing: it closes
                    // before it connects again.
                    XenbusState::Closing => return Ok(StepOutcome::Idle),
                    // Closed and the frontend is back without our having seen it
                    // Initialising (its writes came as one watch event): connect, unless
                    // the toolstack detached the device.
                    XenbusState::Closed if self.detached_by_toolstack(store) => {
                        return self.remove_once_seen(store, hooks)
                    }
                    _ => {}
                }
                // Whatever a previous connection left must be gone before mapping anew.
                if hooks.disconnect().is_err() {
                    return Ok(StepOutcome::Retry);
                }
                self.connect(store, hooks)
            }
            XenbusState::Closing
                if self.state != XenbusState::Closing && self.state != XenbusState::Closed =>
            {
                self.switch(store, XenbusState::Closing)?;
                Ok(StepOutcome::Switched(XenbusState::Closing))
            }
            XenbusState::Closed | XenbusState::Unknown if self.state != XenbusState::Closed => {
                self.close_for_frontend(store, hooks)
            }
            _ if self.state == XenbusState::Closed && self.detached_by_toolstack(store) => {
                self.remove_once_seen(store, hooks)
            }
            _ => Ok(StepOutcome::Idle),
        }
    }

    /// The frontend closed (or went away, or started over): release its rings and say
    /// Closed, or `Retry` (saying Closing meanwhile) while its requests drain.
    fn close_for_frontend<H: ConnectionHooks + ?Sized>(
        &mut self,
        store: &mut dyn XenStore,
        hooks: &mut H,
    ) -> Result<StepOutcome, NegotiationError> {
        if hooks.disconnect().is_err() {
            // The rings go away as soon as the requests drain: the backend stops
            // saying Connected now, not once the drain is over.
            self.tearing_down = true;
            if self.state != XenbusState::Closing {
                self.switch(store, XenbusState::Closing)?;
            }
            return Ok(StepOutcome::Retry);
        }
        self.switch(store, XenbusState::Closed)?;
        if self.detached_by_toolstack(store) {
            return self.remove_once_seen(store, hooks);
        }
        Ok(StepOutcome::Switched(XenbusState::Closed))
    }

    /// blkdom is going away (`xl shutdown`, `xl reboot`): the device closes as it does
    /// when its frontend closes, on the backend's initiative. The rings stop taking
    /// requests, those in flight are answered, and everything is unmapped and unbound
    /// (the hooks' `disconnect`), while the backend says Closing (Linux's blkfront then
    /// fails the disk's I/O and closes); once it is all released, Closed. `Retry` while
    /// requests drain, then `Switched(Closed)` (also for a device closed already). From
    /// the first call on, `step` only finishes this.
    pub fn shut_down<H: ConnectionHooks + ?Sized>(
        &mut self,
        store: &mut dyn XenStore,
        hooks: &mut H,
    ) -> Result<StepOutcome, NegotiationError> {
        if self.removed {
            return Ok(StepOutcome::Removed);
        }
        self.shutting_down = true;
        let gone = self.removed_by_toolstack(store);
        if hooks.disconnect().is_err() {
            if !gone && self.state != XenbusState::Closing && self.state != XenbusState::Closed {
                self.switch(store, XenbusState::Closing)?;
            }
            return Ok(StepOutcome::Retry);
        }
        self.tearing_down = false;
        if gone {
            // The toolstack removed the device meanwhile: nothing to write it to.
            return Ok(self.forget_removed(store));
        }
        self.releasing = false;
        if self.state != XenbusState::Closed {
            // The frontend hears Closing first, as when a frontend's close drains.
            if self.state != XenbusState::Closing {
                self.switch(store, XenbusState::Closing)?;
            }
            self.switch(store, XenbusState::Closed)?;
        }
        Ok(StepOutcome::Switched(XenbusState::Closed))
    }

    /// The toolstack removed the device and its rings are released: forget it, with the
    /// error node Linux would have removed with it. No node is left to write its state
    /// to, but it is closed; from now on every call answers `Removed`.
    fn forget_removed(&mut self, store: &mut dyn XenStore) -> StepOutcome {
        self.removed = true;
        self.releasing = false;
        self.remove_error_directory(store);
        self.state = XenbusState::Closed;
        StepOutcome::Removed
    }

    /// The toolstack removed the device (its `state` node is gone).
    fn removed_by_toolstack(&self, store: &mut dyn XenStore) -> bool {
        matches!(
            store.read(NO_TRANSACTION, &self.key(STATE)),
            Err(StoreError::NotFound)
        )
    }

    /// `xl block-detach` writes `online` = 0 (and our state = Closing); once the device
    /// is closed the backend is to go away.
    fn detached_by_toolstack(&self, store: &mut dyn XenStore) -> bool {
        store
            .read(NO_TRANSACTION, &self.key(ONLINE))
            .is_ok_and(|value| value.trim() == "0")
    }

    /// The device is closed and detached: its directory goes once the toolstack has had
    /// [`DETACH_GRACE_NS`] to read `state` = Closed; until then `RetryAt` its end.
    fn remove_once_seen<H: ConnectionHooks + ?Sized>(
        &mut self,
        store: &mut dyn XenStore,
        hooks: &H,
    ) -> Result<StepOutcome, NegotiationError> {
        let now = hooks.now_ns();
        let since = *self.closed_for_toolstack_at.get_or_insert(now);
        if now.saturating_sub(since) < DETACH_GRACE_NS {
            return Ok(StepOutcome::RetryAt(since.saturating_add(DETACH_GRACE_NS)));
        }
        self.remove_own_directory(store)
    }

    /// A driver domain removes its own backend directory of a detached device (libxl in
    /// dom0 waits for that; for a Linux driver domain `xl devd` does it), and the
    /// per-frontend directory above it once empty.
    fn remove_own_directory(
        &mut self,
        store: &mut dyn XenStore,
    ) -> Result<StepOutcome, NegotiationError> {
        match store.rm(NO_TRANSACTION, &self.backend_path) {
            Ok(()) | Err(StoreError::NotFound) => {}
            Err(error) => return Err(error.into()),
        }
        if let Some((parent, _)) = self.backend_path.rsplit_once('/') {
            if store
                .directory(NO_TRANSACTION, parent)
                .is_ok_and(|children| children.is_empty())
            {
                let _ = store.rm(NO_TRANSACTION, parent);
            }
        }
        self.remove_error_directory(store);
        self.removed = true;
        log::info!(
            "blkback: {} detached by the toolstack; removed",
            self.backend_path
        );
        Ok(StepOutcome::Removed)
    }

    /// The device is gone: so is what Linux's error node said about it (the toolstack
    /// removes the backend directory, not this one).
    fn remove_error_directory(&self, store: &mut dyn XenStore) {
        if let Some(directory) = xenbus_error::error_directory(&self.backend_path) {
            let _ = store.rm(NO_TRANSACTION, &directory);
        }
    }

    fn connect<H: ConnectionHooks + ?Sized>(
        &mut self,
        store: &mut dyn XenStore,
        hooks: &mut H,
    ) -> Result<StepOutcome, NegotiationError> {
        let connection = match self.read_frontend(store) {
            Ok(connection) => connection,
            Err(NegotiationError::Frontend(reason)) => {
                return self.fail(store, errno::EINVAL, reason)
            }
            Err(error) => return Err(error),
        };
        if let Err(reason) = hooks.connect(&connection) {
            // What the attempt took goes now, or at the next steps if the hooks must
            // wait for it (`releasing`).
            self.releasing = hooks.disconnect().is_err();
            return self.fail(store, reason.errno(), format!("connecting rings: {reason}"));
        }
        self.publish_device(store)?;
        self.switch(store, XenbusState::Connected)?;
        log::info!(
            "blkback: {} connected: {} queue(s), ring order {}, persistent grants {}, {}",
            self.backend_path,
            connection.queues.len(),
            connection.ring_order,
            connection.persistent_grants,
            connection.protocol.name()
        );
        Ok(StepOutcome::Switched(XenbusState::Connected))
    }

    /// The disk now has `sectors` sectors (an operator resized it, and every ring's
    /// engine already checks requests against the new size). As Linux's
    /// `xen_vbd_resize`: `sectors` and, while connected, `state` again, in one
    /// transaction (redone on `EAGAIN`), so a connected blkfront re-reads the size; a
    /// later connection publishes it too. [`RESIZE`] says so, and an error node
    /// left by an earlier refused resize goes.
    pub fn resized(
        &mut self,
        store: &mut dyn XenStore,
        sectors: u64,
    ) -> Result<(), NegotiationError> {
        self.params.geometry.sectors = sectors;
        let mut keys = alloc::vec![
            (SECTORS, sectors.to_string()),
            (RESIZE, format!("{sectors} sectors")),
        ];
        if self.state == XenbusState::Connected {
            keys.push((STATE, (self.state as u32).to_string()));
        }
        self.write_in_transaction(store, &keys)?;
        self.remove_error_directory(store);
        log::info!(
            "blkback: {}: resized to {sectors} sectors",
            self.backend_path
        );
        Ok(())
    }

    /// An operator's resize is refused: the disk keeps its size and `params` is written
    /// back as `served` (what the disk is), the reason goes to [`RESIZE`] and, with
    /// its errno, where Linux's `xenbus_dev_error` leaves it; the disk keeps serving.
    pub fn refuse_resize(
        &self,
        store: &mut dyn XenStore,
        served: &str,
        errno: i32,
        reason: &str,
    ) -> Result<(), NegotiationError> {
        log::error!("blkback: {}: resize refused: {reason}", self.backend_path);
        store.write(NO_TRANSACTION, &self.key(PARAMS), served)?;
        store.write(
            NO_TRANSACTION,
            &self.key(RESIZE),
            &format!("refused: {reason}"),
        )?;
        if let Some(node) = xenbus_error::error_node(&self.backend_path) {
            let text = format!("resize refused: {reason}");
            store.write(
                NO_TRANSACTION,
                &node,
                &xenbus_error::error_text(errno, &text),
            )?;
        }
        Ok(())
    }

    /// The disk's device failed (a command got no completion within the deadline, the
    /// device reported a fatal error, or a queue of another disk on it did): the reason
    /// goes to [`FAULT`] and, as EIO, where Linux's `xenbus_dev_error` leaves it.
    /// The vbd stays as it is: every request is answered `BLKIF_RSP_ERROR` (the guest
    /// sees I/O errors) until the frontend closes, which works as ever.
    pub fn device_failed(
        &self,
        store: &mut dyn XenStore,
        reason: &str,
    ) -> Result<(), NegotiationError> {
        log::error!("blkback: {}: device failed: {reason}", self.backend_path);
        store.write(NO_TRANSACTION, &self.key(FAULT), reason)?;
        if let Some(node) = xenbus_error::error_node(&self.backend_path) {
            let text = format!("device failed: {reason}");
            store.write(
                NO_TRANSACTION,
                &node,
                &xenbus_error::error_text(xenbus_error::errno::EIO, &text),
            )?;
        }
        Ok(())
    }

    /// `xenbus_dev_fatal`: leave the reason in `error` (and, with its errno, where Linux
    /// leaves it) and close.
    fn fail(
        &mut self,
        store: &mut dyn XenStore,
        errno: i32,
        reason: String,
    ) -> Result<StepOutcome, NegotiationError> {
        log::error!("blkback: {}: {}", self.backend_path, reason);
        self.refused_connections += 1;
        store.write(NO_TRANSACTION, &self.key(ERROR), &reason)?;
        if let Some(node) = xenbus_error::error_node(&self.backend_path) {
            store.write(
                NO_TRANSACTION,
                &node,
                &xenbus_error::error_text(errno, &reason),
            )?;
        }
        self.switch(store, XenbusState::Closing)?;
        Ok(StepOutcome::Failed(reason))
    }

    /// Read and check the frontend's keys (`connect_ring` in Linux's xenbus.c).
    pub fn read_frontend(
        &self,
        store: &mut dyn XenStore,
    ) -> Result<FrontendConnection, NegotiationError> {
        let fe = &self.frontend_path;
        let bad = |reason: String| Err(NegotiationError::Frontend(reason));
        let ring_order = read_u32(store, &format!("{fe}/{RING_PAGE_ORDER}"))?.unwrap_or(0);
        if ring_order > self.params.max_ring_page_order {
            return bad(format!(
                "{RING_PAGE_ORDER} {ring_order} > max {}",
                self.params.max_ring_page_order
            ));
        }
        let queue_count = read_u32(store, &format!("{fe}/{MULTI_QUEUE_NUM_QUEUES}"))?.unwrap_or(1);
        if queue_count == 0 || queue_count > self.params.max_queues {
            return bad(format!(
                "{MULTI_QUEUE_NUM_QUEUES} {queue_count}: must be 1..={}",
                self.params.max_queues
            ));
        }
        // Absent: x86_64 (every 64-bit frontend writes it; Linux would assume x86_32).
        let protocol = match store.read(NO_TRANSACTION, &format!("{fe}/{PROTOCOL}")) {
            Err(StoreError::NotFound) => Protocol::X86_64,
            Ok(value) => match Protocol::parse(&value) {
                Some(protocol) => protocol,
                None => {
                    return bad(format!(
                        "unknown protocol {value:?}: x86_64-abi and x86_32-abi are served"
                    ))
                }
            },
            Err(error) => return Err(error.into()),
        };
        // Linux's blkfront (and Windows' since it has the key) counts every sector
        // quantity in 512-byte units and takes `sector-size` as the logical block size,
        // as blkdom serves them. A frontend with `feature-large-sector-size` counts in
        // `sector-size` units instead (QEMU's qdisk serves that): on a disk whose blocks
        // are not 512 bytes it would reach the wrong sectors, so it is refused. With
        // 512-byte blocks the two counts are the same.
        let block_size = self.params.geometry.logical_block_size;
        let large_sectors = read_u32(store, &format!("{fe}/{FEATURE_LARGE_SECTOR_SIZE}"))?;
        if large_sectors.is_some_and(|flag| flag != 0) && block_size != 512 {
            return bad(format!(
                "{FEATURE_LARGE_SECTOR_SIZE}: the frontend counts sectors in units of \
                 {SECTOR_SIZE} ({block_size} bytes); blkdom counts 512-byte sectors (as \
                 Linux blkback does): refused rather than serve the wrong sectors"
            ));
        }
        // Both sides write what they offer (Linux since 2022; before, blkback wrote the
        // result, which every blkfront reads the same way): used when both offer.
        let persistent = self.params.persistent_grants
            && read_u32(store, &format!("{fe}/{FEATURE_PERSISTENT}"))?.unwrap_or(0) == 1;
        let mut queues = Vec::with_capacity(queue_count as usize);
        for q in 0..queue_count {
            let dir = if queue_count == 1 {
                fe.clone()
            } else {
                format!("{fe}/{}", numbered(QUEUE_N, q))
            };
            let event_channel = required_u32(store, &format!("{dir}/{EVENT_CHANNEL}"))?;
            let ring_refs = if ring_order == 0 {
                // Frontends write `ring-ref` for a one-page ring (some write `ring-ref0`).
                match read_u32(store, &format!("{dir}/{RING_REF}"))? {
                    Some(gref) => alloc::vec![gref],
                    None => alloc::vec![required_u32(
                        store,
                        &format!("{dir}/{}", numbered(RING_REF_N, 0))
                    )?],
                }
            } else {
                (0..1u32 << ring_order)
                    .map(|i| required_u32(store, &format!("{dir}/{}", numbered(RING_REF_N, i))))
                    .collect::<Result<Vec<u32>, _>>()?
            };
            queues.push(QueueRing {
                ring_refs,
                event_channel,
                attach_at: None,
            });
        }
        Ok(FrontendConnection {
            frontend_id: self.frontend_id,
            ring_order,
            persistent_grants: persistent,
            read_only: self.read_only,
            discard: self.discard,
            max_indirect_segments: self.params.max_indirect_segments,
            protocol,
            queues,
        })
    }

    /// The `info` bits. No `VDISK_REMOVABLE`: Linux sets it only for a device with
    /// removable media, which none of ours has (not for `device-type` "cdrom").
    fn info(&self) -> u32 {
        let cdrom = if self.cdrom { VDISK_CDROM } else { 0 };
        let read_only = if self.read_only { VDISK_READONLY } else { 0 };
        cdrom | read_only
    }

    /// Publish the device in one transaction (redone on `EAGAIN`).
    fn publish_device(&self, store: &mut dyn XenStore) -> Result<(), NegotiationError> {
        let keys = self.device_keys();
        self.write_in_transaction(store, &keys)
    }

    /// The keys `publish_device` writes, with their values.
    fn device_keys(&self) -> Vec<(&'static str, String)> {
        let g = self.params.geometry;
        // Discard is offered when the device has it, the disk is writable and the
        // toolstack did not turn it off.
        let discard = g.discard.filter(|_| self.discard && !self.read_only);
        let flag = |on: bool| if on { "1" } else { "0" }.to_string();
        let mut keys = alloc::vec![
            (FEATURE_FLUSH_CACHE, flag(g.flush)),
            // Barriers are served as flushes.
            (FEATURE_BARRIER, flag(g.flush)),
            // The offer, not the result (Linux since 2022, "xen-blkback: Advertise
            // feature-persistent as user requested"): a frontend uses persistent grants
            // when it offered them and this says 1, as blkdom does when both did.
            (FEATURE_PERSISTENT, flag(self.params.persistent_grants)),
            (SECTORS, g.sectors.to_string()),
            (INFO, self.info().to_string()),
            (SECTOR_SIZE, g.logical_block_size.to_string()),
            (PHYSICAL_SECTOR_SIZE, g.physical_block_size.to_string()),
            (FEATURE_DISCARD, flag(discard.is_some())),
        ];
        if let Some(discard) = discard {
            keys.push((DISCARD_GRANULARITY, discard.granularity.to_string()));
            keys.push((DISCARD_ALIGNMENT, discard.alignment.to_string()));
            keys.push((DISCARD_SECURE, flag(discard.secure)));
        }
        keys
    }

    /// Writes `keys` under the backend directory in one transaction (redone on `EAGAIN`).
    fn write_in_transaction(
        &self,
        store: &mut dyn XenStore,
        keys: &[(&str, String)],
    ) -> Result<(), NegotiationError> {
        Ok(xen::xenbus::write_in_transaction(
            store,
            &self.backend_path,
            keys,
        )?)
    }
}
