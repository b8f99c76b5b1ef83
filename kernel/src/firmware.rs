// SPDX-License-Identifier: MIT OR Apache-2.0
//! Firmware tables through the boot identity map: the ACPI parsers of
//! `machine::acpi` read physical memory through `IdentityMemory`. The tables do not
//! change: `Firmware` reads what blkdom needs once, at boot.

use crate::physmem;
use machine::acpi::{self, AcpiError, EcamWindow, Madt, PhysRead, Rsdp};

/// What the firmware's ACPI tables describe, read once at boot from the RSDP that
/// `hvm_start_info` names.
#[derive(Clone, Copy, Debug)]
pub struct Firmware {
    /// The root of the tables, or why it cannot be read.
    pub rsdp: Result<Rsdp, AcpiError>,
    /// PCI segment 0's ECAM window from the MCFG, or why there is none (configuration
    /// space is then reached through ports 0xCF8/0xCFC).
    pub ecam: Result<EcamWindow, AcpiError>,
}

impl Firmware {
    pub fn read(rsdp_paddr: u64) -> Firmware {
        let rsdp = rsdp(rsdp_paddr);
        let ecam = rsdp
            .and_then(|rsdp| find_table(&rsdp, b"MCFG"))
            .and_then(|table| acpi::parse_mcfg(&IdentityMemory, table));
        Firmware { rsdp, ecam }
    }

    /// Physical address of the table with `signature`.
    pub fn table(&self, signature: &[u8; 4]) -> Result<u64, AcpiError> {
        find_table(&self.rsdp?, signature)
    }
}

/// Physical memory below 4 GiB, read through the boot identity map.
pub struct IdentityMemory;

impl PhysRead for IdentityMemory {
    fn read(&self, paddr: u64, buf: &mut [u8]) -> bool {
        if !physmem::in_identity_map(paddr, buf.len()) {
            return false;
        }
        // SAFETY: the parsers read where the firmware's own pointers (RSDP, RSDT/XSDT
        // entries, table lengths) lead: firmware tables in RAM, which nothing writes.
        unsafe { physmem::read(paddr, buf) };
        true
    }
}

fn rsdp(paddr: u64) -> Result<Rsdp, AcpiError> {
    acpi::parse_rsdp(&IdentityMemory, paddr)
}

/// Physical address of the table with `signature`.
pub fn find_table(rsdp: &Rsdp, signature: &[u8; 4]) -> Result<u64, AcpiError> {
    let mut scratch = [0u8; 4096];
    acpi::find_table(&IdentityMemory, rsdp, signature, &mut scratch)
}

pub fn madt<const N: usize>(rsdp: &Rsdp) -> Result<Madt<N>, AcpiError> {
    acpi::parse_madt(&IdentityMemory, find_table(rsdp, b"APIC")?)
}
