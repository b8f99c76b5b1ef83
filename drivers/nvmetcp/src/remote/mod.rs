// SPDX-License-Identifier: MIT OR Apache-2.0
//! A remote namespace served as a block device: one association with the target (an
//! admin queue and one or more I/O queues, each on its own TCP connection), the
//! channels of the disk queues that use it, and the reconnect loop.
//!
//! A remote asks the controller for the I/O queues it was made with
//! ([`Remote::with_io_queues`]: one per poller) and connects as many as the controller
//! allots. A request goes on the I/O queue of the vCPU that submitted it (modulo the
//! count: `Shared::producer_cpu`); a connection that breaks loses the whole
//! association, as on Linux's host.
//!
//! Runs where the network is driven (vCPU 0 in the image): [`Remote::poll`] moves
//! bytes through a [`Transport`] the caller owns, takes requests from every channel,
//! splits them into commands (at the controller's MDTS), copies data between TCP and
//! the guests' pages through [`Memory`], and completes them on their channels. The
//! queues (`DiskQueue`, a `BlockDevice`) live on whichever poller serves each ring.
//!
//! When a connection breaks, every request sent on it is held (not failed) and the
//! association is rebuilt as [`Reconnect`] says: at once, then every `delay_ms`; once
//! `give_up_ms` passed without a connection, every request held and every later one
//! fails and the queues report a fault (the disk reports it), until a disk is attached
//! on the namespace again ([`Remote::revive`]: one more round of attempts).
//!
//! Where the transport reaches the subsystem through other portals too
//! ([`Remote::with_other_paths`]), an association serving through a non-optimized ANA
//! path looks at the next of them every reconnect delay ([`Link::Probe`]) and moves to
//! one through which the group is optimized ([`Event::OptimizedElsewhere`],
//! [`Event::Moved`]).
//!
//! Once no disk is served from it, the association is closed as Linux's host closes
//! one at `nvme disconnect` ([`Remote::close`]): its I/O queues' connections first,
//! then the controller told of a normal shutdown on the admin queue and its
//! confirmation awaited, at most [`SHUTDOWN_MS`], then the admin queue's connection.

mod channel;
#[cfg(test)]
mod tests;

pub use channel::{DiskQueue, Shared, MAX_SEGMENTS, SLOTS};

use crate::queue::DataPort;
use crate::reconnect::{Action, Reconnect, ReconnectPolicy};
use crate::session::{AdminSession, ControllerInfo, HostIdentity, IoSession, NamespaceInfo};
use crate::sqe::Status;
use crate::{AnaPath, AnaState, Digests, Error, SessionState};
use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use blkdev::{DiscardGeometry, Geometry};
use channel::{Op, SlotRequest};
use core::fmt;
use core::sync::atomic::Ordering;

/// Commands one I/O queue has out at once (at most the controller's queue size).
pub const IO_DEPTH: usize = 128;
/// Channels (disk queues) one remote namespace serves at most.
pub const MAX_CHANNELS: usize = 16;
/// I/O queues (and TCP connections) one association has at most.
pub const MAX_IO_QUEUES: u16 = 8;
/// Largest command this host sends, whatever MDTS allows: a blkif request is at most
/// 2 MiB, and smaller commands keep one from holding the connection long.
const MAX_COMMAND_BYTES: u64 = 1 << 20;
/// Keep Alive Timeout asked in Connect: three times Linux's host default
/// (NVME_DEFAULT_KATO), room for emulated CPUs; a keep-alive goes every half of it.
const KATO_MS: u32 = 15_000;
/// Times a request is sent again before it fails: after a command of it failed with a
/// data transfer error (a read's data digest did not match), or after a connection was
/// lost while it was out. Linux's host gives a request as many (`nvme_max_retries`),
/// whatever the cause. The bound isolates a request the target cannot take (one that
/// makes it drop the connection every time): it fails, and the association, which
/// other disks may share, serves on.
pub const RETRIES: u8 = 5;

/// How long a path may stay in an ANA transition when its controller reports no ANATT
/// (nvmet reports 10 s).
const DEFAULT_ANA_TRANSITION_MS: u64 = 10_000;
/// How often the ANA log is read again while requests wait out a transition, should the
/// controller's notice of its end not come.
const ANA_REREAD_MS: u64 = 1_000;

/// How long an association that found a better path waits for its commands to come
/// back before it leaves anyway (those still out then go again, charged a retry).
const MOVE_DRAIN_MS: u64 = 2_000;

/// How long a closing association waits for the controller to confirm its shutdown
/// (Linux's host waits as long: `shutdown_timeout`, 5 s).
pub const SHUTDOWN_MS: u64 = 5_000;

/// The connections of an association, and the one that looks at another path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Admin,
    /// I/O queue `n` (0-based; its queue ID is `n + 1`).
    Io(u16),
    /// An admin queue of its own to another portal of the subsystem, opened only to read
    /// the namespace's ANA state there (the caller's transport chooses the portal: the
    /// next other one in turn at each open).
    Probe,
}

/// Links a remote may use: the admin queue's, one per I/O queue, the probe's.
pub const MAX_LINKS: usize = 2 + MAX_IO_QUEUES as usize;

impl Link {
    /// 0 for the admin queue's connection, `1 + n` for I/O queue `n`'s, the last of
    /// [`MAX_LINKS`] for the probe's.
    pub fn index(self) -> usize {
        match self {
            Link::Admin => 0,
            Link::Io(n) => 1 + usize::from(n),
            Link::Probe => MAX_LINKS - 1,
        }
    }
}

/// Where a TCP connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    Opening,
    Open,
    /// Refused (reset) while opening.
    Refused,
    /// Closed or reset after it was open.
    Closed,
}

/// The TCP connections of one remote namespace, as the caller keeps them.
pub trait Transport {
    /// Starts `link` afresh (any previous connection of it is dropped).
    fn open(&mut self, link: Link);
    fn state(&mut self, link: Link) -> LinkState;
    /// Hands what arrived to `f`, which returns how much it took.
    fn recv(&mut self, link: Link, f: &mut dyn FnMut(&[u8]) -> usize);
    /// Lets `f` fill the send window; it returns how much it wrote.
    fn send(&mut self, link: Link, f: &mut dyn FnMut(&mut [u8]) -> usize);
    fn close(&mut self, link: Link);
}

/// The guests' pages, by the CPU addresses the queues were given.
pub trait Memory {
    fn read(&self, address: u64, out: &mut [u8]);
    fn write(&self, address: u64, data: &[u8]);
}

/// Timing of connections and of reconnecting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// A TCP connection not open by then has no answer (no route, no ARP reply, filtered).
    pub connect_ms: u64,
    /// The controller's bring-up on a live connection.
    pub bringup_ms: u64,
    pub reconnect: ReconnectPolicy,
}

impl Timing {
    /// Reconnect every 5 s, give up after 600 s (Linux's `ctrl_loss_tmo`); 5 s for a
    /// connection, 10 s for a bring-up.
    pub const DEFAULT: Timing = Timing {
        connect_ms: 5_000,
        bringup_ms: 10_000,
        reconnect: ReconnectPolicy {
            delay_ms: 5_000,
            give_up_ms: 600_000,
        },
    };
}

