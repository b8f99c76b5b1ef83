// SPDX-License-Identifier: MIT OR Apache-2.0
//! Controller bring-up on the admin queue, keep-alive, and I/O queues.
//!
//! The admin sequence follows Linux's nvme_tcp_configure_admin_queue: ICReq/ICResp,
//! Connect (queue 0, controller ID 0xffff, KATO), Property Get CAP, Property Set CC
//! (EN, 64-byte SQ / 16-byte CQ entries, 4 KiB pages, NVM command set), Property Get
//! CSTS until RDY (at most CAP.TO x 500 ms), Identify controller, Identify namespace,
//! the ANA log page when the controller reports ANA (a path that cannot serve the
//! namespace fails the bring-up), Set Features Number of Queues (the I/O queues this
//! host will connect), Namespace Attribute (and, where ANA is reported, ANA change)
//! notices turned on. Live, it keeps a Keep Alive due and an Asynchronous Event Request
//! out: an ANA change notice has the log read again (a state that cannot serve fails the
//! session), a Namespace Attribute notice naming this namespace has it identified again
//! (the caller sees a volume grown on the target).

use crate::ana::{self, AnaPath};
use crate::queue::{Completion, DataPort, Payload, Queue, QueueKind, SubmitError};
use crate::sqe::{self, Status};
use crate::{ConnectRefusal, Digests, Error, ProtocolError};

/// Command slots on the admin queue: bring-up runs one command at a time, keep-alive
/// adds one.
pub const ADMIN_QUEUE_SLOTS: usize = 4;
/// Entries the admin queue asks for in Connect (Linux: NVME_AQ_DEPTH).
const ADMIN_QUEUE_DEPTH: u16 = 32;
/// Most write data this host puts in one command capsule.
const MAX_INLINE: u32 = 1 << 20;
/// How often CSTS is read while waiting for RDY, or for the end of a shutdown.
const CSTS_POLL_MS: u64 = 10;
/// CC as this host enables the controller: EN, 64-byte SQ and 16-byte CQ entries
/// (IOSQES 6, IOCQES 4), 4 KiB memory pages (MPS 0), the NVM command set (CSS 0).
const CC_ENABLED: u32 = 1 | (6 << 16) | (4 << 20);
/// CC.SHN (bits 15:14) 01b: a normal shutdown.
const CC_SHN_NORMAL: u32 = 0b01 << 14;
/// CSTS.CFS (bit 1): the controller reports a fatal status.
const CSTS_CFS: u32 = 1 << 1;
/// CSTS.SHST (bits 3:2) 10b: shutdown processing complete.
const CSTS_SHST_MASK: u32 = 0b11 << 2;
const CSTS_SHST_COMPLETE: u32 = 0b10 << 2;

const TAG_CONNECT: u64 = 1;
const TAG_PROPERTY: u64 = 2;
const TAG_IDENTIFY: u64 = 3;
const TAG_KEEP_ALIVE: u64 = 4;
const TAG_QUEUE_COUNT: u64 = 5;
const TAG_ANA_LOG: u64 = 6;
const TAG_ASYNC_EVENT: u64 = 7;
const TAG_EVENT_CONFIG: u64 = 8;
const TAG_LIVE_READ: u64 = 9;
/// An asynchronous event's type (notice) and information (namespace attribute changed,
/// ANA change).
const EVENT_TYPE_NOTICE: u64 = 2;
const EVENT_NOTICE_NAMESPACE_ATTRIBUTE: u64 = 0;
const EVENT_NOTICE_ANA_CHANGE: u64 = 3;

/// What a live session reads into its identify buffer after a notice, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LiveRead {
    AnaLog,
    /// The Changed Namespace List: reading it clears the notice (nvmet sends no other
    /// until it is read) and says whether this namespace is among those changed.
    ChangedNamespaces,
    Namespace,
}
/// Get Log Page's log specific field for the ANA log: Return Groups Only (no namespace
/// lists; this host looks its namespace's group up by the ID Identify Namespace gave).
const ANA_RETURN_GROUPS_ONLY: u8 = 1;

/// Get Log Page for the ANA log, groups only.
fn ana_log_command() -> sqe::Sqe {
    sqe::get_log_page(ana::LOG_ANA, ANA_RETURN_GROUPS_ONLY, ana::LOG_LEN)
}

/// Who this host is and what it connects to.
#[derive(Clone, Copy, Debug)]
pub struct HostIdentity<'a> {
    pub host_nqn: &'a str,
    /// Host identifier (a UUID), the same on every connection of one host.
    pub host_id: [u8; 16],
    pub subsystem_nqn: &'a str,
}

impl HostIdentity<'_> {
    fn connect_data(&self, cntlid: u16) -> [u8; sqe::CONNECT_DATA_LEN] {
        sqe::connect_data(&self.host_id, cntlid, self.subsystem_nqn, self.host_nqn)
    }
}

/// What bring-up learnt about the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerInfo {
    /// The controller ID the target assigned (I/O queues connect to it).
    pub cntlid: u16,
    /// Largest I/O queue the controller takes (CAP.MQES + 1, at most MAXCMD).
    pub max_queue_entries: u16,
    /// Write data that may go in the command capsule on I/O queues (IOCCSZ x 16 - 64;
    /// 0 when the controller wants an in-capsule data offset).
    pub inline_limit: u32,
    /// Largest transfer in bytes (MDTS), if limited.
    pub max_transfer: Option<u32>,
    pub volatile_write_cache: bool,
    /// Dataset Management (deallocate) is supported.
    pub deallocate: bool,
    /// Keep-alive period in ms (half of KATO), 0 for none.
    pub keep_alive_ms: u32,
    /// ANA Transition Time (ANATT, seconds): how long a group stays in the change state
    /// at most; 0 when not reported.
    pub ana_transition_s: u8,
}

