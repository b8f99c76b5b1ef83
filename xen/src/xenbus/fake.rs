// SPDX-License-Identifier: MIT OR Apache-2.0
//! An in-memory xenstore with transactions (buffered until commit, optionally failing
//! with `EAGAIN`) and removal of subtrees.

use std::collections::{BTreeMap, HashMap};

use super::store::{StoreError, TxId, XenStore, NO_TRANSACTION};

#[derive(Debug, Default)]
pub struct MemStore {
    nodes: BTreeMap<String, String>,
    transactions: HashMap<TxId, BTreeMap<String, Option<String>>>,
    next_tx: TxId,
    /// Commits to refuse with `EAGAIN` before accepting one.
    pub refuse_commits: usize,
    /// Committed writes, in order (path, value).
    pub writes: Vec<(String, String)>,
    /// Nodes whose reads fail as xenstored's EACCES does (e.g. a dying domain's).
    pub unreadable: Vec<String>,
    /// Transactions committed.
    pub commits: usize,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Set a node from outside (the toolstack or the frontend).
    pub fn set(&mut self, path: &str, value: &str) {
        self.nodes.insert(path.to_string(), value.to_string());
    }

    pub fn get(&self, path: &str) -> Option<&str> {
        self.nodes.get(path).map(String::as_str)
    }

    /// Remove a subtree from outside.
    pub fn remove_tree(&mut self, path: &str) {
        let prefix = format!("{path}/");
        self.nodes
            .retain(|key, _| key != path && !key.starts_with(&prefix));
    }

    fn apply(&mut self, path: &str, value: Option<String>) {
        match value {
            Some(value) => {
                self.writes.push((path.to_string(), value.clone()));
                self.nodes.insert(path.to_string(), value);
            }
            None => self.remove_tree(path),
        }
    }

    fn stage(&mut self, tx: TxId, path: &str, value: Option<String>) -> Result<(), StoreError> {
        if tx == NO_TRANSACTION {
            self.apply(path, value);
            return Ok(());
        }
        let staged = self
            .transactions
            .get_mut(&tx)
            .ok_or(StoreError::Failed("no such transaction".into()))?;
        staged.insert(path.to_string(), value);
        Ok(())
    }
}

impl XenStore for MemStore {
    fn read(&mut self, tx: TxId, path: &str) -> Result<String, StoreError> {
        if self.unreadable.iter().any(|p| p == path) {
            return Err(StoreError::Failed(format!("read {path}: EACCES")));
        }
        if let Some(staged) = self.transactions.get(&tx).and_then(|t| t.get(path)) {
            return staged.clone().ok_or(StoreError::NotFound);
        }
        self.nodes.get(path).cloned().ok_or(StoreError::NotFound)
    }

    fn write(&mut self, tx: TxId, path: &str, value: &str) -> Result<(), StoreError> {
        self.stage(tx, path, Some(value.to_string()))
    }

    fn mkdir(&mut self, tx: TxId, path: &str) -> Result<(), StoreError> {
        if self.nodes.contains_key(path) {
            return Ok(());
        }
        self.stage(tx, path, Some(String::new()))
    }

    fn rm(&mut self, tx: TxId, path: &str) -> Result<(), StoreError> {
        self.stage(tx, path, None)
    }

    fn directory(&mut self, _tx: TxId, path: &str) -> Result<Vec<String>, StoreError> {
        let prefix = format!("{path}/");
        let mut children: Vec<String> = self
            .nodes
            .keys()
            .filter_map(|key| key.strip_prefix(&prefix))
            .map(|rest| rest.split('/').next().unwrap_or(rest).to_string())
            .collect();
        children.dedup();
        if children.is_empty() && !self.nodes.contains_key(path) {
            return Err(StoreError::NotFound);
        }
        Ok(children)
    }

    fn transaction_start(&mut self) -> Result<TxId, StoreError> {
        self.next_tx += 1;
        self.transactions.insert(self.next_tx, BTreeMap::new());
        Ok(self.next_tx)
    }

    fn transaction_end(&mut self, tx: TxId, commit: bool) -> Result<(), StoreError> {
        let staged = self
            .transactions
            .remove(&tx)
            .ok_or(StoreError::Failed("no such transaction".into()))?;
        if !commit {
            return Ok(());
        }
        if self.refuse_commits > 0 {
            self.refuse_commits -= 1;
            return Err(StoreError::Again);
        }
        for (path, value) in staged {
            self.apply(&path, value);
        }
        self.commits += 1;
        Ok(())
    }
}
