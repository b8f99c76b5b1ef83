// SPDX-License-Identifier: MIT OR Apache-2.0
//! smoltcp's [`Device`] over a [`NetQueue`]. Frames are copied between the granted
//! pages and two buffers the device owns, one frame to send and one packet received
//! (smoltcp's tokens want plain slices, and the pages are shared memory the backend may
//! write at any time, read only through atomics), so the data path allocates nothing.
//!
//! Checksums: smoltcp computes every one on send, and checks the IPv4 header's on
//! receive; TCP's and UDP's are checked here ([`crate::csum`]) for packets dom0 did not
//! check, and smoltcp is told not to (its settings are per device, and a packet with
//! `NETRXF_csum_blank` has none to check).
//!
//! Large packets: smoltcp 0.14 takes an IPv4/TCP packet longer than the device's MTU on
//! receive (it checks lengths against the IPv4 header, not the MTU; the MTU bounds what
//! it sends), so a 64 KiB GSO packet is one segment to its TCP socket.

use crate::queue::{NetQueue, SendError, MAX_FRAME, MAX_PACKET};
use alloc::boxed::Box;
use alloc::vec;
use smoltcp::phy::{self, Checksum, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use xen::abi::netif::RX_RING_SIZE;

/// Frames lost on the way out (every tx slot in flight, or the queue failed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub tx_full: u64,
    /// Packets received with a wrong TCP or UDP checksum, dropped.
    pub rx_bad_checksum: u64,
}

pub struct NetDevice {
    queue: NetQueue,
    rx_buf: Box<[u8; MAX_PACKET]>,
    tx_buf: Box<[u8; MAX_FRAME]>,
    pub stats: DeviceStats,
}

impl NetDevice {
    pub fn new(queue: NetQueue) -> Self {
        Self {
            queue,
            // Made on the heap: 64 KiB would not fit the stack it is built on.
            rx_buf: vec![0u8; MAX_PACKET]
                .into_boxed_slice()
                .try_into()
                .unwrap_or_else(|_| unreachable!("MAX_PACKET bytes")),
            tx_buf: Box::new([0; MAX_FRAME]),
            stats: DeviceStats::default(),
        }
    }

    pub fn queue(&self) -> &NetQueue {
        &self.queue
    }

    pub fn queue_mut(&mut self) -> &mut NetQueue {
        &mut self.queue
    }
}

pub struct RxToken<'a> {
    frame: &'a [u8],
}

pub struct TxToken<'a> {
    queue: &'a mut NetQueue,
    buf: &'a mut [u8; MAX_FRAME],
    stats: &'a mut DeviceStats,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.frame)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        // smoltcp never builds a frame above the MTU it was given; were it to, the
        // frame is cut here and then refused by the queue's length check.
        let result = f(&mut self.buf[..len.min(MAX_FRAME)]);
        match self.queue.send(&self.buf[..len.min(MAX_FRAME)]) {
            Ok(()) => {}
            Err(SendError::BadLength(_)) | Err(SendError::Full) | Err(SendError::Failed(_)) => {
                self.stats.tx_full += 1
            }
        }
        result
    }
}

impl Device for NetDevice {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        // A failed queue answers nothing; its owner reads `fault()` and reports it.
        let _ = self.queue.reap_tx();
        let len = loop {
            let packet = self.queue.receive(&mut self.rx_buf).ok()??;
            if packet.checksum_checked
                || crate::csum::transport_checksum_ok(&self.rx_buf[..packet.len])
            {
                break packet.len;
            }
            self.stats.rx_bad_checksum += 1;
        };
        Some((
            RxToken {
                frame: &self.rx_buf[..len],
            },
            TxToken {
                queue: &mut self.queue,
                buf: &mut self.tx_buf,
                stats: &mut self.stats,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        let _ = self.queue.reap_tx();
        self.queue.can_send().then_some(TxToken {
            queue: &mut self.queue,
            buf: &mut self.tx_buf,
            stats: &mut self.stats,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        // What smoltcp sends; what it takes in may be larger (GSO, module doc).
        caps.max_transmission_unit = MAX_FRAME;
        // smoltcp caps the window it advertises at burst x MSS: the rx pages posted to
        // the backend are what a burst can land in (one MSS a page at least, more when
        // netback fills pages with GSO packets).
        caps.max_burst_size = Some(RX_RING_SIZE as usize);
        // TCP and UDP checked in `receive`, computed by smoltcp on send.
        caps.checksum.tcp = Checksum::Tx;
        caps.checksum.udp = Checksum::Tx;
        caps
    }
}
