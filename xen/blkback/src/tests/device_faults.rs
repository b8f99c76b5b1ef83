// SPDX-License-Identifier: MIT OR Apache-2.0
//! Device faults under the engine, with the real NVMe and virtio drivers over their fake
//! devices (`nvme::fake`, `virtio::fake`): a command that fails answers its request, and
//! only it, with an error; a command the device never completes is answered with an error
//! once its deadline has passed on the test's clock, while another ring is served all
//! along; teardown of a ring with such a command finishes; the failed device's other
//! queues fail too and say so; and a failed device's ring answers at once, mapping nothing.

use std::sync::{Arc, OnceLock};

use blkdev::{
    BlockDevice, BufferAccess, Completion, DeviceFault, DmaSegment, FaultKind, IoOp, IoRequest,
    IoStatus, SubmitError,
};

use cmdslots::fake::FaultyDevice;
use cmdslots::{RecoveryConfig, RecoveryStep};

use super::{page_bytes, whole_page, Rig};
use crate::abi::{self, RSP_EOPNOTSUPP, RSP_ERROR, RSP_OKAY};
use crate::engine::EngineConfig;
use crate::fake::wire::encode_direct;
use crate::fake::XenGrants;
use crate::ring::Response;

const MS: u64 = 1_000_000;
/// The deadline the tests' engines run with.
const TIMEOUT: u64 = 2_000 * MS;
/// Pages of the fake device's memory per request (one per direct segment).
const PAGES_PER_TAG: u64 = abi::MAX_SEGMENTS_PER_REQUEST as u64;
const RING_SLOTS: u64 = 32;

/// The fake device's memory, as the adapter reaches it.
type Memory = Box<dyn Fn(&mut dyn FnMut(&mut [u8]))>;

/// A driver's queue over a fake device, under the engine. The engine names data by the
/// fake Xen's grant handles, and a fake device reaches only its own memory: each segment
/// goes through a page of that memory, as the kernel's bounce buffers do (a write's data
/// copied in before the driver sees it, a read's copied out to the grant when it
/// completes, while the engine still holds it mapped).
struct OnFakeDma<Q> {
    queue: Q,
    /// The rig's grants (set once the rig exists).
    grants: Arc<OnceLock<XenGrants>>,
    memory: Memory,
    /// Request `tag`'s segment `i` lives in page `pages + (tag * 11 + i) * 4096`.
    pages: u64,
    /// Each read in flight: (grant buffer, offset, length, device page) per segment.
    reads: Vec<Vec<(u64, u32, u32, u64)>>,
    segments: Vec<DmaSegment>,
}

impl<Q: BlockDevice> OnFakeDma<Q> {
    fn new(queue: Q, memory: Memory, pages: u64) -> (Self, Arc<OnceLock<XenGrants>>) {
        let grants = Arc::new(OnceLock::new());
        let device = OnFakeDma {
            queue,
            grants: grants.clone(),
            memory,
            pages,
            reads: vec![Vec::new(); RING_SLOTS as usize],
            segments: Vec::new(),
        };
        (device, grants)
    }
}

impl<Q: BlockDevice> BlockDevice for OnFakeDma<Q> {
    blkdev::forward_to!(queue: geometry, queue_depth, tick, fault);

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        let tag = u64::from(request.tag);
        assert!(tag < RING_SLOTS && request.segments.len() as u64 <= PAGES_PER_TAG);
        self.segments.clear();
        let mut pieces = Vec::new();
        for (i, s) in request.segments.iter().enumerate() {
            let page = self.pages + (tag * PAGES_PER_TAG + i as u64) * 4096;
            let at = (page + u64::from(s.offset)) as usize;
            if request.op == IoOp::Write || request.preflush {
                let mut data = vec![0; s.len as usize];
                assert!(buffers.read_buffer(s.buffer, s.offset as usize, &mut data));
                (self.memory)(&mut |m| m[at..at + data.len()].copy_from_slice(&data));
            }
            pieces.push((s.buffer, s.offset, s.len, page));
            self.segments.push(DmaSegment { buffer: page, ..*s });
        }
        let moved = IoRequest {
            segments: &self.segments,
            ..*request
        };
        self.queue.submit(&moved, buffers)?;
        if request.op == IoOp::Read {
            self.reads[tag as usize] = pieces;
        }
        Ok(())
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let (reads, memory, grants) = (&mut self.reads, &self.memory, &self.grants);
        self.queue.poll_completions(&mut |completion| {
            let pieces = std::mem::take(&mut reads[completion.tag as usize]);
            if completion.status == IoStatus::Ok {
                let grants = grants.get().expect("grants set");
                for (buffer, offset, len, page) in pieces {
                    let at = (page + u64::from(offset)) as usize;
                    let mut data = vec![0; len as usize];
                    memory(&mut |m| data.copy_from_slice(&m[at..at + len as usize]));
                    assert!(grants.write_buffer(buffer, offset as usize, &data));
                }
            }
            sink(completion)
        })
    }
}

