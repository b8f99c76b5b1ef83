// SPDX-License-Identifier: MIT OR Apache-2.0
//! Guest-physical space for foreign mappings: a hole in our memory map (identity
//! mapped, below 4 GiB), cut into one region per ring: 16 pages for the ring itself
//! (order 4 at most, consecutive so the ring is one virtual range) followed by the
//! pages its grants are mapped at. The region bounds how much of the frontend's memory
//! one ring can pin (design.md, XSA-392).

use machine::frames::PhysRange;

pub const RING_PAGES: u32 = 16;
/// Grants one ring may have mapped at once (128 MiB of the frontend's pages): its
/// persistent ones (at most `grants.max-per-ring`, itself at most half of this) and
/// those of its requests in flight.
pub const GRANT_PAGES_PER_RING: u32 = 32 * 1024;
const REGION_BYTES: u64 = (RING_PAGES + GRANT_PAGES_PER_RING) as u64 * 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRegion {
    pub index: u32,
    pub ring_base: u64,
    pub grant_base: u64,
    pub grant_pages: u32,
}

struct Space {
    base: u64,
    free: alloc::vec::Vec<u32>,
}

/// The map space, set once at start-up. Shared: the control path (vCPU 0) takes a
/// region when a ring connects, and the poller that releases the ring, on any vCPU,
/// gives it back.
static SPACE: spin::Once<spin::Mutex<Space>> = spin::Once::new();

/// Takes `hole` (from the memory map) as the map space; returns how many rings fit. Only
/// the first call sets it.
pub fn init(hole: PhysRange) -> u32 {
    let regions = (hole.len() / REGION_BYTES) as u32;
    let space = SPACE.call_once(|| {
        spin::Mutex::new(Space {
            base: hole.start,
            free: (0..regions).rev().collect(),
        })
    });
    space.lock().free.len() as u32
}

fn region(base: u64, index: u32) -> MapRegion {
    let ring_base = base + u64::from(index) * REGION_BYTES;
    MapRegion {
        index,
        ring_base,
        grant_base: ring_base + u64::from(RING_PAGES) * 4096,
        grant_pages: GRANT_PAGES_PER_RING,
    }
}

/// A free region, or `None` when every region is in use.
pub fn alloc() -> Option<MapRegion> {
    let mut space = SPACE.get()?.lock();
    let index = space.free.pop()?;
    Some(region(space.base, index))
}

/// Returns a region whose pages are all unmapped again.
fn free(region: MapRegion) {
    if let Some(space) = SPACE.get() {
        space.lock().free.push(region.index);
    }
}

/// Gives back the region of a ring that is gone (or never connected): free for the next
/// ring, or, when `leaked` pages of it stay mapped (their unmap failed), retired for good
/// (a page of it could be handed out again while Xen still maps it).
pub fn release(region: MapRegion, leaked: u64) {
    if leaked == 0 {
        free(region);
    } else {
        log::error!(
            "blkback: {leaked} pages of map region {} stay mapped; region retired",
            region.index
        );
    }
}

pub fn available() -> usize {
    SPACE.get().map_or(0, |s| s.lock().free.len())
}