/// The namespace the session serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    pub block_size: u32,
}

impl NamespaceInfo {
    /// Every block of `served` is still here: the same block size and at least as many
    /// blocks (a volume grown on the target still holds them; one shrunk does not).
    pub fn holds(&self, served: &NamespaceInfo) -> bool {
        self.block_size == served.block_size && self.blocks >= served.blocks
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    Connecting,
    Live,
    Failed(Error),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    AwaitIcResp,
    Connect,
    GetCap,
    SetCc,
    /// Waiting for CSTS.RDY: a Property Get is out (`None`), or the next is due then.
    WaitReady {
        next_poll: Option<u64>,
        deadline: u64,
    },
    IdentifyController,
    IdentifyNamespace,
    ReadAnaLog,
    SetQueueCount,
    /// Turning Namespace Attribute (and ANA change) notices on.
    ConfigureEvents,
    Live,
    /// Property Set CC.SHN is out ([`AdminSession::shut_down`]).
    ShutDown {
        deadline: u64,
    },
    /// Waiting for CSTS.SHST to say complete: a Property Get is out (`None`), or the
    /// next is due then.
    WaitShutDown {
        next_poll: Option<u64>,
        deadline: u64,
    },
    /// The controller said its shutdown is complete: nothing more is sent.
    ShutDownComplete,
}

/// The admin queue's buffers, as the queue's [`DataPort`].
struct AdminPort<'a> {
    connect: &'a [u8; sqe::CONNECT_DATA_LEN],
    identify: &'a mut [u8; sqe::IDENTIFY_LEN as usize],
}

impl DataPort for AdminPort<'_> {
    fn fetch(&mut self, tag: u64, offset: u32, dst: &mut [u8]) {
        let from = offset as usize;
        if let (TAG_CONNECT, Some(src)) = (tag, self.connect.get(from..from + dst.len())) {
            dst.copy_from_slice(src);
        }
    }

    fn deliver(&mut self, tag: u64, offset: u32, src: &[u8]) {
        let at = offset as usize;
        if tag != TAG_IDENTIFY && tag != TAG_ANA_LOG && tag != TAG_LIVE_READ {
            return;
        }
        if let Some(dst) = self.identify.get_mut(at..at + src.len()) {
            dst.copy_from_slice(src);
        }
    }
}

/// The admin queue of one association with a controller: bring-up, then keep-alive.
/// Times are milliseconds on any monotonic clock the caller keeps.
pub struct AdminSession {
    queue: Queue<ADMIN_QUEUE_SLOTS>,
    step: Step,
    connect_data: [u8; sqe::CONNECT_DATA_LEN],
    /// Identify data, then the ANA log, and live the reads notices call for (each fits
    /// one page).
    identify: [u8; sqe::IDENTIFY_LEN as usize],
    nsid: u32,
    kato_ms: u32,
    /// The controller reports ANA (CMIC bit 3); the namespace's ANA group (0: none).
    ana_reporting: bool,
    ana_group: u32,
    ana: Option<AnaPath>,
    /// ANA change notices taken while live.
    ana_notices: u32,
    /// ANA logs taken (`ana_logs_taken`).
    ana_logs_taken: u32,
    /// Namespace Attribute notices taken while live.
    namespace_notices: u32,
    /// The read out now, and those due after it (a notice during a read of its own
    /// kind has it read again: the read out may predate that change).
    live_read: Option<LiveRead>,
    ana_due: bool,
    changed_due: bool,
    namespace_due: bool,
    bringup_deadline: u64,
    cap: u64,
    cntlid: u16,
    controller: Option<ControllerInfo>,
    namespace: Option<NamespaceInfo>,
    keep_alive_due: u64,
    keep_alive_sent: Option<u64>,
    error: Option<Error>,
    /// I/O queues asked for (Set Features, Number of Queues), and allotted.
    io_queues_asked: u16,
    io_queues: u16,
    /// A look at a path only ([`AdminSession::probing`]): live once the namespace's ANA
    /// state through this controller is known.
    probe: bool,
}

impl AdminSession {
    /// A session for namespace `nsid`. `kato_ms` goes to the target in Connect (0: no
    /// keep-alive); a keep-alive is sent every `kato_ms / 2`. Bring-up must finish within
    /// `bringup_timeout_ms` of `now`.
    pub fn new(
        id: &HostIdentity<'_>,
        nsid: u32,
        kato_ms: u32,
        now: u64,
        bringup_timeout_ms: u64,
    ) -> Self {
        AdminSession {
            queue: Queue::new(QueueKind::Admin),
            step: Step::AwaitIcResp,
            connect_data: id.connect_data(0xffff),
            identify: [0; sqe::IDENTIFY_LEN as usize],
            nsid,
            kato_ms,
            ana_reporting: false,
            ana_group: 0,
            ana: None,
            ana_notices: 0,
            ana_logs_taken: 0,
            namespace_notices: 0,
            live_read: None,
            ana_due: false,
            changed_due: false,
            namespace_due: false,
            bringup_deadline: now.saturating_add(bringup_timeout_ms),
            cap: 0,
            cntlid: 0,
            controller: None,
            namespace: None,
            keep_alive_due: 0,
            keep_alive_sent: None,
            error: None,
            io_queues_asked: 1,
            io_queues: 1,
            probe: false,
        }
    }

