// SPDX-License-Identifier: MIT OR Apache-2.0
//! Each check is met by an input that breaks exactly it, next to one that passes.

use crate::block::*;
use crate::image::{self, BuildId, Expected, ImageError, LOAD_BASE};
use crate::request::{self, Perm, RequestError};
use crate::wire::WireError;
use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

// ---- images --------------------------------------------------------------------------

/// A program header: type, flags, file offset, physical address, file size, memory size.
#[derive(Clone, Copy)]
struct Ph {
    kind: u32,
    flags: u32,
    offset: u64,
    paddr: u64,
    filesz: u64,
    memsz: u64,
}

fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
    let mut n = Vec::new();
    n.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
    n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    n.extend_from_slice(&kind.to_le_bytes());
    n.extend_from_slice(name);
    n.push(0);
    while n.len() % 4 != 0 {
        n.push(0);
    }
    n.extend_from_slice(desc);
    while n.len() % 4 != 0 {
        n.push(0);
    }
    n
}

fn default_notes() -> Vec<u8> {
    let mut notes = note(b"Xen", 18, &(LOAD_BASE as u32 + 0x10).to_le_bytes());
    notes.extend(note(b"GNU", 3, &[0xab; 20]));
    let mut versions = 1u32.to_le_bytes().to_vec();
    versions.extend_from_slice(&1u32.to_le_bytes());
    notes.extend(note(b"blkdom", 1, &versions));
    notes
}

/// An ELF64 with a text segment at the load base (0x1000 bytes of code), a data
/// segment with a `.bss` after it, and one PT_NOTE holding `notes`; `edit` may change
/// the program headers first.
fn elf_with(notes: &[u8], edit: impl FnOnce(&mut Vec<Ph>)) -> Vec<u8> {
    let code_at = 0x1000u64;
    let data_at = 0x2000u64;
    let notes_at = 0x3000u64;
    let mut phs = vec![
        Ph {
            kind: 1,
            flags: 5,
            offset: code_at,
            paddr: LOAD_BASE,
            filesz: 0x1000,
            memsz: 0x1000,
        },
        Ph {
            kind: 1,
            flags: 6,
            offset: data_at,
            paddr: LOAD_BASE + 0x1000,
            filesz: 0x800,
            memsz: 0x4000,
        },
        Ph {
            kind: 4,
            flags: 4,
            offset: notes_at,
            paddr: 0,
            filesz: notes.len() as u64,
            memsz: 0,
        },
    ];
    edit(&mut phs);
    let mut f = vec![0u8; notes_at as usize + notes.len()];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2;
    f[5] = 1;
    f[6] = 1;
    f[16..18].copy_from_slice(&2u16.to_le_bytes());
    f[18..20].copy_from_slice(&62u16.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes());
    f[54..56].copy_from_slice(&56u16.to_le_bytes());
    f[56..58].copy_from_slice(&(phs.len() as u16).to_le_bytes());
    for (i, ph) in phs.iter().enumerate() {
        let at = 64 + i * 56;
        f[at..at + 4].copy_from_slice(&ph.kind.to_le_bytes());
        f[at + 4..at + 8].copy_from_slice(&ph.flags.to_le_bytes());
        f[at + 8..at + 16].copy_from_slice(&ph.offset.to_le_bytes());
        f[at + 16..at + 24].copy_from_slice(&ph.paddr.to_le_bytes());
        f[at + 24..at + 32].copy_from_slice(&ph.paddr.to_le_bytes());
        f[at + 32..at + 40].copy_from_slice(&ph.filesz.to_le_bytes());
        f[at + 40..at + 48].copy_from_slice(&ph.memsz.to_le_bytes());
    }
    f[code_at as usize..code_at as usize + 4].copy_from_slice(&[0xf4; 4]);
    f[notes_at as usize..].copy_from_slice(notes);
    f
}

fn elf() -> Vec<u8> {
    elf_with(&default_notes(), |_| {})
}

fn expect(img: &[u8]) -> Expected {
    Expected {
        size: img.len(),
        sha256: image::sha256(img),
        handover_version: HANDOVER_VERSION,
    }
}

fn check(img: &[u8]) -> Result<image::CheckedImage, ImageError> {
    image::check(img, &expect(img))
}

#[test]
fn a_good_image_passes_with_its_entry_segments_and_build_id() {
    let checked = check(&elf()).unwrap();
    assert_eq!(checked.entry32, LOAD_BASE as u32 + 0x10);
    assert_eq!(checked.segments.len(), 2);
    assert_eq!(checked.segments[1].memsz, 0x4000);
    assert_eq!(checked.segments[1].file, 0x2000..0x2800);
    assert!(checked.segments[0].executable && !checked.segments[1].executable);
    assert_eq!(checked.build_id.to_string(), "ab".repeat(20));
    assert_eq!(checked.handover_versions, 1..=1);
}

