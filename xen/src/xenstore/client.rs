// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore client: one request in flight at a time; replies are matched by request
//! id, watch events that arrive in between are queued for [`XenstoreClient::take_watch_event`].

use super::ring::{RingError, XenstoreRing};
use super::wire::*;
use crate::abi::xs_wire::{msg_type, XENSTORE_PAYLOAD_MAX, XSD_SOCKMSG_SIZE};
use crate::abi::DomId;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;

/// A transaction id; [`Transaction::NONE`] outside transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transaction(pub u32);

impl Transaction {
    pub const NONE: Transaction = Transaction(0);
}

/// Assembles messages from a byte stream that may deliver any number of bytes at a time.
#[derive(Debug, Default)]
struct MessageReader {
    header: [u8; XSD_SOCKMSG_SIZE],
    header_len: usize,
    /// Set once the header is complete.
    current: Option<Header>,
    payload: Vec<u8>,
}

impl MessageReader {
    /// Reads what is available; returns a complete message, or `None` if the ring ran
    /// dry first (the partial message is kept for the next call).
    fn poll<R: XenstoreRing + ?Sized>(&mut self, ring: &mut R) -> Result<Option<Message>, XsError> {
        loop {
            let Some(header) = self.current else {
                let n = ring.read_some(&mut self.header[self.header_len..])?;
                if n == 0 {
                    return Ok(None);
                }
                self.header_len += n;
                if self.header_len == XSD_SOCKMSG_SIZE {
                    let header = Header::decode(&self.header);
                    if header.len as usize > XENSTORE_PAYLOAD_MAX {
                        return Err(XsError::Protocol("reply longer than XENSTORE_PAYLOAD_MAX"));
                    }
                    self.current = Some(header);
                    self.payload = Vec::with_capacity(header.len as usize);
                }
                continue;
            };
            let want = header.len as usize - self.payload.len();
            if want > 0 {
                let mut chunk = [0u8; 256];
                let take = want.min(chunk.len());
                let n = ring.read_some(&mut chunk[..take])?;
                if n == 0 {
                    return Ok(None);
                }
                self.payload.extend_from_slice(&chunk[..n]);
                continue;
            }
            self.current = None;
            self.header_len = 0;
            let payload = core::mem::take(&mut self.payload);
            return Ok(Some(Message { header, payload }));
        }
    }
}

/// A xenstore connection over a [`XenstoreRing`].
#[derive(Debug)]
pub struct XenstoreClient<R> {
    ring: R,
    next_req_id: u32,
    reader: MessageReader,
    watch_events: VecDeque<WatchEvent>,
    /// Events dropped because `MAX_QUEUED_WATCH_EVENTS` were queued already.
    watch_events_lost: bool,
    broken: bool,
}

/// Watch events queued at most. A guest that rewrites its own frontend nodes in a loop
/// makes xenstored send an event per write; past this many unread ones the client drops
/// them and says so (`take_lost_watch_events`): the owner then looks at everything it
/// watches once, which is what the dropped events would have asked for at most.
pub const MAX_QUEUED_WATCH_EVENTS: usize = 256;

/// Transactions retried on `EAGAIN` at most this often by default.
pub const DEFAULT_TRANSACTION_ATTEMPTS: u32 = 16;

impl<R: XenstoreRing> XenstoreClient<R> {
    pub fn new(ring: R) -> Self {
        Self {
            ring,
            next_req_id: 1,
            reader: MessageReader::default(),
            watch_events: VecDeque::new(),
            watch_events_lost: false,
            broken: false,
        }
    }

    pub fn ring_mut(&mut self) -> &mut R {
        &mut self.ring
    }

    /// A failure that desynchronised the stream makes every later call fail fast.
    fn fail<T>(&mut self, e: XsError) -> Result<T, XsError> {
        if matches!(e, XsError::Protocol(_) | XsError::Ring(RingError::Corrupt)) {
            self.broken = true;
        }
        Err(e)
    }

