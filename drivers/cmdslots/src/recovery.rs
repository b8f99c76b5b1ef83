// SPDX-License-Identifier: MIT OR Apache-2.0
//! A device that holds a command past its deadline, or reports a fatal status, is
//! recovered rather than given up: what its queues (on the pollers) and its control
//! path (the owner of the device: NVMe's admin queue, virtio's common configuration)
//! share, and the control path's side of the state machine.
//!
//! ```text
//!   Healthy --(overdue, NVMe)--> abort asked --(aborted: its command completes)--> Healthy
//!      |                            |  (not aborted, no answer, command still out)
//!      |  (overdue on virtio,       v
//!      |   fatal status)  ------> Resetting --(device reset, queues made again)--> Healthy
//!      |                            |  (the device completed nothing after
//!      |                            v   `max_resets` resets in a row)
//!      |                          Failed: every request fails, as a device given up
//! ```
//!
//! - **Queues** ([`QueueLink`]) look at the device's phase when a call may touch the
//!   device ([`QueueLink::enter`]). Healthy: they serve. Resetting: they touch nothing
//!   (no doorbell, no look at the completion queue), take no request (`QueueFull`: the
//!   engine keeps it, and the requests behind it stay in the guest's ring) and keep
//!   what they hold. Healthy again, a generation later: the commands they held were
//!   lost with the reset; they fail them (`Tracker::fail_all`, answered `Error`) and
//!   start their rings afresh. Failed: they fail as a device given up does.
//! - **The control path** ([`Recoverer`]) sends the abort (NVMe), and resets: it marks
//!   the device Resetting, waits until no queue is inside a call that touches the device
//!   (each queue's [`Gate`], a flag of its own), and only then stops the device's DMA,
//!   resets it and makes its queues again. A queue sets its gate and then reads the
//!   phase; the control path sets the phase and then reads the gates (both sequentially
//!   consistent): either the queue sees Resetting, or the control path sees it busy.
//! - **Counting.** A reset after which the device completed nothing before it needed
//!   another counts in a row; after `max_resets` of them (`device.max-resets=`) the
//!   device is given up. `max_resets` 0: no recovery at all, a queue fails at once as
//!   it always did (`Tracker::fail_queue`).

use alloc::sync::Arc;
use alloc::vec::Vec;
use blkdev::{DeviceFault, FaultKind};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Resets in a row a device gets before it is given up (`device.max-resets=`).
pub const DEFAULT_MAX_RESETS: u32 = 3;
/// The most `device.max-resets=` takes.
pub const MAX_MAX_RESETS: u32 = 100;
/// After a reset that failed, how long before the next try.
pub const RESET_RETRY_NS: u64 = 100_000_000;
/// How long an aborted command may take to come back before the device is reset.
pub const ABORT_WAIT_NS: u64 = 1_000_000_000;
/// While a queue is inside a call at the start of a reset, how soon to look again.
const QUIESCE_POLL_NS: u64 = 100_000;

/// How a device recovers: resets in a row before it is given up (0: never reset, fail
/// at once), and a flag the queues raise when the control path has recovery work (the
/// kernel's pollers look at it, and wake the control path).
#[derive(Clone, Copy, Debug)]
pub struct RecoveryConfig {
    pub max_resets: u32,
    pub wake: Option<&'static AtomicBool>,
}

