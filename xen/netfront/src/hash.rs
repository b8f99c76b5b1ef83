// SPDX-License-Identifier: MIT OR Apache-2.0
//! Which vif queue netback puts a packet to blkdom on, computed as netback computes it,
//! and the local port that lands a connection on the queue wanted.
//!
//! With a control ring set up ([`crate::ctrl`]), Linux netback's `xenvif_select_queue`
//! hashes every IPv4/TCP packet for us with Toeplitz over our key (`hash.c`: source
//! address, destination address, source port, destination port, as they sit in the
//! packet, network byte order) and takes queue `mapping[hash % size]`. A packet *to*
//! blkdom comes from the target: its source is the target's address and port, its
//! destination blkdom's. Packets it does not hash (not IPv4/TCP: ARP, DHCP, ICMP) get
//! hash 0, so `mapping[0]`, queue 0.
//!
//! The key is fixed, Microsoft's RSS verification key (netif.h's algorithm is the same
//! Toeplitz; its published vectors check this code and this key at once). A secret
//! per-boot key is what an RSS receiver uses against a peer that crafts flows to pile
//! them on one queue; blkdom opens every connection itself and picks its own port, and
//! a packet of no connection of ours is dropped whichever queue it lands on, so a secret
//! buys nothing here, while a known key lets anyone (a test, an operator reading the
//! console) predict a flow's queue.

use xen::abi::netif::XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP;

/// Microsoft's RSS verification key (40 bytes, Linux netback's `XEN_NETBK_MAX_HASH_KEY_SIZE`).
pub const KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// The hash types asked for: IPv4 with TCP only (other packets hash to 0: queue 0).
pub const HASH_FLAGS: u32 = XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP;

/// The mapping table's entries we ask for (Linux netback's maximum, 128).
pub const MAPPING_SIZE: u32 = 128;

/// The largest queue count a vif is given (the kernel opens at most this many).
pub const MAX_QUEUES: usize = 8;

/// The ephemeral ports connections take (IANA's range, as smoltcp's own).
pub const EPHEMERAL: core::ops::RangeInclusive<u16> = 49152..=65535;

/// Toeplitz over `input` with `key`, netif.h's definition: for each bit of the input, most
/// significant first, when it is 1 the result takes the key's 32 bits at that position.
/// Key bits past its end are 0.
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let key_bit = |i: usize| -> u32 {
        key.get(i / 8)
            .map_or(0, |byte| u32::from(byte >> (7 - i % 8) & 1))
    };
    let mut window: u32 = (0..32).fold(0, |w, i| w << 1 | key_bit(i));
    let mut hash = 0;
    for (n, byte) in input.iter().enumerate() {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                hash ^= window;
            }
            window = window << 1 | key_bit(n * 8 + bit + 32);
        }
    }
    hash
}

/// netback's input for an IPv4/TCP packet: source, destination, source port,
/// destination port, each in network byte order.
pub fn ipv4_tcp_input(src: [u8; 4], dst: [u8; 4], src_port: u16, dst_port: u16) -> [u8; 12] {
    let mut input = [0u8; 12];
    input[..4].copy_from_slice(&src);
    input[4..8].copy_from_slice(&dst);
    input[8..10].copy_from_slice(&src_port.to_be_bytes());
    input[10..].copy_from_slice(&dst_port.to_be_bytes());
    input
}

/// The addresses and ports of an IPv4/TCP frame as netback hashes them (source,
/// destination, source port, destination port); `None` for anything it does not hash
/// under [`HASH_FLAGS`] (not IPv4/TCP, or a fragment: `FLOW_DIS_IS_FRAGMENT`), which
/// takes hash 0.
pub fn ipv4_tcp_flow(frame: &[u8]) -> Option<([u8; 4], [u8; 4], u16, u16)> {
    use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp || ip.more_frags() || ip.frag_offset() != 0 {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    Some((
        ip.src_addr().octets(),
        ip.dst_addr().octets(),
        tcp.src_port(),
        tcp.dst_port(),
    ))
}

/// netback's hash of a flow as [`ipv4_tcp_flow`] gives it.
pub fn flow_hash((src, dst, src_port, dst_port): ([u8; 4], [u8; 4], u16, u16)) -> u32 {
    toeplitz(&KEY, &ipv4_tcp_input(src, dst, src_port, dst_port))
}

/// netback's hash of `frame` (0 when it does not hash it).
pub fn hash_of_frame(frame: &[u8]) -> u32 {
    ipv4_tcp_flow(frame).map_or(0, flow_hash)
}

/// How netback picks the queue of a packet to us, once the control ring set it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steering {
    queues: u16,
    /// Entries of the mapping table (0: netback uses `hash % queues`, its behaviour
    /// without a table).
    size: u32,
}

