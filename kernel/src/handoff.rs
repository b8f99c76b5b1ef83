// SPDX-License-Identifier: MIT OR Apache-2.0
//! A live upgrade's switch (docs/design.md §4.12, 4-5): on the old image, the domain's
//! part of the handover block, the park area written, the other vCPUs parked and the
//! jump; on the new image, the handover module found, checked and adopted, and the
//! parked vCPUs released. The bytes are built by `handover::park` (host-tested), the
//! code that runs from the park area is `arch::jump`'s.

use alloc::vec::Vec;
use core::convert::Infallible;
use core::sync::atomic::Ordering;

use handover::block::{Handover, Limits, MemRange, RangeKind};
use handover::image::{BuildId, CheckedImage, LOAD_WINDOW};
use handover::park::{self, Module, StartInfo, TrampolineParams, PARK_BASE, PARK_LEN};

use crate::arch::jump;
use crate::bootinfo::BootInfo;
use crate::{smp, version, xen_domain};

/// What the old image has ready when it jumps: the staged image (checked), and the
/// handover block with the disks' and rings' part filled (`vbds`, `ram_disks` and their
/// memory ranges; the domain's part is filled here).
pub struct Prepared {
    pub staged: Vec<u8>,
    pub image: CheckedImage,
    pub handover: Handover,
}

/// Why the jump did not happen (before the point of no return: the old image serves on).
#[derive(Debug)]
pub enum JumpError {
    NoBootInfo,
    NoBuildId,
    ParkNotRam,
    Park(park::ParkError),
    /// The handover block would be refused by the next image (why).
    Block(alloc::string::String),
}

impl core::fmt::Display for JumpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            JumpError::NoBootInfo => f.write_str("no boot information kept"),
            JumpError::NoBuildId => f.write_str("this image has no build id"),
            JumpError::ParkNotRam => write!(
                f,
                "the park area {PARK_BASE:#x}+{PARK_LEN:#x} is not RAM in the memory map"
            ),
            JumpError::Park(e) => write!(f, "park area: {e}"),
            JumpError::Block(why) => write!(f, "handover block: {why}"),
        }
    }
}

/// How long vCPU 0 waits for each other vCPU to park (generous: a vCPU of a nested
/// guest may not run for a while).
const PARK_WAIT_MS: u64 = 5000;

/// The module's bytes, copied once (the block is checked on the copy).
pub fn read_module(paddr: u64, len: u64) -> Vec<u8> {
    let mut bytes = alloc::vec![0u8; len as usize];
    // SAFETY: `park::find_handover` checked the module lies in RAM below the identity
    // map's end; the memory is the loader's module, kept out of the frame allocator and
    // written by nobody now; read into a buffer of our own.
    unsafe { crate::physmem::read(paddr, &mut bytes) };
    bytes
}

/// Whether this image still owes dom0 its `done` answer (booted from a handover).
static ANSWER_DUE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(true);

pub fn answer_due() -> bool {
    booted_from().is_some() && ANSWER_DUE.load(Ordering::Acquire)
}

/// The request node's value when this image said `done`: the request that started it,
/// which dom0's tool removes only after reading `done`. Not to be taken again while the
/// node still holds it (`ServedRequest`).
static SERVED_REQUEST: spin::Mutex<handover::receive::ServedRequest> =
    spin::Mutex::new(handover::receive::ServedRequest::new());

/// Whether `value`, the request node now, is the request this image was started by.
pub fn is_served_request(value: Option<&str>) -> bool {
    SERVED_REQUEST.lock().holds(value)
}

