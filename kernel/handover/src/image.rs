// SPDX-License-Identifier: MIT OR Apache-2.0
//! The checks a new image passes before the running one stops anything: its size and
//! checksum, an x86_64 ELF whose loadable segments lie in the load window, the PVH entry
//! note, the handover ABI it accepts, and its build id (docs/design.md §4.12, 2).
//!
//! Everything is read with checked arithmetic from the staged copy; nothing is trusted
//! because dom0 sent it (a toolstack bug, a truncated file).

use alloc::vec::Vec;
use core::ops::Range;
use sha2::{Digest, Sha256};

/// Largest image accepted, and the size of the load window.
pub const IMAGE_MAX: usize = 8 << 20;
/// Where every blkdom image is linked (`linker.ld`): the load window starts here.
pub const LOAD_BASE: u64 = 0x40_0000;
/// The physical range every image's loadable segments (with their `.bss`) must lie in.
/// Each image keeps it out of its frame allocator, so a new image only ever lands on
/// the running image's own code and data.
pub const LOAD_WINDOW: Range<u64> = LOAD_BASE..LOAD_BASE + IMAGE_MAX as u64;
/// Most PT_LOAD segments accepted (ours has three).
pub const MAX_SEGMENTS: usize = 16;
/// Longest build id kept (a GNU build id is 20 bytes with sha1, 32 at most).
pub const MAX_BUILD_ID: usize = 32;

/// `XEN_ELFNOTE_PHYS32_ENTRY`: the 32-bit physical PVH entry.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// `NT_GNU_BUILD_ID`.
pub const NT_GNU_BUILD_ID: u32 = 3;
/// The blkdom note saying which handover ABI versions an image reads: its descriptor is
/// two little-endian u32, the lowest and the highest.
pub const BLKDOM_NOTE_HANDOVER: u32 = 1;
/// The owner name of blkdom's own notes.
pub const BLKDOM_NOTE_NAME: &[u8] = b"blkdom";

const ELF_HEADER: usize = 64;
const PHDR_SIZE: usize = 56;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PF_X: u32 = 1;
const EM_X86_64: u16 = 62;
const ET_EXEC: u16 = 2;

/// What [`check`] is given besides the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// `size=` of the request.
    pub size: usize,
    /// `sha256=` of the request.
    pub sha256: [u8; 32],
    /// The handover ABI version the running image writes.
    pub handover_version: u32,
}

/// One loadable segment: `file` bytes of the image go to `paddr`, followed by
/// `memsz - file.len()` zero bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub paddr: u64,
    pub file: Range<usize>,
    pub memsz: u64,
    pub executable: bool,
}

/// An image that passed every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedImage {
    /// The PVH entry (`XEN_ELFNOTE_PHYS32_ENTRY`).
    pub entry32: u32,
    pub segments: Vec<Segment>,
    pub build_id: BuildId,
    /// The handover ABI versions the image reads.
    pub handover_versions: core::ops::RangeInclusive<u32>,
}

/// A build id, up to [`MAX_BUILD_ID`] bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BuildId {
    bytes: [u8; MAX_BUILD_ID],
    len: u8,
}

impl BuildId {
    /// `None` for an empty id or one longer than [`MAX_BUILD_ID`].
    pub fn new(id: &[u8]) -> Option<Self> {
        if id.is_empty() || id.len() > MAX_BUILD_ID {
            return None;
        }
        let mut bytes = [0; MAX_BUILD_ID];
        bytes[..id.len()].copy_from_slice(id);
        Some(Self {
            bytes,
            len: id.len() as u8,
        })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl core::fmt::Display for BuildId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.as_bytes()
            .iter()
            .try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl core::fmt::Debug for BuildId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "BuildId({self})")
    }
}

/// Why an image is refused; the text goes to the console and `data/blkdom-upgrade`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageError {
    TooLarge(usize),
    SizeMismatch { expected: usize, got: usize },
    Checksum,
    NotElf64,
    NotX86_64Executable,
    BadProgramHeaders,
    TooManySegments(usize),
    SegmentOutsideFile { index: usize },
    SegmentFileLargerThanMemory { index: usize },
    SegmentOutsideWindow { index: usize, start: u64, end: u64 },
    SegmentsOverlap { first: usize, second: usize },
    NoLoadableSegment,
    BadNote,
    NoPvhEntry,
    EntryNotExecutable(u32),
    NoBuildId,
    NoHandoverNote,
    HandoverVersion { ours: u32, min: u32, max: u32 },
}