type NvmeRig = Rig<OnFakeDma<nvme::IoQueue<nvme::fake::FakeHal>>>;
type VirtioRig = Rig<OnFakeDma<virtio::BlkQueue<virtio::fake::FakeHal>>>;

fn config() -> EngineConfig {
    EngineConfig {
        device_timeout_ns: TIMEOUT,
        ..EngineConfig::new(0, false)
    }
}

/// A rig over each of `queues`, queues of the fake device `device`.
fn rigs_over<Q: BlockDevice, H: FaultyDevice + Clone + 'static>(
    queues: Vec<Q>,
    device: &H,
) -> Vec<Rig<OnFakeDma<Q>>> {
    queues
        .into_iter()
        .map(|queue| {
            let mut pages = 0;
            let count = (RING_SLOTS * PAGES_PER_TAG) as usize;
            device.with_memory(&mut |m| pages = m.allocate(count).expect("fake memory"));
            let h = device.clone();
            let memory: Memory = Box::new(move |f| h.with_memory(&mut |m| f(&mut m[..])));
            let (device, grants) = OnFakeDma::new(queue, memory, pages);
            let rig = Rig::new(config(), device);
            grants.set(XenGrants(rig.table.clone())).ok().unwrap();
            rig
        })
        .collect()
}

/// `count` rigs, each over its own I/O queue of one fake NVMe controller, which is
/// never recovered (`device.max-resets=0`: a device that fails is given up at once).
fn nvme_rigs(fake: nvme::fake::FakeController, count: u16) -> (nvme::fake::FakeHal, Vec<NvmeRig>) {
    let (hal, _, rigs) = nvme_rigs_recovering(fake, count, RecoveryConfig::NEVER);
    (hal, rigs)
}

/// As `nvme_rigs`, recovering as `recovery` says (the controller runs the recovery).
fn nvme_rigs_recovering(
    fake: nvme::fake::FakeController,
    count: u16,
    recovery: RecoveryConfig,
) -> (
    nvme::fake::FakeHal,
    nvme::Controller<nvme::fake::FakeHal>,
    Vec<NvmeRig>,
) {
    use nvme::{Controller, InitConfig};
    let hal = nvme::fake::FakeHal::new(fake);
    let config = InitConfig {
        recovery,
        ..InitConfig::default()
    };
    let mut controller = Controller::init(hal.clone(), config).unwrap();
    let namespace = controller.namespace(1).unwrap();
    assert_eq!(controller.request_io_queues(count).unwrap(), count);
    let queues = (0..count)
        .map(|_| controller.create_io_queue(&namespace, 64).unwrap())
        .collect();
    let rigs = rigs_over(queues, &hal);
    (hal, controller, rigs)
}

/// `count` rigs, each over its own virtqueue of one fake virtio-blk device, never
/// recovered (as `nvme_rigs`).
fn virtio_rigs(
    fake: virtio::fake::FakeDevice,
    count: u16,
) -> (virtio::fake::FakeHal, Vec<VirtioRig>) {
    let hal = virtio::fake::FakeHal::new(fake);
    let mut device =
        virtio::VirtioBlk::init(hal.clone(), virtio::fake::regions(), RecoveryConfig::NEVER)
            .unwrap();
    let queues = (0..count)
        .map(|_| device.create_queue(64).unwrap())
        .collect();
    device.start();
    let rigs = rigs_over(queues, &hal);
    (hal, rigs)
}