/// Tells dom0's tool the upgrade is done (`data/blkdom-upgrade` = `done <build id>`),
/// once every handed-over vbd was taken over (or failed).
pub fn answer_done(xs: &mut xen_domain::store::Client) {
    if !ANSWER_DUE.swap(false, Ordering::AcqRel) || booted_from().is_none() {
        return;
    }
    let tx = xen::xenstore::Transaction::NONE;
    if let Ok(request) = xs.read_string(tx, blkback::keys::UPGRADE) {
        SERVED_REQUEST.lock().set(&request);
    }
    let Some(id) = version::build_id() else {
        return;
    };
    let answer = alloc::format!("{}", handover::receive::Answer::Done(id));
    log::info!("upgrade: {answer}");
    if let Err(e) = xs.write(tx, blkback::keys::UPGRADE_ANSWER, answer.as_bytes()) {
        log::warn!(
            "upgrade: {} not written: {e:?}",
            blkback::keys::UPGRADE_ANSWER
        );
    }
}

/// The handover this image booted from, checked (`adopt`).
static BOOTED_FROM: spin::Once<Handover> = spin::Once::new();

pub fn booted_from() -> Option<&'static Handover> {
    BOOTED_FROM.get()
}

/// Whether this boot was given a handover module (usable or not).
static MODULE_GIVEN: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// `upgradetest.corrupt`: the next jump flips a byte of the block's body.
#[cfg(feature = "test-hooks")]
static CORRUPT_BLOCK: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The handover module of this boot, if any (logged when unusable).
pub fn find_module(info: &BootInfo) -> Option<(u64, u64)> {
    let (ram, n) = info.ram();
    match park::find_handover(info.modules().iter().map(|m| m.as_triple()), &ram[..n]) {
        Ok(found) => {
            MODULE_GIVEN.store(found.is_some(), Ordering::Relaxed);
            found
        }
        Err(e) => {
            log::error!("upgrade: {e}; booting cold");
            None
        }
    }
}

/// Decodes and checks the handover block (again: `mm` checked it in a scratch heap to
/// keep its ranges out) and keeps it for the rest of the boot.
pub fn adopt(info: &BootInfo, module: (u64, u64), max_queues: usize) -> Option<&'static Handover> {
    let (ram, n) = info.ram();
    let limits = Limits {
        ram: &ram[..n],
        vcpus: smp::MAX_CPUS,
        max_queues,
    };
    match Handover::decode(&read_module(module.0, module.1), &limits) {
        Ok(h) => {
            let ours = version::build_id().map_or_else(
                || alloc::string::String::from("unknown"),
                |id| alloc::format!("{id}"),
            );
            log::info!(
                "upgrade: booted from a handover: build {} -> {ours}, upgrade {}, {} vCPUs, \
                 {} memory ranges kept, {} RAM disks, {} vbds",
                h.old_build_id,
                h.generation,
                h.vcpus,
                h.ranges.len(),
                h.ram_disks.len(),
                h.vbds.len()
            );
            Some(BOOTED_FROM.call_once(|| h))
        }
        Err(e) => {
            log::error!("upgrade: handover block refused: {e}; booting cold");
            None
        }
    }
}

/// A block with no disk and no ring: `jump` fills the domain's part.
#[cfg(feature = "test-hooks")]
fn empty_handover() -> Handover {
    Handover {
        old_build_id: BuildId::new(&[0]).expect("a one-byte id"),
        generation: 0,
        vcpus: 0,
        vcpu_info: Vec::new(),
        shared_info: 0,
        park_page: 0,
        ranges: Vec::new(),
        ram_disks: Vec::new(),
        vbds: Vec::new(),
    }
}