#[test]
fn the_request_size_and_checksum_must_match() {
    let img = elf();
    let mut e = expect(&img);
    e.size += 1;
    assert!(matches!(
        image::check(&img, &e),
        Err(ImageError::SizeMismatch { .. })
    ));
    let mut e = expect(&img);
    e.sha256[0] ^= 1;
    assert_eq!(image::check(&img, &e), Err(ImageError::Checksum));
    let mut tampered = img.clone();
    tampered[0x1001] ^= 0xff;
    assert_eq!(
        image::check(&tampered, &expect(&img)),
        Err(ImageError::Checksum)
    );
}

#[test]
fn an_image_above_the_bound_is_refused_before_it_is_hashed() {
    let big = vec![0u8; image::IMAGE_MAX + 1];
    assert_eq!(check(&big), Err(ImageError::TooLarge(image::IMAGE_MAX + 1)));
}

#[test]
fn not_an_x86_64_elf64_executable() {
    let mut img = elf();
    img[4] = 1; // ELFCLASS32
    assert_eq!(check(&img), Err(ImageError::NotElf64));
    let mut img = elf();
    img[0] = 0;
    assert_eq!(check(&img), Err(ImageError::NotElf64));
    let mut img = elf();
    img[18] = 3; // EM_386
    assert_eq!(check(&img), Err(ImageError::NotX86_64Executable));
    let mut img = elf();
    img[16] = 3; // ET_DYN
    assert_eq!(check(&img), Err(ImageError::NotX86_64Executable));
}

#[test]
fn program_headers_past_the_file_are_refused() {
    let mut img = elf();
    img[56..58].copy_from_slice(&2000u16.to_le_bytes());
    assert_eq!(check(&img), Err(ImageError::BadProgramHeaders));
}

#[test]
fn segments_must_lie_in_the_file_and_the_load_window() {
    let img = elf_with(&default_notes(), |p| p[0].filesz = 0x10_0000);
    assert_eq!(
        check(&img),
        Err(ImageError::SegmentOutsideFile { index: 0 })
    );
    let img = elf_with(&default_notes(), |p| p[1].memsz = 0x400);
    assert_eq!(
        check(&img),
        Err(ImageError::SegmentFileLargerThanMemory { index: 1 })
    );
    let img = elf_with(&default_notes(), |p| p[0].paddr = LOAD_BASE - 0x1000);
    assert!(matches!(
        check(&img),
        Err(ImageError::SegmentOutsideWindow { index: 0, .. })
    ));
    // A .bss that runs past the window's end.
    let img = elf_with(&default_notes(), |p| p[1].memsz = image::IMAGE_MAX as u64);
    assert!(matches!(
        check(&img),
        Err(ImageError::SegmentOutsideWindow { index: 1, .. })
    ));
    let img = elf_with(&default_notes(), |p| p[1].memsz = u64::MAX);
    assert!(matches!(
        check(&img),
        Err(ImageError::SegmentOutsideWindow { index: 1, .. })
    ));
}

#[test]
fn overlapping_segments_are_refused() {
    let img = elf_with(&default_notes(), |p| p[1].paddr = LOAD_BASE + 0x800);
    assert_eq!(
        check(&img),
        Err(ImageError::SegmentsOverlap {
            first: 0,
            second: 1
        })
    );
}

#[test]
fn the_pvh_entry_note_must_be_there_and_point_at_code() {
    let mut notes = note(b"GNU", 3, &[1; 20]);
    notes.extend(note(b"blkdom", 1, &[1, 0, 0, 0, 1, 0, 0, 0]));
    assert_eq!(
        check(&elf_with(&notes, |_| {})),
        Err(ImageError::NoPvhEntry)
    );
    // In the data segment.
    let mut notes = note(b"Xen", 18, &(LOAD_BASE as u32 + 0x1010).to_le_bytes());
    notes.extend(note(b"GNU", 3, &[1; 20]));
    notes.extend(note(b"blkdom", 1, &[1, 0, 0, 0, 1, 0, 0, 0]));
    assert_eq!(
        check(&elf_with(&notes, |_| {})),
        Err(ImageError::EntryNotExecutable(LOAD_BASE as u32 + 0x1010))
    );
}

#[test]
fn a_note_running_past_its_segment_is_refused() {
    let mut notes = default_notes();
    notes[4..8].copy_from_slice(&4096u32.to_le_bytes());
    assert_eq!(check(&elf_with(&notes, |_| {})), Err(ImageError::BadNote));
}

#[test]
fn a_build_id_and_a_handover_note_that_takes_our_version_are_required() {
    let entry = note(b"Xen", 18, &(LOAD_BASE as u32 + 0x10).to_le_bytes());
    let mut notes = entry.clone();
    notes.extend(note(b"blkdom", 1, &[1, 0, 0, 0, 1, 0, 0, 0]));
    assert_eq!(check(&elf_with(&notes, |_| {})), Err(ImageError::NoBuildId));

    let mut notes = entry.clone();
    notes.extend(note(b"GNU", 3, &[1; 20]));
    assert_eq!(
        check(&elf_with(&notes, |_| {})),
        Err(ImageError::NoHandoverNote)
    );

    let mut notes = entry.clone();
    notes.extend(note(b"GNU", 3, &[1; 20]));
    notes.extend(note(b"blkdom", 1, &[2, 0, 0, 0, 3, 0, 0, 0]));
    assert_eq!(
        check(&elf_with(&notes, |_| {})),
        Err(ImageError::HandoverVersion {
            ours: 1,
            min: 2,
            max: 3
        })
    );
}

