//! Starting the domain's other vCPUs the Xen way: a PVH vCPU has no real mode to take a
//! start-up IPI into, so it is given its 64-bit register state directly
//! (`VCPUOP_initialise` with a `vcpu_hvm_context`) and then `VCPUOP_up`.

use super::{events, get};
use crate::smp;
use xen::abi::vcpu::{VcpuHvmContext, VcpuHvmX86_64, VCPU_HVM_MODE_64B};
use xen::error::check;
use xen::hypercall::VcpuOp;
use xen::{Hypercall, Hypervisor};

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
            continue;
        }
        let up = smp::start_ap(vcpu, |start| {
            let context = VcpuHvmContext {
                mode: VCPU_HVM_MODE_64B,
                pad: 0,
                x86_64: VcpuHvmX86_64 {
                    // Enter `entry(index)` as if called: RSP ≡ 8 (mod 16) at entry.
                    rsp: start.stack_top - 8,
                    rdi: start.index as u64,
                    rip: start.entry,
                    rflags: 0x2,
                    cr0,
                    cr3: start.cr3,
                    cr4,
                    efer: start.efer,
                    ..Default::default()
                },
                _union_tail: 0,
            };
            let vcpu = vcpu as u32;
            let init = check(platform.hv.hypercall(Hypercall::Vcpu(VcpuOp::Initialise {
                vcpu,
                context: &context,
            })));
            let up =
                init.and_then(|_| check(platform.hv.hypercall(Hypercall::Vcpu(VcpuOp::Up(vcpu)))));
            if let Err(e) = up {
                log::error!("cpu: VCPUOP_initialise/up of vCPU {vcpu} failed: {e:?}");
            }
        });
        if up {
            started += 1;
        } else {
            log::error!("cpu: vCPU {vcpu} did not come up within 1 s");
            break;
        }
    }
    started
}