    /// Only looks at the path: the session is live once it has identified the namespace
    /// and read its ANA state through this controller ([`AdminSession::ana`]; none when
    /// the controller does not report it), asking for no I/O queue and no event. A
    /// state that cannot serve fails it, as a bring-up.
    pub fn probing(mut self) -> Self {
        self.probe = true;
        self
    }

    /// Asks the controller for `queues` I/O queues (default 1) in bring-up.
    pub fn with_io_queues(mut self, queues: u16) -> Self {
        self.io_queues_asked = queues.max(1);
        self
    }

    /// Asks for `digests` on the admin queue's connection (before anything is sent).
    pub fn with_digests(mut self, digests: Digests) -> Self {
        self.queue = self.queue.with_digests(digests);
        self
    }

    /// The I/O queues this host may connect once live: what it asked for, or fewer if
    /// the controller allots fewer.
    pub fn io_queues(&self) -> u16 {
        self.io_queues
    }

    /// A session told to shut down stays `Live` until the controller confirms (then
    /// [`shut_down_complete`](Self::shut_down_complete)) or fails.
    pub fn state(&self) -> SessionState {
        match (self.error, self.step) {
            (Some(e), _) => SessionState::Failed(e),
            (None, Step::Live) => SessionState::Live,
            (None, _) if self.shutting_down() => SessionState::Live,
            _ => SessionState::Connecting,
        }
    }

    /// Told to shut down ([`shut_down`](Self::shut_down)), whether or not the controller
    /// confirmed yet.
    fn shutting_down(&self) -> bool {
        matches!(
            self.step,
            Step::ShutDown { .. } | Step::WaitShutDown { .. } | Step::ShutDownComplete
        )
    }

    /// The host is leaving the association (Linux's host does the same when a
    /// controller is deleted, `nvme disconnect`, once its I/O queues are gone): a normal
    /// shutdown notification (Property Set CC.SHN = 01b, CC.EN kept), then CSTS read
    /// every 10 ms until SHST says complete ([`shut_down_complete`]), at most
    /// `within_ms` from `now` (then the session fails with a timeout). A target with a
    /// volatile write cache is told to make it durable; one that keeps nothing needs
    /// no more than the reset that follows. No keep-alive goes meanwhile, nor a read a
    /// notice asks for. Nothing unless live (a bring-up under way has nothing to shut
    /// down).
    ///
    /// [`shut_down_complete`]: Self::shut_down_complete
    pub fn shut_down(&mut self, now: u64, within_ms: u64) -> Result<(), Error> {
        if self.step != Step::Live || self.error.is_some() {
            return Ok(());
        }
        let deadline = now.saturating_add(within_ms);
        let r = self.property(sqe::property_set(sqe::PROP_CC, CC_ENABLED | CC_SHN_NORMAL));
        self.step = Step::ShutDown { deadline };
        self.check(r)
    }

    /// The controller confirmed the shutdown asked for by
    /// [`shut_down`](Self::shut_down) (CSTS.SHST = 10b).
    pub fn shut_down_complete(&self) -> bool {
        self.error.is_none() && self.step == Step::ShutDownComplete
    }

    pub fn controller(&self) -> Option<ControllerInfo> {
        self.controller
    }

    pub fn namespace(&self) -> Option<NamespaceInfo> {
        self.namespace
    }

    /// The namespace's ANA group and its state through this controller, when the
    /// controller reports ANA and its log described the group.
    pub fn ana(&self) -> Option<AnaPath> {
        self.ana
    }

    /// Reads the ANA log again (an I/O command found the path in transition, or the
    /// state is awaited): at once, or after the read that is out. Nothing unless live
    /// through a controller that reports the namespace's ANA state.
    pub fn refresh_ana(&mut self) -> Result<(), Error> {
        if self.step != Step::Live || self.ana.is_none() || self.error.is_some() {
            return Ok(());
        }
        self.ana_due = true;
        let r = self.next_live_read();
        self.check(r)
    }

    /// ANA logs read and taken so far (at the bring-up and since): a caller that asked
    /// for one with [`refresh_ana`](Self::refresh_ana) knows from this when it came.
    pub fn ana_logs_taken(&self) -> u32 {
        self.ana_logs_taken
    }

    /// ANA change notices the controller sent while live (each had the log read again).
    pub fn ana_notices(&self) -> u32 {
        self.ana_notices
    }

    /// Namespace Attribute notices the controller sent while live.
    pub fn namespace_notices(&self) -> u32 {
        self.namespace_notices
    }

    pub fn wants_to_send(&self) -> bool {
        self.error.is_none() && self.queue.wants_to_send()
    }

    pub fn transmit(&mut self, out: &mut [u8]) -> usize {
        if self.error.is_some() {
            return 0;
        }
        let mut port = AdminPort {
            connect: &self.connect_data,
            identify: &mut self.identify,
        };
        self.queue.transmit(out, &mut port)
    }

