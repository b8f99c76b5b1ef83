// SPDX-License-Identifier: MIT OR Apache-2.0
//! Errors where Linux's backends leave them. `xenbus_dev_error`/`xenbus_dev_fatal` write
//! "<errno> <message>" to `error/<device node>/error` under the backend domain's own
//! home (`/local/domain/<backend>/error/backend/vbd/<fe>/<dev>/error`), which the
//! toolstack's tools read; blkdom writes that node next to the device's own
//! `hotplug-error`/`error`, and removes it with the device.

use alloc::format;
use alloc::string::String;

use super::keys::ERROR;
use super::store::StoreError;

/// The errno values the messages carry: Xen's `public/errno.h`, whose numbers are
/// Linux's (written positive, as Linux writes them).
pub use crate::abi::errno;

/// An error that has a Linux errno: the number before its message in the error node.
pub trait Errno {
    fn errno(&self) -> i32;
}

/// Hooks that cannot fail (tests, the negotiation fuzz target).
impl Errno for core::convert::Infallible {
    fn errno(&self) -> i32 {
        match *self {}
    }
}

impl Errno for StoreError {
    fn errno(&self) -> i32 {
        match self {
            StoreError::NotFound => errno::ENOENT,
            StoreError::Again => errno::EAGAIN,
            StoreError::Failed(_) => errno::EIO,
        }
    }
}

/// The error directory of the backend at `backend_path`
/// (`/local/domain/<be>/backend/...` -> `/local/domain/<be>/error/backend/...`); `None`
/// for a path not under a domain's home.
pub fn error_directory(backend_path: &str) -> Option<String> {
    let rest = backend_path.strip_prefix("/local/domain/")?;
    let (domid, device) = rest.split_once('/')?;
    if domid.is_empty() || !domid.bytes().all(|b| b.is_ascii_digit()) || device.is_empty() {
        return None;
    }
    Some(format!("/local/domain/{domid}/error/{device}"))
}

/// The node Linux writes for the backend at `backend_path`: `<error directory>/error`.
pub fn error_node(backend_path: &str) -> Option<String> {
    error_directory(backend_path).map(|dir| format!("{dir}/{ERROR}"))
}

/// What the node holds: "<errno> <message>", as `xenbus_va_dev_error` formats it.
pub fn error_text(errno: i32, message: &str) -> String {
    format!("{errno} {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_node_is_under_the_backend_domains_home() {
        assert_eq!(
            error_node("/local/domain/1/backend/vbd/5/51712").as_deref(),
            Some("/local/domain/1/error/backend/vbd/5/51712/error")
        );
        assert_eq!(
            error_directory("/local/domain/17/backend/vbd/5/768").as_deref(),
            Some("/local/domain/17/error/backend/vbd/5/768")
        );
        for not_ours in [
            "backend/vbd/5/51712",
            "/local/domain/x/backend",
            "/local/domain/1",
        ] {
            assert_eq!(error_node(not_ours), None, "{not_ours}");
        }
    }

    #[test]
    fn error_text_is_errno_then_message() {
        assert_eq!(
            error_text(errno::EINVAL, "params \"nvme:x\": bad"),
            "22 params \"nvme:x\": bad"
        );
        assert_eq!(StoreError::NotFound.errno(), 2);
        assert_eq!(StoreError::Again.errno(), 11);
        assert_eq!(StoreError::Failed("EACCES".into()).errno(), 5);
    }
}
