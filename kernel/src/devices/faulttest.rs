// SPDX-License-Identifier: MIT OR Apache-2.0
//! `faulttest=<target>`: device faults on real (QEMU's) devices, for tier 2. A test hook:
//! nothing runs unless the command line names it.
//!
//! The runner gives the image two disks: `<target>`, whose device fails one sector
//! (QEMU's blkdebug answers EIO for reads touching `faulttest.error-sector`), and
//! `faulttest.stall=<target>`, whose device never completes in time (QEMU's null-co with a
//! latency of `faulttest.late-ms`). The test checks, on one CPU, as one poller would:
//! - the read touching the failing sector, and only it, completes `Error`; the device
//!   keeps serving;
//! - a read on the stalling device completes `Error` after `device.timeout-ms` (and not
//!   long after), while the other device keeps serving reads all along;
//! - the stalling device's queue reports the timeout, with its bus mastering confirmed
//!   off; a later request there completes `Error` at once;
//! - when the stalling device does complete (its latency over), nothing reaches the
//!   read's buffer, painted before (null-co reads zeroes). QEMU's devices map a
//!   command's memory when they start it, so turning bus mastering off does not stop
//!   them: this holds through bounce buffers (`faulttest.bounce`, the path emulated
//!   devices take under Xen), whose failed queue never reuses the pages it held;
//! - the other device still serves.
//!
//! With `device.max-resets` > 0 the stalling device is recovered instead, as the control
//! path would (`Devices::recover` between polls): the overdue read is aborted or its
//! controller reset, and answered `Error` once the reset is done (QEMU finishes the
//! read first: bus mastering is off by then, and it lands in the bounce pool alone);
//! the queue does not fail; `faulttest.after-reset`, another namespace of the stalling
//! controller, serves reads within the deadline after the reset, and the stalled disk
//! itself serves a read given a deadline beyond its latency (null-co delays every
//! read). QEMU 10.0's blkdebug cannot delay a single request.
//!
//! Ends with `faulttest: PASS` or `faulttest: FAIL: <why>` and the matching exit status.

use super::dma_pages::DmaPages;
use super::hal::{self, now_us};
use super::open::{Devices, OpenOptions, PciBus, Queue};
use crate::power;
use alloc::format;
use alloc::string::String;
use blkdev::{DmaSegment, FaultKind, IoOp, IoRequest, IoStatus};
use bootconfig::{Cmdline, Config, Key};
use log::{error, info};

const PAGE: u64 = 4096;
/// Sectors per read (one page).
const READ_SECTORS: u64 = 8;
/// What the stalled read's page holds before, and must hold after.
const PAINT: u8 = 0xa5;

/// Runs the fault test and powers off with its verdict; a command may take
/// `device.timeout-ms=`, and a device is recovered as `device.max-resets=` says.
pub fn fault_test(spec: &str, cmdline: &Cmdline, config: &Config, bus: PciBus) -> ! {
    let verdict = match run(spec, cmdline, config, bus) {
        Ok(()) => {
            info!("faulttest: PASS");
            power::Verdict::Pass
        }
        Err(why) => {
            error!("faulttest: FAIL: {why}");
            power::Verdict::Fail
        }
    };
    power::report_verdict(verdict);
    power::power_off()
}

fn number(cmdline: &Cmdline, key: Key, default: u64) -> Result<u64, String> {
    match cmdline.value(key) {
        None => Ok(default),
        Some(text) => text
            .parse()
            .map_err(|_| format!("{}={text}: want a whole number", key.name())),
    }
}

/// One page of DMA memory and its one segment.
struct Page {
    pages: DmaPages,
    segment: [DmaSegment; 1],
}

impl Page {
    fn new() -> Result<Page, String> {
        let base = hal::allocate_dma(1).ok_or("no DMA memory")?;
        Ok(Page {
            pages: DmaPages { base, pages: 1 },
            segment: [DmaSegment {
                buffer: base,
                offset: 0,
                len: PAGE as u32,
            }],
        })
    }

