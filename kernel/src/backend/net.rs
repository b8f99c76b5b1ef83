// SPDX-License-Identifier: MIT OR Apache-2.0
//! The storage network on the service's path (docs/design.md §5.9): the vif, smoltcp,
//! and every remote namespace (`nvmetcp::remote::Remote`) blkdom serves disks from.
//! Owned by the control path and driven by vCPU 0's poller on every pass
//! ([`Net::poll`]); the disks' queues, on any poller, reach it through their channels
//! (lock-free), and ring vCPU 0's doorbell for each request.

use crate::xen_domain::vif::{Steer, Vif};
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use backing::{NvmeTcpTarget, Portal, ReconnectTimes};
use blkdev::{BlockDevice, BufferAccess, IoRequest, SubmitError};
use bootconfig::HostNqn;
use core::sync::atomic::Ordering;
use netfront::hash::MAX_QUEUES;
use netfront::phy::DeviceStats;
use netfront::NetStats;
use nvmetcp::remote::{
    DiskQueue, Event, Failure, Link, LinkState, Remote, State, Timing, Transport, MAX_IO_QUEUES,
    RETRIES,
};
use nvmetcp::{Digests, ReconnectPolicy};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, Ipv4Address};
use xen::abi::event_channel::EvtchnPort;

/// Remote namespaces blkdom connects to at most.
pub const MAX_REMOTES: usize = 8;
/// TCP connections of one remote at most: its admin queue's, one per I/O queue, and a
/// look at another portal's.
pub use nvmetcp::remote::MAX_LINKS;
/// Socket buffers of a connection: the admin queue's carry little. An I/O queue's send
/// buffer holds commands and write data until the target acknowledges them, so writes
/// stream at one buffer a round trip, as reads do at the receive buffer, the TCP window
/// it announces (a round trip to the target crosses dom0's netback twice). The receive
/// buffer is about what the vif's 256 receive pages hold in large packets, as more did
/// not read faster; a send buffer larger than 1 MiB did not write faster either.
const ADMIN_BUFFER: usize = 16 << 10;
const IO_TX_BUFFER: usize = 1 << 20;
const IO_RX_BUFFER: usize = 1 << 20;
/// A first bring-up (at attach) must end before libxl's 10 s wait for InitWait.
const ATTACH_MS: u64 = 8_000;
/// How the network's remotes connect; how each reconnects and gives up is its
/// target's (`reconnect-delay=`, `ctrl-loss-tmo=`: [`reconnect_policy`]), which replaces
/// `reconnect` here.
const TIMING: Timing = Timing {
    connect_ms: 3_000,
    bringup_ms: 5_000,
    reconnect: Timing::DEFAULT.reconnect,
};

/// The reconnect policy a target's times ask for.
pub fn reconnect_policy(times: &ReconnectTimes) -> ReconnectPolicy {
    ReconnectPolicy {
        delay_ms: times.delay_ms(),
        give_up_ms: times.ctrl_loss_tmo_ms(),
    }
}

/// One remote namespace and its sockets (by `Link::index`: the admin queue's, then one
/// per I/O queue).
struct Entry {
    target: NvmeTcpTarget,
    /// For the log (made once: the poll loop allocates nothing).
    name: String,
    remote: Remote,
    conns: Conns,
    /// An attach waits for this bring-up (a first one, or a revival) until then (ms).
    attach_until: Option<u64>,
    /// The portal of the target's (`Entry::portals`) the next connection goes to: the
    /// first, then, after each loss or failed attempt, the next in turn.
    portal: usize,
    /// Portals a first bring-up failed on so far.
    first_failures: usize,
}

/// A remote's sockets and what is known of their connections.
struct Conns {
    /// By `Link::index`, the probe's aside.
    sockets: Vec<SocketHandle>,
    /// For a look at another portal (`Link::Probe`): only where the target names several.
    probe_socket: Option<SocketHandle>,
    /// The portal the last look went to (the next goes to the next other in turn).
    probe_portal: usize,
    /// The link was seen open since it was (re)opened.
    was_open: [bool; MAX_LINKS],
    /// smoltcp refused to start the connection (no route, say).
    refused: [bool; MAX_LINKS],
}

impl Entry {
    /// Its association is closing or closed: no disk is served from it.
    fn closing(&self) -> bool {
        matches!(self.remote.state(), State::Closing | State::Closed)
    }

    fn portals(&self) -> usize {
        self.target.portals().count()
    }

    fn current_portal(&self) -> Portal {
        self.target
            .portals()
            .nth(self.portal)
            .unwrap_or(self.target.first_portal())
    }

    /// A first bring-up failed at `now` and has a portal it did not try, with time left
    /// for it in the attach's wait.
    fn another_portal_left(&self, now: u64) -> bool {
        matches!(self.remote.state(), State::Failed(_))
            && self.first_failures + 1 < self.portals()
            && self.attach_until.is_some_and(|until| now <= until)
    }

    /// The next connection goes to the next portal (the first after the last).
    fn next_portal(&mut self) -> Portal {
        self.portal = (self.portal + 1) % self.portals().max(1);
        self.current_portal()
    }
}

/// Where a remote an attach names stands ([`Net::remote`]).
pub enum Attach {
    /// Served from remote `0`: open the disk's queues on it.
    Ready(u32),
    /// Its bring-up runs: ask again on the next round.
    Connecting,
}

pub struct Net {
    vif: Vif,
    host_nqn: Option<HostNqn>,
    host_id: [u8; 16],
    /// `net.digest=`: asked for on every connection of every remote.
    digests: Digests,
    /// By slot (a remote's number, `DeviceId::NvmeTcp`); a slot whose first bring-up
    /// failed is empty, for the next.
    entries: Vec<Option<Entry>>,
    /// Sockets of entries whose first bring-up failed, for the next.
    spare: Vec<Vec<SocketHandle>>,
    /// Probe sockets of such entries.
    spare_probes: Vec<SocketHandle>,
    /// I/O queues each remote asks for: one per vif queue, so that each connection's
    /// packets can arrive on a queue of its own.
    io_queues: u16,
    next_port: u16,
    /// The vif's counters as last logged, and when (`log_counters`).
    logged: (NetCounters, u64),
}

