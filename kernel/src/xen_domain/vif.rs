// SPDX-License-Identifier: MIT OR Apache-2.0
//! blkdom's vif, the storage network (`netfront`, docs/design.md §5.10): our own grant
//! table, each queue's rings, frame pages and event channel granted to netback (one
//! queue per vCPU when netback offers queues and a control ring), the xenbus handshake,
//! the hash set-up on the control ring, and smoltcp's interface with the command line's
//! static address or a DHCPv4 lease (`net.ip=dhcp`). Every queue is drained by vCPU 0's
//! network pass. Set up once; every page is taken here and never given back, so the
//! data path allocates nothing.

use super::{get, now_ns, shared_page, zeroed_frame};
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use bootconfig::NetSetup;
use netfront::ctrl::{set_up_hash, CtrlRing, Waits};
use netfront::hash::{Steering, MAX_QUEUES};
use netfront::lease::LeaseEvent;
use netfront::stack::{Addressing, Ipv4Setup, Stack};
use netfront::xenbus::{connect, Connected, CtrlRef, Made, Plan, Rings, VifInfo};
use netfront::{NetDevice, NetQueue, Page};
use smoltcp::iface::SocketStorage;
use xen::abi::event_channel::EvtchnPort;
use xen::grant::{map_own_table, GrantTable};
use xen::raw::hypercall::NativeHypervisor;

/// Our grant table's frames at most (512 entries each): [`MAX_QUEUES`] queues of two
/// rings and 512 pages, the control ring and the hash page, past the 8 reserved entries.
pub const GRANT_FRAMES: u32 =
    (RESERVED_GRANTS + MAX_QUEUES as u32 * GRANTS_PER_QUEUE + 2).div_ceil(GRANTS_PER_FRAME);
const GRANTS_PER_FRAME: u32 = 512;
const GRANTS_PER_QUEUE: u32 = 2 + 512;
const RESERVED_GRANTS: u32 = 8;
/// Sockets the interface can hold: one per connection of each remote namespace (its
/// admin queue's and one per I/O queue), and the DHCP client's.
const SOCKETS: usize = crate::backend::net::MAX_LINKS * crate::backend::net::MAX_REMOTES + 1;
/// The vif blkdom uses (the first of the xl config's `vif=`).
const VIF_DIR: &str = "device/vif/0";

/// How netback steers packets to the vif's queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Steer {
    /// One queue: nothing to steer.
    Single,
    /// The control ring set Toeplitz up: [`Steering`] says each flow's queue.
    Hashed(Steering),
    /// Several queues, but the hash set-up failed (why): packets arrive on queues
    /// blkdom cannot predict (every queue is still drained).
    Unknown(String),
}

/// The vif, connected.
pub struct Vif {
    pub stack: Stack,
    pub info: VifInfo,
    /// What was planned with netback (queues, control ring, why one queue).
    pub plan: Plan,
    pub max_queues: Option<u32>,
    pub steer: Steer,
    /// One event channel per queue.
    ports: Vec<EvtchnPort>,
    hv: NativeHypervisor,
    /// What [`Vif::close`] gives back: our grant table with every reference granted
    /// to netback, the control ring's event channel, the keys the handshake published.
    grants: Grants,
    ctrl_port: Option<EvtchnPort>,
    published: Vec<String>,
    /// The queues asked for at bring-up (a reopen asks the same).
    wanted: u16,
    /// Closed ([`Vif::close`]): nothing moves any more.
    closed: bool,
}

impl Vif {
    /// The queues' event channels (masked: a poller waits on their pending bits).
    pub fn ports(&self) -> &[EvtchnPort] {
        &self.ports
    }

    pub fn now_ms() -> u64 {
        now_ns() / 1_000_000
    }

