//! The few xenstore operations negotiation needs. The kernel adapts the client of
//! [`crate::xenstore`] to this trait; tests use the in-memory store in `fake`.

use alloc::string::String;
use alloc::vec::Vec;

/// A transaction id; [`NO_TRANSACTION`] outside transactions.
pub type TxId = u32;
pub const NO_TRANSACTION: TxId = 0;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// `ENOENT`: the node does not exist.
    NotFound,
    /// `EAGAIN` on transaction end: another writer interfered; redo the transaction.
    Again,
    /// Anything else (permission, ring failure, protocol error).
    Failed(String),
}

impl core::fmt::Display for StoreError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StoreError::NotFound => f.write_str("no such node"),
            StoreError::Again => f.write_str("transaction conflict (EAGAIN)"),
            StoreError::Failed(what) => f.write_str(what),
        }
    }
}

impl core::error::Error for StoreError {}

pub trait XenStore {
    fn read(&mut self, tx: TxId, path: &str) -> Result<String, StoreError>;
    fn write(&mut self, tx: TxId, path: &str, value: &str) -> Result<(), StoreError>;
    fn mkdir(&mut self, tx: TxId, path: &str) -> Result<(), StoreError>;
    /// Remove a node and everything below it.
    fn rm(&mut self, tx: TxId, path: &str) -> Result<(), StoreError>;
    /// Names of the children of `path`.
    fn directory(&mut self, tx: TxId, path: &str) -> Result<Vec<String>, StoreError>;
    fn transaction_start(&mut self) -> Result<TxId, StoreError>;
    fn transaction_end(&mut self, tx: TxId, commit: bool) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn store_errors_say_what_failed() {
        assert_eq!(StoreError::NotFound.to_string(), "no such node");
        assert_eq!(
            StoreError::Again.to_string(),
            "transaction conflict (EAGAIN)"
        );
        assert_eq!(
            StoreError::Failed("read a/b: Broken".into()).to_string(),
            "read a/b: Broken"
        );
    }
}
