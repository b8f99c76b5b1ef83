// SPDX-License-Identifier: MIT OR Apache-2.0
//! The attacks on one connected ring, over any ring memory and any backend: in the guest
//! the pages are shared with blkdom through gntalloc, in the tests below they are
//! blkback's fake guest memory served by the real engine. Each attack says what it saw
//! and whether that is what a correct backend does.

use std::sync::atomic::{AtomicBool, Ordering};

use blkback::abi::{self, REQUEST_SIZE, RSP_OKAY, SEGMENT_SIZE};
use blkback::fake::wire::{encode_direct, encode_discard, encode_indirect, encode_segment};
use blkback::fake::FrontRing;
use blkback::parse::{RequestError, SegmentDesc};
use blkback::ring::{Response, RingMemory};

/// The backend as the attacks see it.
pub trait Peer {
    /// Tell the backend that requests wait (the event channel).
    fn notify(&mut self);
    /// Give the backend a moment (a short sleep in the guest, an engine poll on the host).
    fn pause(&mut self);
}

/// Pauses before a request counts as unanswered (about 10 s in the guest).
pub const ANSWER_PAUSES: u32 = 5000;
/// Pauses of silence after which a ring counts as halted (about 2 s in the guest).
pub const SILENCE_PAUSES: u32 = 1000;

/// A granted page, and what the attacks write into it through.
pub struct Page<M> {
    pub gref: u32,
    pub mem: M,
}

/// The pages and grant references the attacks use; granted to the backend unless said.
pub struct Pages<M> {
    /// Data pages, read-write.
    pub data: [Page<M>; 2],
    /// A page the backend may only read.
    pub read_only: Page<M>,
    /// A page for indirect descriptors.
    pub indirect: Page<M>,
    /// Granted to another domain.
    pub foreign: u32,
    /// Granted to nobody.
    pub ungranted: u32,
}

/// The grant references of [`Pages`], which the request cases are made of.
#[derive(Clone, Copy, Debug)]
pub struct Refs {
    pub data: [u32; 2],
    pub read_only: u32,
    pub indirect: u32,
    pub foreign: u32,
    pub ungranted: u32,
}

impl<M> Pages<M> {
    pub fn refs(&self) -> Refs {
        Refs {
            data: [self.data[0].gref, self.data[1].gref],
            read_only: self.read_only.gref,
            indirect: self.indirect.gref,
            foreign: self.foreign,
            ungranted: self.ungranted,
        }
    }
}

/// Why a correct backend refuses a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request checks refuse it with this error (the slot alone, or with the device).
    Checked(RequestError),
    /// Its indirect descriptors are bad: refused with this error once copied out.
    BadDescriptors(RequestError),
    /// Its indirect page does not map (refused before it takes any data grant).
    IndirectGrant,
    /// A data grant does not map: the request fails (an error response, not a refusal).
    DataGrant,
}

impl Refusal {
    /// The response status a correct backend sends.
    pub fn status(self) -> i16 {
        match self {
            Refusal::Checked(error) | Refusal::BadDescriptors(error) => error.status(),
            Refusal::IndirectGrant | Refusal::DataGrant => abi::RSP_ERROR,
        }
    }

    /// Counted as a refused request (blkback's `bad-requests`), not only as an error.
    pub fn counted_as_refused(self) -> bool {
        self != Refusal::DataGrant
    }
}

/// One malformed request and how a correct backend answers it.
pub struct Case {
    pub name: &'static str,
    pub raw: [u8; REQUEST_SIZE],
    /// Descriptors to put in the indirect page first (indirect cases).
    pub descriptors: Vec<SegmentDesc>,
    pub refusal: Refusal,
}

/// What the frontend knows of the disk.
#[derive(Clone, Copy, Debug)]
pub struct Disk {
    pub sectors: u64,
}

/// Ids of the cases (0x4000 + their index): answers are matched by id.
const CASE_IDS: u64 = 0x4000;

/// A segment covering the whole page `gref`.
pub fn whole(gref: u32) -> SegmentDesc {
    SegmentDesc {
        gref,
        first_sect: 0,
        last_sect: 7,
    }
}

fn sectors(gref: u32, first_sect: u8, last_sect: u8) -> SegmentDesc {
    SegmentDesc {
        gref,
        first_sect,
        last_sect,
    }
}