/// What the vif moved, for the console every [`COUNTERS_EVERY_MS`] while it changes.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct NetCounters {
    /// Every queue's, added up.
    queues: NetStats,
    device: DeviceStats,
    /// Packets in on each queue, and of them those off the queue the hash predicted.
    per_queue: [(u64, u64); MAX_QUEUES],
}
const COUNTERS_EVERY_MS: u64 = 10_000;

/// The guests' granted pages, by the CPU addresses the queues were given.
struct Pages;

impl nvmetcp::remote::Memory for Pages {
    fn read(&self, address: u64, out: &mut [u8]) {
        crate::devices::remote_memory::read(address, out)
    }
    fn write(&self, address: u64, data: &[u8]) {
        crate::devices::remote_memory::write(address, data)
    }
}

/// A remote's connections on the vif's sockets.
struct Links<'a> {
    vif: &'a mut Vif,
    entry_sockets: &'a [SocketHandle],
    probe_socket: Option<SocketHandle>,
    was_open: &'a mut [bool; MAX_LINKS],
    refused: &'a mut [bool; MAX_LINKS],
    remote: (IpAddress, u16),
    next_port: &'a mut u16,
    /// The target's portals, the one in use and the one the last probe went to.
    target: &'a NvmeTcpTarget,
    portal: usize,
    probe_portal: &'a mut usize,
}

fn socket_address(portal: Portal) -> (IpAddress, u16) {
    let [a, b, c, d] = portal.addr;
    (IpAddress::Ipv4(Ipv4Address::new(a, b, c, d)), portal.port)
}

impl Links<'_> {
    /// `link`'s socket, if the remote was given one for it (a remote asks for no more
    /// links than it was given sockets for; a probe only where there are other portals).
    fn socket(&self, link: Link) -> Option<SocketHandle> {
        match link {
            Link::Probe => self.probe_socket,
            _ => self.entry_sockets.get(link.index()).copied(),
        }
    }

    /// `link`'s connection aborted and forgotten; its socket.
    fn drop_connection(&mut self, link: Link) -> Option<SocketHandle> {
        let at = link.index();
        let handle = self.socket(link)?;
        self.vif
            .stack
            .sockets
            .get_mut::<tcp::Socket>(handle)
            .abort();
        self.was_open[at] = false;
        self.refused[at] = false;
        Some(handle)
    }

    /// The local port for a new connection of `link` to `remote`: the next ephemeral one
    /// whose packets netback puts on the vif queue of the link (the admin queue's and a
    /// probe's on queue 0, I/O queue `n`'s on queue `n` modulo the count), or simply the
    /// next one when the steering is not known.
    fn local_port(&mut self, link: Link, remote: (IpAddress, u16)) -> u16 {
        let next = if *self.next_port >= 65000 {
            49152
        } else {
            *self.next_port + 1
        };
        let steered = match (&self.vif.steer, self.vif.stack.iface.ipv4_addr(), remote.0) {
            (Steer::Hashed(steering), Some(local), IpAddress::Ipv4(address)) => {
                let queue = match link {
                    Link::Admin | Link::Probe => 0,
                    Link::Io(n) => n % steering.queues(),
                };
                steering.local_port_for_queue(
                    queue,
                    address.octets(),
                    remote.1,
                    local.octets(),
                    next,
                    &mut |_| false,
                )
            }
            _ => None,
        };
        *self.next_port = steered.unwrap_or(next);
        *self.next_port
    }
}

impl Transport for Links<'_> {
    fn open(&mut self, link: Link) {
        let Some(handle) = self.drop_connection(link) else {
            return;
        };
        let remote = if link == Link::Probe {
            // The next portal in turn other than the one in use.
            let count = self.target.portals().count().max(1);
            let mut next = *self.probe_portal;
            for _ in 0..count {
                next = (next + 1) % count;
                if next != self.portal {
                    break;
                }
            }
            *self.probe_portal = next;
            socket_address(
                self.target
                    .portals()
                    .nth(next)
                    .unwrap_or(self.target.first_portal()),
            )
        } else {
            self.remote
        };
        let port = self.local_port(link, remote);
        let context = self.vif.stack.iface.context();
        let socket = self.vif.stack.sockets.get_mut::<tcp::Socket>(handle);
        self.refused[link.index()] = socket.connect(context, remote, port).is_err();
    }

    fn state(&mut self, link: Link) -> LinkState {
        let at = link.index();
        let Some(handle) = self.socket(link) else {
            return LinkState::Refused;
        };
        if self.refused[at] {
            return LinkState::Refused;
        }
        let socket = self.vif.stack.sockets.get::<tcp::Socket>(handle);
        match socket.state() {
            tcp::State::SynSent | tcp::State::SynReceived => LinkState::Opening,
            tcp::State::Established => {
                self.was_open[at] = true;
                LinkState::Open
            }
            _ if self.was_open[at] => LinkState::Closed,
            // Reset while opening: nothing listens there.
            _ => LinkState::Refused,
        }
    }

    fn recv(&mut self, link: Link, f: &mut dyn FnMut(&[u8]) -> usize) {
        let Some(handle) = self.socket(link) else {
            return;
        };
        let socket = self.vif.stack.sockets.get_mut::<tcp::Socket>(handle);
        if socket.can_recv() {
            let _ = socket.recv(|data| (f(data), ()));
        }
    }

    fn send(&mut self, link: Link, f: &mut dyn FnMut(&mut [u8]) -> usize) {
        let Some(handle) = self.socket(link) else {
            return;
        };
        let socket = self.vif.stack.sockets.get_mut::<tcp::Socket>(handle);
        if socket.can_send() {
            let _ = socket.send(|buf| (f(buf), ()));
        }
    }

    fn close(&mut self, link: Link) {
        self.drop_connection(link);
    }
}

/// What one pass of the network did.
pub struct NetPoll {
    pub work: bool,
    /// Requests are out or a connection is being made: look again within a ms.
    pub busy: bool,
    /// The control path has something to act on now (a namespace grew).
    pub news: bool,
    /// Closing associations whose controller confirmed its shutdown in this pass.
    pub shutdowns_confirmed: usize,
}

/// The host identifier sent in Connect: the same for every connection of this blkdom,
/// made from its host NQN (FNV-1a, twice).
fn host_id(nqn: &str) -> [u8; 16] {
    let hash = |seed: u64| {
        nqn.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (a, b) = (hash(0xcbf2_9ce4_8422_2325), hash(0x6c62_272e_07bb_0142));
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&a.to_le_bytes());
    id[8..].copy_from_slice(&b.to_le_bytes());
    id
}

