// SPDX-License-Identifier: MIT OR Apache-2.0
//! The few ACPI tables blkdom reads, parsed from physical memory through a trait so the
//! parser runs against fake tables on the host: RSDP → RSDT/XSDT → FADT (power-off
//! register), table lookup by signature, the MADT (processors) and the MCFG (PCI ECAM).
//!
//! Every length and checksum is checked; a table that lies gets an error, not a read
//! past its end.

/// Read access to physical memory.
pub trait PhysRead {
    /// Fills `buf` from physical address `paddr`; false when the range is not readable.
    fn read(&self, paddr: u64, buf: &mut [u8]) -> bool;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcpiError {
    Unreadable(u64),
    BadSignature(u64),
    BadChecksum(u64),
    BadLength(u64),
    NotFound([u8; 4]),
}

impl core::fmt::Display for AcpiError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AcpiError::Unreadable(paddr) => write!(f, "ACPI: {paddr:#x} is not readable"),
            AcpiError::BadSignature(paddr) => write!(f, "ACPI: bad signature at {paddr:#x}"),
            AcpiError::BadChecksum(paddr) => write!(f, "ACPI: bad checksum at {paddr:#x}"),
            AcpiError::BadLength(paddr) => write!(f, "ACPI: bad length at {paddr:#x}"),
            AcpiError::NotFound(signature) => write!(
                f,
                "ACPI: no {} table",
                core::str::from_utf8(signature).unwrap_or("????")
            ),
        }
    }
}

impl core::error::Error for AcpiError {}

pub const SDT_HEADER_LEN: usize = 36;
const RSDP_V1_LEN: usize = 20;
const RSDP_V2_LEN: usize = 36;
/// Tables larger than this are refused (a FADT is 276 B, a big MADT a few KiB).
pub const MAX_TABLE_LEN: u32 = 64 * 1024;

fn checksum_ok(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |sum, b| sum.wrapping_add(*b)) == 0
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

/// Where the system description tables start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rsdp {
    pub revision: u8,
    pub rsdt: u32,
    /// Only from revision 2 on.
    pub xsdt: Option<u64>,
}

pub fn parse_rsdp(mem: &impl PhysRead, paddr: u64) -> Result<Rsdp, AcpiError> {
    let mut bytes = [0u8; RSDP_V2_LEN];
    if !mem.read(paddr, &mut bytes[..RSDP_V1_LEN]) {
        return Err(AcpiError::Unreadable(paddr));
    }
    if &bytes[..8] != b"RSD PTR " {
        return Err(AcpiError::BadSignature(paddr));
    }
    if !checksum_ok(&bytes[..RSDP_V1_LEN]) {
        return Err(AcpiError::BadChecksum(paddr));
    }
    let revision = bytes[15];
    let rsdt = u32_at(&bytes, 16);
    let mut xsdt = None;
    if revision >= 2 {
        if !mem.read(paddr, &mut bytes) {
            return Err(AcpiError::Unreadable(paddr));
        }
        if u32_at(&bytes, 20) < RSDP_V2_LEN as u32 {
            return Err(AcpiError::BadLength(paddr));
        }
        if !checksum_ok(&bytes) {
            return Err(AcpiError::BadChecksum(paddr));
        }
        xsdt = Some(u64_at(&bytes, 24)).filter(|&x| x != 0);
    }
    Ok(Rsdp {
        revision,
        rsdt,
        xsdt,
    })
}

/// Reads a whole table at `paddr` into `buf` after checking its header, length and
/// checksum; returns the table's bytes.
pub fn read_table<'b>(
    mem: &impl PhysRead,
    paddr: u64,
    buf: &'b mut [u8],
) -> Result<&'b [u8], AcpiError> {
    let mut header = [0u8; SDT_HEADER_LEN];
    if !mem.read(paddr, &mut header) {
        return Err(AcpiError::Unreadable(paddr));
    }
    let len = u32_at(&header, 4);
    if len < SDT_HEADER_LEN as u32 || len > MAX_TABLE_LEN || len as usize > buf.len() {
        return Err(AcpiError::BadLength(paddr));
    }
    let table = &mut buf[..len as usize];
    if !mem.read(paddr, table) {
        return Err(AcpiError::Unreadable(paddr));
    }
    if !checksum_ok(table) {
        return Err(AcpiError::BadChecksum(paddr));
    }
    Ok(table)
}