/// Why an association could not be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// TCP got no answer in time.
    NoAnswer,
    /// The target reset the connection (nothing listens on that port).
    Refused,
    /// The target closed a connection (during a bring-up, or one that served).
    Closed,
    /// The NVMe bring-up failed (the target refused Connect, the namespace is missing ...).
    Session(Error),
    /// On a reconnect: the namespace shrank or changed its block size.
    NamespaceChanged { blocks: u64, block_size: u32 },
    /// A command completed with a path-related status (an ANA group inaccessible
    /// through this controller, say): the association is left for another, on the next
    /// portal the transport knows, and the command's request goes again there.
    PathError(Status),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NoAnswer => f.write_str("no answer (no route, no ARP reply, or filtered)"),
            Failure::Refused => f.write_str("connection refused (reset)"),
            Failure::Closed => f.write_str("the target closed the connection"),
            Failure::Session(e) => write!(f, "{e}"),
            Failure::NamespaceChanged { blocks, block_size } => write!(
                f,
                "the namespace changed: now {blocks} blocks of {block_size} B"
            ),
            Failure::PathError(status) => write!(
                f,
                "a command failed with a path error ({}, {status})",
                status.path_error_name()
            ),
        }
    }
}

impl Failure {
    /// The Linux errno of the error node.
    pub fn errno(&self) -> i32 {
        use crate::ConnectRefusal as R;
        match self {
            Failure::NoAnswer => 110, // ETIMEDOUT
            Failure::Refused => 111,  // ECONNREFUSED
            Failure::Session(Error::ConnectRefused(R::HostNotAllowed)) => 13, // EACCES
            Failure::Session(Error::ConnectRefused(R::UnknownSubsystem))
            | Failure::Session(Error::NamespaceMissing(_)) => 19, // ENODEV
            _ => 5,                   // EIO
        }
    }
}

/// Where the association is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Being made (first time or a reconnect attempt).
    Connecting,
    Live,
    /// Lost; waiting for the next attempt, requests held.
    Down,
    /// The first bring-up failed: nothing was ever served.
    Failed(Failure),
    /// The target stayed away too long: every request fails (until [`Remote::revive`]).
    GaveUp,
    /// No disk is served from it any more ([`Remote::close`]): the controller was told
    /// of its shutdown, which this waits for; no request is taken.
    Closing,
    /// Every connection closed for good: nothing more happens.
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    AdminTcp,
    Admin,
    IoTcp,
    Io,
}

/// What the network side keeps of a request it took.
#[derive(Clone, Copy, Debug)]
struct Held {
    request: SlotRequest,
    /// Bytes (or sectors, discard) given to commands so far.
    issued: u64,
    outstanding: u16,
    failed: bool,
    /// A write's pre-flush has completed (or was not asked for).
    flushed: bool,
    active: bool,
    /// When it was taken from its channel (ms).
    taken_at: u64,
    /// Times it was sent again (after a data transfer error or a lost connection).
    retries: u8,
    /// A command of it failed with a data transfer error: it goes again from its start
    /// once nothing of it is outstanding (unless out of retries).
    redo: bool,
    /// A command of it came back with ANA Transition: it goes again from its start once
    /// nothing of it is outstanding and the path serves again (no retry charged).
    again: bool,
}

impl Held {
    /// Back to its start, to be sent again from its first byte (its pre-flush first).
    fn restart(&mut self) {
        self.issued = 0;
        self.outstanding = 0;
        self.failed = false;
        self.redo = false;
        self.again = false;
        self.flushed = !matches!(self.request.op, Op::Write { preflush: true });
    }
}

/// Requests completed and how long the remote held them (taken from the channel to
/// completed: the network and the target), for the console.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldTimes {
    pub completed: u64,
    pub total_ms: u64,
    pub max_ms: u64,
}

const IDLE: Held = Held {
    request: SlotRequest {
        op: Op::Flush,
        sector: 0,
        amount: 0,
        segments: 0,
    },
    issued: 0,
    outstanding: 0,
    failed: false,
    flushed: false,
    active: false,
    taken_at: 0,
    retries: 0,
    redo: false,
    again: false,
};

/// How a remote's associations went, for the operator (`data/blkdom-net`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteCounters {
    /// Associations made: the first and every reconnect.
    pub associations: u64,
    /// Associations lost (requests held while reconnecting).
    pub losses: u64,
    /// Bring-up attempts that failed (a first one, or a reconnect attempt).
    pub failed_attempts: u64,
    /// Commands that completed with a data transfer error (with data digests on: data
    /// that did not match its digest, either way).
    pub transfer_errors: u64,
    /// Commands that completed with a path-related status (each lost its association).
    pub path_errors: u64,
    /// ANA transitions met (a command came back with ANA Transition, or the log said
    /// the group was changing): each waited out on its path, or left for another portal.
    pub ana_transitions: u64,
    /// Associations left for another portal through which the namespace's ANA group is
    /// optimized, while this one served it non-optimized.
    pub moves: u64,
}

/// Things worth logging, handed to the caller's closure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Live {
        controller: u16,
        io_queues: u16,
        reconnect: bool,
        /// The namespace's ANA group and state through this controller, if reported.
        ana: Option<AnaPath>,
    },
    Lost(Failure),
    AttemptFailed(Failure),
    /// The namespace is larger than served (`blocks` now, `serving` until now), found
    /// on a reconnect or on a Namespace Attribute notice; the caller has it served at
    /// its new size (`Remote::serve_grown`).
    NamespaceGrew {
        blocks: u64,
        serving: u64,
    },
    /// The controller sent an ANA change notice and the log says the namespace's group
    /// is now in this state (one that cannot serve also loses the association).
    AnaChanged(AnaPath),
    GaveUp {
        waited_ms: u64,
    },
    /// A command failed with a data transfer error: its request goes again (`retry`, of
    /// [`RETRIES`]) or, out of retries, fails.
    TransferError {
        retry: Option<u8>,
    },
    /// On a reconnect: requests that were out at each of the last [`RETRIES`] + 1
    /// losses fail rather than go again.
    OutOfRetries {
        requests: usize,
    },
    /// The path is in an ANA transition (a command came back with ANA Transition, or
    /// the log says the group is changing): requests wait on this association, for up
    /// to `limit_ms` (the controller's ANATT) before it is left as lost.
    TransitionWait {
        limit_ms: u64,
    },
    /// The ANA log says the path serves again: the waiting requests go, `waited_ms`
    /// after the wait began.
    TransitionOver {
        waited_ms: u64,
    },
    /// Serving through a non-optimized path, a look at another portal (the one the
    /// caller's transport opened [`Link::Probe`] to last) found the namespace's group
    /// optimized there: no command is sent any more, and once those out have come back
    /// the association leaves for that portal ([`Event::Moved`]).
    OptimizedElsewhere(AnaPath),
    /// The association was left for the portal found optimized (the caller's transport
    /// connects there next; the attempt goes at once), `waited_ms` after it was found;
    /// `drained`: every command sent had come back. A request with a command still out
    /// goes again there, charged a retry as after a loss.
    Moved {
        waited_ms: u64,
        drained: bool,
    },
    /// The association is closed ([`Remote::close`]). `shutdown`: `None` when it was
    /// not live (nothing to tell a controller); `Some(Ok(ms))` when the controller
    /// confirmed its shutdown `ms` after it was told; `Some(Err(why))` when it did not
    /// (the connection closed, a command failed, [`SHUTDOWN_MS`] passed): closed anyway.
    Closed {
        shutdown: Option<Result<u64, Failure>>,
    },
}

