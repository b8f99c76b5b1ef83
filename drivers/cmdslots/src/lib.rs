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
//! The driver then stops its device and `fail_all` answers every request it holds with
//! an error; such a queue never hands a slot to its device again.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

#[cfg(any(test, feature = "fake"))]
pub mod fake;

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use blkdev::{Completion, DeviceFault, Dma, FaultKind, IoStatus, SubmitError};

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

/// A command the device has held longer than the timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overdue {
    pub slot: u16,
    /// How long it has been with the device, ns.
    pub waited_ns: u64,
}

/// How often `Tracker::tick` looks for overdue commands: an eighth of the timeout, at
/// least every second and at most every millisecond. A command is given up between
/// `timeout` and `timeout + scan_interval(timeout)` after it went to the device.
pub fn scan_interval(timeout_ns: u64) -> u64 {
    (timeout_ns / 8).clamp(1_000_000, 1_000_000_000)
}

/// How long commands may be in flight with none finishing before the driver reads its
/// device's status (`Tracker::health_check_due`), and then how often.
pub const HEALTH_CHECK_INTERVAL_NS: u64 = 10_000_000;

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

/// A DMA driver queue's `BlockDevice::fault`: its own (`own`), or its device's, stopped
/// by another queue (`device_stopped`: what `Dma::dma_stopped` says).
pub fn queue_fault(own: Option<DeviceFault>, device_stopped: Option<bool>) -> Option<DeviceFault> {
    own.or_else(|| {
        device_stopped.map(|dma_stopped| DeviceFault {
            kind: FaultKind::Stopped,
            dma_stopped,
        })
    })
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

    /// The driver's clock (ns, monotonic). Returns the oldest command in flight if it
    /// has been with the device longer than `timeout_ns` (0: no deadline). Looks at the
    /// slots at most every `scan_interval(timeout_ns)`, otherwise costs a comparison.
    /// Commands launched before the first tick count from it, and so do those launched
    /// after a quiet spell longer than a scan interval without a tick (a queue parked
    /// idle, then given work before its next tick): their stamp is that old tick's.
    pub fn tick(&mut self, now: u64, timeout_ns: u64) -> Option<Overdue> {
        let stale = self.now;
        if !self.clock_started {
            self.clock_started = true;
            for s in &mut self.slots {
                s.since = now;
            }
        } else if self.launched_since_tick && now.saturating_sub(stale) > scan_interval(timeout_ns)
        {
            for s in &mut self.slots {
                if s.state == SlotState::InFlight && s.since == stale {
                    s.since = now;
                }
            }
        }
        self.launched_since_tick = false;
        self.now = now;
        if timeout_ns == 0 || self.in_flight == 0 || now < self.next_scan {
            return None;
        }
        self.next_scan = now.saturating_add(scan_interval(timeout_ns));
        let (slot, oldest) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SlotState::InFlight)
            .min_by_key(|(_, s)| s.since)?;
        let waited_ns = now.saturating_sub(oldest.since);
        (waited_ns > timeout_ns).then_some(Overdue {
            slot: slot as u16,
            waited_ns,
        })
    }

    /// Whether the driver should read its device's status register now (a fatal or
    /// needs-reset bit): commands have been in flight for `HEALTH_CHECK_INTERVAL_NS`
    /// without one finishing, and no status was read in that time. Timed, not counted
    /// in polls: a register read is a VM exit under Xen's HVM, and a poll count makes
    /// their rate follow the poller's speed (and a control-path read's register count
    /// follow the machine's load).
    pub fn health_check_due(&mut self, now: u64) -> bool {
        let finished = core::mem::take(&mut self.finished_since_check);
        let quiet_since = match self.last_sign_of_life {
            Some(last) if self.in_flight > 0 && !finished => last,
            _ => {
                self.last_sign_of_life = Some(now);
                return false;
            }
        };
        if now.saturating_sub(quiet_since) < HEALTH_CHECK_INTERVAL_NS {
            return false;
        }
        self.last_sign_of_life = Some(now);
        true
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

    /// A DMA driver's `BlockDevice::tick`: why its queue must fail now, if it must.
    /// Nothing if it has failed already (`own`, its fault); else its device was stopped
    /// by another queue (`device`'s `Dma::dma_stopped` says so), or a command has been
    /// with it longer than `timeout_ns` (logged).
    pub fn due(
        &mut self,
        own: Option<DeviceFault>,
        now: u64,
        timeout_ns: u64,
        device: &impl Dma,
    ) -> Option<FaultKind> {
        if own.is_some() {
            return None;
        }
        if device.dma_stopped().is_some() {
            return Some(FaultKind::Stopped);
        }
        let overdue = self.tick(now, timeout_ns)?;
        let waited_ms = overdue.waited_ns / 1_000_000;
        log::error!(
            "command slot {} got no completion in {waited_ms} ms",
            overdue.slot
        );
        Some(FaultKind::Timeout { waited_ms })
    }

    /// Fails the queue for `kind`: `stop_dma` first (the device's DMA off: what it holds
    /// can no longer land anywhere), then every request outstanding (`fail_all`).
    /// Returns the fault and how many requests failed.
    pub fn fail_queue(
        &mut self,
        kind: FaultKind,
        stop_dma: impl FnOnce() -> bool,
    ) -> (DeviceFault, usize) {
        let dma_stopped = stop_dma();
        let failed = self.fail_all();
        (DeviceFault { kind, dma_stopped }, failed)
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

    fn launch_all(t: &mut Tracker<u8>, slot: u16) {
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
    fn a_command_is_overdue_only_past_its_deadline() {
        const MS: u64 = 1_000_000;
        let mut t: Tracker<u8> = Tracker::new(4);
        // Launched before the clock started: counts from the first tick.
        let early = t.begin(1, 1);
        t.launched(early);
        assert_eq!(t.tick(1_000 * MS, 100 * MS), None);
        let late = t.begin(2, 1);
        assert_eq!(t.tick(1_050 * MS, 100 * MS), None);
        t.launched(late);
        assert_eq!(t.tick(1_055 * MS, 100 * MS), None);
        // Exactly at the deadline is not past it (the scan interval is 12.5 ms).
        assert_eq!(t.tick(1_100 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(1_113 * MS, 100 * MS),
            Some(Overdue {
                slot: early,
                waited_ns: 113 * MS
            })
        );
        // Between scans nothing is looked at.
        assert_eq!(t.tick(1_114 * MS, 100 * MS), None);
        // The early one done, the later one is judged on its own stamp.
        assert!(matches!(
            t.finish(early, IoStatus::Ok, &mut launch_all),
            Finished::Request(_)
        ));
        assert_eq!(t.tick(1_140 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(1_151 * MS, 100 * MS),
            None,
            "the next scan is due at 1152.5 ms"
        );
        assert_eq!(
            t.tick(1_153 * MS, 100 * MS),
            Some(Overdue {
                slot: late,
                waited_ns: 103 * MS
            })
        );
        // No deadline, or nothing in flight: nothing is ever overdue.
        assert_eq!(t.tick(9_000 * MS, 0), None);
        t.fail_all();
        assert_eq!(t.tick(10_000 * MS, 100 * MS), None);
    }

    #[test]
    fn a_command_launched_after_a_quiet_spell_counts_from_the_next_tick() {
        const MS: u64 = 1_000_000;
        let mut t: Tracker<u8> = Tracker::new(4);
        let busy = t.begin(1, 1);
        t.launched(busy);
        assert_eq!(t.tick(0, 100 * MS), None);
        assert!(matches!(
            t.finish(busy, IoStatus::Ok, &mut launch_all),
            Finished::Request(_)
        ));
        // Parked for an hour without ticks, then given a command before the next tick.
        let fresh = t.begin(2, 1);
        t.launched(fresh);
        let hour = 3_600_000 * MS;
        assert_eq!(t.tick(hour, 100 * MS), None, "not an hour old");
        assert_eq!(t.tick(hour + 100 * MS, 100 * MS), None);
        assert_eq!(
            t.tick(hour + 113 * MS, 100 * MS),
            Some(Overdue {
                slot: fresh,
                waited_ns: 113 * MS
            })
        );
    }

    #[test]
    fn the_status_is_read_only_after_a_quiet_interval_with_commands_out() {
        const MS: u64 = 1_000_000;
        let interval = HEALTH_CHECK_INTERVAL_NS;
        let mut t: Tracker<u8> = Tracker::new(4);
        // Nothing in flight: never, however long.
        assert!(!t.health_check_due(0));
        assert!(!t.health_check_due(interval * 10));
        let first = t.begin(1, 1);
        t.launched(first);
        let second = t.begin(2, 1);
        t.launched(second);
        let start = interval * 10;
        assert!(!t.health_check_due(start + interval - 1));
        // A command finished: the device is alive, and the quiet interval starts again.
        t.finish(first, IoStatus::Ok, &mut launch_all);
        assert!(!t.health_check_due(start + interval + MS));
        assert!(!t.health_check_due(start + 2 * interval));
        assert!(t.health_check_due(start + 2 * interval + MS));
        // Then once per interval, not at every call.
        assert!(!t.health_check_due(start + 2 * interval + 2 * MS));
        assert!(t.health_check_due(start + 3 * interval + MS));
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
