// SPDX-License-Identifier: MIT OR Apache-2.0
//! blkdom's vif, the storage network (`netfront`, docs/design.md §5.10): our own grant
//! table, the rings and frame pages granted to netback, the event channel, the xenbus
//! handshake, and smoltcp's interface with the command line's static address or a
//! DHCPv4 lease (`net.ip=dhcp`). Set up once; every page is taken here and never given back, so the data path allocates
//! nothing.

use super::{get, now_ns, shared_page, zeroed_frame};
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use bootconfig::NetSetup;
use netfront::lease::LeaseEvent;
use netfront::stack::{Addressing, Ipv4Setup, Stack};
use netfront::xenbus::{connect, Rings, VifInfo};
use netfront::{NetDevice, NetQueue, Page};
use smoltcp::iface::SocketStorage;
use xen::abi::event_channel::EvtchnPort;
use xen::grant::{map_own_table, GrantTable};
use xen::raw::hypercall::NativeHypervisor;

/// Our grant table's frames: 1,024 entries, enough for the two rings and 512 pages.
pub const GRANT_FRAMES: u32 = 2;
/// Sockets the interface can hold: two per remote namespace (its admin and I/O queue),
/// and the DHCP client's.
const SOCKETS: usize = 2 * crate::backend::net::MAX_REMOTES + 1;
/// The vif blkdom uses (the first of the xl config's `vif=`).
const VIF_DIR: &str = "device/vif/0";

/// The vif, connected.
pub struct Vif {
    pub stack: Stack,
    pub info: VifInfo,
    port: EvtchnPort,
    hv: NativeHypervisor,
}

impl Vif {
    /// The vif's event channel (masked: a poller waits on its pending bit).
    pub fn port(&self) -> EvtchnPort {
        self.port
    }

    pub fn now_ms() -> u64 {
        now_ns() / 1_000_000
    }

    /// Moves frames and runs smoltcp's timers (the DHCP client's among them: a lease,
    /// its renewal, its loss are taken and logged here), then tells netback of what was
    /// pushed (one event for all of it). True when a socket may have changed.
    pub fn poll(&mut self) -> bool {
        let now = Self::now_ms();
        let changed = self.stack.poll(now);
        if let Some(event) = self.stack.poll_lease(now) {
            match event {
                LeaseEvent::Lost { .. } => log::error!("net: {event}"),
                _ => log::info!("net: {event}"),
            }
        }
        if self.stack.device.queue_mut().take_notify() {
            // A failed send means netback closed its end; the queue's fault says more.
            let _ = xen::evtchn::send(&self.hv, self.port);
        }
        changed
    }

    /// Why the vif has no address now (`None`: it has one): no DHCP lease yet, or lost.
    pub fn no_address(&self) -> Option<&'static str> {
        self.stack.lease().and_then(|lease| lease.refusal())
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

fn page(table: &mut GrantTable, backend: u16, readonly: bool) -> Result<Page, String> {
    let frame = zeroed_frame().map_err(|e| format!("{e}"))?;
    let gref = table
        .grant_access(backend, frame >> 12, readonly)
        .map_err(|e| format!("grant: {e}"))?;
    // SAFETY: a fresh frame of ours, shared with netback only, reached only through this
    // window from now on.
    let mem = unsafe { shared_page(frame, 4096) };
    Ok(Page { mem, gref })
}

/// Brings the vif up: grant table frames at guest-physical `grant_gpa` (a hole in the
/// memory map, [`GRANT_FRAMES`] pages), then the handshake with netback and the
/// interface. Bounded: netback gets 10 s for each of its steps.
pub fn bring_up(net: &NetSetup, grant_gpa: u64) -> Result<Vif, String> {
    let domain = get().ok_or("not under Xen")?;
    let hv = domain.hv;
    let frames = map_own_table(&hv, grant_gpa >> 12, GRANT_FRAMES)
        .map_err(|e| format!("grant table: {e:?}"))?;
    if frames < GRANT_FRAMES {
        return Err(format!(
            "grant table: {frames} frames, {GRANT_FRAMES} needed (max_grant_frames)"
        ));
    }
    // SAFETY: the grant table frames Xen just put at these addresses; nothing else uses
    // them.
    let entries = unsafe { shared_page(grant_gpa, GRANT_FRAMES as usize * 4096) };
    let mut table = GrantTable::new(entries);
    let mut queue = None;
    let mut make_rings = |info: &VifInfo| -> Result<Rings, String> {
        let backend = info.backend_id;
        let tx_ring = page(&mut table, backend, false)?;
        let rx_ring = page(&mut table, backend, false)?;
        let mut tx_pages = Box::new([tx_ring; 256]);
        for p in tx_pages.iter_mut() {
            *p = page(&mut table, backend, true)?;
        }
        let mut rx_pages = Box::new([rx_ring; 256]);
        for p in rx_pages.iter_mut() {
            *p = page(&mut table, backend, false)?;
        }
        let port = xen::evtchn::alloc_unbound(&hv, backend)
            .map_err(|e| format!("event channel: {e:?}"))?;
        // Polled, never taken as an upcall.
        domain.shared.mask(port);
        queue = Some((
            NetQueue::new(tx_ring.mem, rx_ring.mem, tx_pages, rx_pages),
            port,
        ));
        Ok(Rings {
            tx_ref: tx_ring.gref,
            rx_ref: rx_ring.gref,
            port,
        })
    };
    let mut now = Vif::now_ms;
    let mut pause = || {
        let until = now_ns() + 10_000_000;
        while now_ns() < until {
            core::hint::spin_loop();
        }
    };
    let info = super::store::with(|client| {
        let mut store = crate::backend::adapters::Store(client);
        connect(&mut store, VIF_DIR, &mut now, &mut pause, &mut make_rings)
    })
    .ok_or("no xenstore")?
    .map_err(|e| format!("{VIF_DIR}: {e}"))?;
    let (mut queue, port) = queue.ok_or("no rings were made")?;
    queue.post_rx();
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
            NetDevice::new(queue),
            info.mac,
            addressing,
            seed,
            Vif::now_ms(),
            storage,
        ),
        info,
        port,
        hv,
    };
    vif.poll();
    Ok(vif)
}