/// Sends one whole-page request of `op` at `sector` on a fresh page filled with `fill`;
/// returns the page.
fn send<D: BlockDevice>(rig: &mut Rig<D>, op: u8, id: u64, sector: u64, fill: u8) -> usize {
    let (page, gref) = rig.data_page(fill);
    rig.send(&encode_direct(op, id, sector, &[whole_page(gref)]));
    page
}

fn statuses(responses: &[Response]) -> Vec<(u64, i16)> {
    let mut out: Vec<_> = responses.iter().map(|r| (r.id, r.status)).collect();
    out.sort();
    out
}

/// The status the device's own error gives: the request that met it, and no other
/// (the device fails reads touching `failing_sector`); a flush it does not know is
/// EOPNOTSUPP, not an error.
fn an_error_answers_exactly_its_request<D: BlockDevice>(rig: &mut Rig<D>, failing_sector: u64) {
    send(rig, abi::OP_WRITE, 1, 0, 0x11);
    rig.engine.poll(64);
    assert_eq!(statuses(&rig.responses()), [(1, RSP_OKAY)]);
    send(rig, abi::OP_READ, 2, failing_sector - 4, 0);
    let read = send(rig, abi::OP_READ, 3, 0, 0);
    send(rig, abi::OP_WRITE, 4, failing_sector + 8, 0x22);
    rig.engine.poll(64);
    assert_eq!(
        statuses(&rig.responses()),
        [(2, RSP_ERROR), (3, RSP_OKAY), (4, RSP_OKAY)]
    );
    assert_eq!(page_bytes(&rig.memory, read), vec![0x11; abi::PAGE_SIZE]);
    let stats = rig.engine.stats();
    assert_eq!((stats.device_errors, stats.errors), (1, 1), "{stats:?}");
    assert_eq!(rig.engine.device_fault(), None, "an error is not a fault");
    rig.send(&encode_direct(abi::OP_FLUSH_DISKCACHE, 5, 0, &[]));
    rig.engine.poll(64);
    assert_eq!(statuses(&rig.responses()), [(5, RSP_EOPNOTSUPP)]);
    assert_eq!(rig.engine.stats().device_errors, 1);
}

#[test]
fn an_nvme_error_status_answers_exactly_its_request_with_error() {
    let mut fake = nvme::fake::FakeController::new(1 << 20);
    // Media error: unrecovered read, in block 100 only; FLUSH "invalid opcode".
    fake.fail_lba = Some((100, nvme::CommandStatus::new(2, 0x81)));
    fake.unsupported_opcodes = vec![0x00];
    let (hal, mut rigs) = nvme_rigs(fake, 1);
    an_error_answers_exactly_its_request(&mut rigs[0], 100);
    assert!(hal.with(|m| m.violations.is_empty()));
}

#[test]
fn a_virtio_ioerr_answers_exactly_its_request_and_unsupp_is_eopnotsupp() {
    let mut fake = virtio::fake::FakeDevice::new(1 << 20);
    // IOERR for sector 100; UNSUPP for flushes.
    fake.fail_sector = Some(100);
    fake.unsupported_kinds = vec![4];
    let (hal, mut rigs) = virtio_rigs(fake, 1);
    an_error_answers_exactly_its_request(&mut rigs[0], 100);
    assert!(hal.with(|m| m.violations.is_empty()));
}

/// Drives `stalled` (whose request id 1 never completes) and `other` on one test
/// "poller" in steps of 100 ms of the test's clock: `other` gets a read every step and
/// must answer it within the step; `stalled`'s request must be answered with an error
/// after the deadline and within one scan interval and one step of it. Returns when it
/// was answered.
fn served_around_a_stall<A: BlockDevice, B: BlockDevice>(
    stalled: &mut Rig<A>,
    other: &mut Rig<B>,
    start: u64,
) -> u64 {
    const STEP: u64 = 100 * MS;
    let mut answered = None;
    let mut now = start;
    let mut next_id = 100;
    while now <= start + TIMEOUT + cmdslots::scan_interval(TIMEOUT) + 2 * STEP {
        send(other, abi::OP_READ, next_id, 0, 0);
        stalled.engine.poll(64);
        other.engine.poll(64);
        stalled.engine.tick(now);
        other.engine.tick(now);
        assert_eq!(
            statuses(&other.responses()),
            [(next_id, RSP_OKAY)],
            "the other ring is served at {} ms",
            (now - start) / MS
        );
        next_id += 1;
        for response in stalled.responses() {
            assert_eq!((response.id, response.status), (1, RSP_ERROR));
            assert!(answered.is_none());
            answered = Some(now);
        }
        now += STEP;
    }
    let at = answered.expect("the stalled request was answered") - start;
    // Answered at the poll after the tick that failed the device.
    assert!(at > TIMEOUT, "answered after {} ms", at / MS);
    assert!(
        at <= TIMEOUT + cmdslots::scan_interval(TIMEOUT) + STEP,
        "answered after {} ms",
        at / MS
    );
    at
}