impl core::fmt::Display for ImageError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use ImageError::*;
        match self {
            TooLarge(size) => write!(f, "image of {size} bytes: at most {IMAGE_MAX}"),
            SizeMismatch { expected, got } => {
                write!(f, "image of {got} bytes, the request says {expected}")
            }
            Checksum => f.write_str("sha256 differs from the request's"),
            NotElf64 => f.write_str("not a little-endian ELF64 file"),
            NotX86_64Executable => f.write_str("not an x86_64 executable"),
            BadProgramHeaders => f.write_str("program headers outside the file"),
            TooManySegments(n) => write!(f, "{n} program headers: at most {MAX_SEGMENTS} loaded"),
            SegmentOutsideFile { index } => write!(f, "segment {index} lies outside the file"),
            SegmentFileLargerThanMemory { index } => {
                write!(f, "segment {index}: file size above memory size")
            }
            SegmentOutsideWindow { index, start, end } => write!(
                f,
                "segment {index} at {start:#x}-{end:#x} leaves the load window {:#x}-{:#x}",
                LOAD_WINDOW.start, LOAD_WINDOW.end
            ),
            SegmentsOverlap { first, second } => {
                write!(f, "segments {first} and {second} overlap")
            }
            NoLoadableSegment => f.write_str("no loadable segment"),
            BadNote => f.write_str("a note runs past its segment"),
            NoPvhEntry => f.write_str("no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY)"),
            EntryNotExecutable(entry) => {
                write!(f, "PVH entry {entry:#x} is not in an executable segment")
            }
            NoBuildId => f.write_str("no build id note (1 to 32 bytes)"),
            NoHandoverNote => f.write_str("no blkdom handover note: not a blkdom image"),
            HandoverVersion { ours, min, max } => write!(
                f,
                "the image reads handover versions {min}..={max}, this one writes {ours}"
            ),
        }
    }
}

impl core::error::Error for ImageError {}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

fn usize_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64_at(b, at)?).ok()
}

/// The sha256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// One ELF note: owner name (without its NUL), type, descriptor.
struct Note<'a> {
    name: &'a [u8],
    kind: u32,
    desc: &'a [u8],
}

/// Calls `each` with every note of one PT_NOTE segment's bytes; an error if one runs
/// past them. Allocates nothing: the running image reads its own notes before its heap
/// exists.
fn for_each_note<'a>(
    mut bytes: &'a [u8],
    mut each: impl FnMut(Note<'a>),
) -> Result<(), ImageError> {
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while !bytes.is_empty() {
        let namesz = u32_at(bytes, 0).ok_or(ImageError::BadNote)? as usize;
        let descsz = u32_at(bytes, 4).ok_or(ImageError::BadNote)? as usize;
        let kind = u32_at(bytes, 8).ok_or(ImageError::BadNote)?;
        let name_end = align4(namesz)
            .and_then(|n| n.checked_add(12))
            .ok_or(ImageError::BadNote)?;
        let desc_end = align4(descsz)
            .and_then(|d| d.checked_add(name_end))
            .ok_or(ImageError::BadNote)?;
        if desc_end > bytes.len() {
            return Err(ImageError::BadNote);
        }
        let mut name = &bytes[12..12 + namesz];
        if let [rest @ .., 0] = name {
            name = rest;
        }
        each(Note {
            name,
            kind,
            desc: &bytes[name_end..name_end + descsz],
        });
        bytes = &bytes[desc_end..];
    }
    Ok(())
}

/// The build id among `bytes`, the notes of a PT_NOTE segment or `.note` section (the
/// running image reads its own this way).
pub fn build_id_in(bytes: &[u8]) -> Option<BuildId> {
    let mut id = None;
    for_each_note(bytes, |n| {
        if n.name == b"GNU" && n.kind == NT_GNU_BUILD_ID {
            id = id.or(BuildId::new(n.desc));
        }
    })
    .ok()?;
    id
}

