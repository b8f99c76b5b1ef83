// SPDX-License-Identifier: MIT OR Apache-2.0
//! A controller whose command times out recovers (`cmdslots::recovery` has the state
//! machine; this is what it asks of an NVMe controller): an Abort for the overdue
//! command, and if that does not bring it back, a controller reset (CC.EN = 0, the
//! admin queue and every I/O queue pair made again, the same) after which each queue
//! fails the commands it held and serves again. Run by the controller's owner, the
//! control path, which also owns the admin queue.

use super::{reg, wait_ready, write_u64, Controller, NvmeError};
use crate::command::{Opcode, SubmissionEntry};
use crate::Hal;
use cmdslots::recovery::{self, Recoverable, Recoverer, RecoveryStep, ResetError};

/// How long the Abort command itself may take: it asks nothing of the medium.
const ABORT_TIMEOUT_MS: u64 = 1_000;

impl<H: Hal> Recoverable for Controller<H> {
    type Error = NvmeError;
    const NAME: &'static str = "nvme: the controller";

    fn recoverer(&mut self) -> &mut Recoverer {
        &mut self.recoverer
    }

    fn abort(&mut self, qid: u16, cid: u16) -> bool {
        self.send_abort(qid, cid)
    }

    fn reset(&mut self) -> Result<(), ResetError<NvmeError>> {
        self.reset_and_remake()
    }

    fn stop_dma(&mut self) -> bool {
        self.hal.stop_dma()
    }

    fn queues(&self) -> usize {
        self.created.len()
    }
}

impl<H: Hal> Controller<H> {
    /// The recovery's next step, at `now` (the control path's clock, ns): sends the
    /// Abort a queue asked for, resets the controller once its queues are all outside
    /// their calls, or gives it up after `RecoveryConfig::max_resets` resets in a row.
    /// Cheap when nothing is asked. Blocks while it resets: at most the controller's
    /// ready timeout (CAP.TO) twice and two admin commands per queue.
    pub fn recover(&mut self, now: u64) -> RecoveryStep {
        recovery::recover(self, now)
    }

    /// The controller is being reset.
    pub fn is_resetting(&self) -> bool {
        self.recoverer.resetting()
    }

    /// Sends an Abort for command `cid` of submission queue `qid`: true when the
    /// controller says it aborted it (the command then completes with an abort status
    /// on its queue). Not aborted, failed, or no answer in `ABORT_TIMEOUT_MS`: false.
    fn send_abort(&mut self, qid: u16, cid: u16) -> bool {
        let entry = SubmissionEntry::new(Opcode::Abort as u8, 0, 0)
            .with_cdw(10, u32::from(qid) | (u32::from(cid) << 16));
        match self.admin_command_within(entry, ABORT_TIMEOUT_MS) {
            // Dword 0 bit 0 clear: the command was aborted.
            Ok(completion) if completion.result & 1 == 0 => {
                log::warn!("nvme: q{qid} command {cid} aborted");
                true
            }
            Ok(_) => {
                log::warn!("nvme: q{qid} command {cid} not aborted");
                false
            }
            Err(e) => {
                log::warn!("nvme: abort of q{qid} command {cid}: {e}");
                false
            }
        }
    }

    /// Resets the controller and makes its admin queue and every I/O queue pair again
    /// (same ids, sizes and memory). Its DMA is stopped first (confirmed: else
    /// `Unstoppable`, nothing reset) and resumed only once the controller is disabled:
    /// a command it held can land nowhere, and after CC.EN = 0 it holds none (QEMU's
    /// controller finishes, and drops, every request it started before it says idle).
    /// The caller made sure no queue touches the controller meanwhile.
    fn reset_and_remake(&mut self) -> Result<(), ResetError<NvmeError>> {
        if !self.hal.stop_dma() {
            return Err(ResetError::Unstoppable);
        }
        let cc = self.hal.read_register(reg::CC);
        self.hal.write_register(reg::CC, cc & !reg::CC_ENABLE);
        wait_ready(&self.hal, false, self.ready_timeout_ms)?;
        if !self.hal.resume_dma() {
            return Err(NvmeError::DmaNotResumed.into());
        }
        let admin = &mut self.admin;
        self.hal.zero_dma(admin.sq);
        self.hal.zero_dma(admin.cq);
        admin.tail = 0;
        admin.head = 0;
        admin.phase = true;
        let size = u32::from(admin.entries - 1);
        self.hal.write_register(reg::INTMS, u32::MAX);
        self.hal.write_register(reg::AQA, (size << 16) | size);
        write_u64(&self.hal, reg::ASQ, admin.sq.address());
        write_u64(&self.hal, reg::ACQ, admin.cq.address());
        self.hal.write_register(
            reg::CC,
            reg::CC_ENABLE | reg::CC_IOSQES_64 | reg::CC_IOCQES_16,
        );
        wait_ready(&self.hal, true, self.ready_timeout_ms)?;
        let made = self.created.len() as u16;
        if made > 0 {
            let granted = self.io_queues_granted;
            let now_granted = self.request_io_queues(granted)?;
            if now_granted < made {
                return Err(NvmeError::FewerQueues {
                    granted: now_granted,
                    made,
                }
                .into());
            }
        }
        for queue in self.created.clone() {
            self.hal.zero_dma(queue.sq);
            self.hal.zero_dma(queue.cq);
            self.create_pair(queue.qid, queue.entries, queue.sq, queue.cq)?;
        }
        Ok(())
    }
}
