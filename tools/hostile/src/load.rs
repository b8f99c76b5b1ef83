// SPDX-License-Identifier: MIT OR Apache-2.0
//! `hostile load`: a lean blkif load generator. It measures a block backend at the
//! backend's own limit, so the frontend does as little as a frontend can: every request
//! slot owns its data pages (and, above 11 segments, an indirect page whose descriptors
//! are written once), granted once for the whole run (persistent grants); responses are
//! reaped by polling `rsp_prod` (the backend is never asked for an event: `rsp_event`
//! stays at `SHARED_RING_INIT`'s 1, past which only the first response goes); a request is announced only when the backend
//! asked for it (`RING_PUSH_REQUESTS_AND_CHECK_NOTIFY` against its `req_event`).
//!
//! The loop here is generic over the ring memory and how the backend is kicked, so the
//! host tests drive it against blkback's engine over fake guest memory; `main.rs` drives
//! it against a real backend over gntalloc pages.

use std::time::Instant;

use blkback::abi::{self, request, PAGE_SIZE, REQUEST_SIZE, RSP_OKAY};
use blkback::fake::wire::{encode_direct, encode_indirect, encode_segment};
use blkback::fake::{FrontRing, Rng};
use blkback::parse::SegmentDesc;
use blkback::ring::RingMemory;

const SECTOR: usize = 512;
const SECTORS_PER_PAGE: usize = PAGE_SIZE / SECTOR;
/// The largest request: one indirect page of descriptors' worth (2 MiB).
pub const MAX_SEGMENTS: usize = abi::SEGMENTS_PER_INDIRECT_PAGE;
/// What `--verify` writes at the start of every 512-byte sector, followed by the sector's
/// number (both little-endian u64).
const STAMP_MAGIC: u64 = 0x474c_6d6f_646b_6c62; // "blkdomLG"

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub write: bool,
    pub random: bool,
    /// Bytes per request, a multiple of 4 KiB.
    pub bs: usize,
    /// Requests kept in flight on each queue.
    pub qd: u32,
    pub queues: u32,
    /// Measured seconds, after `ramp` seconds that are not counted.
    pub seconds: f64,
    pub ramp: f64,
    /// Sequential, one pass over the range, then stop (the prefill); no ramp.
    pub once: bool,
    /// Bytes at the start of the disk to address (default: all of it).
    pub range_bytes: Option<u64>,
    /// Writes stamp every sector with its number; reads check the stamps.
    pub verify: bool,
    pub persistent: bool,
    pub seed: u64,
    /// Stop after this many requests; they all count, the window closing when the last
    /// is answered (tests; also a bound on a run).
    pub max_ios: Option<u64>,
    /// `rig-guest: begin|end <cue>` on the console at the measured window's edges.
    pub cue: Option<String>,
    /// How long in-flight requests may take to come back once submission stopped.
    pub drain_s: f64,
    /// At most this many requests a second over all queues (0: as fast as answered),
    /// evenly spaced; `qd` still bounds what is in flight.
    pub rate: u64,
    /// Connected, and no request at all for the window: what the backend costs idle.
    pub idle: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            write: false,
            random: true,
            bs: 4096,
            qd: 32,
            queues: 1,
            seconds: 10.0,
            ramp: 1.0,
            once: false,
            range_bytes: None,
            verify: false,
            persistent: true,
            seed: 1,
            max_ios: None,
            cue: None,
            drain_s: 30.0,
            rate: 0,
            idle: false,
        }
    }
}

