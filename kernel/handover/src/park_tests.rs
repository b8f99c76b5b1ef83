// SPDX-License-Identifier: MIT OR Apache-2.0
//! The park area's bytes read back as the CPU and the new image read them.

use crate::image::Segment;
use crate::park::*;
use boot::start_info::{HvmMemmapEntry, HVM_START_MAGIC};
use std::vec;
use std::vec::Vec;

fn u64_at(b: &[u8], at: u64) -> u64 {
    u64::from_le_bytes(b[at as usize..at as usize + 8].try_into().unwrap())
}

fn u32_at(b: &[u8], at: u64) -> u32 {
    u32::from_le_bytes(b[at as usize..at as usize + 4].try_into().unwrap())
}

/// Walks the tables as the MMU does (4-level, 2 MiB pages): the physical address of
/// `virt`, or `None` where nothing maps it.
fn walk(tables: &[u8], base: u64, virt: u64) -> Option<u64> {
    let entry = |table: u64, index: u64| u64_at(tables, table - base + index * 8);
    let pml4e = entry(base, (virt >> 39) & 511);
    if pml4e & 1 == 0 {
        return None;
    }
    let pdpte = entry(pml4e & !0xfff, (virt >> 30) & 511);
    if pdpte & 1 == 0 || pdpte & 0x80 != 0 {
        return None;
    }
    let pde = entry(pdpte & !0xfff, (virt >> 21) & 511);
    if pde & 0x81 != 0x81 || pde & 2 == 0 {
        return None;
    }
    Some((pde & !0x1f_ffff) + (virt & 0x1f_ffff))
}

#[test]
fn the_park_tables_map_the_first_4_gib_to_themselves_and_nothing_else() {
    let base = PARK_BASE + TABLES_OFFSET;
    let t = identity_tables(base);
    assert_eq!(t.len() as u64, TABLES_LEN);
    for virt in [
        0,
        0x1_2345,
        PARK_BASE,
        0x40_0000,
        0x7fff_ffff,
        0xc000_1000,
        0xffff_ffff,
    ] {
        assert_eq!(walk(&t, base, virt), Some(virt), "{virt:#x}");
    }
    assert_eq!(walk(&t, base, 1 << 32), None);
    assert_eq!(walk(&t, base, 1 << 39), None);
}

#[test]
fn the_park_area_s_parts_do_not_overlap_and_fit_below_1_mib() {
    let parts = [
        (CODE_OFFSET, PAGE),
        (PARAMS_OFFSET, PAGE),
        (MAILBOX_OFFSET, MAX_VCPUS as u64 * MAILBOX_SIZE),
        (AP_STACKS_OFFSET, MAX_VCPUS as u64 * MAILBOX_SIZE),
        (START_INFO_OFFSET, START_INFO_LEN),
        (TABLES_OFFSET, TABLES_LEN),
    ];
    for (i, a) in parts.iter().enumerate() {
        assert!(a.0 + a.1 <= PARK_LEN);
        for b in &parts[i + 1..] {
            assert!(a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0, "{a:?} {b:?}");
        }
    }
    const { assert!(PARK_BASE >= 0x9000 && PARK_BASE + PARK_LEN <= 0xa_0000) };
    const { assert!(P_SEGMENTS + MAX_SEGMENTS as u64 * SEGMENT_RECORD <= PAGE - 256) };
    assert_eq!(mailbox(PARK_BASE, 3), PARK_BASE + 2 * PAGE + 192);
    assert_eq!(ap_stack_top(PARK_BASE, 0) % 16, 0);
    const { assert!(M_PARKED + 8 <= MAILBOX_SIZE) };
}

fn params() -> TrampolineParams {
    TrampolineParams {
        entry32: 0x40_0010,
        image_paddr: 0x200_0000,
        segments: vec![
            Segment {
                paddr: 0x40_0000,
                file: 0x1000..0x5000,
                memsz: 0x4000,
                executable: true,
            },
            Segment {
                paddr: 0x40_5000,
                file: 0x6000..0x6100,
                memsz: 0x3_0000,
                executable: false,
            },
        ],
    }
}

