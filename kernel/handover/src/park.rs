// SPDX-License-Identifier: MIT OR Apache-2.0
//! The park area (docs/design.md §4.12, 5): the pages below 1 MiB that outlive the jump.
//! The old image writes them; its trampoline and parked vCPUs run from them; the new
//! image reads the `hvm_start_info` there and releases the parked vCPUs through their
//! mailboxes. So the layout and the mailbox protocol are part of the handover ABI:
//! change either and raise [`crate::block::HANDOVER_VERSION`].
//!
//! Everything here builds bytes (page tables, the trampoline's parameters, the new
//! `hvm_start_info`) or reads them back; the kernel copies them into place.

use alloc::vec;
use alloc::vec::Vec;
use boot::start_info::{HvmMemmapEntry, HvmModlistEntry, HvmStartInfo, HVM_START_MAGIC};
use core::mem::{offset_of, size_of};

use crate::image::Segment;

pub const PAGE: u64 = 4096;
/// Where the park area sits: below 1 MiB (the frame allocator of every image keeps that
/// memory out), above the AP start-up page (0x8000) and the real-mode interrupt table.
pub const PARK_BASE: u64 = 0x1_0000;
/// Its size: code, parameters, mailboxes, the parked vCPUs' stacks, the new
/// `hvm_start_info`, the identity page tables.
pub const PARK_LEN: u64 = 16 * PAGE;

/// Page 0: the trampoline and the parked vCPUs' loop (copied from the old image).
pub const CODE_OFFSET: u64 = 0;
/// Page 1: the trampoline's parameters and GDT; its stack grows down from the page's end.
pub const PARAMS_OFFSET: u64 = PAGE;
/// Page 2: one 64-byte mailbox per vCPU.
pub const MAILBOX_OFFSET: u64 = 2 * PAGE;
/// Page 3: a 64-byte stack per parked vCPU (a far return's worth).
pub const AP_STACKS_OFFSET: u64 = 3 * PAGE;
/// Pages 4-7: the new `hvm_start_info`, its module list, memory map and strings.
pub const START_INFO_OFFSET: u64 = 4 * PAGE;
pub const START_INFO_LEN: u64 = 4 * PAGE;
/// Pages 8-13: PML4, PDPT and four page directories: 0-4 GiB identity, 2 MiB pages.
pub const TABLES_OFFSET: u64 = 8 * PAGE;
pub const TABLES_LEN: u64 = 6 * PAGE;

/// vCPUs the park area has mailboxes for (`block::MAX_VCPUS`).
pub const MAX_VCPUS: usize = crate::block::MAX_VCPUS;
pub const MAILBOX_SIZE: u64 = 64;

// The trampoline's parameters (page 1), offsets the assembly reads.
/// The park tables' PML4.
pub const P_CR3: u64 = 0x00;
/// The new image's 32-bit PVH entry.
pub const P_ENTRY32: u64 = 0x08;
/// The new `hvm_start_info` (EBX at the entry).
pub const P_START_INFO: u64 = 0x10;
/// How many segments follow at [`P_SEGMENTS`].
pub const P_SEGMENT_COUNT: u64 = 0x18;
/// The GDT's pseudo-descriptor (limit u16, base u64).
pub const P_GDT_PTR: u64 = 0x20;
/// The GDT: null, 64-bit code ([`SEL_CODE64`]), data ([`SEL_DATA`]), 32-bit code
/// ([`SEL_CODE32`]).
pub const P_GDT: u64 = 0x40;
/// Segments: source, destination, file bytes, memory bytes (u64 each).
pub const P_SEGMENTS: u64 = 0x80;
pub const SEGMENT_RECORD: u64 = 32;
/// As `image::MAX_SEGMENTS`: what the checks let through fits.
pub const MAX_SEGMENTS: usize = crate::image::MAX_SEGMENTS;

pub const SEL_CODE64: u16 = 0x08;
pub const SEL_DATA: u16 = 0x10;
pub const SEL_CODE32: u16 = 0x18;
const GDT: [u64; 4] = [
    0,
    0x00af_9a00_0000_ffff, // 64-bit code
    0x00cf_9200_0000_ffff, // flat data
    0x00cf_9a00_0000_ffff, // flat 32-bit code
];