/// Finds the table with `signature` through the XSDT (preferred) or RSDT; returns its
/// physical address.
pub fn find_table(
    mem: &impl PhysRead,
    rsdp: &Rsdp,
    signature: &[u8; 4],
    scratch: &mut [u8],
) -> Result<u64, AcpiError> {
    let (root, entry_len) = match rsdp.xsdt {
        Some(xsdt) => (xsdt, 8),
        None => (u64::from(rsdp.rsdt), 4),
    };
    let expected_root_sig: &[u8; 4] = if entry_len == 8 { b"XSDT" } else { b"RSDT" };
    let count = {
        let root_table = read_table(mem, root, scratch)?;
        if &root_table[..4] != expected_root_sig {
            return Err(AcpiError::BadSignature(root));
        }
        (root_table.len() - SDT_HEADER_LEN) / entry_len
    };
    for i in 0..count {
        let offset = SDT_HEADER_LEN + i * entry_len;
        let entry = if entry_len == 8 {
            u64_at(scratch, offset)
        } else {
            u64::from(u32_at(scratch, offset))
        };
        let mut sig = [0u8; 4];
        if mem.read(entry, &mut sig) && &sig == signature {
            return Ok(entry);
        }
    }
    Err(AcpiError::NotFound(*signature))
}

/// What the FADT says about sleep control (for soft power-off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerControl {
    /// I/O port of PM1a_CNT; zero when the platform has none (hardware-reduced ACPI).
    pub pm1a_control_port: u16,
    pub pm1b_control_port: u16,
}

/// `SLP_EN` in PM1x_CNT.
pub const PM1_SLP_EN: u16 = 1 << 13;

/// Parses the FADT ("FACP") at `paddr`.
pub fn parse_fadt(mem: &impl PhysRead, paddr: u64) -> Result<PowerControl, AcpiError> {
    let mut buf = [0u8; 512];
    let fadt = read_table(mem, paddr, &mut buf)?;
    if &fadt[..4] != b"FACP" {
        return Err(AcpiError::BadSignature(paddr));
    }
    if fadt.len() < 72 {
        return Err(AcpiError::BadLength(paddr));
    }
    // PM1a_CNT_BLK at 64, PM1b_CNT_BLK at 68 (32-bit I/O port addresses).
    let port = |offset| u16::try_from(u32_at(fadt, offset)).unwrap_or(0);
    Ok(PowerControl {
        pm1a_control_port: port(64),
        pm1b_control_port: port(68),
    })
}

/// The value to write to PM1x_CNT to enter S5 with the given `SLP_TYP`.
pub fn s5_control_value(slp_typ: u8) -> u16 {
    (u16::from(slp_typ & 0x7) << 10) | PM1_SLP_EN
}

/// A processor the MADT lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadtCpu {
    pub apic_id: u32,
    /// Enabled now (flags bit 0); otherwise it may only be hot-added later.
    pub enabled: bool,
}

/// What blkdom needs from the MADT ("APIC"): the local APIC address and the processors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Madt<const N: usize> {
    pub local_apic_address: u64,
    cpus: [MadtCpu; N],
    count: usize,
    /// Processors beyond N (not started).
    pub dropped: usize,
}

impl<const N: usize> Madt<N> {
    pub fn cpus(&self) -> &[MadtCpu] {
        &self.cpus[..self.count]
    }

    pub fn enabled_cpus(&self) -> impl Iterator<Item = &MadtCpu> {
        self.cpus().iter().filter(|c| c.enabled)
    }
}

const MADT_LOCAL_APIC: u8 = 0;
const MADT_LOCAL_APIC_OVERRIDE: u8 = 5;
const MADT_LOCAL_X2APIC: u8 = 9;

