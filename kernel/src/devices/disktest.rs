// SPDX-License-Identifier: MIT OR Apache-2.0
//! `disktest=<backing>`: drive a disk from every CPU at once and check what comes back.
//!
//! Queue `q` runs on CPU `q` and owns region `q` of the disk (the last `TAIL_SECTORS`
//! stay out of every region: the discard check uses them). Per queue: the seeded writes
//! of `testhooks::pattern` (1 sector to 1 MiB each), each read back and compared, then a
//! flush; then throughput: random 4 KiB reads and sequential 256 KiB reads at queue
//! depth. The tier-2 runner recomputes the writes from the seed and compares the backing
//! file after QEMU has exited. A slice (`nvme:1:offset=1M,size=8M`, `virtio:0:part=2`) is
//! tested as a disk of its own, wrapped as the registry wraps it; a read just past its
//! end must be refused. Options: `disktest.seed=`, `disktest.writes=`,
//! `disktest.queues=`, `disktest.random-reads=`, `disktest.sequential-mib=`,
//! `disktest.nvme-prp-only`, `disktest.bounce` (through bounce buffers, as an emulated
//! device under Xen), `disktest.shutdown` (then the devices' part of a clean shutdown,
//! as `xl shutdown` runs it: the device flushed through queue 0, then told to stop; the
//! test fails if it does not answer).

use super::dma_pages::DmaPages;
use super::error::OpenError;
use super::hal::{self, now_us};
use super::open::{self, Queue};
use super::region::{RegionError, TableReader};
use crate::power;
use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use backing::{Backing, Region};
use blkdev::{BlockDevice, DmaSegment, Geometry, IoOp, IoRequest, IoStatus, SubmitError};
use bootconfig::{Cmdline, Key};
use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};
use log::{error, info};
use testhooks::pattern::{self, Plan};

/// Sectors at the end of the disk kept out of the write regions.
pub const TAIL_SECTORS: u64 = 2048;
/// Longest write: 1 MiB.
const MAX_WRITE_SECTORS: u32 = 2048;
const PAGE: u64 = 4096;
const MAX_WRITE_BYTES: usize = MAX_WRITE_SECTORS as usize * 512;
/// Room for the longest write in any layout (short segments take a page each).
const BUFFER_PAGES: usize = 2 * MAX_WRITE_BYTES / PAGE as usize;
/// Any one request must finish within this (TCG is slow, but not this slow).
const REQUEST_TIMEOUT_US: u64 = 20_000_000;
const SEQUENTIAL_REQUEST_BYTES: u64 = 256 * 1024;

#[derive(Clone, Copy)]
struct Params {
    seed: u64,
    writes: u32,
    random_reads: u32,
    sequential_bytes: u64,
    /// The queues go through bounce buffers (`disktest.bounce`).
    bounce: bool,
}

/// What one queue measured.
#[derive(Clone, Copy, Default)]
struct QueueReport {
    written_bytes: u64,
    random_reads: u64,
    random_us: u64,
    sequential_bytes: u64,
    sequential_us: u64,
}

struct Job {
    queue: Queue,
    index: u32,
    region_start: u64,
    region_sectors: u64,
    params: Params,
    discard_tail: bool,
}

static JOBS: spin::Once<Vec<spin::Mutex<Option<Job>>>> = spin::Once::new();
/// Each queue's outcome, filled by the CPU that drove it.
type QueueResult = spin::Mutex<Option<Result<QueueReport, DiskTestError>>>;
static RESULTS: spin::Once<Vec<QueueResult>> = spin::Once::new();
static FINISHED: AtomicUsize = AtomicUsize::new(0);

/// Runs the disk test on `spec` (with commands given up after `device_timeout_ns`, for
/// `disktest.shutdown`) and powers off with its verdict.
pub fn disk_test(spec: &str, cmdline: &Cmdline, device_timeout_ns: u64, bus: open::PciBus) -> ! {
    let verdict = match run(spec, cmdline, device_timeout_ns, bus) {
        Ok(()) => {
            info!("disktest: PASS");
            power::Verdict::Pass
        }
        Err(why) => {
            error!("disktest: FAIL: {why}");
            power::Verdict::Fail
        }
    };
    power::report_verdict(verdict);
    power::power_off()
}