    fn read(&self, tag: u32, sector: u64) -> IoRequest<'_> {
        IoRequest {
            tag,
            op: IoOp::Read,
            sector,
            nr_sectors: READ_SECTORS,
            preflush: false,
            segments: &self.segment,
        }
    }

    fn fill(&self, byte: u8) {
        self.pages.scatter(&self.segment, &[byte; PAGE as usize]);
    }

    fn holds_only(&self, byte: u8) -> bool {
        let mut data = [0u8; PAGE as usize];
        self.pages.gather(&self.segment, &mut data);
        data.iter().all(|&b| b == byte)
    }
}

/// The clock a poller gives its rings (ns).
fn now_ns() -> u64 {
    now_us() * 1000
}

/// Submits `request` on `queue` and polls until its completion (ticking the queue with
/// the deadline `timeout_ns`, as a poller does), for at most `limit_us`.
fn complete(
    queue: &mut Queue,
    request: &IoRequest<'_>,
    pages: &DmaPages,
    limit_us: u64,
    timeout_ns: u64,
) -> Result<IoStatus, String> {
    queue
        .submit(request, pages)
        .map_err(|e| format!("read of sector {} not submitted: {e}", request.sector))?;
    let start = now_us();
    loop {
        let mut status = None;
        queue.poll_completions(&mut |c| {
            if c.tag == request.tag {
                status = Some(c.status);
            }
        });
        if let Some(status) = status {
            return Ok(status);
        }
        queue.tick(now_ns(), timeout_ns);
        if now_us() - start > limit_us {
            return Err(format!(
                "read of sector {} got no completion in {} ms",
                request.sector,
                limit_us / 1000
            ));
        }
    }
}

fn open_one(devices: &mut Devices, spec: &str, bounce: bool) -> Result<Queue, String> {
    let backing =
        backing::parse_backing(spec).map_err(|e| format!("faulttest target {spec:?}: {e}"))?;
    let options = OpenOptions {
        bounce,
        ..OpenOptions::default()
    };
    let disk = devices
        .open(backing, 1, options)
        .map_err(|e| format!("{spec}: {e}"))?;
    info!("faulttest: {spec}: {}", disk.description);
    disk.queues
        .into_iter()
        .next()
        .ok_or_else(|| format!("{spec}: no queue"))
}