// ---- the request ---------------------------------------------------------------------

fn sha_hex() -> String {
    "0123456789abcdef".repeat(4)
}

#[test]
fn a_request_parses_and_needs_exactly_its_index_pages() {
    let r = request::parse(&format!("v1 size=614992 sha256={} index=17", sha_hex())).unwrap();
    assert_eq!(r.size, 614_992);
    assert_eq!(r.sha256[0], 0x01);
    assert_eq!(r.index, [17]);
    assert_eq!(r.pages(), 151);
    // 8 MiB: 2,048 pages, two index pages.
    let text = format!("v1 size={} sha256={} index=1,2", 8 << 20, sha_hex());
    assert_eq!(request::parse(&text).unwrap().index, [1, 2]);
    let text = format!("v1 size={} sha256={} index=1", 8 << 20, sha_hex());
    assert_eq!(
        request::parse(&text),
        Err(RequestError::IndexPages {
            given: 1,
            needed: 2
        })
    );
    let text = format!("v1 size=4096 sha256={} index=1,2", sha_hex());
    assert_eq!(
        request::parse(&text),
        Err(RequestError::IndexPages {
            given: 2,
            needed: 1
        })
    );
}

#[test]
fn bad_requests_are_refused() {
    let sha = sha_hex();
    for (text, error) in [
        (
            format!("v2 size=1 sha256={sha} index=1"),
            RequestError::Version,
        ),
        (
            format!("v1 size=0 sha256={sha} index=1"),
            RequestError::Size(0),
        ),
        (
            format!("v1 size={} sha256={sha} index=1,2,3", (8 << 20) + 1),
            RequestError::Size((8 << 20) + 1),
        ),
        (
            format!("v1 size=x sha256={sha} index=1"),
            RequestError::Syntax("size"),
        ),
        (
            "v1 size=1 sha256=00 index=1".to_string(),
            RequestError::Syntax("sha256"),
        ),
        (
            format!("v1 size=1 sha256={sha} index=1,x"),
            RequestError::Syntax("index"),
        ),
        (
            format!("v1 size=1 sha256={sha}"),
            RequestError::Syntax("index"),
        ),
        (
            format!("v1 size=1 size=2 sha256={sha} index=1"),
            RequestError::Syntax("field"),
        ),
        (
            format!("v1 size=1 sha256={sha} index=1 extra=1"),
            RequestError::Syntax("field"),
        ),
    ] {
        assert_eq!(request::parse(&text), Err(error), "{text}");
    }
}

#[test]
fn only_a_node_no_domain_but_the_toolstack_can_write_is_its_word() {
    let p = |domid, read, write| Perm { domid, read, write };
    // libxl's `control` directory: owned by dom0, read-only for the domain.
    assert!(request::only_toolstack_writes(&[
        p(0, false, false),
        p(7, true, false)
    ]));
    // Owned by blkdom (7) itself.
    assert!(!request::only_toolstack_writes(&[p(7, false, false)]));
    // Everyone may write.
    assert!(!request::only_toolstack_writes(&[p(0, true, true)]));
    // A guest given write.
    assert!(!request::only_toolstack_writes(&[
        p(0, false, false),
        p(9, true, true)
    ]));
    assert!(!request::only_toolstack_writes(&[]));
}

// ---- the handover block --------------------------------------------------------------

const RAM: [core::ops::Range<u64>; 2] = [0..0xa_0000, 0x10_0000..0x4000_0000];

fn limits() -> Limits<'static> {
    Limits {
        ram: &RAM,
        vcpus: 4,
        max_queues: 4,
    }
}

fn handover() -> Handover {
    Handover {
        old_build_id: BuildId::new(&[0xcd; 20]).unwrap(),
        generation: 3,
        vcpus: 2,
        vcpu_info: vec![0x20_0000, 0x20_0040],
        shared_info: 0x20_1000,
        park_page: 0x7000,
        ranges: vec![
            MemRange {
                kind: RangeKind::Park,
                start: 0x6000,
                len: 0x2000,
            },
            MemRange {
                kind: RangeKind::VcpuInfo,
                start: 0x20_0000,
                len: 0x1000,
            },
            MemRange {
                kind: RangeKind::RamDisk,
                start: 0x100_0000,
                len: 0x40_0000,
            },
            MemRange {
                kind: RangeKind::SharedInfo,
                start: 0x20_1000,
                len: 0x1000,
            },
        ],
        ram_disks: vec![RamDiskRecord {
            name: "scratch".into(),
            capacity: 1 << 30,
            stripes: vec![
                Stripe {
                    index: 0,
                    paddr: 0x100_0000,
                },
                Stripe {
                    index: 7,
                    paddr: 0x101_0000,
                },
                Stripe {
                    index: 16383,
                    paddr: 0x13f_0000,
                },
            ],
        }],
        vbds: vec![VbdRecord {
            backend_path: "backend/vbd/5/51712".into(),
            frontend_path: "/local/domain/5/device/vbd/51712".into(),
            frontend_id: 5,
            params: "ram:1G:scratch".into(),
            ring_order: 1,
            protocol: PROTOCOL_X86_32,
            persistent_grants: true,
            read_only: false,
            discard: true,
            max_indirect_segments: 512,
            queues: vec![
                QueueRecord {
                    ring_refs: vec![8, 9],
                    frontend_port: 20,
                    backend_port: 40,
                    rsp_prod: 0xffff_fff0,
                },
                QueueRecord {
                    ring_refs: vec![10, 11],
                    frontend_port: 21,
                    backend_port: 41,
                    rsp_prod: 77,
                },
            ],
            published: vec![
                ("sectors".into(), "2097152".into()),
                ("feature-persistent".into(), "1".into()),
            ],
        }],
    }
}

