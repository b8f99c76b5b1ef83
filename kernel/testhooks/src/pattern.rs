// SPDX-License-Identifier: MIT OR Apache-2.0
//! Seeded disk-test writes: where each write goes and what it writes.
//!
//! Queue `q` of a test owns region `q` of the disk (so concurrent queues never overlap
//! and the last write of each byte is well defined). Write `i` of queue `q` covers
//! `sectors` sectors at `sector`; its data are little-endian 64-bit words, the word at
//! absolute disk byte `8k` being `base(seed, q, i) + k * GOLDEN` (wrapping). Any
//! misplaced, stale or torn sector shows up as a wrong word.

pub const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 finaliser.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// First word of the pattern of write `index` of `queue`.
pub fn base(seed: u64, queue: u32, index: u32) -> u64 {
    mix(seed ^ (u64::from(queue) << 32) ^ u64::from(index).wrapping_mul(GOLDEN))
}

/// Fills `out` with write `index`'s data as it belongs at absolute disk byte
/// `byte_offset` (a multiple of 8; `out.len()` too).
pub fn fill(seed: u64, queue: u32, index: u32, byte_offset: u64, out: &mut [u8]) {
    debug_assert!(byte_offset.is_multiple_of(8) && out.len().is_multiple_of(8));
    let start = base(seed, queue, index);
    let first_word = byte_offset / 8;
    for (k, chunk) in out.chunks_exact_mut(8).enumerate() {
        let word = start.wrapping_add((first_word + k as u64).wrapping_mul(GOLDEN));
        chunk.copy_from_slice(&word.to_le_bytes());
    }
}

/// The first mismatching byte of `data` (at absolute `byte_offset`) against write
/// `index`'s pattern, if any.
pub fn first_mismatch(
    seed: u64,
    queue: u32,
    index: u32,
    byte_offset: u64,
    data: &[u8],
) -> Option<usize> {
    let start = base(seed, queue, index);
    let first_word = byte_offset / 8;
    data.chunks_exact(8).enumerate().find_map(|(k, chunk)| {
        let word = start.wrapping_add((first_word + k as u64).wrapping_mul(GOLDEN));
        (chunk != word.to_le_bytes()).then(|| {
            let bytes = word.to_le_bytes();
            k * 8
                + chunk
                    .iter()
                    .zip(bytes)
                    .position(|(a, b)| *a != b)
                    .unwrap_or(0)
        })
    })
}

/// One write of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    pub index: u32,
    pub sector: u64,
    pub sectors: u32,
}

/// The writes of one queue: `count` writes of 1..=`max_sectors` sectors inside
/// `region_start..region_start + region_sectors`.
#[derive(Clone, Debug)]
pub struct Plan {
    state: u64,
    region_start: u64,
    region_sectors: u64,
    max_sectors: u32,
    next: u32,
    count: u32,
}

impl Plan {
    pub fn new(
        seed: u64,
        queue: u32,
        region_start: u64,
        region_sectors: u64,
        count: u32,
        max_sectors: u32,
    ) -> Self {
        Plan {
            state: mix(seed.wrapping_add(u64::from(queue).wrapping_mul(GOLDEN))),
            region_start,
            region_sectors,
            max_sectors: max_sectors.max(1),
            next: 0,
            count,
        }
    }

    fn random(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }
}

impl Iterator for Plan {
    type Item = Write;

    fn next(&mut self) -> Option<Write> {
        if self.next >= self.count || self.region_sectors == 0 {
            return None;
        }
        let longest = u64::from(self.max_sectors).min(self.region_sectors);
        // Favour the extremes: a quarter single sectors, a quarter the longest.
        let sectors = match self.random() % 4 {
            0 => 1,
            1 => longest,
            _ => 1 + self.random() % longest,
        };
        let sector = self.region_start + self.random() % (self.region_sectors - sectors + 1);
        let index = self.next;
        self.next += 1;
        Some(Write {
            index,
            sector,
            sectors: sectors as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values_shared_with_the_python_checker() {
        // tests/qemu/disk_pattern.py asserts the same numbers.
        assert_eq!(mix(0), 0);
        assert_eq!(mix(1), 0x5692_161d_100b_05e5);
        let mut out = [0u8; 16];
        fill(42, 1, 3, 4096, &mut out);
        let first = u64::from_le_bytes(out[..8].try_into().unwrap());
        assert_eq!(
            first,
            base(42, 1, 3).wrapping_add(512u64.wrapping_mul(GOLDEN))
        );
        assert_eq!(base(7, 0, 0), 0x12ae_3023_7b17_df14);
        let writes: Vec<_> = Plan::new(7, 0, 0, 131072, 3, 2048).collect();
        let expected = [(4034, 1046), (67566, 502), (89558, 1169)];
        for (i, (w, (sector, sectors))) in writes.iter().zip(expected).enumerate() {
            assert_eq!(
                *w,
                Write {
                    index: i as u32,
                    sector,
                    sectors
                }
            );
        }
    }

    #[test]
    fn plans_stay_in_their_region_and_span_one_sector_to_the_maximum() {
        let plan: Vec<_> = Plan::new(99, 2, 1000, 5000, 500, 2048).collect();
        assert_eq!(plan.len(), 500);
        assert!(plan
            .iter()
            .all(|w| w.sector >= 1000 && w.sector + u64::from(w.sectors) <= 6000));
        assert!(plan.iter().any(|w| w.sectors == 1));
        assert!(plan.iter().any(|w| w.sectors == 2048));
        assert!(plan.iter().enumerate().all(|(i, w)| w.index == i as u32));
        // Same inputs, same plan; another queue or seed, another plan.
        assert_eq!(
            plan,
            Plan::new(99, 2, 1000, 5000, 500, 2048).collect::<Vec<_>>()
        );
        assert_ne!(
            plan,
            Plan::new(99, 3, 1000, 5000, 500, 2048).collect::<Vec<_>>()
        );
        assert_ne!(
            plan,
            Plan::new(98, 2, 1000, 5000, 500, 2048).collect::<Vec<_>>()
        );
        // A region smaller than the longest write.
        assert!(Plan::new(1, 0, 0, 3, 50, 2048).all(|w| w.sector + u64::from(w.sectors) <= 3));
        assert_eq!(Plan::new(1, 0, 0, 0, 50, 2048).count(), 0);
    }

    #[test]
    fn mismatches_are_found_at_the_right_byte() {
        let mut data = vec![0u8; 1024];
        fill(5, 0, 9, 512, &mut data);
        assert_eq!(first_mismatch(5, 0, 9, 512, &data), None);
        // Same data one sector off, or from another write, does not verify.
        assert_eq!(first_mismatch(5, 0, 9, 1024, &data), Some(0));
        assert_eq!(first_mismatch(5, 0, 8, 512, &data), Some(0));
        data[700] ^= 0x10;
        assert_eq!(first_mismatch(5, 0, 9, 512, &data), Some(700));
    }
}