/// The malformed and oversized requests for a writable disk.
pub fn cases(refs: Refs, disk: Disk) -> Vec<Case> {
    use Refusal::Checked;
    use RequestError::*;
    let data = whole(refs.data[0]);
    let end = disk.sectors;
    let case = |name, raw, refusal| Case {
        name,
        raw,
        descriptors: Vec::new(),
        refusal,
    };
    let mut cases = vec![
        case(
            "operation-4",
            encode_direct(4, 0, 0, &[data]),
            Checked(UnsupportedOperation),
        ),
        case(
            "operation-255",
            encode_direct(0xFF, 0, 0, &[data]),
            Checked(UnsupportedOperation),
        ),
        case(
            "read-0-segments",
            encode_direct(abi::OP_READ, 0, 0, &[]),
            Checked(BadSegmentCount(0)),
        ),
        case(
            "write-12-segments",
            encode_direct(abi::OP_WRITE, 0, 0, &[data; 12]),
            Checked(BadSegmentCount(12)),
        ),
        case(
            "read-255-segments",
            encode_direct(abi::OP_READ, 0, 0, &[data; 255]),
            Checked(BadSegmentCount(255)),
        ),
        case(
            "indirect-0-segments",
            encode_indirect(abi::OP_READ, 0, 0, 0, &[refs.indirect]),
            Checked(BadSegmentCount(0)),
        ),
        case(
            "indirect-513-segments",
            encode_indirect(abi::OP_READ, 0, 0, 513, &[refs.indirect; 2]),
            Checked(BadSegmentCount(513)),
        ),
        case(
            "indirect-4097-segments",
            encode_indirect(abi::OP_WRITE, 0, 0, 4097, &[refs.indirect; 8]),
            Checked(BadSegmentCount(4097)),
        ),
        case(
            "indirect-65535-segments",
            encode_indirect(abi::OP_READ, 0, 0, u16::MAX, &[refs.indirect; 8]),
            Checked(BadSegmentCount(u16::MAX)),
        ),
        case(
            "indirect-of-a-discard",
            encode_indirect(abi::OP_DISCARD, 0, 0, 1, &[refs.indirect]),
            Checked(BadIndirectOperation),
        ),
        case(
            "first-sect-after-last-sect",
            encode_direct(abi::OP_READ, 0, 0, &[data, sectors(refs.data[1], 5, 2)]),
            Checked(BadSegment {
                first_sect: 5,
                last_sect: 2,
            }),
        ),
        case(
            "last-sect-8",
            encode_direct(abi::OP_WRITE, 0, 0, &[sectors(refs.data[0], 0, 8)]),
            Checked(BadSegment {
                first_sect: 0,
                last_sect: 8,
            }),
        ),
        case(
            "last-sect-255",
            encode_direct(abi::OP_READ, 0, 0, &[sectors(refs.data[0], 255, 255)]),
            Checked(BadSegment {
                first_sect: 255,
                last_sect: 255,
            }),
        ),
        case(
            "read-past-the-end",
            encode_direct(abi::OP_READ, 0, end - 4, &[data]),
            Checked(OutOfRange),
        ),
        case(
            "write-one-sector-past-the-end",
            encode_direct(abi::OP_WRITE, 0, end, &[sectors(refs.data[0], 0, 0)]),
            Checked(OutOfRange),
        ),
        case(
            "sector-overflow",
            encode_direct(abi::OP_READ, 0, u64::MAX - 3, &[data]),
            Checked(SectorOverflow),
        ),
        case(
            "discard-past-the-end",
            encode_discard(0, end - 8, 16, false),
            Checked(OutOfRange),
        ),
        case(
            "discard-overflow",
            encode_discard(0, 8, u64::MAX, false),
            Checked(SectorOverflow),
        ),
        case(
            "ungranted-gref",
            encode_direct(abi::OP_READ, 0, 0, &[whole(refs.ungranted)]),
            Refusal::DataGrant,
        ),
        case(
            "foreign-gref",
            encode_direct(abi::OP_READ, 0, 0, &[whole(refs.foreign)]),
            Refusal::DataGrant,
        ),
        case(
            "read-into-a-read-only-grant",
            encode_direct(abi::OP_READ, 0, 0, &[whole(refs.read_only)]),
            Refusal::DataGrant,
        ),
        case(
            "ungranted-among-granted",
            encode_direct(
                abi::OP_WRITE,
                0,
                0,
                &[data, whole(refs.ungranted), whole(refs.data[1])],
            ),
            Refusal::DataGrant,
        ),
        case(
            "indirect-page-ungranted",
            encode_indirect(abi::OP_READ, 0, 0, 8, &[refs.ungranted]),
            Refusal::IndirectGrant,
        ),
    ];
    // Descriptors fine but for one: the refusal comes from the copy of the page.
    let mut bad = vec![data; 16];
    bad[9] = sectors(refs.data[1], 0, 9);
    cases.push(Case {
        name: "indirect-descriptor-last-sect-9",
        raw: encode_indirect(abi::OP_READ, 0, 0, 16, &[refs.indirect]),
        descriptors: bad,
        refusal: Refusal::BadDescriptors(BadSegment {
            first_sect: 0,
            last_sect: 9,
        }),
    });
    number(cases)
}

