// SPDX-License-Identifier: MIT OR Apache-2.0
//! The log on the Xen PV console ring, so `xl console` and xenconsoled's log show it.

use super::{shared_page, XenDomain};
use xen::abi::event_channel::EvtchnPort;
use xen::console::ConsoleRing;
use xen::XenError;

static RING: spin::Once<(ConsoleRing, EvtchnPort)> = spin::Once::new();

/// How long a log write waits for xenconsoled to drain a full ring before dropping the
/// rest (a log line must not hang the kernel when nobody reads the console).
const FULL_RING_SPINS: u32 = 100_000;

pub(super) fn init(domain: &XenDomain) {
    match xen::domain::console_params(&domain.hv) {
        Ok(params) if params.pfn < (crate::arch::paging::IDENTITY_MAPPED_LIMIT >> 12) => {
            // SAFETY: the console page is shared with xenconsoled only, and the kernel
            // reaches it only through this ring.
            let mem = unsafe { shared_page(params.pfn << 12, 4096) };
            if let Some(ring) = ConsoleRing::new(mem) {
                RING.call_once(|| (ring, params.evtchn));
                crate::console::enable_xen_console(write);
                log::info!(
                    "xen: console ring at pfn {:#x}, event channel {}",
                    params.pfn,
                    params.evtchn
                );
            }
        }
        Ok(params) => log::warn!(
            "xen: console page {:#x} is above the identity map; not used",
            params.pfn
        ),
        Err(XenError::NoDev) => log::info!("xen: no PV console"),
        Err(e) => log::warn!("xen: console parameters: {e:?}"),
    }
}

/// Writes log bytes to the ring (callers serialise: the logger writes whole lines
/// under its line lock).
fn write(bytes: &[u8]) {
    let (Some((ring, port)), Some(domain)) = (RING.get(), super::get()) else {
        return;
    };
    let mut spins = 0;
    ring.write_all(
        bytes,
        || {
            let _ = xen::evtchn::send(&domain.hv, *port);
        },
        || {
            spins += 1;
            core::hint::spin_loop();
            spins < FULL_RING_SPINS
        },
    );
}
