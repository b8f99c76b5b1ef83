// SPDX-License-Identifier: MIT OR Apache-2.0
//! A fake NVMe/TCP target (one per connection), for this crate's tests and for tests
//! that carry NVMe/TCP over something else (netfront's, over smoltcp): it checks every
//! PDU the host sends and answers like a controller with a RAM namespace. Feed it the
//! host's bytes with [`Target::input`]; what it sends accumulates in `out`.
#![allow(dead_code)]

use std::collections::HashMap;

use crate::pdu;
use crate::sqe::{self, Status};

pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:blkdom-test-host";
pub const SUBNQN: &str = "nqn.2026-01.org.example:disk1";
pub const BLOCK: usize = 512;

pub fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

// ---- PDUs as a target sends them ----

pub fn icresp_pdu(maxh2cdata: u32) -> Vec<u8> {
    let mut p = vec![0u8; 128];
    p[0] = pdu::ICRESP;
    p[2] = 128;
    p[4..8].copy_from_slice(&128u32.to_le_bytes());
    p[12..16].copy_from_slice(&maxh2cdata.to_le_bytes());
    p
}

pub fn resp_pdu(cid: u16, status: Status, result: u64) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0] = pdu::CAPSULE_RESP;
    p[2] = 24;
    p[4..8].copy_from_slice(&24u32.to_le_bytes());
    p[8..16].copy_from_slice(&result.to_le_bytes());
    let dw3 = u32::from(cid) | (u32::from(status.0) << 17);
    p[20..24].copy_from_slice(&dw3.to_le_bytes());
    p
}

pub fn c2h_pdu(cid: u16, offset: u32, data: &[u8], flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0] = pdu::C2H_DATA;
    p[1] = flags;
    p[2] = 24;
    p[3] = 24;
    p[4..8].copy_from_slice(&(24 + data.len() as u32).to_le_bytes());
    p[8..10].copy_from_slice(&cid.to_le_bytes());
    p[12..16].copy_from_slice(&offset.to_le_bytes());
    p[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
    p.extend_from_slice(data);
    p
}

pub fn r2t_pdu(cid: u16, ttag: u16, offset: u32, len: u32) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0] = pdu::R2T;
    p[2] = 24;
    p[4..8].copy_from_slice(&24u32.to_le_bytes());
    p[8..10].copy_from_slice(&cid.to_le_bytes());
    p[10..12].copy_from_slice(&ttag.to_le_bytes());
    p[12..16].copy_from_slice(&offset.to_le_bytes());
    p[16..20].copy_from_slice(&len.to_le_bytes());
    p
}

pub fn term_pdu(fes: u16) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0] = pdu::C2H_TERM;
    p[2] = 24;
    p[4..8].copy_from_slice(&24u32.to_le_bytes());
    p[8..10].copy_from_slice(&fes.to_le_bytes());
    p
}

/// `p`, a PDU as built above (no digests), as sent with `digests` in force: digest flags,
/// the header digest after the header, PDO and PLEN moved, the data digest after the data.
fn patch(data: &mut [u8], bytes: &[(usize, u8)]) {
    for &(at, value) in bytes {
        if let Some(b) = data.get_mut(at) {
            *b = value;
        }
    }
}

