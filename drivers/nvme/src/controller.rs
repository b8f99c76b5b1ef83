// SPDX-License-Identifier: MIT OR Apache-2.0
//! Controller bring-up and the admin queue.

use crate::command::{CompletionEntry, Opcode, SubmissionEntry, CQ_ENTRY_LEN, SQ_ENTRY_LEN};
use crate::queue::IoQueue;
use crate::{CommandStatus, Hal, PAGE_SIZE};
use alloc::vec::Vec;
use blkdev::DmaRegion;
use cmdslots::{Recoverer, RecoveryConfig};

mod recover;

pub(crate) mod reg {
    pub const CAP: usize = 0x00;
    pub const VS: usize = 0x08;
    pub const INTMS: usize = 0x0c;
    pub const CC: usize = 0x14;
    pub const CSTS: usize = 0x1c;
    pub const AQA: usize = 0x24;
    pub const ASQ: usize = 0x28;
    pub const ACQ: usize = 0x30;
    pub const DOORBELLS: usize = 0x1000;

    pub const CC_ENABLE: u32 = 1;
    /// I/O submission and completion entry sizes as powers of two (64 and 16 bytes).
    pub const CC_IOSQES_64: u32 = 6 << 16;
    pub const CC_IOCQES_16: u32 = 4 << 20;
    pub const CSTS_READY: u32 = 1;
    pub const CSTS_FATAL: u32 = 1 << 1;
    /// CC.SHN (bits 15:14): 01b asks for a normal shutdown.
    pub const CC_SHN_MASK: u32 = 0b11 << 14;
    pub const CC_SHN_NORMAL: u32 = 0b01 << 14;
    /// CSTS.SHST (bits 3:2): 10b says the shutdown is complete.
    pub const CSTS_SHST_MASK: u32 = 0b11 << 2;
    pub const CSTS_SHST_COMPLETE: u32 = 0b10 << 2;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmeError {
    /// CSTS.RDY did not reach the wanted value in time (`true`: while enabling).
    ReadyTimeout {
        enabling: bool,
    },
    /// An admin command got no completion in time.
    CommandTimeout {
        opcode: u8,
    },
    /// CSTS.CFS: the controller reported a fatal error.
    ControllerFatal,
    CommandFailed {
        opcode: u8,
        status: CommandStatus,
    },
    /// The controller cannot run the NVM command set or 4 KiB pages.
    Unsupported(&'static str),
    OutOfDmaMemory,
    /// The namespace id is not one the controller has, or it is inactive.
    NoSuchNamespace(u32),
    /// Namespace format the driver does not handle (block size, metadata).
    UnsupportedFormat {
        block_size: u64,
        metadata: u16,
    },
    /// All the I/O queues the controller granted are in use.
    NoQueueLeft,
    /// After a reset the controller granted fewer I/O queues than it had made.
    FewerQueues {
        granted: u16,
        made: u16,
    },
    /// Bus mastering did not turn back on after a reset.
    DmaNotResumed,
}

impl core::fmt::Display for NvmeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NvmeError::ReadyTimeout { enabling } => write!(
                f,
                "controller did not become {} in time",
                if *enabling { "ready" } else { "idle" }
            ),
            NvmeError::CommandTimeout { opcode } => {
                write!(f, "admin command {opcode:#04x} timed out")
            }
            NvmeError::ControllerFatal => write!(f, "controller fatal status (CSTS.CFS)"),
            NvmeError::CommandFailed { opcode, status } => {
                write!(f, "admin command {opcode:#04x} failed: {status}")
            }
            NvmeError::Unsupported(what) => write!(f, "controller lacks {what}"),
            NvmeError::OutOfDmaMemory => write!(f, "out of DMA memory"),
            NvmeError::NoSuchNamespace(nsid) => write!(f, "no active namespace {nsid}"),
            NvmeError::UnsupportedFormat {
                block_size,
                metadata,
            } => write!(
                f,
                "namespace format with {block_size}-byte blocks and {metadata} metadata bytes"
            ),
            NvmeError::NoQueueLeft => write!(f, "no I/O queue left"),
            NvmeError::FewerQueues { granted, made } => write!(
                f,
                "after the reset the controller granted {granted} I/O queues, not the {made} made"
            ),
            NvmeError::DmaNotResumed => write!(f, "bus mastering did not turn back on"),
        }
    }
}

