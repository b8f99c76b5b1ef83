// SPDX-License-Identifier: MIT OR Apache-2.0
//! smoltcp's [`Device`] over a [`NetQueue`]. Frames are copied between the granted
//! pages and two buffers the device owns, one frame to send and one packet received
//! (smoltcp's tokens want plain slices, and the pages are shared memory the backend may
//! write at any time, read only through atomics), so the data path allocates nothing.
//!
//! Checksums: smoltcp computes the IPv4 header's and UDP's on send and checks the IPv4
//! header's on receive; TCP's and UDP's are checked here ([`crate::csum`]) for packets
//! dom0 did not check, and smoltcp is told not to (its settings are per device, and a
//! packet with `NETRXF_csum_blank` has none to check). smoltcp computes no TCP checksum
//! on send: the token leaves it to netback with GSO on send, and fills it in otherwise.
//!
//! Several queues: `receive` takes packets from every queue in turn (netback picks the
//! queue of each packet to us). Frames go out on queue 0 only: netback takes a frame on
//! any queue the same way, which queue sends changes nothing for the steering of what
//! comes back, and while vCPU 0 drives every queue one sending queue keeps one tx
//! path. With a [`Steering`] set, each packet is checked against it ([`SteerStats`]).
//!
//! Large packets: smoltcp 0.14 takes an IPv4/TCP packet longer than the device's MTU on
//! receive (it checks lengths against the IPv4 header, not the MTU; the MTU bounds what
//! it sends), so a 64 KiB GSO packet is one segment to its TCP socket. On send, with
//! [`NetDevice::set_tx_gso`] (netback offers `feature-gso-tcpv4`), a connection's
//! back-to-back segments are joined into such packets ([`crate::tso`]); a token is
//! given only while queue 0 has room for every open packet at its largest and one more,
//! so sending an open packet never finds the ring full, and [`NetDevice::flush`] sends
//! them after each poll.
//!
//! The MTU ([`NetDevice::set_mtu`], 1500 unless the toolstack allows more) is what the
//! capabilities tell smoltcp; a frame over a page goes out over several slots.

use crate::hash::{flow_hash, ipv4_tcp_flow, Steering, MAX_QUEUES};
use crate::queue::{
    heap_buffer, NetFault, NetQueue, NetStats, Offload, DEFAULT_MTU, ETHERNET_HEADER, MAX_FRAME,
    MAX_MTU, MAX_PACKET, MIN_MTU,
};
use crate::tso::{JoinStats, Joiner};
use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use smoltcp::phy::{self, Checksum, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use xen::abi::netif::RX_RING_SIZE;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Packets lost on the way out (every tx slot in flight, or the queue failed).
    pub tx_full: u64,
    /// Packets received with a wrong TCP or UDP checksum, dropped.
    pub rx_bad_checksum: u64,
}

/// What one queue received, against what the steering predicted (with a hash set up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerStats {
    /// IPv4/TCP packets received on this queue.
    pub tcp: u64,
    /// Of them, with netback's hash equal to ours.
    pub hash_agreed: u64,
    /// Of them, with netback's hash other than ours (the key or the input differ).
    pub hash_mismatch: u64,
    /// Of them, arrived here while the steering said another queue.
    pub off_queue: u64,
    /// Other packets (not IPv4/TCP: netback hashes them to 0, queue 0) that arrived on
    /// another queue: netback queued them before the hash was set up (dom0's IPv6
    /// neighbour discovery as the vif comes up) and steered them by dom0's own hash.
    pub other_off_queue: u64,
}

pub struct NetDevice {
    /// One to [`MAX_QUEUES`], all made at set-up. Frames go out on queue 0 (module doc).
    queues: Vec<NetQueue>,
    steering: Option<Steering>,
    /// The queue `receive` looks at first: the one after the last that gave a packet,
    /// so a busy queue does not starve the others.
    next_rx: usize,
    rx_buf: Box<[u8; MAX_PACKET]>,
    tx_buf: Box<[u8; MAX_FRAME]>,
    /// Joins segments into GSO packets, with [`NetDevice::set_tx_gso`].
    joiner: Option<Joiner>,
    /// The largest IP packet smoltcp sends ([`NetDevice::set_mtu`]).
    mtu: usize,
    pub stats: DeviceStats,
    pub steer: [SteerStats; MAX_QUEUES],
}

