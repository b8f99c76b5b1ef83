// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the DHCPv4 client has leased (`net.ip=dhcp`), apart from smoltcp: which of its
//! events change the interface, what the console says of them, and what an `nvme-tcp:`
//! disk is told while there is no address. Times are the caller's clock, in ms.

use crate::stack::Ipv4Setup;
use core::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No lease since boot.
    Waiting,
    Leased(Ipv4Setup),
    /// A lease expired (or its server refused its renewal); the client looks for another.
    Lost,
}

/// How long DISCOVERs go out every [`FAST_DISCOVER_MS`] after boot or a lost lease: a
/// boot waits for a first lease, and a server that lost one DISCOVER answers the next.
pub const FAST_DISCOVER_WINDOW_MS: u64 = 30_000;
/// The DISCOVER interval inside that window.
pub const FAST_DISCOVER_MS: u64 = 1_000;
/// The interval after it (smoltcp's own default): with no server on the vif, a
/// DISCOVER a second would wake vCPU 0 every second for as long as blkdom runs.
pub const SLOW_DISCOVER_MS: u64 = 10_000;

/// The lease the interface holds, and since when it is in that state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    state: State,
    since_ms: u64,
}

/// A change the interface takes, for the console.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEvent {
    /// A lease where there was none: `waited_ms` since boot or since the last was lost.
    Acquired { ip: Ipv4Setup, waited_ms: u64 },
    /// A renewal or a new server gave other settings.
    Changed { old: Ipv4Setup, new: Ipv4Setup },
    /// The lease `ip` ended without a renewal: the interface has no address.
    Lost { ip: Ipv4Setup },
}

impl Lease {
    pub fn new(now_ms: u64) -> Self {
        Lease {
            state: State::Waiting,
            since_ms: now_ms,
        }
    }

    /// The client's news (`Some`: a lease, `None`: none): the change it makes, if any.
    /// smoltcp reports "no lease" when it starts and a lease again when a renewal keeps
    /// it: neither changes anything.
    pub fn update(&mut self, leased: Option<Ipv4Setup>, now_ms: u64) -> Option<LeaseEvent> {
        let event = match (self.state, leased) {
            (State::Leased(old), Some(new)) if old == new => return None,
            (State::Leased(old), Some(new)) => LeaseEvent::Changed { old, new },
            (State::Waiting | State::Lost, Some(ip)) => LeaseEvent::Acquired {
                ip,
                waited_ms: now_ms.saturating_sub(self.since_ms),
            },
            (State::Leased(ip), None) => LeaseEvent::Lost { ip },
            (State::Waiting | State::Lost, None) => return None,
        };
        self.state = leased.map_or(State::Lost, State::Leased);
        self.since_ms = now_ms;
        Some(event)
    }

    /// How long the client waits for an OFFER before it sends the next DISCOVER:
    /// [`FAST_DISCOVER_MS`] for the first [`FAST_DISCOVER_WINDOW_MS`] without a lease,
    /// [`SLOW_DISCOVER_MS`] after.
    pub fn discover_retry_ms(&self, now_ms: u64) -> u64 {
        let waiting = now_ms.saturating_sub(self.since_ms);
        match self.state {
            State::Waiting | State::Lost if waiting >= FAST_DISCOVER_WINDOW_MS => SLOW_DISCOVER_MS,
            // Leased: fast, so that the first DISCOVERs after a loss are.
            _ => FAST_DISCOVER_MS,
        }
    }

    /// The address leased now.
    pub fn address(&self) -> Option<Ipv4Setup> {
        match self.state {
            State::Leased(ip) => Some(ip),
            State::Waiting | State::Lost => None,
        }
    }

    /// Why a connection cannot be made now (`None`: it can), for an attach's refusal.
    pub fn refusal(&self) -> Option<&'static str> {
        match self.state {
            State::Leased(_) => None,
            State::Waiting => Some("no DHCP lease yet (net.ip=dhcp): no address on the vif"),
            State::Lost => Some(
                "the DHCP lease was lost and no server has given another (net.ip=dhcp): no \
                 address on the vif",
            ),
        }
    }
}

/// What a lease gives, as the interface takes it: a router is kept only when it is
/// another host of the leased subnet (a server's bad router would send every frame
/// for a target outside the subnet to the broadcast address or nowhere). smoltcp
/// checks the address and the mask itself.
pub fn checked(mut ip: Ipv4Setup) -> Ipv4Setup {
    let mask = u32::MAX.checked_shl(32 - u32::from(ip.prefix)).unwrap_or(0);
    let own = u32::from_be_bytes(ip.address);
    ip.gateway = ip.gateway.filter(|&router| {
        let router = u32::from_be_bytes(router);
        let host = router & !mask;
        router & mask == own & mask && router != own && host != 0 && host != !mask
    });
    ip
}

