// SPDX-License-Identifier: MIT OR Apache-2.0
//! The command slots the DMA block drivers (NVMe, virtio-blk) share: a fixed table,
//! allocated once.
//!
//! A request becomes one or more device commands, one slot each (a driver uses the slot
//! number as its command id). The request's first slot, its head, holds the tag, the
//! number of its commands still out and the worst status so far. A write with
//! pre-flush puts the FLUSH in the head and keeps its data commands *staged* until the
//! flush has completed: devices may reorder commands, so only completion orders them.
//! Requests a driver answers itself (refused operation, dead device) also take a slot,
//! which bounds them like everything else.
//!
//! Deadlines: each command is stamped with the driver's clock (`tick`) when it goes to
//! the device, and `tick` says when the oldest one has waited longer than the timeout.
//! The driver then has its device recovered (`recovery`: an abort, a reset); after a
//! reset `fail_all` answers every request the queue held with an error, and the queue
//! serves again. A device given up (or never to be recovered) is stopped, and its
//! queues answer every request with an error without it.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

mod deadline;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod recovery;

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use blkdev::{Completion, IoStatus, SubmitError};

pub use deadline::{
    answered_within, queue_fault, scan_interval, Overdue, HEALTH_CHECK_INTERVAL_NS,
};
pub use recovery::{Access, QueueLink, Recoverer, RecoveryConfig, RecoveryStep};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Free,
    /// Built, waiting for the pre-flush of its request.
    Staged,
    InFlight,
    /// A head whose own command is done while others of its request are not.
    Waiting,
    /// Answered without the device; reported by the next `drain_local`.
    Local,
}

pub const NO_SLOT: u16 = u16::MAX;

#[derive(Clone, Copy, Debug)]
struct Slot<P> {
    state: SlotState,
    tag: u32,
    head: u16,
    remaining: u16,
    status: IoStatus,
    next_staged: u16,
    /// The clock when the command went to the device (`launched`).
    since: u64,
    payload: P,
}

/// What a finished command meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    /// Its request still has commands out.
    Pending,
    /// Its request is complete.
    Request(Completion),
    /// The slot was not in flight: a device bug or a stale completion (logged).
    Stray,
}

/// The worse of two outcomes: an error beats "unsupported" beats success.
pub fn worse(a: IoStatus, b: IoStatus) -> IoStatus {
    match (a, b) {
        (IoStatus::Error, _) | (_, IoStatus::Error) => IoStatus::Error,
        (IoStatus::Unsupported, _) | (_, IoStatus::Unsupported) => IoStatus::Unsupported,
        _ => IoStatus::Ok,
    }
}

/// The slot table. `P` is the driver's per-command data (a prepared command, say).
pub struct Tracker<P: Copy + Default> {
    slots: Vec<Slot<P>>,
    free: Vec<u16>,
    local: VecDeque<u16>,
    in_flight: usize,
    /// The clock as of the last `tick` (commands launched now are stamped with it).
    now: u64,
    /// `tick` was called at least once (stamps before it mean nothing).
    clock_started: bool,
    /// A command was launched since the last `tick` (stamped with its time).
    launched_since_tick: bool,
    /// When `tick` next looks at the slots.
    next_scan: u64,
    /// A command finished since the last `health_check_due` (the device is alive).
    finished_since_check: bool,
    /// When the device last showed it was alive, or had its status read (None: never
    /// asked yet; the first `health_check_due` starts the clock).
    last_sign_of_life: Option<u64>,
}