    /// Bytes from the target.
    pub fn receive(&mut self, input: &[u8], now: u64) -> Result<(), Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut port = AdminPort {
            connect: &self.connect_data,
            identify: &mut self.identify,
        };
        let r = self
            .queue
            .receive(input, &mut port)
            .map_err(Error::from)
            .and_then(|()| self.advance(now));
        self.check(r)
    }

    /// Timers: CSTS polling, keep-alive, bring-up and keep-alive deadlines.
    pub fn poll(&mut self, now: u64) -> Result<(), Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let r = self.timers(now);
        self.check(r)
    }

    /// The connection broke underneath (reset, closed, unreachable).
    pub fn connection_lost(&mut self) {
        self.queue.fail(ProtocolError::ConnectionLost);
        self.error
            .get_or_insert(Error::Protocol(ProtocolError::ConnectionLost));
    }

    /// When [`poll`](Self::poll) next has something to do.
    pub fn next_timer(&self) -> Option<u64> {
        if self.error.is_some() {
            return None;
        }
        match self.step {
            Step::Live => match self.keep_alive_sent {
                _ if self.kato_ms == 0 => None,
                Some(sent) => Some(sent + u64::from(self.kato_ms)),
                None => Some(self.keep_alive_due),
            },
            Step::WaitReady {
                next_poll: Some(t),
                deadline,
            } => Some(t.min(deadline)),
            Step::WaitReady {
                next_poll: None,
                deadline,
            } => Some(deadline.min(self.bringup_deadline)),
            Step::WaitShutDown {
                next_poll: Some(t),
                deadline,
            } => Some(t.min(deadline)),
            Step::ShutDown { deadline } | Step::WaitShutDown { deadline, .. } => Some(deadline),
            Step::ShutDownComplete => None,
            _ => Some(self.bringup_deadline),
        }
    }

    fn check(&mut self, r: Result<(), Error>) -> Result<(), Error> {
        if let Err(e) = r {
            self.error.get_or_insert(e);
            if let Error::Protocol(p) = e {
                self.queue.fail(p);
            }
        }
        r
    }

    fn submit(&mut self, tag: u64, sqe: sqe::Sqe, payload: Payload) -> Result<(), Error> {
        // Bring-up has at most two commands out (one step, one keep-alive) of four
        // slots: only a failed connection refuses one.
        self.queue.submit(tag, sqe, payload).map_err(|_| {
            self.queue.error().map_or(
                Error::Internal("admin queue refused a command"),
                Error::Protocol,
            )
        })
    }

    /// Property Get and Set: no data, one at a time.
    fn property(&mut self, sqe: sqe::Sqe) -> Result<(), Error> {
        self.submit(TAG_PROPERTY, sqe, Payload::None)
    }

    fn timers(&mut self, now: u64) -> Result<(), Error> {
        match self.step {
            Step::Live => {
                if self.kato_ms == 0 {
                    return Ok(());
                }
                match self.keep_alive_sent {
                    Some(sent) if now >= sent + u64::from(self.kato_ms) => {
                        Err(Error::Timeout("keep-alive response"))
                    }
                    None if now >= self.keep_alive_due => {
                        self.submit(TAG_KEEP_ALIVE, sqe::keep_alive(), Payload::None)?;
                        self.keep_alive_sent = Some(now);
                        Ok(())
                    }
                    _ => Ok(()),
                }
            }
            Step::WaitReady {
                next_poll,
                deadline,
            } => {
                if now >= deadline {
                    return Err(Error::Timeout("CSTS.RDY after CC.EN"));
                }
                if next_poll.is_some_and(|t| now >= t) {
                    self.property(sqe::property_get(sqe::PROP_CSTS, false))?;
                    self.step = Step::WaitReady {
                        next_poll: None,
                        deadline,
                    };
                }
                self.bringup_timer(now)
            }
            Step::ShutDown { deadline } | Step::WaitShutDown { deadline, .. }
                if now >= deadline =>
            {
                Err(Error::Timeout("CSTS.SHST after CC.SHN"))
            }
            Step::WaitShutDown {
                next_poll: Some(t),
                deadline,
            } if now >= t => {
                self.property(sqe::property_get(sqe::PROP_CSTS, false))?;
                self.step = Step::WaitShutDown {
                    next_poll: None,
                    deadline,
                };
                Ok(())
            }
            _ if self.shutting_down() => Ok(()),
            _ => self.bringup_timer(now),
        }
    }

    fn bringup_timer(&self, now: u64) -> Result<(), Error> {
        if now >= self.bringup_deadline {
            Err(Error::Timeout("controller bring-up"))
        } else {
            Ok(())
        }
    }

    /// Takes completions and moves bring-up on.
    fn advance(&mut self, now: u64) -> Result<(), Error> {
        if self.step == Step::AwaitIcResp && self.queue.is_ready() {
            self.submit(
                TAG_CONNECT,
                sqe::connect(0, ADMIN_QUEUE_DEPTH, self.kato_ms),
                Payload::ToTarget(sqe::CONNECT_DATA_LEN as u32),
            )?;
            self.step = Step::Connect;
        }
        while let Some(c) = self.queue.next_completion() {
            self.completed(c, now)?;
        }
        Ok(())
    }

    fn completed(&mut self, c: Completion, now: u64) -> Result<(), Error> {
        if c.tag == TAG_KEEP_ALIVE {
            if !c.status.is_success() {
                return Err(Error::Command {
                    what: "Keep Alive",
                    status: c.status,
                });
            }
            self.keep_alive_sent = None;
            self.keep_alive_due = now + u64::from(self.kato_ms / 2);
            return Ok(());
        }
        if self.shutting_down() {
            return self.shutdown_completed(c, now);
        }
        if self.step == Step::Live {
            return match c.tag {
                TAG_ASYNC_EVENT => self.async_event(c),
                TAG_LIVE_READ => self.live_read_done(c),
                _ => Err(Error::Command {
                    what: "unexpected command",
                    status: c.status,
                }),
            };
        }
        let what = match self.step {
            Step::Connect => "Connect (admin queue)",
            Step::GetCap => "Property Get CAP",
            Step::SetCc => "Property Set CC",
            Step::WaitReady { .. } => "Property Get CSTS",
            Step::IdentifyController => "Identify controller",
            Step::IdentifyNamespace => "Identify namespace",
            Step::ReadAnaLog => "Get Log Page (ANA)",
            Step::SetQueueCount => "Set Features (Number of Queues)",
            Step::ConfigureEvents => "Set Features (Asynchronous Event Configuration)",
            Step::AwaitIcResp
            | Step::Live
            | Step::ShutDown { .. }
            | Step::WaitShutDown { .. }
            | Step::ShutDownComplete => "unexpected command",
        };
        if !c.status.is_success() {
            // The state is a hint that saves a path error; a target that cannot give
            // it still serves (the first I/O's status says the rest).
            if self.step == Step::ReadAnaLog {
                return self.identified(now);
            }
            // Without notices, a change while live shows as a path error instead.
            if self.step == Step::ConfigureEvents {
                self.go_live(now);
                return Ok(());
            }
            if self.step == Step::Connect {
                let why = ConnectRefusal::from_completion(c.status, c.result);
                return Err(Error::ConnectRefused(why));
            }
            // Identify Namespace on an unknown NSID: "Invalid Namespace or Format".
            if self.step == Step::IdentifyNamespace && c.status == Status::new(0, 0x0b) {
                return Err(Error::NamespaceMissing(self.nsid));
            }
            return Err(Error::Command {
                what,
                status: c.status,
            });
        }
        match self.step {
            Step::Connect => {
                self.cntlid = c.result as u16;
                self.property(sqe::property_get(sqe::PROP_CAP, true))?;
                self.step = Step::GetCap;
            }
            Step::GetCap => {
                self.cap = c.result;
                // This host uses 4 KiB memory pages (CC.MPS 0) and the NVM command set.
                if (self.cap >> 48) & 0xf != 0 {
                    return Err(Error::Unsupported("4 KiB memory pages (CAP.MPSMIN)"));
                }
                if (self.cap >> 37) & 1 == 0 {
                    return Err(Error::Unsupported("the NVM command set (CAP.CSS)"));
                }
                self.property(sqe::property_set(sqe::PROP_CC, CC_ENABLED))?;
                self.step = Step::SetCc;
            }
            Step::SetCc => {
                let timeout = ((self.cap >> 24) & 0xff).max(1) * 500;
                self.property(sqe::property_get(sqe::PROP_CSTS, false))?;
                self.step = Step::WaitReady {
                    next_poll: None,
                    deadline: now + timeout,
                };
            }
            Step::WaitReady { deadline, .. } => {
                let csts = c.result as u32;
                if csts & CSTS_CFS != 0 {
                    return Err(Error::ControllerFatal);
                }
                if csts & 1 == 0 {
                    self.step = Step::WaitReady {
                        next_poll: Some(now + CSTS_POLL_MS),
                        deadline,
                    };
                    return Ok(());
                }
                self.submit(
                    TAG_IDENTIFY,
                    sqe::identify(sqe::CNS_CONTROLLER, 0),
                    Payload::ToHost(sqe::IDENTIFY_LEN),
                )?;
                self.step = Step::IdentifyController;
            }
            Step::IdentifyController => {
                self.controller = Some(self.parse_controller()?);
                self.ana_reporting = self.identify[76] & (1 << 3) != 0;
                self.identify = [0; sqe::IDENTIFY_LEN as usize];
                self.submit(
                    TAG_IDENTIFY,
                    sqe::identify(sqe::CNS_NAMESPACE, self.nsid),
                    Payload::ToHost(sqe::IDENTIFY_LEN),
                )?;
                self.step = Step::IdentifyNamespace;
            }
            Step::IdentifyNamespace => {
                self.namespace = Some(self.parse_namespace()?);
                self.ana_group = self.id_u32(92);
                if self.ana_reporting && self.ana_group != 0 {
                    self.identify = [0; sqe::IDENTIFY_LEN as usize];
                    self.submit(
                        TAG_ANA_LOG,
                        ana_log_command(),
                        Payload::ToHost(ana::LOG_LEN),
                    )?;
                    self.step = Step::ReadAnaLog;
                } else {
                    self.identified(now)?;
                }
            }
            Step::ReadAnaLog => {
                self.take_ana_log()?;
                self.identified(now)?;
            }
            Step::SetQueueCount => {
                // Both counts are 0's based; a controller may allot more than asked.
                let submission = (c.result & 0xffff) as u16;
                let completion = ((c.result >> 16) & 0xffff) as u16;
                let allotted = submission.min(completion).saturating_add(1);
                self.io_queues = self.io_queues_asked.min(allotted);
                let mut events = sqe::AEN_NAMESPACE_ATTRIBUTE;
                if self.ana.is_some() {
                    events |= sqe::AEN_ANA_CHANGE;
                }
                self.submit(
                    TAG_EVENT_CONFIG,
                    sqe::set_async_events(events),
                    Payload::None,
                )?;
                self.step = Step::ConfigureEvents;
            }
            Step::ConfigureEvents => {
                self.go_live(now);
                self.ask_for_events()?;
            }
            Step::AwaitIcResp
            | Step::Live
            | Step::ShutDown { .. }
            | Step::WaitShutDown { .. }
            | Step::ShutDownComplete => {
                return Err(Error::Command {
                    what,
                    status: c.status,
                })
            }
        }
        Ok(())
    }

    /// A completion while shutting down: the Property Set and Gets move it on; what
    /// else was out (the event request, a keep-alive, a read) is let be.
    fn shutdown_completed(&mut self, c: Completion, now: u64) -> Result<(), Error> {
        if c.tag != TAG_PROPERTY {
            return Ok(());
        }
        let what = match self.step {
            Step::ShutDown { .. } => "Property Set CC (shutdown notification)",
            _ => "Property Get CSTS (shutdown)",
        };
        if !c.status.is_success() {
            return Err(Error::Command {
                what,
                status: c.status,
            });
        }
        match self.step {
            Step::ShutDown { deadline } => {
                self.property(sqe::property_get(sqe::PROP_CSTS, false))?;
                self.step = Step::WaitShutDown {
                    next_poll: None,
                    deadline,
                };
            }
            Step::WaitShutDown { deadline, .. } => {
                let csts = c.result as u32;
                if csts & CSTS_CFS != 0 {
                    return Err(Error::ControllerFatal);
                }
                self.step = if csts & CSTS_SHST_MASK == CSTS_SHST_COMPLETE {
                    Step::ShutDownComplete
                } else {
                    Step::WaitShutDown {
                        next_poll: Some(now + CSTS_POLL_MS),
                        deadline,
                    }
                };
            }
            _ => {}
        }
        Ok(())
    }

    fn go_live(&mut self, now: u64) {
        self.step = Step::Live;
        self.keep_alive_due = now + u64::from(self.kato_ms / 2);
    }

    /// One Asynchronous Event Request out, for the controller to complete with its next
    /// event.
    fn ask_for_events(&mut self) -> Result<(), Error> {
        self.submit(TAG_ASYNC_EVENT, sqe::async_event_request(), Payload::None)
    }

    fn async_event(&mut self, c: Completion) -> Result<(), Error> {
        // A refused request (the controller's limit, an abort) is not asked again: the
        // path errors of I/O still tell a change.
        if !c.status.is_success() {
            return Ok(());
        }
        let (kind, info) = (c.result & 7, (c.result >> 8) & 0xff);
        match (kind, info) {
            (EVENT_TYPE_NOTICE, EVENT_NOTICE_ANA_CHANGE) => {
                self.ana_notices = self.ana_notices.saturating_add(1);
                self.ana_due = true;
            }
            (EVENT_TYPE_NOTICE, EVENT_NOTICE_NAMESPACE_ATTRIBUTE) => {
                self.namespace_notices = self.namespace_notices.saturating_add(1);
                self.changed_due = true;
            }
            _ => {}
        }
        self.next_live_read()?;
        self.ask_for_events()
    }

    /// Starts the next read due, unless one is out.
    fn next_live_read(&mut self) -> Result<(), Error> {
        if self.live_read.is_some() {
            return Ok(());
        }
        let (read, sqe, len) = if self.ana_due {
            self.ana_due = false;
            (LiveRead::AnaLog, ana_log_command(), ana::LOG_LEN)
        } else if self.changed_due {
            self.changed_due = false;
            let sqe = sqe::get_log_page(sqe::LOG_CHANGED_NAMESPACES, 0, sqe::IDENTIFY_LEN);
            (LiveRead::ChangedNamespaces, sqe, sqe::IDENTIFY_LEN)
        } else if self.namespace_due {
            self.namespace_due = false;
            let sqe = sqe::identify(sqe::CNS_NAMESPACE, self.nsid);
            (LiveRead::Namespace, sqe, sqe::IDENTIFY_LEN)
        } else {
            return Ok(());
        };
        self.identify = [0; sqe::IDENTIFY_LEN as usize];
        self.submit(TAG_LIVE_READ, sqe, Payload::ToHost(len))?;
        self.live_read = Some(read);
        Ok(())
    }

    fn live_read_done(&mut self, c: Completion) -> Result<(), Error> {
        let read = self.live_read.take();
        if c.status.is_success() {
            match read {
                // A newer notice came meanwhile: this state may be stale.
                Some(LiveRead::AnaLog) if !self.ana_due => self.take_ana_log()?,
                Some(LiveRead::ChangedNamespaces) => {
                    // NSIDs in order, ended by a zero; 0xffffffff: more changed than fit.
                    let listed = self
                        .identify
                        .chunks_exact(4)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .take_while(|&nsid| nsid != 0)
                        .any(|nsid| nsid == self.nsid || nsid == u32::MAX);
                    self.namespace_due |= listed;
                }
                Some(LiveRead::Namespace) => {
                    // A namespace gone or unusable fails the session; the reconnect says
                    // why.
                    self.namespace = Some(self.parse_namespace()?);
                }
                _ => {}
            }
        } else if read == Some(LiveRead::ChangedNamespaces) {
            // The list could not be read: look at the namespace anyway.
            self.namespace_due = true;
        }
        self.next_live_read()
    }

    /// The namespace's group in the ANA log just read, when the log describes it: its
    /// state is kept, and one that cannot serve fails the session.
    fn take_ana_log(&mut self) -> Result<(), Error> {
        self.ana_logs_taken = self.ana_logs_taken.wrapping_add(1);
        let group = self.ana_group;
        let Some(state) = ana::group_state(&self.identify, group) else {
            return Ok(());
        };
        let path = AnaPath { group, state };
        self.ana = Some(path);
        if state.usable() {
            Ok(())
        } else {
            Err(Error::PathUnusable(path))
        }
    }

    /// The namespace identified (and its ANA state read): a probe is done, a bring-up
    /// goes on.
    fn identified(&mut self, now: u64) -> Result<(), Error> {
        if self.probe {
            self.go_live(now);
            Ok(())
        } else {
            self.ask_queue_count()
        }
    }

    fn ask_queue_count(&mut self) -> Result<(), Error> {
        self.submit(
            TAG_QUEUE_COUNT,
            sqe::set_queue_count(self.io_queues_asked),
            Payload::None,
        )?;
        self.step = Step::SetQueueCount;
        Ok(())
    }

    fn id_u16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.identify[at], self.identify[at + 1]])
    }

    fn id_u32(&self, at: usize) -> u32 {
        u32::from_le_bytes([
            self.identify[at],
            self.identify[at + 1],
            self.identify[at + 2],
            self.identify[at + 3],
        ])
    }

    /// Identify Controller fields (NVMe base spec figure "Identify Controller Data
    /// Structure"; the Fabrics fields from byte 1792).
    fn parse_controller(&self) -> Result<ControllerInfo, Error> {
        let sgls = self.id_u32(536);
        if sgls & 3 == 0 {
            // NVMe/TCP moves all data through SGLs (Linux refuses the same way).
            return Err(Error::Unsupported("SGLs (SGLS)"));
        }
        let mdts = self.identify[77];
        let max_transfer = match mdts {
            0 => None,
            m => 4096u64
                .checked_shl(u32::from(m))
                .filter(|&b| b <= u64::from(u32::MAX))
                .map(|b| b as u32),
        };
        let maxcmd = self.id_u16(514);
        let mqes = (self.cap & 0xffff) as u16;
        let mut max_queue_entries = mqes.saturating_add(1);
        if maxcmd != 0 {
            max_queue_entries = max_queue_entries.min(maxcmd);
        }
        if max_queue_entries < 2 {
            return Err(Error::Unsupported(
                "I/O queues of two entries or more (CAP.MQES, MAXCMD)",
            ));
        }
        let ioccsz = u64::from(self.id_u32(1792)) * 16;
        // Data goes right after the entry (ICDOFF 0) or not in the capsule at all; more
        // than MAX_INLINE in one capsule gains nothing.
        let icdoff = self.id_u16(1800);
        let inline_limit = if icdoff == 0 {
            ioccsz.saturating_sub(64).min(u64::from(MAX_INLINE)) as u32
        } else {
            0
        };
        Ok(ControllerInfo {
            cntlid: self.cntlid,
            max_queue_entries,
            inline_limit,
            max_transfer,
            volatile_write_cache: self.identify[525] & 1 != 0,
            deallocate: self.id_u16(520) & (1 << 2) != 0,
            keep_alive_ms: self.kato_ms / 2,
            ana_transition_s: self.identify[342],
        })
    }

    fn parse_namespace(&self) -> Result<NamespaceInfo, Error> {
        let blocks = u64::from_le_bytes(self.identify[0..8].try_into().unwrap_or([0; 8]));
        if blocks == 0 {
            return Err(Error::NamespaceMissing(self.nsid));
        }
        let nlbaf = self.identify[25];
        let flbas = self.identify[26];
        let format = (flbas & 0xf) | ((flbas >> 5) & 3) << 4;
        if format > nlbaf || format >= 64 {
            return Err(Error::Unsupported(
                "the namespace's LBA format index (FLBAS)",
            ));
        }
        let at = 128 + 4 * usize::from(format);
        let metadata = self.id_u16(at);
        let lbads = self.identify[at + 2];
        if metadata != 0 {
            return Err(Error::Unsupported("namespaces with metadata"));
        }
        if !(9..=16).contains(&lbads) {
            return Err(Error::Unsupported("the namespace's block size (LBADS)"));
        }
        Ok(NamespaceInfo {
            nsid: self.nsid,
            blocks,
            block_size: 1 << lbads,
        })
    }
}