impl core::error::Error for NvmeError {}

/// The parts of CAP the driver uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities {
    pub max_queue_entries: u32,
    pub doorbell_stride: usize,
    pub ready_timeout_ms: u64,
    pub nvm_command_set: bool,
    pub min_page_shift: u32,
    pub max_page_shift: u32,
}

impl Capabilities {
    pub fn parse(cap: u64) -> Self {
        Capabilities {
            max_queue_entries: (cap & 0xffff) as u32 + 1,
            doorbell_stride: 4 << ((cap >> 32) & 0xf),
            ready_timeout_ms: ((cap >> 24) & 0xff) * 500,
            nvm_command_set: cap & (1 << 37) != 0,
            min_page_shift: 12 + ((cap >> 48) & 0xf) as u32,
            max_page_shift: 12 + ((cap >> 52) & 0xf) as u32,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u16,
    pub minor: u8,
}

/// What Identify Controller says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerIdentity {
    pub vendor_id: u16,
    pub serial: [u8; 20],
    pub model: [u8; 40],
    pub firmware: [u8; 8],
    /// Maximum data transfer as a power of two of the minimum page size; 0: no limit.
    pub mdts: u8,
    pub namespace_count: u32,
    /// Optional NVM commands (bit 2: Dataset Management).
    pub oncs: u16,
    /// SGL support (bits 1:0 non-zero: SGLs for NVM I/O commands).
    pub sgls: u32,
    pub volatile_write_cache: bool,
    /// Dataset Management Range Size Limit, in blocks (the NVM command set's Identify
    /// Controller, CNS 06h): 0 when none is reported. A controller may skip a range
    /// above it without an error (QEMU's does), so discards are split to fit.
    pub dmrsl: u32,
    /// RTD3 Entry Latency: how long the controller says a shutdown may take, in
    /// microseconds (0: it does not say).
    pub rtd3e_us: u32,
}

fn trimmed(bytes: &[u8]) -> &str {
    core::str::from_utf8(bytes)
        .unwrap_or("?")
        .trim_end_matches([' ', '\0'])
}

impl ControllerIdentity {
    fn parse(page: &[u8]) -> Self {
        let mut identity = ControllerIdentity {
            vendor_id: u16::from_le_bytes([page[0], page[1]]),
            serial: [0; 20],
            model: [0; 40],
            firmware: [0; 8],
            mdts: page[77],
            namespace_count: u32::from_le_bytes(page[516..520].try_into().expect("4")),
            oncs: u16::from_le_bytes([page[520], page[521]]),
            sgls: u32::from_le_bytes(page[536..540].try_into().expect("4")),
            volatile_write_cache: page[525] & 1 != 0,
            dmrsl: 0,
            rtd3e_us: u32::from_le_bytes(page[88..92].try_into().expect("4")),
        };
        identity.serial.copy_from_slice(&page[4..24]);
        identity.model.copy_from_slice(&page[24..64]);
        identity.firmware.copy_from_slice(&page[64..72]);
        identity
    }

    pub fn model_str(&self) -> &str {
        trimmed(&self.model)
    }

    pub fn serial_str(&self) -> &str {
        trimmed(&self.serial)
    }

    /// Scatter-gather lists for I/O, with byte (not dword) alignment of data blocks:
    /// what a segment list the PRP rules cannot express needs.
    pub fn sgl_supported(&self) -> bool {
        self.sgls & 0b11 == 0b01
    }

    pub fn dataset_management(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }
}

/// An active namespace and what the driver needs to address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub nsid: u32,
    pub blocks: u64,
    pub block_size: u32,
    pub discard: bool,
    /// Blocks one deallocate range may cover (DMRSL, else the field's 32 bits).
    pub max_discard_blocks: u32,
    pub volatile_write_cache: bool,
    /// Write protected (NSATTR bit 0): writes and discards are refused.
    pub read_only: bool,
    /// Pages one command may carry (MDTS, and one PRP list page).
    pub max_pages_per_command: usize,
    /// Requests the PRP rules would split go out as one SGL command instead.
    pub sgl: bool,
}