fn number<T: core::str::FromStr>(
    cmdline: &Cmdline,
    key: Key,
    default: T,
) -> Result<T, DiskTestError> {
    match cmdline.value(key) {
        None => Ok(default),
        Some(text) => text.parse().map_err(|_| DiskTestError::NotANumber {
            key: key.name(),
            text: text.into(),
        }),
    }
}

fn run(
    spec: &str,
    cmdline: &Cmdline,
    device_timeout_ns: u64,
    bus: open::PciBus,
) -> Result<(), DiskTestError> {
    let backing = backing::parse_backing(spec).map_err(|e| DiskTestError::Spec {
        spec: spec.into(),
        reason: e.to_string(),
    })?;
    let params = Params {
        seed: number(cmdline, Key::DisktestSeed, 1)?,
        writes: number(cmdline, Key::DisktestWrites, 24)?,
        random_reads: number(cmdline, Key::DisktestRandomReads, 2000)?,
        sequential_bytes: number::<u64>(cmdline, Key::DisktestSequentialMib, 16)? << 20,
        bounce: cmdline.has(Key::DisktestBounce),
    };
    let cpus = crate::smp::online_count();
    let wanted: usize = number(cmdline, Key::DisktestQueues, cpus)?;
    if wanted == 0 || wanted > cpus {
        return Err(DiskTestError::QueueCount { wanted, cpus });
    }
    let tsc_per_us = hal::calibrate_clock();
    info!(
        "disktest: {spec}, seed {}, {} writes per queue, TSC {tsc_per_us} MHz",
        params.seed, params.writes
    );

    let options = open::OpenOptions {
        nvme_prp_only: cmdline.has(Key::DisktestNvmePrpOnly),
        bounce: params.bounce,
        ..Default::default()
    };
    // Both opens below go through one `Devices`, as the control path's do.
    // No command is expected to time out here: no recovery to run.
    let mut devices = open::Devices::new(bus, cmdslots::RecoveryConfig::NEVER);
    super::stopwatch::start();
    let opened = devices.open(backing, wanted, options);
    if let Some(cost) = super::stopwatch::finish() {
        info!("devices: {spec} opened in {cost}");
    }
    let mut disk = opened?;
    // A slice: its queues are wrapped as the registry's are, and the test runs inside it.
    let region = backing.device().map_or(Region::Whole, |(_, region)| region);
    let window = match region {
        Region::Whole => None,
        _ => {
            let (extent, _table) = TableReader::default()
                .locate(region, &mut disk.queues, &mut || {})
                .map_err(|error| DiskTestError::Region {
                    spec: spec.into(),
                    error,
                })?;
            info!("disktest: the slice is {extent} of the device");
            extent.sectors()
        }
    };
    if let Some((start, sectors)) = window {
        disk.queues = disk
            .queues
            .into_iter()
            .map(|queue| slice(queue, start, sectors))
            .collect::<Result<_, _>>()?;
    }
    let geometry = disk.queues[0].geometry();
    let queues = disk.queues.len();
    info!(
        "disktest: {}; {} sectors, flush {}, discard {}",
        disk.description,
        geometry.sectors,
        if geometry.flush { "yes" } else { "no" },
        if geometry.discard.is_some() {
            "yes"
        } else {
            "no"
        }
    );
    if queues < wanted {
        info!("disktest: the device gave {queues} of {wanted} queues");
    }
    if geometry.sectors <= TAIL_SECTORS + 2 * u64::from(MAX_WRITE_SECTORS) * queues as u64 {
        return Err(DiskTestError::TooSmall {
            sectors: geometry.sectors,
        });
    }
    let region_sectors = (geometry.sectors - TAIL_SECTORS) / queues as u64;
    info!(
        "disktest: {queues} queue(s), regions of {region_sectors} sectors (host check: disk_pattern.expected_image(size, {}, {queues}, {}))",
        params.seed, params.writes
    );

    // A second open of the same device must not disturb the first: NVMe hands out more
    // queues of the controller already up (its last-write check below runs through
    // one), a virtio device is refused as in use.
    let mut second = match backing {
        Backing::Nvme { .. } => {
            let again = devices
                .open(backing, 1, options)
                .map_err(DiskTestError::SecondOpen)?;
            info!(
                "disktest: a second open got {} more queue(s)",
                again.queues.len()
            );
            match (again.queues.into_iter().next(), window) {
                (Some(queue), Some((start, sectors))) => Some(slice(queue, start, sectors)?),
                (queue, _) => queue,
            }
        }
        Backing::Virtio { .. } => match devices.open(backing, 1, options) {
            Ok(_) => return Err(DiskTestError::SecondVirtioOpenAccepted),
            Err(why) => {
                info!("disktest: a second open is refused: {why}");
                None
            }
        },
        // A second RAM disk would be another disk; remote ones are not opened here.
        Backing::Ram { .. } | Backing::NvmeTcp { .. } => None,
    };

    if let Some((_, sectors)) = window {
        refuses_past_the_end(&mut disk.queues[0], sectors)?;
    }

    let jobs = JOBS.call_once(|| {
        disk.queues
            .into_iter()
            .enumerate()
            .map(|(index, queue)| {
                spin::Mutex::new(Some(Job {
                    queue,
                    index: index as u32,
                    region_start: index as u64 * region_sectors,
                    region_sectors,
                    params,
                    discard_tail: index == 0,
                }))
            })
            .collect()
    });
    RESULTS.call_once(|| (0..jobs.len()).map(|_| spin::Mutex::new(None)).collect());

    // CPUs 1.. get their queue through their mailbox (not waited for); the boot CPU
    // drives queue 0 meanwhile.
    for cpu in 1..queues {
        if let Err(error) = crate::smp::start_on(cpu, worker) {
            return Err(DiskTestError::StartCpu { cpu, error });
        }
    }
    worker(0);
    let deadline = now_us() + 600_000_000;
    while FINISHED.load(Ordering::Acquire) < queues {
        if now_us() > deadline {
            return Err(DiskTestError::Unfinished);
        }
        core::hint::spin_loop();
    }

    let results = RESULTS.get().expect("set above");
    let mut total = QueueReport::default();
    let mut failures = Vec::new();
    for (index, result) in results.iter().enumerate() {
        match result.lock().take() {
            Some(Ok(report)) => {
                total.written_bytes += report.written_bytes;
                total.random_reads += report.random_reads;
                total.random_us = total.random_us.max(report.random_us);
                total.sequential_bytes += report.sequential_bytes;
                total.sequential_us = total.sequential_us.max(report.sequential_us);
            }
            Some(Err(why)) => failures.push((index, Some(why))),
            None => failures.push((index, None)),
        }
    }
    if !failures.is_empty() {
        return Err(DiskTestError::Queues(failures));
    }
    if let Some(queue) = second.as_mut() {
        check_last_write(queue, params, region_sectors)?;
    }
    let iops = total.random_reads * 1_000_000 / total.random_us.max(1);
    let mb_per_s = total.sequential_bytes as f64 / total.sequential_us.max(1) as f64;
    info!(
        "disktest: throughput ({queues} queue(s) at once): random 4 KiB reads {iops} IOPS, sequential 256 KiB reads {mb_per_s:.1} MB/s"
    );
    if cmdline.has(Key::DisktestShutdown) {
        // Queue 0 is back from its CPU (idle): the device is flushed through it.
        let mut queue = jobs[0].lock().take().map(|job| job.queue);
        let flush: Vec<(String, &mut dyn BlockDevice)> = queue
            .iter_mut()
            .map(|queue| (spec.to_string(), &mut **queue as &mut dyn BlockDevice))
            .collect();
        let report =
            devices.shut_down(flush, super::shutdown::flush_deadline_ns(device_timeout_ns));
        info!(
            "disktest: shutdown: {} flush(es), {} device(s) stopped, {} given up",
            report.flushed,
            report.stopped,
            report.given_up.len()
        );
        if !report.given_up.is_empty() {
            return Err(DiskTestError::Shutdown(report.given_up.join("; ")));
        }
    }
    Ok(())
}