fn run(spec: &str, cmdline: &Cmdline, config: &Config, bus: PciBus) -> Result<(), String> {
    hal::calibrate_clock();
    let timeout_ns = config.device_timeout_ns;
    let recovers = config.device_max_resets > 0;
    let error_sector = number(cmdline, Key::FaulttestErrorSector, 2048)?;
    let stall_sector = number(cmdline, Key::FaulttestStallSector, 0)?;
    let late_ms = number(cmdline, Key::FaulttestLateMs, 0)?;
    let timeout_ms = timeout_ns / 1_000_000;
    if timeout_ms == 0 || error_sector < READ_SECTORS {
        return Err("faulttest needs device.timeout-ms > 0 and faulttest.error-sector >= 8".into());
    }
    let mut devices = Devices::new(bus, super::recovery(config.device_max_resets));
    let mut failing = open_one(&mut devices, spec, false)?;
    let page = Page::new()?;
    // 1. A device error: the read touching the sector fails, its neighbours do not.
    let limit = 10_000_000;
    for (tag, sector, want) in [
        (1, error_sector - READ_SECTORS, IoStatus::Ok),
        (2, error_sector, IoStatus::Error),
        (3, error_sector + READ_SECTORS, IoStatus::Ok),
    ] {
        let got = complete(
            &mut failing,
            &page.read(tag, sector),
            &page.pages,
            limit,
            timeout_ns,
        )?;
        if got != want {
            return Err(format!(
                "{spec}: read of sector {sector} completed {got:?}, expected {want:?}"
            ));
        }
    }
    if let Some(fault) = failing.fault() {
        return Err(format!(
            "{spec}: an I/O error failed the whole device: {fault}"
        ));
    }
    info!(
        "faulttest: {spec}: the read of sector {error_sector} answered Error, the reads around it Ok; the device serves on"
    );

    // 2. A stalled command, while the other device keeps serving.
    let Some(stall_spec) = cmdline.value(Key::FaulttestStall) else {
        return Ok(());
    };
    let mut stalling = open_one(&mut devices, stall_spec, cmdline.has(Key::FaulttestBounce))?;
    // With recovery: another disk of the stalling device, serving before its reset too.
    let mut after = match cmdline.value(Key::FaulttestAfterReset) {
        Some(after_spec) if recovers => {
            let mut after = open_one(&mut devices, after_spec, false)?;
            after.tick(now_ns(), timeout_ns);
            read_ok(
                (after_spec, &mut after),
                page.read(199, 0),
                &page,
                limit,
                timeout_ns,
            )?;
            Some((after_spec, after))
        }
        _ => None,
    };
    let stalled = Page::new()?;
    stalled.fill(PAINT);
    stalling.tick(now_ns(), timeout_ns);
    let start = now_us();
    stalling
        .submit(&stalled.read(10, stall_sector), &stalled.pages)
        .map_err(|e| format!("{stall_spec}: read not submitted: {e}"))?;
    let mut served = 0u64;
    let mut tag = 100;
    let status = loop {
        let mut status = None;
        stalling.poll_completions(&mut |c| status = Some((c.tag, c.status)));
        stalling.tick(now_ns(), timeout_ns);
        if let Some(done) = status {
            break done;
        }
        // The control path's part: an abort, a reset (this call waits for it).
        devices.recover(now_ns());
        tag += 1;
        let got = complete(
            &mut failing,
            &page.read(tag, 0),
            &page.pages,
            limit,
            timeout_ns,
        )?;
        if got != IoStatus::Ok {
            return Err(format!(
                "{spec}: a read completed {got:?} while {stall_spec} stalled"
            ));
        }
        served += 1;
        if now_us() - start > (timeout_ms + late_ms + 10_000) * 1000 {
            return Err(format!(
                "{stall_spec}: the stalled read got no answer in {} ms (deadline {timeout_ms} ms)",
                (now_us() - start) / 1000
            ));
        }
    };
    let waited_ms = (now_us() - start) / 1000;
    if status != (10, IoStatus::Error) {
        return Err(format!(
            "{stall_spec}: the stalled read completed {status:?} after {waited_ms} ms"
        ));
    }
    if recovers {
        let (after_spec, mut after) = after
            .take()
            .ok_or("faulttest: recovery needs faulttest.after-reset")?;
        return recovered(
            (spec, &mut failing, &page),
            (stall_spec, &mut stalling, &stalled),
            (after_spec, &mut after),
            &mut devices,
            (waited_ms, served, timeout_ns, late_ms),
        );
    }
    // Given up between the deadline and one scan later; TCG's slowness on top.
    let latest = timeout_ms + cmdslots::scan_interval(timeout_ns) / 1_000_000 + 2_000;
    if waited_ms < timeout_ms || waited_ms > latest {
        return Err(format!(
            "{stall_spec}: the stalled read was answered after {waited_ms} ms, expected {timeout_ms}..={latest} ms"
        ));
    }
    let fault = stalling
        .fault()
        .ok_or_else(|| format!("{stall_spec}: no fault reported"))?;
    if !matches!(fault.kind, FaultKind::Timeout { .. }) || !fault.dma_stopped {
        return Err(format!("{stall_spec}: fault {fault:?}"));
    }
    info!(
        "faulttest: {stall_spec}: the stalled read answered Error after {waited_ms} ms (deadline {timeout_ms} ms): {fault}; {spec} served {served} reads meanwhile"
    );
    let before = now_us();
    let got = complete(
        &mut stalling,
        &page.read(11, 0),
        &page.pages,
        1_000_000,
        timeout_ns,
    )?;
    if got != IoStatus::Error {
        return Err(format!(
            "{stall_spec}: a read after the fault completed {got:?}"
        ));
    }
    info!(
        "faulttest: {stall_spec}: a later read answered Error in {} us, without the device",
        now_us() - before
    );

    // 3. The device completes after all: nothing may land in the painted page.
    if late_ms > 0 {
        while now_us() - start < (late_ms + 1_000) * 1000 {
            stalling.poll_completions(&mut |c| {
                error!("faulttest: {stall_spec}: late completion of tag {}", c.tag)
            });
        }
        if !stalled.holds_only(PAINT) {
            return Err(format!(
                "{stall_spec}: the device completed the stalled read after {late_ms} ms and its data reached memory"
            ));
        }
        info!(
            "faulttest: {stall_spec}: the device completed the stalled read after {late_ms} ms: nothing reached memory"
        );
    }

    // 4. The other device was never touched by it.
    let got = complete(
        &mut failing,
        &page.read(tag + 1, 0),
        &page.pages,
        limit,
        timeout_ns,
    )?;
    if got != IoStatus::Ok || failing.fault().is_some() {
        return Err(format!(
            "{spec}: after {stall_spec} failed: {got:?}, {:?}",
            failing.fault()
        ));
    }
    info!("faulttest: {spec} still serves");
    Ok(())
}