/// The requests a read-only disk refuses.
pub fn read_only_cases(refs: Refs) -> Vec<Case> {
    let data = whole(refs.data[0]);
    let case = |name, raw| Case {
        name,
        raw,
        descriptors: Vec::new(),
        refusal: Refusal::Checked(RequestError::ReadOnly),
    };
    number(vec![
        case(
            "write-to-a-read-only-disk",
            encode_direct(abi::OP_WRITE, 0, 0, &[data]),
        ),
        case(
            "flush-with-data-to-a-read-only-disk",
            encode_direct(abi::OP_FLUSH_DISKCACHE, 0, 0, &[data]),
        ),
        case(
            "discard-on-a-read-only-disk",
            encode_discard(0, 0, 8, false),
        ),
    ])
}

/// Gives each case its id (the same offset in every request type).
fn number(mut cases: Vec<Case>) -> Vec<Case> {
    for (i, case) in cases.iter_mut().enumerate() {
        let id = CASE_IDS + i as u64;
        case.raw[abi::request::ID..abi::request::ID + 8].copy_from_slice(&id.to_le_bytes());
    }
    cases
}

fn id_of(raw: &[u8; REQUEST_SIZE]) -> u64 {
    let mut id = [0; 8];
    id.copy_from_slice(&raw[abi::request::ID..abi::request::ID + 8]);
    u64::from_le_bytes(id)
}

/// What one attack saw.
#[derive(Debug)]
pub struct Outcome {
    pub attack: String,
    pub passed: bool,
    pub saw: String,
}

/// Outcomes so far, and what a correct backend counted for them (`blkdom-stats`).
#[derive(Debug, Default)]
pub struct Tally {
    pub outcomes: Vec<Outcome>,
    pub refused_requests: u64,
    pub error_responses: u64,
    pub halted_rings: u64,
    pub refused_connections: u64,
}

impl Tally {
    pub fn record(&mut self, attack: impl Into<String>, passed: bool, saw: impl Into<String>) {
        let outcome = Outcome {
            attack: attack.into(),
            passed,
            saw: saw.into(),
        };
        println!(
            "rig-hostile: {} {}: {}",
            if passed { "PASS" } else { "FAIL" },
            outcome.attack,
            outcome.saw
        );
        self.outcomes.push(outcome);
    }

    pub fn failed(&self) -> usize {
        self.outcomes.iter().filter(|o| !o.passed).count()
    }
}

/// Takes responses until `want` came, or `pauses` passed.
fn collect<M: RingMemory>(
    front: &mut FrontRing<M>,
    peer: &mut impl Peer,
    want: usize,
    pauses: u32,
) -> Vec<Response> {
    let mut got = Vec::new();
    for _ in 0..pauses {
        front.take_responses(|r| got.push(r));
        if got.len() >= want {
            break;
        }
        peer.pause();
    }
    got
}

/// Publishes `requests`, notifies, and waits for as many responses (none if the ring
/// has no room: a backend that answered more than it was sent leaves it inconsistent).
pub fn exchange<M: RingMemory>(
    front: &mut FrontRing<M>,
    peer: &mut impl Peer,
    requests: &[[u8; REQUEST_SIZE]],
) -> Vec<Response> {
    if (front.free_slots() as usize) < requests.len() {
        return Vec::new();
    }
    for raw in requests {
        front.put_request(raw);
    }
    front.push_requests();
    peer.notify();
    collect(front, peer, requests.len(), ANSWER_PAUSES)
}

fn describe(responses: &[Response]) -> String {
    match responses {
        [] => "no response".into(),
        [r] => format!("status {} (id {:#x}, op {})", r.status, r.id, r.operation),
        _ => format!("{} responses", responses.len()),
    }
}

/// Writes descriptors into a page as the frontend lays them out.
pub fn put_descriptors<M: RingMemory>(page: &M, descriptors: &[SegmentDesc]) {
    let bytes: Vec<u8> = descriptors.iter().flat_map(encode_segment).collect();
    page.write_bytes(0, &bytes);
}

