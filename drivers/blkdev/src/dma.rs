// SPDX-License-Identifier: MIT OR Apache-2.0
//! What a DMA driver needs from the machine beside its device: DMA memory and time.
//!
//! DMA memory is named by [`DmaRegion`]s, which only a [`Dma`] implementation makes
//! (`DmaRegion::new` is `unsafe`). A driver reads and writes its DMA memory through
//! safe methods that take a region and an offset, and an implementation accesses only
//! the bytes the region names (checked once per call by [`DmaRegion::span`]). So those
//! methods are not `unsafe fn`: a driver cannot name memory it was not given, the
//! implementation trusts no bare address, and the drivers stay free of `unsafe`.

/// A run of DMA memory handed out by [`Dma::allocate_dma`] (or a part of one): its bus
/// address and length in bytes.
///
/// A region is `Copy`: DMA memory is never freed, and it is shared with the device
/// anyway, so it is only ever copied to and from (never borrowed as Rust data); two
/// copies of a region name nothing one does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaRegion {
    address: u64,
    len: u64,
}

impl DmaRegion {
    /// A region of `len` bytes at bus address `address`.
    ///
    /// # Safety
    /// The bytes must be DMA memory of the [`Dma`] implementation the region will be
    /// used with, meeting everything [`Dma::allocate_dma`] promises (contiguous, at that
    /// bus address, owned by whoever holds the region and used by nothing else, never
    /// freed), and `address + len` must not overflow. Only `allocate_dma`
    /// implementations (and their test doubles) make regions.
    #[allow(
        unsafe_code,
        reason = "the constructor is the proof a region is DMA memory"
    )]
    pub const unsafe fn new(address: u64, len: u64) -> Self {
        DmaRegion { address, len }
    }

    /// Bus address of the first byte (what the device is told).
    pub const fn address(self) -> u64 {
        self.address
    }

    /// Length in bytes.
    pub const fn len(self) -> u64 {
        self.len
    }

    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `offset`, as a region of their own.
    ///
    /// # Panics
    /// When they do not lie inside this region.
    #[inline]
    #[track_caller]
    pub fn slice(self, offset: u64, len: u64) -> DmaRegion {
        DmaRegion {
            address: self.span(offset, len),
            len,
        }
    }

    /// Bus address of the `len` bytes at `offset`: the one check an implementation
    /// makes before accessing them.
    ///
    /// # Panics
    /// When they do not lie inside this region.
    #[inline]
    #[track_caller]
    pub fn span(self, offset: u64, len: u64) -> u64 {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => self.address + offset,
            _ => outside(self, offset, len),
        }
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn outside(region: DmaRegion, offset: u64, len: u64) -> ! {
    panic!("DMA access of {len} bytes at offset {offset:#x} leaves {region:x?}")
}

/// DMA memory and time, as a DMA driver's HAL provides them. Memory is named by
/// [`DmaRegion`]; `allocate_dma` is for set-up only.
///
/// # Safety
/// A driver hands the bus addresses of its regions to its device, which then reads and
/// writes them behind the compiler's back: safe driver code is sound only if an
/// implementation keeps these promises.
/// - `allocate_dma(pages)` returns a region of exactly `pages * 4096` bytes that is
///   zeroed, physically contiguous and 4 KiB-aligned, at the bus address the device
///   reaches it by, and the caller's alone: no other allocation, Rust object or device
///   request uses it, and it is never freed.
/// - `read_dma` and `write_dma` copy exactly the bytes `region.span(offset, len)` names
///   (which panics when they leave the region) and touch nothing else. They order
///   against the caller's own accesses at least like compiler fences: a read's bytes
///   are loaded after what came before it, a write's stored after.
/// - `delay_us` waits at least `micros` microseconds.
/// - `stop_dma` returns `true` only when, from its return on, the device can read or
///   write no memory at all (every queue of it: bus mastering is off, and writes the
///   device posted before are done); the device stays so until `resume_dma`.
/// - `resume_dma` lets the device reach memory again, and from then on `dma_stopped`
///   says `None` (until the next `stop_dma`).
#[allow(unsafe_code, reason = "implementations promise what DMA memory is")]
pub unsafe trait Dma: Clone {
    /// `pages` zeroed, physically contiguous, 4 KiB-aligned pages.
    fn allocate_dma(&self, pages: usize) -> Option<DmaRegion>;
    /// Copies the bytes at `offset` of `region` into `out`.
    fn read_dma(&self, region: DmaRegion, offset: u64, out: &mut [u8]);
    /// Copies `data` to `offset` of `region`.
    fn write_dma(&self, region: DmaRegion, offset: u64, data: &[u8]);
    /// Waits at least `micros` microseconds.
    fn delay_us(&self, micros: u64);
    /// Stops the device from reaching memory (every queue of it) until `resume_dma`: a
    /// device that holds a command it will not complete may still write its pages.
    /// `true` when that is confirmed (then no slot, buffer or page it was given can be
    /// written by it any more); `false` when it could not be.
    fn stop_dma(&self) -> bool;
    /// Once `stop_dma` was called for this device (by any queue), what it returned:
    /// the device is stopped, and no queue of it will see a completion again unless the
    /// device is reset and `resume_dma` called.
    fn dma_stopped(&self) -> Option<bool>;
    /// Zeroes all of `region` (through `write_dma`).
    fn zero_dma(&self, region: DmaRegion) {
        let zeroes = [0u8; 4096];
        let mut offset = 0;
        while offset < region.len() {
            let len = (region.len() - offset).min(zeroes.len() as u64);
            self.write_dma(region, offset, &zeroes[..len as usize]);
            offset += len;
        }
    }
    /// Lets a device stopped by `stop_dma` reach memory again, after its driver reset
    /// it: the device holds no command from before the stop. `true` when that is
    /// confirmed (bus mastering reads back on).
    fn resume_dma(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::DmaRegion;

    #[allow(
        unsafe_code,
        reason = "a region over nothing, only its arithmetic is used"
    )]
    fn region(address: u64, len: u64) -> DmaRegion {
        // SAFETY: these regions are never handed to a `Dma` implementation.
        unsafe { DmaRegion::new(address, len) }
    }

    #[test]
    fn spans_and_slices_stay_inside() {
        let r = region(0x10_000, 4096);
        assert_eq!(r.span(0, 4096), 0x10_000);
        assert_eq!(r.span(4095, 1), 0x10_fff);
        assert_eq!(r.span(4096, 0), 0x11_000);
        let s = r.slice(64, 64);
        assert_eq!((s.address(), s.len()), (0x10_040, 64));
        assert_eq!(s.span(32, 1), 0x10_060);
    }

    #[test]
    #[should_panic(expected = "leaves")]
    fn a_span_past_the_end_panics() {
        region(0x10_000, 4096).span(4090, 8);
    }

    #[test]
    #[should_panic(expected = "leaves")]
    fn an_overflowing_span_panics() {
        region(0x10_000, 4096).span(u64::MAX, 2);
    }

    #[test]
    #[should_panic(expected = "leaves")]
    fn a_slice_cannot_reach_past_its_parent() {
        region(0x10_000, 4096).slice(64, 64).span(60, 8);
    }
}
