// SPDX-License-Identifier: MIT OR Apache-2.0
//! Which event channel an idle poller blocks on, and how its other ports reach it.
//!
//! Xen 4.17 (`do_poll`, `evtchn_check_pollers`) wakes a vCPU in `SCHEDOP_poll` on one
//! port only for that port, but a vCPU that polls several ports at *any* event of the
//! domain. So a poller polls exactly one port, kept masked (its pending bit is the
//! wake-up, no interrupt): its ring's when it serves exactly one ring, so a frontend's
//! kick costs no upcall, else its doorbell. Every other port it waits on is unmasked,
//! bound to its vCPU, and reaches it as an upcall, whose handler marks the polled port
//! pending (docs/design.md, "Stray wake-ups").

/// How one poller waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakePlan {
    /// The one port the poller blocks on in `SCHEDOP_poll`.
    pub polled: u32,
}

impl WakePlan {
    /// `doorbell` is the poller's own; `rings` the ports of the rings it serves.
    pub fn new(doorbell: u32, rings: &[u32]) -> Self {
        let polled = match rings {
            [only] => *only,
            _ => doorbell,
        };
        Self { polled }
    }

    /// Whether `port`, one the poller waits on, stays masked (it is the polled one) or
    /// is unmasked to come as an upcall.
    pub fn masked(&self, port: u32) -> bool {
        port == self.polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// One vCPU as Xen sees it while the poller sleeps: the ports it polls, and the
    /// ports bound to it that are unmasked (an event on one raises an upcall, which
    /// wakes it).
    struct Sleeper {
        polled: Vec<u32>,
        upcall: Vec<u32>,
    }

    impl Sleeper {
        fn arrange(doorbell: u32, control: Option<u32>, rings: &[u32]) -> Self {
            let plan = WakePlan::new(doorbell, rings);
            let all: Vec<u32> = core::iter::once(doorbell)
                .chain(control)
                .chain(rings.iter().copied())
                .collect();
            Self {
                polled: all.iter().copied().filter(|&p| plan.masked(p)).collect(),
                upcall: all.iter().copied().filter(|&p| !plan.masked(p)).collect(),
            }
        }

        /// Xen's rule for an event on `port` (of any vCPU of the domain).
        fn woken_by(&self, port: u32) -> bool {
            self.upcall.contains(&port) || self.polled.contains(&port) || self.polled.len() > 1
        }
    }

    #[test]
    fn a_poller_is_woken_by_its_own_ports_and_no_other() {
        // vCPU 0: control path (xenstore 5), doorbell 10, no ring. vCPU 1: doorbell 11,
        // one ring (20). vCPU 2: doorbell 12, two rings (21, 22).
        let vcpus = [
            (Sleeper::arrange(10, Some(5), &[]), vec![10, 5]),
            (Sleeper::arrange(11, None, &[20]), vec![11, 20]),
            (Sleeper::arrange(12, None, &[21, 22]), vec![12, 21, 22]),
        ];
        let every_port: Vec<u32> = vcpus.iter().flat_map(|(_, own)| own.clone()).collect();
        for (n, (sleeper, own)) in vcpus.iter().enumerate() {
            assert_eq!(sleeper.polled.len(), 1, "vCPU {n} polls one port");
            for &port in &every_port {
                assert_eq!(
                    sleeper.woken_by(port),
                    own.contains(&port),
                    "vCPU {n}, an event on port {port}"
                );
            }
        }
    }

    #[test]
    fn a_lone_ring_is_polled_and_takes_no_upcall() {
        let plan = WakePlan::new(11, &[20]);
        assert!(plan.masked(20));
        assert!(!plan.masked(11));
        let plan = WakePlan::new(11, &[20, 21]);
        assert!(plan.masked(11));
        assert!(!plan.masked(20) && !plan.masked(21));
    }
}
