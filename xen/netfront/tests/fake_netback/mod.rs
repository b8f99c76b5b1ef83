// SPDX-License-Identifier: MIT OR Apache-2.0
//! A netback for tests: the back ends of a queue's rings, the queue's pages by grant
//! reference, and a switch that carries frames between queues.

#![allow(dead_code)]

use netfront::{NetQueue, Page};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use xen::abi::sring;
use xen::SharedMem;

pub struct BackRing {
    pub mem: SharedMem,
    slot: usize,
    pub req_cons: u32,
    pub rsp_prod_pvt: u32,
}

impl BackRing {
    fn new(mem: SharedMem, slot: usize) -> Self {
        Self {
            mem,
            slot,
            req_cons: 0,
            rsp_prod_pvt: 0,
        }
    }

    pub fn at(&self, index: u32) -> usize {
        sring::HEADER_SIZE + (index & 255) as usize * self.slot
    }

    /// The next request's slot offset, if the frontend produced one.
    pub fn take(&mut self) -> Option<usize> {
        let prod = self.mem.load_u32(sring::REQ_PROD, Ordering::Acquire);
        (prod != self.req_cons).then(|| {
            let at = self.at(self.req_cons);
            self.req_cons += 1;
            at
        })
    }

    /// Offset to write the next response at; then `publish`.
    pub fn respond_at(&mut self) -> usize {
        let at = self.at(self.rsp_prod_pvt);
        self.rsp_prod_pvt += 1;
        at
    }

    pub fn publish(&self) {
        self.mem
            .store_u32(sring::RSP_PROD, self.rsp_prod_pvt, Ordering::Release);
    }
}

pub struct Side {
    pub tx: BackRing,
    pub rx: BackRing,
    pub pages: HashMap<u32, SharedMem>,
}

fn page(gref: u32) -> Page {
    Page {
        mem: SharedMem::alloc_leaked(4096),
        gref,
    }
}

/// A queue and the netback side of it; grant references from `first_gref`.
pub fn queue(first_gref: u32) -> (NetQueue, Side) {
    let tx_ring = SharedMem::alloc_leaked(4096);
    let rx_ring = SharedMem::alloc_leaked(4096);
    let tx_pages: Box<[Page; 256]> = Box::new(std::array::from_fn(|i| page(first_gref + i as u32)));
    let rx_pages: Box<[Page; 256]> =
        Box::new(std::array::from_fn(|i| page(first_gref + 256 + i as u32)));
    let pages = tx_pages
        .iter()
        .chain(rx_pages.iter())
        .map(|p| (p.gref, p.mem))
        .collect();
    let queue = NetQueue::new(tx_ring, rx_ring, tx_pages, rx_pages);
    let side = Side {
        tx: BackRing::new(tx_ring, 12),
        rx: BackRing::new(rx_ring, 8),
        pages,
    };
    (queue, side)
}

impl Side {
    /// Takes the next tx request: (id, the frame), answered OKAY.
    pub fn transmitted(&mut self) -> Option<(u16, Vec<u8>)> {
        let at = self.tx.take()?;
        let m = self.tx.mem;
        let gref = m.load_u32(at, Ordering::Relaxed);
        let offset = m.load_u16(at + 4, Ordering::Relaxed) as usize;
        let id = m.load_u16(at + 8, Ordering::Relaxed);
        let size = m.load_u16(at + 10, Ordering::Relaxed) as usize;
        let mut frame = vec![0; size];
        self.pages[&gref].read_bytes(offset, &mut frame);
        self.tx_response(id, 0);
        Some((id, frame))
    }

    pub fn tx_response(&mut self, id: u16, status: i16) {
        let at = self.tx.respond_at();
        self.tx.mem.store_u16(at, id, Ordering::Relaxed);
        self.tx
            .mem
            .store_u16(at + 2, status as u16, Ordering::Relaxed);
        self.tx.publish();
    }

    /// Copies `frame` into the next posted rx page; false when none is posted.
    pub fn deliver(&mut self, frame: &[u8]) -> bool {
        let Some(at) = self.rx.take() else {
            return false;
        };
        let id = self.rx.mem.load_u16(at, Ordering::Relaxed);
        let gref = self.rx.mem.load_u32(at + 4, Ordering::Relaxed);
        self.pages[&gref].write_bytes(0, frame);
        self.rx_response(id, 0, 0, frame.len() as i16);
        true
    }

    pub fn rx_response(&mut self, id: u16, offset: u16, flags: u16, status: i16) {
        let at = self.rx.respond_at();
        let m = self.rx.mem;
        m.store_u16(at, id, Ordering::Relaxed);
        m.store_u16(at + 2, offset, Ordering::Relaxed);
        m.store_u16(at + 4, flags, Ordering::Relaxed);
        m.store_u16(at + 6, status as u16, Ordering::Relaxed);
        self.rx.publish();
    }
}

/// Carries every waiting frame from each side to the other (a two-port switch).
/// Returns how many frames moved.
pub fn switch(a: &mut Side, b: &mut Side) -> usize {
    let mut moved = 0;
    while let Some((_, frame)) = a.transmitted() {
        moved += usize::from(b.deliver(&frame));
    }
    while let Some((_, frame)) = b.transmitted() {
        moved += usize::from(a.deliver(&frame));
    }
    moved
}

/// What a test leaks to get the `'static` buffers smoltcp's sockets and stack borrow.
pub fn leak<T>(value: T) -> &'static mut T {
    Box::leak(Box::new(value))
}

/// A stack at 10.9.0.`ip_last`/24 (MAC 00:16:3e:00:00:`mac_last`) over a fresh vif queue
/// with its rx pages posted, room for `sockets` sockets, and the netback side of it.
pub fn stack(
    first_gref: u32,
    mac_last: u8,
    ip_last: u8,
    sockets: usize,
) -> (netfront::stack::Stack, Side) {
    let ip = netfront::stack::Addressing::Static(netfront::stack::Ipv4Setup {
        address: [10, 9, 0, ip_last],
        prefix: 24,
        gateway: None,
    });
    stack_with(first_gref, mac_last, ip, sockets)
}

/// [`stack`] with its address from `addressing`.
pub fn stack_with(
    first_gref: u32,
    mac_last: u8,
    addressing: netfront::stack::Addressing,
    sockets: usize,
) -> (netfront::stack::Stack, Side) {
    use smoltcp::iface::SocketStorage;
    let (mut q, side) = queue(first_gref);
    q.post_rx();
    let storage: Vec<SocketStorage<'static>> = (0..sockets).map(|_| SocketStorage::EMPTY).collect();
    let mac = [0x00, 0x16, 0x3e, 0, 0, mac_last];
    let stack = netfront::stack::Stack::new(
        netfront::NetDevice::new(q),
        mac,
        addressing,
        u64::from(mac_last),
        0,
        Box::leak(storage.into_boxed_slice()),
    );
    (stack, side)
}
