// SPDX-License-Identifier: MIT OR Apache-2.0
//! Submission entries for the commands this host sends, and completion status.
//! Layouts: NVMe base spec and NVMe-oF (Linux include/linux/nvme.h, struct
//! nvmf_connect_command, nvmf_property_{get,set}_command, nvmf_connect_data).

/// One 64-byte submission queue entry.
pub type Sqe = [u8; 64];

pub const OPC_FABRICS: u8 = 0x7f;
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
pub const FCTYPE_CONNECT: u8 = 0x01;
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;

pub const ADMIN_GET_LOG_PAGE: u8 = 0x02;
pub const ADMIN_IDENTIFY: u8 = 0x06;
pub const ADMIN_KEEP_ALIVE: u8 = 0x18;
pub const ADMIN_SET_FEATURES: u8 = 0x09;
pub const ADMIN_ASYNC_EVENT_REQUEST: u8 = 0x0c;
/// Set Features' feature: Number of Queues.
pub const FEATURE_NUMBER_OF_QUEUES: u32 = 0x07;
/// Set Features' feature: Asynchronous Event Configuration.
pub const FEATURE_ASYNC_EVENT_CONFIG: u32 = 0x0b;
/// Asynchronous Event Configuration: Namespace Attribute and ANA change notices.
pub const AEN_NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
pub const AEN_ANA_CHANGE: u32 = 1 << 11;
/// Log Identifier of the Changed Namespace List (up to 1,024 NSIDs, 4 KiB).
pub const LOG_CHANGED_NAMESPACES: u8 = 0x04;

pub const IO_FLUSH: u8 = 0x00;
pub const IO_WRITE: u8 = 0x01;
pub const IO_READ: u8 = 0x02;
pub const IO_DSM: u8 = 0x09;

/// Controller properties (register offsets).
pub const PROP_CAP: u32 = 0x00;
pub const PROP_CC: u32 = 0x14;
pub const PROP_CSTS: u32 = 0x1c;

pub const CNS_NAMESPACE: u32 = 0x00;
pub const CNS_CONTROLLER: u32 = 0x01;

/// Bytes of Connect's data (struct nvmf_connect_data).
pub const CONNECT_DATA_LEN: usize = 1024;
/// Most bytes of an NQN (NVMF_NQN_FIELD_LEN, NUL-terminated inside it).
pub const NQN_FIELD_LEN: usize = 256;
/// Identify data is one 4 KiB page.
pub const IDENTIFY_LEN: u32 = 4096;
/// One Dataset Management range.
pub const DSM_RANGE_LEN: usize = 16;

fn new_sqe(opcode: u8, nsid: u32) -> Sqe {
    let mut sqe = [0u8; 64];
    sqe[0] = opcode;
    sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
    sqe
}