/// The stalled read was answered (`Error`, after `waited_ms`) with recovery on: its
/// device was recovered, not given up. Checks what that means, on the device and
/// around it.
fn recovered(
    (spec, failing, page): (&str, &mut Queue, &Page),
    (stall_spec, stalling, stalled): (&str, &mut Queue, &Page),
    (after_spec, after): (&str, &mut Queue),
    devices: &mut Devices,
    (waited_ms, served, timeout_ns, late_ms): (u64, u64, u64, u64),
) -> Result<(), String> {
    let timeout_ms = timeout_ns / 1_000_000;
    // Answered once the reset is done, which QEMU holds until its read is over.
    let latest = timeout_ms.max(late_ms)
        + cmdslots::scan_interval(timeout_ns) / 1_000_000
        + cmdslots::recovery::ABORT_WAIT_NS / 1_000_000
        + 2_000;
    if waited_ms < timeout_ms || waited_ms > latest {
        return Err(format!(
            "{stall_spec}: the stalled read was answered after {waited_ms} ms, expected {timeout_ms}..={latest} ms"
        ));
    }
    if let Some(fault) = stalling.fault() {
        return Err(format!(
            "{stall_spec}: failed instead of recovering: {fault}"
        ));
    }
    if devices.recover(now_ns()).is_some() {
        return Err(format!("{stall_spec}: its recovery is not over"));
    }
    info!(
        "faulttest: {stall_spec}: the stalled read answered Error after {waited_ms} ms (deadline {timeout_ms} ms), the device recovered; {spec} served {served} reads meanwhile"
    );
    if !stalled.holds_only(PAINT) {
        return Err(format!(
            "{stall_spec}: the stalled read's data reached memory"
        ));
    }
    info!("faulttest: {stall_spec}: nothing of the stalled read reached memory");
    // Another namespace of the same controller, its queue made again by the reset:
    // served within the deadline.
    for tag in 0..8 {
        let read = page.read(200 + tag, u64::from(tag) * 8);
        read_ok((after_spec, after), read, page, 5_000_000, timeout_ns)?;
    }
    info!("faulttest: {after_spec}: 8 reads after the reset answered Ok within the deadline");
    // The stalled disk itself, given a deadline beyond its latency.
    let patient = (late_ms + timeout_ms) * 2_000_000;
    let before = now_us();
    let limit = patient / 1000 + 5_000_000;
    read_ok(
        (stall_spec, stalling),
        page.read(300, 0),
        page,
        limit,
        patient,
    )?;
    info!(
        "faulttest: {stall_spec}: a read after the reset answered Ok in {} ms",
        (now_us() - before) / 1000
    );
    read_ok(
        (spec, failing),
        page.read(400, 0),
        page,
        10_000_000,
        timeout_ns,
    )?;
    info!("faulttest: {spec} still serves");
    Ok(())
}

/// Reads `read` on the `queue` of the disk `spec` (as `complete`): it must answer `Ok`,
/// the queue not failed.
fn read_ok(
    (spec, queue): (&str, &mut Queue),
    read: IoRequest<'_>,
    page: &Page,
    limit_us: u64,
    timeout_ns: u64,
) -> Result<(), String> {
    let got = complete(queue, &read, &page.pages, limit_us, timeout_ns)?;
    match (got, queue.fault()) {
        (IoStatus::Ok, None) => Ok(()),
        (got, fault) => Err(format!(
            "{spec}: the read of sector {} completed {got:?}, fault {fault:?}",
            read.sector
        )),
    }
}