/// The domain's part of the block: build id, upgrade count, vCPUs, `vcpu_info` and
/// `shared_info` and the park area, with the memory ranges they need kept.
pub fn domain_fields(h: &mut Handover) -> Result<(), JumpError> {
    let id = version::build_id().ok_or(JumpError::NoBuildId)?;
    h.old_build_id = BuildId::new(id.as_bytes()).ok_or(JumpError::NoBuildId)?;
    h.generation = booted_from().map_or(1, |b| b.generation.saturating_add(1));
    h.vcpus = smp::online_count() as u32;
    h.park_page = PARK_BASE;
    // The domain's ranges are this function's: whatever the caller put of those kinds
    // is replaced (the disks' ranges stay).
    h.ranges.retain(|r| r.kind == RangeKind::RamDisk);
    h.ranges.push(MemRange {
        kind: RangeKind::Park,
        start: PARK_BASE,
        len: PARK_LEN,
    });
    h.vcpu_info.clear();
    h.shared_info = 0;
    if let Some(xen) = xen_domain::get() {
        h.shared_info = xen.shared_info_paddr;
        h.ranges.push(MemRange {
            kind: RangeKind::SharedInfo,
            start: xen.shared_info_paddr,
            len: park::PAGE,
        });
        for vcpu in 0..h.vcpus as usize {
            let paddr = xen.vcpu_info_paddr(vcpu);
            h.vcpu_info.push(paddr);
            let page = paddr & !(park::PAGE - 1);
            if !h
                .ranges
                .iter()
                .any(|r| r.kind == RangeKind::VcpuInfo && r.start == page)
            {
                h.ranges.push(MemRange {
                    kind: RangeKind::VcpuInfo,
                    start: page,
                    len: park::PAGE,
                });
            }
        }
    }
    Ok(())
}

fn overlaps(start: u64, len: u64, other: core::ops::Range<u64>) -> bool {
    start < other.end && other.start < start.saturating_add(len)
}

/// Switches to the new image: writes the park area, parks every other vCPU and enters
/// the trampoline. Returns only an error, before anything was given up.
pub fn jump(mut prepared: Prepared) -> Result<Infallible, JumpError> {
    let info = crate::bootinfo::get().ok_or(JumpError::NoBootInfo)?;
    domain_fields(&mut prepared.handover)?;
    let (ram, n) = info.ram();
    if !ram[..n]
        .iter()
        .any(|r| r.start <= PARK_BASE && PARK_BASE + PARK_LEN <= r.end)
    {
        return Err(JumpError::ParkNotRam);
    }
    #[allow(unused_mut)]
    let mut block = prepared.handover.encode();
    // Read back as the next image will, domain part and all: a block it would refuse
    // must not cost the guests their disks.
    let limits = Limits {
        ram: &ram[..n],
        vcpus: smp::MAX_CPUS,
        max_queues: smp::MAX_CPUS,
    };
    match Handover::decode(&block, &limits) {
        Ok(read) if read == prepared.handover => {}
        Ok(_) => return Err(JumpError::Block("it does not read back as written".into())),
        Err(e) => return Err(JumpError::Block(alloc::format!("{e}"))),
    }
    #[cfg(feature = "test-hooks")]
    if CORRUPT_BLOCK.load(Ordering::Relaxed) {
        if let Some(last) = block.last_mut() {
            *last ^= 1;
            log::warn!("upgradetest: the handover block's last byte flipped on purpose");
        }
    }
    // The boot's modules go on, but those the new image will land on (a loader puts
    // them after the image, in the load window) or the park area covers.
    let modules: Vec<Module> = info
        .modules()
        .iter()
        .filter(|m| {
            !overlaps(m.paddr, m.size, LOAD_WINDOW)
                && !overlaps(m.paddr, m.size, PARK_BASE..PARK_BASE + PARK_LEN)
        })
        .map(|m| Module {
            paddr: m.paddr,
            size: m.size,
            cmdline: m.cmdline().to_vec(),
        })
        .collect();
    let start_info = StartInfo::for_jump(
        info.cmdline().as_bytes(),
        info.start_info.rsdp_paddr,
        info.memmap(),
        &modules,
        (block.as_ptr() as u64, block.len() as u64),
    )
    .encode(PARK_BASE + park::START_INFO_OFFSET)
    .map_err(JumpError::Park)?;
    let params = park::params_page(
        PARK_BASE,
        &TrampolineParams {
            entry32: prepared.image.entry32,
            image_paddr: prepared.staged.as_ptr() as u64,
            segments: prepared.image.segments.clone(),
        },
        prepared.staged.len(),
    )
    .map_err(JumpError::Park)?;
    let tables = park::identity_tables(PARK_BASE + park::TABLES_OFFSET);

    // SAFETY: the park area lies below 1 MiB, in RAM (checked above), which no frame
    // allocator of ours hands out and nothing else uses after boot; no vCPU runs there
    // yet (they are parked only below).
    unsafe {
        crate::physmem::zero(PARK_BASE, PARK_LEN as usize);
        crate::physmem::write(PARK_BASE + park::CODE_OFFSET, jump::code());
        crate::physmem::write(PARK_BASE + park::PARAMS_OFFSET, &params);
        crate::physmem::write(PARK_BASE + park::START_INFO_OFFSET, &start_info);
        crate::physmem::write(PARK_BASE + park::TABLES_OFFSET, &tables);
    }
    core::sync::atomic::fence(Ordering::SeqCst);

    // Pollers park at their next sleep (the drain released every ring); a vCPU that
    // runs no poller (a test, no Xen) takes the same step from its mailbox.
    crate::backend::poller::PARK.store(true, Ordering::Release);
    crate::backend::poller::ring_all_doorbells();
    for cpu in 1..smp::online_count() {
        // Busy: it runs a poller, which parks on PARK instead.
        let _ = smp::start_on(cpu, park_here);
        if !smp::wait_until(PARK_WAIT_MS, || jump::is_parked(cpu)) {
            // The vCPUs already parked cannot come back into this image: a vCPU with no
            // ring that does not reach its park in this long is a bug worth stopping for.
            log::error!("upgrade: CPU {cpu} did not park within {PARK_WAIT_MS} ms");
            crate::power::crash("a vCPU did not park");
        }
    }
    log::info!(
        "upgrade: {} vCPUs parked; jumping to build {} (entry {:#x}, {} segments, block {} \
         bytes at {:#x})",
        smp::online_count() - 1,
        prepared.image.build_id,
        prepared.image.entry32,
        prepared.image.segments.len(),
        block.len(),
        block.as_ptr() as u64
    );
    crate::backend::poller::close_doorbell(0);
    crate::console::flush();
    // The block and the staged image must stay where they are: nothing frees them.
    core::mem::forget(block);
    core::mem::forget(prepared.staged);
    // SAFETY: the park area holds the code, parameters (segments checked by
    // `image::check` and `params_page`), tables and start info; every other vCPU is
    // parked; the caller drained every ring and stopped every device (`Prepared`).
    unsafe { jump::enter_trampoline() }
}

