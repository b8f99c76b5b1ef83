// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore ring as a byte stream.
//!
//! `xenstore_domain_interface` holds two 1024-byte rings (see `crate::byte_ring`): we
//! produce into `req`, xenstored into `rsp`.

use crate::abi::xs_wire::{XenstoreDomainInterface, XENSTORE_RING_SIZE};
use crate::byte_ring::ByteRing;
pub use crate::byte_ring::RingError;
use crate::SharedMem;
use core::mem::{offset_of, size_of};

/// A bidirectional byte stream to xenstored.
pub trait XenstoreRing {
    /// Copies as many bytes as fit into the request ring; may return 0.
    fn write_some(&mut self, data: &[u8]) -> Result<usize, RingError>;
    /// Copies as many reply bytes as are available; may return 0.
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, RingError>;
    /// Tells xenstored that we produced or consumed.
    fn notify(&mut self);
    /// Waits until xenstored may have made progress.
    fn wait(&mut self) -> Result<(), RingError>;
}

/// How the ring kicks and waits for xenstored: in the kernel, `EVTCHNOP_send` on the
/// store event channel and the poller's idle wait (with a deadline).
pub trait RingSignal {
    fn notify(&mut self);
    fn wait(&mut self) -> Result<(), RingError>;
}

const REQ: usize = offset_of!(XenstoreDomainInterface, req);
const RSP: usize = offset_of!(XenstoreDomainInterface, rsp);
const REQ_CONS: usize = offset_of!(XenstoreDomainInterface, req_cons);
const REQ_PROD: usize = offset_of!(XenstoreDomainInterface, req_prod);
const RSP_CONS: usize = offset_of!(XenstoreDomainInterface, rsp_cons);
const RSP_PROD: usize = offset_of!(XenstoreDomainInterface, rsp_prod);

pub(crate) const REQUESTS: ByteRing = ByteRing {
    data: REQ,
    size: XENSTORE_RING_SIZE,
    cons: REQ_CONS,
    prod: REQ_PROD,
};
pub(crate) const REPLIES: ByteRing = ByteRing {
    data: RSP,
    size: XENSTORE_RING_SIZE,
    cons: RSP_CONS,
    prod: RSP_PROD,
};

/// The client side of the real ring page.
#[derive(Debug)]
pub struct SharedXenstoreRing<S> {
    mem: SharedMem,
    signal: S,
}

impl<S: RingSignal> SharedXenstoreRing<S> {
    /// `None` if the window is smaller than `struct xenstore_domain_interface`.
    pub fn new(mem: SharedMem, signal: S) -> Option<Self> {
        (mem.len() >= size_of::<XenstoreDomainInterface>()).then_some(Self { mem, signal })
    }

    pub fn signal_mut(&mut self) -> &mut S {
        &mut self.signal
    }
}

impl<S: RingSignal> XenstoreRing for SharedXenstoreRing<S> {
    fn write_some(&mut self, data: &[u8]) -> Result<usize, RingError> {
        REQUESTS.produce(&self.mem, data)
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, RingError> {
        REPLIES.consume(&self.mem, buf)
    }

    fn notify(&mut self) {
        self.signal.notify()
    }

    fn wait(&mut self) -> Result<(), RingError> {
        self.signal.wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::Ordering;
    use std::vec::Vec;

    struct NoSignal;
    impl RingSignal for NoSignal {
        fn notify(&mut self) {}
        fn wait(&mut self) -> Result<(), RingError> {
            Err(RingError::Timeout)
        }
    }

    fn page() -> SharedMem {
        SharedMem::alloc_leaked(4096)
    }

    #[test]
    fn writes_stop_at_full_and_wrap() {
        let mem = page();
        let mut ring = SharedXenstoreRing::new(mem, NoSignal).unwrap();
        let data: Vec<u8> = (0..1500u32).map(|i| i as u8).collect();
        assert_eq!(ring.write_some(&data).unwrap(), 1024);
        assert_eq!(ring.write_some(&data).unwrap(), 0, "full");
        // xenstored consumes 1000 bytes.
        let mut sink = [0u8; 1000];
        assert_eq!(REQUESTS.consume(&mem, &mut sink).unwrap(), 1000);
        assert_eq!(&sink[..], &data[..1000]);
        assert_eq!(ring.write_some(&data[1024..]).unwrap(), 476);
        let mut rest = [0u8; 600];
        assert_eq!(REQUESTS.consume(&mem, &mut rest).unwrap(), 500);
        assert_eq!(&rest[..24], &data[1000..1024]);
        assert_eq!(&rest[24..500], &data[1024..]);
    }

    #[test]
    fn reads_follow_the_producer_across_index_wraparound() {
        let mem = page();
        // Indices close to u32::MAX: the ring must use wrapping arithmetic.
        mem.store_u32(RSP_CONS, u32::MAX - 10, Ordering::Relaxed);
        mem.store_u32(RSP_PROD, u32::MAX - 10, Ordering::Relaxed);
        let mut ring = SharedXenstoreRing::new(mem, NoSignal).unwrap();
        let msg: Vec<u8> = (0..100u8).collect();
        assert_eq!(REPLIES.produce(&mem, &msg).unwrap(), 100);
        let mut got = [0u8; 64];
        assert_eq!(ring.read_some(&mut got).unwrap(), 64);
        assert_eq!(&got[..], &msg[..64]);
        assert_eq!(ring.read_some(&mut got).unwrap(), 36);
        assert_eq!(&got[..36], &msg[64..]);
        assert_eq!(ring.read_some(&mut got).unwrap(), 0);
    }

    #[test]
    fn corrupt_indices_are_refused() {
        let mem = page();
        let mut ring = SharedXenstoreRing::new(mem, NoSignal).unwrap();
        mem.store_u32(RSP_PROD, 5000, Ordering::Relaxed);
        assert_eq!(ring.read_some(&mut [0u8; 8]), Err(RingError::Corrupt));
        mem.store_u32(REQ_CONS, 3000, Ordering::Relaxed);
        assert_eq!(ring.write_some(b"x"), Err(RingError::Corrupt));
        assert!(SharedXenstoreRing::new(SharedMem::alloc_leaked(1024), NoSignal).is_none());
    }
}