/// `a.b.c.d/prefix`, and the router when there is one.
struct Shown(Ipv4Setup);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.0.address;
        write!(f, "{a}.{b}.{c}.{d}/{}", self.0.prefix)?;
        match self.0.gateway {
            Some([a, b, c, d]) => write!(f, " router {a}.{b}.{c}.{d}"),
            None => write!(f, " no router"),
        }
    }
}

impl fmt::Display for LeaseEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LeaseEvent::Acquired { ip, waited_ms } => {
                write!(f, "DHCP lease {} (after {waited_ms} ms)", Shown(ip))
            }
            LeaseEvent::Changed { old, new } => {
                write!(f, "DHCP lease changed: {} (was {})", Shown(new), Shown(old))
            }
            LeaseEvent::Lost { ip } => write!(
                f,
                "DHCP lease {} lost: no address until a server gives another; connections \
                 to targets stall and reconnect per their disks' policy",
                Shown(ip)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Setup = Ipv4Setup {
        address: [10, 9, 0, 50],
        prefix: 24,
        gateway: Some([10, 9, 0, 1]),
    };

    #[test]
    fn a_first_lease_is_acquired_once_and_a_renewal_changes_nothing() {
        let mut lease = Lease::new(1_000);
        assert!(lease.refusal().unwrap().contains("no DHCP lease yet"));
        assert_eq!(lease.update(None, 1_100), None, "smoltcp's first report");
        assert_eq!(lease.address(), None);
        let event = lease.update(Some(IP), 3_500).unwrap();
        assert_eq!(
            event,
            LeaseEvent::Acquired {
                ip: IP,
                waited_ms: 2_500
            }
        );
        assert_eq!(
            event.to_string(),
            "DHCP lease 10.9.0.50/24 router 10.9.0.1 (after 2500 ms)"
        );
        assert_eq!(lease.address(), Some(IP));
        assert_eq!(lease.refusal(), None);
        assert_eq!(lease.update(Some(IP), 60_000), None, "renewed, same");
    }

    #[test]
    fn discovers_slow_down_after_the_fast_window_and_speed_up_after_a_loss() {
        let mut lease = Lease::new(1_000);
        assert_eq!(lease.discover_retry_ms(1_000), FAST_DISCOVER_MS);
        assert_eq!(lease.discover_retry_ms(30_999), FAST_DISCOVER_MS);
        assert_eq!(lease.discover_retry_ms(31_000), SLOW_DISCOVER_MS);
        lease.update(Some(IP), 100_000);
        assert_eq!(lease.discover_retry_ms(500_000), FAST_DISCOVER_MS);
        lease.update(None, 600_000);
        assert_eq!(
            lease.discover_retry_ms(600_000),
            FAST_DISCOVER_MS,
            "just lost"
        );
        assert_eq!(lease.discover_retry_ms(630_000), SLOW_DISCOVER_MS);
    }

    #[test]
    fn a_router_outside_the_leased_subnet_is_not_taken() {
        assert_eq!(checked(IP), IP);
        for router in [
            [10, 9, 1, 1],
            [10, 9, 0, 50],
            [10, 9, 0, 0],
            [10, 9, 0, 255],
            [255, 255, 255, 255],
            [0, 0, 0, 0],
        ] {
            let given = Ipv4Setup {
                gateway: Some(router),
                ..IP
            };
            assert_eq!(checked(given).gateway, None, "{router:?}");
        }
        let wide = Ipv4Setup {
            address: [10, 200, 0, 7],
            prefix: 8,
            gateway: Some([10, 1, 2, 3]),
        };
        assert_eq!(checked(wide), wide);
    }

    #[test]
    fn other_settings_and_a_lost_lease_are_changes() {
        let mut lease = Lease::new(0);
        lease.update(Some(IP), 10);
        let new = Ipv4Setup {
            address: [10, 9, 0, 51],
            gateway: None,
            ..IP
        };
        let changed = lease.update(Some(new), 20).unwrap();
        assert_eq!(changed, LeaseEvent::Changed { old: IP, new });
        assert_eq!(
            changed.to_string(),
            "DHCP lease changed: 10.9.0.51/24 no router (was 10.9.0.50/24 router 10.9.0.1)"
        );
        let lost = lease.update(None, 30).unwrap();
        assert_eq!(lost, LeaseEvent::Lost { ip: new });
        assert!(lost
            .to_string()
            .starts_with("DHCP lease 10.9.0.51/24 no router lost"));
        assert_eq!(lease.address(), None);
        assert!(lease.refusal().unwrap().contains("was lost"));
        assert_eq!(lease.update(None, 40), None, "lost once");
        assert_eq!(
            lease.update(Some(IP), 530),
            Some(LeaseEvent::Acquired {
                ip: IP,
                waited_ms: 500
            }),
            "waited since the loss"
        );
    }
}