fn decode(h: &Handover) -> Result<Handover, HandoverError> {
    Handover::decode(&h.encode(), &limits())
}

#[test]
fn a_handover_reads_back_field_for_field() {
    let h = handover();
    let mut block = h.encode();
    assert_eq!(&block[..8], b"BLKDOMHO");
    // The rest of its last page may follow.
    block.resize(block.len().next_multiple_of(4096), 0xee);
    assert_eq!(Handover::decode(&block, &limits()), Ok(h));
}

#[test]
fn header_version_length_and_checksum_are_checked() {
    let block = handover().encode();
    let mut b = block.clone();
    b[0] = b'X';
    assert_eq!(Handover::decode(&b, &limits()), Err(HandoverError::Magic));
    let mut b = block.clone();
    b[8] = 2;
    assert_eq!(
        Handover::decode(&b, &limits()),
        Err(HandoverError::Version(2))
    );
    let mut b = block.clone();
    b[12..16].copy_from_slice(&(block.len() as u32).to_le_bytes());
    assert!(matches!(
        Handover::decode(&b, &limits()),
        Err(HandoverError::BodyLength(_))
    ));
    let mut b = block.clone();
    *b.last_mut().unwrap() ^= 1;
    assert_eq!(
        Handover::decode(&b, &limits()),
        Err(HandoverError::Checksum)
    );
    assert_eq!(
        Handover::decode(&block[..block.len() - 1], &limits()),
        Err(HandoverError::BodyLength(block.len() - HEADER_LEN))
    );
}

/// A block whose body is `body`, with a correct header: what a buggy old image writes.
fn with_body(body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&HANDOVER_VERSION.to_le_bytes());
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&image::sha256(body));
    b.extend_from_slice(body);
    b
}

#[test]
fn a_forged_count_allocates_nothing_and_is_refused() {
    let block = handover().encode();
    let body = &block[HEADER_LEN..];
    // After the build id (4 + 20), the generation (4) and the vCPUs (4): the count of
    // vcpu_info addresses.
    let mut forged = body.to_vec();
    forged[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        Handover::decode(&with_body(&forged), &limits()),
        Err(HandoverError::Wire(WireError::Count {
            what: "vCPUs",
            count: u32::MAX as usize
        }))
    );
    let mut longer = body.to_vec();
    longer.push(0);
    assert_eq!(
        Handover::decode(&with_body(&longer), &limits()),
        Err(HandoverError::TrailingBytes)
    );
    // Cut short: the last value's length says more than is left.
    assert_eq!(
        Handover::decode(&with_body(&body[..body.len() - 1]), &limits()),
        Err(HandoverError::Wire(WireError::Count {
            what: "value",
            count: 1
        }))
    );
    assert_eq!(
        Handover::decode(&with_body(&body[..2]), &limits()),
        Err(HandoverError::Wire(WireError::Truncated))
    );
}

#[test]
fn memory_ranges_must_be_aligned_ram_and_disjoint() {
    let mut h = handover();
    h.ranges[2].start += 0x800;
    assert!(matches!(
        decode(&h),
        Err(HandoverError::RangeNotInRam { .. })
    ));
    let mut h = handover();
    h.ranges[2].len = 0;
    assert!(matches!(
        decode(&h),
        Err(HandoverError::RangeNotInRam { .. })
    ));
    // Across the hole below 1 MiB.
    let mut h = handover();
    h.ranges[0].start = 0x9_f000;
    h.park_page = 0x9_f000;
    assert!(matches!(
        decode(&h),
        Err(HandoverError::RangeNotInRam { .. })
    ));
    let mut h = handover();
    h.ranges[1].start = 0x100_0000 + 0x3f_f000;
    h.vcpu_info = vec![0x13f_f000];
    assert_eq!(
        decode(&h),
        Err(HandoverError::RangesOverlap {
            first: 0x100_0000,
            second: 0x13f_f000
        })
    );
    let mut h = handover();
    h.ranges[2].start = u64::MAX - 0xfff;
    assert!(matches!(
        decode(&h),
        Err(HandoverError::RangeNotInRam { .. })
    ));
}