fn park_here(cpu: usize) {
    jump::park_this_cpu(cpu)
}

/// Releases the vCPUs the handover says are parked into this image's AP entry; returns
/// how many came online.
pub fn release_parked(h: &Handover) -> usize {
    let mut released = 0;
    for vcpu in 1..(h.vcpus as usize).min(smp::MAX_CPUS) {
        if let Some(xen) = xen_domain::get() {
            let adopted = h
                .vcpu_info
                .get(vcpu)
                .ok_or(xen_domain::InitError::NotInitialised)
                .and_then(|&paddr| xen.adopt_vcpu_info(vcpu as u32, paddr))
                .and_then(|_| xen_domain::events::init_vcpu(vcpu as u32));
            if let Err(e) = adopted {
                log::error!("cpu: vCPU {vcpu} not released: {e}");
                break;
            }
        }
        // A parked vCPU is already running; under a loaded emulator its thread can wait
        // for a host core longer than a cold AP's 1 s start, so it gets the park's bound.
        let up = smp::start_ap(vcpu, PARK_WAIT_MS, |start| {
            let what = jump::Release {
                cr3: start.cr3,
                // The park code `call`s the entry: RSP ≡ 8 (mod 16) there, as the ABI wants.
                stack_top: start.stack_top,
                entry: start.entry,
                arg: start.index as u64,
            };
            if !jump::release(h.park_page, vcpu, &what) {
                log::error!("cpu: vCPU {vcpu} is not parked");
            }
        });
        if !up {
            log::error!("cpu: parked vCPU {vcpu} did not come up within {PARK_WAIT_MS} ms");
            break;
        }
        released += 1;
    }
    log::info!("upgrade: {released} parked vCPUs released");
    released
}