    /// Moves frames and runs smoltcp's timers (the DHCP client's among them: a lease,
    /// its renewal, its loss are taken and logged here), then tells netback of what was
    /// pushed (one event a queue for all of it). True when a socket may have changed.
    pub fn poll(&mut self) -> bool {
        if self.closed {
            return false;
        }
        let now = Self::now_ms();
        let changed = self.stack.poll(now);
        if let Some(event) = self.stack.poll_lease(now) {
            match event {
                LeaseEvent::Lost { .. } => log::error!("net: {event}"),
                _ => log::info!("net: {event}"),
            }
        }
        for (queue, port) in self.stack.device.queues_mut().iter_mut().zip(&self.ports) {
            if queue.take_notify() {
                // A failed send means netback closed its end; the queue's fault says more.
                let _ = xen::evtchn::send(&self.hv, *port);
            }
        }
        changed
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES` on every queue: true when something arrived.
    pub fn final_check(&self) -> bool {
        self.stack
            .device
            .queues()
            .iter()
            .fold(false, |any, q| q.final_check() | any)
    }

    /// The steering, how segments go out and the MTU, for the console: `2 queues
    /// (netback offers 2), Toeplitz over IPv4/TCP, table of 128; GSO on send; MTU 9000`
    /// and the like.
    pub fn describe_queues(&self) -> String {
        let send = if self.plan.tx_gso {
            "GSO on send"
        } else {
            "one frame per segment on send (netback takes no GSO: feature-sg, feature-gso-tcpv4)"
        };
        let mtu = match self.plan.mtu_note {
            Some(why) => format!("MTU {} ({why})", self.stack.device.mtu()),
            None => format!("MTU {}", self.stack.device.mtu()),
        };
        format!("{}; {send}; {mtu}", self.describe_steering())
    }

    fn describe_steering(&self) -> String {
        let queues = self.ports.len();
        match &self.steer {
            Steer::Single => match self.plan.single_because {
                Some(why) => format!("1 queue ({why})"),
                None => "1 queue".into(),
            },
            Steer::Hashed(s) => format!(
                "{queues} queues (netback offers {}), Toeplitz over IPv4/TCP, table of {}",
                self.max_queues.unwrap_or(1),
                s.table_size()
            ),
            Steer::Unknown(why) => {
                format!("{queues} queues, no hash (control ring: {why}); flows land anywhere")
            }
        }
    }
    /// Why the vif has no address now (`None`: it has one): no DHCP lease yet, or lost.
    pub fn no_address(&self) -> Option<&'static str> {
        self.stack.lease().and_then(|lease| lease.refusal())
    }

    /// Hands the vif back to netback for good, as a live upgrade's last step before
    /// the jump (the next image connects it again from the toolstack's keys): netback
    /// lets the rings go (`netfront::xenbus::disconnect`, bounded), then every page
    /// granted to it is taken back (a grant netback still uses is an error: its page
    /// must not be reused) and the event channels are closed. Frames are sent no more.
    pub fn close(&mut self) -> Result<(), String> {
        self.closed = true;
        let published = core::mem::take(&mut self.published);
        let mut now = Vif::now_ms;
        let mut pause = || spin_ms(10);
        super::store::with(|client| {
            let mut store = crate::backend::adapters::Store(client);
            netfront::xenbus::disconnect(
                &mut store,
                VIF_DIR,
                &self.info.backend,
                &published,
                &mut now,
                &mut pause,
            )
        })
        .ok_or("no xenstore")?
        .map_err(|e| format!("{VIF_DIR}: {e}"))?;
        let granted = core::mem::take(&mut self.grants.granted);
        let held = granted
            .iter()
            .filter(|&&gref| self.grants.table.end_access(gref).is_err())
            .count();
        for port in self.ports.iter().chain(&self.ctrl_port) {
            let _ = xen::evtchn::close(&self.hv, *port);
        }
        if held > 0 {
            return Err(format!(
                "netback said Closed but still uses {held} of {} granted pages",
                granted.len()
            ));
        }
        Ok(())
    }

    /// Connects a closed vif again (a live upgrade that failed after [`Vif::close`]):
    /// the same handshake over the same frames, new queues under the same interface and
    /// sockets (whose connections were reset: their owners connect again). Its event
    /// channels may differ from before ([`Vif::ports`]).
    pub fn reopen(&mut self) -> Result<(), String> {
        if !self.closed {
            return Ok(());
        }
        let made = connect_device(&mut self.grants, self.hv, self.wanted)?;
        // The interface read its MTU once, when it was made: the new device keeps it.
        let mtu = self.stack.device.mtu();
        self.stack.device = net_device(made.queues, &made.steer, &made.connected.plan);
        self.stack.device.set_mtu(mtu);
        self.info = made.connected.info;
        self.plan = made.connected.plan;
        self.max_queues = made.connected.max_queues;
        self.published = made.connected.published;
        self.steer = made.steer;
        self.ports = made.ports;
        self.ctrl_port = made.ctrl_port;
        self.closed = false;
        self.poll();
        Ok(())
    }

    /// With DHCP, polls until a first lease or `bound_ms` have passed; true when the
    /// vif has an address. Only at boot, before anything else uses the vif.
    pub fn await_address(&mut self, bound_ms: u64) -> bool {
        let until = Self::now_ms() + bound_ms;
        while self.no_address().is_some() && Self::now_ms() < until {
            self.poll();
            core::hint::spin_loop();
        }
        self.no_address().is_none()
    }
}

