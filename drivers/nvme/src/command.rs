// SPDX-License-Identifier: MIT OR Apache-2.0
//! Submission and completion entries.

/// Bytes of one submission queue entry (CC.IOSQES = 6).
pub const SQ_ENTRY_LEN: usize = 64;
/// Bytes of one completion queue entry (CC.IOCQES = 4).
pub const CQ_ENTRY_LEN: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    // Admin command set.
    CreateIoSq = 0x01,
    Abort = 0x08,
    CreateIoCq = 0x05,
    Identify = 0x06,
    SetFeatures = 0x09,
}

/// NVM command set opcodes.
pub mod io_opcode {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// A submission queue entry under construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubmissionEntry {
    pub bytes: [u8; SQ_ENTRY_LEN],
}

impl SubmissionEntry {
    pub fn new(opcode: u8, command_id: u16, nsid: u32) -> Self {
        let mut entry = SubmissionEntry {
            bytes: [0; SQ_ENTRY_LEN],
        };
        entry.set_u32(0, u32::from(opcode) | (u32::from(command_id) << 16));
        entry.set_u32(4, nsid);
        entry
    }

    fn set_u32(&mut self, offset: usize, value: u32) {
        self.bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    }

    pub fn set_command_id(&mut self, command_id: u16) {
        self.bytes[2..4].copy_from_slice(&command_id.to_le_bytes());
    }

    pub fn with_prp(mut self, prp1: u64, prp2: u64) -> Self {
        self.bytes[24..32].copy_from_slice(&prp1.to_le_bytes());
        self.bytes[32..40].copy_from_slice(&prp2.to_le_bytes());
        self
    }

    /// Data pointer as SGL 1 (PSDT = 01: SGLs, metadata pointer unused).
    pub fn with_sgl(mut self, descriptor: [u8; 16]) -> Self {
        self.bytes[1] = (self.bytes[1] & 0x3f) | 0x40;
        self.bytes[24..40].copy_from_slice(&descriptor);
        self
    }

    /// Command dword `n` (10..=15).
    pub fn with_cdw(mut self, n: usize, value: u32) -> Self {
        debug_assert!((10..=15).contains(&n));
        self.set_u32(n * 4, value);
        self
    }
}

/// SGL descriptor types (in the top nibble of the last byte).
pub const SGL_DATA_BLOCK: u8 = 0x0;
pub const SGL_LAST_SEGMENT: u8 = 0x3;

/// One 16-byte SGL descriptor.
pub fn sgl_descriptor(address: u64, len: u32, kind: u8) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0..8].copy_from_slice(&address.to_le_bytes());
    bytes[8..12].copy_from_slice(&len.to_le_bytes());
    bytes[15] = kind << 4;
    bytes
}

/// Status field of a completion, without the phase bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandStatus(pub u16);

impl CommandStatus {
    pub const SUCCESS: CommandStatus = CommandStatus(0);

    /// From dword 3 of a completion entry (status in bits 17..32).
    pub fn from_dw3(dw3: u32) -> Self {
        CommandStatus((dw3 >> 17) as u16)
    }

    pub fn code(self) -> u8 {
        self.0 as u8
    }

    pub fn code_type(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    pub fn is_success(self) -> bool {
        self.code() == 0 && self.code_type() == 0
    }

    /// The controller does not do this command (as opposed to failing it): generic
    /// "invalid command opcode", or "invalid field" for optional commands.
    pub fn is_unsupported(self, optional_command: bool) -> bool {
        self.code_type() == 0
            && (self.code() == GENERIC_INVALID_OPCODE
                || (optional_command && self.code() == GENERIC_INVALID_FIELD))
    }

    /// Builds the status as the controller writes it (for the fake controller).
    pub fn new(code_type: u8, code: u8) -> Self {
        CommandStatus((u16::from(code_type & 7) << 8) | u16::from(code))
    }
}

pub const GENERIC_INVALID_OPCODE: u8 = 0x01;
pub const GENERIC_INVALID_FIELD: u8 = 0x02;

impl core::fmt::Display for CommandStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "type {:#x} code {:#04x}", self.code_type(), self.code())
    }
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletionEntry {
    pub result: u32,
    pub sq_head: u16,
    pub sq_id: u16,
    pub command_id: u16,
    pub status: CommandStatus,
    pub phase: bool,
}

impl CompletionEntry {
    pub fn parse(bytes: &[u8; CQ_ENTRY_LEN]) -> Self {
        let dw = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4"));
        let dw3 = dw(3);
        CompletionEntry {
            result: dw(0),
            sq_head: dw(2) as u16,
            sq_id: (dw(2) >> 16) as u16,
            command_id: dw3 as u16,
            status: CommandStatus::from_dw3(dw3),
            phase: dw3 & (1 << 16) != 0,
        }
    }
}
