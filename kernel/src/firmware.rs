//! Firmware tables through the boot identity map: the ACPI parsers of
//! `machine::acpi` read physical memory through `IdentityMemory`.

use crate::physmem;
use machine::acpi::{self, AcpiError, Madt, PhysRead, Rsdp};

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

pub fn rsdp(paddr: u64) -> Result<Rsdp, AcpiError> {
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