impl RecoveryConfig {
    /// `DEFAULT_MAX_RESETS`, nobody to wake.
    pub const DEFAULT: RecoveryConfig = RecoveryConfig {
        max_resets: DEFAULT_MAX_RESETS,
        wake: None,
    };
    /// No recovery: a queue with an overdue command, or a device in fatal status, fails
    /// for good at once.
    pub const NEVER: RecoveryConfig = RecoveryConfig {
        max_resets: 0,
        wake: None,
    };
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The phase, in the low bits of `Recovery::word`; the generation (resets done) above.
const HEALTHY: u64 = 0;
const RESETTING: u64 = 1;
const FAILED: u64 = 2;
const PHASE_MASK: u64 = 3;
const GENERATION_ONE: u64 = 4;

/// In `Recovery::abort`: a queue asks for an abort of `qid << 16 | cid`; `SENT`: the
/// control path sent it.
const ABORT_ASKED: u64 = 1 << 32;
const ABORT_SENT: u64 = 1 << 33;

/// In `Recovery::cause`: the fault kind (low 2 bits), `Timeout`'s wait above.
const CAUSE_FATAL: u64 = 1;
const CAUSE_TIMEOUT: u64 = 2;

fn encode(kind: FaultKind) -> u64 {
    match kind {
        FaultKind::Timeout { waited_ms } => CAUSE_TIMEOUT | (waited_ms << 2),
        FaultKind::Fatal => CAUSE_FATAL,
        // A PCIe device's recovery never sees a remote target's fault.
        FaultKind::Stopped | FaultKind::TargetGone { .. } => 0,
    }
}

fn decode(cause: u64) -> FaultKind {
    match cause & 3 {
        CAUSE_TIMEOUT => FaultKind::Timeout {
            waited_ms: cause >> 2,
        },
        CAUSE_FATAL => FaultKind::Fatal,
        _ => FaultKind::Stopped,
    }
}

/// What the queues of one device and its control path share. The queues read `word`
/// at every call that may touch the device (a line nobody writes while the device is
/// healthy); they write the rest only to ask for recovery.
struct Recovery {
    /// Phase and generation.
    word: AtomicU64,
    /// An abort asked for or sent (`ABORT_*`), or 0.
    abort: AtomicU64,
    /// A queue asks for a reset.
    reset_wanted: AtomicBool,
    /// Why the device is being recovered (its last trigger), for the fault a device
    /// given up reports.
    cause: AtomicU64,
    /// A queue saw a command completed since the last reset: the reset worked.
    served: AtomicBool,
    max_resets: u32,
    wake: Option<&'static AtomicBool>,
}

impl Recovery {
    fn wake(&self) {
        if let Some(wake) = self.wake {
            wake.store(true, Ordering::Release);
        }
    }
}

/// A queue's flag: set while it is inside a call that may touch the device. On a line
/// of its own: the queue writes it at every such call.
#[repr(align(64))]
#[derive(Default)]
pub struct Gate {
    busy: AtomicBool,
}

/// What a queue may do now ([`QueueLink::enter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Serve (then `leave`).
    Go,
    /// The device was reset since the queue last looked: what it holds was lost. Fail
    /// it, start the ring afresh, call `synced`, then serve (then `leave`).
    Resync,
    /// The device is being reset: touch nothing, take no request.
    Wait,
    /// The device was given up: fail as a queue that failed for good.
    Failed(FaultKind),
}

/// A queue's side of its device's recovery.
pub struct QueueLink {
    shared: Arc<Recovery>,
    gate: Arc<Gate>,
    /// The generation the queue's rings were made in.
    seen: u64,
    /// What this queue asked to abort (`qid << 16 | slot`), until that slot finishes.
    abort_asked: Option<u64>,
    /// Set at a resync: the first command finished after it tells the control path the
    /// reset worked.
    proving: bool,
}

impl QueueLink {
    /// The device recovers (else a queue fails for good at once, as it always did).
    #[inline]
    pub fn recovers(&self) -> bool {
        self.shared.max_resets > 0
    }

    /// At the start of a call that may touch the device. After `Go` and `Resync`, the
    /// caller calls `leave` once it touches the device no more.
    #[inline]
    pub fn enter(&mut self) -> Access {
        if !self.recovers() {
            return Access::Go;
        }
        self.gate.busy.store(true, Ordering::SeqCst);
        let word = self.shared.word.load(Ordering::SeqCst);
        let access = match word & PHASE_MASK {
            HEALTHY if word >> 2 == self.seen => return Access::Go,
            HEALTHY => return Access::Resync,
            RESETTING => Access::Wait,
            _ => Access::Failed(decode(self.shared.cause.load(Ordering::Acquire))),
        };
        self.gate.busy.store(false, Ordering::Release);
        access
    }

    /// The end of a call `enter` let through.
    #[inline]
    pub fn leave(&self) {
        if self.recovers() {
            self.gate.busy.store(false, Ordering::Release);
        }
    }

    /// After `Resync`: the queue failed what it held and started its ring afresh.
    pub fn synced(&mut self) {
        self.seen = self.shared.word.load(Ordering::Acquire) >> 2;
        self.abort_asked = None;
        self.proving = true;
    }