impl Steering {
    /// `queues` queues (1 to [`MAX_QUEUES`]) and a table of `size` entries, filled by
    /// [`Steering::entry`].
    pub fn new(queues: u16, size: u32) -> Self {
        Self {
            queues: queues.max(1),
            size,
        }
    }

    pub fn queues(&self) -> u16 {
        self.queues
    }

    pub fn table_size(&self) -> u32 {
        self.size
    }

    /// The table's entry `i`: the queues in turn, so entry 0 (every unhashed packet) is
    /// queue 0 and each queue has the same share of hash values.
    pub fn entry(&self, i: u32) -> u32 {
        i % u32::from(self.queues)
    }

    /// The queue of a hash value, as `xenvif_select_queue` takes it.
    pub fn queue_of_hash(&self, hash: u32) -> u16 {
        let queues = u32::from(self.queues);
        let queue = if self.size == 0 {
            hash % queues
        } else {
            self.entry(hash % self.size)
        };
        queue as u16
    }

    /// The queue netback puts the packets of a TCP connection to us on: they come from
    /// `remote`:`remote_port` to `local`:`local_port`.
    pub fn queue_for_flow(
        &self,
        remote: [u8; 4],
        remote_port: u16,
        local: [u8; 4],
        local_port: u16,
    ) -> u16 {
        self.queue_of_hash(flow_hash((remote, local, remote_port, local_port)))
    }