impl NetDevice {
    pub fn new(queue: NetQueue) -> Self {
        Self::with_queues(vec![queue])
    }

    /// A device over `queues` (1 to [`MAX_QUEUES`]; past that the rest are not used).
    pub fn with_queues(mut queues: Vec<NetQueue>) -> Self {
        assert!(!queues.is_empty());
        queues.truncate(MAX_QUEUES);
        Self {
            queues,
            steering: None,
            next_rx: 0,
            rx_buf: heap_buffer(),
            tx_buf: heap_buffer(),
            joiner: None,
            mtu: DEFAULT_MTU,
            stats: DeviceStats::default(),
            steer: [SteerStats::default(); MAX_QUEUES],
        }
    }

    /// Joins each connection's back-to-back segments into TCPv4 GSO packets of up to
    /// 64 KiB from now on (netback offers `feature-gso-tcpv4`): takes the joiner's
    /// buffers ([`crate::tso::OPEN_PACKETS`] of 64 KiB) now.
    pub fn set_tx_gso(&mut self) {
        self.joiner.get_or_insert_with(Joiner::new);
    }

    /// IP packets of up to `mtu` bytes (bounded to [`MIN_MTU`]..=[`MAX_MTU`]), and an MSS
    /// to match: what the capabilities say. Set it before the interface is made, which
    /// reads them once.
    pub fn set_mtu(&mut self, mtu: usize) {
        self.mtu = mtu.clamp(MIN_MTU, MAX_MTU);
    }

    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Segments joined so far (zeros without GSO on send).
    pub fn join_stats(&self) -> JoinStats {
        self.joiner
            .as_ref()
            .map_or(JoinStats::default(), |j| j.stats)
    }

    /// Sends every packet still being joined: after each poll of the interface.
    pub fn flush(&mut self) {
        let Some(joiner) = self.joiner.as_mut() else {
            return;
        };
        let (queue, stats) = (&mut self.queues[0], &mut self.stats);
        joiner.flush(&mut |packet, offload| send(queue, stats, packet, offload));
    }

    /// Queue 0, the one frames go out on.
    pub fn queue(&self) -> &NetQueue {
        &self.queues[0]
    }

    pub fn queue_mut(&mut self) -> &mut NetQueue {
        &mut self.queues[0]
    }

    pub fn queues(&self) -> &[NetQueue] {
        &self.queues
    }

    /// Every queue's counters added up.
    pub fn queue_totals(&self) -> NetStats {
        self.queues
            .iter()
            .fold(NetStats::default(), |mut total, q| {
                total += q.stats;
                total
            })
    }

    pub fn queues_mut(&mut self) -> &mut [NetQueue] {
        &mut self.queues
    }

    /// The first queue's fault, if any queue failed.
    pub fn fault(&self) -> Option<(usize, NetFault)> {
        self.queues
            .iter()
            .enumerate()
            .find_map(|(i, q)| q.fault().map(|f| (i, f)))
    }

    /// How netback steers packets to the queues, once the control ring set it up:
    /// from then on each received packet is checked against it ([`SteerStats`]).
    pub fn set_steering(&mut self, steering: Option<Steering>) {
        self.steering = steering;
    }

    pub fn steering(&self) -> Option<Steering> {
        self.steering
    }