/// Routes Connect's data to the session's buffer until the queue is connected, and
/// everything after to the caller's port.
struct IoPort<'a, P> {
    connecting: bool,
    connect: &'a [u8; sqe::CONNECT_DATA_LEN],
    user: &'a mut P,
}

impl<P: DataPort> DataPort for IoPort<'_, P> {
    fn fetch(&mut self, tag: u64, offset: u32, dst: &mut [u8]) {
        if self.connecting {
            let from = offset as usize;
            if let Some(src) = self.connect.get(from..from + dst.len()) {
                dst.copy_from_slice(src);
            }
        } else {
            self.user.fetch(tag, offset, dst);
        }
    }

    fn deliver(&mut self, tag: u64, offset: u32, src: &[u8]) {
        if !self.connecting {
            self.user.deliver(tag, offset, src);
        }
    }
}

/// One I/O queue of a live controller, on its own TCP connection, with `N` command
/// slots (at most the controller's queue size).
pub struct IoSession<const N: usize> {
    queue: Queue<N>,
    connect_data: [u8; sqe::CONNECT_DATA_LEN],
    qid: u16,
    connected: bool,
    error: Option<Error>,
    namespace: NamespaceInfo,
    max_transfer: Option<u32>,
    /// Commands in flight at most: N, or fewer if the controller's queues are smaller.
    depth: usize,
}

