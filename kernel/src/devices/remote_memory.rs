// SPDX-License-Identifier: MIT OR Apache-2.0
//! Where an NVMe/TCP disk's data lands: the guests' granted pages, by the addresses
//! their ring's engine gave its requests (`BufferAccess::cpu_address`). The network side
//! (`nvmetcp::remote`, on vCPU 0) copies between them and TCP as a DMA device would.

/// Copies `out.len()` bytes of a request's buffer at `address`.
pub fn read(address: u64, out: &mut [u8]) {
    // SAFETY: `address` came from the engine's `cpu_address` for a segment of a request
    // the remote has not completed yet: the grant stays mapped (identity mapped, at
    // least as long as the segment) until the request is answered, and `Remote` copies
    // nothing for a request once it completed it. `out` is a buffer of ours.
    unsafe { crate::physmem::read(address, out) }
}

/// Copies `data` into a request's buffer at `address`.
pub fn write(address: u64, data: &[u8]) {
    // SAFETY: as in `read`; the engine maps a read's grants writable.
    unsafe { crate::physmem::write(address, data) }
}
