// SPDX-License-Identifier: MIT OR Apache-2.0
//! A small xenstored for host tests, serving the far side of a real ring page: a node
//! tree with permissions, watches (fired on registration and on changes), transactions
//! (EAGAIN on conflict or on request), injected errors, and a configurable number of
//! bytes moved per step so messages arrive split at arbitrary points.

use crate::abi::xs_wire::msg_type;
use crate::xenstore::ring::{REPLIES, REQUESTS};
use crate::xenstore::wire::{encode, split_strings, Header, Permission};
use crate::SharedMem;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::string::{String, ToString};
use std::vec::Vec;

#[derive(Clone, Debug, PartialEq)]
struct Node {
    value: Vec<u8>,
    perms: Vec<Permission>,
}

type Tree = BTreeMap<String, Node>;

pub struct FakeXenstored {
    mem: SharedMem,
    pub domid: u16,
    nodes: Tree,
    pub watches: Vec<(String, String)>,
    /// Transaction id -> (tree at start, working copy).
    transactions: HashMap<u32, (Tree, Tree)>,
    next_tx: u32,
    /// The next this many commits answer EAGAIN.
    pub eagain_commits: u32,
    /// The next request of this type answers this error name.
    pub fail_next: Option<(u32, &'static str)>,
    /// Bytes moved per step in each direction.
    pub chunk: usize,
    /// Put the watch events a request causes before its reply (xenstored may do either).
    pub events_before_reply: bool,
    input: Vec<u8>,
    output: VecDeque<u8>,
    pub requests: Vec<Header>,
    /// Bumped on every change of the tree (node generation for DIRECTORY_PART).
    generation: u64,
    /// After the next DIRECTORY_PART reply, write this node (a concurrent change).
    pub mutate_after_part: Option<String>,
}

impl FakeXenstored {
    pub fn new(mem: SharedMem) -> Self {
        let mut nodes = Tree::new();
        for path in ["/", "/local", "/local/domain", "/local/domain/1"] {
            nodes.insert(
                path.to_string(),
                Node {
                    value: Vec::new(),
                    perms: vec_perm(0),
                },
            );
        }
        Self {
            mem,
            domid: 1,
            nodes,
            watches: Vec::new(),
            transactions: HashMap::new(),
            next_tx: 1,
            eagain_commits: 0,
            fail_next: None,
            chunk: usize::MAX,
            events_before_reply: false,
            input: Vec::new(),
            output: VecDeque::new(),
            requests: Vec::new(),
            generation: 0,
            mutate_after_part: None,
        }
    }

    fn home(&self) -> String {
        std::format!("/local/domain/{}", self.domid)
    }

    fn absolute(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            std::format!("{}/{path}", self.home())
        }
    }

