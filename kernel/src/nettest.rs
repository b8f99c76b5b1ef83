// SPDX-License-Identifier: MIT OR Apache-2.0
//! `nettest=<nvme-tcp target>` (test image only): brings up the vif with `net.ip`,
//! opens a TCP connection to the target and brings an NVMe/TCP admin association up on
//! it (ICReq/ICResp, Fabrics Connect, Property Get CAP, Set CC.EN, Get CSTS until RDY,
//! Identify controller and namespace), logging each stage; then reads the namespace's
//! first block on an I/O queue. Reports pass or fail and powers off.

use crate::power::{self, Verdict};
use crate::xen_domain::vif::{self, Vif};
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

/// The read's buffer, as the I/O queue's data port.
struct Block<'a>(&'a mut [u8]);

impl DataPort for Block<'_> {
    fn fetch(&mut self, _tag: u64, _offset: u32, _dst: &mut [u8]) {}
    fn deliver(&mut self, _tag: u64, offset: u32, src: &[u8]) {
        let at = offset as usize;
        if let Some(dst) = self.0.get_mut(at..at + src.len()) {
            dst.copy_from_slice(src);
        }
    }
}

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
        if let Some(fault) = vif.stack.device.queue().fault() {
            fail(&alloc::format!(
                "vif stopped: netback broke the protocol: {fault}"
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
        .unwrap_or_else(|| fail("nettest needs net.ip=<a.b.c.d>/<prefix>"));
    let host_nqn = cmdline.value(Key::NettestHostnqn).unwrap_or(HOST_NQN);
    let start = Vif::now_ms();
    let mut vif = vif::bring_up(&net, grant_gpa).unwrap_or_else(|e| fail(&e));
    let [m0, m1, m2, m3, m4, m5] = vif.info.mac;
    info!(
        "nettest: vif connected to {} (dom{}), mac {m0:02x}:{m1:02x}:{m2:02x}:{m3:02x}:\
         {m4:02x}:{m5:02x}, in {} ms",
        vif.info.backend,
        vif.info.backend_id,
        Vif::now_ms() - start
    );
    let deadline = start + TEST_MS;
    let local = 49152 + (xen::raw::cpu::read_tsc() % 8192) as u16;
    let admin_socket = open(&mut vif, target.addr, target.port, local, deadline);
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
    let io_socket = open(
        &mut vif,
        target.addr,
        target.port,
        local.wrapping_add(1),
        deadline,
    );
    let mut io: IoSession<8> = IoSession::new(&id, &ctrl, ns, 1);
    let mut block = alloc::vec![0u8; ns.block_size as usize];
    let mut submitted = false;
    loop {
        vif.poll();
        let now = Vif::now_ms();
        let mut port = Block(&mut block);
        let socket = vif.stack.sockets.get_mut::<tcp::Socket>(io_socket);
        if socket.can_recv() {
            let r = socket.recv(|data| (data.len(), io.receive(data, &mut port)));
            if let Ok(Err(e)) = r {
                fail(&alloc::format!("I/O queue: {e}"));
            }
        }
        if io.state() == SessionState::Live && !submitted {
            io.read(7, 0, 1)
                .unwrap_or_else(|e| fail(&alloc::format!("read: {e:?}")));
            submitted = true;
        }
        if io.wants_to_send() && socket.can_send() {
            let _ = socket.send(|buf| (io.transmit(buf, &mut port), ()));
        }
        if let Some(done) = io.next_completion() {
            if !done.status.is_success() {
                fail(&alloc::format!("read of block 0: {:?}", done.status));
            }
            break;
        }
        // Keep-alives on the admin queue meanwhile.
        let _ = admin.poll(now);
        match io.state() {
            SessionState::Failed(e) => fail(&alloc::format!("I/O queue: {e}")),
            _ if now > deadline => fail("I/O queue: timed out"),
            _ => {}
        }
    }
    let words: alloc::vec::Vec<alloc::string::String> = block[..16]
        .iter()
        .map(|b| alloc::format!("{b:02x}"))
        .collect();
    let stats = vif.stack.device.queue().stats;
    info!(
        "nettest: I/O queue connected; block 0 read: {} ...; vif tx {} rx {} dropped {} \
         events {}",
        words.join(""),
        stats.tx_frames,
        stats.rx_frames,
        stats.rx_dropped,
        stats.notifications
    );
    info!("nettest: PASS in {} ms", Vif::now_ms() - start);
    power::report_verdict(Verdict::Pass);
    power::power_off();
}
