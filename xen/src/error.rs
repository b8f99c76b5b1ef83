// SPDX-License-Identifier: MIT OR Apache-2.0
//! Hypercall errors: Xen returns `-errno` (`public/errno.h`).

use crate::abi::errno::*;
use core::fmt;

/// A failed hypercall, by Xen errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XenError {
    Perm,
    NoEnt,
    Srch,
    Io,
    TooBig,
    BadF,
    Again,
    NoMem,
    Access,
    Fault,
    Busy,
    Exist,
    NoDev,
    Inval,
    NoSpc,
    NoSys,
    Range,
    OpNotSupp,
    IsConn,
    NotConn,
    TimedOut,
    /// Any other errno (positive value).
    Other(i32),
}

impl XenError {
    /// The error for a negative hypercall return value.
    pub fn from_errno(errno: i32) -> Self {
        match errno {
            EPERM => Self::Perm,
            ENOENT => Self::NoEnt,
            ESRCH => Self::Srch,
            EIO => Self::Io,
            E2BIG => Self::TooBig,
            EBADF => Self::BadF,
            EAGAIN => Self::Again,
            ENOMEM => Self::NoMem,
            EACCES => Self::Access,
            EFAULT => Self::Fault,
            EBUSY => Self::Busy,
            EEXIST => Self::Exist,
            ENODEV => Self::NoDev,
            EINVAL => Self::Inval,
            ENOSPC => Self::NoSpc,
            ENOSYS => Self::NoSys,
            ERANGE => Self::Range,
            EOPNOTSUPP => Self::OpNotSupp,
            EISCONN => Self::IsConn,
            ENOTCONN => Self::NotConn,
            ETIMEDOUT => Self::TimedOut,
            other => Self::Other(other),
        }
    }

    /// The positive errno value.
    pub fn errno(self) -> i32 {
        match self {
            Self::Perm => EPERM,
            Self::NoEnt => ENOENT,
            Self::Srch => ESRCH,
            Self::Io => EIO,
            Self::TooBig => E2BIG,
            Self::BadF => EBADF,
            Self::Again => EAGAIN,
            Self::NoMem => ENOMEM,
            Self::Access => EACCES,
            Self::Fault => EFAULT,
            Self::Busy => EBUSY,
            Self::Exist => EEXIST,
            Self::NoDev => ENODEV,
            Self::Inval => EINVAL,
            Self::NoSpc => ENOSPC,
            Self::NoSys => ENOSYS,
            Self::Range => ERANGE,
            Self::OpNotSupp => EOPNOTSUPP,
            Self::IsConn => EISCONN,
            Self::NotConn => ENOTCONN,
            Self::TimedOut => ETIMEDOUT,
            Self::Other(errno) => errno,
        }
    }
}

/// Turns a hypercall return value into `Ok(value)` (>= 0) or the errno it encodes.
pub fn check(rc: i64) -> Result<u64, XenError> {
    if rc >= 0 {
        Ok(rc as u64)
    } else {
        // Xen's errnos are small; anything that does not fit is still an error.
        let errno = rc.checked_neg().and_then(|e| i32::try_from(e).ok());
        Err(XenError::from_errno(errno.unwrap_or(i32::MAX)))
    }
}

impl fmt::Display for XenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Xen error {:?} (-{})", self, self.errno())
    }
}

impl core::error::Error for XenError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error type of the crate says what went wrong and is a `core::error::Error`.
    #[test]
    fn errors_display_their_cause() {
        use crate::byte_ring::RingError;
        use crate::grant::{BatchError, BatchFault, FreeError, GrantError, GrantStatus, MapError};
        use crate::xenstore::wire::{XsErrno, XsError};
        fn text(error: &dyn core::error::Error) -> String {
            error.to_string()
        }
        assert_eq!(text(&XenError::Inval), "Xen error Inval (-22)");
        assert_eq!(
            text(&XsError::Xenstored(XsErrno::Eacces)),
            "xenstored: EACCES"
        );
        assert_eq!(text(&XsError::TooBig), "xenstore: TooBig");
        assert_eq!(text(&RingError::Corrupt), "ring indices are corrupt");
        assert_eq!(
            text(&RingError::Timeout),
            "the peer made no progress in time"
        );
        assert_eq!(text(&FreeError::NotAllocated), "index not allocated");
        assert_eq!(text(&GrantError::Exhausted), "no free grant reference");
        assert_eq!(
            text(&MapError {
                fault: BatchFault::Entry {
                    index: 2,
                    status: GrantStatus::BadGntref
                },
                failed: 3,
                leaked: 0
            }),
            "grant map failed (entry 2: BadGntref): 3 entries not mapped, 0 left mapped"
        );
        assert_eq!(
            text(&BatchError {
                fault: BatchFault::Hypercall(XenError::Fault),
                failed: 4
            }),
            "grant batch failed (hypercall failed: Xen error Fault (-14)): 4 entries"
        );
    }

    #[test]
    fn errno_round_trip() {
        for errno in 1..=120 {
            assert_eq!(XenError::from_errno(errno).errno(), errno);
        }
    }

    #[test]
    fn check_maps_negative_returns() {
        assert_eq!(check(0), Ok(0));
        assert_eq!(check(7), Ok(7));
        assert_eq!(check(-22), Err(XenError::Inval));
        assert_eq!(check(-38), Err(XenError::NoSys));
        assert_eq!(check(-11), Err(XenError::Again));
        assert_eq!(check(-500), Err(XenError::Other(500)));
        assert_eq!(check(i64::MIN), Err(XenError::Other(i32::MAX)));
    }
}
