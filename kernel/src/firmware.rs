//! Firmware tables through the boot identity map: the ACPI parsers of
//! `machine::acpi` read physical memory through `IdentityMemory`.

use crate::arch::paging::IDENTITY_MAPPED_LIMIT;
use machine::acpi::{self, AcpiError, Madt, PhysRead, Rsdp};

/// Physical memory below 4 GiB, read through the boot identity map.
pub struct IdentityMemory;

impl PhysRead for IdentityMemory {
    fn read(&self, paddr: u64, buf: &mut [u8]) -> bool {
        let Some(end) = paddr.checked_add(buf.len() as u64) else {
            return false;
        };
        if paddr == 0 || end > IDENTITY_MAPPED_LIMIT {
            return false;
        }
        // SAFETY: the range is identity mapped; firmware tables are plain bytes.
        unsafe { core::ptr::copy_nonoverlapping(paddr as *const u8, buf.as_mut_ptr(), buf.len()) };
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