/// What names a namespace whatever controller or slot it is reached through (Identify
/// Namespace), with its size: read for every active namespace at bring-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceIdentity {
    pub nsid: u32,
    pub blocks: u64,
    /// The formatted block size (0: a format the driver does not serve).
    pub block_size: u32,
    /// NGUID (bytes 104..119); all zero: none.
    pub nguid: [u8; 16],
    /// EUI-64 (bytes 120..127); all zero: none.
    pub eui64: [u8; 8],
}

impl NamespaceIdentity {
    /// From an Identify Namespace page; `None` for an inactive namespace (no blocks).
    pub fn parse(nsid: u32, page: &[u8; 4096]) -> Option<NamespaceIdentity> {
        let blocks = u64::from_le_bytes(page[0..8].try_into().expect("8"));
        if blocks == 0 {
            return None;
        }
        let format = usize::from(page[26] & 0xf);
        let lbaf = &page[128 + 4 * format..132 + 4 * format];
        let metadata = u16::from_le_bytes([lbaf[0], lbaf[1]]);
        let shift = u32::from(lbaf[2]);
        let block_size = if (9..=12).contains(&shift) && metadata == 0 {
            1 << shift
        } else {
            0
        };
        Some(NamespaceIdentity {
            nsid,
            blocks,
            block_size,
            nguid: page[104..120].try_into().expect("16"),
            eui64: page[120..128].try_into().expect("8"),
        })
    }
}

impl Namespace {
    pub fn capacity_bytes(&self) -> u64 {
        self.blocks * u64::from(self.block_size)
    }
}

/// Choices for bring-up.
#[derive(Clone, Copy, Debug)]
pub struct InitConfig {
    pub admin_entries: u16,
    /// Upper bound for any single admin command.
    pub admin_timeout_ms: u64,
    /// Upper bound for a ready transition when CAP.TO says more (or nothing).
    pub max_ready_timeout_ms: u64,
    /// How a controller whose command times out recovers (`Controller::recover`).
    pub recovery: RecoveryConfig,
}

impl Default for InitConfig {
    fn default() -> Self {
        InitConfig {
            admin_entries: 32,
            admin_timeout_ms: 5_000,
            max_ready_timeout_ms: 30_000,
            recovery: RecoveryConfig::DEFAULT,
        }
    }
}

/// How long a shutdown is waited for (as Linux's `shutdown_timeout`): what RTD3E says,
/// rounded up to whole seconds, at least 5 s and at most 60 s.
pub const SHUTDOWN_MIN_MS: u64 = 5_000;
pub const SHUTDOWN_MAX_MS: u64 = 60_000;

/// Identify CNS 06h: the I/O command set specific Identify Controller page (NVMe 1.4
/// controllers onwards, with command sets; CSI 0 is the NVM command set).
const IDENTIFY_CS_CONTROLLER: u32 = 0x06;
/// Identify CNS 02h: the active namespace ids above CDW1's, 1024 to a page.
const IDENTIFY_ACTIVE_NAMESPACES: u32 = 0x02;
/// Namespaces identified at bring-up at most: one active-list page, or, for a controller
/// without the list (before NVMe 1.1), the first this many ids.
pub const MAX_IDENTIFIED_NAMESPACES: u32 = 1024;
const CSI_NVM: u8 = 0;
const DMRSL_VERSION: Version = Version { major: 1, minor: 4 };

/// Most PRP list entries the driver uses per command: one list page.
pub(crate) const MAX_PRP_LIST_ENTRIES: usize = (PAGE_SIZE / 8) as usize;
const POLL_INTERVAL_US: u64 = 10;

struct AdminQueue {
    sq: DmaRegion,
    cq: DmaRegion,
    entries: u16,
    tail: u16,
    head: u16,
    phase: bool,
    next_command_id: u16,
}