/// A write of a pattern and a read of it back into the other page (on a read-only disk,
/// the read alone): the connection works.
pub fn baseline<M: RingMemory>(
    front: &mut FrontRing<M>,
    peer: &mut impl Peer,
    pages: &Pages<M>,
    sector: u64,
    writable: bool,
    tally: &mut Tally,
) -> bool {
    let pattern: Vec<u8> = (0..abi::PAGE_SIZE)
        .map(|i| (i as u64 ^ sector) as u8)
        .collect();
    pages.data[0].mem.write_bytes(0, &pattern);
    pages.data[1].mem.write_bytes(0, &[0; abi::PAGE_SIZE]);
    let write = encode_direct(abi::OP_WRITE, 1, sector, &[whole(pages.data[0].gref)]);
    let read = encode_direct(abi::OP_READ, 2, sector, &[whole(pages.data[1].gref)]);
    let okay = |r: &[Response]| r.len() == 1 && r[0].status == RSP_OKAY;
    if !writable {
        let read_back = exchange(front, peer, &[read]);
        let passed = okay(&read_back);
        tally.record(
            "baseline-read-only",
            passed,
            format!("a read at sector {sector}: {}", describe(&read_back)),
        );
        return passed;
    }
    let written = exchange(front, peer, &[write]);
    let read_back = exchange(front, peer, &[read]);
    let mut back = vec![0; abi::PAGE_SIZE];
    pages.data[1].mem.read_bytes(0, &mut back);
    let passed = okay(&written) && okay(&read_back) && back == pattern;
    let saw = if passed {
        format!("a write at sector {sector} and its read back answered OKAY, data intact")
    } else {
        format!(
            "write: {}, read: {}, data {}",
            describe(&written),
            describe(&read_back),
            if back == pattern { "intact" } else { "differs" }
        )
    };
    tally.record("baseline", passed, saw);
    passed
}

/// Each case alone: exactly one response, with its id and the status it deserves.
pub fn run_cases<M: RingMemory>(
    front: &mut FrontRing<M>,
    peer: &mut impl Peer,
    pages: &Pages<M>,
    cases: &[Case],
    tally: &mut Tally,
) {
    for case in cases {
        if !case.descriptors.is_empty() {
            put_descriptors(&pages.indirect.mem, &case.descriptors);
        }
        let id = id_of(&case.raw);
        let responses = exchange(front, peer, &[case.raw]);
        let status = case.refusal.status();
        let passed = matches!(responses.as_slice(), [r] if r.id == id && r.status == status);
        if let [r] = responses.as_slice() {
            if r.status != RSP_OKAY {
                tally.error_responses += 1;
                tally.refused_requests += u64::from(case.refusal.counted_as_refused());
            }
        }
        tally.record(
            case.name,
            passed,
            format!(
                "{} (expected status {status}: {:?})",
                describe(&responses),
                case.refusal
            ),
        );
    }
}

/// The same id on many requests in flight at once: each is answered, with that id.
pub fn reused_ids<M: RingMemory>(
    front: &mut FrontRing<M>,
    peer: &mut impl Peer,
    pages: &Pages<M>,
    tally: &mut Tally,
) {
    const COUNT: usize = 16;
    let read = encode_direct(abi::OP_READ, 0x1D, 16, &[whole(pages.data[1].gref)]);
    let responses = exchange(front, peer, &[read; COUNT]);
    let good = responses
        .iter()
        .filter(|r| r.id == 0x1D && r.status == RSP_OKAY)
        .count();
    tally.record(
        "ids-reused-in-flight",
        responses.len() == COUNT && good == COUNT,
        format!(
            "{} responses to {COUNT} reads with id 0x1d, {good} OKAY",
            responses.len()
        ),
    );
}