/// `4k`, `64k`, `1m`, `512`: bytes.
pub fn parse_size(text: &str) -> Option<usize> {
    let text = text.to_ascii_lowercase();
    let (digits, unit) = match text.as_bytes().last()? {
        b'k' => (&text[..text.len() - 1], 1 << 10),
        b'm' => (&text[..text.len() - 1], 1 << 20),
        b'g' => (&text[..text.len() - 1], 1 << 30),
        _ => (&text[..], 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

pub const USAGE: &str = "hostile load --vbd xvdX [--rw randread|randwrite|read|write] [--bs 4k] \
[--qd 32] [--queues 1] [--time 10] [--ramp 1] [--range 256m] [--once] [--verify] \
[--no-persistent] [--seed N] [--ios N] [--rate IOPS] [--idle] [--cue NAME]";

/// The options after `load`: the vbd's name and the spec.
pub fn parse_args(args: &[String]) -> Result<(String, Spec), String> {
    let mut spec = Spec::default();
    let mut vbd = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        let number = |v: &String| {
            v.parse::<u64>()
                .map_err(|_| format!("{arg} {v}: not a number"))
        };
        let seconds = |v: &String| match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
            _ => Err(format!("{arg} {v}: not a number of seconds")),
        };
        match arg.as_str() {
            "--vbd" => vbd = Some(value()?.clone()),
            "--rw" => {
                (spec.write, spec.random) = match value()?.as_str() {
                    "randread" => (false, true),
                    "randwrite" => (true, true),
                    "read" => (false, false),
                    "write" => (true, false),
                    other => {
                        return Err(format!("--rw {other}: randread, randwrite, read or write"))
                    }
                }
            }
            "--bs" => {
                let v = value()?;
                spec.bs = parse_size(v).ok_or(format!("--bs {v}: not a size"))?;
            }
            "--qd" => spec.qd = number(value()?)? as u32,
            "--queues" => spec.queues = number(value()?)? as u32,
            "--time" => spec.seconds = seconds(value()?)?,
            "--ramp" => spec.ramp = seconds(value()?)?,
            "--range" => {
                let v = value()?;
                spec.range_bytes =
                    Some(parse_size(v).ok_or(format!("--range {v}: not a size"))? as u64);
            }
            "--once" => spec.once = true,
            "--verify" => spec.verify = true,
            "--no-persistent" => spec.persistent = false,
            "--seed" => spec.seed = number(value()?)?,
            "--ios" => spec.max_ios = Some(number(value()?)?),
            "--cue" => spec.cue = Some(value()?.clone()),
            "--rate" => spec.rate = number(value()?)?,
            "--idle" => spec.idle = true,
            other => return Err(format!("unknown option {other}; usage: {USAGE}")),
        }
    }
    if spec.bs == 0 || spec.bs % PAGE_SIZE != 0 || spec.bs / PAGE_SIZE > MAX_SEGMENTS {
        return Err(format!(
            "--bs {}: a multiple of 4 KiB up to {} KiB",
            spec.bs,
            MAX_SEGMENTS * 4
        ));
    }
    if spec.qd == 0 || spec.qd > abi::ring_slots(abi::MAX_RING_PAGE_ORDER) {
        return Err(format!(
            "--qd {}: 1 to {} (a ring of order {})",
            spec.qd,
            abi::ring_slots(abi::MAX_RING_PAGE_ORDER),
            abi::MAX_RING_PAGE_ORDER
        ));
    }
    if !(1..=16).contains(&spec.queues) {
        return Err(format!("--queues {}: 1 to 16", spec.queues));
    }
    if spec.once {
        spec.random = false;
        spec.ramp = 0.0;
    }
    Ok((vbd.ok_or(format!("--vbd missing; usage: {USAGE}"))?, spec))
}

impl Spec {
    pub fn segments(&self) -> usize {
        self.bs / PAGE_SIZE
    }
    /// Above 11 segments a request goes through an indirect page.
    pub fn indirect(&self) -> bool {
        self.segments() > abi::MAX_SEGMENTS_PER_REQUEST
    }
    /// Data pages, then indirect pages, the run grants.
    pub fn pages(&self) -> (usize, usize) {
        let slots = (self.qd * self.queues) as usize;
        (
            slots * self.segments(),
            if self.indirect() { slots } else { 0 },
        )
    }
    /// The smallest ring order with `qd` slots.
    pub fn ring_order(&self) -> u32 {
        (0..=abi::MAX_RING_PAGE_ORDER)
            .find(|&order| abi::ring_slots(order) >= self.qd)
            .unwrap_or(abi::MAX_RING_PAGE_ORDER)
    }
    pub fn rw(&self) -> &'static str {
        match (self.write, self.random) {
            (false, true) => "randread",
            (true, true) => "randwrite",
            (false, false) => "read",
            (true, false) => "write",
        }
    }
}

/// One granted page: its reference and where it is mapped (a chunk of pages and the
/// byte offset in it).
#[derive(Clone, Copy, Debug)]
pub struct PageAt {
    pub gref: u32,
    pub chunk: usize,
    pub offset: usize,
}

/// The run's granted pages.
pub struct DataPages<M> {
    pub chunks: Vec<M>,
    /// Data pages: queue q, slot s owns `[(q * qd + s) * segments ..][..segments]`.
    pub data: Vec<PageAt>,
    /// Indirect pages, one per slot (when requests are indirect).
    pub indirect: Vec<PageAt>,
}

impl<M: RingMemory> DataPages<M> {
    fn write(&self, page: PageAt, offset: usize, bytes: &[u8]) {
        self.chunks[page.chunk].write_bytes(page.offset + offset, bytes);
    }
    fn read(&self, page: PageAt, offset: usize, out: &mut [u8]) {
        self.chunks[page.chunk].read_bytes(page.offset + offset, out);
    }
}

/// How the loop reaches the backend and the outside world.
pub trait Kick {
    /// The backend asked for an event on `queue`.
    fn notify(&mut self, queue: usize);
    /// Nothing came back this pass.
    fn idle(&mut self);
    /// This process's CPU time so far, seconds.
    fn cpu_seconds(&mut self) -> f64;
    /// A line for the console (`rig-guest: begin|end ...`).
    fn cue(&mut self, line: &str);
}