// A mailbox (page 2, one per vCPU): the parked vCPU sets `PARKED` once it spins in the
// park area on the park tables; the new image fills CR3, stack, entry and argument and
// then sets `GO`; the vCPU loads them and calls `entry(arg)`.
pub const M_GO: u64 = 0x00;
pub const M_CR3: u64 = 0x08;
pub const M_STACK: u64 = 0x10;
pub const M_ENTRY: u64 = 0x18;
pub const M_ARG: u64 = 0x20;
pub const M_PARKED: u64 = 0x28;
/// The value of `GO` and `PARKED` when set.
pub const MAILBOX_SET: u64 = 1;

/// The module `cmdline` that names the handover block in `hvm_start_info`.
pub const HANDOVER_CMDLINE: &str = "blkdom-handover";

/// Physical address of vCPU `vcpu`'s mailbox.
pub fn mailbox(park: u64, vcpu: usize) -> u64 {
    park + MAILBOX_OFFSET + vcpu as u64 * MAILBOX_SIZE
}

/// Top of vCPU `vcpu`'s park stack (16-byte aligned).
pub fn ap_stack_top(park: u64, vcpu: usize) -> u64 {
    park + AP_STACKS_OFFSET + (vcpu as u64 + 1) * MAILBOX_SIZE
}

/// The trampoline's stack: the top of the parameter page.
pub fn trampoline_stack_top(park: u64) -> u64 {
    park + PARAMS_OFFSET + PAGE
}

/// The six pages of an identity map of 0-4 GiB with 2 MiB pages, to sit at `base`
/// (page-aligned, below 4 GiB): PML4, PDPT, then one page directory per GiB.
pub fn identity_tables(base: u64) -> Vec<u8> {
    debug_assert!(base.is_multiple_of(PAGE) && base + TABLES_LEN <= 1 << 32);
    const PRESENT_WRITABLE: u64 = 0x3;
    const LARGE: u64 = 0x80;
    let mut t = vec![0u8; TABLES_LEN as usize];
    let mut put = |page: u64, index: u64, entry: u64| {
        let at = (page * PAGE + index * 8) as usize;
        t[at..at + 8].copy_from_slice(&entry.to_le_bytes());
    };
    put(0, 0, (base + PAGE) | PRESENT_WRITABLE);
    for gib in 0..4 {
        put(1, gib, (base + (2 + gib) * PAGE) | PRESENT_WRITABLE);
        for i in 0..512 {
            let address = (gib << 30) + (i << 21);
            put(2 + gib, i, address | PRESENT_WRITABLE | LARGE);
        }
    }
    t
}

/// What the trampoline is told (page 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrampolineParams {
    pub entry32: u32,
    /// Where the staged image's bytes are (physical, identity mapped).
    pub image_paddr: u64,
    pub segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParkError {
    TooManySegments(usize),
    /// A segment's source is not inside the staged image.
    SegmentSource(usize),
    /// The new `hvm_start_info` does not fit its pages.
    StartInfoTooLarge(usize),
    /// A string with a NUL in it.
    Nul,
}

impl core::fmt::Display for ParkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ParkError::TooManySegments(n) => write!(f, "{n} segments for the trampoline"),
            ParkError::SegmentSource(i) => write!(f, "segment {i} outside the staged image"),
            ParkError::StartInfoTooLarge(n) => {
                write!(f, "the new hvm_start_info takes {n} bytes")
            }
            ParkError::Nul => f.write_str("a command line with a NUL"),
        }
    }
}