/// The frames the vif's pages live in, taken once: a connection made again after
/// [`Vif::close`] ([`Vif::reopen`]) grants the same frames anew (rings are reset by
/// their `init`, other pages are written before they are read), so closing and
/// reopening costs no memory.
#[derive(Default)]
struct Frames {
    frames: Vec<u64>,
    next: usize,
}

impl Frames {
    fn take(&mut self) -> Result<u64, String> {
        let frame = match self.frames.get(self.next) {
            Some(&frame) => frame,
            None => {
                let frame = zeroed_frame().map_err(|e| format!("{e}"))?;
                self.frames.push(frame);
                frame
            }
        };
        self.next += 1;
        Ok(frame)
    }
}

/// Our grant table and what is granted from it to netback.
struct Grants {
    table: GrantTable,
    granted: Vec<xen::abi::grant_table::GrantRef>,
    frames: Frames,
}

impl Grants {
    /// A page of ours granted to `backend`.
    fn page(&mut self, backend: u16, readonly: bool) -> Result<Page, String> {
        let frame = self.frames.take()?;
        let gref = self
            .table
            .grant_access(backend, frame >> 12, readonly)
            .map_err(|e| format!("grant: {e}"))?;
        self.granted.push(gref);
        // SAFETY: a frame of ours (taken for the vif and never freed), shared with
        // netback only, reached only through the vif's windows.
        let mem = unsafe { shared_page(frame, 4096) };
        Ok(Page { mem, gref })
    }
}

/// A connected vif's device side: its queues (rx posted, hash slots taken when the
/// control ring set a hash up) and what the handshake settled.
struct Device {
    queues: Vec<NetQueue>,
    ports: Vec<EvtchnPort>,
    ctrl_port: Option<EvtchnPort>,
    connected: Connected,
    steer: Steer,
}

/// The handshake with netback for up to `wanted` queues, the rings made from `grants`,
/// then the hash set-up on the control ring when there are several.
fn connect_device(
    grants: &mut Grants,
    hv: NativeHypervisor,
    wanted: u16,
) -> Result<Device, String> {
    grants.frames.next = 0;
    let mut queues: Vec<(NetQueue, EvtchnPort)> = Vec::with_capacity(MAX_QUEUES);
    let mut ctrl = None;
    let mut make_rings = |info: &VifInfo, plan: &Plan| -> Result<Made, String> {
        let backend = info.backend_id;
        let mut made = Made {
            queues: Vec::with_capacity(usize::from(plan.queues)),
            ctrl: None,
        };
        for _ in 0..plan.queues {
            let tx_ring = grants.page(backend, false)?;
            let rx_ring = grants.page(backend, false)?;
            let mut tx_pages = Box::new([tx_ring; 256]);
            for p in tx_pages.iter_mut() {
                *p = grants.page(backend, true)?;
            }
            let mut rx_pages = Box::new([rx_ring; 256]);
            for p in rx_pages.iter_mut() {
                *p = grants.page(backend, false)?;
            }
            let port = event_channel(backend)?;
            queues.push((
                NetQueue::new(tx_ring.mem, rx_ring.mem, tx_pages, rx_pages),
                port,
            ));
            made.queues.push(Rings {
                tx_ref: tx_ring.gref,
                rx_ref: rx_ring.gref,
                port,
            });
        }
        if plan.ctrl_ring {
            let ring = grants.page(backend, false)?;
            // The key and the table are read by netback: read-only.
            let data = grants.page(backend, true)?;
            let port = event_channel(backend)?;
            ctrl = Some((CtrlRing::new(ring.mem), data, port));
            made.ctrl = Some(CtrlRef {
                gref: ring.gref,
                port,
            });
        }
        Ok(made)
    };
    let mut now = Vif::now_ms;
    let mut pause = || spin_ms(10);
    let connected = super::store::with(|client| {
        let mut store = crate::backend::adapters::Store(client);
        connect(
            &mut store,
            VIF_DIR,
            wanted,
            &mut now,
            &mut pause,
            &mut make_rings,
        )
    })
    .ok_or("no xenstore")?
    .map_err(|e| format!("{VIF_DIR}: {e}"))?;
    let ctrl_port = ctrl.as_ref().map(|(_, _, port)| *port);
    let (mut queues, ports): (Vec<NetQueue>, Vec<EvtchnPort>) = queues.into_iter().unzip();
    if ctrl.is_some() {
        // netif.h: a frontend that sets a hash up takes hash extra slots.
        queues.iter_mut().for_each(NetQueue::accept_hash);
    }
    queues.iter_mut().for_each(NetQueue::post_rx);
    let steer = match ctrl {
        None => Steer::Single,
        Some((mut ring, data, port)) => {
            let mut kick = || {
                let _ = xen::evtchn::send(&hv, port);
            };
            let mut pause = || spin_ms(1);
            let mut waits = Waits {
                now_ms: &mut now,
                pause: &mut pause,
                kick: &mut kick,
            };
            // After netback's Connected: it checks the table against the queues it
            // connected.
            match set_up_hash(&mut ring, ports.len() as u16, &data, &mut waits) {
                Ok(steering) => Steer::Hashed(steering),
                Err(e) => {
                    log::error!("net: vif: hash set-up on the control ring failed: {e}");
                    Steer::Unknown(format!("{e}"))
                }
            }
        }
    };
    Ok(Device {
        queues,
        ports,
        ctrl_port,
        connected,
        steer,
    })
}