    /// Counts `frame`, received on `queue` with netback's `hash`, against the steering.
    fn check_steering(&mut self, queue: usize, len: usize, hash: Option<u32>) {
        let Some(steering) = self.steering else {
            return;
        };
        // Parsed once: its hash, and whether netback hashes it at all.
        let flow = ipv4_tcp_flow(&self.rx_buf[..len]);
        let ours = flow.map_or(0, flow_hash);
        let stats = &mut self.steer[queue];
        let off = usize::from(steering.queue_of_hash(ours)) != queue;
        if flow.is_some() {
            stats.tcp += 1;
            stats.off_queue += u64::from(off);
            match hash {
                Some(theirs) if theirs == ours => stats.hash_agreed += 1,
                Some(_) => stats.hash_mismatch += 1,
                None => {}
            }
        } else {
            stats.other_off_queue += u64::from(off);
        }
    }
}

pub struct RxToken<'a> {
    frame: &'a [u8],
}

pub struct TxToken<'a> {
    queue: &'a mut NetQueue,
    buf: &'a mut [u8; MAX_FRAME],
    joiner: Option<&'a mut Joiner>,
    stats: &'a mut DeviceStats,
}

/// Sends `packet` on `queue`, counting it lost when the queue cannot take it.
fn send(queue: &mut NetQueue, stats: &mut DeviceStats, packet: &[u8], offload: Offload) {
    if queue.send_packet(packet, offload).is_err() {
        stats.tx_full += 1;
    }
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
        let frame = &mut self.buf[..len.min(MAX_FRAME)];
        let result = f(frame);
        let (queue, stats) = (self.queue, self.stats);
        let mut send = |packet: &[u8], offload| send(queue, stats, packet, offload);
        match self.joiner {
            Some(joiner) => joiner.take(frame, &mut send),
            None => {
                crate::csum::fill_tcp_checksum(frame);
                send(frame, Offload::None)
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
        let _ = self.queues[0].reap_tx();
        let count = self.queues.len();
        let (queue, len) = (0..count).find_map(|i| {
            let at = (self.next_rx + i) % count;
            loop {
                let packet = self.queues[at].receive(&mut self.rx_buf).ok()??;
                if packet.checksum_checked
                    || crate::csum::transport_checksum_ok(&self.rx_buf[..packet.len])
                {
                    self.check_steering(at, packet.len, packet.hash);
                    break Some((at, packet.len));
                }
                self.stats.rx_bad_checksum += 1;
            }
        })?;
        self.next_rx = (queue + 1) % count;
        let (tx, _) = self.queues.split_at_mut(1);
        Some((
            RxToken {
                frame: &self.rx_buf[..len],
            },
            TxToken {
                queue: &mut tx[0],
                buf: &mut self.tx_buf,
                joiner: self.joiner.as_mut(),
                stats: &mut self.stats,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        let _ = self.queues[0].reap_tx();
        let room = match &self.joiner {
            Some(joiner) => self.queues[0].can_send_packets(joiner.open_count() + 1),
            None => self.queues[0].can_send_frame(ETHERNET_HEADER + self.mtu),
        };
        room.then_some(TxToken {
            queue: &mut self.queues[0],
            buf: &mut self.tx_buf,
            joiner: self.joiner.as_mut(),
            stats: &mut self.stats,
        })
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        // What smoltcp sends; what it takes in may be larger (GSO, module doc).
        caps.max_transmission_unit = ETHERNET_HEADER + self.mtu;
        // smoltcp caps the window it advertises at burst x MSS: the rx pages posted to
        // the backend are what a burst can land in (one MSS a page at least, more when
        // netback fills pages with GSO packets). It compares the header's window field,
        // which a scaled window (buffers over 64 KiB) keeps under 65,536, so the cap
        // binds only unscaled windows; what the ring cannot take waits in netback, which
        // stops its queue when full rather than drop.
        caps.max_burst_size = Some(RX_RING_SIZE as usize);
        // TCP and UDP checked in `receive`; on send UDP's computed by smoltcp, TCP's
        // left to netback or filled in by the token (`crate::csum`).
        caps.checksum.tcp = Checksum::None;
        caps.checksum.udp = Checksum::Tx;
        caps
    }
}
