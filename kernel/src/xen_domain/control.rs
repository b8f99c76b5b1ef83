// SPDX-License-Identifier: MIT OR Apache-2.0
//! The toolstack's control requests: `xl shutdown`/`xl reboot` write
//! `control/shutdown`; we advertise that we listen (`control/feature-*`, without which
//! xl refuses to ask) and act on the request.

use xen::domain::{ShutdownReason, UpcallMode};
use xen::xenbus::keys::{CONTROL_FEATURE_POWEROFF, CONTROL_FEATURE_REBOOT, CONTROL_SHUTDOWN};
use xen::xenstore::Transaction;

/// The token of the watch on `CONTROL_SHUTDOWN`.
pub const SHUTDOWN_TOKEN: &str = "control-shutdown";
/// The token of the watch on a live upgrade's request (`blkback::keys::UPGRADE`).
pub const UPGRADE_TOKEN: &str = "control-upgrade";

/// Tells the toolstack we handle power-off and reboot requests, and watches for them.
pub fn listen() {
    if let Some(xen) = super::get() {
        // An HVM blkdom is offered xl shutdown only with this (`announce_pv_control`).
        if xen.upcall_mode.get() == Some(&UpcallMode::PerVcpuVector) {
            if let Err(e) = xen::domain::announce_pv_control(&xen.hv) {
                log::warn!("xen: cannot announce PV control (HVM_PARAM_CALLBACK_IRQ): {e:?}");
            }
        }
    }
    let done = super::store::with(|xs| {
        xs.write(Transaction::NONE, CONTROL_FEATURE_POWEROFF, b"1")?;
        xs.write(Transaction::NONE, CONTROL_FEATURE_REBOOT, b"1")?;
        xs.watch(CONTROL_SHUTDOWN, SHUTDOWN_TOKEN)?;
        xs.watch(blkback::keys::UPGRADE, UPGRADE_TOKEN)
    });
    match done {
        Some(Ok(())) => log::info!("xen: listening for xl shutdown/reboot on {CONTROL_SHUTDOWN}"),
        Some(Err(e)) => log::warn!("xen: cannot listen on {CONTROL_SHUTDOWN}: {e:?}"),
        None => {}
    }
}

/// The request waiting in `control/shutdown`, acknowledged (emptied) as Linux does.
pub fn take_request() -> Option<ShutdownReason> {
    let request = super::store::with(|xs| {
        let value = xs.read_string(Transaction::NONE, CONTROL_SHUTDOWN).ok()?;
        let reason = match value.trim() {
            "" => return None,
            "poweroff" | "halt" => ShutdownReason::Poweroff,
            "reboot" => ShutdownReason::Reboot,
            other => {
                log::warn!(
                    "xen: control/shutdown = {other:?} not supported (poweroff, halt, reboot)"
                );
                return None;
            }
        };
        let _ = xs.write(Transaction::NONE, CONTROL_SHUTDOWN, b"");
        Some(reason)
    })?;
    request
}

/// Acts on a request, once blkdom has shut down (`backend::control`'s shutdown): the
/// log is flushed, then Xen is told why we stop.
pub fn obey(reason: ShutdownReason) -> ! {
    log::info!("xen: {reason:?} as the toolstack asked; stopping");
    log::logger().flush();
    super::shutdown(reason);
    crate::arch::cpu::halt_forever()
}
