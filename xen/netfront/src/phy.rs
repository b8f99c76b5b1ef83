// SPDX-License-Identifier: MIT OR Apache-2.0
//! smoltcp's [`Device`] over a [`NetQueue`]. Frames are copied between the granted
//! pages and two buffers the device owns (smoltcp's tokens want plain slices, and the
//! pages are shared memory the backend may write at any time, read only through
//! atomics), so the data path allocates nothing.

use crate::queue::{NetQueue, SendError, MAX_FRAME};
use alloc::boxed::Box;
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use xen::abi::netif::RX_RING_SIZE;

/// Frames lost on the way out (every tx slot in flight, or the queue failed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub tx_full: u64,
}

pub struct NetDevice {
    queue: NetQueue,
    rx_buf: Box<[u8; MAX_FRAME]>,
    tx_buf: Box<[u8; MAX_FRAME]>,
    pub stats: DeviceStats,
}

impl NetDevice {
    pub fn new(queue: NetQueue) -> Self {
        Self {
            queue,
            rx_buf: Box::new([0; MAX_FRAME]),
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
        let len = self.queue.receive(&mut self.rx_buf).ok()??;
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
        caps.max_transmission_unit = MAX_FRAME;
        // smoltcp caps the window it advertises at burst x MSS: the rx pages posted to
        // the backend are what a burst can land in.
        caps.max_burst_size = Some(RX_RING_SIZE as usize);
        caps
    }
}