/// The namespace a target names, as `target=` writes it (without a disk's region or
/// reconnect times: the disks on one namespace differ in those).
fn namespace_spec(target: &NvmeTcpTarget) -> String {
    format!(
        "nvme-tcp:{}:{}:nqn={}",
        target.first_portal(),
        target.nsid,
        target.subsystem
    )
}

fn describe(target: &NvmeTcpTarget) -> String {
    format!(
        "nvme-tcp {} {} ns {}",
        target.first_portal(),
        target.subsystem,
        target.nsid
    )
}

/// Portals for the console: `10.0.0.3:4420, 10.0.0.4:4420`.
fn portal_list(portals: impl Iterator<Item = Portal>) -> String {
    portals
        .map(|p| format!("{p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `policy`: the remote's own reconnect times; `digests`: those its connections run;
/// `via`: the portal of a target that has several.
fn log_event(
    name: &str,
    event: Event,
    policy: ReconnectPolicy,
    digests: Digests,
    via: Option<Portal>,
    probed: Option<Portal>,
) {
    let delay = policy.delay_ms / 1000;
    let give_up = policy.give_up_ms / 1000;
    let mut with_digests = if digests == Digests::NONE {
        String::new()
    } else {
        format!("; {digests}")
    };
    let through = via.map_or(String::new(), |portal| format!(" through {portal}"));
    if let Some(portal) = via {
        with_digests = format!("{with_digests}; via {portal}");
    }
    match event {
        Event::AnaChanged(path) if path.state.usable() => log::info!(
            "{name}: ANA change: group {} is now {}{through}",
            path.group,
            path.state
        ),
        Event::AnaChanged(path) => log::warn!(
            "{name}: ANA change: group {} is now {}{through}; leaving the association",
            path.group,
            path.state
        ),
        Event::Live {
            controller,
            io_queues,
            reconnect,
            ana,
        } => {
            let path = ana.map_or(String::new(), |a| {
                format!(", ANA group {} {}", a.group, a.state)
            });
            let (what, held) = if reconnect {
                ("reconnected", "; held requests sent again")
            } else {
                ("connected", "")
            };
            log::info!(
                "{name}: {what} (controller {controller}, {io_queues} I/O queue{}{path}){with_digests}{held}",
                plural(io_queues)
            )
        }
        Event::TransferError { retry: Some(n) } => log::warn!(
            "{name}: a command failed with a data transfer error (data that did not match \
             its digest): its request goes again (retry {n} of {RETRIES})"
        ),
        Event::OutOfRetries { requests } => log::error!(
            "{name}: {requests} request(s) failed: each was out when the connection was lost \
             {} times (a request the target cannot take?); the rest go again",
            1 + RETRIES
        ),
        Event::TransferError { retry: None } => log::error!(
            "{name}: a request failed: data transfer errors on every one of its {} tries",
            1 + RETRIES
        ),
        Event::Lost(why) => log::error!(
            "{name}: connection lost: {why}; I/O held while reconnecting (every {delay} s, for up to {give_up} s)"
        ),
        Event::AttemptFailed(why) => log::warn!("{name}: reconnect attempt failed: {why}"),
        Event::NamespaceGrew { blocks, serving } => log::info!(
            "{name}: the namespace grew to {blocks} blocks (from {serving})"
        ),
        Event::TransitionWait { limit_ms } => log::warn!(
            "{name}: ANA transition{through}: requests wait on this path for up to {} s (ANATT)",
            limit_ms / 1000
        ),
        Event::TransitionOver { waited_ms } => log::info!(
            "{name}: ANA transition over{through}: waiting requests go again after {waited_ms} ms"
        ),
        Event::OptimizedElsewhere(path) => log::warn!(
            "{name}: ANA group {} is optimized through portal {} (non-optimized{through}): \
             the association moves there once its commands are in",
            path.group,
            probed.map_or(String::from("?"), |p| format!("{p}")),
        ),
        Event::Moved { waited_ms, drained } => log::warn!(
            "{name}: leaving the association for portal {} after {waited_ms} ms ({}); I/O held \
             while it connects",
            probed.map_or(String::from("?"), |p| format!("{p}")),
            if drained {
                "every command in"
            } else {
                "commands still out go again there"
            },
        ),
        Event::GaveUp { waited_ms } => log::error!(
            "{name}: the target stayed unreachable for {} s: given up, its disks fail every request",
            waited_ms / 1000
        ),
        Event::Closed {
            shutdown: Some(Ok(ms)),
        } => log::info!(
            "{name}: association closed: the controller confirmed its shutdown in {ms} ms{through}"
        ),
        Event::Closed {
            shutdown: Some(Err(why)),
        } => log::warn!(
            "{name}: association closed without the controller's confirmation of its \
             shutdown: {why}"
        ),
        Event::Closed { shutdown: None } => log::info!(
            "{name}: association closed (it was not live: no controller to shut down)"
        ),
    }
}

impl Net {
    pub fn new(vif: Vif, host_nqn: Option<HostNqn>, digests: Digests) -> Net {
        let host_id = host_id(host_nqn.as_ref().map_or("", |n| n.as_str()));
        let io_queues = (vif.ports().len() as u16).clamp(1, MAX_IO_QUEUES);
        Net {
            io_queues,
            vif,
            host_nqn,
            host_id,
            digests,
            entries: Vec::with_capacity(MAX_REMOTES),
            spare: Vec::with_capacity(MAX_REMOTES),
            spare_probes: Vec::with_capacity(MAX_REMOTES),
            next_port: 49152 + (xen::raw::cpu::read_tsc() % 8192) as u16,
            logged: (NetCounters::default(), 0),
        }
    }

    /// The vif's queues' event channels.
    pub fn ports(&self) -> &[EvtchnPort] {
        self.vif.ports()
    }

    /// The remote `target` names (its region and reconnect times aside), for a disk
    /// being attached: [`Attach::Ready`] once its association is live (or was, and is
    /// reconnecting: the disk's I/O is then held like the others'), [`Attach::Connecting`]
    /// while a bring-up the attach waits for runs (a new remote's first, or the revival of
    /// one that gave up), or why not (with its errno). Never waits itself: the bring-up
    /// goes on in [`Net::poll`] on vCPU 0's passes, so its rings and the control path
    /// serve on meanwhile, and the caller asks again; an attach waits [`ATTACH_MS`] at
    /// most.
    ///
    /// Disks naming one namespace share one association whatever times they ask (the
    /// caller settles a difference: `reconnect_policy`, `set_reconnect_policy`): one
    /// association per time would let two disks on one namespace escape the check that
    /// their ranges do not overlap, which goes by the remote, and double the
    /// connections to the target. A namespace is its subsystem's NQN and its nsid,
    /// whatever portal reaches it (an NQN names one subsystem): a disk naming it with
    /// other portals, or the same ones in another order, is refused.
    pub fn remote(&mut self, target: &NvmeTcpTarget) -> Result<Attach, (String, i32)> {
        let now = Vif::now_ms();
        // One closing serves nobody: a disk attached meanwhile gets an association of
        // its own.
        let same = |e: &Option<Entry>| {
            e.as_ref().is_some_and(|e| {
                (e.target.nsid, e.target.subsystem) == (target.nsid, target.subsystem)
                    && !e.closing()
            })
        };
        if let Some(at) = self.entries.iter().position(same) {
            if let Some(entry) = self.entries[at].as_ref() {
                if !entry.target.portals().eq(target.portals()) {
                    return Err((
                        format!(
                            "{}: already served through other portals ({}): name the same \
                             ones, in that order",
                            entry.name,
                            portal_list(entry.target.portals())
                        ),
                        xen::xenbus::error::errno::EINVAL,
                    ));
                }
            }
            return self.attach_progress(at, now);
        }
        // No address (net.ip=dhcp, no lease): a bring-up would only fail to connect,
        // and say so less plainly. A later attach tries again.
        if let Some(why) = self.vif.no_address() {
            return Err((why.into(), xen::xenbus::error::errno::EAGAIN));
        }
        let Some(host_nqn) = self.host_nqn else {
            return Err((
                "no host NQN: set net.hostnqn= on blkdom's command line".into(),
                xen::xenbus::error::errno::EINVAL,
            ));
        };
        self.forget_abandoned(now);
        let vacant = self.entries.iter().position(Option::is_none);
        if vacant.is_none() && self.entries.len() >= MAX_REMOTES {
            return Err((
                format!("blkdom connects to at most {MAX_REMOTES} remote namespaces"),
                xen::xenbus::error::errno::ENOSPC,
            ));
        }
        let remote = Remote::new(
            host_nqn.as_str(),
            self.host_id,
            target.subsystem.as_str(),
            target.nsid,
            Timing {
                reconnect: reconnect_policy(&target.reconnect),
                ..TIMING
            },
            now,
        )
        .with_io_queues(self.io_queues)
        .with_digests(self.digests)
        .with_other_paths(target.portals().count() > 1);
        let sockets = self.spare_sockets()?;
        // A look at the other portals needs a connection of its own.
        let probe_socket = if target.portals().count() > 1 {
            match self.spare_probe_socket() {
                Ok(handle) => Some(handle),
                Err(refusal) => {
                    self.spare.push(sockets);
                    return Err(refusal);
                }
            }
        } else {
            None
        };
        let entry = Entry {
            target: *target,
            name: describe(target),
            remote,
            conns: Conns {
                sockets,
                probe_socket,
                probe_portal: 0,
                was_open: [false; MAX_LINKS],
                refused: [false; MAX_LINKS],
            },
            attach_until: Some(now + ATTACH_MS),
            portal: 0,
            first_failures: 0,
        };
        let others = if entry.portals() > 1 {
            format!(
                "; other portals: {}",
                portal_list(entry.target.portals().skip(1))
            )
        } else {
            String::new()
        };
        log::info!(
            "{}: connecting (the attach waits up to {} s){others}",
            entry.name,
            ATTACH_MS / 1000
        );
        match vacant {
            Some(at) => self.entries[at] = Some(entry),
            None => self.entries.push(Some(entry)),
        }
        Ok(Attach::Connecting)
    }

    /// Where the bring-up an attach on remote `at` waits for stands at `now` (ms).
    fn attach_progress(&mut self, at: usize, now: u64) -> Result<Attach, (String, i32)> {
        let Some(entry) = self.entries[at].as_mut() else {
            return Err(("no such remote".into(), xen::xenbus::error::errno::ENODEV));
        };
        let first = entry.remote.first_namespace().is_none();
        match (entry.remote.state(), entry.attach_until) {
            (State::Live, _) => {
                entry.attach_until = None;
                Ok(Attach::Ready(at as u32))
            }
            // The target stayed away too long and a disk is attached on it again: one
            // more round of attempts, bounded as a first bring-up. Live: its disks serve
            // again (those still attached too).
            (State::GaveUp, _) => {
                log::info!(
                    "{}: a disk is attached on it again: connecting again",
                    entry.name
                );
                entry.remote.revive(now);
                entry.attach_until = Some(now + ATTACH_MS);
                Ok(Attach::Connecting)
            }
            // A first bring-up that failed on one portal tries the next, while the
            // attach waits.
            (State::Failed(why), _) if entry.another_portal_left(now) => {
                entry.first_failures += 1;
                let failed = entry.current_portal();
                let next = entry.next_portal();
                log::warn!(
                    "{}: portal {failed}: {why}; trying portal {next}",
                    entry.name
                );
                entry.remote.retry_first_bring_up();
                Ok(Attach::Connecting)
            }
            (State::Failed(why), _) => {
                let refusal = if entry.portals() > 1 {
                    let last = entry.current_portal();
                    (
                        format!("{}: no portal served; the last, {last}: {why}", entry.name),
                        why.errno(),
                    )
                } else {
                    (format!("{}: {why}", entry.name), why.errno())
                };
                self.forget(at);
                Err(refusal)
            }
            (_, Some(until)) if now > until => {
                let why = entry.remote.last_failure();
                let refusal = match why {
                    Some(why) => (format!("{}: {why}", entry.name), why.errno()),
                    None => (
                        format!(
                            "{}: not connected within {} s",
                            entry.name,
                            ATTACH_MS / 1000
                        ),
                        Failure::NoAnswer.errno(),
                    ),
                };
                if first {
                    self.forget(at);
                } else {
                    // A revival not live in time: given up again.
                    let name = entry.name.as_str();
                    let (policy, digests) =
                        (entry.remote.reconnect_policy(), entry.remote.digests());
                    entry.remote.give_up(now, &mut |e| {
                        log_event(name, e, policy, digests, None, None)
                    });
                    entry.attach_until = None;
                    Self::close_links(&mut self.vif, &mut self.next_port, entry);
                }
                Err(refusal)
            }
            (_, Some(_)) => Ok(Attach::Connecting),
            // Live before and reconnecting now: the disk attaches, its I/O held.
            (_, None) => Ok(Attach::Ready(at as u32)),
        }
    }

    /// Remote `at`, from which no disk is served any more (its last disk detached: the
    /// disks' rings drained before their queues came back, so it holds no request) is
    /// let go, so that the target frees its controller and queues now and no reconnect
    /// or keep-alive goes on for nobody: its association closed ([`Remote::close`]: a
    /// live one's controller is told of its shutdown first, on vCPU 0's next passes,
    /// for up to [`nvmetcp::remote::SHUTDOWN_MS`]), then its connections reset, its
    /// sockets kept for the next, its slot (and its statistics node) free. Attaching a
    /// disk on the namespace meanwhile or later connects afresh.
    pub fn release(&mut self, at: u32) {
        let now = Vif::now_ms();
        let Some(Some(entry)) = self.entries.get_mut(at as usize) else {
            return;
        };
        if entry.closing() {
            return;
        }
        log::info!(
            "{}: no disk is served from it any more: closing the association",
            entry.name
        );
        Self::close_entry(&mut self.vif, &mut self.next_port, entry, now);
        self.forget_closed();
    }

    /// `entry`'s association closed from `now` ([`Remote::close`]).
    fn close_entry(vif: &mut Vif, next_port: &mut u16, entry: &mut Entry, now: u64) {
        let via = (entry.portals() > 1).then_some(entry.current_portal());
        let Entry {
            name,
            remote,
            conns,
            target,
            portal,
            ..
        } = entry;
        let mut links = Self::links(vif, next_port, target, *portal, conns);
        let (policy, digests) = (remote.reconnect_policy(), remote.digests());
        remote.close(&mut links, now, &mut |e| {
            log_event(name.as_str(), e, policy, digests, via, None)
        });
    }

    /// Remotes whose association closed: their slots are free.
    fn forget_closed(&mut self) {
        for at in 0..self.entries.len() {
            let closed = self.entries[at]
                .as_ref()
                .is_some_and(|e| matches!(e.remote.state(), State::Closed));
            if closed {
                self.forget(at);
            }
        }
    }

    /// blkdom's shutdown, once every namespace was flushed: every association closed
    /// ([`Net::release`]) and the network driven (`relax` between passes) until each
    /// controller confirmed its shutdown or [`nvmetcp::remote::SHUTDOWN_MS`] passed, at
    /// most until `deadline_ns` (the poller's clock). The connections that are left are
    /// reset. Returns the controllers told of their shutdown, and those that confirmed.
    pub fn close_all(&mut self, deadline_ns: u64, relax: &mut dyn FnMut()) -> (usize, usize) {
        let now = Vif::now_ms();
        for entry in self.entries.iter_mut().flatten() {
            if !entry.closing() {
                Self::close_entry(&mut self.vif, &mut self.next_port, entry, now);
            }
        }
        // Those released just before are waiting too.
        let notified = self
            .entries
            .iter()
            .flatten()
            .filter(|e| matches!(e.remote.state(), State::Closing))
            .count();
        let mut confirmed = 0;
        while self.entries.iter().flatten().any(Entry::closing)
            && crate::xen_domain::now_ns() < deadline_ns
        {
            confirmed += self.poll().shutdowns_confirmed;
            relax();
        }
        for at in 0..self.entries.len() {
            if let Some(entry) = self.entries[at].as_ref() {
                if entry.closing() {
                    log::warn!(
                        "{}: blkdom's shutdown did not wait for the controller to confirm \
                         its own",
                        entry.name
                    );
                }
            }
            self.forget(at);
        }
        // smoltcp sends a dropped connection's reset at its next dispatch.
        for _ in 0..4 {
            self.vif.poll();
        }
        (notified, confirmed)
    }

    /// Remote `at` is dropped: its links closed, its sockets kept for the next, its
    /// slot free (its first bring-up failed, or no disk is served from it any more).
    fn forget(&mut self, at: usize) {
        if let Some(mut entry) = self.entries[at].take() {
            Self::close_links(&mut self.vif, &mut self.next_port, &mut entry);
            self.spare.push(entry.conns.sockets);
            if let Some(handle) = entry.conns.probe_socket {
                self.spare_probes.push(handle);
            }
        }
    }

    /// Remotes whose first bring-up failed, or outlived its attach, with nobody asking
    /// any more (the vbd was removed meanwhile): their slots are free again.
    fn forget_abandoned(&mut self, now: u64) {
        for at in 0..self.entries.len() {
            // One whose attach goes on to its next portal is not.
            let abandoned = self.entries[at].as_ref().is_some_and(|e| {
                e.remote.first_namespace().is_none()
                    && !e.another_portal_left(now)
                    && (matches!(e.remote.state(), State::Failed(_))
                        || e.attach_until.is_some_and(|until| now > until))
            });
            if abandoned {
                self.forget(at);
            }
        }
    }

    /// `wanted` new queues of remote `at`.
    pub fn queues(&mut self, at: u32, wanted: usize) -> Vec<crate::devices::open::Queue> {
        let Some(entry) = self.entry_mut(at) else {
            return Vec::new();
        };
        (0..wanted)
            .map_while(|_| entry.remote.add_queue())
            .map(|q| Box::new(RemoteQueue(q)) as crate::devices::open::Queue)
            .collect()
    }

    /// When remote `at` reconnects and gives up.
    pub fn reconnect_policy(&self, at: u32) -> Option<ReconnectPolicy> {
        self.entry(at).map(|e| e.remote.reconnect_policy())
    }

    /// Other reconnect times for remote `at`, from now on: for a disk that asks for them
    /// while no other disk is served from it.
    pub fn set_reconnect_policy(&mut self, at: u32, policy: ReconnectPolicy) {
        if let Some(entry) = self.entry_mut(at) {
            let old = entry.remote.reconnect_policy();
            log::info!(
                "{}: reconnect every {} s, give up after {} s (was {} s, {} s)",
                entry.name,
                policy.delay_ms / 1000,
                policy.give_up_ms / 1000,
                old.delay_ms / 1000,
                old.give_up_ms / 1000
            );
            entry.remote.set_reconnect_policy(policy);
        }
    }

    pub fn describe(&self, at: u32) -> String {
        self.entry(at)
            .map_or_else(|| "nvme-tcp".into(), |e| e.name.clone())
    }

    fn entry(&self, at: u32) -> Option<&Entry> {
        self.entries.get(at as usize).and_then(Option::as_ref)
    }

    fn entry_mut(&mut self, at: u32) -> Option<&mut Entry> {
        self.entries.get_mut(at as usize).and_then(Option::as_mut)
    }

    /// A probe socket for a new entry: one of an entry whose bring-up failed, or a new one.
    fn spare_probe_socket(&mut self) -> Result<SocketHandle, (String, i32)> {
        if let Some(handle) = self.spare_probes.pop() {
            return Ok(handle);
        }
        socket_memory_fits(2 * ADMIN_BUFFER)?;
        let (rx, tx) = (socket_buffer(ADMIN_BUFFER)?, socket_buffer(ADMIN_BUFFER)?);
        let handle = self
            .vif
            .stack
            .add_tcp(rx.leak(), tx.leak())
            .ok_or_else(no_socket_left)?;
        let socket = self.vif.stack.sockets.get_mut::<tcp::Socket>(handle);
        socket.set_nagle_enabled(false);
        socket.set_ack_delay(None);
        Ok(handle)
    }

    /// Sockets for a new entry: those of one whose bring-up failed, or new ones, their
    /// buffers taken only if the memory for disks and rings holds them all.
    fn spare_sockets(&mut self) -> Result<Vec<SocketHandle>, (String, i32)> {
        if let Some(sockets) = self.spare.pop() {
            return Ok(sockets);
        }
        let io_queues = usize::from(self.io_queues);
        socket_memory_fits(2 * ADMIN_BUFFER + io_queues * (IO_RX_BUFFER + IO_TX_BUFFER))?;
        // Every buffer first, so that a failure frees what was taken.
        let mut buffers = Vec::with_capacity(1 + io_queues);
        buffers.push((socket_buffer(ADMIN_BUFFER)?, socket_buffer(ADMIN_BUFFER)?));
        for _ in 0..io_queues {
            buffers.push((socket_buffer(IO_RX_BUFFER)?, socket_buffer(IO_TX_BUFFER)?));
        }
        let mut sockets = Vec::with_capacity(1 + io_queues);
        for (rx, tx) in buffers {
            let handle = self.vif.stack.add_tcp(rx.leak(), tx.leak());
            sockets.push(handle.ok_or_else(no_socket_left)?);
        }
        for &handle in &sockets {
            // A command's PDU goes out whole at once and every received PDU is acked at
            // once: Nagle's wait for an ack, against a delayed ack at the other end,
            // and smoltcp's own delayed ack would add their timers to every command at
            // low depth (Linux's host and nvmet-tcp set TCP_NODELAY too).
            let socket = self.vif.stack.sockets.get_mut::<tcp::Socket>(handle);
            socket.set_nagle_enabled(false);
            socket.set_ack_delay(None);
        }
        Ok(sockets)
    }

    /// A remote's connections on the vif: `target`'s, through portal `at` of its.
    fn links<'a>(
        vif: &'a mut Vif,
        next_port: &'a mut u16,
        target: &'a NvmeTcpTarget,
        at: usize,
        conns: &'a mut Conns,
    ) -> Links<'a> {
        let portal = target.portals().nth(at).unwrap_or(target.first_portal());
        let Conns {
            sockets,
            probe_socket,
            probe_portal,
            was_open,
            refused,
        } = conns;
        Links {
            vif,
            entry_sockets: sockets,
            probe_socket: *probe_socket,
            was_open,
            refused,
            remote: socket_address(portal),
            next_port,
            target,
            portal: at,
            probe_portal,
        }
    }

    /// Every connection of `entry` closed (an attach that gave up on it).
    fn close_links(vif: &mut Vif, next_port: &mut u16, entry: &mut Entry) {
        let io_queues = entry.remote.io_queues_asked();
        let mut links = Self::links(
            vif,
            next_port,
            &entry.target,
            entry.portal,
            &mut entry.conns,
        );
        links.close(Link::Admin);
        links.close(Link::Probe);
        for n in 0..io_queues {
            links.close(Link::Io(n));
        }
    }

    /// One remote's pass: whether anything moved, whether its namespace grew, and
    /// whether its controller confirmed the shutdown of a closing association.
    fn poll_entry(
        vif: &mut Vif,
        next_port: &mut u16,
        entry: &mut Entry,
        now: u64,
    ) -> (bool, bool, bool) {
        let portal = entry.current_portal();
        // The portal is named only where there is a choice.
        let via = (entry.portals() > 1).then_some(portal);
        let (mut lost, mut grew, mut moving, mut confirmed) = (false, false, false, false);
        let moved = {
            let Entry {
                name,
                remote,
                conns,
                target,
                portal: at,
                ..
            } = &mut *entry;
            // Where the last look went (opened on an earlier pass than its answer).
            let probed = target.portals().nth(conns.probe_portal);
            let mut links = Self::links(vif, next_port, target, *at, conns);
            let (policy, digests) = (remote.reconnect_policy(), remote.digests());
            remote.poll(&mut links, &Pages, now, &mut |e| {
                lost |= matches!(e, Event::Lost(_) | Event::AttemptFailed(_));
                grew |= matches!(e, Event::NamespaceGrew { .. });
                moving |= matches!(e, Event::Moved { .. });
                confirmed |= matches!(
                    e,
                    Event::Closed {
                        shutdown: Some(Ok(_))
                    }
                );
                log_event(name.as_str(), e, policy, digests, via, probed)
            })
        };
        if moving {
            // To the portal the look found optimized; the attempt goes at once.
            entry.portal = entry.conns.probe_portal;
        } else if lost && via.is_some() {
            // Failing over: the next attempt (at once after a loss) goes to the next
            // portal.
            let next = entry.next_portal();
            log::warn!("{}: the next attempt goes to portal {next}", entry.name);
        }
        (moved, grew, confirmed)
    }

    /// One pass: frames in, every remote, frames out; queues on other vCPUs with new
    /// completions are woken.
    pub fn poll(&mut self) -> NetPoll {
        if let Some(xen) = crate::xen_domain::get() {
            for &port in self.vif.ports() {
                xen.shared.clear_pending(port);
            }
        }
        let now = Vif::now_ms();
        let mut work = self.vif.poll();
        let mut busy = false;
        let mut wake = 0u64;
        let mut news = false;
        let mut shutdowns_confirmed = 0;
        for entry in self.entries.iter_mut().flatten() {
            let (moved, grew, confirmed) =
                Self::poll_entry(&mut self.vif, &mut self.next_port, entry, now);
            shutdowns_confirmed += usize::from(confirmed);
            news |= grew;
            work |= moved;
            busy |= entry.remote.busy();
            if moved {
                for shared in entry.remote.channels() {
                    let cpu = shared.producer_cpu.load(Ordering::Relaxed);
                    if cpu != 0 && cpu < 64 && shared.has_completions() {
                        wake |= 1 << cpu;
                    }
                }
            }
        }
        self.forget_closed();
        work |= self.vif.poll();
        while wake != 0 {
            let cpu = wake.trailing_zeros() as usize;
            wake &= wake - 1;
            super::poller::ring_doorbell(cpu);
        }
        self.log_counters(now);
        NetPoll {
            work,
            busy,
            news,
            shutdowns_confirmed,
        }
    }

    /// When smoltcp's next timer is due (a retransmission, an ack, a keep-alive), in the
    /// poller's clock (ns): vCPU 0's sleep ends by then. Asked only before a sleep.
    pub fn timer_due_ns(&mut self) -> Option<u64> {
        let now_ns = crate::xen_domain::now_ns();
        self.vif
            .stack
            .poll_delay_ms(now_ns / 1_000_000)
            .map(|ms| now_ns.saturating_add(ms.saturating_mul(1_000_000)))
    }

    /// What the vif moved so far.
    fn counters(&self) -> NetCounters {
        let device = &self.vif.stack.device;
        let mut counters = NetCounters {
            queues: device.queue_totals(),
            device: device.stats,
            per_queue: [(0, 0); MAX_QUEUES],
        };
        for (i, queue) in device.queues().iter().enumerate() {
            counters.per_queue[i] = (queue.stats.rx_frames, device.steer[i].off_queue);
        }
        counters
    }

    /// The vif's counters for `data/blkdom-net` (`blkdom-stat`'s `blkdom_vif_*`).
    pub fn vif_stats_line(&self) -> String {
        let c = self.counters();
        format!(
            "queues={} mtu={} tx-frames={} tx-gso={} tx-refused={} tx-ring-full={} \
             rx-packets={} rx-gso={} rx-dropped={} rx-bad-checksum={} events-sent={}",
            self.vif.ports().len(),
            self.vif.stack.device.mtu(),
            c.queues.tx_frames,
            c.queues.tx_gso,
            c.queues.tx_errors,
            c.device.tx_full,
            c.queues.rx_frames,
            c.queues.rx_gso,
            c.queues.rx_dropped,
            c.device.rx_bad_checksum,
            c.queues.notifications
        )
    }

    /// Remote namespaces grown on their targets since last asked, now served at their
    /// new size (`Remote::serve_grown`): (remote, sectors).
    pub fn take_growth(&mut self) -> Vec<(usize, u64)> {
        self.entries
            .iter_mut()
            .enumerate()
            .filter_map(|(at, entry)| Some((at, entry.as_mut()?.remote.serve_grown()?)))
            .collect()
    }

    /// Each remote's number and its line for `data/blkdom-remotes/<n>`
    /// (`blkdom-stat`'s `blkdom_remote_*`): its state and counters, then its target.
    pub fn remote_stats_lines(&self) -> Vec<(usize, String)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(at, entry)| {
                // One closing serves no disk: its node goes.
                let entry = entry.as_ref().filter(|e| !e.closing())?;
                let remote = &entry.remote;
                // 0 connecting, 1 live, 2 reconnecting (I/O held), 3 given up (I/O
                // fails), 4 the first bring-up failed.
                let state = match remote.state() {
                    State::Connecting if remote.first_namespace().is_some() => 2,
                    State::Connecting => 0,
                    State::Live => 1,
                    State::Down => 2,
                    State::GaveUp => 3,
                    State::Failed(_) | State::Closing | State::Closed => 4,
                };
                let (counters, held) = (remote.counters(), remote.held_times());
                // The state as the ANA log codes it (1 optimized, 2 non-optimized, 3
                // inaccessible, 4 persistent loss, 15 changing); 0 when not reported.
                let ana = remote.ana().map_or(0, |a| a.state.code());
                let line = format!(
                    "up={} state={state} io-queues={} associations={} losses={} \
                     failed-attempts={} transfer-errors={} path-errors={} ana-transitions={} \
                     path-moves={} portal={} ana={ana} \
                     requests={} held-ms={} held-max-ms={} in-flight={} target={}",
                    u8::from(state == 1),
                    remote.io_queues(),
                    counters.associations,
                    counters.losses,
                    counters.failed_attempts,
                    counters.transfer_errors,
                    counters.path_errors,
                    counters.ana_transitions,
                    counters.moves,
                    entry.portal,
                    held.completed,
                    held.total_ms,
                    held.max_ms,
                    remote.in_flight(),
                    namespace_spec(&entry.target)
                );
                Some((at, line))
            })
            .collect()
    }

    /// The vif's counters on the console, at most every [`COUNTERS_EVERY_MS`] and only
    /// when they moved: what an operator reads first when a remote disk is slow (frames
    /// lost on the way out, dropped on the way in).
    fn log_counters(&mut self, now_ms: u64) {
        if now_ms < self.logged.1 + COUNTERS_EVERY_MS {
            return;
        }
        let counters = self.counters();
        let device = &self.vif.stack.device;
        if counters != self.logged.0 {
            log::info!(
                "net: vif: {} packets out ({} GSO joining {} segments; {} refused by netback, {} lost with the ring full), {} packets in ({} GSO; {} dropped by netfront: {} bad extra slot, {} bad slot chain; {} bad checksum), {} events sent{}",
                counters.queues.tx_frames,
                counters.queues.tx_gso,
                device.join_stats().segments,
                counters.queues.tx_errors,
                counters.device.tx_full,
                counters.queues.rx_frames,
                counters.queues.rx_gso,
                counters.queues.rx_dropped,
                counters.queues.rx_bad_extra,
                counters.queues.rx_bad_chain,
                counters.device.rx_bad_checksum,
                counters.queues.notifications,
                per_queue(&counters.per_queue[..device.queues().len()])
            );
            for entry in self.entries.iter().flatten() {
                let held = entry.remote.held_times();
                log::info!(
                    "net: {}: {} requests completed, held {} ms on average, {} ms at most",
                    entry.name,
                    held.completed,
                    held.total_ms / held.completed.max(1),
                    held.max_ms
                );
            }
        }
        self.logged = (counters, now_ms);
    }

    /// Why a live upgrade may not start now (`None`: it may): a remote being brought
    /// up or reconnecting. Its held requests, its attempts and its give-up time belong
    /// to this image; the next one gets one bounded bring-up per remote (as an attach),
    /// so it must find the targets answering.
    pub fn not_ready_for_upgrade(&self) -> Option<String> {
        self.entries
            .iter()
            .flatten()
            .find_map(|entry| match entry.remote.state() {
                // A reconnect attempt is Connecting too: it served before.
                State::Connecting if entry.remote.first_namespace().is_none() => {
                    Some(format!("{} is connecting", entry.name))
                }
                State::Connecting | State::Down => Some(format!("{} is reconnecting", entry.name)),
                // Its controller's shutdown is awaited, at most SHUTDOWN_MS.
                State::Closing => Some(format!("{} is closing its association", entry.name)),
                State::Live | State::Failed(_) | State::GaveUp | State::Closed => None,
            })
    }

    /// A live upgrade's step before the devices stop (every ring drained, every remote
    /// flushed): each remote's connections reset, so the target lets its queues and
    /// controller go now rather than at its keep-alive timeout; the resets sent; then
    /// the vif given back to netback ([`Vif::close`]). The next image brings the vif up
    /// and connects again. Returns how many connections were reset. After this the
    /// network moves nothing until [`Net::reopen_after_upgrade`].
    pub fn close_for_upgrade(&mut self) -> Result<usize, String> {
        let mut reset = 0;
        for entry in self.entries.iter_mut().flatten() {
            for &handle in entry.conns.sockets.iter().chain(&entry.conns.probe_socket) {
                let socket = self.vif.stack.sockets.get_mut::<tcp::Socket>(handle);
                if socket.is_open() {
                    socket.abort();
                    reset += 1;
                }
            }
        }
        // smoltcp sends an aborted connection's reset at its next dispatch.
        for _ in 0..4 {
            self.vif.poll();
        }
        self.vif.close()?;
        Ok(reset)
    }

    /// After a switch that failed once [`Net::close_for_upgrade`] ran: the vif
    /// connected again ([`Vif::reopen`]); each remote sees its connections closed and
    /// reconnects as after any loss, its held requests sent again.
    pub fn reopen_after_upgrade(&mut self) -> Result<(), String> {
        self.vif.reopen()
    }

    /// Requests wait in a channel of a live remote (looked at before vCPU 0 sleeps). A
    /// remote that is away holds its channels' requests on purpose: vCPU 0
    /// sleeps meanwhile (at most 1 ms: `NetPoll::busy`).
    pub fn has_submissions(&self) -> bool {
        self.entries.iter().flatten().any(|e| {
            e.remote.state() == State::Live
                && e.remote.channels().iter().any(|c| c.has_submissions())
        })
    }

    /// Before vCPU 0 sleeps: asks netback for an event at its next rx or tx response
    /// (without it netback's first response after a sleep raises none, and a frame
    /// waits for the sleep's deadline); true when one came meanwhile.
    pub fn frames_waiting(&self) -> bool {
        self.vif.final_check()
    }
}

