// SPDX-License-Identifier: MIT OR Apache-2.0
//! The byte rings of Xen's PV protocols (xenstore, console): a power-of-two data area
//! and free-running 32-bit producer/consumer indices in shared memory. The producer
//! writes data, then publishes the index (release); the consumer observes the index
//! (acquire), then reads. Indices are written by the peer: a distance above the ring
//! size means the page is corrupt, and nothing is read or written.

use crate::SharedMem;
use core::sync::atomic::Ordering;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Indices that cannot be (distance > ring size).
    Corrupt,
    /// The peer made no progress in time.
    Timeout,
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RingError::Corrupt => "ring indices are corrupt",
            RingError::Timeout => "the peer made no progress in time",
        })
    }
}

impl core::error::Error for RingError {}

/// Where one ring lives inside its page (byte offsets).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ByteRing {
    pub data: usize,
    pub size: usize,
    pub cons: usize,
    pub prod: usize,
}

impl ByteRing {
    /// Producer side: copies what fits of `data`, returns the bytes written.
    pub fn produce(&self, mem: &SharedMem, data: &[u8]) -> Result<usize, RingError> {
        let cons = mem.load_u32(self.cons, Ordering::Acquire);
        let prod = mem.load_u32(self.prod, Ordering::Relaxed);
        let used = prod.wrapping_sub(cons) as usize;
        if used > self.size {
            return Err(RingError::Corrupt);
        }
        let n = data.len().min(self.size - used);
        let start = prod as usize % self.size;
        let first = n.min(self.size - start);
        mem.write_bytes(self.data + start, &data[..first]);
        mem.write_bytes(self.data, &data[first..n]);
        mem.store_u32(self.prod, prod.wrapping_add(n as u32), Ordering::Release);
        Ok(n)
    }

    /// Consumer side: copies what is available into `buf`, returns the bytes read.
    pub fn consume(&self, mem: &SharedMem, buf: &mut [u8]) -> Result<usize, RingError> {
        let prod = mem.load_u32(self.prod, Ordering::Acquire);
        let cons = mem.load_u32(self.cons, Ordering::Relaxed);
        let avail = prod.wrapping_sub(cons) as usize;
        if avail > self.size {
            return Err(RingError::Corrupt);
        }
        let n = buf.len().min(avail);
        let start = cons as usize % self.size;
        let first = n.min(self.size - start);
        mem.read_bytes(self.data + start, &mut buf[..first]);
        mem.read_bytes(self.data, &mut buf[first..n]);
        mem.store_u32(self.cons, cons.wrapping_add(n as u32), Ordering::Release);
        Ok(n)
    }
}
