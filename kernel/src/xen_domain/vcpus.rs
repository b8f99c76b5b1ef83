// SPDX-License-Identifier: MIT OR Apache-2.0
//! Starting the domain's other vCPUs the Xen way: a PVH vCPU has no real mode to take a
//! start-up IPI into, so it is given its 64-bit register state (`VCPUOP_initialise`)
//! and then brought up (`VCPUOP_up`). Booted as HVM, hvmloader has already initialised
//! every vCPU (to set its MTRRs) and taken it down again, so Xen refuses a second
//! `VCPUOP_initialise` (EEXIST); those vCPUs take INIT and start-up IPIs through the
//! emulated local APIC instead, as on a PC.

use super::{events, get};
use crate::smp;
use xen::domain::{start_vcpu, LongModeStart};
use xen::XenError;

/// Starts vCPUs 1..count; returns how many came online. vCPU n becomes CPU index n.
/// `apic_ids[n]` is vCPU n's local APIC id (from the MADT, in vCPU order), for the
/// start-up IPI fallback.
pub fn start(apic_ids: &[u32]) -> usize {
    let Some(domain) = get() else { return 0 };
    let cr0 = x86_64::registers::control::Cr0::read_raw();
    let cr4 = x86_64::registers::control::Cr4::read_raw();
    let mut started = 0;
    for (vcpu, &apic_id) in apic_ids.iter().enumerate().take(smp::MAX_CPUS).skip(1) {
        if let Err(e) = domain
            .register_vcpu_info(vcpu as u32)
            .and_then(|_| events::init_vcpu(vcpu as u32))
        {
            log::error!("cpu: vCPU {vcpu} not started: {e}");
            break;
        }
        let up = smp::start_ap(vcpu, 1000, |start| {
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
            match start_vcpu(&domain.hv, vcpu as u32, &context) {
                Ok(()) => {}
                Err(XenError::Exist) => {
                    log::info!("cpu: vCPU {vcpu} was initialised by firmware; start-up IPI");
                    smp::launch_with_sipi(apic_id, start);
                }
                Err(e) => log::error!("cpu: VCPUOP_initialise/up of vCPU {vcpu} failed: {e:?}"),
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