/// An I/O queue pair as it was created: a reset makes it again, the same.
#[derive(Clone, Copy, Debug)]
struct CreatedQueue {
    qid: u16,
    entries: u16,
    sq: DmaRegion,
    cq: DmaRegion,
}

/// An enabled controller with its admin queue.
pub struct Controller<H: Hal> {
    hal: H,
    pub(crate) caps: Capabilities,
    version: Version,
    identity: ControllerIdentity,
    admin: AdminQueue,
    config: InitConfig,
    /// One page for identify data and the like.
    scratch: DmaRegion,
    io_queues_granted: u16,
    next_qid: u16,
    /// CAP.TO, bounded by `InitConfig::max_ready_timeout_ms`.
    ready_timeout_ms: u64,
    /// Every I/O queue pair created, for a reset to make again.
    created: Vec<CreatedQueue>,
    /// The controller's recovery after a timeout or a fatal status (`recover`).
    recoverer: Recoverer,
}

fn read_u64<H: Hal>(hal: &H, offset: usize) -> u64 {
    u64::from(hal.read_register(offset)) | (u64::from(hal.read_register(offset + 4)) << 32)
}

fn write_u64<H: Hal>(hal: &H, offset: usize, value: u64) {
    hal.write_register(offset, value as u32);
    hal.write_register(offset + 4, (value >> 32) as u32);
}

/// Polls CSTS until `ready` matches, CFS appears, or `timeout_ms` passes.
fn wait_ready<H: Hal>(hal: &H, ready: bool, timeout_ms: u64) -> Result<(), NvmeError> {
    let mut waited_us = 0;
    loop {
        let csts = hal.read_register(reg::CSTS);
        if csts & reg::CSTS_FATAL != 0 && ready {
            return Err(NvmeError::ControllerFatal);
        }
        if (csts & reg::CSTS_READY != 0) == ready {
            return Ok(());
        }
        if waited_us >= timeout_ms * 1000 {
            return Err(NvmeError::ReadyTimeout { enabling: ready });
        }
        hal.delay_us(POLL_INTERVAL_US * 10);
        waited_us += POLL_INTERVAL_US * 10;
    }
}

pub(crate) fn doorbell(caps: &Capabilities, qid: u16, completion: bool) -> usize {
    reg::DOORBELLS + (2 * usize::from(qid) + usize::from(completion)) * caps.doorbell_stride
}