    /// Moves at most `chunk` bytes each way and handles complete requests. Returns
    /// whether anything moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        let mut buf = std::vec![0u8; self.chunk.min(4096)];
        let n = REQUESTS
            .consume(&self.mem, &mut buf)
            .expect("client corrupted req indices");
        if n > 0 {
            moved = true;
            self.input.extend_from_slice(&buf[..n]);
        }
        while self.input.len() >= 16 {
            let header = Header::decode(self.input[..16].try_into().unwrap());
            let total = 16 + header.len as usize;
            if self.input.len() < total {
                break;
            }
            let payload: Vec<u8> = self.input[16..total].to_vec();
            self.input.drain(..total);
            self.requests.push(header);
            self.handle(header, &payload);
        }
        let out: Vec<u8> = self
            .output
            .iter()
            .copied()
            .take(self.chunk.min(4096))
            .collect();
        if !out.is_empty() {
            let n = REPLIES
                .produce(&self.mem, &out)
                .expect("client corrupted rsp indices");
            self.output.drain(..n);
            moved |= n > 0;
        }
        moved
    }

    fn queue(&mut self, msg_type: u32, req_id: u32, tx_id: u32, payload: &[u8]) {
        let bytes = encode(msg_type, req_id, tx_id, &[payload]).unwrap();
        self.output.extend(bytes);
    }

    /// dom0 writing a key: changes the tree and fires watches.
    pub fn external_write(&mut self, path: &str, value: &[u8]) {
        let path = self.absolute(path);
        let mut tree = std::mem::take(&mut self.nodes);
        write_node(&mut tree, &path, value, 0);
        self.nodes = tree;
        self.generation += 1;
        let events = self.watch_events(&[path]);
        for payload in events {
            self.queue(msg_type::WATCH_EVENT, 0, 0, &payload);
        }
    }

    pub fn value(&self, path: &str) -> Option<Vec<u8>> {
        self.nodes
            .get(&self.absolute(path))
            .map(|n| n.value.clone())
    }

    fn watch_events(&self, changed: &[String]) -> Vec<Vec<u8>> {
        let mut events = Vec::new();
        for path in changed {
            for (wpath, token) in &self.watches {
                let abs = self.absolute(wpath);
                if path == &abs || path.starts_with(&std::format!("{abs}/")) || abs == "/" {
                    let shown = if wpath.starts_with('/') {
                        path.clone()
                    } else {
                        path.strip_prefix(&std::format!("{}/", self.home()))
                            .unwrap_or(path)
                            .to_string()
                    };
                    events.push(std::format!("{shown}\0{token}\0").into_bytes());
                }
            }
        }
        events
    }

    fn handle(&mut self, h: Header, payload: &[u8]) {
        let args: Vec<String> = split_strings(payload)
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if let Some((kind, name)) = self.fail_next {
            if kind == h.msg_type {
                self.fail_next = None;
                return self.queue(
                    msg_type::ERROR,
                    h.req_id,
                    h.tx_id,
                    std::format!("{name}\0").as_bytes(),
                );
            }
        }
        let result = self.execute(h, payload, &args);
        if h.msg_type == msg_type::DIRECTORY_PART {
            if let Some(node) = self.mutate_after_part.take() {
                let value = self.generation.to_string();
                self.external_write(&node, value.as_bytes());
            }
        }
        let (reply, changed) = match result {
            Ok(ok) => ok,
            Err(name) => {
                return self.queue(
                    msg_type::ERROR,
                    h.req_id,
                    h.tx_id,
                    std::format!("{name}\0").as_bytes(),
                );
            }
        };
        let mut events = self.watch_events(&changed);
        if h.msg_type == msg_type::WATCH {
            // xenstored fires a new watch once, right away.
            events.push(std::format!("{}\0{}\0", args[0], args[1]).into_bytes());
        }
        if !self.events_before_reply {
            self.queue(h.msg_type, h.req_id, h.tx_id, &reply);
        }
        for event in events {
            self.queue(msg_type::WATCH_EVENT, 0, 0, &event);
        }
        if self.events_before_reply {
            self.queue(h.msg_type, h.req_id, h.tx_id, &reply);
        }
    }

    /// Returns the reply payload and the paths that changed, or an error name.
    fn execute(
        &mut self,
        h: Header,
        payload: &[u8],
        args: &[String],
    ) -> Result<(Vec<u8>, Vec<String>), &'static str> {
        let ok = b"OK\0".to_vec();
        let path = args.first().map(|p| self.absolute(p)).unwrap_or_default();
        if h.msg_type == msg_type::TRANSACTION_START {
            let id = self.next_tx;
            self.next_tx += 1;
            self.transactions
                .insert(id, (self.nodes.clone(), self.nodes.clone()));
            return Ok((std::format!("{id}\0").into_bytes(), Vec::new()));
        }
        if h.msg_type == msg_type::TRANSACTION_END {
            let (base, work) = self.transactions.remove(&h.tx_id).ok_or("ENOENT")?;
            if args.first().map(String::as_str) != Some("T") {
                return Ok((ok, Vec::new()));
            }
            if self.eagain_commits > 0 {
                self.eagain_commits -= 1;
                return Err("EAGAIN");
            }
            if base != self.nodes {
                return Err("EAGAIN");
            }
            let changed = work
                .iter()
                .filter(|(k, v)| base.get(*k) != Some(v))
                .map(|(k, _)| k.clone())
                .collect();
            self.nodes = work;
            self.generation += 1;
            return Ok((ok, changed));
        }
        if h.msg_type == msg_type::WATCH {
            self.watches.push((args[0].clone(), args[1].clone()));
            return Ok((ok, Vec::new()));
        }
        if h.msg_type == msg_type::RESET_WATCHES {
            self.watches.clear();
            return Ok((ok, Vec::new()));
        }
        if h.msg_type == msg_type::UNWATCH {
            let before = self.watches.len();
            self.watches
                .retain(|(p, t)| !(p == &args[0] && t == &args[1]));
            return if self.watches.len() < before {
                Ok((ok, Vec::new()))
            } else {
                Err("ENOENT")
            };
        }
        if h.msg_type == msg_type::GET_DOMAIN_PATH {
            return Ok((
                std::format!("/local/domain/{}\0", args[0]).into_bytes(),
                Vec::new(),
            ));
        }
        let in_tx = h.tx_id != 0;
        let mut tree = if in_tx {
            self.transactions.get(&h.tx_id).ok_or("EINVAL")?.1.clone()
        } else {
            self.nodes.clone()
        };
        let (reply, changed) = match h.msg_type {
            msg_type::READ => (tree.get(&path).ok_or("ENOENT")?.value.clone(), Vec::new()),
            msg_type::WRITE => {
                let value = &payload[payload.iter().position(|&b| b == 0).unwrap() + 1..];
                write_node(&mut tree, &path, value, self.domid);
                (ok, std::vec![path])
            }
            msg_type::MKDIR => {
                if !tree.contains_key(&path) {
                    write_node(&mut tree, &path, b"", self.domid);
                }
                (ok, std::vec![path])
            }
            msg_type::RM => {
                if !tree.contains_key(&path) {
                    return Err("ENOENT");
                }
                let prefix = std::format!("{path}/");
                tree.retain(|k, _| k != &path && !k.starts_with(&prefix));
                (ok, std::vec![path])
            }
            msg_type::DIRECTORY => {
                let out = children(&tree, &path).ok_or("ENOENT")?;
                if out.len() > crate::abi::xs_wire::XENSTORE_PAYLOAD_MAX {
                    return Err("E2BIG");
                }
                (out, Vec::new())
            }
            msg_type::DIRECTORY_PART => {
                let list = children(&tree, &path).ok_or("ENOENT")?;
                let offset: usize = args[1].parse().map_err(|_| "EINVAL")?;
                let offset = offset.min(list.len());
                let mut out = std::format!("{}\0", self.generation).into_bytes();
                // Whole names only, as many as fit; the last piece gets the extra NUL.
                let max = crate::abi::xs_wire::XENSTORE_PAYLOAD_MAX - out.len() - 1;
                let mut end = offset;
                while end < list.len() {
                    let next = end + list[end..].iter().position(|&b| b == 0).unwrap() + 1;
                    if next - offset > max {
                        break;
                    }
                    end = next;
                }
                out.extend_from_slice(&list[offset..end]);
                if end == list.len() {
                    out.push(0);
                }
                (out, Vec::new())
            }
            msg_type::GET_PERMS => {
                let node = tree.get(&path).ok_or("ENOENT")?;
                let mut out = Vec::new();
                for perm in &node.perms {
                    out.extend_from_slice(perm.encode().as_bytes());
                    out.push(0);
                }
                (out, Vec::new())
            }
            msg_type::SET_PERMS => {
                let perms: Result<Vec<Permission>, _> = args[1..]
                    .iter()
                    .map(|a| Permission::parse(a.as_bytes()))
                    .collect();
                let node = tree.get_mut(&path).ok_or("ENOENT")?;
                node.perms = perms.map_err(|_| "EINVAL")?;
                (ok, std::vec![path])
            }
            _ => return Err("ENOSYS"),
        };
        if in_tx {
            self.transactions.get_mut(&h.tx_id).unwrap().1 = tree;
            Ok((reply, Vec::new()))
        } else {
            if !changed.is_empty() {
                self.generation += 1;
            }
            self.nodes = tree;
            Ok((reply, changed))
        }
    }
}

