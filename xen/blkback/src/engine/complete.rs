// SPDX-License-Identifier: MIT OR Apache-2.0
//! Completion: collect what the device finished, give back grants, answer requests, and
//! publish the responses (after the unmaps queued before them) with a notification when
//! the frontend asked for one.

use blkdev::{BlockDevice, Completion, IoStatus};

use super::notify::{Outlook, Release, Why};
use super::slots::Slot;
use super::{worth_logging, Engine, EngineState, EventChannel};
use crate::abi;
use crate::grant::GrantOps;
use crate::parse::RequestError;
use crate::ring::{Response, RingMemory};

fn status_code(status: IoStatus) -> i16 {
    match status {
        IoStatus::Ok => abi::RSP_OKAY,
        IoStatus::Error => abi::RSP_ERROR,
        IoStatus::Unsupported => abi::RSP_EOPNOTSUPP,
    }
}

impl<M: RingMemory, G: GrantOps, D: BlockDevice, E: EventChannel> Engine<M, G, D, E> {
    /// Give back a slot's grants: cached ones are unpinned, transient ones queued for
    /// the unmap batch.
    #[cfg_attr(feature = "profile-passes", inline(never))]
    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    fn release_grants(&mut self, slot: u16) {
        let segments = self.slots.segments(slot);
        self.mapper
            .reserve_unmaps(segments.len(), &mut self.grants, &mut self.stats);
        self.mapper.release(segments);
        self.slots[slot].nr_segments = 0;
    }

    /// Answer a slot and free it. The response becomes visible at the next publish,
    /// after the unmaps queued before it.
    #[cfg_attr(feature = "profile-passes", inline(never))]
    #[cfg_attr(not(feature = "profile-passes"), inline(always))]
    fn respond(&mut self, slot: u16, status: i16) {
        let Slot {
            id, response_op, ..
        } = self.slots[slot];
        if status != abi::RSP_OKAY {
            self.stats.errors += 1;
        }
        self.ring.put_response(Response {
            id,
            operation: response_op,
            status,
        });
        self.slots.free(slot);
    }

    /// A request that holds a slot (and maybe grants) failed before reaching the device.
    pub(super) fn fail(&mut self, slot: u16, error: RequestError) {
        if worth_logging(self.stats.errors + 1) {
            let Slot {
                id, response_op, ..
            } = self.slots[slot];
            log::warn!(
                "blkback: request id {:#x} op {} failed: {:?}",
                id,
                response_op,
                error
            );
        }
        self.release_grants(slot);
        self.respond(slot, error.status());
    }

    /// Collect what the device finished and answer it. Each completion is checked as
    /// the device reports it: only one naming a slot the device owns is kept, and that
    /// slot is marked returned at once, so at most one completion per slot is kept and
    /// `completions` (one entry per slot) always has room. A device that reports more
    /// (unknown tags, repeats) cannot push a real completion out.
    #[cfg_attr(feature = "profile-passes", inline(never))]
    pub(super) fn reap_completions(&mut self) -> usize {
        self.completions.clear();
        let completions = &mut self.completions;
        let slots = &mut self.slots;
        self.device.poll_completions(&mut |completion| {
            if !slots.is_submitted(completion.tag) {
                log::error!("blkback: device completed unknown tag {}", completion.tag);
                return;
            }
            slots[completion.tag as u16].submitted = false;
            debug_assert!(completions.len() < completions.capacity());
            completions.push(completion);
        });
        let finished = self.completions.len();
        for n in 0..finished {
            let Completion { tag, status } = self.completions[n];
            let slot = tag as u16;
            self.submission.in_flight -= 1;
            if status == IoStatus::Error {
                self.stats.device_errors += 1;
            }
            self.release_grants(slot);
            self.respond(slot, status_code(status));
        }
        finished
    }

    /// Unmap first, then make the responses visible, then notify if asked to (or hold
    /// the notification, or release a held one: `notify`).
    #[cfg_attr(feature = "profile-passes", inline(never))]
    pub(super) fn publish_responses(&mut self) -> bool {
        self.mapper.flush_unmaps(&mut self.grants, &mut self.stats);
        let published = self.ring.publish_responses();
        let rsp_prod = self.ring.rsp_prod();
        if let Some(old) = published {
            self.stats.responses += u64::from(rsp_prod.wrapping_sub(old));
        }
        if !self.moderator.enabled() {
            return published.is_some_and(|old| self.ring.notify_wanted_since(old))
                && self.send_notification();
        }
        if self.moderator.holding() {
            return match self.moderator.release(rsp_prod, self.outlook()) {
                Release::No => false,
                Release::Yes { since, wasted, why } => self.end_hold(since, wasted, why),
            };
        }
        self.moderator.observe(published.map(|_| rsp_prod));
        let Some(old) = published else {
            return false;
        };
        if !self.ring.notify_wanted_since(old) {
            return false;
        }
        if self.state == EngineState::Running {
            match self.moderator.hold(old, rsp_prod, self.outlook()) {
                Some(true) => {
                    self.stats.notifications_held += 1;
                    return false;
                }
                Some(false) => self.stats.notify_holds_declined += 1,
                None => {}
            }
        }
        self.send_notification()
    }

    /// Send a held notification now if the frontend still wants it (teardown).
    pub(super) fn release_held_notification(&mut self) {
        if let Some(since) = self.moderator.release_now() {
            if self.ring.notify_wanted_since(since) {
                self.send_notification();
            }
        }
    }

    /// The poller is about to block: a held notification goes out now, so no hold ever
    /// depends on the poller's timer.
    pub(super) fn release_before_sleep(&mut self) {
        let outstanding = self.ring.frontend_outstanding(self.ring.req_prod());
        if let Some(Release::Yes { since, wasted, why }) = self
            .moderator
            .release_idle(self.ring.rsp_prod(), outstanding)
        {
            self.end_hold(since, wasted, why);
        }
    }

    /// A hold ended (`Release::Yes`): count it, and send the event if the frontend
    /// still wants one for what was published since `since`. True if sent.
    fn end_hold(&mut self, since: u32, wasted: bool, why: Why) -> bool {
        self.stats.notify_holds_wasted += u64::from(wasted);
        *match why {
            Why::Deadline => &mut self.stats.notify_holds_deadline,
            Why::Drained => &mut self.stats.notify_holds_drained,
            Why::Quiet => &mut self.stats.notify_holds_quiet,
            Why::Depth => &mut self.stats.notify_holds_depth,
            Why::Sleep => &mut self.stats.notify_holds_sleep,
        } += 1;
        self.ring.notify_wanted_since(since) && self.send_notification()
    }

    pub(super) fn send_notification(&mut self) -> bool {
        self.events.notify();
        self.stats.notifications += 1;
        true
    }

    /// What the moderator weighs: more of this ring's requests on their way to an
    /// answer (on the device, waiting for it, or in the ring while it is served), and
    /// how many requests the frontend has outstanding (all its ring's worth?).
    fn outlook(&self) -> Outlook {
        let req_prod = self.ring.req_prod();
        let waiting = self.state == EngineState::Running && self.ring.unconsumed(req_prod) > 0;
        let outstanding = self.ring.frontend_outstanding(req_prod);
        Outlook {
            busy: self.submission.in_flight > 0 || !self.submission.deferred.is_empty() || waiting,
            outstanding,
            full: outstanding >= self.ring.slots(),
        }
    }
}