/// `queue` as the slice of `sectors` sectors from sector `start` of its device.
fn slice(queue: Queue, start: u64, sectors: u64) -> Result<Queue, DiskTestError> {
    blkdev::Slice::new(queue, start, sectors)
        .map(|slice| Box::new(slice) as Queue)
        .map_err(|(_, error)| DiskTestError::Slice(error))
}

/// A read of the sector after a slice of `sectors` sectors is refused before it reaches
/// the device (the host check of the backing file then shows nothing outside changed).
fn refuses_past_the_end(queue: &mut Queue, sectors: u64) -> Result<(), DiskTestError> {
    let mut buffer = Buffer::new(1)?;
    let pages = buffer.access();
    let request = IoRequest {
        tag: 1,
        op: IoOp::Read,
        sector: sectors,
        nr_sectors: 1,
        preflush: false,
        segments: buffer.segments(0, 512),
    };
    match queue.submit(&request, &pages) {
        Err(SubmitError::Invalid) => {
            info!("disktest: a read at sector {sectors}, past the slice's end, is refused");
            Ok(())
        }
        _ => Err(DiskTestError::SliceEndNotRefused { sector: sectors }),
    }
}

/// Reads queue 0's last write (nothing overwrites it) through `queue` and checks it.
fn check_last_write(
    queue: &mut Queue,
    params: Params,
    region_sectors: u64,
) -> Result<(), DiskTestError> {
    let Some(last) = Plan::new(
        params.seed,
        0,
        0,
        region_sectors,
        params.writes,
        MAX_WRITE_SECTORS,
    )
    .last() else {
        return Ok(());
    };
    let bytes = u64::from(last.sectors) * 512;
    let mut buffer = Buffer::new(BUFFER_PAGES)?;
    let pages = buffer.access();
    let segments = buffer.layout(0, bytes);
    complete(
        queue,
        &IoRequest {
            tag: 1,
            op: IoOp::Read,
            sector: last.sector,
            nr_sectors: u64::from(last.sectors),
            preflush: false,
            segments,
        },
        pages,
    )?;
    let mut data = alloc::vec![0u8; bytes as usize];
    pages.gather(&buffer.segments, &mut data);
    if let Some(at) = pattern::first_mismatch(params.seed, 0, last.index, last.sector * 512, &data)
    {
        return Err(DiskTestError::SecondOpenReadsWrong {
            write: last.index,
            at,
        });
    }
    info!("disktest: the second open reads queue 0's last write back intact");
    Ok(())
}