    /// Drains complete messages without blocking: queues watch events, returns the first
    /// other message (a reply) if one was complete.
    fn pump(&mut self) -> Result<Option<Message>, XsError> {
        loop {
            let msg = match self.reader.poll(&mut self.ring) {
                Ok(Some(msg)) => msg,
                Ok(None) => return Ok(None),
                Err(e) => return self.fail(e),
            };
            // We consumed ring space: xenstored may be waiting to write more.
            self.ring.notify();
            if msg.header.msg_type == msg_type::WATCH_EVENT {
                match WatchEvent::parse(&msg.payload) {
                    Ok(_) if self.watch_events.len() >= MAX_QUEUED_WATCH_EVENTS => {
                        self.watch_events_lost = true;
                    }
                    Ok(event) => self.watch_events.push_back(event),
                    Err(e) => return self.fail(e),
                }
                continue;
            }
            return Ok(Some(msg));
        }
    }

    fn send_all(&mut self, mut bytes: &[u8]) -> Result<(), XsError> {
        while !bytes.is_empty() {
            let n = match self.ring.write_some(bytes) {
                Ok(n) => n,
                // A partly written request leaves the stream unusable.
                Err(e) => return self.fail_send(e),
            };
            bytes = &bytes[n..];
            if n > 0 {
                self.ring.notify();
                continue;
            }
            if let Some(reply) = self.pump()? {
                // Nothing is outstanding: a reply now is a stale one (timed out earlier).
                drop(reply);
            }
            if let Err(e) = self.ring.wait() {
                return self.fail_send(e);
            }
        }
        Ok(())
    }

    fn fail_send<T>(&mut self, e: RingError) -> Result<T, XsError> {
        self.broken = true;
        Err(XsError::Ring(e))
    }

    /// Sends one request and returns the reply payload.
    fn request(&mut self, kind: u32, tx: Transaction, parts: &[&[u8]]) -> Result<Vec<u8>, XsError> {
        if self.broken {
            return Err(XsError::Broken);
        }
        let req_id = self.next_req_id;
        self.next_req_id = self.next_req_id.wrapping_add(1);
        let bytes = encode(kind, req_id, tx.0, parts)?;
        self.send_all(&bytes)?;
        loop {
            match self.pump()? {
                Some(msg) if msg.header.req_id != req_id => continue, // stale reply
                Some(msg) if msg.header.msg_type == msg_type::ERROR => {
                    return Err(XsError::Xenstored(XsErrno::from_payload(&msg.payload)));
                }
                Some(msg) if msg.header.msg_type != kind => {
                    return Err(XsError::Protocol("reply of another type"));
                }
                Some(msg) => return Ok(msg.payload),
                None => self.ring.wait()?,
            }
        }
    }