#[test]
fn vcpu_info_and_the_park_page_must_lie_in_ranges_of_their_kind() {
    let mut h = handover();
    h.vcpu_info[1] = 0x100_0000; // a RAM disk's range
    assert_eq!(
        decode(&h),
        Err(HandoverError::VcpuInfo {
            vcpu: 1,
            addr: 0x100_0000
        })
    );
    let mut h = handover();
    h.vcpu_info[1] = 0x20_0020; // misaligned
    assert!(matches!(
        decode(&h),
        Err(HandoverError::VcpuInfo { vcpu: 1, .. })
    ));
    let mut h = handover();
    h.vcpu_info[1] = 0x20_0fc0 + 0x40; // past the page
    assert!(matches!(
        decode(&h),
        Err(HandoverError::VcpuInfo { vcpu: 1, .. })
    ));
    let mut h = handover();
    h.vcpus = 5;
    h.vcpu_info = vec![0x20_0000; 5];
    assert_eq!(decode(&h), Err(HandoverError::VcpuCount(5)));
    let mut h = handover();
    h.vcpus = 0;
    h.vcpu_info.clear();
    h.shared_info = 0;
    assert_eq!(decode(&h), Err(HandoverError::VcpuCount(0)));
    // Under Xen every vCPU has its vcpu_info.
    let mut h = handover();
    h.vcpus = 3;
    assert_eq!(decode(&h), Err(HandoverError::VcpuCount(3)));
    // Without Xen: no vcpu_info, no shared_info.
    let mut h = handover();
    h.vcpu_info.clear();
    assert_eq!(decode(&h), Err(HandoverError::SharedInfo(0x20_1000)));
    h.shared_info = 0;
    assert!(decode(&h).is_ok());
    // Under Xen, shared_info lies in its own range, page-aligned.
    let mut h = handover();
    h.shared_info = 0x20_0000; // the vcpu_info range
    assert_eq!(decode(&h), Err(HandoverError::SharedInfo(0x20_0000)));
    let mut h = handover();
    h.shared_info = 0;
    assert_eq!(decode(&h), Err(HandoverError::SharedInfo(0)));
    let mut h = handover();
    h.ranges.last_mut().unwrap().len = 0x2000;
    h.shared_info = 0x20_1040; // inside its range, but not a page
    assert_eq!(decode(&h), Err(HandoverError::SharedInfo(0x20_1040)));
    let mut h = handover();
    h.park_page = 0x20_0000;
    assert_eq!(decode(&h), Err(HandoverError::NoParkRange(0x20_0000)));
}

#[test]
fn stripes_must_be_inside_their_disk_and_memory_and_never_shared() {
    let stripe_error = |h: &Handover| matches!(decode(h), Err(HandoverError::Stripe { .. }));
    let mut h = handover();
    h.ram_disks[0].stripes[2].index = 16384; // past a 1 GiB disk
    assert!(stripe_error(&h));
    let mut h = handover();
    h.ram_disks[0].stripes[1].paddr = 0x20_0000; // not RAM disk memory
    assert!(stripe_error(&h));
    let mut h = handover();
    h.ram_disks[0].stripes[1].paddr = 0x13f_8000; // runs past its range
    assert!(stripe_error(&h));
    let mut h = handover();
    h.ram_disks[0].stripes[1].index = 0; // twice
    assert!(stripe_error(&h));
    let mut h = handover();
    h.ram_disks[0].stripes[1].paddr = 0x100_8000; // half of stripe 0's memory
    assert_eq!(
        decode(&h),
        Err(HandoverError::StripesOverlap {
            name: "scratch".into(),
            paddr: 0x100_8000
        })
    );
    // Two disks sharing a stripe's memory.
    let mut h = handover();
    let mut other = h.ram_disks[0].clone();
    other.name = "other".into();
    other.stripes.truncate(1);
    h.ram_disks.push(other);
    assert!(matches!(
        decode(&h),
        Err(HandoverError::StripesOverlap { .. })
    ));
    let mut h = handover();
    h.ram_disks.push(h.ram_disks[0].clone());
    assert_eq!(
        decode(&h),
        Err(HandoverError::DuplicateName("scratch".into()))
    );
    let mut h = handover();
    h.ram_disks[0].capacity = 1000;
    assert!(matches!(
        decode(&h),
        Err(HandoverError::RamDiskCapacity { .. })
    ));
    let mut h = handover();
    h.ram_disks[0].capacity = 0x10000; // one stripe, three handed over
    assert_eq!(
        decode(&h),
        Err(HandoverError::TooMany {
            what: "stripes",
            count: 3
        })
    );
}