fn worker(cpu: usize) {
    let slot = JOBS.get().and_then(|jobs| jobs.get(cpu));
    let result = match slot.and_then(|j| j.lock().take()) {
        Some(mut job) => {
            let result = exercise(&mut job).map_err(|why| {
                error!("disktest: queue {} on cpu {cpu}: {why}", job.index);
                why
            });
            // Back, idle, for the shutdown that may follow (`disktest.shutdown`).
            *slot.expect("the job came from it").lock() = Some(job);
            result
        }
        None => Err(DiskTestError::NoQueueForCpu(cpu)),
    };
    if let Some(slot) = RESULTS.get().and_then(|r| r.get(cpu)) {
        *slot.lock() = Some(result);
    }
    FINISHED.fetch_add(1, Ordering::AcqRel);
}

/// A DMA buffer of whole pages and the scratch list of its segments.
struct Buffer {
    base: u64,
    pages: usize,
    segments: Vec<DmaSegment>,
}

impl Buffer {
    fn new(pages: usize) -> Result<Self, DiskTestError> {
        let base = hal::allocate_dma(pages).ok_or(DiskTestError::NoDmaMemory)?;
        Ok(Buffer {
            base,
            pages,
            segments: Vec::with_capacity(pages),
        })
    }

    /// CPU access to this buffer's pages.
    fn access(&self) -> DmaPages {
        DmaPages {
            base: self.base,
            pages: self.pages,
        }
    }