#[test]
fn a_stalled_nvme_command_is_answered_with_an_error_after_the_deadline_while_another_ring_is_served(
) {
    let mut fake = nvme::fake::FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    let (hal, mut stalled) = nvme_rigs(fake, 2);
    let (_, mut others) = virtio_rigs(virtio::fake::FakeDevice::new(1 << 20), 1);
    let (stalled, sibling) = stalled.split_at_mut(1);
    let (stalled, sibling, other) = (&mut stalled[0], &mut sibling[0], &mut others[0]);
    let start = 1_000 * MS;
    stalled.engine.tick(start);
    sibling.engine.tick(start);
    let page = send(stalled, abi::OP_READ, 1, 64, 0x5a);
    stalled.engine.poll(64);
    assert_eq!(stalled.engine.in_flight(), 1);
    served_around_a_stall(stalled, other, start);
    assert_eq!(
        stalled.engine.device_fault(),
        Some(DeviceFault {
            kind: FaultKind::Timeout { waited_ms: 2_100 },
            dma_stopped: true
        })
    );
    // The controller completes it now: bus mastering is off, the page is untouched.
    hal.with(|m| m.finish_stalled());
    assert_eq!(
        page_bytes(&stalled.memory, page),
        vec![0x5a; abi::PAGE_SIZE]
    );
    let stats = stalled.engine.stats();
    assert_eq!((stats.device_errors, stats.errors), (1, 1));

    // From now on requests are answered at once, mapping no grant.
    let maps = stalled.table.calls().0;
    send(stalled, abi::OP_WRITE, 2, 0, 1);
    stalled.engine.poll(64);
    assert_eq!(statuses(&stalled.responses()), [(2, RSP_ERROR)]);
    assert_eq!(
        stalled.table.calls().0,
        maps,
        "no grant mapped for a failed device"
    );
    assert_eq!(stalled.engine.stats().device_errors, 2);

    // The controller's other queue, another disk's ring: failed too, and says why.
    sibling.engine.tick(start + 3_000 * MS);
    assert_eq!(
        sibling.engine.device_fault(),
        Some(DeviceFault {
            kind: FaultKind::Stopped,
            dma_stopped: true
        })
    );
    send(sibling, abi::OP_READ, 7, 0, 0);
    sibling.engine.poll(64);
    assert_eq!(statuses(&sibling.responses()), [(7, RSP_ERROR)]);
}

#[test]
fn a_stalled_virtio_request_is_answered_with_an_error_after_the_deadline_while_another_ring_is_served(
) {
    let mut fake = virtio::fake::FakeDevice::new(1 << 20);
    fake.stall_sector = Some(64);
    let (hal, mut stalled) = virtio_rigs(fake, 1);
    let (_, mut others) = nvme_rigs(nvme::fake::FakeController::new(1 << 20), 1);
    let (stalled, other) = (&mut stalled[0], &mut others[0]);
    stalled.engine.tick(0);
    let page = send(stalled, abi::OP_READ, 1, 64, 0x5a);
    stalled.engine.poll(64);
    served_around_a_stall(stalled, other, 0);
    assert!(matches!(
        stalled.engine.device_fault(),
        Some(DeviceFault {
            kind: FaultKind::Timeout { .. },
            dma_stopped: true
        })
    ));
    hal.with(|m| m.finish_stalled());
    assert_eq!(
        page_bytes(&stalled.memory, page),
        vec![0x5a; abi::PAGE_SIZE]
    );
    assert_eq!(hal.with(|m| m.bus.blocked), 1);
}