/// The packets in on each queue, when there are several: `; in by queue 120/98 (0 TCP
/// off the hash's queue)`.
fn plural(n: u16) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn per_queue(queues: &[(u64, u64)]) -> String {
    if queues.len() < 2 {
        return String::new();
    }
    let counts: Vec<String> = queues.iter().map(|(n, _)| format!("{n}")).collect();
    let off: u64 = queues.iter().map(|(_, off)| off).sum();
    format!(
        "; in by queue {} ({off} TCP off the hash's queue)",
        counts.join("/")
    )
}

/// A remote namespace's queue as a ring's engine drives it: the channel's producer end,
/// which rings vCPU 0 for each request.
struct RemoteQueue(DiskQueue);

impl BlockDevice for RemoteQueue {
    blkdev::forward_to!(0: geometry, queue_depth, poll_completions, fault);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        // Before the request is visible: the network side sends it on this vCPU's I/O
        // queue, and wakes this vCPU for its completion.
        let cpu = crate::smp::current().index.load(Ordering::Relaxed);
        self.0.shared().producer_cpu.store(cpu, Ordering::Relaxed);
        self.0.submit(request, buffers)?;
        // Every request from another vCPU rings vCPU 0: asleep, it wakes; awake, its next
        // sleep returns at once. (Ringing only while a flag said vCPU 0 slept lost
        // wake-ups in the rig: requests waited for its 1 s deadline.)
        if cpu != 0 {
            super::poller::ring_doorbell(0);
        }
        Ok(())
    }
}

/// A new remote's socket buffers come out of the memory disks and rings may take, so a
/// remote the heap cannot hold is refused instead of aborting the domain.
fn socket_memory_fits(bytes: usize) -> Result<(), (String, i32)> {
    crate::mm::DISK_MEMORY
        .fits(bytes as u64)
        .map_err(|no_room| {
            (
                format!("the connections' socket buffers do not fit: {no_room}"),
                xen::xenbus::error::errno::ENOMEM,
            )
        })
}

/// A zeroed socket buffer, or a refusal if the heap has no piece that large.
fn socket_buffer(bytes: usize) -> Result<Vec<u8>, (String, i32)> {
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(bytes).map_err(|_| {
        (
            format!("the connections' socket buffers do not fit: no {bytes} bytes in one piece"),
            xen::xenbus::error::errno::ENOMEM,
        )
    })?;
    buffer.resize(bytes, 0);
    Ok(buffer)
}

fn no_socket_left() -> (String, i32) {
    ("no socket left".into(), xen::xenbus::error::errno::ENOSPC)
}
