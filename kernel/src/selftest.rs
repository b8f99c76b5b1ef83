// SPDX-License-Identifier: MIT OR Apache-2.0
//! In-kernel self-tests, run with the `selftest` command-line switch under plain QEMU
//! (test tier 2). Each test prints `selftest: <name> ... ok` or `... FAILED: <why>`; the
//! summary line `selftest: N passed, M failed` and the `isa-debug-exit` verdict follow.
//! `selftest.inject-failure` adds a test that must fail, so the runner's own test can
//! prove a failing self-test is caught.

use crate::arch::{paging, trap};
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt::Write;
use x86_64::structures::paging::PageTableFlags;

type TestResult = Result<(), heapless_string::Message>;
type SelfTest = (&'static str, fn() -> TestResult);

/// A short, fixed-capacity failure message (no heap needed to report a heap failure).
mod heapless_string {
    pub struct Message {
        buf: [u8; 96],
        len: usize,
    }

    impl Message {
        pub fn new() -> Self {
            Message {
                buf: [0; 96],
                len: 0,
            }
        }

        pub fn as_str(&self) -> &str {
            core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?")
        }
    }

    impl core::fmt::Write for Message {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let take = s.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
            self.len += take;
            Ok(())
        }
    }
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            let mut message = heapless_string::Message::new();
            let _ = write!(message, $($fmt)+);
            return Err(message);
        }
    };
}

/// Boxes, a growing vector and a page-aligned allocation; everything freed comes back.
fn heap_allocations() -> TestResult {
    let before = crate::mm::heap_used();
    {
        let boxed = Box::new(0xb10c_d0a1u64);
        check!(*boxed == 0xb10c_d0a1, "box holds {:#x}", *boxed);
        let mut v: Vec<u64> = Vec::new();
        for i in 0..128 * 1024 {
            v.push(i * 7);
        }
        check!(
            v.iter().enumerate().all(|(i, x)| *x == i as u64 * 7),
            "vector contents differ"
        );
        let layout = core::alloc::Layout::from_size_align(8192, 4096).expect("valid layout");
        let page = raw_alloc::alloc_zeroed(layout);
        check!(
            !page.is_null() && (page as usize).is_multiple_of(4096),
            "aligned alloc returned {:p}",
            page
        );
        raw_alloc::dealloc(page, layout);
        check!(
            crate::mm::heap_used() > before,
            "heap use did not grow while allocated"
        );
    }
    let after = crate::mm::heap_used();
    check!(
        after == before,
        "heap use {} after freeing, {} before",
        after,
        before
    );
    Ok(())
}

/// The global allocator behind `alloc`'s safe wrappers, for the aligned-allocation check.
mod raw_alloc {
    use alloc::alloc::Layout;

    pub fn alloc_zeroed(layout: Layout) -> *mut u8 {
        // SAFETY: the layout has a non-zero size.
        unsafe { alloc::alloc::alloc_zeroed(layout) }
    }