    /// The command in `slot` has been with the device longer than its deadline: asks
    /// the control path to abort it (command id `slot` of submission queue `qid`).
    /// True when asked now (false: this queue or another already has an abort out; the
    /// deadline scan finds the command again).
    pub fn ask_abort(&mut self, qid: u16, slot: u16, waited_ms: u64) -> bool {
        if self.abort_asked.is_some() {
            return false;
        }
        let command = (u64::from(qid) << 16) | u64::from(slot);
        let asked = ABORT_ASKED | command;
        if self
            .shared
            .abort
            .compare_exchange(0, asked, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.shared
            .cause
            .store(encode(FaultKind::Timeout { waited_ms }), Ordering::Release);
        self.abort_asked = Some(command);
        self.shared.wake();
        true
    }

    /// Asks the control path for a reset (`kind`: why). True when it was not asked yet.
    pub fn ask_reset(&mut self, kind: FaultKind) -> bool {
        self.shared.cause.store(encode(kind), Ordering::Release);
        let first = !self.shared.reset_wanted.swap(true, Ordering::AcqRel);
        self.shared.wake();
        first
    }

    /// The command in `slot` finished (whatever its status): the device answers.
    #[inline]
    pub fn finished(&mut self, slot: u16) {
        if self.proving {
            self.proving = false;
            self.shared.served.store(true, Ordering::Release);
        }
        let Some(command) = self.abort_asked else {
            return;
        };
        if command & 0xffff == u64::from(slot) {
            self.abort_asked = None;
            // Whether the control path sent the abort yet or not, it is settled.
            let mut current = self.shared.abort.load(Ordering::Acquire);
            while current != 0 && current & 0xffff_ffff == command {
                match self.shared.abort.compare_exchange(
                    current,
                    0,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        self.shared.wake();
                        break;
                    }
                    Err(now) => current = now,
                }
            }
        }
    }

    /// The device was given up (`dma_stopped`: what stopping it said): the fault every
    /// queue of it reports, even one that has not looked since.
    pub fn failed(&self, dma_stopped: Option<bool>) -> Option<DeviceFault> {
        (self.recovers() && self.shared.word.load(Ordering::Acquire) & PHASE_MASK == FAILED).then(
            || DeviceFault {
                kind: decode(self.shared.cause.load(Ordering::Acquire)),
                dma_stopped: dma_stopped.unwrap_or(false),
            },
        )
    }

    /// The device is being reset now.
    pub fn resetting(&self) -> bool {
        self.recovers() && self.shared.word.load(Ordering::Acquire) & PHASE_MASK == RESETTING
    }
}

/// What the control path is to do for its device now ([`Recoverer::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the device is healthy (or given up).
    Idle,
    /// Call `next` again at this time (ns): an abort's command may still complete, a
    /// queue is inside a call, or a failed reset is to be tried again.
    At(u64),
    /// Send an NVMe Abort for command `cid` of submission queue `qid`, then
    /// `abort_sent`. A device without an abort command calls `abort_sent(false)`.
    Abort { qid: u16, cid: u16 },
    /// Reset the device now, then `reset_done`: its queues are all outside their calls
    /// and touch nothing until then. Its DMA is to be stopped (confirmed) before the
    /// reset and resumed after, before its queues are made again.
    Reset,
    /// Give the device up: stop its DMA, then `gave_up`.
    GiveUp,
}

/// What a driver's `recover` call did (NVMe's `Controller::recover`, virtio's
/// `VirtioBlk::recover`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryStep {
    /// Nothing to do: the device serves (or was given up before).
    Idle,
    /// Work is under way: call again at this time (ns).
    At(u64),
    /// The device was reset and serves again: its queues fail what they held at their
    /// next call.
    Reset,
    /// The device did not come back: given up (`dma_stopped`: its bus mastering is
    /// confirmed off).
    GaveUp { dma_stopped: bool },
}

/// The control path's side of one device's recovery: made with the device, it makes
/// each queue's [`QueueLink`].
pub struct Recoverer {
    shared: Arc<Recovery>,
    gates: Vec<Arc<Gate>>,
    /// Resets since the device last completed a command.
    in_a_row: u32,
    /// Resets done, for the log.
    resets: u64,
    /// An abort sent: its command may come back until then.
    abort_deadline: Option<u64>,
    /// After a failed reset: not before then.
    retry_at: u64,
}

