// SPDX-License-Identifier: MIT OR Apache-2.0
//! Host micro-benchmark of the event-channel hot path: raise N ports on a shared_info
//! page (as Xen would), then one `HandlerTable::dispatch_pending` pass.
//! `cargo run --release -p blkdom-xen --example scan_bench`

use std::time::Instant;
use xen::evtchn::HandlerTable;
use xen::shared_info::{SharedInfoPage, VcpuEvents};
use xen::SharedMem;

fn noop(_port: u32, _context: usize) {}

fn main() {
    let page = SharedInfoPage::new(SharedMem::alloc_leaked(4096)).unwrap();
    let vcpu_info = page.legacy_vcpu_info(0).unwrap();
    let events = VcpuEvents {
        shared: page,
        vcpu_info,
    };
    for ports in [1u32, 16, 256] {
        let mut table = HandlerTable::new();
        let step = 4000 / ports;
        for i in 0..ports {
            table.register(8 + i * step, noop, 0).unwrap();
        }
        let rounds = 200_000;
        let start = Instant::now();
        let mut dispatched = 0;
        for _ in 0..rounds {
            for i in 0..ports {
                page.raise(8 + i * step, &vcpu_info);
            }
            dispatched += table.dispatch_pending(&events);
        }
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(dispatched, rounds * ports as usize);
        println!(
            "{ports:>4} ports pending per pass: {:.0} ns per pass, {:.1} M events/s (raise + scan + dispatch)",
            secs * 1e9 / rounds as f64,
            dispatched as f64 / secs / 1e6
        );
    }
}