    pub fn dealloc(ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc_zeroed` with the same layout.
        unsafe { alloc::alloc::dealloc(ptr, layout) }
    }
}

/// Frames are distinct, aligned, zero-able through the identity map, and come back.
fn frame_allocation() -> TestResult {
    let free_before = crate::mm::free_frame_bytes();
    let mut frames = [0u64; 16];
    for slot in frames.iter_mut() {
        *slot = crate::mm::allocate_frame().map_err(|e| {
            let mut m = heapless_string::Message::new();
            let _ = write!(m, "allocate_frame: {e:?}");
            m
        })?;
    }
    let mut sorted = frames;
    sorted.sort_unstable();
    check!(
        sorted.windows(2).all(|w| w[0] != w[1]),
        "a frame was handed out twice"
    );
    check!(
        frames.iter().all(|f| f % 4096 == 0 && *f >= 1 << 20),
        "misaligned or low frame"
    );
    check!(
        crate::mm::free_frame_bytes() == free_before - 16 * 4096,
        "free memory did not drop by 16 frames"
    );
    for f in frames {
        let _ = crate::mm::free_frame(f);
    }
    check!(
        crate::mm::free_frame_bytes() == free_before,
        "frames did not all come back"
    );
    Ok(())
}

/// A fresh frame mapped at an address nothing else uses: writes through the new mapping
/// show through the identity map; after unmapping, a read faults with that address.
fn page_table_mapping() -> TestResult {
    const TEST_VIRT: u64 = 0x0000_4000_0000_0000;
    let frame = crate::mm::allocate_frame().map_err(|_| heapless_string::Message::new())?;
    let flags = PageTableFlags::WRITABLE | PageTableFlags::NO_EXECUTE;
    let mapped = paging::map_page(TEST_VIRT, frame, flags);
    check!(mapped.is_ok(), "map_page: {:?}", mapped);
    check!(
        paging::translate(TEST_VIRT + 0x123) == Some(frame + 0x123),
        "translate disagrees"
    );
    let pattern = 0x5eed_1234_abcd_0000u64;
    for i in 0..512u64 {
        // SAFETY: TEST_VIRT..+4 KiB was just mapped to `frame`, which nothing else uses.
        unsafe { core::ptr::write_volatile((TEST_VIRT + i * 8) as *mut u64, pattern + i) };
    }
    for i in 0..512u64 {
        // SAFETY: `frame` is identity mapped and owned by this test.
        let seen = unsafe { core::ptr::read_volatile((frame + i * 8) as *const u64) };
        check!(
            seen == pattern + i,
            "word {} reads {:#x} through the identity map",
            i,
            seen
        );
    }
    let unmapped = paging::unmap_page(TEST_VIRT);
    check!(
        unmapped.as_ref().ok() == Some(&frame),
        "unmap_page: {:?}",
        unmapped
    );
    let fault = trap::probe_read(TEST_VIRT + 8);
    let _ = crate::mm::free_frame(frame);
    match fault {
        Err(f) => {
            check!(f.vector == 14, "caught vector {} instead of #PF", f.vector);
            check!(f.address == TEST_VIRT + 8, "CR2 {:#x}", f.address);
            check!(
                f.error_code & 1 == 0,
                "error code {:#x} says present",
                f.error_code
            );
        }
        Ok(v) => check!(false, "read of an unmapped page returned {:#x}", v),
    }
    Ok(())
}

/// `int3` reaches the breakpoint handler and execution continues after it.
fn exception_breakpoint() -> TestResult {
    let before = trap::breakpoint_count();
    x86_64::instructions::interrupts::int3();
    check!(
        trap::breakpoint_count() == before + 1,
        "breakpoint handler did not run"
    );
    Ok(())
}

/// `ud2` raises #UD, which the handler catches and resumes from.
fn exception_invalid_opcode() -> TestResult {
    match trap::probe_invalid_opcode() {
        Err(f) => check!(f.vector == 6, "caught vector {} instead of #UD", f.vector),
        Ok(()) => check!(false, "ud2 did not fault"),
    }
    Ok(())
}

/// A read of an address no page table maps raises #PF with CR2 = that address.
fn exception_page_fault() -> TestResult {
    let addr = 0x0000_7fff_dead_b000u64;
    match trap::probe_read(addr) {
        Err(f) => {
            check!(f.vector == 14, "caught vector {} instead of #PF", f.vector);
            check!(
                f.address == addr,
                "CR2 {:#x}, expected {:#x}",
                f.address,
                addr
            );
        }
        Ok(v) => check!(false, "read returned {:#x}", v),
    }
    Ok(())
}

const TEST_VECTOR: u8 = 0x40;
static TEST_VECTOR_HITS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

fn count_test_vector(frame: &mut trap::TrapFrame) {
    if frame.vector == u64::from(TEST_VECTOR) {
        TEST_VECTOR_HITS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    }
}

/// A registered handler runs for its vector (`int 0x40`), and execution continues.
fn interrupt_handler_dispatch() -> TestResult {
    trap::set_interrupt_handler(TEST_VECTOR, count_test_vector);
    let before = TEST_VECTOR_HITS.load(core::sync::atomic::Ordering::Relaxed);
    // SAFETY: vector 0x40 has a gate to our stub and a registered handler that only
    // counts; the software interrupt returns to the next instruction.
    unsafe { core::arch::asm!("int 0x40") };
    let after = TEST_VECTOR_HITS.load(core::sync::atomic::Ordering::Relaxed);
    check!(after == before + 1, "handler ran {} times", after - before);
    Ok(())
}

static RAN_ON: [core::sync::atomic::AtomicU32; crate::smp::MAX_CPUS] =
    [const { core::sync::atomic::AtomicU32::new(u32::MAX) }; crate::smp::MAX_CPUS];

fn record_cpu(index: usize) {
    let me = crate::smp::current()
        .index
        .load(core::sync::atomic::Ordering::Relaxed);
    RAN_ON[index].store(me, core::sync::atomic::Ordering::Release);
}

/// Every online CPU runs work handed to it (woken from `hlt` by an IPI) and reports its
/// own index through its per-CPU data; with `selftest.expect-cpus=N`, N must be online.
fn smp_run_on_every_cpu(expected_cpus: Option<usize>) -> TestResult {
    let online = crate::smp::online_count();
    if let Some(expected) = expected_cpus {
        check!(
            online == expected,
            "{} CPUs online, expected {}",
            online,
            expected
        );
    }
    for (index, ran_on) in RAN_ON.iter().enumerate().take(online) {
        let result = crate::smp::run_on(index, record_cpu, 1000);
        check!(result.is_ok(), "cpu {}: {:?}", index, result);
        let seen = ran_on.load(core::sync::atomic::Ordering::Acquire);
        check!(
            seen == index as u32,
            "work for cpu {} ran on cpu {}",
            index,
            seen
        );
        check!(
            index == 0 || crate::smp::wakeups(index) > 0,
            "cpu {} was never woken by IPI",
            index
        );
    }
    Ok(())
}

static LOOPBACK_HITS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
static LOOPBACK_CPU: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(u32::MAX);

fn on_loopback_event(_port: u32, _context: usize) {
    let me = crate::smp::current()
        .index
        .load(core::sync::atomic::Ordering::Relaxed);
    LOOPBACK_CPU.store(me, core::sync::atomic::Ordering::Release);
    LOOPBACK_HITS.fetch_add(1, core::sync::atomic::Ordering::AcqRel);
}

/// Xen only: an event channel connected to ourselves, its receiving end bound to the
/// last vCPU; sending on the other end runs the handler on that vCPU.
fn xen_event_channel_loopback() -> TestResult {
    use crate::xen_domain;
    use xen::abi::DOMID_SELF;
    let Some(xen) = xen_domain::get() else {
        check!(false, "platform not initialised");
        return Ok(());
    };
    let target = (crate::smp::online_count() - 1) as u32;
    let unbound = xen::evtchn::alloc_unbound(&xen.hv, DOMID_SELF);
    check!(unbound.is_ok(), "alloc_unbound: {:?}", unbound);
    let sender = unbound.unwrap_or_default();
    let bound = xen::evtchn::bind_interdomain(&xen.hv, DOMID_SELF, sender);
    check!(bound.is_ok(), "bind_interdomain: {:?}", bound);
    let receiver = bound.unwrap_or_default();
    let registered = xen_domain::events::register(receiver, target, on_loopback_event, 0);
    check!(
        registered.is_ok(),
        "register on vCPU {}: {:?}",
        target,
        registered
    );
    let before = LOOPBACK_HITS.load(core::sync::atomic::Ordering::Acquire);
    let sent = xen::evtchn::send(&xen.hv, sender);
    check!(sent.is_ok(), "send: {:?}", sent);
    // Up to 2 s of Xen time: the event crosses to another vCPU (and, nested, to another
    // emulated CPU), so a fixed spin count is no bound.
    let deadline = xen.now_ns() + 2_000_000_000;
    let mut fired = false;
    while xen.now_ns() < deadline {
        if LOOPBACK_HITS.load(core::sync::atomic::Ordering::Acquire) > before {
            fired = true;
            break;
        }
        core::hint::spin_loop();
    }
    let (pending, masked) = (
        xen.shared.is_pending(receiver),
        xen.shared.is_masked(receiver),
    );
    let upcall_pending = xen.vcpu_info(target as usize).map(|v| v.upcall_pending());
    xen_domain::events::unregister(receiver, target);
    let _ = xen::evtchn::close(&xen.hv, receiver);
    let _ = xen::evtchn::close(&xen.hv, sender);
    check!(
        fired,
        "event on port {} never arrived (upcalls/dispatches on vCPU {}: {:?}; pending {} masked {} upcall_pending {:?})",
        receiver,
        target,
        xen_domain::events::counters(target as usize),
        pending,
        masked,
        upcall_pending
    );
    let on = LOOPBACK_CPU.load(core::sync::atomic::Ordering::Acquire);
    check!(
        on == target,
        "handler ran on vCPU {}, expected {}",
        on,
        target
    );
    Ok(())
}

/// Xen only: a key written to our xenstore home reads back, and a watch on it fires
/// (once when registered, as xenstored always does, and again on our own write).
fn xen_xenstore_write_read_watch() -> TestResult {
    use testhooks::keys::SELFTEST;
    use xen::xenstore::Transaction;
    let result = crate::xen_domain::store::with(|xs| {
        let tx = Transaction::NONE;
        xs.watch(SELFTEST, "selftest")?;
        let initial = xs.wait_watch_event()?;
        xs.write(tx, SELFTEST, b"written-by-blkdom")?;
        let value = xs.read_string(tx, SELFTEST)?;
        let fired = xs.wait_watch_event()?;
        xs.unwatch(SELFTEST, "selftest")?;
        Ok::<_, xen::xenstore::XsError>((initial, value, fired))
    });
    let Some(result) = result else {
        check!(false, "no xenstore connection");
        return Ok(());
    };
    check!(result.is_ok(), "xenstore: {:?}", result.as_ref().err());
    let Ok((initial, value, fired)) = result else {
        return Ok(());
    };
    check!(value == "written-by-blkdom", "read back {:?}", value);
    check!(
        initial.token == "selftest" && fired.token == "selftest",
        "tokens {:?} {:?}",
        initial.token,
        fired.token
    );
    check!(
        fired.path.ends_with(SELFTEST),
        "watch fired for {:?}",
        fired.path
    );
    Ok(())
}

/// Xen only, with the rig: after reading the key of the xenstore test, dom0 writes
/// `data/blkdom-ack = seen`; our watch must deliver that (a dom0 write seen by a watch).
fn xen_watch_sees_dom0_write() -> TestResult {
    use testhooks::keys::ACK;
    use xen::xenstore::Transaction;
    let seen = crate::xen_domain::store::with(|xs| {
        xs.watch(ACK, "ack")?;
        // Each wait is bounded by the client's timeout; about two minutes in all.
        let mut seen = false;
        for _ in 0..12 {
            let event = xs.wait_watch_event();
            if event.is_ok()
                && xs
                    .read_string(Transaction::NONE, ACK)
                    .is_ok_and(|v| v.trim() == "seen")
            {
                seen = true;
                break;
            }
        }
        xs.unwatch(ACK, "ack")?;
        Ok::<_, xen::xenstore::XsError>(seen)
    });
    check!(
        matches!(seen, Some(Ok(true))),
        "no dom0 write seen: {:?}",
        seen
    );
    Ok(())
}

/// Exists only to prove the runner notices a failing self-test.
/// Both bulk copies of `arch::copy` move exactly the bytes asked for.
fn bulk_copies() -> TestResult {
    if let Err((way, len, offset)) = crate::arch::copy::self_check() {
        check!(false, "{way}: {len} bytes at offset {offset} copied wrong");
    }
    Ok(())
}

/// The `crc32` instruction computes the NVMe/TCP digest as the table does (where the
/// CPU has SSE4.2; without it there is nothing to check).
fn crc32c_instruction() -> TestResult {
    match crate::arch::crc32c::self_check() {
        Ok(checked) => {
            if !checked {
                log::info!("selftest: crc32c: no SSE4.2, the table alone");
            }
        }
        Err((len, start)) => check!(
            false,
            "crc32 instruction: {len} bytes at offset {start} differ from the table"
        ),
    }
    Ok(())
}

fn injected_failure() -> TestResult {
    check!(false, "deliberate failure (selftest.inject-failure)");
    Ok(())
}

/// Runs the self-tests; returns (passed, failed).
pub fn run(
    inject_failure: bool,
    expected_cpus: Option<usize>,
    under_xen: bool,
    await_dom0: bool,
) -> (u32, u32) {
    let mut tests: Vec<SelfTest> = alloc::vec![
        ("heap.allocations", heap_allocations),
        ("frames.allocate-free", frame_allocation),
        ("paging.map-unmap", page_table_mapping),
        ("exception.breakpoint", exception_breakpoint),
        ("exception.invalid-opcode", exception_invalid_opcode),
        ("exception.page-fault", exception_page_fault),
        ("interrupt.handler-dispatch", interrupt_handler_dispatch),
        ("copy.both-ways", bulk_copies),
        ("crc32c.instruction", crc32c_instruction),
    ];
    if under_xen {
        tests.push(("xen.event-channel-loopback", xen_event_channel_loopback));
        tests.push((
            "xen.xenstore-write-read-watch",
            xen_xenstore_write_read_watch,
        ));
        if await_dom0 {
            tests.push(("xen.watch-sees-dom0-write", xen_watch_sees_dom0_write));
        }
    }
    if inject_failure {
        tests.push(("selftest.injected-failure", injected_failure));
    }
    let (mut passed, mut failed) = (0, 0);
    let smp_test = move || smp_run_on_every_cpu(expected_cpus);
    let all = tests
        .iter()
        .map(|(name, test)| (*name, test as &dyn Fn() -> TestResult));
    for (name, test) in all.chain(core::iter::once((
        "smp.run-on-every-cpu",
        &smp_test as &dyn Fn() -> TestResult,
    ))) {
        match test() {
            Ok(()) => {
                passed += 1;
                log::info!("{name} ... ok");
            }
            Err(message) => {
                failed += 1;
                log::error!("{name} ... FAILED: {}", message.as_str());
            }
        }
    }
    log::info!("{passed} passed, {failed} failed");
    (passed, failed)
}