/// One remote namespace and the disk queues on it.
pub struct Remote {
    host_nqn: String,
    host_id: [u8; 16],
    subsystem: String,
    nsid: u32,
    timing: Timing,
    state: State,
    stage: Stage,
    stage_since: u64,
    /// The current attempt opened its first connection.
    started: bool,
    /// Boxed, as the I/O sessions: their buffers and command slots (tens of KiB) stay
    /// off the small kernel stacks that move a `Remote` about.
    admin: Option<Box<AdminSession>>,
    /// One per I/O queue asked for; the first `live_queues` serve.
    io: Vec<IoQueue>,
    /// The I/O queues of the current association (the controller may allot fewer).
    live_queues: u16,
    controller: Option<ControllerInfo>,
    ana: Option<AnaPath>,
    namespace: Option<NamespaceInfo>,
    /// Set once live: what every reconnect must find again.
    first_namespace: Option<NamespaceInfo>,
    reconnect: Reconnect,
    lost_at: u64,
    /// Why the last bring-up attempt failed (for the operator who asked for it).
    last_failure: Option<Failure>,
    channels: Vec<Arc<Shared>>,
    held: Vec<[Held; SLOTS]>,
    /// Requests taken and not completed.
    active: usize,
    /// The time of the current pass (ms).
    now: u64,
    held_times: HeldTimes,
    counters: RemoteCounters,
    /// A command of this pass completed with a path error: the association is left.
    path_error: Option<Status>,
    /// The path is in an ANA transition: no command is sent (`issue`) until an ANA log
    /// read since says the group serves; the log's count of reads when the wait began.
    transition_wait: Option<u32>,
    /// Since when the path has not served (the first ANA Transition, or a changing state
    /// found, and no command completed since); ANATT after it the association is left.
    transition_since: Option<u64>,
    /// When the ANA log was last asked for while waiting.
    ana_asked_at: u64,
    /// The last association was left at ANATT: every request it held is charged a
    /// retry, sent or not, so that a path that never ends its transition fails them.
    transition_expired: bool,
    /// A command of this pass came back with ANA Transition.
    transition_hit: bool,
    /// The caller's transport reaches the subsystem through other portals too: a path
    /// that starts a transition while serving is left for them (`with_other_paths`).
    other_paths: bool,
    /// The association was made while its group was changing: it waits that out
    /// rather than move on (the other paths were tried to get here).
    arrived_changing: bool,
    /// A look at another portal under way, while the path serves non-optimized.
    probe: Option<Probe>,
    /// When the next look is due (ms), while the path serves non-optimized.
    probe_at: Option<u64>,
    /// Since when the association waits for its commands to come back before it moves
    /// to the portal found optimized; nothing is sent meanwhile.
    moving_since: Option<u64>,
    /// Asked for on every connection of every association.
    digests: Digests,
    /// When the controller was told of its shutdown (`State::Closing`).
    closing_since: u64,
}

impl Remote {
    /// An association to make with namespace `nsid` of `subsystem`, from `now` (ms).
    pub fn new(
        host_nqn: &str,
        host_id: [u8; 16],
        subsystem: &str,
        nsid: u32,
        timing: Timing,
        now: u64,
    ) -> Remote {
        Remote {
            host_nqn: host_nqn.into(),
            host_id,
            subsystem: subsystem.into(),
            nsid,
            timing,
            state: State::Connecting,
            stage: Stage::AdminTcp,
            stage_since: now,
            started: false,
            admin: None,
            io: alloc::vec![IoQueue::new()],
            live_queues: 1,
            controller: None,
            ana: None,
            namespace: None,
            first_namespace: None,
            reconnect: Reconnect::new(timing.reconnect),
            lost_at: 0,
            last_failure: None,
            path_error: None,
            transition_wait: None,
            transition_since: None,
            ana_asked_at: 0,
            transition_expired: false,
            transition_hit: false,
            other_paths: false,
            arrived_changing: false,
            probe: None,
            probe_at: None,
            moving_since: None,
            channels: Vec::with_capacity(MAX_CHANNELS),
            held: Vec::with_capacity(MAX_CHANNELS),
            active: 0,
            now,
            held_times: HeldTimes::default(),
            counters: RemoteCounters::default(),
            digests: Digests::NONE,
            closing_since: 0,
        }
    }

