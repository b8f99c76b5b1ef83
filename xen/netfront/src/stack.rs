// SPDX-License-Identifier: MIT OR Apache-2.0
//! smoltcp's interface over one vif: a static IPv4 address (the command line's
//! `net.ip`/`net.gw`), and a socket set whose storage and buffers the caller gives once
//! (taken from the heap at set-up and never given back), so polling allocates nothing.

use crate::phy::NetDevice;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet, SocketStorage};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address, Ipv4Cidr};

/// blkdom's address on its vif.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Setup {
    pub address: [u8; 4],
    pub prefix: u8,
    pub gateway: Option<[u8; 4]>,
}

pub struct Stack {
    pub device: NetDevice,
    pub iface: Interface,
    pub sockets: SocketSet<'static>,
    sockets_capacity: usize,
}

impl Stack {
    /// An interface with `mac` and `ip` on `device`. `seed` picks TCP's initial
    /// sequence numbers and local ports: give each boot its own (the TSC will do).
    pub fn new(
        mut device: NetDevice,
        mac: [u8; 6],
        ip: Ipv4Setup,
        seed: u64,
        now_ms: u64,
        storage: &'static mut [SocketStorage<'static>],
    ) -> Self {
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut device, Instant::from_millis(now_ms as i64));
        let [a, b, c, d] = ip.address;
        iface.update_ip_addrs(|addrs| {
            // One address in a list of at least one: cannot be full.
            let _ = addrs.push(IpCidr::Ipv4(Ipv4Cidr::new(
                Ipv4Address::new(a, b, c, d),
                ip.prefix,
            )));
        });
        if let Some([a, b, c, d]) = ip.gateway {
            // A route table with room for one default route.
            let _ = iface
                .routes_mut()
                .add_default_ipv4_route(Ipv4Address::new(a, b, c, d));
        }
        let sockets_capacity = storage.len();
        Self {
            device,
            iface,
            sockets: SocketSet::new(storage),
            sockets_capacity,
        }
    }

    /// Adds a TCP socket over the buffers given (`None`: the socket set is full).
    pub fn add_tcp(
        &mut self,
        rx: &'static mut [u8],
        tx: &'static mut [u8],
    ) -> Option<SocketHandle> {
        let free = self.sockets.iter().count() < self.capacity();
        free.then(|| {
            self.sockets.add(tcp::Socket::new(
                tcp::SocketBuffer::new(rx),
                tcp::SocketBuffer::new(tx),
            ))
        })
    }

    fn capacity(&self) -> usize {
        // A socket set over a borrowed slice never grows (adding past it panics).
        self.sockets_capacity
    }

    /// Moves frames and runs the sockets' timers; true when a socket's state may have
    /// changed. Then tells the backend of what was pushed.
    pub fn poll(&mut self, now_ms: u64) -> bool {
        let now = Instant::from_millis(now_ms as i64);
        let changed = self.iface.poll(now, &mut self.device, &mut self.sockets);
        changed != smoltcp::iface::PollResult::None
    }

    /// How long smoltcp may sleep before a timer needs it, in ms (`None`: no timer).
    pub fn poll_delay_ms(&mut self, now_ms: u64) -> Option<u64> {
        self.iface
            .poll_delay(Instant::from_millis(now_ms as i64), &self.sockets)
            .map(|d| d.total_millis())
    }
}
