// SPDX-License-Identifier: MIT OR Apache-2.0
//! The memory ranges an old image's handover block lists, from what it holds: the pages
//! of the vCPUs' `vcpu_info`, the park page and the RAM disks' stripes (runs of
//! neighbouring stripes as one range, so that a disk's stripes, handed out lowest first,
//! take a few ranges and not one each).

use alloc::vec::Vec;

use crate::block::{MemRange, RangeKind, PAGE, STRIPE_SIZE};

/// The ranges for `vcpu_info` addresses, the park page and stripe addresses (any order;
/// each stripe `STRIPE_SIZE` long): `vcpu_info` pages once each, then the park page, then
/// the stripes' runs in address order.
pub fn kept_ranges(vcpu_info: &[u64], park_page: u64, stripes: &[u64]) -> Vec<MemRange> {
    let mut ranges = Vec::new();
    let mut pages: Vec<u64> = vcpu_info.iter().map(|a| a / PAGE * PAGE).collect();
    pages.sort_unstable();
    pages.dedup();
    ranges.extend(pages.into_iter().map(|start| MemRange {
        kind: RangeKind::VcpuInfo,
        start,
        len: PAGE,
    }));
    ranges.push(MemRange {
        kind: RangeKind::Park,
        start: park_page,
        len: PAGE,
    });
    let mut stripes = stripes.to_vec();
    stripes.sort_unstable();
    for address in stripes {
        match ranges.last_mut() {
            Some(last) if last.kind == RangeKind::RamDisk && last.end() == address => {
                last.len += STRIPE_SIZE
            }
            _ => ranges.push(MemRange {
                kind: RangeKind::RamDisk,
                start: address,
                len: STRIPE_SIZE,
            }),
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_stripes_make_one_range_and_vcpu_info_pages_are_listed_once() {
        let s = STRIPE_SIZE;
        let base = 64 << 20;
        let ranges = kept_ranges(
            &[0x20_0000, 0x20_0040, 0x30_0000],
            0x1_0000,
            &[base + 3 * s, base, base + s, base + 10 * s, base + 2 * s],
        );
        let expect = [
            (RangeKind::VcpuInfo, 0x20_0000, PAGE),
            (RangeKind::VcpuInfo, 0x30_0000, PAGE),
            (RangeKind::Park, 0x1_0000, PAGE),
            (RangeKind::RamDisk, base, 4 * s),
            (RangeKind::RamDisk, base + 10 * s, s),
        ];
        let got: Vec<_> = ranges.iter().map(|r| (r.kind, r.start, r.len)).collect();
        assert_eq!(got, expect);
    }
}