    /// Runs every connection with `digests` (CRC32C over headers, data, or both); a
    /// target that does not agree fails the bring-up.
    pub fn with_digests(mut self, digests: Digests) -> Remote {
        self.digests = digests;
        self
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// The caller's transport moves to another portal of the subsystem after every loss:
    /// a path that starts an ANA transition while it serves is left for the next at
    /// once, as Linux's native multipath sends I/O down another path, rather than
    /// waited out (an association made while its group is changing still waits).
    pub fn with_other_paths(mut self, other_paths: bool) -> Remote {
        self.other_paths = other_paths;
        self
    }

    /// Asks for `queues` I/O queues (1..=[`MAX_IO_QUEUES`]; default 1), each on its own
    /// connection: one per poller that serves the namespace's disks.
    pub fn with_io_queues(mut self, queues: u16) -> Remote {
        let queues = queues.clamp(1, MAX_IO_QUEUES);
        self.io = (0..queues).map(|_| IoQueue::new()).collect();
        self
    }

    /// The I/O queues asked for: links `Io(0)` to `Io(n - 1)` of the [`Transport`].
    pub fn io_queues_asked(&self) -> u16 {
        self.io.len() as u16
    }

    /// The I/O queues the association connects (fewer than asked if the controller
    /// allots fewer).
    pub fn io_queues(&self) -> u16 {
        self.live_queues
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn controller(&self) -> Option<ControllerInfo> {
        self.controller
    }

    /// When it reconnects and gives up.
    pub fn reconnect_policy(&self) -> ReconnectPolicy {
        self.reconnect.policy()
    }

    /// Other reconnect times, from now on (`Reconnect::set_policy`).
    pub fn set_reconnect_policy(&mut self, policy: ReconnectPolicy) {
        self.timing.reconnect = policy;
        self.reconnect.set_policy(policy);
    }

    pub fn held_times(&self) -> HeldTimes {
        self.held_times
    }

    pub fn counters(&self) -> RemoteCounters {
        self.counters
    }

    /// The namespace's ANA group and state through the controller of the last
    /// association made, when that controller reported it: as read at its bring-up or
    /// on its latest ANA change notice.
    pub fn ana(&self) -> Option<AnaPath> {
        self.ana
    }

    /// Requests submitted and not completed: taken (commands out, or held while
    /// reconnecting) or still waiting in their channels.
    pub fn in_flight(&self) -> usize {
        self.active + self.channels.iter().map(|c| c.submissions()).sum::<usize>()
    }

    /// The namespace as served: as the first bring-up found it, or grown since
    /// (`serve_grown`); every reconnect must find at least that.
    pub fn first_namespace(&self) -> Option<NamespaceInfo> {
        self.first_namespace
    }

    /// The disk's geometry (once live).
    pub fn geometry(&self) -> Option<Geometry> {
        let (c, ns) = (self.controller?, self.first_namespace?);
        Some(Geometry {
            sectors: ns.blocks * u64::from(ns.block_size) / blkdev::SECTOR_SIZE,
            logical_block_size: ns.block_size,
            physical_block_size: ns.block_size,
            read_only: false,
            flush: c.volatile_write_cache,
            discard: c.deallocate.then_some(DiscardGeometry {
                granularity: ns.block_size,
                alignment: 0,
                secure: false,
            }),
        })
    }

    /// The namespace grew on the target (a notice, or a reconnect, found it larger):
    /// it is served at its new size from now on, every disk queue's and every new one's
    /// geometry saying so; the new size in sectors. `None` when it has not grown. The
    /// caller publishes the size to the disks served whole (a slice keeps its own).
    pub fn serve_grown(&mut self) -> Option<u64> {
        let (first, now) = (self.first_namespace.as_mut()?, self.namespace?);
        if !now.holds(first) || now.blocks == first.blocks {
            return None;
        }
        first.blocks = now.blocks;
        let sectors = self.geometry()?.sectors;
        for shared in &self.channels {
            shared.set_sectors(sectors);
        }
        Some(sectors)
    }

    /// A new disk queue on this namespace (once live); `None` past [`MAX_CHANNELS`], or
    /// once closing.
    pub fn add_queue(&mut self) -> Option<DiskQueue> {
        let geometry = self.geometry()?;
        if self.channels.len() >= MAX_CHANNELS
            || matches!(self.state, State::Closing | State::Closed)
        {
            return None;
        }
        let shared = Shared::new();
        if self.state == State::GaveUp {
            shared.give_up(self.timing.reconnect.give_up_ms);
        }
        self.channels.push(shared.clone());
        self.held.push([IDLE; SLOTS]);
        Some(DiskQueue::new(shared, geometry))
    }

    /// Requests taken and not completed, or the association is not live: the caller
    /// polls again soon.
    pub fn busy(&self) -> bool {
        self.active > 0 || matches!(self.state, State::Connecting | State::Down | State::Closing)
    }

    pub fn channels(&self) -> &[Arc<Shared>] {
        &self.channels
    }

    /// One pass at `now` (ms). True when something moved.
    pub fn poll(
        &mut self,
        t: &mut dyn Transport,
        mem: &dyn Memory,
        now: u64,
        log: &mut dyn FnMut(Event),
    ) -> bool {
        self.now = now;
        match self.state {
            State::Connecting if !self.started => {
                self.start(t, now);
                true
            }
            State::Connecting => self.connect_step(t, now, log),
            State::Live => self.live_step(t, mem, now, log),
            State::Down => match self.reconnect.poll(now) {
                Action::Attempt => {
                    self.start(t, now);
                    true
                }
                Action::GiveUp => {
                    self.give_up(now, log);
                    true
                }
                Action::Nothing => false,
            },
            State::GaveUp => self.fail_everything(),
            State::Closing => self.closing_step(t, now, log),
            State::Failed(_) | State::Closed => false,
        }
    }

    /// No disk is served from the namespace any more: the association ends, from `now`.
    /// Its I/O queues' connections (and a look at another portal) are closed, and, its
    /// controller up, the controller is told of a normal shutdown on the admin queue
    /// ([`AdminSession::shut_down`]); the remote is `Closing` until the controller
    /// confirms or [`SHUTDOWN_MS`] passes, then closes the admin queue's connection
    /// (`Closed`, [`Event::Closed`]). Without a controller up (its bring-up under way,
    /// reconnecting, given up, failed), every connection closes at once. A request still taken or waiting (the
    /// caller drained its disks first: there should be none) fails rather than wait for
    /// nobody. Nothing once closing.
    pub fn close(&mut self, t: &mut dyn Transport, now: u64, log: &mut dyn FnMut(Event)) {
        if matches!(self.state, State::Closing | State::Closed) {
            return;
        }
        self.fail_everything();
        // The I/O queues go first, as on Linux's host: the controller is shut down with
        // nothing of this host's left on it.
        for n in 0..self.io_queues_asked() {
            t.close(Link::Io(n));
        }
        for queue in &mut self.io {
            queue.session = None;
        }
        self.drop_probe(t);
        self.moving_since = None;
        // A controller that is up is told, whether or not the I/O queues were (a
        // reconnect may be connecting them).
        let live = self
            .admin
            .as_ref()
            .is_some_and(|a| a.state() == SessionState::Live)
            && t.state(Link::Admin) == LinkState::Open;
        if let (true, Some(admin)) = (live, self.admin.as_mut()) {
            if admin.shut_down(now, SHUTDOWN_MS).is_ok() {
                self.state = State::Closing;
                self.closing_since = now;
                pump_admin(admin, t, now);
                return;
            }
        }
        self.finish_closing(t, None, log);
    }

    /// Closing: the admin queue driven until the controller confirms its shutdown, or
    /// cannot.
    fn closing_step(
        &mut self,
        t: &mut dyn Transport,
        now: u64,
        log: &mut dyn FnMut(Event),
    ) -> bool {
        let Some(admin) = self.admin.as_mut() else {
            self.finish_closing(t, None, log);
            return true;
        };
        let outcome = match drive_admin(admin, t, Link::Admin, now) {
            _ if admin.shut_down_complete() => Ok(now.saturating_sub(self.closing_since)),
            SessionState::Failed(e) => Err(Failure::Session(e)),
            _ => return false,
        };
        self.finish_closing(t, Some(outcome), log);
        true
    }

    fn finish_closing(
        &mut self,
        t: &mut dyn Transport,
        shutdown: Option<Result<u64, Failure>>,
        log: &mut dyn FnMut(Event),
    ) {
        self.close_links(t);
        self.admin = None;
        self.state = State::Closed;
        log(Event::Closed { shutdown });
    }

    /// Stops holding requests: every request held and every later one fails, and the
    /// queues report the fault, until [`Remote::revive`].
    pub fn give_up(&mut self, now: u64, log: &mut dyn FnMut(Event)) {
        self.state = State::GaveUp;
        let waited_ms = now.saturating_sub(self.lost_at);
        for shared in &self.channels {
            shared.give_up(waited_ms);
        }
        log(Event::GaveUp { waited_ms });
        self.fail_everything();
    }

    /// A remote that gave up tries again from `now`, as after a loss (at once, then
    /// every delay, for up to the give-up time): an operator attached a disk on it again,
    /// the target being back. Its queues take requests again (held until it is live).
    /// False, and nothing changes, unless it had given up.
    pub fn revive(&mut self, now: u64) -> bool {
        if self.state != State::GaveUp {
            return false;
        }
        for shared in &self.channels {
            shared.revive();
        }
        self.reconnect = Reconnect::new(self.timing.reconnect);
        self.reconnect.lost(now);
        self.lost_at = now;
        self.last_failure = None;
        self.state = State::Down;
        true
    }

    /// A first bring-up that failed starts again from its first step (the caller's
    /// transport now leads to another portal of the target). False, and nothing
    /// changes, unless the first bring-up had failed.
    pub fn retry_first_bring_up(&mut self) -> bool {
        if !matches!(self.state, State::Failed(_)) || self.first_namespace.is_some() {
            return false;
        }
        self.state = State::Connecting;
        self.started = false;
        true
    }

    /// Why the last bring-up attempt failed, if one did since the last loss or revival.
    pub fn last_failure(&self) -> Option<Failure> {
        self.last_failure
    }

    fn start(&mut self, t: &mut dyn Transport, now: u64) {
        self.close_links(t);
        t.open(Link::Admin);
        self.admin = None;
        for queue in &mut self.io {
            queue.session = None;
        }
        self.state = State::Connecting;
        self.stage = Stage::AdminTcp;
        self.stage_since = now;
        self.started = true;
    }

    /// Every connection closed (the admin queue's, every I/O queue's asked for, a
    /// probe's).
    fn close_links(&mut self, t: &mut dyn Transport) {
        t.close(Link::Admin);
        for n in 0..self.io_queues_asked() {
            t.close(Link::Io(n));
        }
        self.drop_probe(t);
        self.moving_since = None;
    }

    /// The I/O queues of the current association, with their link.
    fn live_io(&mut self) -> impl Iterator<Item = (Link, &mut IoQueue)> {
        let live = usize::from(self.live_queues);
        self.io
            .iter_mut()
            .take(live)
            .enumerate()
            .map(|(n, queue)| (Link::Io(n as u16), queue))
    }

    /// An admin queue's session for this remote's namespace, bring-up from `now`.
    fn admin_session(&self, now: u64) -> AdminSession {
        AdminSession::new(
            &self.identity(),
            self.nsid,
            KATO_MS,
            now,
            self.timing.bringup_ms,
        )
        .with_digests(self.digests)
    }

    fn identity(&self) -> HostIdentity<'_> {
        HostIdentity {
            host_nqn: &self.host_nqn,
            host_id: self.host_id,
            subsystem_nqn: &self.subsystem,
        }
    }

    fn connect_step(
        &mut self,
        t: &mut dyn Transport,
        now: u64,
        log: &mut dyn FnMut(Event),
    ) -> bool {
        let result = self.bring_up(t, now);
        match result {
            Ok(false) => false,
            Ok(true) => {
                let reconnect = self.first_namespace.is_some();
                self.first_namespace
                    .get_or_insert(self.namespace.unwrap_or(NamespaceInfo {
                        nsid: self.nsid,
                        blocks: 0,
                        block_size: 512,
                    }));
                self.state = State::Live;
                self.counters.associations += 1;
                self.reconnect.connected();
                log(Event::Live {
                    controller: self.controller.map_or(0, |c| c.cntlid),
                    io_queues: self.live_queues,
                    reconnect,
                    ana: self.ana,
                });
                if let (Some(first), Some(ns)) = (self.first_namespace, self.namespace) {
                    if ns.blocks > first.blocks {
                        log(Event::NamespaceGrew {
                            blocks: ns.blocks,
                            serving: first.blocks,
                        });
                    }
                }
                self.arrived_changing = self.ana.is_some_and(|a| a.state == AnaState::Change);
                if self.arrived_changing {
                    // Live through a group in transition: nothing is sent until it ends.
                    self.wait_for_path(now, log);
                }
                // What the old connection held goes again, first.
                let failed = self.replay_active();
                if failed > 0 {
                    log(Event::OutOfRetries { requests: failed });
                }
                true
            }
            Err(failure) => {
                self.close_links(t);
                self.admin = None;
                for queue in &mut self.io {
                    queue.session = None;
                }
                self.last_failure = Some(failure);
                self.counters.failed_attempts += 1;
                if self.first_namespace.is_none() {
                    self.state = State::Failed(failure);
                } else {
                    log(Event::AttemptFailed(failure));
                    self.reconnect.attempt_failed(now);
                    self.state = State::Down;
                }
                true
            }
        }
    }

    /// Moves the bring-up on; true once live.
    fn bring_up(&mut self, t: &mut dyn Transport, now: u64) -> Result<bool, Failure> {
        let connect_deadline = self.stage_since + self.timing.connect_ms;
        match self.stage {
            Stage::AdminTcp => {
                if !link_open(t, Link::Admin, now, connect_deadline)? {
                    return Ok(false);
                }
                let admin = self
                    .admin_session(now)
                    .with_io_queues(self.io_queues_asked());
                self.admin = Some(Box::new(admin));
                self.stage = Stage::Admin;
                self.stage_since = now;
                Ok(false)
            }
            Stage::Admin => {
                let admin = self.admin.as_mut().ok_or(Failure::Closed)?;
                match drive_admin(admin, t, Link::Admin, now) {
                    SessionState::Live => {
                        let ns = admin.namespace();
                        // A namespace grown meanwhile (an operator grew the volume) still
                        // holds every block served; one that shrank or changed its block
                        // size does not.
                        if let (Some(first), Some(ns)) = (self.first_namespace, ns) {
                            if !ns.holds(&first) {
                                return Err(Failure::NamespaceChanged {
                                    blocks: ns.blocks,
                                    block_size: ns.block_size,
                                });
                            }
                        }
                        self.controller = admin.controller();
                        self.ana = admin.ana();
                        self.namespace = ns;
                        self.live_queues = admin.io_queues().clamp(1, self.io_queues_asked());
                        for n in 0..self.live_queues {
                            t.open(Link::Io(n));
                        }
                        self.stage = Stage::IoTcp;
                        self.stage_since = now;
                        Ok(false)
                    }
                    SessionState::Failed(e) => Err(Failure::Session(e)),
                    SessionState::Connecting => Ok(false),
                }
            }
            Stage::IoTcp => {
                let mut all_open = true;
                for n in 0..self.live_queues {
                    all_open &= link_open(t, Link::Io(n), now, connect_deadline)?;
                }
                if !all_open {
                    return Ok(false);
                }
                let (Some(c), Some(ns)) = (self.controller, self.namespace) else {
                    return Err(Failure::Session(Error::Internal("no controller")));
                };
                for n in 0..self.live_queues {
                    let session =
                        IoSession::new(&self.identity(), &c, ns, n + 1).with_digests(self.digests);
                    self.io[usize::from(n)].session = Some(Box::new(session));
                }
                self.stage = Stage::Io;
                self.stage_since = now;
                Ok(false)
            }
            Stage::Io => {
                let mut no_data = NoData;
                for (link, queue) in self.live_io() {
                    let io = queue.session.as_mut().ok_or(Failure::Closed)?;
                    pump_io(io, t, link, &mut no_data);
                    if t.state(link) != LinkState::Open {
                        io.connection_lost();
                    }
                }
                if let Some(admin) = self.admin.as_mut() {
                    pump_admin(admin, t, now);
                    if let Err(e) = admin.poll(now) {
                        return Err(Failure::Session(e));
                    }
                }
                let mut all_live = true;
                for (_, queue) in self.live_io() {
                    match queue.session.as_ref().map(|io| io.state()) {
                        Some(SessionState::Live) => {}
                        Some(SessionState::Failed(e)) => return Err(Failure::Session(e)),
                        Some(SessionState::Connecting) | None => all_live = false,
                    }
                }
                if all_live {
                    Ok(true)
                } else if now >= self.stage_since + self.timing.bringup_ms {
                    Err(Failure::Session(Error::Timeout("I/O queue Connect")))
                } else {
                    Ok(false)
                }
            }
        }
    }

    fn live_step(
        &mut self,
        t: &mut dyn Transport,
        mem: &dyn Memory,
        now: u64,
        log: &mut dyn FnMut(Event),
    ) -> bool {
        let mut moved = self.take_new();
        moved |= self.issue();
        let mut failure = None;
        let mut ana_change = None;
        let mut grew = None;
        let live = usize::from(self.live_queues);
        {
            let Some(admin) = self.admin.as_mut() else {
                return moved;
            };
            pump_admin(admin, t, now);
            if admin.ana() != self.ana {
                self.ana = admin.ana();
                ana_change = self.ana;
            }
            // Identified again after a Namespace Attribute notice: grown, it is said;
            // shrunk, or another block size, its disks' blocks are not all there.
            if let (Some(first), Some(ns)) = (self.first_namespace, admin.namespace()) {
                if self.namespace != Some(ns) {
                    self.namespace = Some(ns);
                    if !ns.holds(&first) {
                        failure = Some(Failure::NamespaceChanged {
                            blocks: ns.blocks,
                            block_size: ns.block_size,
                        });
                    } else if ns.blocks > first.blocks {
                        grew = Some(Event::NamespaceGrew {
                            blocks: ns.blocks,
                            serving: first.blocks,
                        });
                    }
                }
            }
            let mut port = Port {
                channels: &self.channels,
                held: &self.held,
                mem,
            };
            let mut all_open = t.state(Link::Admin) == LinkState::Open;
            for (n, queue) in self.io.iter_mut().take(live).enumerate() {
                let link = Link::Io(n as u16);
                if let Some(io) = queue.session.as_mut() {
                    moved |= pump_io(io, t, link, &mut port);
                }
                all_open &= t.state(link) == LinkState::Open;
            }
            if !all_open {
                failure = Some(Failure::Closed);
            }
            if let Err(e) = admin.poll(now) {
                failure = Some(Failure::Session(e));
            }
            for queue in self.io.iter().take(live) {
                if let Some(SessionState::Failed(e)) = queue.session.as_ref().map(|io| io.state()) {
                    failure = Some(Failure::Session(e));
                }
            }
        }
        if let Some(path) = ana_change {
            log(Event::AnaChanged(path));
        }
        if let Some(event) = grew {
            log(event);
        }
        // Completions that arrived before any failure are genuine.
        for n in 0..live {
            while let Some(done) = self.io[n]
                .session
                .as_mut()
                .and_then(|io| io.next_completion())
            {
                moved = true;
                self.command_done(done.tag, done.status, log);
            }
        }
        failure = failure.or_else(|| self.follow_transition(now, log));
        if let Some(failure) = failure.or_else(|| self.path_error.take().map(Failure::PathError)) {
            self.lose(t, now, failure, log);
            return true;
        }
        moved |= self.look_elsewhere(t, now, log);
        if let Some(since) = self.moving_since {
            let drained = !self
                .held
                .iter()
                .flatten()
                .any(|h| h.active && h.outstanding > 0);
            if drained || now >= since + MOVE_DRAIN_MS {
                self.leave_for_better_path(t, now, drained, log);
                return true;
            }
        }
        moved |= self.issue();
        // Anything issued just now goes out in this pass.
        let mut port = Port {
            channels: &self.channels,
            held: &self.held,
            mem,
        };
        for (n, queue) in self.io.iter_mut().take(live).enumerate() {
            if let Some(io) = queue.session.as_mut() {
                moved |= pump_io(io, t, Link::Io(n as u16), &mut port);
            }
        }
        moved
    }

    /// The ANA transition wait, after a pass's completions and log reads: begun when a
    /// command came back with ANA Transition or the log says the group is changing,
    /// over when a log read since says it serves, the log read again every
    /// [`ANA_REREAD_MS`] meanwhile; a failure to leave the association with once the
    /// path has not served for ANATT.
    fn follow_transition(&mut self, now: u64, log: &mut dyn FnMut(Event)) -> Option<Failure> {
        let changing = self.ana.is_some_and(|a| a.state == AnaState::Change);
        if core::mem::take(&mut self.transition_hit) || changing {
            if self.other_paths && !self.arrived_changing {
                // Another portal may serve now.
                let leave = match self.ana {
                    // The log says so: over to the next at once, as for a state that
                    // cannot serve (no reconnect delay: its bring-up reads its own).
                    Some(path) if changing => Some(Failure::Session(Error::PathUnusable(path))),
                    // No log to ask: a path error like any (a reconnect delay first).
                    None => Some(Failure::PathError(Status::ANA_TRANSITION)),
                    // Only a command said so: the log is asked first (the wait below);
                    // one that says the group serves leaves it to ANATT.
                    Some(_) => None,
                };
                if leave.is_some() {
                    if self.transition_since.is_none() {
                        self.counters.ana_transitions += 1;
                    }
                    return leave;
                }
            }
            self.wait_for_path(now, log);
        }
        let taken_at_start = self.transition_wait?;
        let taken = self
            .admin
            .as_ref()
            .map_or(taken_at_start, |a| a.ana_logs_taken());
        if taken != taken_at_start && !changing && self.ana.is_some_and(|a| a.state.usable()) {
            self.transition_wait = None;
            self.arrived_changing = false;
            let since = self.transition_since.unwrap_or(now);
            log(Event::TransitionOver {
                waited_ms: now.saturating_sub(since),
            });
            return None;
        }
        if self
            .transition_since
            .is_some_and(|since| now >= since + self.transition_limit_ms())
        {
            self.transition_expired = true;
            return Some(Failure::PathError(Status::ANA_TRANSITION));
        }
        if now >= self.ana_asked_at + ANA_REREAD_MS {
            self.ana_asked_at = now;
            if let Some(Err(e)) = self.admin.as_mut().map(|a| a.refresh_ana()) {
                return Some(Failure::Session(e));
            }
        }
        None
    }

    /// Commands wait from now (unless they already do): the path is in an ANA
    /// transition.
    fn wait_for_path(&mut self, now: u64, log: &mut dyn FnMut(Event)) {
        if self.transition_wait.is_some() {
            return;
        }
        self.transition_wait = Some(self.admin.as_ref().map_or(0, |a| a.ana_logs_taken()));
        // The log is asked for at most every ANA_REREAD_MS (`follow_transition`): a
        // target whose log says the group serves while its I/O says otherwise has its
        // requests sent again once a second, not in a loop, until ANATT.
        if self.transition_since.is_none() {
            self.transition_since = Some(now);
            self.counters.ana_transitions += 1;
            // With other portals to go to, the wait is for the log's answer only.
            if !self.other_paths || self.arrived_changing {
                log(Event::TransitionWait {
                    limit_ms: self.transition_limit_ms(),
                });
            }
        }
    }

    /// Serving non-optimized with other portals to go to (and not in a transition, nor
    /// already leaving): worth a look elsewhere.
    fn wants_better_path(&self) -> bool {
        self.other_paths
            && self.ana.is_some_and(|a| a.state == AnaState::NonOptimized)
            && self.transition_wait.is_none()
            && self.moving_since.is_none()
    }

    /// While the path serves non-optimized, every reconnect delay an admin queue of its
    /// own to the next other portal ([`Link::Probe`]) reads the namespace's ANA state
    /// there, as Linux's multipath learns it from the controller it keeps on each path;
    /// found optimized, the association starts moving there (`moving_since`). The look
    /// is closed as soon as it has its answer.
    fn look_elsewhere(
        &mut self,
        t: &mut dyn Transport,
        now: u64,
        log: &mut dyn FnMut(Event),
    ) -> bool {
        if !self.wants_better_path() {
            self.drop_probe(t);
            return false;
        }
        let every = self.timing.reconnect.delay_ms.max(1);
        let Some(mut probe) = self.probe.take() else {
            if now < *self.probe_at.get_or_insert(now + every) {
                return false;
            }
            t.open(Link::Probe);
            self.probe = Some(Probe {
                session: None,
                since: now,
            });
            return true;
        };
        let answer = match probe.session.as_mut() {
            None => match link_open(t, Link::Probe, now, probe.since + self.timing.connect_ms) {
                Ok(false) => None,
                Ok(true) => {
                    probe.session = Some(Box::new(self.admin_session(now).probing()));
                    None
                }
                Err(failure) => Some(Err(failure)),
            },
            Some(session) => match drive_admin(session, t, Link::Probe, now) {
                SessionState::Live => Some(Ok(session.ana())),
                SessionState::Failed(e) => Some(Err(Failure::Session(e))),
                SessionState::Connecting => None,
            },
        };
        let Some(answer) = answer else {
            self.probe = Some(probe);
            return false;
        };
        t.close(Link::Probe);
        self.probe_at = Some(now + every);
        let group = self.ana.map(|a| a.group);
        if let Ok(Some(path)) = answer {
            if path.state == AnaState::Optimized && Some(path.group) == group {
                self.moving_since = Some(now);
                log(Event::OptimizedElsewhere(path));
            }
        }
        true
    }

    /// No look under way, and none due.
    fn drop_probe(&mut self, t: &mut dyn Transport) {
        if self.probe.take().is_some() {
            t.close(Link::Probe);
        }
        self.probe_at = None;
    }

    /// The association is left for the portal found optimized: as after a loss, the
    /// next attempt goes at once and the requests it held go again there, but it is not
    /// counted a loss.
    fn leave_for_better_path(
        &mut self,
        t: &mut dyn Transport,
        now: u64,
        drained: bool,
        log: &mut dyn FnMut(Event),
    ) {
        let since = self.moving_since.unwrap_or(now);
        log(Event::Moved {
            waited_ms: now.saturating_sub(since),
            drained,
        });
        self.counters.moves += 1;
        self.lose_quietly(t, now);
    }

    /// ANATT: how long a path may not serve through a transition.
    fn transition_limit_ms(&self) -> u64 {
        match self.controller.map_or(0, |c| c.ana_transition_s) {
            0 => DEFAULT_ANA_TRANSITION_MS,
            s => u64::from(s) * 1000,
        }
    }

    fn lose(&mut self, t: &mut dyn Transport, now: u64, why: Failure, log: &mut dyn FnMut(Event)) {
        log(Event::Lost(why));
        self.counters.losses += 1;
        self.lose_quietly(t, now);
        if matches!(why, Failure::PathError(_)) {
            // The target is there and answered: the path needs time (an ANA transition)
            // or another portal, not an attempt at once on this one.
            self.reconnect.attempt_failed(now);
        }
    }

    /// The association's connections closed and its sessions dropped; the next attempt
    /// due at once.
    fn lose_quietly(&mut self, t: &mut dyn Transport, now: u64) {
        for queue in &mut self.io {
            if let Some(io) = queue.session.as_mut() {
                io.connection_lost();
                io.drain(|_| {});
            }
            queue.session = None;
        }
        self.admin = None;
        self.path_error = None;
        self.transition_wait = None;
        self.transition_since = None;
        self.transition_hit = false;
        self.close_links(t);
        self.lost_at = now;
        self.last_failure = None;
        self.reconnect.lost(now);
        self.state = State::Down;
    }

    /// Every request taken and not completed goes again from its start (a read read
    /// twice or a write written twice is harmless; one completed is never sent again),
    /// but one that was out at [`RETRIES`] + 1 losses fails. Returns how many failed.
    fn replay_active(&mut self) -> usize {
        for queue in &mut self.io {
            queue.pending.clear();
        }
        let mut out_of_retries = 0;
        for ch in 0..self.held.len() {
            for slot in 0..SLOTS {
                let h = &mut self.held[ch][slot];
                if !h.active {
                    continue;
                }
                // Only what went out counts: a request still waiting for its turn did
                // not meet the target (unless it waited out a whole ANA transition).
                if h.issued > 0 || h.outstanding > 0 || self.transition_expired {
                    if h.retries >= RETRIES {
                        h.failed = true;
                        self.finish(ch as u16, slot as u16);
                        out_of_retries += 1;
                        continue;
                    }
                    h.retries += 1;
                }
                h.restart();
                self.io[queue_of(&self.channels[ch], self.live_queues)]
                    .pending
                    .push_back((ch as u16, slot as u16));
            }
        }
        self.transition_expired = false;
        out_of_retries
    }

    /// New requests from every channel.
    fn take_new(&mut self) -> bool {
        let mut moved = false;
        for (ch, shared) in self.channels.iter().enumerate() {
            while let Some((slot, request)) = shared.take() {
                moved = true;
                let h = &mut self.held[ch][usize::from(slot)];
                if h.active {
                    // The producer reused a slot it was never given back: its bug, not
                    // the target's; fail it rather than lose track.
                    shared.complete(slot, false);
                    continue;
                }
                *h = Held {
                    request,
                    issued: 0,
                    outstanding: 0,
                    failed: false,
                    flushed: !matches!(request.op, Op::Write { preflush: true }),
                    active: true,
                    taken_at: self.now,
                    retries: 0,
                    redo: false,
                    again: false,
                };
                self.active += 1;
                self.io[queue_of(shared, self.live_queues)]
                    .pending
                    .push_back((ch as u16, slot));
            }
        }
        moved
    }

    /// Sends commands for pending requests while the I/O queues take them (none while
    /// the path is in an ANA transition, or the association is about to move).
    fn issue(&mut self) -> bool {
        if self.transition_wait.is_some() || self.moving_since.is_some() {
            return false;
        }
        let mut moved = false;
        for n in 0..usize::from(self.live_queues) {
            moved |= self.issue_on(n);
        }
        moved
    }

    /// Sends commands for I/O queue `n`'s pending requests while it takes them.
    fn issue_on(&mut self, n: usize) -> bool {
        let Remote {
            io: queues,
            held,
            channels,
            active,
            controller,
            namespace,
            ..
        } = self;
        let IoQueue { session, pending } = &mut queues[n];
        let (Some(io), Some(c), Some(ns)) = (session.as_mut(), *controller, *namespace) else {
            return false;
        };
        let block = u64::from(ns.block_size);
        let most = u64::from(c.max_transfer.unwrap_or(u32::MAX))
            .min(MAX_COMMAND_BYTES)
            .min(65_536 * block);
        let most = (most / block).max(1) * block;
        let mut moved = false;
        while let Some(&(ch, slot)) = pending.front() {
            let h = &mut held[usize::from(ch)][usize::from(slot)];
            let r = h.request;
            let tag = u64::from(ch) << 48 | u64::from(slot) << 32 | h.issued;
            let sent = match r.op {
                Op::Flush if !c.volatile_write_cache => Done::Complete,
                Op::Write { preflush: true } if !h.flushed && !c.volatile_write_cache => {
                    h.flushed = true;
                    continue;
                }
                Op::Flush => submit(io.flush(tag | 1 << 31), r.amount),
                Op::Write { .. } if !h.flushed => {
                    if h.outstanding > 0 {
                        // The pre-flush is out: the data waits for it.
                        break;
                    }
                    match io.flush(tag | 1 << 31) {
                        Ok(()) => {
                            h.outstanding += 1;
                            moved = true;
                            break;
                        }
                        Err(crate::SubmitError::Full) => break,
                        Err(_) => Done::Fail,
                    }
                }
                Op::Read | Op::Write { .. } => {
                    let sector_bytes = r.sector * blkdev::SECTOR_SIZE;
                    let len = (r.amount - h.issued).min(most);
                    if !sector_bytes.is_multiple_of(block) || !r.amount.is_multiple_of(block) {
                        Done::Fail
                    } else {
                        let lba = (sector_bytes + h.issued) / block;
                        let blocks = (len / block) as u32;
                        let result = if r.op == Op::Read {
                            io.read(tag, lba, blocks)
                        } else {
                            io.write(tag, lba, blocks)
                        };
                        submit(result, len)
                    }
                }
                Op::Discard => {
                    let sector_bytes = r.sector * blkdev::SECTOR_SIZE;
                    let bytes = r.amount * blkdev::SECTOR_SIZE;
                    if !sector_bytes.is_multiple_of(block) || !bytes.is_multiple_of(block) {
                        Done::Fail
                    } else {
                        let left = (bytes - h.issued * blkdev::SECTOR_SIZE) / block;
                        let blocks = left.min(u64::from(u32::MAX >> 1)) as u32;
                        let lba = sector_bytes / block + h.issued * blkdev::SECTOR_SIZE / block;
                        let sectors = u64::from(blocks) * block / blkdev::SECTOR_SIZE;
                        submit(io.discard(tag, lba, blocks), sectors)
                    }
                }
            };
            match sent {
                Done::Sent(amount) => {
                    h.issued += amount;
                    h.outstanding += 1;
                    moved = true;
                    let all = match r.op {
                        Op::Flush => true,
                        _ => h.issued >= r.amount,
                    };
                    if all {
                        pending.pop_front();
                    }
                }
                Done::Full => break,
                Done::Complete | Done::Fail => {
                    let ok = matches!(sent, Done::Complete);
                    h.failed |= !ok;
                    h.issued = r.amount;
                    pending.pop_front();
                    if h.outstanding == 0 {
                        h.active = false;
                        *active -= 1;
                        channels[usize::from(ch)].complete(slot, !h.failed);
                    }
                    moved = true;
                }
            }
        }
        moved
    }

    fn command_done(&mut self, tag: u64, status: Status, log: &mut dyn FnMut(Event)) {
        let ok = status.is_success();
        let (ch, slot) = ((tag >> 48) as u16, (tag >> 32) as u16);
        let Some(h) = self
            .held
            .get_mut(usize::from(ch))
            .and_then(|held| held.get_mut(usize::from(slot)))
            .filter(|h| h.active && h.outstanding > 0)
        else {
            return;
        };
        h.outstanding -= 1;
        if status.is_ana_transition() && !status.do_not_retry() {
            // The path serves again within ANATT: the request waits on this association
            // and goes again from its start then (`follow_transition`).
            self.transition_hit = true;
            h.again = true;
        } else if status.is_path_error() && !status.do_not_retry() {
            // Not this request's fault: it stays taken, and goes again from its start on
            // the next association (charged as one that was out at a loss), which this
            // pass's end brings about.
            self.counters.path_errors += 1;
            self.path_error.get_or_insert(status);
            return;
        } else if status == Status::DATA_TRANSFER_ERROR {
            self.counters.transfer_errors += 1;
            if h.retries < RETRIES {
                h.redo = true;
            } else {
                h.failed = true;
                log(Event::TransferError { retry: None });
            }
        } else {
            h.failed |= !ok;
            if ok && self.transition_wait.is_none() {
                // The path serves (a command out from before a wait says nothing).
                self.transition_since = None;
            }
        }
        if !h.flushed {
            // The pre-flush: the data goes now.
            h.flushed = true;
            return;
        }
        let all = match h.request.op {
            Op::Flush => true,
            _ => h.issued >= h.request.amount,
        };
        if h.outstanding == 0 && all {
            if (h.redo || h.again) && !h.failed {
                // Again from its start, on the queue it would go on now.
                if h.redo {
                    h.retries += 1;
                    log(Event::TransferError {
                        retry: Some(h.retries),
                    });
                }
                h.restart();
                let queue = queue_of(&self.channels[usize::from(ch)], self.live_queues);
                self.io[queue].pending.push_back((ch, slot));
            } else {
                self.finish(ch, slot);
            }
        }
    }

    fn finish(&mut self, ch: u16, slot: u16) {
        let h = &mut self.held[usize::from(ch)][usize::from(slot)];
        if !h.active {
            return;
        }
        h.active = false;
        self.active -= 1;
        let held = self.now.saturating_sub(h.taken_at);
        self.held_times.completed += 1;
        self.held_times.total_ms += held;
        self.held_times.max_ms = self.held_times.max_ms.max(held);
        self.channels[usize::from(ch)].complete(slot, !h.failed);
    }

    /// Given up: everything held and every new request fails.
    fn fail_everything(&mut self) -> bool {
        let _ = self.take_new();
        for queue in &mut self.io {
            queue.pending.clear();
        }
        let mut moved = false;
        for ch in 0..self.held.len() {
            for slot in 0..SLOTS {
                let h = &mut self.held[ch][slot];
                if h.active {
                    h.failed = true;
                    self.finish(ch as u16, slot as u16);
                    moved = true;
                }
            }
        }
        moved
    }
}

/// The I/O queue a request taken from `channel` goes on, of `live` (at least 1): the one
/// of the vCPU that submitted it, as Linux's host maps a CPU's requests to its queue.
fn queue_of(channel: &Shared, live: u16) -> usize {
    channel.producer_cpu.load(Ordering::Relaxed) as usize % usize::from(live.max(1))
}

/// Whether `link` is open; an error once it was refused or closed, or is still opening
/// at `deadline` (ms).
fn link_open(t: &mut dyn Transport, link: Link, now: u64, deadline: u64) -> Result<bool, Failure> {
    match t.state(link) {
        LinkState::Open => Ok(true),
        LinkState::Refused => Err(Failure::Refused),
        LinkState::Closed => Err(Failure::Closed),
        LinkState::Opening if now >= deadline => Err(Failure::NoAnswer),
        LinkState::Opening => Ok(false),
    }
}

/// One I/O queue of the association: its session while connected, and the requests
/// with commands still to send on it, in order: (channel, slot).
struct IoQueue {
    session: Option<Box<IoSession<IO_DEPTH>>>,
    pending: VecDeque<(u16, u16)>,
}

impl IoQueue {
    fn new() -> IoQueue {
        IoQueue {
            session: None,
            // Every request a remote can hold: the data path never grows it.
            pending: VecDeque::with_capacity(MAX_CHANNELS * SLOTS),
        }
    }
}

enum Done {
    Sent(u64),
    Full,
    Complete,
    Fail,
}

fn submit(result: Result<(), crate::SubmitError>, amount: u64) -> Done {
    match result {
        Ok(()) => Done::Sent(amount),
        Err(crate::SubmitError::Full | crate::SubmitError::NotReady) => Done::Full,
        Err(_) => Done::Fail,
    }
}

fn pump_admin(admin: &mut AdminSession, t: &mut dyn Transport, now: u64) {
    pump_admin_on(admin, t, Link::Admin, now);
}

/// One pass of an admin session being brought up on `link`: bytes both ways, a closed
/// connection seen, its timers; where it stands after.
fn drive_admin(
    admin: &mut AdminSession,
    t: &mut dyn Transport,
    link: Link,
    now: u64,
) -> SessionState {
    pump_admin_on(admin, t, link, now);
    if t.state(link) != LinkState::Open {
        admin.connection_lost();
    }
    let _ = admin.poll(now);
    admin.state()
}

fn pump_admin_on(admin: &mut AdminSession, t: &mut dyn Transport, link: Link, now: u64) {
    t.recv(link, &mut |data| {
        let _ = admin.receive(data, now);
        data.len()
    });
    if admin.wants_to_send() {
        t.send(link, &mut |buf| admin.transmit(buf));
    }
}

/// A look at another portal: its admin queue, once its connection is open.
struct Probe {
    session: Option<Box<AdminSession>>,
    since: u64,
}

fn pump_io<P: DataPort>(
    io: &mut IoSession<IO_DEPTH>,
    t: &mut dyn Transport,
    link: Link,
    port: &mut P,
) -> bool {
    let mut moved = false;
    t.recv(link, &mut |data| {
        moved = true;
        let _ = io.receive(data, port);
        data.len()
    });
    if io.wants_to_send() {
        t.send(link, &mut |buf| {
            let n = io.transmit(buf, port);
            moved |= n > 0;
            n
        });
    }
    moved
}

/// No data moves before the I/O queue is connected.
struct NoData;

impl DataPort for NoData {
    fn fetch(&mut self, _: u64, _: u32, _: &mut [u8]) {}
    fn deliver(&mut self, _: u64, _: u32, _: &[u8]) {}
}

/// Command data: the request's segments, by the command's tag (channel, slot, byte
/// offset of the command in the request).
struct Port<'a> {
    channels: &'a [Arc<Shared>],
    held: &'a [[Held; SLOTS]],
    mem: &'a dyn Memory,
}