/// Latencies in a log-linear histogram: 32 buckets per power of two (3% resolution),
/// nanoseconds; fixed size, nothing allocated per sample.
pub struct Histogram {
    counts: Box<[u64; Self::BUCKETS]>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Histogram {
    const SUB_BITS: u32 = 5;
    const SUB: u64 = 1 << Self::SUB_BITS;
    const BUCKETS: usize = (Self::SUB as usize) * (64 - Self::SUB_BITS as usize + 1);

    pub fn new() -> Self {
        Self {
            counts: Box::new([0; Self::BUCKETS]),
            total: 0,
            sum: 0,
            max: 0,
        }
    }

    fn index(ns: u64) -> usize {
        if ns < Self::SUB {
            return ns as usize;
        }
        let exp = 63 - ns.leading_zeros(); // >= SUB_BITS
        let sub = (ns >> (exp - Self::SUB_BITS)) - Self::SUB;
        (Self::SUB + u64::from(exp - Self::SUB_BITS) * Self::SUB + sub) as usize
    }

    /// The middle of bucket `index`.
    fn value(index: usize) -> u64 {
        let index = index as u64;
        if index < Self::SUB {
            return index;
        }
        let exp = (index - Self::SUB) / Self::SUB + u64::from(Self::SUB_BITS);
        let sub = (index - Self::SUB) % Self::SUB;
        let shift = exp - u64::from(Self::SUB_BITS);
        ((Self::SUB + sub) << shift) + ((1 << shift) >> 1)
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum += u128::from(ns);
        self.max = self.max.max(ns);
    }

    /// The latency below which `fraction` of the samples lie (ns); 0 when empty.
    pub fn quantile(&self, fraction: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((fraction * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Self::value(index).min(self.max);
            }
        }
        self.max
    }

    pub fn mean(&self) -> u64 {
        self.sum.checked_div(u128::from(self.total)).unwrap_or(0) as u64
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Requests completed inside the measured window.
    pub ios: u64,
    pub window_s: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub mean_ns: u64,
    pub max_ns: u64,
    pub cpu_s: f64,
    /// Time in the loop's passes that took responses (and sent requests), in the window.
    pub busy_ns: u64,
    /// Event sends (the backend asked) over the window, and requests pushed in it.
    pub notifies: u64,
    pub pushed: u64,
    /// Responses with a status other than OKAY (whole run).
    pub errors: u64,
    /// Sectors whose stamp was not theirs on a verified read (whole run).
    pub verify_errors: u64,
    /// Responses naming no request in flight (whole run).
    pub bad_responses: u64,
    /// Requests sent over the whole run, and those never answered.
    pub sent: u64,
    pub unanswered: u64,
    /// The first thing that went wrong.
    pub first_problem: Option<String>,
}

impl Outcome {
    /// Every request answered OKAY (and verified), and some were (`idle`: none sent).
    pub fn ok(&self, idle: bool) -> bool {
        self.errors == 0
            && self.verify_errors == 0
            && self.bad_responses == 0
            && self.unanswered == 0
            && if idle { self.sent == 0 } else { self.ios > 0 }
    }

    fn problem(&mut self, what: String) {
        self.first_problem.get_or_insert(what);
    }
}

/// Per queue: when each slot's request went out (ns since the start; `u64::MAX`: free)
/// and its first sector.
struct Slots {
    issued: Vec<u64>,
    sector: Vec<u64>,
    /// Responses taken in one pass (ids), reused.
    done: Vec<(u64, i16)>,
    /// Slots with no request in flight, to be sent.
    free: Vec<usize>,
}

/// Where the next request goes.
struct Placement {
    rng: Rng,
    random: bool,
    once: bool,
    blocks: u64,
    next: u64,
    sectors_per_block: u64,
}

impl Placement {
    fn next(&mut self) -> Option<u64> {
        let block = if self.random {
            self.rng.below(self.blocks)
        } else {
            if self.once && self.next >= self.blocks {
                return None;
            }
            let block = self.next % self.blocks;
            self.next += 1;
            block
        };
        Some(block * self.sectors_per_block)
    }
}

fn stamp(sector: u64) -> [u8; 16] {
    let mut bytes = [0; 16];
    bytes[..8].copy_from_slice(&STAMP_MAGIC.to_le_bytes());
    bytes[8..].copy_from_slice(&sector.to_le_bytes());
    bytes
}

/// The request templates, one per slot: everything but the sector, which `submit`
/// writes in. Indirect pages get their descriptors here, once.
fn templates<M: RingMemory>(spec: &Spec, pages: &DataPages<M>) -> Vec<[u8; REQUEST_SIZE]> {
    let op = if spec.write {
        abi::OP_WRITE
    } else {
        abi::OP_READ
    };
    let segs = spec.segments();
    let slots = (spec.qd * spec.queues) as usize;
    (0..slots)
        .map(|slot| {
            let id = (slot % spec.qd as usize) as u64;
            let descs: Vec<SegmentDesc> = pages.data[slot * segs..][..segs]
                .iter()
                .map(|p| SegmentDesc {
                    gref: p.gref,
                    first_sect: 0,
                    last_sect: (SECTORS_PER_PAGE - 1) as u8,
                })
                .collect();
            if spec.indirect() {
                let page = pages.indirect[slot];
                let bytes: Vec<u8> = descs.iter().flat_map(encode_segment).collect();
                pages.write(page, 0, &bytes);
                encode_indirect(op, id, 0, segs as u16, &[page.gref])
            } else {
                encode_direct(op, id, 0, &descs)
            }
        })
        .collect()
}

/// Runs `spec` on `rings` (connected, one per queue) over a disk of `disk_sectors`
/// sectors, with `pages` granted as `spec.pages()` says.
pub fn drive<M: RingMemory>(
    spec: &Spec,
    rings: &mut [&mut FrontRing<M>],
    pages: &DataPages<M>,
    disk_sectors: u64,
    kick: &mut impl Kick,
) -> Outcome {
    let mut out = Outcome::default();
    let qd = spec.qd as usize;
    let segs = spec.segments();
    let sectors_per_block = (spec.bs / SECTOR) as u64;
    let range = spec
        .range_bytes
        .map_or(disk_sectors, |b| (b / SECTOR as u64).min(disk_sectors));
    let blocks = range / sectors_per_block;
    if blocks == 0 {
        out.problem(format!(
            "a range of {range} sectors holds no {} B block",
            spec.bs
        ));
        return out;
    }
    let mut placement = Placement {
        rng: Rng::new(spec.seed),
        random: spec.random,
        once: spec.once,
        blocks,
        next: 0,
        sectors_per_block,
    };
    let templates = templates(spec, pages);
    let mut slots: Vec<Slots> = (0..rings.len())
        .map(|_| Slots {
            issued: vec![u64::MAX; qd],
            sector: vec![0; qd],
            done: Vec::with_capacity(rings[0].slots() as usize),
            free: (0..qd).rev().collect(),
        })
        .collect();
    let mut hist = Histogram::new();
    let start = Instant::now();
    let now_ns = || start.elapsed().as_nanos() as u64;
    let ramp_end = (spec.ramp * 1e9) as u64;
    let end = ramp_end + (spec.seconds * 1e9) as u64;
    let drain_ns = (spec.drain_s * 1e9) as u64;
    // Runs that end by count rather than time count every answer, to the last.
    let bounded = spec.once || spec.max_ios.is_some();
    let mut measuring = false;
    let mut submitting = !spec.idle;
    let (mut window_start, mut window_end) = (0u64, 0u64);
    let mut cpu_start = 0.0;
    let mut in_flight = 0usize;
    let mut stamp_buf = [0u8; 16];

    // Puts slot `s` of queue `q` on its ring (not yet pushed); false if the range is
    // done (`--once`).
    let mut submit =
        |q: usize, s: usize, slots: &mut [Slots], ring: &mut FrontRing<M>, at: u64| -> bool {
            let Some(sector) = placement.next() else {
                return false;
            };
            let slot = q * qd + s;
            if spec.verify {
                for (i, &page) in pages.data[slot * segs..][..segs].iter().enumerate() {
                    for k in 0..SECTORS_PER_PAGE {
                        let here = sector + (i * SECTORS_PER_PAGE + k) as u64;
                        // A read's pages are poisoned first: a backend that writes nothing
                        // cannot pass with what an earlier read left there.
                        let bytes = if spec.write { stamp(here) } else { [0; 16] };
                        pages.write(page, k * SECTOR, &bytes);
                    }
                }
            }
            let mut raw = templates[slot];
            raw[request::SECTOR..request::SECTOR + 8].copy_from_slice(&sector.to_le_bytes());
            ring.put_request(&raw);
            slots[q].issued[s] = at;
            slots[q].sector[s] = sector;
            true
        };

    // --rate: when the next request may go (ns since the start).
    let interval = 1_000_000_000u64.checked_div(spec.rate).unwrap_or(0);
    let mut next_send = 0u64;
    if spec.once {
        measuring = true;
        cpu_start = kick.cpu_seconds();
        if let Some(cue) = &spec.cue {
            kick.cue(&format!("rig-guest: begin {cue}"));
        }
    }

    loop {
        let now = now_ns();
        if !measuring && now >= ramp_end {
            measuring = true;
            window_start = now;
            cpu_start = kick.cpu_seconds();
            if let Some(cue) = &spec.cue {
                kick.cue(&format!("rig-guest: begin {cue}"));
            }
        }
        let enough = spec.max_ios.is_some_and(|n| out.sent >= n);
        if spec.idle && measuring && now >= end && window_end == 0 {
            window_end = now;
            out.cpu_s = kick.cpu_seconds() - cpu_start;
            break;
        }
        if submitting && ((!spec.once && now >= end) || enough) {
            submitting = false;
            window_end = now;
            out.cpu_s = kick.cpu_seconds() - cpu_start;
        }
        if spec.idle {
            // Nothing to poll for: sleep, and leave the host's core to the backend.
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        if !submitting && in_flight == 0 {
            break;
        }
        if !submitting && now.saturating_sub(window_end) > drain_ns {
            out.unanswered = in_flight as u64;
            out.problem(format!(
                "{in_flight} requests unanswered {} s after the last was sent",
                spec.drain_s
            ));
            break;
        }
        let mut reaped = 0;
        for (q, ring) in rings.iter_mut().enumerate() {
            let mut done = std::mem::take(&mut slots[q].done);
            done.clear();
            if ring.take_responses(|rsp| done.push((rsp.id, rsp.status))) == 0 {
                slots[q].done = done;
                continue;
            }
            let seen = now_ns();
            for &(id, status) in &done {
                let s = id as usize;
                if id >= qd as u64 || slots[q].issued[s] == u64::MAX {
                    out.bad_responses += 1;
                    out.problem(format!("queue {q}: a response for id {id}, not in flight"));
                    continue;
                }
                let issued = std::mem::replace(&mut slots[q].issued[s], u64::MAX);
                in_flight -= 1;
                if measuring && (submitting || bounded) {
                    out.ios += 1;
                    hist.record(seen - issued);
                }
                if status != RSP_OKAY {
                    out.errors += 1;
                    out.problem(format!(
                        "queue {q}: status {status} for sector {}",
                        slots[q].sector[s]
                    ));
                } else if spec.verify && !spec.write {
                    let first = slots[q].sector[s];
                    let slot = q * qd + s;
                    for (i, &page) in pages.data[slot * segs..][..segs].iter().enumerate() {
                        for k in 0..SECTORS_PER_PAGE {
                            let here = first + (i * SECTORS_PER_PAGE + k) as u64;
                            pages.read(page, k * SECTOR, &mut stamp_buf);
                            if stamp_buf != stamp(here) {
                                out.verify_errors += 1;
                                out.problem(format!(
                                    "sector {here}: read {:02x?}, not its stamp",
                                    &stamp_buf
                                ));
                            }
                        }
                    }
                }
                slots[q].free.push(s);
            }
            reaped += done.len();
            slots[q].done = done;
        }
        // Every free slot goes out again at once, or (--rate) when its turn comes.
        let pass_start = now;
        let now = now_ns();
        for (q, ring) in rings.iter_mut().enumerate() {
            let mut pushed = 0;
            while submitting && !slots[q].free.is_empty() {
                if spec.max_ios.is_some_and(|n| out.sent >= n) {
                    break;
                }
                if interval > 0 {
                    if now < next_send {
                        break;
                    }
                    // Behind (a slow pass): no burst to catch up.
                    next_send = next_send.max(now - now % interval) + interval;
                }
                let s = slots[q].free.pop().unwrap_or_default();
                if submit(q, s, &mut slots, ring, now) {
                    in_flight += 1;
                    out.sent += 1;
                    pushed += 1;
                } else {
                    // --once: the range is done; what is in flight drains.
                    slots[q].free.push(s);
                    submitting = false;
                    window_end = now;
                }
            }
            if pushed > 0 {
                if measuring {
                    out.pushed += pushed;
                }
                if ring.push_requests() {
                    kick.notify(q);
                    if measuring {
                        out.notifies += 1;
                    }
                }
            }
        }
        if reaped == 0 {
            kick.idle();
        } else if measuring && submitting {
            // The passes that found work: what a request costs the generator, without
            // the empty polls between (a polling loop's CPU is all of its window).
            out.busy_ns += now_ns() - pass_start;
        }
    }
    if bounded {
        window_end = now_ns();
        out.cpu_s = kick.cpu_seconds() - cpu_start;
    }
    out.window_s = window_end.saturating_sub(window_start) as f64 / 1e9;
    out.p50_ns = hist.quantile(0.5);
    out.p99_ns = hist.quantile(0.99);
    out.p999_ns = hist.quantile(0.999);
    out.mean_ns = hist.mean();
    out.max_ns = hist.max;
    if !spec.idle && out.ios == 0 {
        out.problem("no request completed inside the measured window".into());
    }
    if let Some(cue) = &spec.cue {
        kick.cue(&format!(
            "rig-guest: end {cue} rc={}",
            if out.ok(spec.idle) { 0 } else { 1 }
        ));
    }
    out
}

/// What the JSON line says about the connection besides the spec and outcome.
pub struct Connection<'a> {
    pub vbd: &'a str,
    pub backend: &'a str,
    pub backend_id: u16,
    pub ring_order: u32,
    pub disk_sectors: u64,
    pub backend_persistent: bool,
}

fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The run as one JSON line.
pub fn json(spec: &Spec, conn: &Connection, out: &Outcome) -> String {
    let per_io = |x: f64| if out.ios > 0 { x / out.ios as f64 } else { 0.0 };
    let iops = if out.window_s > 0.0 {
        out.ios as f64 / out.window_s
    } else {
        0.0
    };
    let us = |ns: u64| ns as f64 / 1e3;
    format!(
        concat!(
            "{{\"tool\":\"hostile-load\",\"vbd\":{},\"backend\":{},\"backend_id\":{},",
            "\"rw\":\"{}\",\"bs\":{},\"qd\":{},\"queues\":{},\"ring_order\":{},",
            "\"indirect\":{},\"persistent\":{},\"backend_persistent\":{},\"verify\":{},",
            "\"once\":{},\"disk_sectors\":{},\"seconds\":{:.3},\"ios\":{},\"iops\":{:.1},",
            "\"mib_s\":{:.2},\"lat_us\":{{\"p50\":{:.1},\"p99\":{:.1},\"p99.9\":{:.1},",
            "\"mean\":{:.1},\"max\":{:.1}}},\"cpu_s\":{:.3},\"cpu_us_per_io\":{:.2},",
            "\"busy_us_per_io\":{:.2},",
            "\"notifies\":{},\"notifies_per_io\":{:.4},\"sent\":{},\"errors\":{},",
            "\"verify_errors\":{},\"bad_responses\":{},\"unanswered\":{},\"idle\":{},\"ok\":{},",
            "\"problem\":{}}}"
        ),
        quote(conn.vbd),
        quote(conn.backend),
        conn.backend_id,
        spec.rw(),
        spec.bs,
        spec.qd,
        spec.queues,
        conn.ring_order,
        spec.indirect(),
        spec.persistent,
        conn.backend_persistent,
        spec.verify,
        spec.once,
        conn.disk_sectors,
        out.window_s,
        out.ios,
        iops,
        iops * spec.bs as f64 / f64::from(1 << 20),
        us(out.p50_ns),
        us(out.p99_ns),
        us(out.p999_ns),
        us(out.mean_ns),
        us(out.max_ns),
        out.cpu_s,
        per_io(out.cpu_s * 1e6),
        per_io(out.busy_ns as f64 / 1e3),
        out.notifies,
        if out.pushed > 0 {
            out.notifies as f64 / out.pushed as f64
        } else {
            0.0
        },
        out.sent,
        out.errors,
        out.verify_errors,
        out.bad_responses,
        out.unanswered,
        spec.idle,
        out.ok(spec.idle),
        out.first_problem.as_deref().map_or("null".into(), quote),
    )
}

#[cfg(test)]
mod tests {
    //! The loop against blkback's real engine over fake guest memory and a RAM disk, and
    //! against a backend that answers with ids nobody sent.

    use super::*;
    use blkback::abi::sring;
    use blkback::engine::{Engine, EngineConfig};
    use blkback::fake::{CountingEvents, GrantTable, GuestMemory, RingView, XenGrants};
    use blkdev::{RamDisk, RamDiskQueue};

    const SECTORS: u64 = 8192; // 4 MiB

    struct EngineKick {
        engine: Engine<RingView, XenGrants, RamDiskQueue, CountingEvents>,
        notified: u64,
    }

    impl Kick for EngineKick {
        fn notify(&mut self, _queue: usize) {
            self.notified += 1;
            self.engine.event_received();
        }
        fn idle(&mut self) {
            self.engine.poll(64);
        }
        fn cpu_seconds(&mut self) -> f64 {
            0.0
        }
        fn cue(&mut self, _line: &str) {}
    }

    /// A ring (page 0), the run's pages granted from page 1 on (as one chunk), the
    /// engine over `disk`.
    fn rig(spec: &Spec, disk: &RamDisk) -> (FrontRing, DataPages<RingView>, EngineKick) {
        let (data, indirect) = spec.pages();
        let memory = GuestMemory::new(1 + data + indirect);
        let table = GrantTable::new(memory.clone());
        let pages: Vec<PageAt> = (0..data + indirect)
            .map(|i| {
                let gref = 100 + i as u32;
                table.grant(gref, 1 + i, false);
                PageAt {
                    gref,
                    chunk: 0,
                    offset: i * PAGE_SIZE,
                }
            })
            .collect();
        let chunk = RingView::new(memory.clone(), (1..=data + indirect).collect());
        let view = RingView::new(memory.clone(), vec![0]);
        let engine = Engine::new(
            view.clone(),
            XenGrants(table),
            disk.queue(64),
            CountingEvents::default(),
            EngineConfig::new(0, spec.persistent),
        )
        .unwrap();
        let pages = DataPages {
            chunks: vec![chunk],
            data: pages[..data].to_vec(),
            indirect: pages[data..].to_vec(),
        };
        let kick = EngineKick {
            engine,
            notified: 0,
        };
        (FrontRing::new(view, 0), pages, kick)
    }

    fn run(spec: &Spec, disk: &RamDisk) -> (Outcome, u64) {
        let (mut ring, pages, mut kick) = rig(spec, disk);
        let out = drive(spec, &mut [&mut ring], &pages, SECTORS, &mut kick);
        (out, kick.notified)
    }

    fn fill(disk: &RamDisk, bs: usize) -> Outcome {
        let spec = Spec {
            write: true,
            once: true,
            bs,
            qd: 4,
            verify: true,
            ..Spec::default()
        };
        let (out, _) = run(&parse_args_ok(&spec), disk);
        out
    }

    /// `spec` through the same normalisation `parse_args` applies.
    fn parse_args_ok(spec: &Spec) -> Spec {
        let mut spec = spec.clone();
        if spec.once {
            spec.random = false;
            spec.ramp = 0.0;
        }
        spec
    }

    #[test]
    fn a_stamped_disk_reads_back_verified_direct_and_indirect() {
        for bs in [4096, 64 << 10, 1 << 20] {
            let disk = RamDisk::new(SECTORS);
            let filled = fill(&disk, bs);
            assert!(filled.ok(false), "{bs}: {filled:?}");
            assert_eq!(filled.ios, SECTORS * 512 / bs as u64, "{bs}: one pass");
            let spec = Spec {
                bs,
                qd: 8,
                verify: true,
                ramp: 0.0,
                max_ios: Some(200),
                seconds: 3600.0,
                ..Spec::default()
            };
            let (out, _) = run(&spec, &disk);
            assert!(out.ok(false), "{bs}: {out:?}");
            assert_eq!(out.verify_errors, 0);
            assert_eq!((out.ios, out.sent), (200, 200), "{bs}: {out:?}");
            assert!(out.busy_ns > 0, "{bs}: {out:?}");
            assert!(out.p50_ns > 0 && out.p50_ns <= out.p99_ns && out.p99_ns <= out.p999_ns);
        }
    }

    #[test]
    fn verify_catches_a_disk_that_was_never_written() {
        let disk = RamDisk::new(SECTORS);
        let spec = Spec {
            verify: true,
            ramp: 0.0,
            max_ios: Some(50),
            seconds: 3600.0,
            ..Spec::default()
        };
        let (out, _) = run(&spec, &disk);
        assert!(!out.ok(false));
        assert_eq!(
            out.verify_errors,
            out.sent * 8,
            "every sector of every read"
        );
        assert!(out.first_problem.unwrap().contains("not its stamp"));
    }

    #[test]
    fn verify_catches_data_from_the_wrong_sector() {
        // Stamped with sectors shifted by one block: each block holds its neighbour's.
        let disk = RamDisk::new(SECTORS);
        assert!(fill(&disk, 4096).ok(false));
        let spec = Spec {
            write: true,
            random: false,
            verify: true,
            ramp: 0.0,
            qd: 1,
            max_ios: Some(1),
            seconds: 3600.0,
            ..Spec::default()
        };
        let (mut ring, pages, mut kick) = rig(&spec, &disk);
        // Sector 0's block, stamped as block 1: write pages stamp sectors 8.. instead.
        let first = drive(&spec, &mut [&mut ring], &pages, SECTORS, &mut kick);
        assert!(first.ok(false));
        let page = pages.data[0];
        for k in 0..SECTORS_PER_PAGE {
            pages.write(page, k * SECTOR, &stamp(8 + k as u64));
        }
        let raw = encode_direct(
            abi::OP_WRITE,
            0,
            0,
            &[SegmentDesc {
                gref: page.gref,
                first_sect: 0,
                last_sect: 7,
            }],
        );
        ring.put_request(&raw);
        ring.push_requests();
        kick.notify(0);
        while ring.take_responses(|_| {}) == 0 {
            kick.idle();
        }
        let read = Spec {
            random: false,
            verify: true,
            ramp: 0.0,
            qd: 1,
            max_ios: Some(2),
            seconds: 3600.0,
            ..Spec::default()
        };
        let (out, _) = run(&read, &disk);
        assert_eq!(
            out.verify_errors, 8,
            "block 0 holds block 1's stamps: {out:?}"
        );
    }

    #[test]
    fn notifies_only_when_the_backend_asks() {
        let disk = RamDisk::new(SECTORS);
        let spec = Spec {
            qd: 32,
            ramp: 0.0,
            max_ios: Some(3000),
            seconds: 3600.0,
            ..Spec::default()
        };
        let (out, notified) = run(&spec, &disk);
        assert!(out.ok(false), "{out:?}");
        // The engine asks again only once it has drained the ring and set req_event.
        assert!(out.notifies <= out.pushed, "{out:?}");
        assert!(
            notified >= 1 && notified < out.sent / 2,
            "{notified} of {}",
            out.sent
        );
    }

    #[test]
    fn a_rate_spaces_the_requests_out() {
        let disk = RamDisk::new(SECTORS);
        let spec = Spec {
            qd: 32,
            queues: 1,
            ramp: 0.0,
            rate: 400,
            max_ios: Some(200),
            seconds: 3600.0,
            ..Spec::default()
        };
        let (out, _) = run(&spec, &disk);
        assert!(out.ok(false), "{out:?}");
        // 200 requests 2.5 ms apart: half a second, whatever the depth allows.
        assert!(out.window_s >= 0.495, "{out:?}");
        let (fast, _) = run(&Spec { rate: 0, ..spec }, &disk);
        assert!(fast.window_s < out.window_s / 2.0, "{fast:?}");
    }

    #[test]
    fn idle_sends_nothing_for_the_window() {
        let disk = RamDisk::new(SECTORS);
        let spec = Spec {
            idle: true,
            ramp: 0.0,
            seconds: 0.2,
            ..Spec::default()
        };
        let (mut ring, pages, mut kick) = rig(&spec, &disk);
        let out = drive(&spec, &mut [&mut ring], &pages, SECTORS, &mut kick);
        assert!(out.ok(true), "{out:?}");
        assert_eq!((out.sent, out.ios, ring.req_prod_pvt()), (0, 0, 0));
        assert!(out.window_s >= 0.2, "{out:?}");
        assert!(!out.ok(false), "an idle run is no load run");
    }

    #[test]
    fn two_queues_and_order_two_rings_carry_their_depth() {
        let spec = Spec {
            qd: 128,
            queues: 2,
            ..Spec::default()
        };
        assert_eq!(spec.ring_order(), 2);
        assert_eq!(spec.pages(), (256, 0));
        let wide = Spec {
            bs: 1 << 20,
            qd: 4,
            ..Spec::default()
        };
        assert_eq!(wide.pages(), (1024, 4));
        assert!(wide.indirect());
    }

    /// A backend that answers every request with the id `lie(id)` after taking it.
    struct LyingBackend {
        view: RingView,
        lie: fn(u64) -> u64,
        req_cons: u32,
        rsp_prod: u32,
        notified: u64,
    }

    impl Kick for LyingBackend {
        fn notify(&mut self, _queue: usize) {
            self.notified += 1;
        }
        fn idle(&mut self) {
            let req_prod = self.view.load_u32(sring::REQ_PROD);
            while self.req_cons != req_prod {
                let at = sring::HEADER_SIZE + (self.req_cons % 32) as usize * REQUEST_SIZE;
                let mut id = [0u8; 8];
                self.view.read_bytes(at + request::ID, &mut id);
                let mut rsp = [0u8; abi::RESPONSE_SIZE];
                rsp[..8].copy_from_slice(&(self.lie)(u64::from_le_bytes(id)).to_le_bytes());
                self.view.write_bytes(at, &rsp);
                self.req_cons += 1;
                self.rsp_prod += 1;
            }
            self.view.store_u32(sring::RSP_PROD, self.rsp_prod);
        }
        fn cpu_seconds(&mut self) -> f64 {
            0.0
        }
        fn cue(&mut self, _line: &str) {}
    }

    fn lying(lie: fn(u64) -> u64) -> (Outcome, u64) {
        let spec = Spec {
            qd: 4,
            ramp: 0.0,
            max_ios: Some(40),
            // The lies leave requests in flight forever: time ends the run.
            seconds: 1.0,
            drain_s: 0.5,
            ..Spec::default()
        };
        let disk = RamDisk::new(SECTORS);
        let (mut ring, pages, _) = rig(&spec, &disk);
        let mut kick = LyingBackend {
            view: ring.view().clone(),
            lie,
            req_cons: 0,
            rsp_prod: 0,
            notified: 0,
        };
        let out = drive(&spec, &mut [&mut ring], &pages, SECTORS, &mut kick);
        (out, kick.notified)
    }

    #[test]
    fn a_read_answered_without_data_fails_verify_even_over_the_right_stamps() {
        // The slot's page already holds sector 0's stamps (as a read of it would leave
        // them); the backend answers OKAY and writes nothing.
        let spec = Spec {
            random: false,
            verify: true,
            qd: 1,
            ramp: 0.0,
            range_bytes: Some(4096),
            max_ios: Some(3),
            seconds: 3600.0,
            ..Spec::default()
        };
        let disk = RamDisk::new(SECTORS);
        let (mut ring, pages, _) = rig(&spec, &disk);
        for k in 0..SECTORS_PER_PAGE {
            pages.write(pages.data[0], k * SECTOR, &stamp(k as u64));
        }
        let mut kick = LyingBackend {
            view: ring.view().clone(),
            lie: |id| id,
            req_cons: 0,
            rsp_prod: 0,
            notified: 0,
        };
        let out = drive(&spec, &mut [&mut ring], &pages, SECTORS, &mut kick);
        assert_eq!(out.verify_errors, 3 * 8, "{out:?}");
    }

    #[test]
    fn responses_for_requests_not_in_flight_are_counted_not_trusted() {
        let (honest, notified) = lying(|id| id);
        assert!(honest.ok(false), "{honest:?}");
        // This backend never moves req_event past SHARED_RING_INIT's 1: it asked for one
        // event, for the first request, and got exactly that.
        assert_eq!(notified, 1, "{honest:?}");
        let (out, _) = lying(|_| 9); // beyond the depth
        assert!(!out.ok(false));
        assert_eq!(out.bad_responses, 4);
        assert_eq!(out.unanswered, 4, "the real requests never came back");
        let (twice, _) = lying(|_| 0); // the same slot answered again and again
        assert!(twice.bad_responses >= 3, "{twice:?}");
    }

    #[test]
    fn histogram_quantiles_within_its_resolution() {
        let mut h = Histogram::new();
        for ns in 1..=100_000u64 {
            h.record(ns * 10);
        }
        for (q, want) in [(0.5, 500_000.0), (0.99, 990_000.0), (0.999, 999_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.035, "{q}: {got} vs {want}");
        }
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(Histogram::new().quantile(0.5), 0);
        for ns in [0, 1, 31, 32, 33, 1000, 1 << 40, u64::MAX] {
            let i = Histogram::index(ns);
            assert!(i < Histogram::BUCKETS, "{ns}");
            let mid = Histogram::value(i) as f64;
            assert!(
                ns < 32 || (mid - ns as f64).abs() / ns as f64 <= 1.0 / 32.0,
                "{ns} {mid}"
            );
        }
    }

    #[test]
    fn arguments() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let (vbd, spec) = parse_args(&args(
            "--vbd xvdb --rw write --bs 1m --qd 4 --once --verify",
        ))
        .unwrap();
        assert_eq!(vbd, "xvdb");
        assert!(spec.write && spec.once && spec.verify && !spec.random);
        assert_eq!((spec.bs, spec.qd, spec.ramp), (1 << 20, 4, 0.0));
        for bad in [
            "--vbd xvda --bs 6k",
            "--vbd xvda --bs 4m",
            "--vbd xvda --qd 0",
            "--vbd xvda --qd 513",
            "--vbd xvda --queues 0",
            "--vbd xvda --rw trim",
            "--vbd xvda --time -1",
            "--bs 4k",
            "--vbd xvda --frobnicate",
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad}");
        }
    }
}