#[test]
fn the_trampoline_parameters_sit_where_the_assembly_reads_them() {
    let page = params_page(PARK_BASE, &params(), 0x7000).unwrap();
    assert_eq!(page.len() as u64, PAGE);
    assert_eq!(u64_at(&page, P_CR3), PARK_BASE + TABLES_OFFSET);
    assert_eq!(u64_at(&page, P_ENTRY32), 0x40_0010);
    assert_eq!(u64_at(&page, P_START_INFO), PARK_BASE + START_INFO_OFFSET);
    assert_eq!(u64_at(&page, P_SEGMENT_COUNT), 2);
    assert_eq!(u16::from_le_bytes([page[0x20], page[0x21]]), 31);
    assert_eq!(
        u64_at(&page, P_GDT_PTR + 2),
        PARK_BASE + PARAMS_OFFSET + P_GDT
    );
    // The selectors name the descriptors the assembly expects: 64-bit code (L=1), flat
    // data, 32-bit code (D=1, L=0).
    let desc = |sel: u16| u64_at(&page, P_GDT + u64::from(sel));
    assert_eq!((desc(SEL_CODE64) >> 53) & 3, 0b01);
    assert_eq!((desc(SEL_CODE32) >> 53) & 3, 0b10);
    assert_eq!((desc(SEL_DATA) >> 40) & 0xff, 0x92);
    let seg = P_SEGMENTS + SEGMENT_RECORD;
    assert_eq!(u64_at(&page, seg), 0x200_6000);
    assert_eq!(u64_at(&page, seg + 8), 0x40_5000);
    assert_eq!(u64_at(&page, seg + 16), 0x100);
    assert_eq!(u64_at(&page, seg + 24), 0x3_0000);
    // Nothing after the segments: the stack's room.
    assert!(page[(P_SEGMENTS + 2 * SEGMENT_RECORD) as usize..]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_segment_source_outside_the_staged_image_or_too_many_segments_is_refused() {
    assert_eq!(
        params_page(PARK_BASE, &params(), 0x6000),
        Err(ParkError::SegmentSource(1))
    );
    let mut p = params();
    let (start, end) = (0x5000, 0x1000);
    p.segments[0].file = start..end; // reversed
    assert_eq!(
        params_page(PARK_BASE, &p, 0x7000),
        Err(ParkError::SegmentSource(0))
    );
    let mut p = params();
    p.segments = vec![p.segments[0].clone(); MAX_SEGMENTS + 1];
    assert_eq!(
        params_page(PARK_BASE, &p, 0x7000),
        Err(ParkError::TooManySegments(MAX_SEGMENTS + 1))
    );
}

fn memmap() -> Vec<HvmMemmapEntry> {
    vec![
        HvmMemmapEntry {
            addr: 0,
            size: 0x9_fc00,
            kind: 1,
            reserved: 0,
        },
        HvmMemmapEntry {
            addr: 0x10_0000,
            size: 0x7ff0_0000,
            kind: 1,
            reserved: 0,
        },
        HvmMemmapEntry {
            addr: 0xfc00_0000,
            size: 0x100_0000,
            kind: 2,
            reserved: 0,
        },
    ]
}

fn module(paddr: u64, size: u64, cmdline: &str) -> Module {
    Module {
        paddr,
        size,
        cmdline: cmdline.as_bytes().to_vec(),
    }
}

/// Reads a NUL-terminated string at physical `paddr` of an area at `base`.
fn string_at(b: &[u8], base: u64, paddr: u64) -> Vec<u8> {
    let from = (paddr - base) as usize;
    let len = b[from..].iter().position(|&c| c == 0).unwrap();
    b[from..from + len].to_vec()
}

#[test]
fn the_new_start_info_is_the_old_one_with_the_block_as_its_last_module() {
    let base = PARK_BASE + START_INFO_OFFSET;
    let boot_modules = [
        module(0x300_0000, 0x9000, "next.elf"),
        // The block an earlier upgrade handed this image: not passed on.
        module(0x310_0000, 0x2000, HANDOVER_CMDLINE),
    ];
    let si = StartInfo::for_jump(
        b"loglevel=info x=1",
        0xf_e000,
        &memmap(),
        &boot_modules,
        (0x320_0000, 0x1234),
    );
    let b = si.encode(base).unwrap();
    assert!(b.len() as u64 <= START_INFO_LEN);
    assert_eq!(u32_at(&b, 0), HVM_START_MAGIC);
    assert_eq!(u32_at(&b, 4), 1);
    assert_eq!(u32_at(&b, 12), 2);
    assert_eq!(u64_at(&b, 32), 0xf_e000);
    assert_eq!(string_at(&b, base, u64_at(&b, 24)), b"loglevel=info x=1");
    assert_eq!(u32_at(&b, 48), 3);
    let memmap_at = u64_at(&b, 40) - base;
    assert_eq!(u64_at(&b, memmap_at + 24), 0x10_0000);
    assert_eq!(u64_at(&b, memmap_at + 24 + 8), 0x7ff0_0000);
    assert_eq!(u32_at(&b, memmap_at + 2 * 24 + 16), 2);
    let modlist = u64_at(&b, 16) - base;
    assert_eq!(modlist % 8, 0);
    let read_module = |i: u64| {
        let at = modlist + i * 32;
        module_read(&b, base, at)
    };
    assert_eq!(read_module(0), module(0x300_0000, 0x9000, "next.elf"));
    assert_eq!(read_module(1), module(0x320_0000, 0x1234, HANDOVER_CMDLINE));
    // What the new image's search finds: the block, once.
    let ram = [0..0x9_fc00, 0x10_0000..0x8000_0000];
    let modules = [read_module(0), read_module(1)];
    assert_eq!(
        find_handover(modules.iter().map(triple), &ram),
        Ok(Some((0x320_0000, 0x1234)))
    );
}

fn module_read(b: &[u8], base: u64, at: u64) -> Module {
    Module {
        paddr: u64_at(b, at),
        size: u64_at(b, at + 8),
        cmdline: string_at(b, base, u64_at(b, at + 16)),
    }
}

#[test]
fn a_start_info_that_does_not_fit_or_has_a_nul_is_refused() {
    let big = vec![HvmMemmapEntry::default(); 700];
    let si = StartInfo::for_jump(b"x", 0, &big, &[], (0x1000, 0x1000));
    assert!(matches!(
        si.encode(PARK_BASE),
        Err(ParkError::StartInfoTooLarge(_))
    ));
    let si = StartInfo::for_jump(b"a\0b", 0, &memmap(), &[], (0x1000, 0x1000));
    assert_eq!(si.encode(PARK_BASE), Err(ParkError::Nul));
    // 128 entries (what the boot keeps) and a 1 KiB command line fit.
    let si = StartInfo::for_jump(
        &[b'c'; 1023],
        0,
        &vec![HvmMemmapEntry::default(); 128],
        &[module(1 << 20, 1, "m")],
        (0x1000, 0x1000),
    );
    assert!(si.encode(PARK_BASE).is_ok());
}

#[test]
fn a_handover_module_must_be_unique_sized_and_in_ram() {
    let ram = [0..0x9_fc00, 0x10_0000..0x8000_0000];
    let good = module(0x320_0000, 0x1234, HANDOVER_CMDLINE);
    assert_eq!(
        find_handover([module(0x300_0000, 1, "other")].iter().map(triple), &ram),
        Ok(None)
    );
    assert_eq!(
        find_handover([good.clone(), good.clone()].iter().map(triple), &ram),
        Err(ModuleError::Several)
    );
    let mut m = good.clone();
    m.size = 10;
    assert_eq!(
        find_handover([m].iter().map(triple), &ram),
        Err(ModuleError::Size(10))
    );
    let mut m = good.clone();
    m.size = (crate::block::HEADER_LEN + crate::block::MAX_BODY) as u64 + 1;
    assert!(matches!(
        find_handover([m].iter().map(triple), &ram),
        Err(ModuleError::Size(_))
    ));
    let mut m = good.clone();
    m.paddr = 0x9_f000; // runs past the low RAM
    assert!(matches!(
        find_handover([m].iter().map(triple), &ram),
        Err(ModuleError::Place { .. })
    ));
    let mut m = good.clone();
    m.paddr = u64::MAX - 0x100;
    assert!(matches!(
        find_handover([m].iter().map(triple), &ram),
        Err(ModuleError::Place { .. })
    ));
    let mut m = good;
    m.paddr = 0;
    assert!(matches!(
        find_handover([m].iter().map(triple), &ram),
        Err(ModuleError::Place { .. })
    ));
}

fn triple(m: &Module) -> (u64, u64, &[u8]) {
    (m.paddr, m.size, &m.cmdline)
}