impl Port<'_> {
    /// Calls `f` with (address, range of the buffer) for each piece of the request's
    /// segments that `len` bytes at `offset` of command `tag` cover.
    fn walk(&self, tag: u64, offset: u32, len: usize, f: &mut dyn FnMut(u64, usize, usize)) {
        let (ch, slot) = (
            usize::from((tag >> 48) as u16),
            usize::from((tag >> 32) as u16),
        );
        let (Some(shared), Some(h)) = (
            self.channels.get(ch),
            self.held.get(ch).and_then(|h| h.get(slot)),
        ) else {
            return;
        };
        if !h.active {
            return;
        }
        let mut at = (tag & 0xffff_ffff) + u64::from(offset);
        let mut done = 0usize;
        let mut start = 0u64;
        for n in 0..h.request.segments {
            if done == len {
                break;
            }
            let (address, seg_len) = shared.segment(slot as u16, n);
            let end = start + u64::from(seg_len);
            if at < end {
                let inside = (at - start) as usize;
                let k = (seg_len as usize - inside).min(len - done);
                f(address + inside as u64, done, k);
                done += k;
                at += k as u64;
            }
            start = end;
        }
    }
}

impl DataPort for Port<'_> {
    fn fetch(&mut self, tag: u64, offset: u32, dst: &mut [u8]) {
        let mem = self.mem;
        self.walk(tag, offset, dst.len(), &mut |address, from, k| {
            mem.read(address, &mut dst[from..from + k]);
        });
    }

    fn deliver(&mut self, tag: u64, offset: u32, src: &[u8]) {
        let mem = self.mem;
        self.walk(tag, offset, src.len(), &mut |address, from, k| {
            mem.write(address, &src[from..from + k]);
        });
    }
}
