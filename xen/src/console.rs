// SPDX-License-Identifier: MIT OR Apache-2.0
//! The PV console ring (`HVM_PARAM_CONSOLE_PFN`, kicked through
//! `HVM_PARAM_CONSOLE_EVTCHN`): what `xl console` and xenconsoled's guest log show.
//!
//! Single producer: the kernel serialises writers (one lock around the logger).

use crate::abi::console::{XenconsInterface, XENCONS_IN_SIZE, XENCONS_OUT_SIZE};
use crate::byte_ring::{ByteRing, RingError};
use crate::SharedMem;
use core::mem::{offset_of, size_of};

const OUTPUT: ByteRing = ByteRing {
    data: offset_of!(XenconsInterface, out),
    size: XENCONS_OUT_SIZE,
    cons: offset_of!(XenconsInterface, out_cons),
    prod: offset_of!(XenconsInterface, out_prod),
};

const INPUT: ByteRing = ByteRing {
    data: offset_of!(XenconsInterface, in_),
    size: XENCONS_IN_SIZE,
    cons: offset_of!(XenconsInterface, in_cons),
    prod: offset_of!(XenconsInterface, in_prod),
};

/// The console page.
#[derive(Clone, Copy, Debug)]
pub struct ConsoleRing {
    mem: SharedMem,
}

impl ConsoleRing {
    /// `None` if the window is smaller than `struct xencons_interface`.
    pub fn new(mem: SharedMem) -> Option<Self> {
        (mem.len() >= size_of::<XenconsInterface>()).then_some(Self { mem })
    }

    /// Copies what fits into the output ring; returns the bytes written (0 when full).
    pub fn write_some(&self, data: &[u8]) -> Result<usize, RingError> {
        OUTPUT.produce(&self.mem, data)
    }

    /// Writes all of `data`: `notify` kicks xenconsoled after each piece, `wait` is
    /// called while the ring is full and returns `false` to give up (a log line must not
    /// hang the kernel when nobody drains the console). Returns the bytes written.
    pub fn write_all(
        &self,
        mut data: &[u8],
        mut notify: impl FnMut(),
        mut wait: impl FnMut() -> bool,
    ) -> usize {
        let mut written = 0;
        while !data.is_empty() {
            match self.write_some(data) {
                Ok(0) => {
                    if !wait() {
                        break;
                    }
                }
                Ok(n) => {
                    written += n;
                    data = &data[n..];
                    notify();
                }
                Err(RingError::Corrupt | RingError::Timeout) => break,
            }
        }
        written
    }

    /// Reads console input (`xl console` keystrokes).
    pub fn read_some(&self, buf: &mut [u8]) -> Result<usize, RingError> {
        INPUT.consume(&self.mem, buf)
    }

    /// Bytes xenconsoled has not consumed yet.
    pub fn pending_output(&self) -> usize {
        use core::sync::atomic::Ordering;
        let prod = self.mem.load_u32(OUTPUT.prod, Ordering::Relaxed);
        let cons = self.mem.load_u32(OUTPUT.cons, Ordering::Acquire);
        prod.wrapping_sub(cons) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::Ordering;
    use std::vec::Vec;

    fn console() -> (ConsoleRing, SharedMem) {
        let mem = SharedMem::alloc_leaked(4096);
        (ConsoleRing::new(mem).unwrap(), mem)
    }

    /// What xenconsoled does: take everything pending.
    fn drain(mem: &SharedMem, max: usize) -> Vec<u8> {
        let mut buf = std::vec![0u8; max];
        let n = OUTPUT.consume(mem, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn writes_land_after_the_input_ring_and_publish_out_prod() {
        let (con, mem) = console();
        assert_eq!(con.write_some(b"blkdom: hello\n").unwrap(), 14);
        let mut head = [0u8; 14];
        mem.read_bytes(1024, &mut head);
        assert_eq!(&head, b"blkdom: hello\n");
        assert_eq!(mem.load_u32(3084, Ordering::Acquire), 14);
        assert_eq!(con.pending_output(), 14);
        assert_eq!(drain(&mem, 100), b"blkdom: hello\n");
        assert_eq!(con.pending_output(), 0);
    }

    #[test]
    fn partial_space_and_wraparound() {
        let (con, mem) = console();
        let line: Vec<u8> = (0..3000u32).map(|i| b'0' + (i % 10) as u8).collect();
        assert_eq!(con.write_some(&line).unwrap(), 2048, "only what fits");
        assert_eq!(con.write_some(b"x").unwrap(), 0, "full");
        assert_eq!(drain(&mem, 1500), &line[..1500]);
        // 1500 free now, the next write wraps past the end of the data area.
        assert_eq!(con.write_some(&line[2048..]).unwrap(), 952);
        assert_eq!(drain(&mem, 4096), &line[1500..]);
    }

    #[test]
    fn write_all_waits_for_the_reader_and_gives_up_when_told() {
        let (con, mem) = console();
        let text: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut received = Vec::new();
        let mut kicks = 0;
        let written = con.write_all(
            &text,
            || kicks += 1,
            || {
                received.extend(drain(&mem, 700));
                true
            },
        );
        received.extend(drain(&mem, 4096));
        assert_eq!(written, 5000);
        assert_eq!(received, text);
        assert!(kicks >= 3);

        // Nobody drains: give up after a few waits instead of hanging.
        let (con, _mem) = console();
        let mut waits = 0;
        let written = con.write_all(
            &text,
            || {},
            || {
                waits += 1;
                waits < 3
            },
        );
        assert_eq!(written, 2048);
        assert_eq!(waits, 3);
    }

    #[test]
    fn corrupt_indices_stop_output() {
        let (con, mem) = console();
        mem.store_u32(3080, 9999, Ordering::Release); // out_cons ahead of out_prod
        assert_eq!(con.write_some(b"x"), Err(RingError::Corrupt));
        assert_eq!(con.write_all(b"x", || {}, || true), 0);
    }

    #[test]
    fn input_is_read_from_the_in_ring() {
        let (con, mem) = console();
        INPUT.produce(&mem, b"q\r").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(con.read_some(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"q\r");
        assert_eq!(mem.load_u32(3072, Ordering::Acquire), 2, "in_cons advanced");
    }
}