    /// An ephemeral local port whose connection to `remote`:`remote_port` lands on
    /// `queue`: the first from `from` on (wrapping within [`EPHEMERAL`]) that does and
    /// that `taken` does not refuse. `None` when no port does (a queue past the count,
    /// or every such port taken).
    pub fn local_port_for_queue(
        &self,
        queue: u16,
        remote: [u8; 4],
        remote_port: u16,
        local: [u8; 4],
        from: u16,
        taken: &mut dyn FnMut(u16) -> bool,
    ) -> Option<u16> {
        if queue >= self.queues {
            return None;
        }
        let first = *EPHEMERAL.start();
        let span = u32::from(*EPHEMERAL.end() - first) + 1;
        let start = u32::from(from.max(first) - first);
        (0..span)
            .map(|i| first + ((start + i) % span) as u16)
            .find(|&port| {
                self.queue_for_flow(remote, remote_port, local, port) == queue && !taken(port)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Microsoft's "Verifying the RSS Hash Calculation" vectors with its key:
    /// (destination, destination port, source, source port, IPv4 hash, IPv4/TCP hash).
    /// The input is source address, destination address, source port, destination port.
    type Vector = ([u8; 4], u16, [u8; 4], u16, u32, u32);
    const VECTORS: [Vector; 5] = [
        (
            [161, 142, 100, 80],
            1766,
            [66, 9, 149, 187],
            2794,
            0x323e8fc2,
            0x51ccc178,
        ),
        (
            [65, 69, 140, 83],
            4739,
            [199, 92, 111, 2],
            14230,
            0xd718262a,
            0xc626b0ea,
        ),
        (
            [12, 22, 207, 184],
            38024,
            [24, 19, 198, 95],
            12898,
            0xd2d0a5de,
            0x5c2b394a,
        ),
        (
            [209, 142, 163, 6],
            2217,
            [38, 27, 205, 30],
            48228,
            0x82989176,
            0xafc7327f,
        ),
        (
            [202, 188, 127, 2],
            1303,
            [153, 39, 163, 191],
            44251,
            0x5d1809c5,
            0x10e828a2,
        ),
    ];

    #[test]
    fn toeplitz_matches_microsofts_rss_vectors() {
        for (dst, dst_port, src, src_port, ipv4, ipv4_tcp) in VECTORS {
            let mut l3 = [0u8; 8];
            l3[..4].copy_from_slice(&src);
            l3[4..].copy_from_slice(&dst);
            assert_eq!(toeplitz(&KEY, &l3), ipv4, "{src:?} -> {dst:?}");
            let input = ipv4_tcp_input(src, dst, src_port, dst_port);
            assert_eq!(toeplitz(&KEY, &input), ipv4_tcp, "{src:?} -> {dst:?}");
        }
    }

    /// netif.h's reference code, transcribed: a 64-bit prefix shifted a bit at a time.
    fn netif_h_toeplitz(key: &[u8], buf: &[u8]) -> u32 {
        let mut prefix: u64 = 0;
        let mut keyi = 0;
        while keyi < 8 {
            prefix = prefix << 8 | u64::from(key.get(keyi).copied().unwrap_or(0));
            keyi += 1;
        }
        let mut hash: u64 = 0;
        for &b in buf {
            let mut byte = b;
            for _ in 0..8 {
                if byte & 0x80 != 0 {
                    hash ^= prefix;
                }
                prefix <<= 1;
                byte <<= 1;
            }
            prefix |= u64::from(key.get(keyi).copied().unwrap_or(0));
            keyi += 1;
        }
        (hash >> 32) as u32
    }

    #[test]
    fn toeplitz_agrees_with_netif_h_for_any_input_and_short_keys() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..2000 {
            let len = (next() % 40) as usize;
            let input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let key_len = if round % 3 == 0 {
                (next() % 40) as usize
            } else {
                40
            };
            let key: Vec<u8> = (0..key_len).map(|_| next() as u8).collect();
            assert_eq!(toeplitz(&key, &input), netif_h_toeplitz(&key, &input));
        }
        assert_eq!(toeplitz(&KEY, &[]), 0);
    }

    #[test]
    fn the_table_spreads_hashes_over_the_queues_and_unhashed_packets_take_queue_0() {
        for queues in 1..=MAX_QUEUES as u16 {
            let steering = Steering::new(queues, MAPPING_SIZE);
            assert_eq!(steering.queue_of_hash(0), 0);
            let mut share = vec![0; queues as usize];
            for i in 0..MAPPING_SIZE {
                share[steering.entry(i) as usize] += 1;
            }
            let (least, most) = (share.iter().min(), share.iter().max());
            assert!(most.unwrap() - least.unwrap() <= 1, "{queues}: {share:?}");
            // Without a table netback takes hash % queues.
            assert_eq!(
                u32::from(Steering::new(queues, 0).queue_of_hash(1234567)),
                1234567 % u32::from(queues)
            );
        }
    }

    #[test]
    fn picked_ports_land_on_their_queue() {
        let remote = [10, 9, 0, 1];
        let local = [10, 9, 0, 2];
        for queues in [2u16, 3, 4, 8] {
            let steering = Steering::new(queues, MAPPING_SIZE);
            let mut counts = vec![0u32; queues as usize];
            let mut from = 49152;
            for round in 0..500u32 {
                let queue = (round % u32::from(queues)) as u16;
                let port = steering
                    .local_port_for_queue(queue, remote, 4420, local, from, &mut |_| false)
                    .expect("a port");
                assert!(EPHEMERAL.contains(&port));
                // The packets of that connection to us: from the target to our port.
                let hash = toeplitz(&KEY, &ipv4_tcp_input(remote, local, 4420, port));
                assert_eq!(steering.queue_of_hash(hash), queue);
                assert_eq!(steering.queue_for_flow(remote, 4420, local, port), queue);
                counts[queue as usize] += 1;
                from = port.wrapping_add(1).max(49152);
            }
            assert!(counts.iter().all(|&c| c > 0));
        }
        // Every port of a queue but one refused: that one; all refused: none.
        let steering = Steering::new(2, MAPPING_SIZE);
        let only = steering
            .local_port_for_queue(1, remote, 4420, local, 60000, &mut |_| false)
            .unwrap();
        let picked =
            steering.local_port_for_queue(1, remote, 4420, local, 49152, &mut |p| p != only);
        assert_eq!(picked, Some(only));
        assert_eq!(
            steering.local_port_for_queue(1, remote, 4420, local, 49152, &mut |_| true),
            None
        );
        assert_eq!(
            steering.local_port_for_queue(2, remote, 4420, local, 49152, &mut |_| false),
            None
        );
        // Wrapping: from the range's last port the search goes on at its first.
        let last = steering.local_port_for_queue(0, remote, 4420, local, 65535, &mut |_| false);
        assert!(last.is_some());
    }
}
