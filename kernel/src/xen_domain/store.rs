// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore connection: the `xen` crate's client over the shared ring page, kicked
//! through the store event channel and waiting with `SCHEDOP_poll` (the port stays
//! masked, so no upcall competes for it). Control path only: one lock for the domain.

use super::{failed, get, now_ns, shared_page, InitError};
use xen::evtchn::PortSignal;
use xen::raw::hypercall::NativeHypervisor;
use xen::xenstore::{SharedXenstoreRing, XenstoreClient};

/// How long one xenstore wait may take before the request fails.
const STORE_TIMEOUT_NS: u64 = 10_000_000_000;

type Signal = PortSignal<NativeHypervisor, fn() -> u64>;
pub type Client = XenstoreClient<SharedXenstoreRing<Signal>>;

/// The domain's one xenstore connection, set once at boot. Global: the control path,
/// the toolstack's shutdown watch and the self-tests all talk through it, one at a time.
static STORE: spin::Once<spin::Mutex<Client>> = spin::Once::new();

/// Connects to xenstored through the ring the toolstack set up for us (once).
pub fn init() -> Result<(), InitError> {
    let domain = get().ok_or(InitError::NotInitialised)?;
    if STORE.is_completed() {
        return Ok(());
    }
    let params = xen::domain::store_params(&domain.hv).map_err(failed("xenstore parameters"))?;
    if params.pfn >= crate::arch::paging::IDENTITY_MAPPED_LIMIT >> 12 {
        return Err(InitError::Hypercall(
            "xenstore page above the identity map",
            xen::XenError::Range,
        ));
    }
    domain.shared.mask(params.evtchn);
    let signal = Signal {
        hv: domain.hv,
        port: params.evtchn,
        shared: domain.shared,
        now_ns: now_ns as fn() -> u64,
        timeout_ns: STORE_TIMEOUT_NS,
    };
    // SAFETY: the store page is shared with xenstored only, and the kernel reaches it only
    // through this client.
    let mem = unsafe { shared_page(params.pfn << 12, 4096) };
    let ring = SharedXenstoreRing::new(mem, signal).ok_or(InitError::NoFrame)?;
    STORE.call_once(|| spin::Mutex::new(XenstoreClient::new(ring)));
    log::info!(
        "xen: xenstore ring at pfn {:#x}, event channel {}",
        params.pfn,
        params.evtchn
    );
    Ok(())
}

/// Runs `f` with the xenstore client; `None` when there is no xenstore connection, or
/// when the client is already held. Only vCPU 0 uses it (boot, then the control path),
/// so a held client means a call from inside another `with`: waiting would stop vCPU 0
/// for good (its rings, every negotiation), so the inner call is refused and logged,
/// and the caller goes on as without xenstore. (A refusal answered this way inside the
/// control round once hung blkdom in the rig.)
pub fn with<R>(f: impl FnOnce(&mut Client) -> R) -> Option<R> {
    let store = STORE.get()?;
    let Some(mut client) = store.try_lock() else {
        log::error!("xenstore: the client was asked for while held (a nested call): refused");
        return None;
    };
    Some(f(&mut client))
}