    fn path_request(
        &mut self,
        kind: u32,
        tx: Transaction,
        path: &str,
        rest: &[&[u8]],
    ) -> Result<Vec<u8>, XsError> {
        validate_path(path)?;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 + rest.len());
        parts.push(path.as_bytes());
        parts.push(b"\0");
        parts.extend_from_slice(rest);
        self.request(kind, tx, &parts)
    }

    pub fn read(&mut self, tx: Transaction, path: &str) -> Result<Vec<u8>, XsError> {
        self.path_request(msg_type::READ, tx, path, &[])
    }

    /// Reads a text value (trailing NULs some writers leave are dropped).
    pub fn read_string(&mut self, tx: Transaction, path: &str) -> Result<String, XsError> {
        let mut value = self.read(tx, path)?;
        while value.last() == Some(&0) {
            value.pop();
        }
        String::from_utf8(value).map_err(|_| XsError::BadValue)
    }

    /// Reads a decimal number.
    pub fn read_u64(&mut self, tx: Transaction, path: &str) -> Result<u64, XsError> {
        self.read_string(tx, path)?
            .trim()
            .parse()
            .map_err(|_| XsError::BadValue)
    }

    pub fn write(&mut self, tx: Transaction, path: &str, value: &[u8]) -> Result<(), XsError> {
        self.path_request(msg_type::WRITE, tx, path, &[value])
            .map(drop)
    }

    pub fn mkdir(&mut self, tx: Transaction, path: &str) -> Result<(), XsError> {
        self.path_request(msg_type::MKDIR, tx, path, &[]).map(drop)
    }

    /// Removes a node and everything below it.
    pub fn rm(&mut self, tx: Transaction, path: &str) -> Result<(), XsError> {
        self.path_request(msg_type::RM, tx, path, &[]).map(drop)
    }

    /// The names of a node's children. Lists longer than one payload (xenstored answers
    /// `E2BIG`) are fetched in pieces with `XS_DIRECTORY_PART`.
    pub fn directory(&mut self, tx: Transaction, path: &str) -> Result<Vec<String>, XsError> {
        let payload = match self.path_request(msg_type::DIRECTORY, tx, path, &[]) {
            Err(e) if e.is(XsErrno::E2big) => self.directory_parts(tx, path)?,
            other => other?,
        };
        split_strings(&payload)
            .into_iter()
            .map(|name| {
                String::from_utf8(name.to_vec()).map_err(|_| XsError::Protocol("non-UTF-8 name"))
            })
            .collect()
    }

    /// Reassembles a long child list: each reply is `<generation>\0` plus the list from
    /// the requested byte offset; the last piece ends with an extra NUL. A generation
    /// change between pieces (the node changed) starts over.
    fn directory_parts(&mut self, tx: Transaction, path: &str) -> Result<Vec<u8>, XsError> {
        const MAX_RESTARTS: u32 = 8;
        let mut list = Vec::new();
        let mut generation = Vec::new();
        let mut restarts = 0;
        loop {
            let offset = alloc::format!("{}", list.len());
            let reply = self.path_request(
                msg_type::DIRECTORY_PART,
                tx,
                path,
                &[offset.as_bytes(), b"\0"],
            )?;
            let gen_end = reply
                .iter()
                .position(|&b| b == 0)
                .ok_or(XsError::Protocol("directory part without generation"))?;
            let (gen, rest) = (&reply[..gen_end], &reply[gen_end + 1..]);
            if list.is_empty() {
                generation = gen.to_vec();
            } else if gen != generation.as_slice() {
                restarts += 1;
                if restarts > MAX_RESTARTS {
                    return Err(XsError::Xenstored(XsErrno::Eagain));
                }
                list.clear();
                continue;
            }
            if rest.is_empty() {
                return Err(XsError::Protocol("empty directory part"));
            }
            list.extend_from_slice(rest);
            // Done when the list ends with the terminating empty string ("\0\0", or a
            // lone "\0" for no children).
            if list.len() <= 1 || list.ends_with(&[0, 0]) {
                list.pop();
                return Ok(list);
            }
        }
    }

    pub fn get_perms(&mut self, tx: Transaction, path: &str) -> Result<Vec<Permission>, XsError> {
        let payload = self.path_request(msg_type::GET_PERMS, tx, path, &[])?;
        split_strings(&payload)
            .into_iter()
            .map(Permission::parse)
            .collect()
    }

    /// Sets the permissions (the first entry is the owner and the default access).
    pub fn set_perms(
        &mut self,
        tx: Transaction,
        path: &str,
        perms: &[Permission],
    ) -> Result<(), XsError> {
        if perms.is_empty() {
            return Err(XsError::BadValue);
        }
        let encoded: Vec<String> = perms.iter().map(|p| p.encode()).collect();
        let mut parts: Vec<&[u8]> = Vec::with_capacity(encoded.len() * 2);
        for perm in &encoded {
            parts.push(perm.as_bytes());
            parts.push(b"\0");
        }
        self.path_request(msg_type::SET_PERMS, tx, path, &parts)
            .map(drop)
    }

    /// Watches `path` (and everything below). xenstored fires once right away; events
    /// arrive through [`Self::take_watch_event`] / [`Self::wait_watch_event`].
    pub fn watch(&mut self, path: &str, token: &str) -> Result<(), XsError> {
        Self::check_token(token)?;
        self.path_request(
            msg_type::WATCH,
            Transaction::NONE,
            path,
            &[token.as_bytes(), b"\0"],
        )
        .map(drop)
    }

    pub fn unwatch(&mut self, path: &str, token: &str) -> Result<(), XsError> {
        Self::check_token(token)?;
        self.path_request(
            msg_type::UNWATCH,
            Transaction::NONE,
            path,
            &[token.as_bytes(), b"\0"],
        )
        .map(drop)
    }

    /// `XS_RESET_WATCHES`: xenstored drops every watch the domain holds. A live
    /// upgrade's new image sends it first (the old image's watches are not its own),
    /// then forgets the events of those watches already read or still in the ring;
    /// returns how many it forgot.
    pub fn reset_watches(&mut self) -> Result<usize, XsError> {
        // xenstored answers in order: every event of the dropped watches came before the
        // reply, and was queued while it was read.
        self.request(msg_type::RESET_WATCHES, Transaction::NONE, &[b"\0"])?;
        let forgotten = self.watch_events.len();
        self.watch_events.clear();
        self.watch_events_lost = false;
        Ok(forgotten)
    }

    fn check_token(token: &str) -> Result<(), XsError> {
        if token.is_empty() || token.as_bytes().contains(&0) {
            Err(XsError::BadValue)
        } else {
            Ok(())
        }
    }

    /// The next queued watch event, reading the ring without blocking first.
    pub fn take_watch_event(&mut self) -> Result<Option<WatchEvent>, XsError> {
        if self.watch_events.is_empty() && !self.broken {
            // No request is outstanding, so anything else complete is a stale reply.
            while self.pump()?.is_some() {}
        }
        Ok(self.watch_events.pop_front())
    }

    /// Whether watch events were dropped (the queue held `MAX_QUEUED_WATCH_EVENTS`) since
    /// the last call: the caller is to re-read everything it watches.
    pub fn take_lost_watch_events(&mut self) -> bool {
        core::mem::take(&mut self.watch_events_lost)
    }

    /// Whether watch events are queued here already: read off the ring while waiting for
    /// a reply, after that wait consumed their event channel kick. A caller that sleeps
    /// until the next kick would leave them unseen until something else wakes it.
    pub fn has_watch_events(&self) -> bool {
        !self.watch_events.is_empty()
    }

    /// Blocks (through the ring's `wait`) until a watch event arrives.
    pub fn wait_watch_event(&mut self) -> Result<WatchEvent, XsError> {
        loop {
            if let Some(event) = self.take_watch_event()? {
                return Ok(event);
            }
            if self.broken {
                return Err(XsError::Broken);
            }
            self.ring.wait()?;
        }
    }

    /// Hands every queued watch event to `handler`; returns how many.
    pub fn dispatch_watch_events(
        &mut self,
        mut handler: impl FnMut(&WatchEvent),
    ) -> Result<usize, XsError> {
        let mut count = 0;
        while let Some(event) = self.take_watch_event()? {
            handler(&event);
            count += 1;
        }
        Ok(count)
    }

    pub fn transaction_start(&mut self) -> Result<Transaction, XsError> {
        let payload = self.request(msg_type::TRANSACTION_START, Transaction::NONE, &[b"\0"])?;
        let text = split_strings(&payload).into_iter().next().unwrap_or(&[]);
        core::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse().ok())
            .filter(|&id| id != 0)
            .map(Transaction)
            .ok_or(XsError::Protocol("bad transaction id"))
    }

    /// Commits (`commit = true`) or aborts. A commit answers `EAGAIN` when another
    /// writer got in between: run the transaction again.
    pub fn transaction_end(&mut self, tx: Transaction, commit: bool) -> Result<(), XsError> {
        let flag: &[u8] = if commit { b"T\0" } else { b"F\0" };
        self.request(msg_type::TRANSACTION_END, tx, &[flag])
            .map(drop)
    }

    /// Runs `body` in a transaction and commits, starting over on `EAGAIN` (at commit or
    /// inside the body) up to `attempts` times. Any other error aborts the transaction
    /// and is returned.
    pub fn transaction<T>(
        &mut self,
        attempts: u32,
        mut body: impl FnMut(&mut Self, Transaction) -> Result<T, XsError>,
    ) -> Result<T, XsError> {
        for _ in 0..attempts {
            let tx = self.transaction_start()?;
            let value = match body(self, tx) {
                Ok(value) => value,
                Err(e) => {
                    // Best effort: the transaction is abandoned either way.
                    let _ = self.transaction_end(tx, false);
                    if e.is(XsErrno::Eagain) {
                        continue;
                    }
                    return Err(e);
                }
            };
            match self.transaction_end(tx, true) {
                Ok(()) => return Ok(value),
                Err(e) if e.is(XsErrno::Eagain) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(XsError::RetriesExhausted(attempts))
    }

    /// `/local/domain/<domid>` as xenstored names it.
    pub fn get_domain_path(&mut self, domid: DomId) -> Result<String, XsError> {
        let id = alloc::format!("{domid}");
        let payload = self.request(
            msg_type::GET_DOMAIN_PATH,
            Transaction::NONE,
            &[id.as_bytes(), b"\0"],
        )?;
        let text = split_strings(&payload).into_iter().next().unwrap_or(&[]);
        String::from_utf8(text.to_vec()).map_err(|_| XsError::Protocol("non-UTF-8 path"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::xs_wire::msg_type;
    use crate::xenstore::fake_xenstored::FakeXenstored;
    use crate::xenstore::ring::{RingSignal, SharedXenstoreRing, REPLIES};
    use crate::SharedMem;
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::string::ToString;
    use std::vec;

    /// Drives the fake xenstored whenever the client waits; gives up after many idle
    /// waits (a reply that never comes).
    struct Stepper {
        server: Rc<RefCell<FakeXenstored>>,
        paused: Rc<Cell<bool>>,
        idle: usize,
    }

    impl RingSignal for Stepper {
        fn notify(&mut self) {}
        fn wait(&mut self) -> Result<(), RingError> {
            if !self.paused.get() && self.server.borrow_mut().step() {
                self.idle = 0;
                return Ok(());
            }
            self.idle += 1;
            if self.idle > 100 {
                Err(RingError::Timeout)
            } else {
                Ok(())
            }
        }
    }

    type Client = XenstoreClient<SharedXenstoreRing<Stepper>>;

    struct Rig {
        client: Client,
        server: Rc<RefCell<FakeXenstored>>,
        paused: Rc<Cell<bool>>,
        mem: SharedMem,
    }

    fn rig(chunk: usize) -> Rig {
        let mem = SharedMem::alloc_leaked(4096);
        let server = Rc::new(RefCell::new(FakeXenstored::new(mem)));
        server.borrow_mut().chunk = chunk;
        let paused = Rc::new(Cell::new(false));
        let signal = Stepper {
            server: server.clone(),
            paused: paused.clone(),
            idle: 0,
        };
        let client = XenstoreClient::new(SharedXenstoreRing::new(mem, signal).unwrap());
        Rig {
            client,
            server,
            paused,
            mem,
        }
    }

    const NO_TX: Transaction = Transaction::NONE;

    #[test]
    fn basic_operations_over_a_ring_that_splits_everything() {
        for chunk in [1, 7, 16, 1024] {
            let Rig {
                mut client, server, ..
            } = rig(chunk);
            client.write(NO_TX, "data/a", b"hello").unwrap();
            client
                .write(NO_TX, "/local/domain/1/data/b", b"42")
                .unwrap();
            client.mkdir(NO_TX, "data/dir").unwrap();
            assert_eq!(client.read(NO_TX, "data/a").unwrap(), b"hello");
            assert_eq!(client.read_u64(NO_TX, "data/b").unwrap(), 42);
            assert_eq!(client.read_u64(NO_TX, "data/a"), Err(XsError::BadValue));
            assert_eq!(client.directory(NO_TX, "data").unwrap(), ["a", "b", "dir"]);
            client.rm(NO_TX, "data/a").unwrap();
            assert_eq!(
                client.read(NO_TX, "data/a"),
                Err(XsError::Xenstored(XsErrno::Enoent))
            );
            assert_eq!(
                client.rm(NO_TX, "data/a"),
                Err(XsError::Xenstored(XsErrno::Enoent))
            );
            assert_eq!(client.get_domain_path(7).unwrap(), "/local/domain/7");
            assert_eq!(server.borrow().value("data/b").unwrap(), b"42");
            assert_eq!(client.read(NO_TX, "bad//path"), Err(XsError::InvalidPath));
        }
    }

    #[test]
    fn long_child_lists_are_fetched_in_parts() {
        let Rig {
            mut client, server, ..
        } = rig(512);
        let names: Vec<String> = (0..400).map(|i| std::format!("child-{i:09}")).collect();
        for name in &names {
            server
                .borrow_mut()
                .external_write(&std::format!("many/{name}"), b"");
        }
        // 400 * 16 bytes > 4096: DIRECTORY answers E2BIG, the client switches to parts.
        assert_eq!(client.directory(NO_TX, "many").unwrap(), names);
        let parts = || {
            server
                .borrow()
                .requests
                .iter()
                .filter(|h| h.msg_type == msg_type::DIRECTORY_PART)
                .count()
        };
        assert_eq!(parts(), 2);
        // The node changes between two parts: the client starts over and still
        // returns one consistent list.
        server.borrow_mut().mutate_after_part = Some("many/child-zzz".to_string());
        let mut expected = names.clone();
        expected.push("child-zzz".to_string());
        assert_eq!(client.directory(NO_TX, "many").unwrap(), expected);
        assert_eq!(
            parts(),
            2 + 2 + 2,
            "two parts see the change, then a full restart"
        );
        assert_eq!(
            client.directory(NO_TX, "data-none"),
            Err(XsError::Xenstored(XsErrno::Enoent))
        );
    }

    #[test]
    fn messages_larger_than_the_ring_go_through_in_pieces() {
        let Rig {
            mut client, server, ..
        } = rig(100);
        let big: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
        client.write(NO_TX, "big", &big).unwrap();
        assert_eq!(server.borrow().value("big").unwrap(), big);
        assert_eq!(client.read(NO_TX, "big").unwrap(), big);
        // The largest payload: path "m" + NUL + 4094 bytes = 4096.
        let max = vec![b'z'; 4094];
        client.write(NO_TX, "m", &max).unwrap();
        assert_eq!(client.read(NO_TX, "m").unwrap(), max);
        let requests_before = server.borrow().requests.len();
        assert_eq!(
            client.write(NO_TX, "m", &vec![b'z'; 4095]),
            Err(XsError::TooBig)
        );
        assert_eq!(
            server.borrow().requests.len(),
            requests_before,
            "nothing was sent"
        );
    }

    #[test]
    fn a_flood_of_watch_events_is_bounded_and_reported_lost() {
        let Rig {
            mut client, server, ..
        } = rig(5);
        server.borrow_mut().events_before_reply = true;
        client.watch("device", "dev-token").unwrap();
        let writes = MAX_QUEUED_WATCH_EVENTS + 40;
        for n in 0..writes {
            client
                .write(NO_TX, "device/vbd/1/state", n.to_string().as_bytes())
                .unwrap();
        }
        assert!(client.take_lost_watch_events(), "events were dropped");
        assert!(!client.take_lost_watch_events(), "said once");
        let mut events = 0;
        client.dispatch_watch_events(|_| events += 1).unwrap();
        assert_eq!(events, MAX_QUEUED_WATCH_EVENTS);
        // Once drained, new events queue again and nothing is reported lost.
        client.write(NO_TX, "device/vbd/1/state", b"x").unwrap();
        client.dispatch_watch_events(|_| events += 1).unwrap();
        assert_eq!(events, MAX_QUEUED_WATCH_EVENTS + 1);
        assert!(!client.take_lost_watch_events());
    }

    #[test]
    fn reset_watches_drops_every_watch_and_the_events_already_queued() {
        let Rig {
            mut client, server, ..
        } = rig(5);
        client.watch("device", "dev-token").unwrap();
        server
            .borrow_mut()
            .external_write("device/vbd/1/state", b"4");
        // The old image's events, unread in the ring.
        assert_eq!(client.reset_watches(), Ok(2));
        assert!(server.borrow().watches.is_empty());
        assert!(!client.has_watch_events());
        server
            .borrow_mut()
            .external_write("device/vbd/1/state", b"5");
        assert_eq!(client.take_watch_event(), Ok(None));
    }

    #[test]
    fn watch_events_interleaved_with_replies_are_queued() {
        let Rig {
            mut client, server, ..
        } = rig(5);
        server.borrow_mut().events_before_reply = true;
        client.watch("device", "dev-token").unwrap();
        client.watch("/local/domain/1/control", "ctl").unwrap();
        // Our own writes fire watches; the events come *before* the replies here.
        client.write(NO_TX, "device/vbd/1/state", b"1").unwrap();
        client.write(NO_TX, "control/shutdown", b"").unwrap();
        assert_eq!(client.read(NO_TX, "device/vbd/1/state").unwrap(), b"1");
        assert!(
            client.has_watch_events(),
            "read off the ring with the replies: queued, no kick left to say so"
        );
        let mut events = vec![];
        client
            .dispatch_watch_events(|e| events.push((e.path.clone(), e.token.clone())))
            .unwrap();
        assert!(!client.has_watch_events());
        assert_eq!(
            events,
            [
                ("device".to_string(), "dev-token".to_string()),
                ("/local/domain/1/control".to_string(), "ctl".to_string()),
                ("device/vbd/1/state".to_string(), "dev-token".to_string()),
                (
                    "/local/domain/1/control/shutdown".to_string(),
                    "ctl".to_string()
                ),
            ]
        );
        // dom0 writes: the event arrives with no request outstanding.
        server
            .borrow_mut()
            .external_write("/local/domain/1/control/shutdown", b"poweroff");
        let event = client.wait_watch_event().unwrap();
        assert_eq!(event.path, "/local/domain/1/control/shutdown");
        assert_eq!(event.token, "ctl");
        assert_eq!(
            client.read_string(NO_TX, "control/shutdown").unwrap(),
            "poweroff"
        );
        client.unwatch("/local/domain/1/control", "ctl").unwrap();
        assert_eq!(
            client.unwatch("/local/domain/1/control", "ctl"),
            Err(XsError::Xenstored(XsErrno::Enoent))
        );
        server
            .borrow_mut()
            .external_write("control/shutdown", b"reboot");
        assert_eq!(client.take_watch_event().unwrap(), None);
        assert_eq!(client.watch("x", ""), Err(XsError::BadValue));
    }

    #[test]
    fn transactions_retry_on_eagain() {
        let Rig {
            mut client, server, ..
        } = rig(9);
        server.borrow_mut().eagain_commits = 2;
        let mut runs = 0;
        let value = client
            .transaction(DEFAULT_TRANSACTION_ATTEMPTS, |c, tx| {
                runs += 1;
                c.write(tx, "backend/state", b"4")?;
                c.write(tx, "backend/sectors", b"2048")?;
                Ok(runs)
            })
            .unwrap();
        assert_eq!((runs, value), (3, 3));
        assert_eq!(server.borrow().value("backend/state").unwrap(), b"4");
        assert_eq!(server.borrow().value("backend/sectors").unwrap(), b"2048");

        server.borrow_mut().eagain_commits = 5;
        assert_eq!(
            client.transaction(3, |c, tx| c.write(tx, "k", b"v")),
            Err(XsError::RetriesExhausted(3))
        );
    }

    #[test]
    fn transaction_conflicts_with_another_writer_and_retries() {
        let Rig {
            mut client, server, ..
        } = rig(64);
        client.write(NO_TX, "counter", b"1").unwrap();
        let mut runs = 0;
        client
            .transaction(4, |c, tx| {
                runs += 1;
                let n = c.read_u64(tx, "counter")?;
                if runs == 1 {
                    // Someone else bumps the counter while we are inside.
                    server.borrow_mut().external_write("counter", b"10");
                }
                c.write(tx, "counter", std::format!("{}", n + 1).as_bytes())
            })
            .unwrap();
        assert_eq!(runs, 2);
        assert_eq!(server.borrow().value("counter").unwrap(), b"11");
    }

    #[test]
    fn transaction_body_errors_abort_and_are_returned() {
        let Rig {
            mut client, server, ..
        } = rig(64);
        let err = client.transaction(4, |c, tx| {
            c.write(tx, "t/a", b"1")?;
            c.read(tx, "t/missing")
        });
        assert_eq!(err, Err(XsError::Xenstored(XsErrno::Enoent)));
        assert_eq!(server.borrow().value("t/a"), None, "aborted, not committed");
        let last = *server.borrow().requests.last().unwrap();
        assert_eq!(last.msg_type, msg_type::TRANSACTION_END);
    }

    #[test]
    fn errors_map_to_the_typed_enum() {
        let Rig {
            mut client, server, ..
        } = rig(64);
        for (name, errno) in [
            ("EACCES", XsErrno::Eacces),
            ("EQUOTA", XsErrno::Equota),
            ("EBUSY", XsErrno::Ebusy),
        ] {
            server.borrow_mut().fail_next = Some((msg_type::WRITE, name));
            assert_eq!(
                client.write(NO_TX, "x", b"1"),
                Err(XsError::Xenstored(errno))
            );
        }
        server.borrow_mut().fail_next = Some((msg_type::MKDIR, "ENOSPC"));
        assert!(client.mkdir(NO_TX, "y").unwrap_err().is(XsErrno::Enospc));
        // The connection is still fine afterwards.
        client.write(NO_TX, "x", b"2").unwrap();
    }

    #[test]
    fn permissions_round_trip() {
        let Rig { mut client, .. } = rig(64);
        client.write(NO_TX, "shared", b"v").unwrap();
        let perms = [
            Permission {
                domid: 1,
                access: Access::None,
            },
            Permission {
                domid: 0,
                access: Access::Read,
            },
            Permission {
                domid: 5,
                access: Access::Both,
            },
        ];
        client.set_perms(NO_TX, "shared", &perms).unwrap();
        assert_eq!(client.get_perms(NO_TX, "shared").unwrap(), perms);
        assert_eq!(
            client.set_perms(NO_TX, "shared", &[]),
            Err(XsError::BadValue)
        );
    }

    #[test]
    fn a_reply_after_a_timeout_is_discarded_as_stale() {
        let Rig {
            mut client, paused, ..
        } = rig(64);
        client.write(NO_TX, "k", b"first").unwrap();
        paused.set(true);
        assert_eq!(
            client.read(NO_TX, "k"),
            Err(XsError::Ring(RingError::Timeout))
        );
        paused.set(false);
        client.write(NO_TX, "k", b"second").unwrap();
        assert_eq!(client.read(NO_TX, "k").unwrap(), b"second");
    }

    #[test]
    fn an_oversized_reply_breaks_the_connection() {
        let Rig {
            mut client, mem, ..
        } = rig(64);
        let bogus = Header {
            msg_type: msg_type::READ,
            req_id: 1,
            tx_id: 0,
            len: 5000,
        };
        REPLIES.produce(&mem, &bogus.encode()).unwrap();
        assert!(matches!(client.read(NO_TX, "k"), Err(XsError::Protocol(_))));
        assert_eq!(client.read(NO_TX, "k"), Err(XsError::Broken));
    }

    #[test]
    fn a_threaded_xenstored_serves_concurrent_traffic() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        use std::time::{Duration, Instant};

        struct Yield {
            deadline: Instant,
        }
        impl RingSignal for Yield {
            fn notify(&mut self) {}
            fn wait(&mut self) -> Result<(), RingError> {
                std::thread::yield_now();
                if Instant::now() > self.deadline {
                    Err(RingError::Timeout)
                } else {
                    Ok(())
                }
            }
        }

        let mem = SharedMem::alloc_leaked(4096);
        let server = Arc::new(Mutex::new(FakeXenstored::new(mem)));
        server.lock().unwrap().chunk = 13;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (server, stop) = (server.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(Ordering::Acquire) {
                    let moved = server.lock().unwrap().step();
                    n += 1;
                    if n.is_multiple_of(50) {
                        server
                            .lock()
                            .unwrap()
                            .external_write("watched/tick", std::format!("{n}").as_bytes());
                    }
                    if !moved {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let signal = Yield {
            deadline: Instant::now() + Duration::from_secs(15),
        };
        let mut client = XenstoreClient::new(SharedXenstoreRing::new(mem, signal).unwrap());
        client.watch("watched", "w").unwrap();
        for i in 0..200u32 {
            let value = std::format!("value-{i}-{}", "x".repeat((i as usize * 37) % 1500));
            client
                .write(NO_TX, &std::format!("data/k{}", i % 10), value.as_bytes())
                .unwrap();
            assert_eq!(
                client
                    .read(NO_TX, &std::format!("data/k{}", i % 10))
                    .unwrap(),
                value.as_bytes()
            );
        }
        stop.store(true, Ordering::Release);
        thread.join().unwrap();
        let mut events = 0;
        client
            .dispatch_watch_events(|e| {
                assert_eq!(e.token, "w");
                events += 1;
            })
            .unwrap();
        assert!(events >= 1, "at least the initial watch event");
    }
}