/// A [`NetDevice`] over `queues`, steering as `steer` says, joining segments on send
/// when netback takes GSO packets (`plan.tx_gso`), at the planned MTU.
fn net_device(queues: Vec<NetQueue>, steer: &Steer, plan: &Plan) -> NetDevice {
    let mut device = NetDevice::with_queues(queues);
    device.set_mtu(usize::from(plan.mtu));
    if let Steer::Hashed(steering) = steer {
        device.set_steering(Some(*steering));
    }
    if plan.tx_gso {
        device.set_tx_gso();
    }
    device
}

/// Brings the vif up: grant table frames at guest-physical `grant_gpa` (a hole in the
/// memory map, [`GRANT_FRAMES`] pages), then the handshake with netback for up to
/// `wanted` queues (blkdom's vCPUs, at most [`MAX_QUEUES`], as many as the grant table
/// holds), the hash set-up on the control ring with several, and the interface.
/// Bounded: netback gets 10 s for each of its steps, 2 s for each control request.
pub fn bring_up(net: &NetSetup, grant_gpa: u64, wanted: usize) -> Result<Vif, String> {
    let domain = get().ok_or("not under Xen")?;
    let hv = domain.hv;
    let frames = map_own_table(&hv, grant_gpa >> 12, GRANT_FRAMES)
        .map_err(|e| format!("grant table: {e:?}"))?;
    let fit = (frames * GRANTS_PER_FRAME).saturating_sub(RESERVED_GRANTS + 2) / GRANTS_PER_QUEUE;
    if fit == 0 {
        return Err(format!(
            "grant table: {frames} frames, too few for one queue (max_grant_frames)"
        ));
    }
    let wanted = wanted.clamp(1, MAX_QUEUES).min(fit as usize) as u16;
    // SAFETY: the grant table frames Xen just put at these addresses; nothing else uses
    // them.
    let entries = unsafe { shared_page(grant_gpa, frames as usize * 4096) };
    let mut grants = Grants {
        table: GrantTable::new(entries),
        granted: Vec::new(),
        frames: Frames::default(),
    };
    let made = connect_device(&mut grants, hv, wanted)?;
    let storage: &'static mut [SocketStorage<'static>] =
        Box::leak(Box::new([SocketStorage::EMPTY; SOCKETS]));
    let addressing = match net {
        NetSetup::Static(net) => Addressing::Static(Ipv4Setup {
            address: net.address,
            prefix: net.prefix,
            gateway: net.gateway,
        }),
        NetSetup::Dhcp => Addressing::Dhcp,
    };
    let seed = xen::raw::cpu::read_tsc();
    let mut vif = Vif {
        stack: Stack::new(
            net_device(made.queues, &made.steer, &made.connected.plan),
            made.connected.info.mac,
            addressing,
            seed,
            Vif::now_ms(),
            storage,
        ),
        info: made.connected.info,
        plan: made.connected.plan,
        max_queues: made.connected.max_queues,
        steer: made.steer,
        ports: made.ports,
        hv,
        grants,
        ctrl_port: made.ctrl_port,
        published: made.connected.published,
        wanted,
        closed: false,
    };
    vif.poll();
    Ok(vif)
}

/// An event channel for netback, masked: polled, never taken as an upcall.
fn event_channel(backend: u16) -> Result<EvtchnPort, String> {
    let domain = get().ok_or("not under Xen")?;
    let port = xen::evtchn::alloc_unbound(&domain.hv, backend)
        .map_err(|e| format!("event channel: {e:?}"))?;
    domain.shared.mask(port);
    Ok(port)
}

fn spin_ms(ms: u64) {
    let until = now_ns() + ms * 1_000_000;
    while now_ns() < until {
        core::hint::spin_loop();
    }
}
