// SPDX-License-Identifier: MIT OR Apache-2.0
//! `nettest=<nvme-tcp target>` (test image only): brings up the vif with `net.ip`,
//! opens a TCP connection to the target and brings an NVMe/TCP admin association up on
//! it (ICReq/ICResp, Fabrics Connect, Property Get CAP, Set CC.EN, Get CSTS until RDY,
//! Identify controller and namespace), logging each stage; then, on an I/O queue, reads
//! block 0, writes [`WRITE_MARK`] to block 1 and reads it back. With several vif queues
//! and netback's hash set up, the admin connection comes from a local port steered to
//! queue 0 and the I/O connection from one steered to the last queue; each queue's
//! packets are logged against the steering. Reports pass or fail and powers off.

use crate::power::{self, Verdict};
use crate::xen_domain::vif::{self, Steer, Vif};
use bootconfig::{Cmdline, Config, Key};
use log::{error, info};
use nvmetcp::{DataPort, HostIdentity, IoSession, SessionState};
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, Ipv4Address};

/// The whole test's bound: ARP, TCP, bring-up and one read.
const TEST_MS: u64 = 60_000;
const BRINGUP_MS: u64 = 20_000;
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:b1cd0000-0000-4000-8000-000000000001";
const HOST_ID: [u8; 16] = [0xb1, 0xcd, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1];

fn fail(why: &str) -> ! {
    error!("nettest: FAIL: {why}");
    power::report_verdict(Verdict::Fail);
    power::power_off();
}

/// The I/O queue's data port: tag 0 reads block 0 into `first`, tag 1 writes `pattern`
/// to block 1, tag 2 reads block 1 back into `back`.
struct Blocks<'a> {
    first: &'a mut [u8],
    pattern: &'a [u8],
    back: &'a mut [u8],
}

impl DataPort for Blocks<'_> {
    fn fetch(&mut self, tag: u64, offset: u32, dst: &mut [u8]) {
        let at = offset as usize;
        if let (1, Some(src)) = (tag, self.pattern.get(at..at + dst.len())) {
            dst.copy_from_slice(src);
        }
    }
    fn deliver(&mut self, tag: u64, offset: u32, src: &[u8]) {
        let at = offset as usize;
        let buffer = match tag {
            0 => &mut *self.first,
            2 => &mut *self.back,
            _ => return,
        };
        if let Some(dst) = buffer.get_mut(at..at + src.len()) {
            dst.copy_from_slice(src);
        }
    }
}

/// What the network test writes to block 1 (dom0 reads it back from the target's disk).
pub const WRITE_MARK: &[u8] = b"blkdom-nettest-wrote-block-1";

/// Opens a TCP connection on `vif` to the target; returns its handle once established.
fn open(
    vif: &mut Vif,
    addr: [u8; 4],
    port: u16,
    local: u16,
    deadline: u64,
) -> smoltcp::iface::SocketHandle {
    let rx = alloc::vec![0u8; 65536].leak();
    let tx = alloc::vec![0u8; 65536].leak();
    let handle = vif
        .stack
        .add_tcp(rx, tx)
        .unwrap_or_else(|| fail("no free socket"));
    let [a, b, c, d] = addr;
    let remote = (IpAddress::Ipv4(Ipv4Address::new(a, b, c, d)), port);
    let context = vif.stack.iface.context();
    let socket = vif.stack.sockets.get_mut::<tcp::Socket>(handle);
    socket
        .connect(context, remote, local)
        .unwrap_or_else(|e| fail(&alloc::format!("connect: {e}")));
    loop {
        vif.poll();
        let socket = vif.stack.sockets.get_mut::<tcp::Socket>(handle);
        match socket.state() {
            tcp::State::Established => return handle,
            tcp::State::Closed => fail(&alloc::format!(
                "{a}.{b}.{c}.{d}:{port}: connection refused (reset)"
            )),
            _ => {}
        }
        if let Some((queue, fault)) = vif.stack.device.fault() {
            fail(&alloc::format!(
                "vif queue {queue} stopped: netback broke the protocol: {fault}"
            ));
        }
        if Vif::now_ms() > deadline {
            fail(&alloc::format!(
                "{a}.{b}.{c}.{d}:{port}: no answer (no route, no ARP reply, or filtered); \
                 socket {:?}",
                socket.state()
            ));
        }
    }
}

