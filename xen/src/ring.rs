// SPDX-License-Identifier: MIT OR Apache-2.0
//! A frontend's ring as a backend holds it besides its engine: the ring's pages mapped at
//! consecutive guest-physical pages, and its event channel bound. Made whole or not at
//! all ([`RingConnection::connect`] gives back what it took when a later step fails),
//! and given back whole ([`RingConnection::release`]): a page whose unmap failed is
//! counted and reported, never forgotten, so the caller knows its guest-physical range
//! must not be reused.

use crate::abi::event_channel::EvtchnPort;
use crate::abi::grant_table::{GnttabUnmapGrantRef, GrantRef, GNTST_OKAY};
use crate::abi::{DomId, PAGE_SIZE};
use crate::evtchn;
use crate::grant::{map_batch, map_request, unmap_batch, unmap_request, BatchError, MapError};
use crate::hypercall::Hypervisor;
use crate::XenError;
use alloc::vec::Vec;

/// Why a ring could not be connected. Nothing of it stays taken, except `leaked_pages`
/// (ring pages whose unmap failed while undoing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RingError {
    /// A ring grant did not map; the pages that did were unmapped again (but for
    /// `MapError::leaked`).
    Map(MapError),
    /// The frontend's event channel did not bind; the ring's pages were unmapped again
    /// (but for `leaked`, with the unmap's error).
    Bind {
        port: EvtchnPort,
        error: XenError,
        leaked: usize,
        unmap: Option<BatchError>,
    },
}

impl RingError {
    /// Ring pages still mapped after the failure (their range must not be reused).
    pub fn leaked_pages(&self) -> usize {
        match self {
            RingError::Map(error) => error.leaked,
            RingError::Bind { leaked, .. } => *leaked,
        }
    }
}

/// Releasing a ring left pages mapped: their unmap failed (`error`), they stay mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingUnmapError {
    pub leaked: usize,
    pub error: BatchError,
}

/// One frontend ring, mapped and bound. Dropping it without [`Self::release`] leaves
/// both taken: release it.
#[derive(Debug)]
#[must_use = "a connected ring holds mappings and a port until released"]
pub struct RingConnection {
    unmaps: Vec<GnttabUnmapGrantRef>,
    port: EvtchnPort,
}

impl RingConnection {
    /// Maps `refs` of `frontend` read-write at consecutive pages from `base` (all of
    /// them or none, one batch), then binds the frontend's `remote_port`. When the bind
    /// fails the pages are unmapped again before the error returns.
    pub fn connect<H: Hypervisor + ?Sized>(
        hv: &H,
        base: u64,
        frontend: DomId,
        refs: &[GrantRef],
        remote_port: EvtchnPort,
    ) -> Result<Self, RingError> {
        let mut ops: Vec<_> = refs
            .iter()
            .zip((base..).step_by(PAGE_SIZE))
            .map(|(&gref, gpa)| map_request(gpa, frontend, gref, false))
            .collect();
        map_batch(hv, &mut ops).map_err(RingError::Map)?;
        let mut unmaps: Vec<_> = ops.iter().map(unmap_request).collect();
        match evtchn::bind_interdomain(hv, frontend, remote_port) {
            Ok(port) => Ok(Self { unmaps, port }),
            Err(error) => {
                let (leaked, unmap) = match unmap_all(hv, &mut unmaps) {
                    Ok(()) => (0, None),
                    Err(e) => (e.leaked, Some(e.error)),
                };
                Err(RingError::Bind {
                    port: remote_port,
                    error,
                    leaked,
                    unmap,
                })
            }
        }
    }

    /// Our end of the ring's event channel.
    pub fn port(&self) -> EvtchnPort {
        self.port
    }

    /// Pages the ring spans.
    pub fn pages(&self) -> usize {
        self.unmaps.len()
    }

    /// Unmaps the ring's pages and closes its port. `Err` says how many pages stay
    /// mapped (their unmap failed).
    pub fn release<H: Hypervisor + ?Sized>(mut self, hv: &H) -> Result<(), RingUnmapError> {
        let unmapped = unmap_all(hv, &mut self.unmaps);
        // A failed close means the port is gone already (the frontend closed its end).
        let _ = evtchn::close(hv, self.port);
        unmapped
    }
}

