// SPDX-License-Identifier: MIT OR Apache-2.0
//! smoltcp's interface over one vif: a static IPv4 address (the command line's
//! `net.ip`/`net.gw`) or one from smoltcp's DHCPv4 client (`net.ip=dhcp`), and a socket
//! set whose storage and buffers the caller gives once (taken from the heap at set-up
//! and never given back), so polling allocates nothing.

use crate::lease::{Lease, LeaseEvent, FAST_DISCOVER_MS};
use crate::phy::NetDevice;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet, SocketStorage};
use smoltcp::socket::{dhcpv4, tcp};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address, Ipv4Cidr};

/// blkdom's address on its vif.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Setup {
    pub address: [u8; 4],
    pub prefix: u8,
    pub gateway: Option<[u8; 4]>,
}

/// Where the interface's address comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    Static(Ipv4Setup),
    /// A DHCPv4 lease, asked for at once and renewed by [`Stack::poll`]; the interface
    /// has no address until the first one.
    Dhcp,
}

pub struct Stack {
    pub device: NetDevice,
    pub iface: Interface,
    pub sockets: SocketSet<'static>,
    sockets_capacity: usize,
    /// The DHCPv4 client's socket (`Addressing::Dhcp`) and what it leased.
    dhcp: Option<(SocketHandle, Lease)>,
}

impl Stack {
    /// An interface with `mac` and its address from `addressing` on `device`. `seed`
    /// picks TCP's initial sequence numbers and local ports: give each boot its own (the
    /// TSC will do). With DHCP the client takes one socket of `storage`.
    pub fn new(
        mut device: NetDevice,
        mac: [u8; 6],
        addressing: Addressing,
        seed: u64,
        now_ms: u64,
        storage: &'static mut [SocketStorage<'static>],
    ) -> Self {
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        config.random_seed = seed;
        let iface = Interface::new(config, &mut device, Instant::from_millis(now_ms as i64));
        let sockets_capacity = storage.len();
        let mut stack = Self {
            device,
            iface,
            sockets: SocketSet::new(storage),
            sockets_capacity,
            dhcp: None,
        };
        match addressing {
            Addressing::Static(ip) => stack.set_address(Some(ip)),
            Addressing::Dhcp if sockets_capacity > 0 => {
                let mut client = dhcpv4::Socket::new();
                let mut retry = dhcpv4::RetryConfig::default();
                // smoltcp's 10 s would make a boot that lost its first DISCOVER wait
                // past its bound; `poll_lease` slows down when no server answers.
                retry.discover_timeout = Duration::from_millis(FAST_DISCOVER_MS);
                client.set_retry_config(retry);
                let handle = stack.sockets.add(client);
                stack.dhcp = Some((handle, Lease::new(now_ms)));
            }
            // No room for the client: the interface stays without an address, and
            // `lease` says so.
            Addressing::Dhcp => {}
        }
        stack
    }

    /// The interface's address and default route become `ip`'s (`None`: none).
    fn set_address(&mut self, ip: Option<Ipv4Setup>) {
        self.iface.update_ip_addrs(|addrs| {
            addrs.clear();
            if let Some(ip) = ip {
                let [a, b, c, d] = ip.address;
                // One address in a list of at least one: cannot be full.
                let _ = addrs.push(IpCidr::Ipv4(Ipv4Cidr::new(
                    Ipv4Address::new(a, b, c, d),
                    ip.prefix,
                )));
            }
        });
        let routes = self.iface.routes_mut();
        match ip.and_then(|ip| ip.gateway) {
            Some([a, b, c, d]) => {
                // A route table with room for one default route.
                let _ = routes.add_default_ipv4_route(Ipv4Address::new(a, b, c, d));
            }
            None => {
                routes.remove_default_ipv4_route();
            }
        }
    }

    /// The DHCP client's lease (`None`: a static address).
    pub fn lease(&self) -> Option<&Lease> {
        self.dhcp.as_ref().map(|(_, lease)| lease)
    }

    /// What the DHCP client did since it was last asked, applied to the interface (a
    /// lease: its address, prefix and router; a lease lost: no address, no route), and
    /// the DISCOVER interval for the time without a lease ([`Lease::discover_retry_ms`]).
    /// Call after every [`Stack::poll`]; allocates nothing.
    pub fn poll_lease(&mut self, now_ms: u64) -> Option<LeaseEvent> {
        let (handle, lease) = self.dhcp.as_ref()?;
        let retry = Duration::from_millis(lease.discover_retry_ms(now_ms));
        let client = self.sockets.get_mut::<dhcpv4::Socket>(*handle);
        let mut config = client.get_retry_config();
        if config.discover_timeout != retry {
            config.discover_timeout = retry;
            client.set_retry_config(config);
        }
        let event = match client.poll()? {
            dhcpv4::Event::Configured(config) => Some(crate::lease::checked(Ipv4Setup {
                address: config.address.address().octets(),
                prefix: config.address.prefix_len(),
                gateway: config.router.map(|r| r.octets()),
            })),
            dhcpv4::Event::Deconfigured => None,
        };
        let (_, lease) = self.dhcp.as_mut()?;
        let change = lease.update(event, now_ms);
        if change.is_some() {
            self.set_address(event);
        }
        change
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

    /// Moves frames and runs the sockets' timers, then sends the packets still being
    /// joined ([`NetDevice::flush`]); true when a socket's state may have changed.
    pub fn poll(&mut self, now_ms: u64) -> bool {
        let now = Instant::from_millis(now_ms as i64);
        let changed = self.iface.poll(now, &mut self.device, &mut self.sockets);
        self.device.flush();
        changed != smoltcp::iface::PollResult::None
    }

    /// How long smoltcp may sleep before a timer needs it, in ms (`None`: no timer).
    pub fn poll_delay_ms(&mut self, now_ms: u64) -> Option<u64> {
        self.iface
            .poll_delay(Instant::from_millis(now_ms as i64), &self.sockets)
            .map(|d| d.total_millis())
    }
}