impl Recoverer {
    pub fn new(config: RecoveryConfig) -> Self {
        Recoverer {
            shared: Arc::new(Recovery {
                word: AtomicU64::new(HEALTHY),
                abort: AtomicU64::new(0),
                reset_wanted: AtomicBool::new(false),
                cause: AtomicU64::new(0),
                served: AtomicBool::new(false),
                max_resets: config.max_resets.min(MAX_MAX_RESETS),
                wake: config.wake,
            }),
            gates: Vec::new(),
            in_a_row: 0,
            resets: 0,
            abort_deadline: None,
            retry_at: 0,
        }
    }

    /// A new queue's link (the queue is made in the current generation).
    pub fn link(&mut self) -> QueueLink {
        let gate = Arc::new(Gate::default());
        self.gates.push(gate.clone());
        QueueLink {
            shared: self.shared.clone(),
            gate,
            seen: self.shared.word.load(Ordering::Acquire) >> 2,
            abort_asked: None,
            proving: false,
        }
    }

    pub fn max_resets(&self) -> u32 {
        self.shared.max_resets
    }

    /// Resets done so far.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Resets since the device last completed a command.
    pub fn in_a_row(&self) -> u32 {
        self.in_a_row
    }

    /// The device was given up.
    pub fn failed(&self) -> bool {
        self.shared.word.load(Ordering::Acquire) & PHASE_MASK == FAILED
    }

    /// A reset is under way (begun, or failed and to be tried again).
    pub fn resetting(&self) -> bool {
        self.shared.word.load(Ordering::Acquire) & PHASE_MASK == RESETTING
    }

    /// Why the device is being recovered (its last trigger).
    pub fn cause(&self) -> FaultKind {
        decode(self.shared.cause.load(Ordering::Acquire))
    }

    /// Marks the device Resetting (queues stop at their next call).
    fn begin_reset(&mut self) {
        let word = self.shared.word.load(Ordering::Acquire);
        self.shared
            .word
            .store((word & !PHASE_MASK) | RESETTING, Ordering::SeqCst);
    }

    /// What to do now (`now`: the control path's clock, ns).
    pub fn next(&mut self, now: u64) -> Action {
        if self.shared.max_resets == 0 || self.failed() {
            return Action::Idle;
        }
        // Looked at before it is written: the queues read `word` on the same line at
        // every call, and the control path comes here at every round.
        if self.shared.served.load(Ordering::Acquire)
            && self.shared.served.swap(false, Ordering::AcqRel)
        {
            self.in_a_row = 0;
        }
        if !self.resetting() {
            let abort = self.shared.abort.load(Ordering::Acquire);
            let abort_over = match self.abort_deadline {
                // Its command came back: the abort worked (or was not needed).
                Some(_) if abort == 0 => {
                    self.abort_deadline = None;
                    log::info!("recovery: the aborted command came back; the device serves on");
                    false
                }
                Some(deadline) => now >= deadline,
                None => false,
            };
            if !self.shared.reset_wanted.load(Ordering::Acquire) && !abort_over {
                if abort & ABORT_ASKED != 0 && abort & ABORT_SENT == 0 {
                    return Action::Abort {
                        qid: (abort >> 16) as u16,
                        cid: abort as u16,
                    };
                }
                return match self.abort_deadline {
                    Some(deadline) => Action::At(deadline),
                    None => Action::Idle,
                };
            }
            self.begin_reset();
        }
        if now < self.retry_at {
            return Action::At(self.retry_at);
        }
        // After the phase store (sequentially consistent): a queue whose flag is down
        // now sees Resetting at its next call.
        if self.gates.iter().any(|g| g.busy.load(Ordering::SeqCst)) {
            return Action::At(now.saturating_add(QUIESCE_POLL_NS));
        }
        if self.in_a_row >= self.shared.max_resets {
            return Action::GiveUp;
        }
        Action::Reset
    }