#[test]
fn a_vbds_connection_is_checked_as_a_frontend_s_would_be() {
    let path = || "backend/vbd/5/51712".to_string();
    let mut h = handover();
    h.vbds[0].ring_order = 5;
    assert_eq!(
        decode(&h),
        Err(HandoverError::RingOrder {
            path: path(),
            order: 5
        })
    );
    let mut h = handover();
    h.vbds[0].protocol = 2;
    assert_eq!(
        decode(&h),
        Err(HandoverError::Protocol {
            path: path(),
            protocol: 2
        })
    );
    let mut h = handover();
    h.vbds[0].queues.clear();
    assert_eq!(
        decode(&h),
        Err(HandoverError::Queues {
            path: path(),
            queues: 0
        })
    );
    let mut h = handover();
    let q = h.vbds[0].queues[0].clone();
    h.vbds[0].queues.extend([q.clone(), q.clone(), q]);
    assert_eq!(
        decode(&h),
        Err(HandoverError::Queues {
            path: path(),
            queues: 5
        })
    );
    let mut h = handover();
    h.vbds[0].queues[1].ring_refs.pop();
    assert_eq!(
        decode(&h),
        Err(HandoverError::RingRefs {
            path: path(),
            queue: 1,
            refs: 1
        })
    );
    let mut h = handover();
    h.vbds[0].queues[0].ring_refs = vec![1; 32];
    assert!(matches!(
        decode(&h),
        Err(HandoverError::TooMany {
            what: "ring references",
            ..
        })
    ));
    let mut h = handover();
    h.vbds[0].queues[1].frontend_port = 0;
    assert_eq!(
        decode(&h),
        Err(HandoverError::Port {
            path: path(),
            queue: 1
        })
    );
    let mut h = handover();
    h.vbds.push(h.vbds[0].clone());
    assert_eq!(decode(&h), Err(HandoverError::DuplicateName(path())));
    for key in ["state", "", "a/b", "sectors"] {
        let mut h = handover();
        h.vbds[0].published.push((key.into(), "4".into()));
        assert_eq!(
            decode(&h),
            Err(HandoverError::PublishedKey {
                path: path(),
                key: key.into()
            }),
            "{key}"
        );
    }
}

#[test]
fn strings_are_bounded_and_without_nul() {
    let mut h = handover();
    h.vbds[0].params = "ram\0x".into();
    assert_eq!(
        decode(&h),
        Err(HandoverError::Wire(WireError::BadString("params")))
    );
    let mut h = handover();
    h.vbds[0].params = "x".repeat(5000);
    assert!(matches!(
        decode(&h),
        Err(HandoverError::Wire(WireError::Count { what: "params", .. }))
    ));
}

#[test]
fn the_build_id_is_found_among_notes_without_a_heap() {
    assert_eq!(
        image::build_id_in(&default_notes()).unwrap().to_string(),
        "ab".repeat(20)
    );
    let without = note(b"Xen", 18, &[0; 4]);
    assert_eq!(image::build_id_in(&without), None);
    // Notes that run past their bytes are no answer, even after the build id.
    let mut broken = default_notes();
    broken.truncate(broken.len() - 4);
    assert_eq!(image::build_id_in(&broken), None);
    // A GNU note of another type (NT_GNU_ABI_TAG) is not the build id.
    let mut tagged = note(b"GNU", 1, &[0; 16]);
    tagged.extend(default_notes());
    assert_eq!(
        image::build_id_in(&tagged).unwrap().to_string(),
        "ab".repeat(20)
    );
}

// ---- a vbd through the block ---------------------------------------------------------

mod vbd_round_trip {
    use super::{handover, limits};
    use crate::block::Handover;
    use crate::vbd::{self, LeftAt, RecordError};
    use blkback::abi::Protocol;
    use blkback::engine::Busy;
    use blkback::negotiate::{
        BackendParams, BlkifBackend, ConnectionHooks, FrontendConnection, StepOutcome, XenbusState,
    };
    use blkdev::RamDisk;
    use std::string::ToString;
    use std::vec::Vec;
    use std::{format, vec};
    use xen::xenbus::error::{errno, Errno};
    use xen::xenbus::fake::MemStore;

    const BE: &str = "/local/domain/1/backend/vbd/5/51712";
    const FE: &str = "/local/domain/5/device/vbd/51712";