/// The parameter page for a park area at `park`: its bytes (`PAGE` long, the stack's
/// room at the end zero). `image_len` bounds every segment's source.
pub fn params_page(
    park: u64,
    params: &TrampolineParams,
    image_len: usize,
) -> Result<Vec<u8>, ParkError> {
    if params.segments.len() > MAX_SEGMENTS {
        return Err(ParkError::TooManySegments(params.segments.len()));
    }
    let mut page = vec![0u8; PAGE as usize];
    let mut put = |at: u64, value: &[u8]| {
        page[at as usize..at as usize + value.len()].copy_from_slice(value);
    };
    put(P_CR3, &(park + TABLES_OFFSET).to_le_bytes());
    put(P_ENTRY32, &u64::from(params.entry32).to_le_bytes());
    put(P_START_INFO, &(park + START_INFO_OFFSET).to_le_bytes());
    put(
        P_SEGMENT_COUNT,
        &(params.segments.len() as u64).to_le_bytes(),
    );
    put(P_GDT_PTR, &((GDT.len() * 8 - 1) as u16).to_le_bytes());
    put(P_GDT_PTR + 2, &(park + PARAMS_OFFSET + P_GDT).to_le_bytes());
    for (i, d) in GDT.iter().enumerate() {
        put(P_GDT + i as u64 * 8, &d.to_le_bytes());
    }
    for (i, s) in params.segments.iter().enumerate() {
        // The checks (`image::check`) already bound every segment to the file and the
        // load window; this only makes sure the copy reads the staged bytes.
        if s.file.start > s.file.end || s.file.end > image_len {
            return Err(ParkError::SegmentSource(i));
        }
        let at = P_SEGMENTS + i as u64 * SEGMENT_RECORD;
        put(
            at,
            &(params.image_paddr + s.file.start as u64).to_le_bytes(),
        );
        put(at + 8, &s.paddr.to_le_bytes());
        put(at + 16, &(s.file.len() as u64).to_le_bytes());
        put(at + 24, &s.memsz.to_le_bytes());
    }
    Ok(page)
}

/// A module as `hvm_start_info` lists it, with its command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    pub paddr: u64,
    pub size: u64,
    pub cmdline: Vec<u8>,
}

/// What the new `hvm_start_info` says: the old boot's (command line, memory map, RSDP,
/// modules but an old handover block) and the new handover block as one more module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartInfo {
    pub cmdline: Vec<u8>,
    pub rsdp: u64,
    pub memmap: Vec<HvmMemmapEntry>,
    pub modules: Vec<Module>,
}

impl StartInfo {
    /// The old boot's information with `handover` (address and length of the block)
    /// added as a module; a module the old boot was given as a handover is left out.
    pub fn for_jump(
        cmdline: &[u8],
        rsdp: u64,
        memmap: &[HvmMemmapEntry],
        boot_modules: &[Module],
        handover: (u64, u64),
    ) -> Self {
        let mut modules: Vec<Module> = boot_modules
            .iter()
            .filter(|m| m.cmdline != HANDOVER_CMDLINE.as_bytes())
            .cloned()
            .collect();
        modules.push(Module {
            paddr: handover.0,
            size: handover.1,
            cmdline: HANDOVER_CMDLINE.as_bytes().to_vec(),
        });
        Self {
            cmdline: cmdline.to_vec(),
            rsdp,
            memmap: memmap.to_vec(),
            modules,
        }
    }

