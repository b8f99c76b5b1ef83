//! What a DMA driver needs from the machine beside its device: DMA memory and time.

/// DMA memory and time, as a DMA driver's HAL provides them. Memory is named by
/// bus address; `allocate_dma` is for set-up only.
pub trait Dma: Clone {
    /// `pages` zeroed, physically contiguous, 4 KiB-aligned pages; their bus address.
    fn allocate_dma(&self, pages: usize) -> Option<u64>;
    /// Copies DMA memory at `address` into `out`.
    fn read_dma(&self, address: u64, out: &mut [u8]);
    /// Copies `data` into DMA memory at `address`.
    fn write_dma(&self, address: u64, data: &[u8]);
    /// Waits at least `micros` microseconds.
    fn delay_us(&self, micros: u64);
}