const TAG_IO_CONNECT: u64 = u64::MAX;

impl<const N: usize> IoSession<N> {
    /// I/O queue `qid` (1-based) of the controller `controller` describes.
    pub fn new(
        id: &HostIdentity<'_>,
        controller: &ControllerInfo,
        namespace: NamespaceInfo,
        qid: u16,
    ) -> Self {
        IoSession {
            queue: Queue::new(QueueKind::Io {
                inline_limit: controller.inline_limit,
            }),
            connect_data: id.connect_data(controller.cntlid),
            qid,
            connected: false,
            error: None,
            namespace,
            max_transfer: controller.max_transfer,
            depth: N.min(usize::from(controller.max_queue_entries)),
        }
    }

    /// Asks for `digests` on this queue's connection (before anything is sent).
    pub fn with_digests(mut self, digests: Digests) -> Self {
        self.queue = self.queue.with_digests(digests);
        self
    }

    pub fn state(&self) -> SessionState {
        match (self.error, self.connected) {
            (Some(e), _) => SessionState::Failed(e),
            (None, true) => SessionState::Live,
            (None, false) => SessionState::Connecting,
        }
    }

    pub fn wants_to_send(&self) -> bool {
        self.error.is_none() && self.queue.wants_to_send()
    }

    pub fn transmit(&mut self, out: &mut [u8], port: &mut impl DataPort) -> usize {
        if self.error.is_some() {
            return 0;
        }
        let mut port = IoPort {
            connecting: !self.connected,
            connect: &self.connect_data,
            user: port,
        };
        self.queue.transmit(out, &mut port)
    }