    /// Segments for `bytes` in one of four layouts, one segment per page as the engine
    /// hands them over: 0 whole pages; 1 the first segment starts mid-page; 2 every
    /// fifth segment is short, 3 the first eight are second halves of pages (PRP breaks:
    /// the NVMe driver must split).
    fn layout(&mut self, kind: u32, bytes: u64) -> &[DmaSegment] {
        self.segments.clear();
        let mut left = bytes;
        let mut page = 0;
        while left > 0 && page < self.pages {
            let n = self.segments.len();
            let (offset, room) = match kind % 4 {
                1 if n == 0 => (
                    512 * (1 + bytes / 512 % 7),
                    PAGE - 512 * (1 + bytes / 512 % 7),
                ),
                2 if n % 5 == 4 => (0, 1024),
                3 if n < 8 => (2048, 2048),
                _ => (0, PAGE),
            };
            let len = left.min(room);
            self.segments.push(DmaSegment {
                buffer: self.base + page as u64 * PAGE,
                offset: offset as u32,
                len: len as u32,
            });
            left -= len;
            page += 1;
        }
        &self.segments
    }

    /// Segments for `bytes` starting at page `first_page`: one per page, never merged.
    fn segments(&mut self, first_page: usize, bytes: u64) -> &[DmaSegment] {
        self.segments.clear();
        let mut left = bytes;
        let mut page = first_page;
        while left > 0 && page < self.pages {
            let len = left.min(PAGE);
            self.segments.push(DmaSegment {
                buffer: self.base + page as u64 * PAGE,
                offset: 0,
                len: len as u32,
            });
            left -= len;
            page += 1;
        }
        &self.segments
    }
}

/// Submits `request` (retrying while the queue is full) and waits for its completion.
fn complete(
    queue: &mut Queue,
    request: &IoRequest<'_>,
    buffers: DmaPages,
) -> Result<(), DiskTestError> {
    let start = now_us();
    loop {
        match queue.submit(request, &buffers) {
            Ok(()) => break,
            Err(SubmitError::QueueFull) => {
                queue.poll_completions(&mut |_| {});
            }
            Err(SubmitError::Invalid) => {
                return Err(DiskTestError::Refused {
                    op: request.op,
                    sector: request.sector,
                })
            }
        }
        if now_us() - start > REQUEST_TIMEOUT_US {
            return Err(DiskTestError::QueueStayedFull {
                op: request.op,
                sector: request.sector,
            });
        }
    }
    let status = loop {
        let mut seen = None;
        queue.poll_completions(&mut |c| {
            if c.tag == request.tag {
                seen = Some(c.status);
            }
        });
        if let Some(status) = seen {
            break status;
        }
        if now_us() - start > REQUEST_TIMEOUT_US {
            return Err(DiskTestError::NoCompletion {
                op: request.op,
                sectors: request.nr_sectors,
                sector: request.sector,
            });
        }
    };
    if status == IoStatus::Ok {
        return Ok(());
    }
    Err(DiskTestError::DeviceAnswered {
        op: request.op,
        sectors: request.nr_sectors,
        sector: request.sector,
        status,
    })
}

fn exercise(job: &mut Job) -> Result<QueueReport, DiskTestError> {
    let geometry = job.queue.geometry();
    let mut report = QueueReport::default();
    let mut write = Buffer::new(BUFFER_PAGES)?;
    let mut read = Buffer::new(BUFFER_PAGES)?;
    let (write_pages, read_pages) = (write.access(), read.access());
    let params = job.params;
    let mut tag = 0u32;
    let mut data = alloc::vec![0u8; MAX_WRITE_BYTES];

    for w in Plan::new(
        params.seed,
        job.index,
        job.region_start,
        job.region_sectors,
        params.writes,
        MAX_WRITE_SECTORS,
    ) {
        let bytes = u64::from(w.sectors) * 512;
        let data = &mut data[..bytes as usize];
        pattern::fill(params.seed, job.index, w.index, w.sector * 512, data);
        // Shapes vary per write; every fourth write carries a pre-flush.
        let segments = write.layout(w.index, bytes);
        write_pages.scatter(segments, data);
        tag += 1;
        complete(
            &mut job.queue,
            &IoRequest {
                tag,
                op: IoOp::Write,
                sector: w.sector,
                nr_sectors: u64::from(w.sectors),
                preflush: geometry.flush && w.index % 4 == 3,
                segments,
            },
            write_pages,
        )?;
        tag += 1;
        let segments = read.layout(w.index + 1, bytes);
        complete(
            &mut job.queue,
            &IoRequest {
                tag,
                op: IoOp::Read,
                sector: w.sector,
                nr_sectors: u64::from(w.sectors),
                preflush: false,
                segments,
            },
            read_pages,
        )?;
        read_pages.gather(&read.segments, data);
        if let Some(at) =
            pattern::first_mismatch(params.seed, job.index, w.index, w.sector * 512, data)
        {
            return Err(DiskTestError::ReadBackDiffers {
                write: w.index,
                sectors: w.sectors,
                sector: w.sector,
                at,
            });
        }
        report.written_bytes += bytes;
    }
    if geometry.flush {
        tag += 1;
        complete(&mut job.queue, &flush_request(tag), DmaPages::NONE)?;
    }
    info!(
        "disktest: queue {} verified {} writes ({} KiB){}",
        job.index,
        params.writes,
        report.written_bytes / 1024,
        if geometry.flush { ", flushed" } else { "" }
    );
    if job.discard_tail {
        discard_tail(&mut job.queue, &geometry, &mut tag)?;
    }
    if params.bounce {
        tag += 1;
        bounce_refuses_foreign_buffers(job, read_pages, tag)?;
    }
    throughput(job, &mut read, &mut report, &mut tag)?;
    Ok(report)
}