impl<H: Hal> Controller<H> {
    /// Resets the controller, sets up the admin queue, enables it and identifies it.
    pub fn init(hal: H, config: InitConfig) -> Result<Self, NvmeError> {
        let caps = Capabilities::parse(read_u64(&hal, reg::CAP));
        if !caps.nvm_command_set {
            return Err(NvmeError::Unsupported("the NVM command set"));
        }
        if caps.min_page_shift > 12 || caps.max_page_shift < 12 {
            return Err(NvmeError::Unsupported("4 KiB memory pages"));
        }
        let vs = hal.read_register(reg::VS);
        let version = Version {
            major: (vs >> 16) as u16,
            minor: (vs >> 8) as u8,
        };
        let ready_timeout_ms = if caps.ready_timeout_ms == 0 {
            config.max_ready_timeout_ms
        } else {
            caps.ready_timeout_ms.min(config.max_ready_timeout_ms)
        };

        // Reset: clearing EN drops every queue; wait for the controller to go idle.
        let cc = hal.read_register(reg::CC);
        if cc & reg::CC_ENABLE != 0 {
            hal.write_register(reg::CC, cc & !reg::CC_ENABLE);
        }
        wait_ready(&hal, false, ready_timeout_ms)?;

        let entries = config
            .admin_entries
            .clamp(2, 4096)
            .min(caps.max_queue_entries.min(4096) as u16);
        let sq_pages = pages_for(usize::from(entries) * SQ_ENTRY_LEN);
        let cq_pages = pages_for(usize::from(entries) * CQ_ENTRY_LEN);
        let sq = hal
            .allocate_dma(sq_pages)
            .ok_or(NvmeError::OutOfDmaMemory)?;
        let cq = hal
            .allocate_dma(cq_pages)
            .ok_or(NvmeError::OutOfDmaMemory)?;
        let scratch = hal.allocate_dma(1).ok_or(NvmeError::OutOfDmaMemory)?;
        // The driver polls: mask every interrupt vector.
        hal.write_register(reg::INTMS, u32::MAX);
        let size = u32::from(entries - 1);
        hal.write_register(reg::AQA, (size << 16) | size);
        write_u64(&hal, reg::ASQ, sq.address());
        write_u64(&hal, reg::ACQ, cq.address());
        // CSS 0 (NVM), MPS 0 (4 KiB), round robin, I/O entry sizes 64/16.
        hal.write_register(
            reg::CC,
            reg::CC_ENABLE | reg::CC_IOSQES_64 | reg::CC_IOCQES_16,
        );
        wait_ready(&hal, true, ready_timeout_ms)?;

        let mut controller = Controller {
            hal,
            caps,
            version,
            identity: ControllerIdentity::parse(&[0; 4096]),
            admin: AdminQueue {
                sq,
                cq,
                entries,
                tail: 0,
                head: 0,
                phase: true,
                next_command_id: 0,
            },
            config,
            scratch,
            io_queues_granted: 0,
            next_qid: 1,
            ready_timeout_ms,
            created: Vec::new(),
            recoverer: Recoverer::new(config.recovery),
        };
        let page = controller.identify(1, 0)?;
        controller.identity = ControllerIdentity::parse(&page);
        if controller.identity.dataset_management() && controller.version >= DMRSL_VERSION {
            // Optional: a controller without the NVM command set's page answers an
            // error, and has no limit to tell.
            match controller.identify_with(IDENTIFY_CS_CONTROLLER, 0, CSI_NVM) {
                Ok(page) => {
                    controller.identity.dmrsl =
                        u32::from_le_bytes(page[4..8].try_into().expect("4"));
                }
                Err(e) => log::info!("nvme: no NVM command set identify page ({e:?})"),
            }
        }
        Ok(controller)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn identity(&self) -> &ControllerIdentity {
        &self.identity
    }

    /// Largest I/O queue the controller takes (CAP.MQES + 1).
    pub fn max_queue_entries(&self) -> u32 {
        self.caps.max_queue_entries
    }

    /// The controller was given up (a queue of it failed without recovery, or it did
    /// not come back from its resets): it reaches no memory any more, and no new queue
    /// of it would work.
    pub fn is_stopped(&self) -> bool {
        if self.recoverer.max_resets() == 0 {
            self.hal.dma_stopped().is_some()
        } else {
            self.recoverer.failed()
        }
    }

    /// Asks for a normal shutdown (CC.SHN = 01b, CC.EN left set): the controller writes
    /// back whatever it caches and says so in CSTS.SHST (`shutdown_complete`). Nothing
    /// may be submitted to it afterwards.
    pub fn begin_shutdown(&mut self) {
        let cc = self.hal.read_register(reg::CC);
        self.hal
            .write_register(reg::CC, (cc & !reg::CC_SHN_MASK) | reg::CC_SHN_NORMAL);
    }

    /// Whether the shutdown `begin_shutdown` asked for is complete (CSTS.SHST = 10b);
    /// `ControllerFatal` if CSTS.CFS says the controller failed.
    pub fn shutdown_complete(&self) -> Result<bool, NvmeError> {
        let csts = self.hal.read_register(reg::CSTS);
        if csts & reg::CSTS_FATAL != 0 {
            return Err(NvmeError::ControllerFatal);
        }
        Ok(csts & reg::CSTS_SHST_MASK == reg::CSTS_SHST_COMPLETE)
    }

    /// How long to wait for a shutdown: RTD3E rounded up to whole seconds, within
    /// [`SHUTDOWN_MIN_MS`] and [`SHUTDOWN_MAX_MS`].
    pub fn shutdown_timeout_ms(&self) -> u64 {
        let seconds = u64::from(self.identity.rtd3e_us).div_ceil(1_000_000);
        (seconds * 1000).clamp(SHUTDOWN_MIN_MS, SHUTDOWN_MAX_MS)
    }

    /// True when CSTS.CFS reports a fatal controller error.
    pub fn is_fatal(&self) -> bool {
        self.hal.read_register(reg::CSTS) & reg::CSTS_FATAL != 0
    }

    fn identify(&mut self, cns: u32, nsid: u32) -> Result<[u8; 4096], NvmeError> {
        self.identify_with(cns, nsid, 0)
    }

    /// Identify with a command set identifier (CDW11 bits 31:24).
    fn identify_with(&mut self, cns: u32, nsid: u32, csi: u8) -> Result<[u8; 4096], NvmeError> {
        self.hal.write_dma(self.scratch, 0, &[0; 4096]);
        let entry = SubmissionEntry::new(Opcode::Identify as u8, 0, nsid)
            .with_prp(self.scratch.address(), 0)
            .with_cdw(10, cns)
            .with_cdw(11, u32::from(csi) << 24);
        self.admin_command(entry)?;
        let mut page = [0u8; 4096];
        self.hal.read_dma(self.scratch, 0, &mut page);
        Ok(page)
    }

    /// Runs one admin command to completion.
    fn admin_command(&mut self, entry: SubmissionEntry) -> Result<CompletionEntry, NvmeError> {
        self.admin_command_within(entry, self.config.admin_timeout_ms)
    }

    /// Runs one admin command to completion, waiting for it at most `timeout_ms`.
    fn admin_command_within(
        &mut self,
        mut entry: SubmissionEntry,
        timeout_ms: u64,
    ) -> Result<CompletionEntry, NvmeError> {
        let opcode = entry.bytes[0];
        let admin = &mut self.admin;
        let command_id = admin.next_command_id;
        admin.next_command_id = admin.next_command_id.wrapping_add(1);
        entry.set_command_id(command_id);
        self.hal.write_dma(
            admin.sq,
            u64::from(admin.tail) * SQ_ENTRY_LEN as u64,
            &entry.bytes,
        );
        admin.tail = (admin.tail + 1) % admin.entries;
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        self.hal
            .write_register(doorbell(&self.caps, 0, false), u32::from(admin.tail));

        let mut waited_us = 0;
        loop {
            let slot = u64::from(admin.head) * CQ_ENTRY_LEN as u64;
            let dw3 = self.hal.read_dma_u32(admin.cq, slot + 12);
            if (dw3 & (1 << 16) != 0) == admin.phase {
                core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
                let mut bytes = [0u8; CQ_ENTRY_LEN];
                self.hal.read_dma(admin.cq, slot, &mut bytes);
                let completion = CompletionEntry::parse(&bytes);
                admin.head += 1;
                if admin.head == admin.entries {
                    admin.head = 0;
                    admin.phase = !admin.phase;
                }
                self.hal
                    .write_register(doorbell(&self.caps, 0, true), u32::from(admin.head));
                if completion.command_id != command_id {
                    // Stale or foreign: keep waiting for ours.
                    log::warn!(
                        "nvme: admin completion for command {} while waiting for {}",
                        completion.command_id,
                        command_id
                    );
                    continue;
                }
                if !completion.status.is_success() {
                    return Err(NvmeError::CommandFailed {
                        opcode,
                        status: completion.status,
                    });
                }
                return Ok(completion);
            }
            if waited_us >= timeout_ms * 1000 {
                let fatal = self.hal.read_register(reg::CSTS) & reg::CSTS_FATAL != 0;
                return Err(if fatal {
                    NvmeError::ControllerFatal
                } else {
                    NvmeError::CommandTimeout { opcode }
                });
            }
            if waited_us % 10_000 == 0 && self.hal.read_register(reg::CSTS) & reg::CSTS_FATAL != 0 {
                return Err(NvmeError::ControllerFatal);
            }
            self.hal.delay_us(POLL_INTERVAL_US);
            waited_us += POLL_INTERVAL_US;
        }
    }

    /// Identifies namespace `nsid` (1-based).
    pub fn namespace(&mut self, nsid: u32) -> Result<Namespace, NvmeError> {
        if nsid == 0 || nsid > self.identity.namespace_count {
            return Err(NvmeError::NoSuchNamespace(nsid));
        }
        let page = self.identify(0, nsid)?;
        let blocks = u64::from_le_bytes(page[0..8].try_into().expect("8"));
        if blocks == 0 {
            return Err(NvmeError::NoSuchNamespace(nsid));
        }
        let format = usize::from(page[26] & 0xf);
        let lbaf = &page[128 + 4 * format..132 + 4 * format];
        let metadata = u16::from_le_bytes([lbaf[0], lbaf[1]]);
        let block_shift = u32::from(lbaf[2]);
        let block_size = 1u64.checked_shl(block_shift).unwrap_or(0);
        if !(9..=12).contains(&block_shift) || metadata != 0 {
            return Err(NvmeError::UnsupportedFormat {
                block_size,
                metadata,
            });
        }
        let mdts_pages = match self.identity.mdts {
            0 => usize::MAX,
            m => 1usize
                .checked_shl(u32::from(m) + self.caps.min_page_shift - 12)
                .unwrap_or(usize::MAX),
        };
        Ok(Namespace {
            nsid,
            blocks,
            block_size: block_size as u32,
            discard: self.identity.dataset_management(),
            max_discard_blocks: match self.identity.dmrsl {
                0 => u32::MAX,
                limit => limit,
            },
            volatile_write_cache: self.identity.volatile_write_cache,
            read_only: page[99] & 1 != 0,
            // PRP1 plus one full list page.
            max_pages_per_command: mdts_pages.min(MAX_PRP_LIST_ENTRIES + 1),
            sgl: self.identity.sgl_supported(),
        })
    }

    /// The ids of the active namespaces (Identify CNS 02h; a controller without that
    /// list has every id up to NN tried), each identified: what names a namespace
    /// (`NamespaceIdentity`). At most `MAX_IDENTIFIED_NAMESPACES`, in nsid order.
    pub fn identify_namespaces(&mut self) -> Result<Vec<NamespaceIdentity>, NvmeError> {
        let ids: Vec<u32> = match self.identify(IDENTIFY_ACTIVE_NAMESPACES, 0) {
            Ok(page) => page
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
                .take_while(|&nsid| nsid != 0)
                .filter(|&nsid| nsid <= self.identity.namespace_count)
                .collect(),
            Err(NvmeError::CommandFailed { .. }) => {
                (1..=self.identity.namespace_count.min(MAX_IDENTIFIED_NAMESPACES)).collect()
            }
            Err(error) => return Err(error),
        };
        let mut namespaces = Vec::new();
        for nsid in ids {
            let page = self.identify(0, nsid)?;
            namespaces.extend(NamespaceIdentity::parse(nsid, &page));
        }
        Ok(namespaces)
    }

    /// Asks for `wanted` I/O queue pairs; returns how many the controller granted.
    pub fn request_io_queues(&mut self, wanted: u16) -> Result<u16, NvmeError> {
        let n = u32::from(wanted.clamp(1, 0xfffe) - 1);
        let entry = SubmissionEntry::new(Opcode::SetFeatures as u8, 0, 0)
            .with_cdw(10, 0x07)
            .with_cdw(11, n | (n << 16));
        let completion = self.admin_command(entry)?;
        let submission = (completion.result & 0xffff) as u16;
        let completions = (completion.result >> 16) as u16;
        self.io_queues_granted = submission.min(completions).saturating_add(1).min(wanted);
        Ok(self.io_queues_granted)
    }

    /// I/O queue pairs granted and not yet created.
    pub fn io_queues_left(&self) -> u16 {
        (self.io_queues_granted + 1).saturating_sub(self.next_qid)
    }

    /// Creates the next I/O queue pair (`entries` deep, clamped to what the controller
    /// takes) for `namespace`.
    pub fn create_io_queue(
        &mut self,
        namespace: &Namespace,
        entries: u16,
    ) -> Result<IoQueue<H>, NvmeError> {
        if self.next_qid > self.io_queues_granted {
            return Err(NvmeError::NoQueueLeft);
        }
        let qid = self.next_qid;
        let entries = entries
            .clamp(2, 4096)
            .min(self.caps.max_queue_entries.min(4096) as u16);
        let sq_pages = pages_for(usize::from(entries) * SQ_ENTRY_LEN);
        let cq_pages = pages_for(usize::from(entries) * CQ_ENTRY_LEN);
        let sq = self
            .hal
            .allocate_dma(sq_pages)
            .ok_or(NvmeError::OutOfDmaMemory)?;
        let cq = self
            .hal
            .allocate_dma(cq_pages)
            .ok_or(NvmeError::OutOfDmaMemory)?;
        self.create_pair(qid, entries, sq, cq)?;
        self.next_qid += 1;
        self.created.push(CreatedQueue {
            qid,
            entries,
            sq,
            cq,
        });
        IoQueue::new(
            self.hal.clone(),
            &self.caps,
            namespace,
            (qid, entries),
            (sq, cq),
            self.recoverer.link(),
        )
    }
}

impl<H: Hal> Controller<H> {
    /// Has the controller make I/O queue pair `qid`, `entries` deep, in `sq` and `cq`.
    fn create_pair(
        &mut self,
        qid: u16,
        entries: u16,
        sq: DmaRegion,
        cq: DmaRegion,
    ) -> Result<(), NvmeError> {
        let size = u32::from(entries - 1) << 16;
        // Completion queue first: the submission queue names it. Physically contiguous,
        // interrupts off.
        self.admin_command(
            SubmissionEntry::new(Opcode::CreateIoCq as u8, 0, 0)
                .with_prp(cq.address(), 0)
                .with_cdw(10, size | u32::from(qid))
                .with_cdw(11, 1),
        )?;
        self.admin_command(
            SubmissionEntry::new(Opcode::CreateIoSq as u8, 0, 0)
                .with_prp(sq.address(), 0)
                .with_cdw(10, size | u32::from(qid))
                .with_cdw(11, (u32::from(qid) << 16) | 1),
        )?;
        Ok(())
    }
}

impl<H: Hal> Controller<H> {
    /// Asks the controller to disable (CC.EN = 0, no shutdown notification): every
    /// queue is dropped and no command of it runs any more. A live upgrade's stop: the
    /// next image enables it again at boot, and RTD3E's seconds are not spent.
    pub fn begin_disable(&mut self) {
        let cc = self.hal.read_register(reg::CC);
        self.hal.write_register(reg::CC, cc & !reg::CC_ENABLE);
    }

