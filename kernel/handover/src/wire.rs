// SPDX-License-Identifier: MIT OR Apache-2.0
//! Little-endian fields written and read one by one: the handover block is read by
//! another build, so no `repr(C)` layout is shared. Every read is checked against what
//! is left, and every count against the bytes its items need at least, before anything
//! is allocated for them.

use alloc::string::String;
use alloc::vec::Vec;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The block ends inside a field.
    Truncated,
    /// A count says more items than the bytes left could hold.
    Count { what: &'static str, count: usize },
    /// A string is longer than allowed, not UTF-8, or holds a NUL.
    BadString(&'static str),
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Truncated => f.write_str("the block ends inside a field"),
            WireError::Count { what, count } => {
                write!(f, "{count} {what}: more than the block holds")
            }
            WireError::BadString(what) => write!(f, "{what}: not a short UTF-8 string"),
        }
    }
}

/// Longest string in a handover (xenstore paths and values are at most 4 KiB).
pub const MAX_STRING: usize = 4096;

#[derive(Default)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    /// A count, as u32 (counts are bounded far below).
    pub fn count(&mut self, n: usize) {
        self.u32(n as u32);
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.count(b.len());
        self.bytes.extend_from_slice(b);
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
}

pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.rest.len() {
            return Err(WireError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A count of items each at least `min_item` bytes long: refused when the bytes left
    /// cannot hold them, so a forged count allocates nothing.
    pub fn count(&mut self, what: &'static str, min_item: usize) -> Result<usize, WireError> {
        let count = self.u32()? as usize;
        if count.saturating_mul(min_item.max(1)) > self.rest.len() {
            return Err(WireError::Count { what, count });
        }
        Ok(count)
    }

    pub fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], WireError> {
        let len = self.count(what, 1)?;
        if len > max {
            return Err(WireError::Count { what, count: len });
        }
        self.take(len)
    }

    /// A string of at most [`MAX_STRING`] bytes, UTF-8, without NUL.
    pub fn string(&mut self, what: &'static str) -> Result<String, WireError> {
        let bytes = self.bytes(what, MAX_STRING)?;
        let s = core::str::from_utf8(bytes).map_err(|_| WireError::BadString(what))?;
        if s.contains('\0') {
            return Err(WireError::BadString(what));
        }
        Ok(String::from(s))
    }
}