    #[derive(Debug)]
    struct Never;
    impl core::fmt::Display for Never {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("never")
        }
    }
    impl core::error::Error for Never {}
    impl Errno for Never {
        fn errno(&self) -> i32 {
            errno::EIO
        }
    }

    /// Hooks that record what they are asked to connect.
    #[derive(Default)]
    struct Recording(Vec<FrontendConnection>);
    impl ConnectionHooks for Recording {
        type Error = Never;
        fn connect(&mut self, connection: &FrontendConnection) -> Result<(), Never> {
            self.0.push(connection.clone());
            Ok(())
        }
        fn disconnect(&mut self) -> Result<(), Busy> {
            Ok(())
        }
        fn now_ns(&self) -> u64 {
            0
        }
    }

    fn params(sectors: u64) -> BackendParams {
        BackendParams::new(2, RamDisk::new(sectors).geometry())
    }

    /// A vbd connected by the old image: two queues of two-page rings, an x86_32
    /// frontend with persistent grants.
    fn connected() -> (MemStore, BlkifBackend, FrontendConnection) {
        let mut store = MemStore::new();
        for (key, value) in [
            (format!("{BE}/frontend"), FE),
            (format!("{BE}/frontend-id"), "5"),
            (format!("{BE}/mode"), "w"),
            (format!("{BE}/state"), "1"),
            (format!("{FE}/state"), "1"),
            (format!("{FE}/multi-queue-num-queues"), "2"),
            (format!("{FE}/ring-page-order"), "1"),
            (format!("{FE}/protocol"), "x86_32-abi"),
            (format!("{FE}/feature-persistent"), "1"),
        ] {
            store.set(&key, value);
        }
        for q in 0..2u32 {
            store.set(
                &format!("{FE}/queue-{q}/event-channel"),
                &(20 + q).to_string(),
            );
            for i in 0..2 {
                store.set(
                    &format!("{FE}/queue-{q}/ring-ref{i}"),
                    &(100 + 10 * q + i).to_string(),
                );
            }
        }
        let mut backend = BlkifBackend::probe(&mut store, BE, params(4096)).unwrap();
        store.set(&format!("{FE}/state"), "3");
        let mut hooks = Recording::default();
        assert_eq!(
            backend.step(&mut store, &mut hooks),
            Ok(StepOutcome::Switched(XenbusState::Connected))
        );
        let connection = hooks.0.remove(0);
        (store, backend, connection)
    }

    const LEFT: [LeftAt; 2] = [
        LeftAt {
            backend_port: 40,
            rsp_prod: 7,
        },
        LeftAt {
            backend_port: 41,
            rsp_prod: u32::MAX,
        },
    ];

    #[test]
    fn a_vbd_recorded_by_one_image_is_taken_over_by_the_next_unchanged() {
        let (mut store, backend, negotiated) = connected();
        assert_eq!(negotiated.protocol, Protocol::X86_32);
        let record = vbd::record(&backend, &negotiated, "ram:2M:a", &LEFT).unwrap();
        let block = Handover {
            vbds: vec![record],
            ..handover()
        }
        .encode();
        let received = Handover::decode(&block, &limits()).unwrap();
        let (connection, published) = vbd::connection(&received.vbds[0]);

        let mut expected = negotiated.clone();
        expected.queues[0].attach_at = Some(7);
        expected.queues[1].attach_at = Some(u32::MAX);
        assert_eq!(connection, expected);
        assert_eq!(received.vbds[0].params, "ram:2M:a");
        assert_eq!(received.vbds[0].queues[1].backend_port, 41);

        let writes = store.writes.len();
        let mut hooks = Recording::default();
        let (taken, outcome) = BlkifBackend::resume(
            &mut store,
            BE,
            params(4096),
            &connection,
            &published,
            &mut hooks,
        )
        .unwrap();
        assert_eq!(outcome, StepOutcome::Switched(XenbusState::Connected));
        assert_eq!(taken.state(), XenbusState::Connected);
        assert_eq!(hooks.0, [expected]);
        assert_eq!(store.writes.len(), writes, "nothing written");
    }

    #[test]
    fn a_new_image_seeing_another_disk_size_fails_the_vbd_rather_than_change_it() {
        let (mut store, backend, negotiated) = connected();
        let record = vbd::record(&backend, &negotiated, "ram:2M:a", &LEFT).unwrap();
        let (connection, published) = vbd::connection(&record);
        let mut hooks = Recording::default();
        let (_, outcome) = BlkifBackend::resume(
            &mut store,
            BE,
            params(8192),
            &connection,
            &published,
            &mut hooks,
        )
        .unwrap();
        let StepOutcome::Failed(reason) = outcome else {
            panic!("{outcome:?}");
        };
        assert!(reason.contains("sectors was \"4096\""), "{reason}");
        assert!(hooks.0.is_empty());
    }

    #[test]
    fn every_queue_needs_where_it_was_left() {
        let (_, backend, negotiated) = connected();
        assert_eq!(
            vbd::record(&backend, &negotiated, "ram:2M:a", &LEFT[..1]),
            Err(RecordError::Queues { queues: 2, left: 1 })
        );
    }
}

// ---- receiving an image --------------------------------------------------------------

mod receiving {
    use super::{elf, sha_hex};
    use crate::block::HANDOVER_VERSION;
    use crate::image::{self, ImageError};
    use crate::receive::{accept, image_refs, Answer, Refusal, ServedRequest, Staging, PAGE};
    use crate::request::{Perm, Request, RequestError};
    use std::string::{String, ToString};
    use std::vec::Vec;
    use std::{format, vec};

    const DOM0_ONLY: [Perm; 2] = [
        Perm {
            domid: 0,
            read: false,
            write: false,
        },
        Perm {
            domid: 7,
            read: true,
            write: false,
        },
    ];

    fn request_for(img: &[u8]) -> Request {
        let hex: String = image::sha256(img)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        crate::request::parse(&format!("v1 size={} sha256={hex} index=3", img.len())).unwrap()
    }

    /// One index page listing `refs`, zeroes after.
    fn index(refs: &[u32]) -> Vec<u8> {
        let mut page = vec![0u8; PAGE];
        for (i, r) in refs.iter().enumerate() {
            page[4 * i..4 * i + 4].copy_from_slice(&r.to_le_bytes());
        }
        page
    }