/// Unmaps `ops` with one call; what failed stays mapped and is counted.
fn unmap_all<H: Hypervisor + ?Sized>(
    hv: &H,
    ops: &mut [GnttabUnmapGrantRef],
) -> Result<(), RingUnmapError> {
    unmap_batch(hv, ops).map_err(|error| RingUnmapError {
        leaked: ops.iter().filter(|op| op.status != GNTST_OKAY).count(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::grant_table::GNTST_BAD_GNTREF;
    use crate::fake::FakeXen;
    use crate::grant::{BatchFault, CountedGrants, GrantStatus};
    use core::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    const FRONTEND: DomId = 3;
    const BASE: u64 = 0x4000_0000;

    /// A fake Xen under a page count, as the kernel uses it.
    struct Rig {
        xen: FakeXen,
        count: Arc<AtomicI64>,
    }

    impl Rig {
        fn new() -> Self {
            Self {
                xen: FakeXen::new(),
                count: Arc::new(AtomicI64::new(0)),
            }
        }

        fn hv(&self) -> CountedGrants<&FakeXen, impl Fn(i64) + Sync + '_> {
            CountedGrants::new(&self.xen, |delta| {
                self.count.fetch_add(delta, Ordering::Relaxed);
            })
        }

        /// Pages Xen holds mapped, and what the count says; they must agree.
        fn mapped(&self) -> usize {
            let held = self.xen.with(|s| s.mapped.len());
            assert_eq!(self.count.load(Ordering::Relaxed), held as i64, "count");
            held
        }

        fn closed_ports(&self) -> Vec<u32> {
            self.xen.with(|s| s.closed_ports.clone())
        }
    }

    #[test]
    fn a_ring_connects_and_releases_every_page_and_its_port() {
        let rig = Rig::new();
        let ring = RingConnection::connect(&rig.hv(), BASE, FRONTEND, &[8, 9, 10, 11], 7).unwrap();
        assert_eq!(ring.pages(), 4);
        assert_eq!(rig.mapped(), 4);
        let addresses: Vec<u64> = rig.xen.with(|s| {
            let mut a: Vec<u64> = s.mapped.values().map(|m| m.2).collect();
            a.sort();
            a
        });
        assert_eq!(
            addresses,
            [BASE, BASE + 0x1000, BASE + 0x2000, BASE + 0x3000]
        );
        let port = ring.port();
        assert_eq!(ring.release(&rig.hv()), Ok(()));
        assert_eq!(rig.mapped(), 0);
        assert_eq!(rig.closed_ports(), [port]);
    }

    /// The hostile guest's event-channel-0 (and never-allocated, and another domain's):
    /// the ring maps, the bind fails. Its pages must be unmapped again and the count
    /// back at 0 (blkdom's said 3 after three such attacks).
    #[test]
    fn a_ring_whose_event_channel_does_not_bind_is_unmapped_and_uncounted() {
        let rig = Rig::new();
        for order in 0..=4 {
            let refs: Vec<GrantRef> = (0..1 << order).collect();
            let error = RingConnection::connect(&rig.hv(), BASE, FRONTEND, &refs, 0).unwrap_err();
            assert_eq!(
                error,
                RingError::Bind {
                    port: 0,
                    error: XenError::Inval,
                    leaked: 0,
                    unmap: None
                }
            );
            assert_eq!(rig.mapped(), 0, "order {order}");
        }
        assert!(rig.closed_ports().is_empty(), "no port was bound");
    }

    #[test]
    fn an_undo_that_fails_to_unmap_says_how_many_pages_stay_mapped() {
        let rig = Rig::new();
        // The second ring page's unmap fails.
        rig.xen.with(|s| s.unmap_fails.insert(s.next_handle + 1));
        let error = RingConnection::connect(&rig.hv(), BASE, FRONTEND, &[8, 9], 0).unwrap_err();
        assert_eq!(error.leaked_pages(), 1);
        assert_eq!(rig.mapped(), 1, "the page stays mapped, and counted");
    }

    #[test]
    fn a_ring_grant_that_does_not_map_leaves_nothing_mapped() {
        let rig = Rig::new();
        rig.xen
            .with(|s| s.grant_status.insert((FRONTEND, 10), GNTST_BAD_GNTREF));
        let error =
            RingConnection::connect(&rig.hv(), BASE, FRONTEND, &[8, 9, 10, 11], 7).unwrap_err();
        let RingError::Map(map) = error else {
            panic!("{error:?}")
        };
        assert_eq!(
            map.fault,
            BatchFault::Entry {
                index: 2,
                status: GrantStatus::BadGntref
            }
        );
        assert_eq!((map.leaked, error.leaked_pages()), (0, 0));
        assert_eq!(rig.mapped(), 0);
        // Its unwinding fails for one page: that one stays mapped, and counted.
        rig.xen.with(|s| s.unmap_fails.insert(s.next_handle));
        let error =
            RingConnection::connect(&rig.hv(), BASE, FRONTEND, &[8, 9, 10, 11], 7).unwrap_err();
        assert_eq!(error.leaked_pages(), 1);
        assert_eq!(rig.mapped(), 1);
    }

    #[test]
    fn a_release_whose_unmap_fails_says_how_many_pages_stay_mapped() {
        let rig = Rig::new();
        let ring = RingConnection::connect(&rig.hv(), BASE, FRONTEND, &[8, 9], 7).unwrap();
        let port = ring.port();
        let handle = rig.xen.with(|s| *s.mapped.keys().min().unwrap());
        rig.xen.with(|s| s.unmap_fails.insert(handle));
        let error = ring.release(&rig.hv()).unwrap_err();
        assert_eq!(error.leaked, 1);
        assert_eq!(
            error.error.fault,
            BatchFault::Entry {
                index: 0,
                status: GrantStatus::GeneralError
            }
        );
        assert_eq!(rig.mapped(), 1);
        assert_eq!(
            rig.closed_ports(),
            [port],
            "the port is closed all the same"
        );
    }
}