pub fn with_digests(p: &[u8], digests: pdu::Digests) -> Vec<u8> {
    let (t, hlen, pdo) = (p[0], usize::from(p[2]), usize::from(p[3]));
    let data = if pdo != 0 { &p[pdo..] } else { &p[p.len()..] };
    let header_digest = digests.header && !matches!(t, pdu::ICRESP | pdu::C2H_TERM);
    let data_digest = digests.data && !data.is_empty();
    let mut out = p[..hlen].to_vec();
    if header_digest {
        out[1] |= pdu::FLAG_HDGST;
    }
    if data_digest {
        out[1] |= pdu::FLAG_DDGST;
    }
    let full_hlen = hlen + if header_digest { 4 } else { 0 };
    out[3] = if data.is_empty() { 0 } else { full_hlen as u8 };
    let plen = full_hlen + data.len() + if data_digest { 4 } else { 0 };
    out[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
    if header_digest {
        let crc = crate::crc32c::checksum(&out[..hlen]);
        out.extend(crc.to_le_bytes());
    }
    out.extend_from_slice(data);
    if data_digest {
        out.extend(crate::crc32c::checksum(data).to_le_bytes());
    }
    out
}

// ---- The fake target ----

pub struct PendingWrite {
    pub sqe: [u8; 64],
    pub len: u32,
    pub data: Vec<u8>,
    pub ttag: u16,
    /// End of the active R2T.
    pub r2t_end: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConnectSeen {
    pub qid: u16,
    pub sqsize: u16,
    pub kato: u32,
    pub cntlid: u16,
    pub host_id: [u8; 16],
    pub subnqn: String,
    pub hostnqn: String,
}

/// Knobs and records of a fake target connection.
pub struct Target {
    pub rx: Vec<u8>,
    pub out: Vec<u8>,
    pub initialized: bool,
    pub maxh2cdata: u32,
    /// IOCCSZ in 16-byte units.
    pub ioccsz: u32,
    pub mdts: u8,
    pub maxcmd: u16,
    pub sgls: u32,
    /// Identify Namespace: size override, FLBAS, NLBAF, and format 0's metadata size
    /// and LBADS.
    pub ns_blocks: Option<u64>,
    pub flbas: u8,
    pub nlbaf: u8,
    pub lbaf0: (u16, u8),
    pub cap: u64,
    pub cc: u32,
    /// CSTS reads that report not-ready before RDY.
    pub csts_polls_before_ready: u32,
    pub csts_fatal: bool,
    pub csts_reads: u32,
    /// Shutdown notifications received (CC.SHN going from 00b to 01b), and the CSTS
    /// reads since the last that said "shutdown occurring".
    pub shutdowns: u32,
    pub shutdown_reads: u32,
    /// CSTS reads after a shutdown notification that say "occurring" before one says
    /// "complete"; `u32::MAX`: the shutdown never completes.
    pub shutdown_polls: u32,
    /// A command came after the shutdown notification (this host sends none but the
    /// CSTS reads).
    pub after_shutdown: u32,
    pub disk: Vec<u8>,
    pub nsid: u32,
    /// Most bytes per C2HData PDU.
    pub c2h_chunk: usize,
    /// Send reads' completions as the C2HData SUCCESS flag.
    pub success_flag: bool,
    /// Most bytes per R2T.
    pub r2t_chunk: u32,
    /// Connect fails with this status.
    /// Connect fails with this status and dword 0.
    pub connect_status: Option<(Status, u64)>,
    /// Keep-alives are not answered.
    pub mute_keep_alive: bool,
    /// I/O queues allotted to Set Features Number of Queues, whatever was asked (as
    /// Linux nvmet answers its subsystem's limit); `None`: that Set Features fails.
    pub io_queues: Option<u16>,
    /// The I/O queues the host asked for (Set Features Number of Queues).
    pub io_queues_asked: Option<(u16, u16)>,
    pub cntlid: u16,
    pub writes: HashMap<u16, PendingWrite>,
    pub next_ttag: u16,
    pub connects: Vec<ConnectSeen>,
    pub keep_alives: u32,
    pub flushes: u32,
    /// I/O commands executed (reads, writes, flushes, deallocates).
    pub io_commands: u32,
    pub inline_writes: u32,
    pub r2ts: u32,
    pub h2c_pdus: u32,
    /// Largest H2CData payload seen.
    pub h2c_max: u32,
    pub cids_in_flight: Vec<u16>,
    /// Digests in force (those the host asked for, once ICResp went).
    pub digests: pdu::Digests,
    /// ICResp's DGST field, whatever the host asked.
    pub icresp_dgst: Option<u8>,
    /// The next this many C2HData PDUs have a byte of data changed after their digest
    /// was made (a corrupting path).
    pub corrupt_c2h: u32,
    /// The next PDU sent with a header digest gets a wrong one.
    pub corrupt_header: bool,
    /// An I/O command touching this LBA is not executed: the target drops the connection
    /// instead (`dropped` is set; the caller's network closes it).
    pub poison_lba: Option<usize>,
    pub dropped: bool,
    /// Every I/O command is answered with this status, not executed (a path-related
    /// one: the namespace's ANA group inaccessible through this controller).
    pub path_status: Option<Status>,
    /// The namespace's ANA group (0: the controller does not report ANA) and the
    /// group's state byte in the ANA log.
    pub ana_group: u32,
    pub ana_state: u8,
    /// ANA Transition Time in Identify Controller (nvmet's is 10 s).
    pub ana_transition_s: u8,
    /// Get Log Page (ANA) fails (Invalid Log Page).
    pub ana_log_fails: bool,
    /// ANA log pages read.
    pub ana_log_reads: u32,
    /// Bytes of Identify data, and of the ANA log, overwritten before they go (a
    /// controller that reports nonsense): (offset, value).
    pub identify_patch: Vec<(usize, u8)>,
    pub log_patch: Vec<(usize, u8)>,
    /// Asynchronous Event Configuration, as the host set it.
    pub async_events: Option<u32>,
    /// Asynchronous Event Requests held for the next event.
    pub event_requests: Vec<u16>,
    /// Events waiting for a request: each its dword 0.
    pub events_waiting: Vec<u64>,
    /// Changed Namespace List reads, and the NSIDs the next one lists.
    pub changed_log_reads: u32,
    pub changed_namespaces: Vec<u32>,
    /// Host PDUs whose header digest, and whose data digest, were checked.
    pub header_digests_checked: u32,
    pub data_digests_checked: u32,
}

impl Default for Target {
    fn default() -> Self {
        Self::new()
    }
}

impl Target {
    pub fn new() -> Self {
        let mut disk = vec![0u8; 256 * BLOCK];
        for (i, b) in disk.iter_mut().enumerate() {
            *b = (i * 7 + i / 512) as u8;
        }
        Target {
            rx: Vec::new(),
            out: Vec::new(),
            initialized: false,
            maxh2cdata: 8192,
            ioccsz: (64 + 4096) / 16,
            mdts: 5,
            maxcmd: 64,
            sgls: 1,
            ns_blocks: None,
            flbas: 0,
            nlbaf: 0,
            lbaf0: (0, 9),
            // MQES 127, TO 2 (1 s), CSS NVM.
            cap: 127 | (2 << 24) | (1 << 37),
            cc: 0,
            csts_polls_before_ready: 2,
            csts_fatal: false,
            csts_reads: 0,
            shutdowns: 0,
            shutdown_reads: 0,
            shutdown_polls: 1,
            after_shutdown: 0,
            disk,
            nsid: 1,
            c2h_chunk: 1500,
            success_flag: false,
            r2t_chunk: 1 << 20,
            connect_status: None,
            mute_keep_alive: false,
            io_queues: Some(128),
            io_queues_asked: None,
            cntlid: 0x11,
            writes: HashMap::new(),
            next_ttag: 1,
            connects: Vec::new(),
            keep_alives: 0,
            flushes: 0,
            io_commands: 0,
            inline_writes: 0,
            r2ts: 0,
            h2c_pdus: 0,
            h2c_max: 0,
            cids_in_flight: Vec::new(),
            digests: pdu::Digests::NONE,
            icresp_dgst: None,
            corrupt_c2h: 0,
            corrupt_header: false,
            header_digests_checked: 0,
            data_digests_checked: 0,
            poison_lba: None,
            dropped: false,
            path_status: None,
            ana_group: 0,
            ana_state: 0x01,
            ana_transition_s: 10,
            ana_log_fails: false,
            ana_log_reads: 0,
            identify_patch: Vec::new(),
            log_patch: Vec::new(),
            async_events: None,
            event_requests: Vec::new(),
            events_waiting: Vec::new(),
            changed_log_reads: 0,
            changed_namespaces: Vec::new(),
        }
    }

    /// Sends `p` (built without digests) with the digests in force, and the corruption
    /// asked for.
    pub fn send(&mut self, p: Vec<u8>) {
        let mut p = with_digests(&p, self.digests);
        if p[1] & pdu::FLAG_HDGST != 0 && self.corrupt_header {
            self.corrupt_header = false;
            let at = usize::from(p[2]);
            p[at] ^= 1;
        }
        if p[0] == pdu::C2H_DATA && self.corrupt_c2h > 0 {
            self.corrupt_c2h -= 1;
            let at = usize::from(p[3]);
            p[at] ^= 0x80;
        }
        self.out.extend(p);
    }

    /// Checks and takes off the digests of a host PDU: the PDU as it would be without.
    fn strip_digests(&mut self, p: &[u8]) -> Vec<u8> {
        let (t, flags, hlen, pdo) = (p[0], p[1], usize::from(p[2]), usize::from(p[3]));
        let has_data = pdo != 0;
        assert_eq!(
            flags & pdu::FLAG_HDGST != 0,
            self.digests.header,
            "header digest flag on PDU type {t}"
        );
        assert_eq!(
            flags & pdu::FLAG_DDGST != 0,
            self.digests.data && has_data,
            "data digest flag on PDU type {t}"
        );
        let mut full_hlen = hlen;
        if self.digests.header {
            let sent = le32(p, hlen);
            assert_eq!(sent, crate::crc32c::checksum(&p[..hlen]), "header digest");
            self.header_digests_checked += 1;
            full_hlen += 4;
        }
        let mut end = p.len();
        if self.digests.data && has_data {
            end -= 4;
            assert_eq!(pdo, full_hlen, "data right after the header digest");
            let sent = le32(p, end);
            assert_eq!(sent, crate::crc32c::checksum(&p[pdo..end]), "data digest");
            self.data_digests_checked += 1;
        }
        let mut out = p[..hlen].to_vec();
        out[1] &= !(pdu::FLAG_HDGST | pdu::FLAG_DDGST);
        if has_data {
            out[3] = hlen as u8;
            out.extend_from_slice(&p[pdo..end]);
        }
        let plen = out.len() as u32;
        out[4..8].copy_from_slice(&plen.to_le_bytes());
        out
    }

    pub fn input(&mut self, bytes: &[u8]) {
        self.rx.extend_from_slice(bytes);
        loop {
            if self.rx.len() < 8 {
                return;
            }
            let plen = le32(&self.rx, 4) as usize;
            assert!(plen >= 8, "host PDU with plen {plen}");
            if self.rx.len() < plen {
                return;
            }
            let p: Vec<u8> = self.rx.drain(..plen).collect();
            self.pdu(&p);
        }
    }

    pub fn pdu(&mut self, p: &[u8]) {
        if !self.initialized {
            let (t, flags, hlen, pdo) = (p[0], p[1], p[2], p[3]);
            assert_eq!(t, pdu::ICREQ, "first host PDU must be ICReq");
            assert_eq!((flags, hlen, pdo, p.len()), (0, 128, 0, 128));
            assert_eq!(le16(p, 8), 0, "pfv");
            assert_eq!(p[10], 0, "hpda");
            assert_eq!(p[11] & !3, 0, "digest bits");
            assert_eq!(le32(p, 12), 0, "maxr2t");
            self.initialized = true;
            // As Linux nvmet: whatever digests the host asks for.
            let asked = pdu::Digests {
                header: p[11] & 1 != 0,
                data: p[11] & 2 != 0,
            };
            let mut icresp = icresp_pdu(self.maxh2cdata);
            icresp[11] = self.icresp_dgst.unwrap_or(asked.bits());
            self.out.extend(icresp);
            self.digests = asked;
            return;
        }
        let p = &self.strip_digests(p)[..];
        let (t, flags, hlen, pdo) = (p[0], p[1], p[2], p[3]);
        match t {
            pdu::CAPSULE_CMD => {
                assert_eq!(flags, 0);
                assert_eq!(hlen, 72);
                let mut sqe = [0u8; 64];
                sqe.copy_from_slice(&p[8..72]);
                let data = if p.len() > 72 {
                    assert_eq!(pdo, 72, "in-capsule data right after the entry");
                    &p[72..]
                } else {
                    assert_eq!(pdo, 0);
                    &p[72..72]
                };
                self.command(sqe, data);
            }
            pdu::H2C_DATA => {
                assert_eq!((hlen, pdo), (24, 24));
                assert_eq!(flags & !pdu::FLAG_DATA_LAST, 0);
                let cid = le16(p, 8);
                let ttag = le16(p, 10);
                let offset = le32(p, 12);
                let len = le32(p, 16);
                assert_eq!(len as usize, p.len() - 24, "DATAL");
                assert!(len <= self.maxh2cdata, "H2CData of {len} > MAXH2CDATA");
                self.h2c_pdus += 1;
                self.h2c_max = self.h2c_max.max(len);
                let w = self
                    .writes
                    .get_mut(&cid)
                    .expect("H2CData for a write with an R2T");
                assert_eq!(ttag, w.ttag);
                assert_eq!(offset as usize, w.data.len(), "H2CData in order");
                w.data.extend_from_slice(&p[24..]);
                let at_end = w.data.len() as u32 == w.r2t_end;
                assert!(
                    w.data.len() as u32 <= w.r2t_end,
                    "more data than the R2T asked"
                );
                assert_eq!(
                    flags & pdu::FLAG_DATA_LAST != 0,
                    at_end,
                    "LAST on the R2T's last PDU only"
                );
                if at_end {
                    if w.r2t_end < w.len {
                        let (off, end) = (w.r2t_end, w.len.min(w.r2t_end + self.r2t_chunk));
                        w.r2t_end = end;
                        let ttag = w.ttag;
                        self.r2ts += 1;
                        self.send(r2t_pdu(cid, ttag, off, end - off));
                    } else {
                        let w = self.writes.remove(&cid).unwrap();
                        self.execute(w.sqe, &w.data);
                    }
                }
            }
            t => panic!("host sent PDU type {t}"),
        }
    }

    pub fn command(&mut self, sqe: [u8; 64], inline: &[u8]) {
        let cid = le16(&sqe, 2);
        assert_eq!(sqe[1] & 0xc0, 0x40, "PSDT: SGL");
        assert!(
            !self.cids_in_flight.contains(&cid),
            "CID {cid:#x} reused while in flight"
        );
        self.cids_in_flight.push(cid);
        let sgl_len = le32(&sqe, 32);
        let sgl_type = sqe[39];
        // Admin and I/O opcodes overlap (Set Features and Dataset Management are both 9).
        let io_queue = self.connects.last().is_some_and(|c| c.qid != 0);
        let writes = (io_queue && matches!(sqe[0], sqe::IO_WRITE | sqe::IO_DSM))
            || (sqe[0] == sqe::OPC_FABRICS && sqe[4] == sqe::FCTYPE_CONNECT);
        if !inline.is_empty() {
            assert_eq!(
                (sgl_type, sgl_len as usize),
                (0x01, inline.len()),
                "in-capsule SGL"
            );
            assert_eq!(le64(&sqe, 24), 0, "in-capsule offset");
            if sqe[0] == sqe::IO_WRITE {
                self.inline_writes += 1;
            }
            self.execute(sqe, inline);
        } else if writes {
            assert_eq!(sgl_type, 0x5a, "transport SGL");
            assert!(sgl_len > 0);
            let end = sgl_len.min(self.r2t_chunk);
            let ttag = self.next_ttag;
            self.next_ttag += 1;
            self.writes.insert(
                cid,
                PendingWrite {
                    sqe,
                    len: sgl_len,
                    data: Vec::new(),
                    ttag,
                    r2t_end: end,
                },
            );
            self.r2ts += 1;
            self.send(r2t_pdu(cid, ttag, 0, end));
        } else {
            assert_eq!(sgl_type, 0x5a, "transport SGL");
            self.execute(sqe, &[]);
        }
    }

    /// The namespace's ANA group changes to `state` through this controller; a notice
    /// goes to the host if it turned ANA change notices on (at once on a request held,
    /// else on its next).
    pub fn ana_change(&mut self, state: u8) {
        self.ana_state = state;
        // Notice, ANA change, the ANA log page.
        self.notify(
            sqe::AEN_ANA_CHANGE,
            2 | 3 << 8 | u64::from(crate::ana::LOG_ANA) << 16,
        );
    }

    /// The namespace now has `blocks` blocks (an operator resized the volume); a
    /// Namespace Attribute notice goes to the host if it turned those on.
    pub fn resize_namespace(&mut self, blocks: u64) {
        self.ns_blocks = Some(blocks);
        self.changed_namespaces.push(self.nsid);
        self.notify_namespace_attribute();
    }

    /// A Namespace Attribute notice (for the NSIDs in `changed_namespaces`).
    pub fn notify_namespace_attribute(&mut self) {
        let log = u64::from(sqe::LOG_CHANGED_NAMESPACES) << 16;
        self.notify(sqe::AEN_NAMESPACE_ATTRIBUTE, 2 | log);
    }

    fn notify(&mut self, enabled_by: u32, result: u64) {
        if self.async_events.is_some_and(|m| m & enabled_by != 0) {
            self.events_waiting.push(result);
            self.report_events();
        }
    }

    fn report_events(&mut self) {
        while !self.events_waiting.is_empty() && !self.event_requests.is_empty() {
            let cid = self.event_requests.remove(0);
            let result = self.events_waiting.remove(0);
            self.respond(cid, Status::SUCCESS, result);
        }
    }

    pub fn respond(&mut self, cid: u16, status: Status, result: u64) {
        self.cids_in_flight.retain(|&c| c != cid);
        self.send(resp_pdu(cid, status, result));
    }

    pub fn send_data(&mut self, cid: u16, data: &[u8]) {
        let mut off = 0;
        while off < data.len() {
            let n = self.c2h_chunk.min(data.len() - off);
            let last = off + n == data.len();
            let mut flags = if last { pdu::FLAG_DATA_LAST } else { 0 };
            if last && self.success_flag {
                flags |= pdu::FLAG_DATA_SUCCESS;
            }
            self.send(c2h_pdu(cid, off as u32, &data[off..off + n], flags));
            off += n;
        }
        if self.success_flag {
            self.cids_in_flight.retain(|&c| c != cid);
        } else {
            self.respond(cid, Status::SUCCESS, 0);
        }
    }

    pub fn execute(&mut self, sqe: [u8; 64], data: &[u8]) {
        let cid = le16(&sqe, 2);
        let nsid = le32(&sqe, 4);
        let ok = Status::SUCCESS;
        let is_csts_read = sqe[0] == sqe::OPC_FABRICS
            && sqe[4] == sqe::FCTYPE_PROPERTY_GET
            && le32(&sqe, 44) == sqe::PROP_CSTS;
        if self.cc & (0b11 << 14) != 0 && !is_csts_read {
            self.after_shutdown += 1;
        }
        match sqe[0] {
            sqe::OPC_FABRICS => match sqe[4] {
                sqe::FCTYPE_CONNECT => {
                    assert_eq!(data.len(), 1024);
                    let nqn = |at: usize| {
                        let f = &data[at..at + 256];
                        String::from_utf8(f[..f.iter().position(|&b| b == 0).unwrap()].to_vec())
                            .unwrap()
                    };
                    self.connects.push(ConnectSeen {
                        qid: le16(&sqe, 42),
                        sqsize: le16(&sqe, 44),
                        kato: le32(&sqe, 48),
                        cntlid: le16(data, 16),
                        host_id: data[0..16].try_into().unwrap(),
                        subnqn: nqn(256),
                        hostnqn: nqn(512),
                    });
                    match self.connect_status {
                        Some((s, result)) => self.respond(cid, s, result),
                        None => self.respond(cid, ok, u64::from(self.cntlid)),
                    }
                }
                sqe::FCTYPE_PROPERTY_GET => {
                    let value = match le32(&sqe, 44) {
                        sqe::PROP_CAP => {
                            assert_eq!(sqe[40], 1, "CAP is 8 bytes");
                            self.cap
                        }
                        sqe::PROP_CSTS => {
                            self.csts_reads += 1;
                            let rdy =
                                self.cc & 1 != 0 && self.csts_reads > self.csts_polls_before_ready;
                            // SHST: 01b occurring, 10b complete.
                            let shst = if self.cc & (0b11 << 14) == 0 {
                                0
                            } else {
                                self.shutdown_reads += 1;
                                if self.shutdown_reads > self.shutdown_polls {
                                    0b10
                                } else {
                                    0b01
                                }
                            };
                            u64::from(rdy) | (if self.csts_fatal { 2 } else { 0 }) | (shst << 2)
                        }
                        sqe::PROP_CC => u64::from(self.cc),
                        o => panic!("property {o:#x}"),
                    };
                    self.respond(cid, ok, value);
                }
                sqe::FCTYPE_PROPERTY_SET => {
                    assert_eq!(le32(&sqe, 44), sqe::PROP_CC);
                    let cc = le32(&sqe, 48);
                    if self.cc & (0b11 << 14) == 0 && cc & (0b11 << 14) == 0b01 << 14 {
                        self.shutdowns += 1;
                        self.shutdown_reads = 0;
                    }
                    self.cc = cc;
                    self.respond(cid, ok, 0);
                }
                f => panic!("fctype {f}"),
            },
            sqe::ADMIN_IDENTIFY if self.connects.last().unwrap().qid == 0 => {
                assert_eq!(le32(&sqe, 32), 4096);
                let mut id = vec![0u8; 4096];
                match le32(&sqe, 40) {
                    sqe::CNS_CONTROLLER => {
                        if self.ana_group != 0 {
                            id[76] = 1 << 3;
                            id[342] = self.ana_transition_s;
                        }
                        id[77] = self.mdts;
                        id[78..80].copy_from_slice(&self.cntlid.to_le_bytes());
                        id[514..516].copy_from_slice(&self.maxcmd.to_le_bytes());
                        id[520..522].copy_from_slice(&(1u16 << 2).to_le_bytes());
                        id[525] = 1;
                        id[536..540].copy_from_slice(&self.sgls.to_le_bytes());
                        id[1792..1796].copy_from_slice(&self.ioccsz.to_le_bytes());
                    }
                    sqe::CNS_NAMESPACE => {
                        if nsid != self.nsid {
                            // Linux nvmet: Invalid Namespace or Format.
                            self.respond(cid, Status::new(0, 0x0b), 0);
                            return;
                        }
                        let blocks = self.ns_blocks.unwrap_or((self.disk.len() / BLOCK) as u64);
                        id[0..8].copy_from_slice(&blocks.to_le_bytes());
                        id[25] = self.nlbaf;
                        id[26] = self.flbas;
                        id[128..130].copy_from_slice(&self.lbaf0.0.to_le_bytes());
                        id[128 + 2] = self.lbaf0.1;
                        id[132 + 2] = 12;
                        id[92..96].copy_from_slice(&self.ana_group.to_le_bytes());
                    }
                    c => panic!("cns {c}"),
                }
                patch(&mut id, &self.identify_patch);
                self.send_data(cid, &id);
            }
            sqe::ADMIN_GET_LOG_PAGE if self.connects.last().unwrap().qid == 0 => {
                let cdw10 = le32(&sqe, 40);
                let (lid, rgo) = (cdw10 as u8, (cdw10 >> 8) & 1 != 0);
                let len = ((cdw10 >> 16 | le32(&sqe, 44) << 16) as usize + 1) * 4;
                assert_eq!(le32(&sqe, 32) as usize, len, "SGL length");
                if lid == sqe::LOG_CHANGED_NAMESPACES {
                    self.changed_log_reads += 1;
                    let mut log: Vec<u8> = self
                        .changed_namespaces
                        .drain(..)
                        .flat_map(u32::to_le_bytes)
                        .collect();
                    log.resize(len, 0);
                    self.send_data(cid, &log);
                    return;
                }
                self.ana_log_reads += 1;
                if lid != crate::ana::LOG_ANA || self.ana_log_fails {
                    // Invalid Log Page.
                    self.respond(cid, Status::new(1, 0x09), 0);
                    return;
                }
                // Another group first, as nvmet lists every enabled group; and the
                // namespace lists unless the host asked for groups only.
                let mut log = vec![0u8; 16];
                log[8] = 2;
                for (group, state, nsid) in [
                    (0x55, 0x01, 99),
                    (self.ana_group, self.ana_state, self.nsid),
                ] {
                    let mut d = [0u8; 32];
                    d[0..4].copy_from_slice(&u32::to_le_bytes(group));
                    d[4] = u8::from(!rgo);
                    d[16] = state;
                    log.extend_from_slice(&d);
                    if !rgo {
                        log.extend_from_slice(&u32::to_le_bytes(nsid));
                    }
                }
                log.resize(len, 0);
                patch(&mut log, &self.log_patch);
                self.send_data(cid, &log);
            }
            sqe::ADMIN_SET_FEATURES
                if self.connects.last().unwrap().qid == 0
                    && le32(&sqe, 40) & 0xff == sqe::FEATURE_ASYNC_EVENT_CONFIG =>
            {
                self.async_events = Some(le32(&sqe, 44));
                self.respond(cid, ok, 0);
            }
            sqe::ADMIN_ASYNC_EVENT_REQUEST if self.connects.last().unwrap().qid == 0 => {
                // nvmet holds at most 4 (NVMET_ASYNC_EVENTS): Asynchronous Event Request
                // Limit Exceeded beyond.
                if self.event_requests.len() >= 4 {
                    self.respond(cid, Status::new(1, 0x05), 0);
                    return;
                }
                self.event_requests.push(cid);
                self.report_events();
            }
            sqe::ADMIN_SET_FEATURES if self.connects.last().unwrap().qid == 0 => {
                assert_eq!(le32(&sqe, 40) & 0xff, sqe::FEATURE_NUMBER_OF_QUEUES);
                let asked = le32(&sqe, 44);
                self.io_queues_asked = Some(((asked & 0xffff) as u16, (asked >> 16) as u16));
                match self.io_queues {
                    Some(n) => {
                        let allotted = u64::from(n - 1);
                        self.respond(cid, ok, allotted << 16 | allotted);
                    }
                    // Invalid Field in Command.
                    None => self.respond(cid, Status::new(0, 0x02), 0),
                }
            }
            sqe::ADMIN_KEEP_ALIVE if self.connects.last().unwrap().qid == 0 => {
                self.keep_alives += 1;
                if !self.mute_keep_alive {
                    self.respond(cid, ok, 0);
                }
            }
            op => {
                assert_ne!(
                    self.connects.last().unwrap().qid,
                    0,
                    "I/O opcode {op} on the admin queue"
                );
                assert_eq!(nsid, self.nsid);
                self.io_commands += 1;
                let lba = le64(&sqe, 40) as usize;
                let blocks = (le32(&sqe, 48) & 0xffff) as usize + 1;
                let range = lba * BLOCK..(lba + blocks) * BLOCK;
                if self
                    .poison_lba
                    .is_some_and(|p| (lba..lba + blocks).contains(&p))
                {
                    self.dropped = true;
                    return;
                }
                if let Some(status) = self.path_status {
                    self.respond(cid, status, 0);
                    return;
                }
                match op {
                    sqe::IO_READ => {
                        assert_eq!(le32(&sqe, 32) as usize, range.len());
                        let d = self.disk[range].to_vec();
                        self.send_data(cid, &d);
                    }
                    sqe::IO_WRITE => {
                        assert_eq!(data.len(), range.len());
                        self.disk[range].copy_from_slice(data);
                        self.respond(cid, ok, 0);
                    }
                    sqe::IO_FLUSH => {
                        self.flushes += 1;
                        self.respond(cid, ok, 0);
                    }
                    sqe::IO_DSM => {
                        assert_eq!(le32(&sqe, 40), 0, "one range");
                        assert_eq!(le32(&sqe, 44), 4, "deallocate");
                        assert_eq!(data.len(), 16);
                        let (n, slba) = (le32(data, 4) as usize, le64(data, 8) as usize);
                        self.disk[slba * BLOCK..(slba + n) * BLOCK].fill(0);
                        self.respond(cid, ok, 0);
                    }
                    op => panic!("opcode {op}"),
                }
            }
        }
    }
}
