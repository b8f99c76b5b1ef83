// SPDX-License-Identifier: MIT OR Apache-2.0
//! Event sends a poller holds for its next sleep (docs/design.md §4.4): under Xen every
//! hypercall of a PVH vCPU is a VM exit, and a poller that answers one request and then
//! sleeps would pay one exit for the request's event and one for the sleep. Held here,
//! the sends go with the sleep's poll in one multicall.
//!
//! One poller's list: only its own vCPU touches it (its rings' engines through
//! [`OwedSends::owe`], the poller through the rest), so relaxed atomics suffice; they
//! only let the list live in a `static` slot that other vCPUs never write.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Most sends held for one sleep (then a send goes at once): Xen's multicall carries
/// them with the poll, and more than a few rings due an event in one pass is a busy
/// poller, which spins rather than sleeps.
pub const MAX_OWED: usize = 8;

/// The sends one poller holds for its next sleep.
pub struct OwedSends {
    /// Set by the poller for a pass after which it expects to sleep.
    collecting: AtomicBool,
    len: AtomicU32,
    ports: [AtomicU32; MAX_OWED],
}

impl Default for OwedSends {
    fn default() -> Self {
        Self::new()
    }
}

impl OwedSends {
    pub const fn new() -> OwedSends {
        OwedSends {
            collecting: AtomicBool::new(false),
            len: AtomicU32::new(0),
            ports: [const { AtomicU32::new(0) }; MAX_OWED],
        }
    }

    /// Whether sends asked for from now on are held (the poller expects to sleep after
    /// this pass) or go at once.
    pub fn collect(&self, collecting: bool) {
        self.collecting.store(collecting, Ordering::Relaxed);
    }

    /// A send on `port` is due: true when it is held for the sleep (or already was:
    /// one event per port carries every response), false when the caller sends it now
    /// (not collecting, or the list is full).
    pub fn owe(&self, port: u32) -> bool {
        if !self.collecting.load(Ordering::Relaxed) {
            return false;
        }
        let n = (self.len.load(Ordering::Relaxed) as usize).min(MAX_OWED);
        if self.ports[..n]
            .iter()
            .any(|p| p.load(Ordering::Relaxed) == port)
        {
            return true;
        }
        if n == MAX_OWED {
            return false;
        }
        self.ports[n].store(port, Ordering::Relaxed);
        self.len.store(n as u32 + 1, Ordering::Relaxed);
        true
    }

    /// Sends are held.
    pub fn any(&self) -> bool {
        self.len.load(Ordering::Relaxed) > 0
    }

    /// The ports held, in the order they were owed, moved into `into`; how many. The
    /// list is empty after.
    pub fn take(&self, into: &mut [u32; MAX_OWED]) -> usize {
        let n = (self.len.swap(0, Ordering::Relaxed) as usize).min(MAX_OWED);
        for (slot, port) in into.iter_mut().zip(&self.ports).take(n) {
            *slot = port.load(Ordering::Relaxed);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(owed: &OwedSends) -> Vec<u32> {
        let mut ports = [0; MAX_OWED];
        let n = owed.take(&mut ports);
        ports[..n].to_vec()
    }

    #[test]
    fn sends_are_held_only_while_collecting() {
        let owed = OwedSends::new();
        assert!(!owed.owe(5), "not collecting: the caller sends");
        assert!(!owed.any());
        owed.collect(true);
        assert!(owed.owe(5) && owed.owe(9));
        assert!(owed.any());
        owed.collect(false);
        assert!(!owed.owe(7), "collecting ended: sent at once");
        assert_eq!(taken(&owed), [5, 9], "what was held stays until taken");
        assert!(!owed.any());
        assert_eq!(taken(&owed), [] as [u32; 0]);
    }

    #[test]
    fn one_send_per_port_and_at_most_a_multicalls_worth() {
        let owed = OwedSends::new();
        owed.collect(true);
        for round in 0..3 {
            for port in 0..MAX_OWED as u32 {
                assert!(owed.owe(100 + port), "round {round}, port {port}");
            }
        }
        assert!(!owed.owe(7), "full: the caller sends it now");
        assert!(owed.owe(100), "a port already held is held");
        let ports = taken(&owed);
        assert_eq!(ports, (100..100 + MAX_OWED as u32).collect::<Vec<_>>());
        assert!(owed.owe(7), "room again once taken");
        assert_eq!(taken(&owed), [7]);
    }
}