impl<P: Copy + Default> Tracker<P> {
    pub fn new(capacity: u16) -> Self {
        let empty = Slot {
            state: SlotState::Free,
            tag: 0,
            head: NO_SLOT,
            remaining: 0,
            status: IoStatus::Ok,
            next_staged: NO_SLOT,
            since: 0,
            payload: P::default(),
        };
        Tracker {
            slots: alloc::vec![empty; usize::from(capacity.min(NO_SLOT - 1))],
            free: (0..capacity.min(NO_SLOT - 1)).rev().collect(),
            local: VecDeque::with_capacity(usize::from(capacity)),
            in_flight: 0,
            now: 0,
            clock_started: false,
            launched_since_tick: false,
            next_scan: 0,
            finished_since_check: false,
            last_sign_of_life: None,
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Commands handed to the device and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn state(&self, slot: u16) -> Option<SlotState> {
        self.slots.get(usize::from(slot)).map(|s| s.state)
    }

    pub fn payload(&self, slot: u16) -> &P {
        &self.slots[usize::from(slot)].payload
    }

    pub fn payload_mut(&mut self, slot: u16) -> &mut P {
        &mut self.slots[usize::from(slot)].payload
    }

    fn take(&mut self, head: Option<u16>) -> u16 {
        let slot = self
            .free
            .pop()
            .expect("callers check free_slots before taking");
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::Staged;
        s.head = head.unwrap_or(slot);
        s.remaining = 0;
        s.status = IoStatus::Ok;
        s.next_staged = NO_SLOT;
        s.payload = P::default();
        slot
    }

    /// Starts a request of `commands` commands (the caller checked `free_slots`); the
    /// head slot returned is the first command's.
    pub fn begin(&mut self, tag: u32, commands: u16) -> u16 {
        let head = self.take(None);
        let s = &mut self.slots[usize::from(head)];
        s.tag = tag;
        s.remaining = commands;
        head
    }

    /// Another command slot for the request headed by `head`.
    pub fn add(&mut self, head: u16) -> u16 {
        self.take(Some(head))
    }

    /// Keeps `slot` back until `after` (the head's pre-flush, or the previous staged
    /// command) completes.
    pub fn stage_after(&mut self, after: u16, slot: u16) {
        self.slots[usize::from(slot)].state = SlotState::Staged;
        self.slots[usize::from(after)].next_staged = slot;
    }

    /// The command in `slot` is now with the device (stamped with the clock of the last
    /// `tick`).
    pub fn launched(&mut self, slot: u16) {
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::InFlight;
        s.since = self.now;
        self.in_flight += 1;
        self.launched_since_tick = true;
    }

    fn release(&mut self, slot: u16) {
        self.slots[usize::from(slot)].state = SlotState::Free;
        self.free.push(slot);
    }

    /// Answers a request without the device; refused when no slot is free.
    pub fn complete_locally(&mut self, tag: u32, status: IoStatus) -> Result<(), SubmitError> {
        if self.free.is_empty() {
            return Err(SubmitError::QueueFull);
        }
        let slot = self.take(None);
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::Local;
        s.tag = tag;
        s.status = status;
        self.local.push_back(slot);
        Ok(())
    }

    /// Reports the locally answered requests.
    pub fn drain_local(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        let mut reported = 0;
        while let Some(slot) = self.local.pop_front() {
            let s = self.slots[usize::from(slot)];
            sink(Completion {
                tag: s.tag,
                status: s.status,
            });
            self.release(slot);
            reported += 1;
        }
        reported
    }

    /// Accounts the command in `slot` finishing with `outcome`. When it was a pre-flush,
    /// its staged commands go to `launch` on success (the driver hands them to the
    /// device and must call `launched`), or fail unstarted otherwise.
    pub fn finish(
        &mut self,
        slot: u16,
        outcome: IoStatus,
        launch: &mut dyn FnMut(&mut Self, u16),
    ) -> Finished {
        let Some(s) = self.slots.get(usize::from(slot)).copied() else {
            return Finished::Stray;
        };
        if s.state != SlotState::InFlight {
            return Finished::Stray;
        }
        self.in_flight -= 1;
        self.finished_since_check = true;
        let head = s.head;
        let mut finished = 1;
        if slot == head && s.next_staged != NO_SLOT {
            let mut next = s.next_staged;
            self.slots[usize::from(head)].next_staged = NO_SLOT;
            while next != NO_SLOT {
                let following = self.slots[usize::from(next)].next_staged;
                if outcome == IoStatus::Ok {
                    launch(self, next);
                } else {
                    self.release(next);
                    finished += 1;
                }
                next = following;
            }
        }
        let h = &mut self.slots[usize::from(head)];
        h.status = worse(h.status, outcome);
        h.remaining -= finished;
        if slot == head {
            h.state = SlotState::Waiting;
        } else {
            self.release(slot);
        }
        let h = self.slots[usize::from(head)];
        if h.remaining > 0 {
            return Finished::Pending;
        }
        self.release(head);
        Finished::Request(Completion {
            tag: h.tag,
            status: h.status,
        })
    }

    /// Fails every request with commands out or staged: each is answered `Error` by the
    /// next `drain_local`, and every slot it held is free again. Only once the device
    /// can no longer touch what they named (its DMA stopped, or it is known to have
    /// dropped them): a freed slot is reused. Returns how many requests failed.
    pub fn fail_all(&mut self) -> usize {
        let mut failed = 0;
        for index in 0..self.slots.len() {
            let s = &mut self.slots[index];
            if !matches!(
                s.state,
                SlotState::InFlight | SlotState::Waiting | SlotState::Staged
            ) {
                continue;
            }
            if s.head == index as u16 {
                s.state = SlotState::Local;
                s.status = IoStatus::Error;
                self.local.push_back(index as u16);
                failed += 1;
            } else {
                self.release(index as u16);
            }
        }
        self.in_flight = 0;
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn launch_all(t: &mut Tracker<u8>, slot: u16) {
        t.launched(slot);
    }

    #[test]
    fn a_split_request_completes_after_its_last_command_with_the_worst_status() {
        let mut t: Tracker<u8> = Tracker::new(4);
        let head = t.begin(7, 3);
        let second = t.add(head);
        let third = t.add(head);
        for s in [head, second, third] {
            t.launched(s);
        }
        assert_eq!(t.free_slots(), 1);
        assert_eq!(
            t.finish(second, IoStatus::Ok, &mut launch_all),
            Finished::Pending
        );
        assert_eq!(
            t.finish(head, IoStatus::Error, &mut launch_all),
            Finished::Pending
        );
        assert_eq!(t.state(head), Some(SlotState::Waiting));
        assert_eq!(
            t.finish(head, IoStatus::Ok, &mut launch_all),
            Finished::Stray
        );
        assert_eq!(
            t.finish(third, IoStatus::Unsupported, &mut launch_all),
            Finished::Request(Completion {
                tag: 7,
                status: IoStatus::Error
            })
        );
        assert_eq!(t.free_slots(), 4);
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.finish(99, IoStatus::Ok, &mut launch_all), Finished::Stray);
    }

    #[test]
    fn staged_commands_launch_after_the_flush_or_fail_with_it() {
        let mut t: Tracker<u8> = Tracker::new(8);
        let head = t.begin(1, 3);
        let a = t.add(head);
        t.stage_after(head, a);
        let b = t.add(head);
        t.stage_after(a, b);
        t.launched(head);
        let mut launched = Vec::new();
        let r = t.finish(head, IoStatus::Ok, &mut |t, s| {
            launched.push(s);
            t.launched(s);
        });
        assert_eq!(r, Finished::Pending);
        assert_eq!(launched, [a, b]);
        t.finish(b, IoStatus::Ok, &mut launch_all);
        assert!(matches!(
            t.finish(a, IoStatus::Ok, &mut launch_all),
            Finished::Request(Completion {
                tag: 1,
                status: IoStatus::Ok
            })
        ));

        let head = t.begin(2, 3);
        let a = t.add(head);
        t.stage_after(head, a);
        let b = t.add(head);
        t.stage_after(a, b);
        t.launched(head);
        let r = t.finish(head, IoStatus::Unsupported, &mut |_, _| panic!("launched"));
        assert_eq!(
            r,
            Finished::Request(Completion {
                tag: 2,
                status: IoStatus::Unsupported
            })
        );
        assert_eq!(t.free_slots(), 8);
    }

    #[test]
    fn local_answers_and_failing_everything() {
        let mut t: Tracker<u8> = Tracker::new(3);
        t.complete_locally(5, IoStatus::Unsupported).unwrap();
        let head = t.begin(6, 2);
        let other = t.add(head);
        t.launched(head);
        t.stage_after(head, other);
        assert_eq!(
            t.complete_locally(8, IoStatus::Ok),
            Err(SubmitError::QueueFull)
        );
        let mut seen = Vec::new();
        assert_eq!(t.drain_local(&mut |c| seen.push(c)), 1);
        assert_eq!(t.fail_all(), 1);
        // Failed, not yet reported: no slot is free before the report.
        assert_eq!(t.free_slots(), 2);
        assert_eq!(t.drain_local(&mut |c| seen.push(c)), 1);
        assert_eq!(
            seen,
            [
                Completion {
                    tag: 5,
                    status: IoStatus::Unsupported
                },
                Completion {
                    tag: 6,
                    status: IoStatus::Error
                }
            ]
        );
        assert_eq!(t.free_slots(), 3);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn failed_requests_keep_their_slots_until_reported() {
        let mut t: Tracker<u8> = Tracker::new(4);
        let head = t.begin(9, 2);
        let second = t.add(head);
        t.launched(head);
        t.launched(second);
        assert_eq!(t.fail_all(), 1);
        assert_eq!(t.in_flight(), 0);
        // A late completion of either command is stray: nothing is reported twice.
        assert_eq!(
            t.finish(second, IoStatus::Ok, &mut launch_all),
            Finished::Stray
        );
        assert_eq!(
            t.finish(head, IoStatus::Ok, &mut launch_all),
            Finished::Stray
        );
        let mut seen = Vec::new();
        t.drain_local(&mut |c| seen.push(c));
        assert_eq!(
            seen,
            [Completion {
                tag: 9,
                status: IoStatus::Error
            }]
        );
        assert_eq!(t.free_slots(), 4);
    }
}
