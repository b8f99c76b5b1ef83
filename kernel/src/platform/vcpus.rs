//! Starting the domain's other vCPUs the Xen way: a PVH vCPU has no real mode to take a
//! start-up IPI into, so it is given its 64-bit register state (`VCPUOP_initialise`)
//! and then brought up (`VCPUOP_up`).

use super::{events, get};
use crate::smp;
use xen::platform::{start_vcpu, LongModeStart};

/// Starts vCPUs 1..count; returns how many came online. vCPU n becomes CPU index n.
pub fn start(count: usize) -> usize {
    let Some(platform) = get() else { return 0 };
    let cr0 = x86_64::registers::control::Cr0::read_raw();
    let cr4 = x86_64::registers::control::Cr4::read_raw();
    let mut started = 0;
    for vcpu in 1..count.min(smp::MAX_CPUS) {
        if let Err(e) = platform
            .register_vcpu_info(vcpu as u32)
            .and_then(|_| events::init_vcpu(vcpu as u32))
        {
            log::error!("cpu: vCPU {vcpu} not started: {e}");
            break;
        }
        let up = smp::start_ap(vcpu, |start| {
            let context = LongModeStart {
                rip: start.entry,
                // Enter `entry(index)` as if called: RSP ≡ 8 (mod 16) at entry.
                rsp: start.stack_top - 8,
                arg: start.index as u64,
                cr3: start.cr3,
                cr0,
                cr4,
                efer: start.efer,
            };
            if let Err(e) = start_vcpu(&platform.hv, vcpu as u32, &context) {
                log::error!("cpu: VCPUOP_initialise/up of vCPU {vcpu} failed: {e:?}");
            }
        });
        if !up {
            log::error!("cpu: vCPU {vcpu} did not come up within 1 s");
            break;
        }
        started += 1;
    }
    started
}