#[test]
fn teardown_of_a_ring_with_a_stalled_command_finishes_at_the_deadline() {
    let mut fake = nvme::fake::FakeController::new(1 << 20);
    fake.stall_lba = Some(8);
    let (_, mut rigs) = nvme_rigs(fake, 1);
    let rig = &mut rigs[0];
    rig.engine.tick(0);
    send(rig, abi::OP_WRITE, 1, 8, 0x33);
    send(rig, abi::OP_READ, 2, 16, 0);
    rig.engine.poll(64);
    assert_eq!(statuses(&rig.responses()), [(2, RSP_OKAY)]);
    // The frontend closes: teardown waits for the device, whose command holds a grant.
    let mut now = 0;
    while rig.engine.disconnect().is_err() {
        assert!(
            rig.table.live_mappings().0 > 0,
            "the stalled command's grant stays mapped while the device may use it"
        );
        now += 50 * MS;
        rig.engine.tick(now);
        assert!(
            now <= TIMEOUT + cmdslots::scan_interval(TIMEOUT),
            "teardown still waits after {} ms",
            now / MS
        );
    }
    assert!(now > TIMEOUT);
    assert_eq!(statuses(&rig.responses()), [(1, RSP_ERROR)]);
    assert_eq!(rig.table.live_mappings().0, 0, "every grant unmapped");
    assert_eq!(rig.engine.in_flight(), 0);
}

#[test]
fn with_recovery_only_the_stalled_request_fails_and_requests_sent_during_the_reset_wait() {
    let mut fake = nvme::fake::FakeController::new(1 << 20);
    fake.stall_lba = Some(64);
    let (hal, mut controller, mut rigs) = nvme_rigs_recovering(fake, 1, RecoveryConfig::DEFAULT);
    let rig = &mut rigs[0];
    rig.engine.tick(0);
    let stalled = send(rig, abi::OP_READ, 1, 64, 0x5a);
    send(rig, abi::OP_WRITE, 2, 0, 0x77);
    rig.engine.poll(64);
    assert_eq!(statuses(&rig.responses()), [(2, RSP_OKAY)]);
    rig.engine.tick(MS);
    let overdue = TIMEOUT + cmdslots::scan_interval(TIMEOUT) + MS;
    rig.engine.tick(overdue);
    // The controller takes no abort; its first reset fails (it never gets ready).
    hal.with(|m| m.never_ready = true);
    assert!(matches!(controller.recover(overdue), RecoveryStep::At(_)));
    // Requests the guest sends meanwhile wait: the first is held by the engine, the
    // ones after it are left in the ring; nothing is answered, nothing fails.
    let read = send(rig, abi::OP_READ, 3, 0, 0);
    rig.engine.poll(64);
    for (step, id) in [(1, 4), (2, 5)] {
        send(rig, abi::OP_READ, id, 8 * id, 0);
        rig.engine.tick(overdue + step * MS);
        rig.engine.poll(64);
    }
    assert!(rig.responses().is_empty());
    assert_eq!(rig.engine.device_fault(), None);
    assert_eq!(
        rig.table.live_mappings().0,
        2,
        "the stalled request and the one waiting in the engine are mapped, no other"
    );
    // The controller back: the stalled read fails, the waiting ones are served.
    hal.with(|m| m.never_ready = false);
    let retry = overdue + cmdslots::recovery::RESET_RETRY_NS;
    assert_eq!(controller.recover(retry), RecoveryStep::Reset);
    for step in 0..3 {
        rig.engine.tick(retry + step * MS);
        rig.engine.poll(64);
    }
    assert_eq!(
        statuses(&rig.responses()),
        [(1, RSP_ERROR), (3, RSP_OKAY), (4, RSP_OKAY), (5, RSP_OKAY)]
    );
    assert_eq!(page_bytes(&rig.memory, read), vec![0x77; abi::PAGE_SIZE]);
    assert_eq!(
        page_bytes(&rig.memory, stalled),
        vec![0x5a; abi::PAGE_SIZE],
        "the lost read wrote nothing"
    );
    assert_eq!(rig.engine.device_fault(), None);
    assert_eq!(rig.engine.stats().device_errors, 1);
    assert!(hal.with(|m| m.violations.is_empty()));
}