/// Parses the MADT at `paddr`, keeping at most `N` processors. Entries are walked by
/// their own length fields; one that runs past the table ends the walk.
pub fn parse_madt<const N: usize>(mem: &impl PhysRead, paddr: u64) -> Result<Madt<N>, AcpiError> {
    let mut buf = [0u8; 8192];
    let table = read_table(mem, paddr, &mut buf)?;
    if &table[..4] != b"APIC" {
        return Err(AcpiError::BadSignature(paddr));
    }
    if table.len() < SDT_HEADER_LEN + 8 {
        return Err(AcpiError::BadLength(paddr));
    }
    let mut madt = Madt {
        local_apic_address: u64::from(u32_at(table, SDT_HEADER_LEN)),
        cpus: [MadtCpu {
            apic_id: 0,
            enabled: false,
        }; N],
        count: 0,
        dropped: 0,
    };
    let mut offset = SDT_HEADER_LEN + 8;
    while offset + 2 <= table.len() {
        let (kind, len) = (table[offset], usize::from(table[offset + 1]));
        if len < 2 || offset + len > table.len() {
            break;
        }
        let entry = &table[offset..offset + len];
        let cpu = match (kind, len) {
            (MADT_LOCAL_APIC, 8..) => Some(MadtCpu {
                apic_id: u32::from(entry[3]),
                enabled: u32_at(entry, 4) & 1 != 0,
            }),
            (MADT_LOCAL_X2APIC, 16..) => Some(MadtCpu {
                apic_id: u32_at(entry, 4),
                enabled: u32_at(entry, 8) & 1 != 0,
            }),
            (MADT_LOCAL_APIC_OVERRIDE, 12..) => {
                madt.local_apic_address = u64_at(entry, 4);
                None
            }
            _ => None,
        };
        if let Some(cpu) = cpu {
            if madt.count < N {
                madt.cpus[madt.count] = cpu;
                madt.count += 1;
            } else {
                madt.dropped += 1;
            }
        }
        offset += len;
    }
    Ok(madt)
}

/// One ECAM window from the MCFG: configuration space of buses `start_bus..=end_bus`
/// of `segment`, 1 MiB per bus, starting at `base` (the address of bus 0, even when
/// `start_bus` is not 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EcamWindow {
    pub base: u64,
    pub segment: u16,
    pub start_bus: u8,
    pub end_bus: u8,
}

impl EcamWindow {
    /// Physical address of the configuration space of one function.
    pub fn function_address(&self, bus: u8, device: u8, function: u8) -> Option<u64> {
        if bus < self.start_bus || bus > self.end_bus || device >= 32 || function >= 8 {
            return None;
        }
        Some(
            self.base
                + (u64::from(bus) << 20)
                + (u64::from(device) << 15)
                + (u64::from(function) << 12),
        )
    }
}

const MCFG_ENTRIES_OFFSET: usize = SDT_HEADER_LEN + 8;
const MCFG_ENTRY_LEN: usize = 16;

/// Parses the MCFG at `paddr`; returns the window of PCI segment 0 (the only one
/// blkdom uses). Windows with an inverted bus range or a zero base are skipped.
pub fn parse_mcfg(mem: &impl PhysRead, paddr: u64) -> Result<EcamWindow, AcpiError> {
    let mut buf = [0u8; 4096];
    let table = read_table(mem, paddr, &mut buf)?;
    if &table[..4] != b"MCFG" {
        return Err(AcpiError::BadSignature(paddr));
    }
    if table.len() < MCFG_ENTRIES_OFFSET {
        return Err(AcpiError::BadLength(paddr));
    }
    table[MCFG_ENTRIES_OFFSET..]
        .chunks_exact(MCFG_ENTRY_LEN)
        .map(|entry| EcamWindow {
            base: u64_at(entry, 0),
            segment: u16::from_le_bytes([entry[8], entry[9]]),
            start_bus: entry[10],
            end_bus: entry[11],
        })
        .find(|w| w.segment == 0 && w.base != 0 && w.start_bus <= w.end_bus)
        .ok_or(AcpiError::NotFound(*b"MCFG"))
}