/// `upgradetest=<n>`: upgrades to the image given as a module (not the handover), n
/// times in a row, with a handover of the domain's part only (no disk, no ring); each new
/// image checks it booted from the handover, that its parked vCPUs were released and
/// take work, and the last reports the verdict and powers off.
#[cfg(feature = "test-hooks")]
pub fn upgrade_test(
    upgrades: &str,
    corrupt: bool,
    devices: bool,
    bus: crate::devices::open::PciBus,
) -> ! {
    use crate::power::{self, Verdict};
    let fail = |why: &str| -> ! {
        log::error!("upgradetest: FAILED: {why}");
        power::report_verdict(Verdict::Fail);
        power::power_off()
    };
    if MODULE_GIVEN.load(Ordering::Relaxed) && booted_from().is_none() {
        // The block came, and was refused: the boot went on cold (under plain QEMU the
        // start-up IPIs reset the parked vCPUs into the cold path).
        if !corrupt {
            fail("a handover block was given and refused");
        }
        log::info!(
            "upgradetest: the corrupted block was refused; booted cold, {} CPUs online, passed",
            smp::online_count()
        );
        power::report_verdict(Verdict::Pass);
        power::power_off();
    }
    CORRUPT_BLOCK.store(corrupt, Ordering::Relaxed);
    let Some(wanted) = upgrades
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=10).contains(n))
    else {
        fail("upgradetest= takes a number of upgrades, 1 to 10");
    };
    let done = booted_from().map_or(0, |h| h.generation);
    if let Some(h) = booted_from() {
        let online = smp::online_count();
        if online != h.vcpus as usize {
            fail(&alloc::format!(
                "{online} CPUs online, {} handed over",
                h.vcpus
            ));
        }
        for cpu in 1..online {
            if let Err(e) = smp::run_on(cpu, took_work, 1000) {
                fail(&alloc::format!("released CPU {cpu} takes no work: {e}"));
            }
        }
        log::info!(
            "upgradetest: upgrade {done} of {wanted}: from build {}, {online} CPUs online, \
             every released one took work",
            h.old_build_id
        );
    }
    let mut handover = empty_handover();
    match crate::backend::carry_ram_disk(bus, booted_from(), done + 1, &mut handover, devices) {
        Ok(seen) => log::info!("upgradetest: RAM disk: {seen}"),
        Err(e) => fail(&alloc::format!("RAM disk: {e}")),
    }
    if done >= wanted {
        log::info!("upgradetest: {done} upgrades, passed");
        power::report_verdict(Verdict::Pass);
        power::power_off();
    }
    let Some(info) = crate::bootinfo::get() else {
        fail("no boot information")
    };
    let Some(module) = info
        .modules()
        .iter()
        .find(|m| m.cmdline() != park::HANDOVER_CMDLINE.as_bytes())
    else {
        fail("no image given as a module")
    };
    if module.size as usize > handover::image::IMAGE_MAX
        || !crate::physmem::in_identity_map(module.paddr, module.size as usize)
    {
        fail("the module is too large or not in the identity map");
    }
    let staged = read_module(module.paddr, module.size);
    let expected = handover::image::Expected {
        size: staged.len(),
        sha256: handover::image::sha256(&staged),
        handover_version: handover::block::HANDOVER_VERSION,
    };
    let image = match handover::image::check(&staged, &expected) {
        Ok(image) => image,
        Err(e) => fail(&alloc::format!("the module is refused: {e}")),
    };
    log::info!(
        "upgradetest: upgrade {} of {wanted}: to build {}",
        done + 1,
        image.build_id
    );
    match jump(Prepared {
        staged,
        image,
        handover,
    }) {
        Err(e) => fail(&alloc::format!("no jump: {e}")),
        Ok(never) => match never {},
    }
}

#[cfg(feature = "test-hooks")]
fn took_work(_cpu: usize) {}