fn flush_request(tag: u32) -> IoRequest<'static> {
    IoRequest {
        tag,
        op: IoOp::Flush,
        sector: 0,
        nr_sectors: 0,
        preflush: false,
        segments: &[],
    }
}

/// Through bounce buffers a read's data is copied out by the CPU on completion: a read
/// into a page that is not one of the request's buffers (the page just past `pages`)
/// must be refused at submit, never copied to. (Only through bounce buffers: a DMA
/// device takes buffer addresses as they are.)
fn bounce_refuses_foreign_buffers(
    job: &mut Job,
    pages: DmaPages,
    tag: u32,
) -> Result<(), DiskTestError> {
    let outside = [DmaSegment {
        buffer: pages.base + pages.pages as u64 * PAGE,
        offset: 0,
        len: PAGE as u32,
    }];
    let request = IoRequest {
        tag,
        op: IoOp::Read,
        sector: job.region_start,
        nr_sectors: PAGE / 512,
        preflush: false,
        segments: &outside,
    };
    if job.queue.submit(&request, &pages) != Err(SubmitError::Invalid) {
        return Err(DiskTestError::BounceAcceptedForeignBuffer);
    }
    info!(
        "disktest: queue {}: a read into a page outside its buffers is refused",
        job.index
    );
    Ok(())
}

/// Discards the tail (outside every write region) when the device offers discard.
fn discard_tail(
    queue: &mut Queue,
    geometry: &Geometry,
    tag: &mut u32,
) -> Result<(), DiskTestError> {
    let Some(discard) = geometry.discard else {
        return Ok(());
    };
    let granularity = u64::from(discard.granularity.max(512)) / 512;
    let start = (geometry.sectors - TAIL_SECTORS).div_ceil(granularity) * granularity;
    let sectors = (geometry.sectors - start) / granularity * granularity;
    *tag += 1;
    complete(
        queue,
        &IoRequest {
            tag: *tag,
            op: IoOp::Discard { secure: false },
            sector: start,
            nr_sectors: sectors,
            preflush: false,
            segments: &[],
        },
        DmaPages::NONE,
    )?;
    info!("disktest: discarded {sectors} sectors at sector {start}");
    Ok(())
}