/// The NUL-terminated names of `path`'s children, `None` if the node does not exist.
fn children(tree: &Tree, path: &str) -> Option<Vec<u8>> {
    tree.get(path)?;
    let prefix = if path == "/" {
        "/".to_string()
    } else {
        std::format!("{path}/")
    };
    let mut out = Vec::new();
    for key in tree.keys() {
        if let Some(name) = key.strip_prefix(&prefix) {
            if !name.is_empty() && !name.contains('/') {
                out.extend_from_slice(name.as_bytes());
                out.push(0);
            }
        }
    }
    Some(out)
}

fn vec_perm(owner: u16) -> Vec<Permission> {
    std::vec![Permission {
        domid: owner,
        access: crate::xenstore::wire::Access::None
    }]
}

/// Writes a node, creating missing ancestors (as xenstored does).
fn write_node(tree: &mut Tree, path: &str, value: &[u8], owner: u16) {
    let mut at = 0;
    while let Some(slash) = path[at + 1..].find('/') {
        let parent = &path[..at + 1 + slash];
        tree.entry(parent.to_string()).or_insert_with(|| Node {
            value: Vec::new(),
            perms: vec_perm(owner),
        });
        at += 1 + slash;
    }
    let node = tree.entry(path.to_string()).or_insert_with(|| Node {
        value: Vec::new(),
        perms: vec_perm(owner),
    });
    node.value = value.to_vec();
}