/// A second thread rewrites the indirect page between good and bad descriptors while
/// `rounds` indirect reads go through: every one is answered (OKAY or refused).
pub fn flipped_indirect_page<M: RingMemory + Sync>(
    front: &mut FrontRing<M>,
    peer: &mut impl Peer,
    pages: &Pages<M>,
    rounds: u64,
    tally: &mut Tally,
) {
    const SEGMENTS: u16 = 32;
    let good = vec![whole(pages.data[1].gref); usize::from(SEGMENTS)];
    let mut bad = good.clone();
    bad[SEGMENTS as usize / 2] = sectors(pages.data[1].gref, 7, 0);
    let stop = AtomicBool::new(false);
    let page = &pages.indirect.mem;
    let (mut okay, mut refused, mut missing) = (0u64, 0u64, 0u64);
    // The two versions differ in one descriptor's sectors only (same grant): a request
    // sees one or the other, never a grant that fails.
    put_descriptors(page, &good);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // One version per pass, so each is there about half the time.
            for pass in 0u64.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                put_descriptors(page, if pass % 2 == 0 { &good } else { &bad });
                std::thread::yield_now();
            }
        });
        for round in 0..rounds {
            let read = encode_indirect(
                abi::OP_READ,
                0x7000 + round,
                32,
                SEGMENTS,
                &[pages.indirect.gref],
            );
            match exchange(front, peer, &[read]).as_slice() {
                [r] if r.status == RSP_OKAY => okay += 1,
                [_] => refused += 1,
                _ => missing += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    tally.refused_requests += refused;
    tally.error_responses += refused;
    tally.record(
        "indirect-page-flipped-while-read",
        missing == 0 && okay + refused == rounds,
        format!(
            "{rounds} indirect reads of {SEGMENTS} segments: {okay} OKAY, {refused} refused, {missing} unanswered ({} bytes of descriptors flipped by a second thread)",
            usize::from(SEGMENTS) * SEGMENT_SIZE
        ),
    );
}

/// How a halting attack breaks the producer index.
#[derive(Clone, Copy, Debug)]
pub enum BadProducer {
    /// `req_prod` one past a full ring.
    PastTheRing,
    /// `req_prod` jumps this far ahead.
    Ahead(u32),
    /// `req_prod` goes back by this much, behind requests the backend consumed: a
    /// discard of the whole disk (which a RAM disk zeroes over many polls, so it is
    /// still in flight) and two reads.
    Backwards(u32),
}

/// Ids of the requests of [`bad_producer`]: the ones in flight before the index breaks,
/// and the valid one after it is sane again.
const IN_FLIGHT_IDS: std::ops::Range<u64> = 0xB0..0xB3;
const AFTER_ID: u64 = 0xB9;

/// Breaks the producer index: the backend must halt the ring (it may still answer what
/// it had taken before, nothing else, not even a valid request once the index is sane
/// again) and not crash.
pub fn bad_producer<M: RingMemory>(
    front: &mut FrontRing<M>,
    peer: &mut impl Peer,
    pages: &Pages<M>,
    disk: Disk,
    how: BadProducer,
    tally: &mut Tally,
) {
    let read = |id| encode_direct(abi::OP_READ, id, 24, &[whole(pages.data[1].gref)]);
    let (name, bogus, mut seen) = if let BadProducer::Backwards(by) = how {
        let mut ids = IN_FLIGHT_IDS;
        front.put_request(&encode_discard(ids.next().unwrap(), 0, disk.sectors, false));
        for id in ids {
            front.put_request(&read(id));
        }
        front.push_requests();
        peer.notify();
        // The reads' answers say the backend took all three; the discard is then most
        // likely still being zeroed (either way the index below is bad).
        let reads = IN_FLIGHT_IDS.count() - 1;
        let early = collect(front, peer, reads, ANSWER_PAUSES);
        (
            format!("req-prod-backwards-by-{by}-while-in-flight"),
            front.req_prod_pvt().wrapping_sub(by),
            early,
        )
    } else {
        let by = match how {
            BadProducer::Ahead(by) => by,
            _ => front.slots() + 1,
        };
        (
            format!("req-prod-ahead-by-{by:#x}"),
            front.req_prod_pvt().wrapping_add(by),
            Vec::new(),
        )
    };
    front.set_req_prod(bogus);
    peer.notify();
    seen.extend(collect(front, peer, usize::MAX, SILENCE_PAUSES));
    // A valid request where the next one goes, the producer index sane again (no room
    // left means the backend answered requests that were never sent).
    if front.free_slots() > 0 {
        front.put_request(&read(AFTER_ID));
        front.push_requests();
        peer.notify();
        seen.extend(collect(front, peer, usize::MAX, SILENCE_PAUSES));
    }
    let taken_before =
        |r: &Response| matches!(how, BadProducer::Backwards(_)) && IN_FLIGHT_IDS.contains(&r.id);
    let stray: Vec<Response> = seen.iter().filter(|r| !taken_before(r)).copied().collect();
    let halted = stray.is_empty();
    tally.halted_rings += u64::from(halted);
    tally.record(
        name,
        halted,
        if halted {
            format!(
                "ring halted: {} answers to requests taken before, none after (not even a valid request once the index was sane)",
                seen.len()
            )
        } else {
            format!("answered after the bad index: {stray:?}")
        },
    )
}

#[cfg(test)]
mod tests {
    //! Every attack against blkback's real engine over fake guest memory: the bytes each
    //! case claims to be are refused by the parser with the error it names, and the
    //! engine answers (or halts) as the attack expects.

    use super::*;
    use blkback::engine::{Engine, EngineConfig, EngineState};
    use blkback::fake::{
        CountingEvents, GrantTable, GuestMemory, RingView, ShufflingDevice, XenGrants,
    };
    use blkback::parse::{check_data_access, check_discard, parse_request, Request};
    use blkdev::{BlockDevice, Geometry, RamDisk, RamDiskQueue};
    use std::sync::Arc;

    const SECTORS: u64 = 4096;

    /// The engine, and the fake grant table it maps the frontend's pages from.
    struct EnginePeer<D = RamDiskQueue>(
        Engine<RingView, XenGrants, D, CountingEvents>,
        Arc<GrantTable>,
    );

    impl<D: BlockDevice> EnginePeer<D> {
        /// Mappings of the frontend's pages alive now.
        fn live(&self) -> usize {
            self.1.live_mappings().0
        }

        /// Tears the ring down as the kernel does when the frontend goes (disconnect,
        /// polled until the device has given back everything), then checks that nothing
        /// of the frontend stays mapped: every data and indirect grant, persistent or
        /// not, is unmapped, whatever the attack did to the ring.
        fn tear_down(&mut self, attack: &str) {
            let done = (0..10_000).any(|_| self.0.disconnect().is_ok());
            assert!(done, "{attack}: requests still in flight");
            assert_eq!(self.0.state(), EngineState::Disconnected, "{attack}");
            assert_eq!(self.0.stats().grants_mapped, 0, "{attack}: engine's count");
            assert_eq!(self.live(), 0, "{attack}: grants left mapped");
        }
    }

    impl<D: BlockDevice> Peer for EnginePeer<D> {
        fn notify(&mut self) {
            self.0.event_received();
        }
        fn pause(&mut self) {
            self.0.poll(64);
        }
    }

    /// A ring of one page and the attacks' pages, granted as in the guest.
    fn rig(read_only: bool, persistent: bool) -> (FrontRing, EnginePeer, Pages<RingView>) {
        rig_on(read_only, persistent, |disk| disk.queue(64))
    }

    /// `rig`, with the device `device` makes of the RAM disk.
    fn rig_on<D: BlockDevice>(
        read_only: bool,
        persistent: bool,
        device: impl FnOnce(&RamDisk) -> D,
    ) -> (FrontRing, EnginePeer<D>, Pages<RingView>) {
        let memory = GuestMemory::new(8);
        let table = GrantTable::new(memory.clone());
        let view = |page| RingView::new(memory.clone(), vec![page]);
        let grant = |gref, page, readonly| {
            table.grant(gref, page, readonly);
            Page {
                gref,
                mem: view(page),
            }
        };
        let pages = Pages {
            data: [grant(10, 1, false), grant(11, 2, false)],
            read_only: grant(12, 3, true),
            indirect: grant(13, 4, false),
            foreign: 14,
            ungranted: 0xFFFF_FFF0,
        };
        // Granted, but not to this backend: maps fail.
        table.grant(14, 5, false);
        table.fail_maps_of(14);
        let mut config = EngineConfig::new(0, persistent);
        config.read_only = read_only;
        let disk = RamDisk::new(SECTORS);
        let engine = Engine::new(
            view(0),
            XenGrants(table.clone()),
            device(&disk),
            CountingEvents::default(),
            config,
        )
        .unwrap();
        (FrontRing::new(view(0), 0), EnginePeer(engine, table), pages)
    }

    fn geometry(read_only: bool) -> Geometry {
        Geometry {
            read_only,
            ..RamDisk::new(SECTORS).queue(1).geometry()
        }
    }

    /// What the request checks alone say of a case (no grants involved).
    fn checked(case: &Case, geometry: &Geometry) -> Result<(), RequestError> {
        let descs = |r: &blkback::parse::DirectRequest| r.segments().collect::<Vec<_>>();
        match parse_request(&case.raw, abi::MAX_INDIRECT_SEGMENTS).map_err(|r| r.error)? {
            Request::Direct(r) => check_data_access(r.op, r.sector, &descs(&r), geometry).map(drop),
            Request::Discard(r) => check_discard(&r, geometry),
            Request::Indirect(r) => {
                case.descriptors.iter().try_for_each(SegmentDesc::check)?;
                check_data_access(r.op, r.sector, &case.descriptors, geometry).map(drop)
            }
        }
    }

    #[test]
    fn each_case_is_refused_by_the_checks_it_names_and_only_by_them() {
        let refs = rig(false, true).2.refs();
        let all = [
            (cases(refs, Disk { sectors: SECTORS }), false),
            (read_only_cases(refs), true),
        ];
        for (cases, read_only) in all {
            for case in cases {
                let result = checked(&case, &geometry(read_only));
                match case.refusal {
                    Refusal::Checked(error) | Refusal::BadDescriptors(error) => {
                        assert_eq!(result, Err(error), "{}", case.name)
                    }
                    // Well formed: only its grant is wrong.
                    Refusal::IndirectGrant | Refusal::DataGrant => {
                        assert_eq!(result, Ok(()), "{}", case.name)
                    }
                }
            }
        }
    }

    #[test]
    fn the_engine_answers_every_case_as_the_attack_expects_and_counts_it() {
        for persistent in [false, true] {
            let (mut front, mut peer, pages) = rig(false, persistent);
            let mut tally = Tally::default();
            assert!(baseline(&mut front, &mut peer, &pages, 8, true, &mut tally));
            let cases = cases(pages.refs(), Disk { sectors: SECTORS });
            run_cases(&mut front, &mut peer, &pages, &cases, &mut tally);
            reused_ids(&mut front, &mut peer, &pages, &mut tally);
            assert_eq!(tally.failed(), 0, "{:#?}", tally.outcomes);
            let stats = peer.0.stats();
            assert_eq!(stats.bad_requests, tally.refused_requests);
            assert_eq!(stats.errors, tally.error_responses);
            assert_eq!(tally.error_responses, cases.len() as u64);
            assert_eq!(
                tally.refused_requests,
                cases
                    .iter()
                    .filter(|c| c.refusal.counted_as_refused())
                    .count() as u64
            );
        }
        let (mut front, mut peer, pages) = rig(true, true);
        let mut tally = Tally::default();
        assert!(baseline(
            &mut front, &mut peer, &pages, 8, false, &mut tally
        ));
        let cases = read_only_cases(pages.refs());
        run_cases(&mut front, &mut peer, &pages, &cases, &mut tally);
        assert_eq!(tally.failed(), 0, "{:#?}", tally.outcomes);
        assert_eq!(peer.0.stats().bad_requests, 3);
    }

    #[test]
    fn a_flipped_indirect_page_gets_every_request_answered() {
        let (mut front, mut peer, pages) = rig(false, true);
        let mut tally = Tally::default();
        flipped_indirect_page(&mut front, &mut peer, &pages, 200, &mut tally);
        assert_eq!(tally.failed(), 0, "{:#?}", tally.outcomes);
        assert_eq!(peer.0.stats().bad_requests, tally.refused_requests);
        assert_eq!(peer.0.stats().indirect, 200);
    }

    #[test]
    fn a_broken_producer_index_halts_the_ring() {
        for how in [
            BadProducer::PastTheRing,
            BadProducer::Ahead(0x8000_0000),
            BadProducer::Backwards(1),
            BadProducer::Backwards(3),
        ] {
            // The device holds every completion: what the backend took stays in flight,
            // as a long discard does on the real backend.
            let (mut front, mut peer, pages) = rig_on(false, false, |disk| {
                let device = ShufflingDevice::new(disk.queue(64), 1, 100);
                device.hold.store(true, Ordering::Release);
                device
            });
            let mut tally = Tally::default();
            let disk = Disk { sectors: SECTORS };
            bad_producer(&mut front, &mut peer, &pages, disk, how, &mut tally);
            assert_eq!(tally.failed(), 0, "{how:?}: {:#?}", tally.outcomes);
            assert_eq!(peer.0.state(), EngineState::Halted, "{how:?}");
            assert_eq!(peer.0.stats().ring_overflows, 1, "{how:?}");
            assert_eq!(tally.halted_rings, 1);
        }
        // On a plain RAM disk too (the discard is answered before the index goes back).
        let (mut front, mut peer, pages) = rig(false, true);
        let mut tally = Tally::default();
        let disk = Disk { sectors: SECTORS };
        bad_producer(
            &mut front,
            &mut peer,
            &pages,
            disk,
            BadProducer::Backwards(2),
            &mut tally,
        );
        assert_eq!(tally.failed(), 0, "{:#?}", tally.outcomes);
        assert_eq!(peer.0.state(), EngineState::Halted);
    }

    /// A device that holds every completion until told otherwise (as a long discard,
    /// or a guest destroyed mid-flood, leaves requests on the real device).
    fn held(disk: &RamDisk) -> ShufflingDevice<RamDiskQueue> {
        let device = ShufflingDevice::new(disk.queue(64), 1, 100);
        device.hold.store(true, Ordering::Release);
        device
    }

    /// blkdom's `mapped-pages` stayed above 0 after a hostile run: every attack, each on
    /// a ring of its own, must leave nothing of the frontend mapped once its ring is torn
    /// down, and (without persistent grants) nothing mapped once it is answered.
    #[test]
    fn each_case_leaves_nothing_mapped_once_its_ring_is_torn_down() {
        for persistent in [false, true] {
            for read_only in [false, true] {
                let refs = rig(read_only, persistent).2.refs();
                let all = if read_only {
                    read_only_cases(refs)
                } else {
                    cases(refs, Disk { sectors: SECTORS })
                };
                for case in &all {
                    let (mut front, mut peer, pages) = rig(read_only, persistent);
                    let mut tally = Tally::default();
                    run_cases(
                        &mut front,
                        &mut peer,
                        &pages,
                        std::slice::from_ref(case),
                        &mut tally,
                    );
                    assert_eq!(tally.failed(), 0, "{:#?}", tally.outcomes);
                    if !persistent {
                        assert_eq!(peer.live(), 0, "{}: mapped after its answer", case.name);
                    }
                    peer.tear_down(case.name);
                }
            }
        }
    }

    #[test]
    fn reused_ids_and_a_flipped_indirect_page_leave_nothing_mapped() {
        for persistent in [false, true] {
            let (mut front, mut peer, pages) = rig(false, persistent);
            let mut tally = Tally::default();
            reused_ids(&mut front, &mut peer, &pages, &mut tally);
            if !persistent {
                assert_eq!(peer.live(), 0);
            }
            peer.tear_down("ids-reused-in-flight");
            let (mut front, mut peer, pages) = rig(false, persistent);
            flipped_indirect_page(&mut front, &mut peer, &pages, 50, &mut tally);
            assert_eq!(tally.failed(), 0, "{:#?}", tally.outcomes);
            if !persistent {
                assert_eq!(peer.live(), 0);
            }
            peer.tear_down("indirect-page-flipped-while-read");
        }
    }

    /// A halted ring (the three req_prod attacks) closed while what it took before is
    /// still on the device: nothing is unmapped under the device, everything once it is
    /// done.
    #[test]
    fn a_halted_ring_closed_with_requests_in_flight_unmaps_everything_once_they_finish() {
        for persistent in [false, true] {
            for how in [
                BadProducer::PastTheRing,
                BadProducer::Ahead(0x8000_0000),
                BadProducer::Backwards(1),
            ] {
                let (mut front, mut peer, pages) = rig_on(false, persistent, held);
                let mut tally = Tally::default();
                let disk = Disk { sectors: SECTORS };
                bad_producer(&mut front, &mut peer, &pages, disk, how, &mut tally);
                assert_eq!(peer.0.state(), EngineState::Halted, "{how:?}");
                let in_flight = peer.0.in_flight();
                if let BadProducer::Backwards(_) = how {
                    assert!(in_flight > 0, "{how:?}: the discard and reads are held");
                    assert!(peer.0.disconnect().is_err(), "{how:?}: must wait");
                    if !persistent {
                        // The held reads' grants: still mapped while the device owns them.
                        assert!(peer.live() > 0, "{how:?}: unmapped under the device");
                    }
                }
                peer.0.device().hold.store(false, Ordering::Release);
                peer.tear_down(&format!("{how:?}, persistent {persistent}"));
            }
        }
    }

    /// The end of the hostile run: the guest destroyed with its ring full of requests
    /// the device still holds (direct and indirect, persistent grants on and off).
    #[test]
    fn a_full_ring_torn_down_mid_flight_unmaps_everything_once_the_device_lets_go() {
        for persistent in [false, true] {
            let (mut front, mut peer, pages) = rig_on(false, persistent, held);
            put_descriptors(&pages.indirect.mem, &[whole(pages.data[1].gref); 16]);
            for n in 0..u64::from(front.slots()) {
                let raw = match n % 3 {
                    0 => encode_direct(abi::OP_READ, n, 8 * n, &[whole(pages.data[0].gref)]),
                    1 => encode_direct(abi::OP_WRITE, n, 8 * n, &[whole(pages.data[1].gref)]),
                    _ => encode_indirect(abi::OP_READ, n, 0, 16, &[pages.indirect.gref]),
                };
                front.put_request(&raw);
            }
            front.push_requests();
            peer.notify();
            for _ in 0..10 {
                peer.pause();
            }
            assert_eq!(peer.0.in_flight(), front.slots() as usize);
            assert!(peer.live() > 0);
            // The frontend is gone: teardown waits for the device, mapping all it holds.
            for _ in 0..10 {
                assert!(peer.0.disconnect().is_err());
            }
            assert!(peer.live() > 0, "unmapped under the device");
            peer.0.device().hold.store(false, Ordering::Release);
            peer.tear_down(&format!("full ring, persistent {persistent}"));
            let mut answered = 0;
            front.take_responses(|_| answered += 1);
            assert_eq!(answered, front.slots(), "every request answered");
        }
    }

    #[test]
    fn an_unanswered_request_fails_its_attack() {
        // A backend that never answers: the attack reports it instead of hanging.
        struct Silent;
        impl Peer for Silent {
            fn notify(&mut self) {}
            fn pause(&mut self) {}
        }
        let (mut front, _, pages) = rig(false, false);
        let mut tally = Tally::default();
        let cases = read_only_cases(pages.refs());
        run_cases(&mut front, &mut Silent, &pages, &cases[..1], &mut tally);
        assert_eq!(tally.failed(), 1);
        assert!(tally.outcomes[0].saw.starts_with("no response"));
    }
}