#[cfg(test)]
pub mod fake {
    use super::PhysRead;

    /// A sparse fake physical memory: (address, bytes) blobs.
    #[derive(Default)]
    pub struct FakeMemory {
        pub blobs: Vec<(u64, Vec<u8>)>,
    }

    impl PhysRead for FakeMemory {
        fn read(&self, paddr: u64, buf: &mut [u8]) -> bool {
            for (start, bytes) in &self.blobs {
                let end = start + bytes.len() as u64;
                if paddr >= *start && paddr + buf.len() as u64 <= end {
                    let off = (paddr - start) as usize;
                    buf.copy_from_slice(&bytes[off..off + buf.len()]);
                    return true;
                }
            }
            false
        }
    }

    pub fn fix_checksum(bytes: &mut [u8], at: usize) {
        bytes[at] = 0;
        let sum = bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b));
        bytes[at] = 0u8.wrapping_sub(sum);
    }

    pub fn table(signature: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; super::SDT_HEADER_LEN];
        t[..4].copy_from_slice(signature);
        t.extend_from_slice(body);
        let len = t.len() as u32;
        t[4..8].copy_from_slice(&len.to_le_bytes());
        fix_checksum(&mut t, 9);
        t
    }

    pub fn rsdp_v2(xsdt: u64, rsdt: u32) -> Vec<u8> {
        let mut r = vec![0u8; 36];
        r[..8].copy_from_slice(b"RSD PTR ");
        r[15] = 2;
        r[16..20].copy_from_slice(&rsdt.to_le_bytes());
        r[20..24].copy_from_slice(&36u32.to_le_bytes());
        r[24..32].copy_from_slice(&xsdt.to_le_bytes());
        fix_checksum(&mut r[..20], 8);
        fix_checksum(&mut r, 32);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::fake::*;
    use super::*;

    #[test]
    fn errors_display_their_cause() {
        let text = |e: &dyn core::error::Error| e.to_string();
        assert_eq!(
            text(&AcpiError::Unreadable(0x1000)),
            "ACPI: 0x1000 is not readable"
        );
        assert_eq!(
            text(&AcpiError::BadChecksum(0xe0000)),
            "ACPI: bad checksum at 0xe0000"
        );
        assert_eq!(text(&AcpiError::NotFound(*b"MCFG")), "ACPI: no MCFG table");
    }

    fn fadt_body(pm1a: u32) -> Vec<u8> {
        let mut body = vec![0u8; 244 - SDT_HEADER_LEN];
        body[64 - SDT_HEADER_LEN..68 - SDT_HEADER_LEN].copy_from_slice(&pm1a.to_le_bytes());
        body
    }

    fn machine(xsdt_entries: &[u64]) -> FakeMemory {
        let mut mem = FakeMemory::default();
        mem.blobs.push((0xe0000, rsdp_v2(0x1000, 0x2000)));
        let body: Vec<u8> = xsdt_entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.blobs.push((0x1000, table(b"XSDT", &body)));
        mem.blobs
            .push((0x2000, table(b"RSDT", &0x3000u32.to_le_bytes())));
        mem.blobs.push((0x3000, table(b"FACP", &fadt_body(0x604))));
        mem.blobs.push((0x4000, table(b"APIC", &[1, 2, 3, 4])));
        mem
    }

    #[test]
    fn finds_the_fadt_through_the_xsdt_and_reads_pm1a() {
        let mem = machine(&[0x4000, 0x3000]);
        let rsdp = parse_rsdp(&mem, 0xe0000).unwrap();
        assert_eq!(
            rsdp,
            Rsdp {
                revision: 2,
                rsdt: 0x2000,
                xsdt: Some(0x1000)
            }
        );
        let mut scratch = [0u8; 4096];
        let fadt = find_table(&mem, &rsdp, b"FACP", &mut scratch).unwrap();
        assert_eq!(fadt, 0x3000);
        let power = parse_fadt(&mem, fadt).unwrap();
        assert_eq!(power.pm1a_control_port, 0x604);
        assert_eq!(power.pm1b_control_port, 0);
        assert_eq!(
            find_table(&mem, &rsdp, b"MCFG", &mut scratch),
            Err(AcpiError::NotFound(*b"MCFG"))
        );
    }

    #[test]
    fn revision_one_uses_the_rsdt() {
        let mut mem = machine(&[]);
        let mut r = rsdp_v2(0x1000, 0x2000);
        r[15] = 0;
        fix_checksum(&mut r[..20], 8);
        mem.blobs[0] = (0xe0000, r[..20].to_vec());
        let rsdp = parse_rsdp(&mem, 0xe0000).unwrap();
        assert_eq!(rsdp.xsdt, None);
        let mut scratch = [0u8; 4096];
        assert_eq!(find_table(&mem, &rsdp, b"FACP", &mut scratch), Ok(0x3000));
    }

    #[test]
    fn corrupt_tables_are_refused() {
        let mut mem = machine(&[0x3000]);
        mem.blobs[0].1[3] ^= 1; // RSDP signature
        assert_eq!(
            parse_rsdp(&mem, 0xe0000),
            Err(AcpiError::BadSignature(0xe0000))
        );

        let mut mem = machine(&[0x3000]);
        mem.blobs[0].1[16] ^= 1; // RSDT address without fixing the checksum
        assert_eq!(
            parse_rsdp(&mem, 0xe0000),
            Err(AcpiError::BadChecksum(0xe0000))
        );

        let mut mem = machine(&[0x3000]);
        mem.blobs[3].1[100] ^= 0xff; // FADT body
        assert_eq!(
            parse_fadt(&mem, 0x3000),
            Err(AcpiError::BadChecksum(0x3000))
        );

        let mut mem = machine(&[0x3000]);
        let t = &mut mem.blobs[3].1;
        t[4..8].copy_from_slice(&(MAX_TABLE_LEN + 1).to_le_bytes()); // length lies
        assert_eq!(parse_fadt(&mem, 0x3000), Err(AcpiError::BadLength(0x3000)));

        let mem = FakeMemory::default();
        assert_eq!(parse_rsdp(&mem, 0x10), Err(AcpiError::Unreadable(0x10)));
    }

    fn madt_body(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![0u8; 8];
        body[..4].copy_from_slice(&0xfee0_0000u32.to_le_bytes());
        for e in entries {
            body.extend_from_slice(e);
        }
        body
    }

    fn lapic(apic_id: u8, flags: u32) -> Vec<u8> {
        let mut e = vec![0, 8, apic_id, apic_id];
        e.extend_from_slice(&flags.to_le_bytes());
        e
    }

    #[test]
    fn madt_lists_processors_and_their_state() {
        let mut x2apic = vec![9u8, 16, 0, 0];
        x2apic.extend_from_slice(&300u32.to_le_bytes());
        x2apic.extend_from_slice(&1u32.to_le_bytes());
        x2apic.extend_from_slice(&300u32.to_le_bytes());
        let ioapic = vec![1u8, 12, 0, 0, 0, 0, 0xc0, 0xfe, 0, 0, 0, 0];
        let body = madt_body(&[lapic(0, 1), ioapic, lapic(2, 0), x2apic]);
        let mut mem = FakeMemory::default();
        mem.blobs.push((0x5000, table(b"APIC", &body)));
        let madt: Madt<8> = parse_madt(&mem, 0x5000).unwrap();
        assert_eq!(madt.local_apic_address, 0xfee0_0000);
        assert_eq!(
            madt.cpus(),
            &[
                MadtCpu {
                    apic_id: 0,
                    enabled: true
                },
                MadtCpu {
                    apic_id: 2,
                    enabled: false
                },
                MadtCpu {
                    apic_id: 300,
                    enabled: true
                }
            ]
        );
        assert_eq!(madt.enabled_cpus().count(), 2);
    }

    #[test]
    fn madt_keeps_at_most_n_and_stops_at_a_lying_entry() {
        let mut truncated = lapic(9, 1);
        truncated[1] = 200; // runs past the table
        let body = madt_body(&[lapic(0, 1), lapic(1, 1), lapic(2, 1), truncated]);
        let mut mem = FakeMemory::default();
        mem.blobs.push((0x5000, table(b"APIC", &body)));
        let madt: Madt<2> = parse_madt(&mem, 0x5000).unwrap();
        assert_eq!(madt.cpus().len(), 2);
        assert_eq!(madt.dropped, 1);

        let mut zero_len = lapic(5, 1);
        zero_len[1] = 0; // would loop forever if trusted
        let body = madt_body(&[zero_len, lapic(6, 1)]);
        mem.blobs[0] = (0x5000, table(b"APIC", &body));
        let madt: Madt<4> = parse_madt(&mem, 0x5000).unwrap();
        assert!(madt.cpus().is_empty());
    }

    fn mcfg_entry(base: u64, segment: u16, start: u8, end: u8) -> Vec<u8> {
        let mut e = base.to_le_bytes().to_vec();
        e.extend_from_slice(&segment.to_le_bytes());
        e.extend_from_slice(&[start, end, 0, 0, 0, 0]);
        e
    }

    #[test]
    fn mcfg_gives_the_segment_zero_ecam_window() {
        let mut body = vec![0u8; 8];
        body.extend(mcfg_entry(0xc000_0000, 1, 0, 255));
        body.extend(mcfg_entry(0, 0, 0, 255)); // zero base: skipped
        body.extend(mcfg_entry(0xb000_0000, 0, 0, 0xff));
        body.extend([0u8; 7]); // a partial trailing entry is ignored
        let mut mem = FakeMemory::default();
        mem.blobs.push((0x6000, table(b"MCFG", &body)));
        let window = parse_mcfg(&mem, 0x6000).unwrap();
        assert_eq!(
            window,
            EcamWindow {
                base: 0xb000_0000,
                segment: 0,
                start_bus: 0,
                end_bus: 0xff
            }
        );
        assert_eq!(window.function_address(0, 3, 0), Some(0xb001_8000));
        assert_eq!(window.function_address(1, 31, 7), Some(0xb01f_f000));
        assert_eq!(window.function_address(0, 32, 0), None);
        assert_eq!(window.function_address(0, 0, 8), None);
        let narrow = EcamWindow {
            start_bus: 2,
            end_bus: 3,
            ..window
        };
        assert_eq!(narrow.function_address(1, 0, 0), None);
        assert_eq!(narrow.function_address(4, 0, 0), None);
        assert_eq!(narrow.function_address(2, 0, 0), Some(0xb020_0000));
    }

    #[test]
    fn mcfg_without_a_usable_window_or_with_a_bad_header_is_refused() {
        let mut body = vec![0u8; 8];
        body.extend(mcfg_entry(0xb000_0000, 0, 9, 1)); // inverted bus range
        let mut mem = FakeMemory::default();
        mem.blobs.push((0x6000, table(b"MCFG", &body)));
        assert_eq!(parse_mcfg(&mem, 0x6000), Err(AcpiError::NotFound(*b"MCFG")));
        mem.blobs[0] = (0x6000, table(b"MCFG", &[0u8; 4]));
        assert_eq!(parse_mcfg(&mem, 0x6000), Err(AcpiError::BadLength(0x6000)));
        mem.blobs[0] = (0x6000, table(b"APIC", &body));
        assert_eq!(
            parse_mcfg(&mem, 0x6000),
            Err(AcpiError::BadSignature(0x6000))
        );
    }

    #[test]
    fn s5_value_sets_sleep_type_and_enable() {
        assert_eq!(s5_control_value(0), 0x2000);
        assert_eq!(s5_control_value(5), 0x3400);
    }
}