    #[test]
    fn only_a_toolstack_request_that_parses_is_taken() {
        let text = format!("v1 size=4096 sha256={} index=3", sha_hex());
        assert!(matches!(accept(Some(&text), &DOM0_ONLY), Ok(Some(_))));
        assert_eq!(accept(None, &DOM0_ONLY), Ok(None));
        assert_eq!(accept(Some(" "), &[]), Ok(None));
        let guest_writable = [
            DOM0_ONLY[0],
            Perm {
                domid: 9,
                read: true,
                write: true,
            },
        ];
        assert_eq!(
            accept(Some(&text), &guest_writable),
            Err(Refusal::NotToolstack)
        );
        assert_eq!(
            accept(Some("v2"), &DOM0_ONLY),
            Err(Refusal::Request(RequestError::Version))
        );
    }

    #[test]
    fn the_index_lists_exactly_one_distinct_reference_per_page() {
        let img = elf();
        let request = request_for(&img);
        let pages = request.pages();
        assert_eq!(pages, img.len().div_ceil(PAGE));
        let refs: Vec<u32> = (0..pages as u32).map(|i| 1000 + i).collect();
        assert_eq!(image_refs(&index(&refs), &request), Ok(refs.clone()));

        assert_eq!(
            image_refs(&index(&refs)[..PAGE - 4], &request),
            Err(Refusal::Index("not the pages the request names"))
        );
        assert_eq!(
            image_refs(&index(&refs[..pages - 1]), &request),
            Err(Refusal::Index("a page without a reference"))
        );
        let mut more = refs.clone();
        more.push(5000);
        assert_eq!(
            image_refs(&index(&more), &request),
            Err(Refusal::Index("references past the image's last page"))
        );
        let mut twice = refs.clone();
        twice[1] = twice[0];
        assert_eq!(
            image_refs(&index(&twice), &request),
            Err(Refusal::Index("a reference given twice"))
        );
    }

    /// Stages `img` page by page as the kernel copies granted pages.
    fn staged(img: &[u8], request: Request) -> Staging {
        let mut staging = Staging::new(request).unwrap();
        for (i, chunk) in img.chunks(PAGE).enumerate() {
            let page = staging.page_mut(i).unwrap();
            assert_eq!(page.len(), chunk.len());
            page.copy_from_slice(chunk);
        }
        assert!(staging.page_mut(img.len().div_ceil(PAGE)).is_none());
        staging
    }

    #[test]
    fn a_staged_image_is_checked_against_the_request() {
        let img = elf();
        let (bytes, checked) = staged(&img, request_for(&img))
            .check(HANDOVER_VERSION)
            .unwrap();
        assert_eq!(bytes, img);
        assert_eq!(checked.build_id.to_string(), "ab".repeat(20));
        // A page dom0 changed between the request and the copy.
        let mut changed = img.clone();
        changed[PAGE] ^= 1;
        assert_eq!(
            staged(&changed, request_for(&img))
                .check(HANDOVER_VERSION)
                .err(),
            Some(Refusal::Image(ImageError::Checksum))
        );
        assert!(matches!(
            staged(&img, request_for(&img)).check(HANDOVER_VERSION + 1),
            Err(Refusal::Image(ImageError::HandoverVersion { .. }))
        ));
    }

    #[test]
    fn what_blkdom_answers() {
        assert_eq!(Answer::Checking.to_string(), "checking");
        assert_eq!(
            Answer::Refused(Refusal::Image(ImageError::Checksum)).to_string(),
            "refused: image: sha256 differs from the request's"
        );
        assert_eq!(
            Answer::Refused(Refusal::NotToolstack).to_string(),
            "refused: the request node is writable by a domain other than dom0"
        );
        let id = image::BuildId::new(&[0x0f, 0xa0]).unwrap();
        assert_eq!(Answer::Done(id).to_string(), "done 0fa0");
        assert_eq!(
            Answer::Refused(Refusal::SwitchNotBuilt(id)).to_string(),
            "refused: image checked (build 0fa0), but this blkdom cannot switch images yet"
        );
        assert_eq!(
            Answer::Refused(Refusal::Busy("/local/domain/1/backend/vbd/2/51712".into()))
                .to_string(),
            "refused: vbd /local/domain/1/backend/vbd/2/51712 busy"
        );
        assert_eq!(
            Answer::Refused(Refusal::Drain("vbd x did not drain in 5000 ms".into())).to_string(),
            "refused: drain: vbd x did not drain in 5000 ms"
        );
        assert_eq!(Answer::Draining.to_string(), "draining");
    }

    #[test]
    fn the_served_request_is_ignored_until_the_node_changes() {
        let request = "v1 size=4096 sha256=00 index=207";
        let mut served = ServedRequest::default();
        assert!(!served.holds(Some(request)), "nothing served yet");
        served.set(request);
        // The new image's watch fires with the node still holding it.
        assert!(served.holds(Some(request)));
        assert!(served.holds(Some(&format!(" {request}\n"))));
        // dom0's tool removes it; the same text later is a new request.
        assert!(!served.holds(None));
        assert!(!served.holds(Some(request)));
        served.set(request);
        assert!(!served.holds(Some("")), "an emptied node forgets it too");
        assert!(!served.holds(Some(request)));
        served.set(request);
        assert!(!served.holds(Some("v1 size=8192 sha256=11 index=208")));
        assert!(!served.holds(Some(request)), "another request came between");
        served.set("  ");
        assert!(!served.holds(Some("")));
    }
}