/// Reads at queue depth: `count` requests of `bytes` from `next_sector()`.
fn reads_at_depth(
    queue: &mut Queue,
    buffer: &mut Buffer,
    bytes: u64,
    count: u64,
    tag: &mut u32,
    next_sector: &mut dyn FnMut() -> u64,
) -> Result<u64, DiskTestError> {
    let pages_each = (bytes / PAGE) as usize;
    let depth = queue
        .queue_depth()
        .min(buffer.pages / pages_each)
        .clamp(1, 16);
    let mut free_slots: Vec<usize> = (0..depth).collect();
    let pages = buffer.access();
    let first_tag = *tag + 1;
    *tag += depth as u32;
    let mut issued = 0u64;
    let mut done = 0u64;
    let start = now_us();
    let mut last_progress = start;
    while done < count {
        while issued < count {
            let Some(slot) = free_slots.pop() else { break };
            let segments = buffer.segments(slot * pages_each, bytes);
            let request = IoRequest {
                tag: first_tag + slot as u32,
                op: IoOp::Read,
                sector: next_sector(),
                nr_sectors: bytes / 512,
                preflush: false,
                segments,
            };
            match queue.submit(&request, &pages) {
                Ok(()) => issued += 1,
                Err(SubmitError::QueueFull) => {
                    free_slots.push(slot);
                    break;
                }
                Err(SubmitError::Invalid) => {
                    return Err(DiskTestError::ReadRefused {
                        sector: request.sector,
                    })
                }
            }
        }
        let mut failed = None;
        let finished = queue.poll_completions(&mut |c| {
            let slot = c.tag.wrapping_sub(first_tag) as usize;
            if slot < depth {
                free_slots.push(slot);
            }
            if c.status != IoStatus::Ok {
                failed = Some(c.status);
            }
        });
        if let Some(status) = failed {
            return Err(DiskTestError::ReadFailed(status));
        }
        done += finished as u64;
        let now = now_us();
        if finished > 0 {
            last_progress = now;
        } else if now - last_progress > REQUEST_TIMEOUT_US {
            return Err(DiskTestError::ReadsStalled {
                in_flight: issued - done,
            });
        }
    }
    Ok(now_us() - start)
}

fn throughput(
    job: &mut Job,
    buffer: &mut Buffer,
    report: &mut QueueReport,
    tag: &mut u32,
) -> Result<(), DiskTestError> {
    let params = job.params;
    let region_start = job.region_start;
    let pages = job.region_sectors / 8;
    let mut state = params.seed ^ 0x5151;
    let mut random_page = || {
        state = state.wrapping_add(pattern::GOLDEN);
        region_start + pattern::mix(state) % pages * 8
    };
    let count = u64::from(params.random_reads);
    report.random_us = reads_at_depth(&mut job.queue, buffer, PAGE, count, tag, &mut random_page)?;
    report.random_reads = count;

    let step = SEQUENTIAL_REQUEST_BYTES / 512;
    let requests = params.sequential_bytes / SEQUENTIAL_REQUEST_BYTES;
    let span = (job.region_sectors / step).max(1);
    let mut next = 0u64;
    let mut sequential = || {
        let sector = region_start + (next % span) * step;
        next += 1;
        sector
    };
    report.sequential_us = reads_at_depth(
        &mut job.queue,
        buffer,
        SEQUENTIAL_REQUEST_BYTES,
        requests,
        tag,
        &mut sequential,
    )?;
    report.sequential_bytes = requests * SEQUENTIAL_REQUEST_BYTES;
    info!(
        "disktest: queue {}: {} random 4 KiB reads in {} ms, {} MiB sequential in {} ms",
        job.index,
        count,
        report.random_us / 1000,
        report.sequential_bytes >> 20,
        report.sequential_us / 1000
    );
    Ok(())
}

/// Why the disk test failed (printed after "disktest: FAIL: ", which the tier-2 runner
/// reads).
#[derive(Debug)]
enum DiskTestError {
    Spec {
        spec: String,
        reason: String,
    },
    NotANumber {
        key: &'static str,
        text: String,
    },
    QueueCount {
        wanted: usize,
        cpus: usize,
    },
    Open(OpenError),
    TooSmall {
        sectors: u64,
    },
    SecondOpen(OpenError),
    SecondVirtioOpenAccepted,
    Region {
        spec: String,
        error: RegionError,
    },
    Slice(blkdev::SliceError),
    SliceEndNotRefused {
        sector: u64,
    },
    StartCpu {
        cpu: usize,
        error: crate::smp::RunError,
    },
    Unfinished,
    /// What of the shutdown after the test did not answer or failed.
    Shutdown(String),
    /// The queues that failed: (index, why; `None`: no result).
    Queues(Vec<(usize, Option<DiskTestError>)>),
    SecondOpenReadsWrong {
        write: u32,
        at: usize,
    },
    NoQueueForCpu(usize),
    NoDmaMemory,
    Refused {
        op: IoOp,
        sector: u64,
    },
    QueueStayedFull {
        op: IoOp,
        sector: u64,
    },
    NoCompletion {
        op: IoOp,
        sectors: u64,
        sector: u64,
    },
    DeviceAnswered {
        op: IoOp,
        sectors: u64,
        sector: u64,
        status: IoStatus,
    },
    ReadBackDiffers {
        write: u32,
        sectors: u32,
        sector: u64,
        at: usize,
    },
    ReadRefused {
        sector: u64,
    },
    ReadFailed(IoStatus),
    ReadsStalled {
        in_flight: u64,
    },
    BounceAcceptedForeignBuffer,
}