fn set_u32(sqe: &mut Sqe, at: usize, v: u32) {
    sqe[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Fabrics Connect for queue `qid` with `sqsize` entries (sent 0's based). `kato_ms` is
/// the keep-alive timeout (admin queue only; I/O queues send 0).
pub fn connect(qid: u16, sqsize: u16, kato_ms: u32) -> Sqe {
    let mut sqe = new_sqe(OPC_FABRICS, 0);
    sqe[4] = FCTYPE_CONNECT;
    // recfmt (40..42) = 0.
    sqe[42..44].copy_from_slice(&qid.to_le_bytes());
    sqe[44..46].copy_from_slice(&sqsize.saturating_sub(1).to_le_bytes());
    set_u32(&mut sqe, 48, kato_ms);
    sqe
}

/// Connect's data: host ID, controller ID (0xffff on the admin queue: any controller),
/// subsystem and host NQN. NQNs longer than 255 bytes are cut (the caller checks).
pub fn connect_data(
    host_id: &[u8; 16],
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> [u8; CONNECT_DATA_LEN] {
    let mut data = [0u8; CONNECT_DATA_LEN];
    data[0..16].copy_from_slice(host_id);
    data[16..18].copy_from_slice(&cntlid.to_le_bytes());
    let put = |data: &mut [u8; CONNECT_DATA_LEN], at: usize, s: &str| {
        let n = s.len().min(NQN_FIELD_LEN - 1);
        data[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
    };
    put(&mut data, 256, subnqn);
    put(&mut data, 512, hostnqn);
    data
}

/// Property Get of a 4-byte (`wide == false`) or 8-byte property.
pub fn property_get(offset: u32, wide: bool) -> Sqe {
    let mut sqe = new_sqe(OPC_FABRICS, 0);
    sqe[4] = FCTYPE_PROPERTY_GET;
    sqe[40] = u8::from(wide);
    set_u32(&mut sqe, 44, offset);
    sqe
}

/// Property Set of a 4-byte property.
pub fn property_set(offset: u32, value: u32) -> Sqe {
    let mut sqe = new_sqe(OPC_FABRICS, 0);
    sqe[4] = FCTYPE_PROPERTY_SET;
    set_u32(&mut sqe, 44, offset);
    set_u32(&mut sqe, 48, value);
    sqe
}

pub fn identify(cns: u32, nsid: u32) -> Sqe {
    let mut sqe = new_sqe(ADMIN_IDENTIFY, nsid);
    set_u32(&mut sqe, 40, cns);
    sqe
}

/// Get Log Page: `len` bytes (a multiple of 4, at least 4) of log `lid` from its
/// start, with log specific field `lsp`, for every namespace.
pub fn get_log_page(lid: u8, lsp: u8, len: u32) -> Sqe {
    let mut sqe = new_sqe(ADMIN_GET_LOG_PAGE, 0xffff_ffff);
    let dwords = (len / 4).max(1) - 1;
    set_u32(
        &mut sqe,
        40,
        u32::from(lid) | u32::from(lsp & 0x7f) << 8 | (dwords & 0xffff) << 16,
    );
    set_u32(&mut sqe, 44, dwords >> 16);
    sqe
}

/// Set Features, Number of Queues: asks for `queues` (1..=65535) I/O submission and
/// completion queues; the completion's dword 0 holds what the controller allots
/// (submission queues in bits 0..16, completion queues in 16..32, both 0's based).
pub fn set_queue_count(queues: u16) -> Sqe {
    let mut sqe = new_sqe(ADMIN_SET_FEATURES, 0);
    let asked = u32::from(queues.max(1) - 1);
    set_u32(&mut sqe, 40, FEATURE_NUMBER_OF_QUEUES);
    set_u32(&mut sqe, 44, asked << 16 | asked);
    sqe
}

/// Set Features, Asynchronous Event Configuration: the events in `mask` are reported.
pub fn set_async_events(mask: u32) -> Sqe {
    let mut sqe = new_sqe(ADMIN_SET_FEATURES, 0);
    set_u32(&mut sqe, 40, FEATURE_ASYNC_EVENT_CONFIG);
    set_u32(&mut sqe, 44, mask);
    sqe
}

/// Asynchronous Event Request: completes when the controller has an event to report
/// (dword 0: its type in bits 0..3, its information in 8..16, its log page in 16..24).
pub fn async_event_request() -> Sqe {
    new_sqe(ADMIN_ASYNC_EVENT_REQUEST, 0)
}

pub fn keep_alive() -> Sqe {
    new_sqe(ADMIN_KEEP_ALIVE, 0)
}

/// Read or write `blocks` (1..=65536) logical blocks from `lba`.
pub fn rw(write: bool, nsid: u32, lba: u64, blocks: u32) -> Sqe {
    let mut sqe = new_sqe(if write { IO_WRITE } else { IO_READ }, nsid);
    set_u32(&mut sqe, 40, lba as u32);
    set_u32(&mut sqe, 44, (lba >> 32) as u32);
    set_u32(&mut sqe, 48, blocks.saturating_sub(1) & 0xffff);
    sqe
}

pub fn flush(nsid: u32) -> Sqe {
    new_sqe(IO_FLUSH, nsid)
}

/// Dataset Management, deallocate, one range (its 16 bytes go as command data).
pub fn deallocate(nsid: u32) -> Sqe {
    let mut sqe = new_sqe(IO_DSM, nsid);
    set_u32(&mut sqe, 40, 0); // NR: one range, 0's based
    set_u32(&mut sqe, 44, 1 << 2); // AD: deallocate
    sqe
}

pub fn dsm_range(lba: u64, blocks: u32) -> [u8; DSM_RANGE_LEN] {
    let mut r = [0u8; DSM_RANGE_LEN];
    r[4..8].copy_from_slice(&blocks.to_le_bytes());
    r[8..16].copy_from_slice(&lba.to_le_bytes());
    r
}

/// Status field of a completion (dword 3 bits 17..32: code, type, more, DNR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u16);

impl Status {
    pub const SUCCESS: Status = Status(0);
    /// Not an NVMe status: the host could not deliver the command (connection failed).
    /// Generic "command aborted due to host path error" (type 3, code 0x71), as Linux
    /// uses for the same case.
    pub const HOST_PATH_ERROR: Status = Status((3 << 8) | 0x71);
    /// Generic "data transfer error" (type 0, code 0x04): what Linux's host completes a
    /// read with when its data digest does not match, and worth another try.
    pub const DATA_TRANSFER_ERROR: Status = Status(0x04);
    /// ANA Transition (type 3, code 0x03): the namespace's ANA group is changing state
    /// through this controller (nvmet's answer to I/O in the change state).
    pub const ANA_TRANSITION: Status = Status((3 << 8) | 0x03);

    pub fn from_dw3(dw3: u32) -> Self {
        Status((dw3 >> 17) as u16)
    }

    pub fn new(code_type: u8, code: u8) -> Self {
        Status((u16::from(code_type & 7) << 8) | u16::from(code))
    }

    pub fn code(self) -> u8 {
        self.0 as u8
    }

    pub fn code_type(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }

    pub fn is_success(self) -> bool {
        self.code() == 0 && self.code_type() == 0
    }

    /// Do Not Retry: the same command would fail again.
    pub fn do_not_retry(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// [`Status::ANA_TRANSITION`], whatever its other bits (Do Not Retry, More): the
    /// same path may serve the command within ANATT.
    pub fn is_ana_transition(self) -> bool {
        (self.code_type(), self.code()) == (3, Self::ANA_TRANSITION.code())
    }

    /// Path-related status (type 3): the path to the namespace failed, not the command
    /// (an ANA group inaccessible or in transition through this controller, a pathing
    /// error); another path, or this one later, may serve it.
    pub fn is_path_error(self) -> bool {
        self.code_type() == 3
    }

    /// What a path-related status says, for the log.
    pub fn path_error_name(self) -> &'static str {
        match self.code() {
            0x00 => "internal path error",
            0x01 => "ANA persistent loss",
            0x02 => "ANA inaccessible",
            0x03 => "ANA transition",
            0x60 => "controller pathing error",
            0x70 => "host pathing error",
            0x71 => "command aborted by host",
            _ => "path error",
        }
    }
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "status type {:#x} code {:#04x}",
            self.code_type(),
            self.code()
        )
    }
}