    /// The abort `next` asked for was sent: `aborted` when the device says it aborted
    /// the command (it comes back with an abort status, failing its request alone);
    /// otherwise (not aborted, no answer, no abort command) the device is reset.
    pub fn abort_sent(&mut self, now: u64, aborted: bool) {
        let asked = self.shared.abort.load(Ordering::Acquire);
        if asked & ABORT_ASKED != 0 {
            let _ = self.shared.abort.compare_exchange(
                asked,
                asked | ABORT_SENT,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        if aborted {
            self.abort_deadline = Some(now.saturating_add(ABORT_WAIT_NS));
        } else {
            self.shared.reset_wanted.store(true, Ordering::Release);
        }
    }

    /// The reset `next` asked for is over: `done` when the device is back with every
    /// queue made again (its queues then fail what they held and serve again), else it
    /// is tried again after `RESET_RETRY_NS` (or the device given up).
    pub fn reset_done(&mut self, now: u64, done: bool) {
        self.in_a_row += 1;
        self.resets += 1;
        if !done {
            self.retry_at = now.saturating_add(RESET_RETRY_NS);
            return;
        }
        self.abort_deadline = None;
        self.retry_at = 0;
        self.shared.abort.store(0, Ordering::Release);
        self.shared.reset_wanted.store(false, Ordering::Release);
        self.shared.served.store(false, Ordering::Release);
        let word = self.shared.word.load(Ordering::Acquire);
        let next = ((word & !PHASE_MASK) + GENERATION_ONE) | HEALTHY;
        self.shared.word.store(next, Ordering::SeqCst);
    }

    /// The device was given up: its DMA is stopped; every queue fails at its next call.
    pub fn gave_up(&mut self) {
        let word = self.shared.word.load(Ordering::Acquire);
        self.shared
            .word
            .store((word & !PHASE_MASK) | FAILED, Ordering::SeqCst);
        self.shared.wake();
    }
}

/// A driver queue with a [`QueueLink`]: what it does when its device's recovery says
/// so, and (provided) the look at the start of each call that may touch the device.
pub trait LinkedQueue {
    fn link(&mut self) -> &mut QueueLink;
    /// The device was reset since the queue last looked: fail what it held (lost with
    /// the reset: `Tracker::fail_all`), start its rings afresh, then `link().synced()`.
    fn resync(&mut self);
    /// The device was given up: fail as a queue that failed for good.
    fn fail(&mut self, kind: FaultKind);

    /// What the device's recovery lets the queue do now ([`QueueLink::enter`]; a resync
    /// is done here). `false`: touch nothing (the device is being reset, or was given
    /// up and the queue failed now); `true`: serve, then `link().leave()`.
    fn enter(&mut self) -> bool {
        match self.link().enter() {
            Access::Go => true,
            Access::Resync => {
                self.resync();
                true
            }
            Access::Wait => false,
            Access::Failed(kind) => {
                self.fail(kind);
                false
            }
        }
    }
}

/// Why a device's reset did not bring it back.
pub enum ResetError<E> {
    /// Its DMA could not be confirmed stopped: nothing was reset, and what it holds
    /// may still land anywhere.
    Unstoppable,
    Failed(E),
}

impl<E> From<E> for ResetError<E> {
    fn from(e: E) -> Self {
        ResetError::Failed(e)
    }
}

/// A device a driver recovers ([`recover`] runs its steps).
pub trait Recoverable {
    type Error: core::fmt::Display;
    /// The driver and device, for the log ("nvme: the controller").
    const NAME: &'static str;
    fn recoverer(&mut self) -> &mut Recoverer;
    /// Sends an abort for command `cid` of queue `qid`: true when the device says it
    /// aborted it (the command then comes back with an abort status on its queue).
    fn abort(&mut self, qid: u16, cid: u16) -> bool;
    /// Stops the device's DMA (confirmed, or `Unstoppable`), resets it, resumes its
    /// DMA and sets every queue of it up again, the same.
    fn reset(&mut self) -> Result<(), ResetError<Self::Error>>;
    /// `Dma::stop_dma`.
    fn stop_dma(&mut self) -> bool;
    /// Queues it has set up.
    fn queues(&self) -> usize;
}

/// The recovery's next step for `device` at `now` (the control path's clock, ns): sends
/// the abort a queue asked for, resets the device once its queues are all outside
/// their calls, or gives it up after `RecoveryConfig::max_resets` resets in a row.
/// Cheap when nothing is asked; blocks while it resets.
pub fn recover<D: Recoverable>(device: &mut D, now: u64) -> RecoveryStep {
    loop {
        match device.recoverer().next(now) {
            Action::Idle => return RecoveryStep::Idle,
            Action::At(at) => return RecoveryStep::At(at),
            Action::Abort { qid, cid } => {
                let aborted = device.abort(qid, cid);
                device.recoverer().abort_sent(now, aborted);
            }
            Action::Reset => {
                let recoverer = device.recoverer();
                log::error!(
                    "{}: resetting ({:?}; reset {}, {} of {} in a row)",
                    D::NAME,
                    recoverer.cause(),
                    recoverer.resets() + 1,
                    recoverer.in_a_row() + 1,
                    recoverer.max_resets()
                );
                match device.reset() {
                    Ok(()) => {
                        device.recoverer().reset_done(now, true);
                        log::error!(
                            "{}: reset; its {} queues serve again, each failing what it held",
                            D::NAME,
                            device.queues()
                        );
                        return RecoveryStep::Reset;
                    }
                    Err(ResetError::Unstoppable) => {
                        device.recoverer().gave_up();
                        log::error!("{}: not reset (bus mastering stays on): given up", D::NAME);
                        return RecoveryStep::GaveUp { dma_stopped: false };
                    }
                    Err(ResetError::Failed(e)) => {
                        log::error!("{}: the reset failed: {e}", D::NAME);
                        device.recoverer().reset_done(now, false);
                    }
                }
            }
            Action::GiveUp => {
                let dma_stopped = device.stop_dma();
                let recoverer = device.recoverer();
                recoverer.gave_up();
                log::error!(
                    "{}: did not come back after {} resets in a row: given up",
                    D::NAME,
                    recoverer.in_a_row()
                );
                return RecoveryStep::GaveUp { dma_stopped };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_reset_waits_until_no_queue_is_inside_a_call() {
        static WAKE: AtomicBool = AtomicBool::new(false);
        let mut recoverer = Recoverer::new(RecoveryConfig {
            max_resets: 1,
            wake: Some(&WAKE),
        });
        let (mut inside, mut asking) = (recoverer.link(), recoverer.link());
        assert_eq!(inside.enter(), Access::Go);
        assert!(asking.ask_reset(FaultKind::Fatal));
        assert!(WAKE.load(Ordering::Acquire), "the control path is woken");
        // A queue is inside a call: the device may not be touched yet; one that comes
        // now touches nothing.
        assert_eq!(recoverer.next(0), Action::At(QUIESCE_POLL_NS));
        assert_eq!(asking.enter(), Access::Wait);
        assert!(recoverer.resetting());
        inside.leave();
        assert_eq!(recoverer.next(MS), Action::Reset);
        recoverer.reset_done(2 * MS, true);
        // Each queue resyncs once, then serves.
        for link in [&mut inside, &mut asking] {
            assert_eq!(link.enter(), Access::Resync);
            link.synced();
            link.leave();
            assert_eq!(link.enter(), Access::Go);
            link.leave();
        }
        assert_eq!(recoverer.next(3 * MS), Action::Idle);
    }

    #[test]
    fn an_aborted_command_that_does_not_come_back_in_time_resets_the_device() {
        let mut recoverer = Recoverer::new(RecoveryConfig::DEFAULT);
        let mut link = recoverer.link();
        assert!(link.ask_abort(3, 7, 31_000));
        assert!(!link.ask_abort(3, 8, 31_000), "one abort at a time");
        assert_eq!(recoverer.next(0), Action::Abort { qid: 3, cid: 7 });
        recoverer.abort_sent(0, true);
        assert_eq!(recoverer.next(MS), Action::At(ABORT_WAIT_NS));
        // Another command finishing settles nothing.
        link.finished(8);
        assert_eq!(recoverer.next(ABORT_WAIT_NS), Action::Reset);
        assert_eq!(recoverer.cause(), FaultKind::Timeout { waited_ms: 31_000 });
    }

    #[test]
    fn without_resets_nothing_is_shared_and_nothing_recovers() {
        let mut recoverer = Recoverer::new(RecoveryConfig::NEVER);
        let mut link = recoverer.link();
        assert!(!link.recovers());
        assert_eq!(link.enter(), Access::Go);
        assert!(!recoverer.gates[0].busy.load(Ordering::SeqCst));
        assert_eq!(recoverer.next(0), Action::Idle);
    }
}
