// SPDX-License-Identifier: MIT OR Apache-2.0
//! The few xenstore operations negotiation needs. The kernel adapts the client of
//! [`crate::xenstore`] to this trait; tests use the in-memory store in `fake`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::xenstore::client::DEFAULT_TRANSACTION_ATTEMPTS;

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

/// Writes `keys` under `directory` in one transaction (redone on `EAGAIN`).
pub fn write_in_transaction(
    store: &mut dyn XenStore,
    directory: &str,
    keys: &[(&str, String)],
) -> Result<(), StoreError> {
    for _ in 0..DEFAULT_TRANSACTION_ATTEMPTS {
        let tx = store.transaction_start()?;
        let written: Result<(), StoreError> = keys
            .iter()
            .try_for_each(|(key, value)| store.write(tx, &format!("{directory}/{key}"), value));
        if let Err(error) = written {
            let _ = store.transaction_end(tx, false);
            return Err(error);
        }
        match store.transaction_end(tx, true) {
            Ok(()) => return Ok(()),
            Err(StoreError::Again) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(StoreError::Again)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xenbus::fake::MemStore;
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

    #[test]
    fn keys_are_written_in_one_transaction_redone_on_eagain() {
        let mut store = MemStore::new();
        store.refuse_commits = 2;
        let keys = [("a", "1".to_string()), ("b", "2".to_string())];
        assert_eq!(write_in_transaction(&mut store, "dev/0", &keys), Ok(()));
        assert_eq!(store.commits, 1);
        assert_eq!(
            (store.get("dev/0/a"), store.get("dev/0/b")),
            (Some("1"), Some("2"))
        );
        store.refuse_commits = DEFAULT_TRANSACTION_ATTEMPTS as usize;
        assert_eq!(
            write_in_transaction(&mut store, "dev/1", &keys),
            Err(StoreError::Again)
        );
        assert_eq!((store.commits, store.get("dev/1/a")), (1, None));
    }
}