impl From<OpenError> for DiskTestError {
    fn from(error: OpenError) -> Self {
        DiskTestError::Open(error)
    }
}

impl fmt::Display for DiskTestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskTestError::Spec { spec, reason } => write!(f, "disktest={spec}: {reason}"),
            DiskTestError::NotANumber { key, text } => write!(f, "{key}={text} is not a number"),
            DiskTestError::QueueCount { wanted, cpus } => write!(
                f,
                "disktest.queues={wanted}: between 1 and the {cpus} online CPUs"
            ),
            DiskTestError::Open(error) => write!(f, "{error}"),
            DiskTestError::TooSmall { sectors } => {
                write!(f, "disk of {sectors} sectors is too small")
            }
            DiskTestError::SecondOpen(error) => write!(f, "second open: {error}"),
            DiskTestError::SecondVirtioOpenAccepted => {
                f.write_str("a second open of the virtio device was not refused")
            }
            DiskTestError::Region { spec, error } => write!(f, "disktest={spec}: {error}"),
            DiskTestError::Slice(error) => write!(f, "{error}"),
            DiskTestError::SliceEndNotRefused { sector } => write!(
                f,
                "a read at sector {sector}, past the slice's end, was not refused"
            ),
            DiskTestError::StartCpu { cpu, error } => {
                write!(f, "cannot start queue {cpu} on cpu {cpu}: {error:?}")
            }
            DiskTestError::Unfinished => f.write_str("a queue's CPU did not finish within 600 s"),
            DiskTestError::Shutdown(given_up) => write!(f, "shutdown: {given_up}"),
            DiskTestError::Queues(failures) => {
                for (n, (index, why)) in failures.iter().enumerate() {
                    if n > 0 {
                        f.write_str("; ")?;
                    }
                    match why {
                        Some(why) => write!(f, "queue {index}: {why}")?,
                        None => write!(f, "queue {index}: no result")?,
                    }
                }
                Ok(())
            }
            DiskTestError::SecondOpenReadsWrong { write, at } => {
                write!(f, "the second open reads write {write} wrong at byte {at}")
            }
            DiskTestError::NoQueueForCpu(cpu) => write!(f, "no queue for cpu {cpu}"),
            DiskTestError::NoDmaMemory => f.write_str("out of memory for DMA buffers"),
            DiskTestError::Refused { op, sector } => {
                write!(f, "{op:?} at sector {sector} refused as invalid")
            }
            DiskTestError::QueueStayedFull { op, sector } => {
                write!(f, "{op:?} at sector {sector}: queue stayed full")
            }
            DiskTestError::NoCompletion { op, sectors, sector } => write!(
                f,
                "{op:?} of {sectors} sectors at sector {sector}: no completion within {} s",
                REQUEST_TIMEOUT_US / 1_000_000
            ),
            DiskTestError::DeviceAnswered {
                op,
                sectors,
                sector,
                status,
            } => write!(
                f,
                "{op:?} of {sectors} sectors at sector {sector}: the device answered {status:?}"
            ),
            DiskTestError::ReadBackDiffers {
                write,
                sectors,
                sector,
                at,
            } => write!(
                f,
                "write {write} ({sectors} sectors at sector {sector}): read back differs at byte {at}"
            ),
            DiskTestError::ReadRefused { sector } => write!(f, "read at sector {sector} refused"),
            DiskTestError::ReadFailed(status) => write!(f, "read failed with {status:?}"),
            DiskTestError::BounceAcceptedForeignBuffer => {
                f.write_str("the bounce path accepted a read into a page outside the buffers")
            }
            DiskTestError::ReadsStalled { in_flight } => {
                write!(f, "reads stalled with {in_flight} in flight")
            }
        }
    }
}

impl core::error::Error for DiskTestError {}