/// Checks `image` against the request and the rules above.
pub fn check(image: &[u8], expected: &Expected) -> Result<CheckedImage, ImageError> {
    if image.len() > IMAGE_MAX {
        return Err(ImageError::TooLarge(image.len()));
    }
    if image.len() != expected.size {
        return Err(ImageError::SizeMismatch {
            expected: expected.size,
            got: image.len(),
        });
    }
    if sha256(image) != expected.sha256 {
        return Err(ImageError::Checksum);
    }
    // e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT.
    if image.len() < ELF_HEADER || image[..4] != *b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return Err(ImageError::NotElf64);
    }
    if u16_at(image, 16) != Some(ET_EXEC) || u16_at(image, 18) != Some(EM_X86_64) {
        return Err(ImageError::NotX86_64Executable);
    }
    let phoff = usize_at(image, 32).ok_or(ImageError::BadProgramHeaders)?;
    let phentsize = u16_at(image, 54).ok_or(ImageError::BadProgramHeaders)? as usize;
    let phnum = u16_at(image, 56).ok_or(ImageError::BadProgramHeaders)? as usize;
    if phentsize != PHDR_SIZE {
        return Err(ImageError::BadProgramHeaders);
    }
    let table_end = phnum
        .checked_mul(PHDR_SIZE)
        .and_then(|n| n.checked_add(phoff))
        .ok_or(ImageError::BadProgramHeaders)?;
    if table_end > image.len() {
        return Err(ImageError::BadProgramHeaders);
    }

    let mut segments: Vec<Segment> = Vec::new();
    let mut entry32 = None;
    let mut build_id = None;
    let mut handover = None;
    for index in 0..phnum {
        let ph = &image[phoff + index * PHDR_SIZE..phoff + (index + 1) * PHDR_SIZE];
        let field = |at| usize_at(ph, at).ok_or(ImageError::BadProgramHeaders);
        let kind = u32_at(ph, 0).ok_or(ImageError::BadProgramHeaders)?;
        let flags = u32_at(ph, 4).ok_or(ImageError::BadProgramHeaders)?;
        let offset = field(8)?;
        let paddr = u64_at(ph, 24).ok_or(ImageError::BadProgramHeaders)?;
        let filesz = field(32)?;
        let memsz = u64_at(ph, 40).ok_or(ImageError::BadProgramHeaders)?;
        let file = offset
            ..offset
                .checked_add(filesz)
                .ok_or(ImageError::SegmentOutsideFile { index })?;
        if file.end > image.len() {
            return Err(ImageError::SegmentOutsideFile { index });
        }
        match kind {
            PT_LOAD => {
                if filesz as u64 > memsz {
                    return Err(ImageError::SegmentFileLargerThanMemory { index });
                }
                let end = paddr.checked_add(memsz);
                if paddr < LOAD_WINDOW.start || end.is_none_or(|end| end > LOAD_WINDOW.end) {
                    return Err(ImageError::SegmentOutsideWindow {
                        index,
                        start: paddr,
                        end: end.unwrap_or(u64::MAX),
                    });
                }
                if segments.len() == MAX_SEGMENTS {
                    return Err(ImageError::TooManySegments(phnum));
                }
                segments.push(Segment {
                    paddr,
                    file,
                    memsz,
                    executable: flags & PF_X != 0,
                });
            }
            PT_NOTE => {
                for_each_note(&image[file], |note| {
                    match (note.name, note.kind) {
                        (b"Xen", XEN_ELFNOTE_PHYS32_ENTRY) => {
                            // A 4-byte address (some linkers pad it to 8).
                            entry32 = u32_at(note.desc, 0);
                        }
                        (b"GNU", NT_GNU_BUILD_ID) => build_id = BuildId::new(note.desc),
                        (BLKDOM_NOTE_NAME, BLKDOM_NOTE_HANDOVER) if note.desc.len() == 8 => {
                            handover = Some((
                                u32_at(note.desc, 0).unwrap_or(0),
                                u32_at(note.desc, 4).unwrap_or(0),
                            ));
                        }
                        _ => {}
                    }
                })?;
            }
            _ => {}
        }
    }
    if segments.is_empty() {
        return Err(ImageError::NoLoadableSegment);
    }
    for (first, a) in segments.iter().enumerate() {
        for (second, b) in segments.iter().enumerate().skip(first + 1) {
            if a.paddr < b.paddr + b.memsz && b.paddr < a.paddr + a.memsz {
                return Err(ImageError::SegmentsOverlap { first, second });
            }
        }
    }
    let entry32 = entry32.ok_or(ImageError::NoPvhEntry)?;
    let entry = u64::from(entry32);
    if !segments
        .iter()
        .any(|s| s.executable && s.paddr <= entry && entry < s.paddr + s.file.len() as u64)
    {
        return Err(ImageError::EntryNotExecutable(entry32));
    }
    let build_id = build_id.ok_or(ImageError::NoBuildId)?;
    let (min, max) = handover.ok_or(ImageError::NoHandoverNote)?;
    if !(min..=max).contains(&expected.handover_version) {
        return Err(ImageError::HandoverVersion {
            ours: expected.handover_version,
            min,
            max,
        });
    }
    Ok(CheckedImage {
        entry32,
        segments,
        build_id,
        handover_versions: min..=max,
    })
}
