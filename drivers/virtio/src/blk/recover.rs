// SPDX-License-Identifier: MIT OR Apache-2.0
//! A virtio-blk device whose request times out, or that asks for a reset, recovers
//! (`cmdslots::recovery` has the state machine): virtio-blk has no abort, so the device
//! is reset (status 0), its features negotiated again and every virtqueue set up again
//! (the same), after which each queue fails the requests it held and serves again.
//! Run by the device's owner, the control path.

use super::{accept_features, enable_queue, reset_device, VirtioBlk, VirtioError};
use crate::transport::{common, status};
use crate::virtqueue::SplitRing;
use crate::Hal;
use cmdslots::recovery::{self, Recoverable, Recoverer, RecoveryStep, ResetError};

impl<H: Hal> Recoverable for VirtioBlk<H> {
    type Error = VirtioError;
    const NAME: &'static str = "virtio: the device";

    fn recoverer(&mut self) -> &mut Recoverer {
        &mut self.recoverer
    }

    /// No abort in virtio-blk: straight to a reset.
    fn abort(&mut self, _qid: u16, _cid: u16) -> bool {
        false
    }

    fn reset(&mut self) -> Result<(), ResetError<VirtioError>> {
        self.reset_and_remake()
    }

    fn stop_dma(&mut self) -> bool {
        self.common.hal.stop_dma()
    }

    fn queues(&self) -> usize {
        self.created.len()
    }
}

impl<H: Hal> VirtioBlk<H> {
    /// The recovery's next step, at `now` (the control path's clock, ns): resets the
    /// device once its queues are all outside their calls, or gives it up after
    /// `RecoveryConfig::max_resets` resets in a row. Cheap when nothing is asked.
    /// Blocks while it resets: at most a second for the device to read back reset.
    pub fn recover(&mut self, now: u64) -> RecoveryStep {
        recovery::recover(self, now)
    }

    /// The device is being reset.
    pub fn is_resetting(&self) -> bool {
        self.recoverer.resetting()
    }

    /// The device was given up: it serves no new disk.
    pub fn is_stopped(&self) -> bool {
        self.recoverer.failed()
    }

    /// Resets the device, negotiates the same features and sets every virtqueue up
    /// again (same sizes and memory, both rings emptied). Its DMA is stopped first
    /// (confirmed: else `Unstoppable`, nothing reset) and resumed only once the device
    /// reads back reset: a request it held can land nowhere, and a reset device holds
    /// none (QEMU's finishes, and drops, every request it started before it says so).
    /// The caller made sure no queue touches the device meanwhile.
    fn reset_and_remake(&mut self) -> Result<(), ResetError<VirtioError>> {
        let hal = self.common.hal.clone();
        if !hal.stop_dma() {
            return Err(ResetError::Unstoppable);
        }
        reset_device(&self.common)?;
        if !hal.resume_dma() {
            return Err(VirtioError::DmaNotResumed.into());
        }
        let offered = self.common.device_features();
        if offered & self.features != self.features {
            return Err(VirtioError::FeaturesChanged.into());
        }
        if !accept_features(&self.common, self.features) {
            return Err(VirtioError::FeaturesRefused.into());
        }
        for queue in &self.created {
            SplitRing::clear(&hal, queue.avail, queue.used);
            self.common.write16(common::QUEUE_SELECT, queue.index);
            enable_queue(&self.common, queue);
        }
        self.common.add_status(status::DRIVER_OK);
        Ok(())
    }
}