#[allow(clippy::too_many_lines)]
pub fn run(spec: &str, cmdline: &Cmdline<'_>, config: &Config, grant_gpa: u64) -> ! {
    let target = backing::parse_nvme_tcp(spec)
        .unwrap_or_else(|e| fail(&alloc::format!("nettest={spec}: {e}")));
    let net = config
        .net
        .unwrap_or_else(|| fail("nettest needs net.ip=<a.b.c.d>/<prefix> or net.ip=dhcp"));
    let host_nqn = cmdline.value(Key::NettestHostnqn).unwrap_or(HOST_NQN);
    let start = Vif::now_ms();
    let vcpus = crate::smp::online_count();
    let mut vif = vif::bring_up(&net, grant_gpa, vcpus).unwrap_or_else(|e| fail(&e));
    let [m0, m1, m2, m3, m4, m5] = vif.info.mac;
    info!(
        "nettest: vif connected to {} (dom{}), mac {m0:02x}:{m1:02x}:{m2:02x}:{m3:02x}:\
         {m4:02x}:{m5:02x}, in {} ms; {vcpus} vCPUs: {}",
        vif.info.backend,
        vif.info.backend_id,
        Vif::now_ms() - start,
        vif.describe_queues()
    );
    if let Steer::Unknown(why) = &vif.steer {
        fail(&alloc::format!("vif: hash set-up: {why}"));
    }
    if !vif.await_address(crate::backend::FIRST_LEASE_MS) {
        fail(vif.no_address().unwrap_or("no address"));
    }
    let deadline = start + TEST_MS;
    let local = 49152 + (xen::raw::cpu::read_tsc() % 8192) as u16;
    // With a hash set up: the admin connection from a port netback steers to queue 0,
    // the I/O connection from one it steers to the last queue.
    let (admin_port, io_port) = match &vif.steer {
        Steer::Hashed(steering) => {
            let ours = vif
                .stack
                .iface
                .ipv4_addr()
                .unwrap_or_else(|| fail("no address"))
                .octets();
            let last = steering.queues() - 1;
            let pick = |queue: u16, from: u16, not: u16| {
                steering
                    .local_port_for_queue(queue, target.addr, target.port, ours, from, &mut |p| {
                        p == not
                    })
                    .unwrap_or_else(|| fail(&alloc::format!("no local port for queue {queue}")))
            };
            let admin_port = pick(0, local, 0);
            let io_port = pick(last, admin_port.wrapping_add(1), admin_port);
            info!(
                "nettest: admin connection from port {admin_port} (queue {}), I/O connection \
                 from port {io_port} (queue {})",
                steering.queue_for_flow(target.addr, target.port, ours, admin_port),
                steering.queue_for_flow(target.addr, target.port, ours, io_port)
            );
            (admin_port, io_port)
        }
        _ => (local, local.wrapping_add(1)),
    };
    let admin_socket = open(&mut vif, target.addr, target.port, admin_port, deadline);
    info!(
        "nettest: TCP connected to {target} in {} ms",
        Vif::now_ms() - start
    );
    let id = HostIdentity {
        host_nqn,
        host_id: HOST_ID,
        subsystem_nqn: target.subsystem.as_str(),
    };
    let mut admin = nvmetcp::AdminSession::new(&id, target.nsid, 30_000, Vif::now_ms(), BRINGUP_MS);
    loop {
        vif.poll();
        let now = Vif::now_ms();
        let socket = vif.stack.sockets.get_mut::<tcp::Socket>(admin_socket);
        if socket.can_recv() {
            let r = socket.recv(|data| (data.len(), admin.receive(data, now)));
            if let Ok(Err(e)) = r {
                fail(&alloc::format!("admin queue: {e}"));
            }
        }
        if admin.wants_to_send() && socket.can_send() {
            let _ = socket.send(|buf| (admin.transmit(buf), ()));
        }
        if !socket.is_active() {
            admin.connection_lost();
        }
        let _ = admin.poll(now);
        match admin.state() {
            SessionState::Live => break,
            SessionState::Failed(e) => fail(&alloc::format!("admin queue: {e}")),
            SessionState::Connecting if now > deadline => fail("admin queue: timed out"),
            SessionState::Connecting => {}
        }
    }
    let (Some(ctrl), Some(ns)) = (admin.controller(), admin.namespace()) else {
        fail("live without controller or namespace data")
    };
    info!(
        "nettest: ICReq/ICResp, Fabrics Connect (controller {}), CC.EN/CSTS.RDY, Identify: \
         queue entries {}, in-capsule {} B, MDTS {:?}, write cache {}, deallocate {}; \
         namespace {}: {} blocks of {} B",
        ctrl.cntlid,
        ctrl.max_queue_entries,
        ctrl.inline_limit,
        ctrl.max_transfer,
        ctrl.volatile_write_cache,
        ctrl.deallocate,
        ns.nsid,
        ns.blocks,
        ns.block_size
    );
    // One I/O queue on a connection of its own: read block 0.
    let io_socket = open(&mut vif, target.addr, target.port, io_port, deadline);
    let mut io: IoSession<8> = IoSession::new(&id, &ctrl, ns, 1);
    let size = ns.block_size as usize;
    let mut first = alloc::vec![0u8; size];
    let mut back = alloc::vec![0u8; size];
    let mut pattern = alloc::vec![0u8; size];
    pattern[..WRITE_MARK.len()].copy_from_slice(WRITE_MARK);
    for (i, byte) in pattern.iter_mut().enumerate().skip(WRITE_MARK.len()) {
        *byte = i as u8;
    }
    // Read block 0, then write block 1, then read it back: one after another.
    let mut next_tag = 0u64;
    let mut in_flight = false;
    while next_tag < 3 || in_flight {
        vif.poll();
        let now = Vif::now_ms();
        let mut port = Blocks {
            first: &mut first,
            pattern: &pattern,
            back: &mut back,
        };
        let socket = vif.stack.sockets.get_mut::<tcp::Socket>(io_socket);
        if socket.can_recv() {
            let r = socket.recv(|data| (data.len(), io.receive(data, &mut port)));
            if let Ok(Err(e)) = r {
                fail(&alloc::format!("I/O queue: {e}"));
            }
        }
        if io.state() == SessionState::Live && !in_flight && next_tag < 3 {
            let submitted = match next_tag {
                0 => io.read(0, 0, 1),
                1 => io.write(1, 1, 1),
                _ => io.read(2, 1, 1),
            };
            submitted.unwrap_or_else(|e| fail(&alloc::format!("command {next_tag}: {e:?}")));
            next_tag += 1;
            in_flight = true;
        }
        if io.wants_to_send() && socket.can_send() {
            let _ = socket.send(|buf| (io.transmit(buf, &mut port), ()));
        }
        if let Some(done) = io.next_completion() {
            let what = ["read of block 0", "write of block 1", "read of block 1"];
            let what = what
                .get(done.tag as usize)
                .copied()
                .unwrap_or("unknown command");
            if !done.status.is_success() {
                fail(&alloc::format!("{what}: {:?}", done.status));
            }
            info!("nettest: {what} done in {} ms", Vif::now_ms() - start);
            in_flight = false;
        }
        // Keep-alives on the admin queue meanwhile.
        let _ = admin.poll(now);
        match io.state() {
            SessionState::Failed(e) => fail(&alloc::format!("I/O queue: {e}")),
            _ if now > deadline => fail("I/O queue: timed out"),
            _ => {}
        }
    }
    if back != pattern {
        fail("block 1 read back is not what was written");
    }
    let words: alloc::vec::Vec<alloc::string::String> = first[..16]
        .iter()
        .map(|b| alloc::format!("{b:02x}"))
        .collect();
    let device = &vif.stack.device;
    let total = device.queue_totals();
    info!(
        "nettest: block 0 read: {} ...; block 1 written and read back the same; vif tx {} \
         rx {} (GSO {}) dropped {} bad checksum {} events {}",
        words.join(""),
        total.tx_frames,
        total.rx_frames,
        total.rx_gso,
        total.rx_dropped,
        device.stats.rx_bad_checksum,
        total.notifications
    );
    // Each queue's packets against the steering: the scenario checks these lines.
    for (i, queue) in device.queues().iter().enumerate() {
        let steer = device.steer[i];
        info!(
            "nettest: queue {i}: {} packets in (GSO {}, hashed by netback {}), {} TCP: hash \
             agreed {} mismatched {}, off the hash's queue {}; other packets off queue 0: {}",
            queue.stats.rx_frames,
            queue.stats.rx_gso,
            queue.stats.rx_hashed,
            steer.tcp,
            steer.hash_agreed,
            steer.hash_mismatch,
            steer.off_queue,
            steer.other_off_queue
        );
    }
    info!("nettest: PASS in {} ms", Vif::now_ms() - start);
    power::report_verdict(Verdict::Pass);
    power::power_off();
}