    /// The bytes to copy to `base` (= park + [`START_INFO_OFFSET`]): the structure, its
    /// module list, its memory map, then the NUL-terminated strings, each aligned.
    pub fn encode(&self, base: u64) -> Result<Vec<u8>, ParkError> {
        let strings =
            core::iter::once(&self.cmdline).chain(self.modules.iter().map(|m| &m.cmdline));
        if strings.clone().any(|s| s.contains(&0)) {
            return Err(ParkError::Nul);
        }
        let modlist = size_of::<HvmStartInfo>().next_multiple_of(16);
        let memmap = modlist + self.modules.len() * size_of::<HvmModlistEntry>();
        let mut end = memmap + self.memmap.len() * size_of::<HvmMemmapEntry>();
        let mut string_at = Vec::new();
        for s in strings {
            string_at.push(end);
            end = (end + s.len() + 1).next_multiple_of(8);
        }
        if end > START_INFO_LEN as usize {
            return Err(ParkError::StartInfoTooLarge(end));
        }
        let mut b = vec![0u8; end];
        let mut put = |at: usize, value: &[u8]| b[at..at + value.len()].copy_from_slice(value);
        let si = |field: usize| field;
        put(
            si(offset_of!(HvmStartInfo, magic)),
            &HVM_START_MAGIC.to_le_bytes(),
        );
        put(si(offset_of!(HvmStartInfo, version)), &1u32.to_le_bytes());
        put(
            si(offset_of!(HvmStartInfo, nr_modules)),
            &(self.modules.len() as u32).to_le_bytes(),
        );
        put(
            si(offset_of!(HvmStartInfo, modlist_paddr)),
            &(base + modlist as u64).to_le_bytes(),
        );
        put(
            si(offset_of!(HvmStartInfo, cmdline_paddr)),
            &(base + string_at[0] as u64).to_le_bytes(),
        );
        put(
            si(offset_of!(HvmStartInfo, rsdp_paddr)),
            &self.rsdp.to_le_bytes(),
        );
        put(
            si(offset_of!(HvmStartInfo, memmap_paddr)),
            &(base + memmap as u64).to_le_bytes(),
        );
        put(
            si(offset_of!(HvmStartInfo, memmap_entries)),
            &(self.memmap.len() as u32).to_le_bytes(),
        );
        for (i, m) in self.modules.iter().enumerate() {
            let at = modlist + i * size_of::<HvmModlistEntry>();
            put(
                at + offset_of!(HvmModlistEntry, paddr),
                &m.paddr.to_le_bytes(),
            );
            put(
                at + offset_of!(HvmModlistEntry, size),
                &m.size.to_le_bytes(),
            );
            put(
                at + offset_of!(HvmModlistEntry, cmdline_paddr),
                &(base + string_at[i + 1] as u64).to_le_bytes(),
            );
        }
        for (i, e) in self.memmap.iter().enumerate() {
            let at = memmap + i * size_of::<HvmMemmapEntry>();
            put(at + offset_of!(HvmMemmapEntry, addr), &e.addr.to_le_bytes());
            put(at + offset_of!(HvmMemmapEntry, size), &e.size.to_le_bytes());
            put(at + offset_of!(HvmMemmapEntry, kind), &e.kind.to_le_bytes());
        }
        put(string_at[0], &self.cmdline);
        for (i, m) in self.modules.iter().enumerate() {
            put(string_at[i + 1], &m.cmdline);
        }
        Ok(b)
    }
}

/// Why a boot's handover module is not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleError {
    /// More than one module says it is the handover.
    Several,
    /// Empty, or larger than any block can be.
    Size(u64),
    /// Not inside the identity map, or not in RAM.
    Place { paddr: u64, size: u64 },
}

impl core::fmt::Display for ModuleError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ModuleError::Several => f.write_str("more than one handover module"),
            ModuleError::Size(n) => write!(f, "handover module of {n} bytes"),
            ModuleError::Place { paddr, size } => {
                write!(f, "handover module {paddr:#x}+{size:#x} is not in RAM")
            }
        }
    }
}

/// The handover module among a boot's modules (address, size, command line):
/// `Ok(None)` when there is none (a cold boot). It must be unique, sized as a block can
/// be, and lie in `ram` (ranges below the identity map's end, from the memory map). Its
/// bytes are then copied and checked with `block::Handover::decode`. Allocates nothing:
/// it runs before the heap exists.
pub fn find_handover<'a>(
    modules: impl IntoIterator<Item = (u64, u64, &'a [u8])>,
    ram: &[core::ops::Range<u64>],
) -> Result<Option<(u64, u64)>, ModuleError> {
    let mut found = modules
        .into_iter()
        .filter(|m| m.2 == HANDOVER_CMDLINE.as_bytes());
    let Some((paddr, size, _)) = found.next() else {
        return Ok(None);
    };
    if found.next().is_some() {
        return Err(ModuleError::Several);
    }
    let max = (crate::block::HEADER_LEN + crate::block::MAX_BODY) as u64;
    if size < crate::block::HEADER_LEN as u64 || size > max {
        return Err(ModuleError::Size(size));
    }
    let inside = paddr != 0
        && paddr
            .checked_add(size)
            .is_some_and(|end| ram.iter().any(|r| r.start <= paddr && end <= r.end));
    if !inside {
        return Err(ModuleError::Place { paddr, size });
    }
    Ok(Some((paddr, size)))
}