    /// Whether the disable `begin_disable` asked for is done (CSTS.RDY = 0).
    pub fn disabled(&self) -> bool {
        self.hal.read_register(reg::CSTS) & reg::CSTS_READY == 0
    }

    /// How long the controller may take to change CSTS.RDY (CAP.TO, bounded).
    pub fn ready_timeout_ms(&self) -> u64 {
        self.ready_timeout_ms
    }
}

/// A controller stopped by disabling it, without the shutdown notification (a live
/// upgrade: docs/design.md §4.12).
pub struct Disable<'a, H: Hal>(pub &'a mut Controller<H>);

impl<H: Hal> blkdev::shutdown::Stop for Disable<'_, H> {
    fn begin_stop(&mut self) -> Result<(), alloc::string::String> {
        self.0.begin_disable();
        Ok(())
    }

    fn stopped(&mut self) -> Result<bool, alloc::string::String> {
        Ok(self.0.disabled())
    }

    fn stop_deadline_ns(&self) -> u64 {
        self.0.ready_timeout_ms() * 1_000_000
    }
}

/// A controller stops by its normal shutdown notification.
impl<H: Hal> blkdev::shutdown::Stop for Controller<H> {
    fn begin_stop(&mut self) -> Result<(), alloc::string::String> {
        self.begin_shutdown();
        Ok(())
    }

    fn stopped(&mut self) -> Result<bool, alloc::string::String> {
        self.shutdown_complete()
            .map_err(|e| alloc::string::ToString::to_string(&e))
    }

    fn stop_deadline_ns(&self) -> u64 {
        self.shutdown_timeout_ms() * 1_000_000
    }
}

pub(crate) fn pages_for(bytes: usize) -> usize {
    bytes.div_ceil(PAGE_SIZE as usize).max(1)
}