    pub fn receive(&mut self, input: &[u8], port: &mut impl DataPort) -> Result<(), Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut io_port = IoPort {
            connecting: !self.connected,
            connect: &self.connect_data,
            user: port,
        };
        let r = self.queue.receive(input, &mut io_port);
        if let Err(e) = r {
            self.error = Some(Error::Protocol(e));
            return Err(Error::Protocol(e));
        }
        if !self.connected {
            if self.queue.is_ready() && self.queue.in_flight() == 0 {
                let sqsize = self.depth as u16;
                let connect = sqe::connect(self.qid, sqsize, 0);
                let payload = Payload::ToTarget(sqe::CONNECT_DATA_LEN as u32);
                if self.queue.submit(TAG_IO_CONNECT, connect, payload).is_err() {
                    let e = Error::Unsupported("I/O queue submission");
                    self.error = Some(e);
                    return Err(e);
                }
            }
            if let Some(c) = self.queue.next_completion() {
                if !c.status.is_success() {
                    let why = ConnectRefusal::from_completion(c.status, c.result);
                    let e = Error::ConnectRefused(why);
                    self.error = Some(e);
                    return Err(e);
                }
                self.connected = true;
            }
        }
        Ok(())
    }

    /// The next finished I/O command.
    pub fn next_completion(&mut self) -> Option<Completion> {
        if self.connected {
            self.queue.next_completion()
        } else {
            None
        }
    }

    /// The connection broke underneath (reset, closed, unreachable).
    pub fn connection_lost(&mut self) {
        self.queue.fail(ProtocolError::ConnectionLost);
        self.error
            .get_or_insert(Error::Protocol(ProtocolError::ConnectionLost));
    }

    /// Tags of every command not completed (to be held and sent again on a new
    /// connection); their slots are freed.
    pub fn drain(&mut self, f: impl FnMut(u64)) {
        self.queue.drain(f);
    }

    fn check_io(&self, blocks: u32) -> Result<u32, SubmitError> {
        if self.error.is_some() {
            return Err(SubmitError::Failed);
        }
        if !self.connected {
            return Err(SubmitError::NotReady);
        }
        let len = u64::from(blocks) * u64::from(self.namespace.block_size);
        let limit = u64::from(self.max_transfer.unwrap_or(u32::MAX));
        if blocks == 0 || blocks > 65536 || len > limit {
            return Err(SubmitError::BadLength);
        }
        if self.queue.in_flight() >= self.depth {
            return Err(SubmitError::Full);
        }
        Ok(len as u32)
    }

    pub fn read(&mut self, tag: u64, lba: u64, blocks: u32) -> Result<(), SubmitError> {
        let len = self.check_io(blocks)?;
        self.queue.submit(
            tag,
            sqe::rw(false, self.namespace.nsid, lba, blocks),
            Payload::ToHost(len),
        )
    }

    pub fn write(&mut self, tag: u64, lba: u64, blocks: u32) -> Result<(), SubmitError> {
        let len = self.check_io(blocks)?;
        self.queue.submit(
            tag,
            sqe::rw(true, self.namespace.nsid, lba, blocks),
            Payload::ToTarget(len),
        )
    }

    pub fn flush(&mut self, tag: u64) -> Result<(), SubmitError> {
        self.check_io(1)?;
        self.queue
            .submit(tag, sqe::flush(self.namespace.nsid), Payload::None)
    }

    /// Deallocates `blocks` blocks from `lba` (one Dataset Management range).
    pub fn discard(&mut self, tag: u64, lba: u64, blocks: u32) -> Result<(), SubmitError> {
        self.check_io(1)?;
        if blocks == 0 {
            return Err(SubmitError::BadLength);
        }
        let bytes = sqe::dsm_range(lba, blocks);
        self.queue.submit(
            tag,
            sqe::deallocate(self.namespace.nsid),
            Payload::Owned { bytes, len: 16 },
        )
    }
}
