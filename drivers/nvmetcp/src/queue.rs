// SPDX-License-Identifier: MIT OR Apache-2.0
//! One NVMe queue on one TCP connection.

use crate::crc32c::{self, Running};
use crate::pdu::{self, CommonHeader, Digests, TransferHeader};
use crate::sqe::{Sqe, Status, OPC_FABRICS};
use crate::ProtocolError;

/// Where command data lives: the caller's buffers, named by the command's tag.
pub trait DataPort {
    /// Fills `dst` with the bytes at `offset` of the data of the command tagged `tag`
    /// (host to target: writes).
    fn fetch(&mut self, tag: u64, offset: u32, dst: &mut [u8]);
    /// Stores `src` at `offset` of the data of the command tagged `tag` (target to host:
    /// reads). The queue has checked that the range lies within the command's length.
    fn deliver(&mut self, tag: u64, offset: u32, src: &[u8]);
}

/// Most data one command moves: far beyond any block request, and small enough that no
/// sum of lengths and header sizes overflows a `u32`.
pub const MAX_DATA_LEN: u32 = 1 << 30;

/// The data a command moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    None,
    /// `len` bytes from the target into the caller's buffer.
    ToHost(u32),
    /// `len` bytes from the caller's buffer to the target.
    ToTarget(u32),
    /// Up to 16 bytes the queue keeps itself (a Dataset Management range), sent to the
    /// target; `len` of `bytes` count.
    Owned {
        bytes: [u8; 16],
        len: u8,
    },
}

/// The queue's place: the admin queue carries up to 8 KiB in a capsule; an I/O queue
/// what the controller's IOCCSZ allows (Fabrics commands 8 KiB on either, as Linux).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    Admin,
    Io { inline_limit: u32 },
}

/// A finished command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub tag: u64,
    pub status: Status,
    /// Dwords 0 and 1 of the completion entry.
    pub result: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// ICResp has not arrived yet.
    NotReady,
    /// Every command slot is in use.
    Full,
    /// The payload is empty, or larger than a command can carry.
    BadLength,
    /// The connection failed; the error is in [`Queue::error`].
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Sent (or being sent), waiting for data or a response.
    Active,
    /// The response arrived while data was still being sent: finish the PDU on the
    /// wire, then complete.
    Deferred,
    /// In the completion ring.
    Done,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    /// Bumped on every use: stale command IDs from the target do not match.
    generation: u8,
    tag: u64,
    payload: Payload,
    /// Bytes the target sent (reads) or the host sent (writes) so far.
    done: u32,
    /// The data goes in the capsule.
    inline: bool,
    /// The capsule is (partly) still to be sent.
    capsule_pending: bool,
    /// Active R2T: transfer tag and end offset (exclusive).
    r2t: Option<(u16, u32)>,
    /// The slot sits in the transmit ring or is being transmitted.
    tx_busy: bool,
    /// Data arrived that failed its data digest: whatever the target says, the command
    /// completes with a data transfer error.
    bad_data: bool,
    status: Status,
    result: u64,
}

const FREE_SLOT: Slot = Slot {
    state: SlotState::Free,
    generation: 0,
    tag: 0,
    payload: Payload::None,
    done: 0,
    inline: false,
    capsule_pending: false,
    r2t: None,
    tx_busy: false,
    bad_data: false,
    status: Status::SUCCESS,
    result: 0,
};

impl Slot {
    fn data_len(&self) -> u32 {
        match self.payload {
            Payload::None => 0,
            Payload::ToHost(n) | Payload::ToTarget(n) => n,
            Payload::Owned { len, .. } => u32::from(len),
        }
    }

    fn is_write(&self) -> bool {
        matches!(self.payload, Payload::ToTarget(_) | Payload::Owned { .. })
    }
}

/// The PDU being transmitted.
#[derive(Clone, Copy, Debug)]
struct TxPdu {
    slot: u16,
    header: [u8; pdu::MAX_TX_HEADER],
    /// With the header digest.
    header_len: u8,
    /// Bytes of this PDU already handed out.
    pos: u32,
    /// Command data offset of this PDU's data, and its length.
    data_offset: u32,
    data_len: u32,
    /// A data digest follows the data.
    data_digest: bool,
}

impl TxPdu {
    /// Bytes of the whole PDU.
    fn end(&self) -> u32 {
        u32::from(self.header_len)
            + self.data_len
            + pdu::DIGEST_LEN as u32 * u32::from(self.data_digest)
    }
}

#[derive(Clone, Copy, Debug)]
enum Rx {
    /// Collecting a header: `have` bytes so far (common header first, then the rest).
    Header {
        have: usize,
    },
    /// Skipping padding between a C2HData header and its data.
    Pad {
        remaining: u32,
        data: RxData,
    },
    Data(RxData),
    /// Collecting the data digest after the data: `have` bytes so far.
    DataDigest {
        have: usize,
        data: RxData,
    },
}

#[derive(Clone, Copy, Debug)]
struct RxData {
    slot: u16,
    offset: u32,
    remaining: u32,
    success: bool,
    /// A data digest follows.
    digest: bool,
}

/// One NVMe queue over one TCP connection, with `N` command slots (1..=256: the slot
/// index is the low byte of the command ID, a generation count the high byte).
pub struct Queue<const N: usize> {
    kind: QueueKind,
    /// Digests asked for in ICReq; in force once ICResp agreed.
    asked: Digests,
    digests: Digests,
    /// CRC32C of the data of the PDU being sent, and of the one being received.
    tx_crc: Running,
    rx_crc: Running,
    /// Bytes of ICReq already sent.
    icreq_sent: usize,
    maxh2cdata: Option<u32>,
    error: Option<ProtocolError>,
    slots: [Slot; N],
    free: [u16; N],
    free_len: usize,
    tx_ring: [u16; N],
    tx_head: usize,
    tx_len: usize,
    tx: Option<TxPdu>,
    done_ring: [u16; N],
    done_head: usize,
    done_len: usize,
    rx: Rx,
    rx_buf: [u8; pdu::IC_LEN],
    /// The submission entry of each slot, kept until its capsule is sent.
    sqes: [Sqe; N],
}

impl<const N: usize> Queue<N> {
    const SLOTS_FIT: () = assert!(N > 0 && N <= 256, "1..=256 slots");

    pub fn new(kind: QueueKind) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::SLOTS_FIT;
        let mut free = [0u16; N];
        for (i, f) in free.iter_mut().enumerate() {
            // Popped from the end: slot 0 first.
            *f = (N - 1 - i) as u16;
        }
        Queue {
            kind,
            asked: Digests::NONE,
            digests: Digests::NONE,
            tx_crc: Running::new(),
            rx_crc: Running::new(),
            icreq_sent: 0,
            maxh2cdata: None,
            error: None,
            slots: [FREE_SLOT; N],
            free,
            free_len: N,
            tx_ring: [0; N],
            tx_head: 0,
            tx_len: 0,
            tx: None,
            done_ring: [0; N],
            done_head: 0,
            done_len: 0,
            rx: Rx::Header { have: 0 },
            rx_buf: [0; pdu::IC_LEN],
            sqes: [[0; 64]; N],
        }
    }

    /// Asks for `digests` in ICReq (before anything is sent): the target must agree, or
    /// the connection fails with `ProtocolError::DigestMismatch`.
    pub fn with_digests(mut self, digests: Digests) -> Self {
        self.asked = digests;
        self
    }

    /// The digests in force (none until ICResp agreed).
    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// ICResp arrived and was acceptable: commands may be submitted.
    pub fn is_ready(&self) -> bool {
        self.maxh2cdata.is_some() && self.error.is_none()
    }

    /// The negotiated MAXH2CDATA.
    pub fn maxh2cdata(&self) -> Option<u32> {
        self.maxh2cdata
    }

    pub fn error(&self) -> Option<ProtocolError> {
        self.error
    }

    /// Commands submitted and not yet popped as completions.
    pub fn in_flight(&self) -> usize {
        N - self.free_len
    }

    /// Marks the connection failed from outside (`ProtocolError::ConnectionLost`: the
    /// TCP connection broke).
    pub fn fail(&mut self, e: ProtocolError) {
        self.error.get_or_insert(e);
    }

    /// Calls `f` with the tag of every command that has not completed, and frees their
    /// slots: after a connection fails, the caller holds these and submits them again on
    /// the next connection (or fails them).
    pub fn drain(&mut self, mut f: impl FnMut(u64)) {
        for i in 0..N {
            if matches!(self.slots[i].state, SlotState::Active | SlotState::Deferred) {
                f(self.slots[i].tag);
                self.release(i as u16);
            }
        }
        self.tx = None;
        self.tx_len = 0;
    }

    fn release(&mut self, slot: u16) {
        let s = &mut self.slots[usize::from(slot)];
        s.state = SlotState::Free;
        s.tx_busy = false;
        s.r2t = None;
        self.free[self.free_len] = slot;
        self.free_len += 1;
    }

    /// Queues a command. `sqe`'s command ID and data pointer are filled in here.
    pub fn submit(&mut self, tag: u64, mut sqe: Sqe, payload: Payload) -> Result<(), SubmitError> {
        if self.error.is_some() {
            return Err(SubmitError::Failed);
        }
        if self.maxh2cdata.is_none() {
            return Err(SubmitError::NotReady);
        }
        let len = match payload {
            Payload::None => 0,
            Payload::ToHost(n) | Payload::ToTarget(n) if (1..=MAX_DATA_LEN).contains(&n) => n,
            Payload::Owned { len, .. } if (1..=16).contains(&len) => u32::from(len),
            _ => return Err(SubmitError::BadLength),
        };
        if self.free_len == 0 {
            return Err(SubmitError::Full);
        }
        self.free_len -= 1;
        let index = self.free[self.free_len];
        let inline_limit = match self.kind {
            _ if sqe[0] == OPC_FABRICS => pdu::ADMIN_INLINE_LIMIT,
            QueueKind::Admin => pdu::ADMIN_INLINE_LIMIT,
            QueueKind::Io { inline_limit } => inline_limit,
        };
        let s = &mut self.slots[usize::from(index)];
        let writes = matches!(payload, Payload::ToTarget(_) | Payload::Owned { .. });
        let inline = writes && len <= inline_limit;
        s.generation = s.generation.wrapping_add(1);
        *s = Slot {
            state: SlotState::Active,
            generation: s.generation,
            tag,
            payload,
            done: 0,
            inline,
            capsule_pending: true,
            r2t: None,
            tx_busy: true,
            bad_data: false,
            status: Status::SUCCESS,
            result: 0,
        };
        let cid = u16::from(s.generation) << 8 | index;
        sqe[2..4].copy_from_slice(&cid.to_le_bytes());
        // PSDT = 01: the data pointer is an SGL.
        sqe[1] = (sqe[1] & 0x3f) | 0x40;
        let mut sgl = [0u8; 16];
        sgl[8..12].copy_from_slice(&len.to_le_bytes());
        // In-capsule: data block, offset subtype (0x01), address = offset in the capsule
        // (0: data right after the entry). Otherwise transport data block, transport
        // subtype (0x5a): the transport moves it (C2HData, or H2CData after R2T).
        sgl[15] = if inline { 0x01 } else { 0x5a };
        sqe[24..40].copy_from_slice(&sgl);
        self.sqes[usize::from(index)] = sqe;
        self.push_tx(index);
        Ok(())
    }

    fn push_tx(&mut self, slot: u16) {
        // Each slot is in the ring at most once (tx_busy), so N places suffice.
        let at = (self.tx_head + self.tx_len) % N;
        self.tx_ring[at] = slot;
        self.tx_len += 1;
    }

    fn pop_tx(&mut self) -> Option<u16> {
        if self.tx_len == 0 {
            return None;
        }
        let slot = self.tx_ring[self.tx_head];
        self.tx_head = (self.tx_head + 1) % N;
        self.tx_len -= 1;
        Some(slot)
    }

    fn push_done(&mut self, slot: u16) {
        self.slots[usize::from(slot)].state = SlotState::Done;
        let at = (self.done_head + self.done_len) % N;
        self.done_ring[at] = slot;
        self.done_len += 1;
    }

    /// The next finished command, if any. Its slot is free again afterwards.
    pub fn next_completion(&mut self) -> Option<Completion> {
        if self.done_len == 0 {
            return None;
        }
        let slot = self.done_ring[self.done_head];
        self.done_head = (self.done_head + 1) % N;
        self.done_len -= 1;
        let s = &self.slots[usize::from(slot)];
        let c = Completion {
            tag: s.tag,
            status: s.status,
            result: s.result,
        };
        self.release(slot);
        Some(c)
    }

    /// There is something to send (call [`transmit`](Self::transmit)).
    pub fn wants_to_send(&self) -> bool {
        self.error.is_none()
            && (self.icreq_sent < pdu::IC_LEN
                || (self.maxh2cdata.is_some() && (self.tx.is_some() || self.tx_len > 0)))
    }

    /// Fills as much of `out` as there is to send; returns the bytes written. PDUs may be
    /// cut anywhere: the rest follows on the next call.
    pub fn transmit(&mut self, out: &mut [u8], port: &mut impl DataPort) -> usize {
        if self.error.is_some() {
            return 0;
        }
        let mut n = 0;
        if self.icreq_sent < pdu::IC_LEN {
            let icreq = pdu::icreq(self.asked);
            let k = (pdu::IC_LEN - self.icreq_sent).min(out.len());
            out[..k].copy_from_slice(&icreq[self.icreq_sent..self.icreq_sent + k]);
            self.icreq_sent += k;
            n = k;
        }
        // The host sends nothing else before ICResp.
        let Some(maxh2cdata) = self.maxh2cdata else {
            return n;
        };
        while n < out.len() {
            let mut cur = match self.tx {
                Some(cur) => cur,
                None => match self.pop_tx() {
                    Some(slot) => self.start_pdu(slot, maxh2cdata),
                    None => break,
                },
            };
            let slot = &self.slots[usize::from(cur.slot)];
            let header_len = u32::from(cur.header_len);
            if cur.pos < header_len {
                let from = cur.pos as usize;
                let k = (header_len as usize - from).min(out.len() - n);
                out[n..n + k].copy_from_slice(&cur.header[from..from + k]);
                n += k;
                cur.pos += k as u32;
            }
            let data_end = header_len + cur.data_len;
            if cur.pos >= header_len && cur.pos < data_end && n < out.len() {
                let k = ((data_end - cur.pos) as usize).min(out.len() - n);
                let offset = cur.data_offset + (cur.pos - header_len);
                let dst = &mut out[n..n + k];
                match slot.payload {
                    Payload::Owned { bytes, .. } => {
                        let from = offset as usize;
                        dst.copy_from_slice(&bytes[from..from + k]);
                    }
                    _ => port.fetch(slot.tag, offset, dst),
                }
                if cur.data_digest {
                    // Over the bytes as they go on the wire: what the target checks.
                    self.tx_crc.update(dst);
                }
                n += k;
                cur.pos += k as u32;
            }
            let end = cur.end();
            if cur.pos >= data_end && cur.pos < end && n < out.len() {
                let crc = self.tx_crc.value().to_le_bytes();
                let from = (cur.pos - data_end) as usize;
                let k = (pdu::DIGEST_LEN - from).min(out.len() - n);
                out[n..n + k].copy_from_slice(&crc[from..from + k]);
                n += k;
                cur.pos += k as u32;
            }
            if cur.pos == end {
                self.tx = None;
                self.finish_pdu(cur, maxh2cdata);
            } else {
                self.tx = Some(cur);
            }
        }
        n
    }

    /// Builds the next PDU of `slot`: its capsule, or the next H2CData of its R2T.
    fn start_pdu(&mut self, index: u16, maxh2cdata: u32) -> TxPdu {
        self.tx_crc = Running::new();
        let s = &self.slots[usize::from(index)];
        let mut header = [0u8; pdu::MAX_TX_HEADER];
        if s.capsule_pending {
            let inline_len = if s.inline { s.data_len() } else { 0 };
            let sqe = &self.sqes[usize::from(index)];
            let header_len = pdu::capsule_header(sqe, inline_len, self.digests, &mut header);
            TxPdu {
                slot: index,
                header,
                header_len,
                pos: 0,
                data_offset: 0,
                data_len: inline_len,
                data_digest: self.digests.data_len(inline_len) > 0,
            }
        } else {
            // An H2CData PDU: only reached with an active R2T (see finish_pdu, r2t).
            let (ttag, end) = s.r2t.unwrap_or((0, s.done));
            let len = (end - s.done).min(maxh2cdata);
            let last = s.done + len == end;
            let cid = u16::from(s.generation) << 8 | index;
            let th = TransferHeader {
                cid,
                ttag,
                offset: s.done,
                len,
            };
            let flags = if last { pdu::FLAG_DATA_LAST } else { 0 };
            let header_len = th.write(pdu::H2C_DATA, flags, self.digests, &mut header);
            TxPdu {
                slot: index,
                header,
                header_len,
                pos: 0,
                data_offset: s.done,
                data_len: len,
                data_digest: self.digests.data_len(len) > 0,
            }
        }
    }

    fn finish_pdu(&mut self, cur: TxPdu, maxh2cdata: u32) {
        let s = &mut self.slots[usize::from(cur.slot)];
        if s.capsule_pending {
            s.capsule_pending = false;
            if s.inline {
                s.done = s.data_len();
            }
            s.tx_busy = false;
        } else {
            s.done += cur.data_len;
            match s.r2t {
                Some((_, end)) if s.done < end && s.state == SlotState::Active => {
                    // More of this R2T: straight on, ahead of other commands.
                    self.tx = Some(self.start_pdu(cur.slot, maxh2cdata));
                    return;
                }
                _ => {
                    s.r2t = None;
                    s.tx_busy = false;
                }
            }
        }
        if s.state == SlotState::Deferred {
            self.push_done(cur.slot);
        }
    }

    /// Consumes bytes the target sent. On a protocol error the connection is finished:
    /// the error is kept, and every later call returns it.
    pub fn receive(
        &mut self,
        mut input: &[u8],
        port: &mut impl DataPort,
    ) -> Result<(), ProtocolError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        while !input.is_empty() {
            let step = self.receive_step(input, port);
            match step {
                Ok(used) => input = &input[used..],
                Err(e) => {
                    self.error = Some(e);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn receive_step(
        &mut self,
        input: &[u8],
        port: &mut impl DataPort,
    ) -> Result<usize, ProtocolError> {
        match self.rx {
            Rx::Header { have } => {
                // The header, and its digest when the flag says one follows (checked
                // against the digests in force with the common header).
                let want = if have < pdu::COMMON_LEN {
                    pdu::COMMON_LEN
                } else if self.rx_buf[1] & pdu::FLAG_HDGST != 0 {
                    usize::from(self.rx_buf[2]) + pdu::DIGEST_LEN
                } else {
                    usize::from(self.rx_buf[2])
                };
                let k = (want - have).min(input.len());
                self.rx_buf[have..have + k].copy_from_slice(&input[..k]);
                let have = have + k;
                self.rx = Rx::Header { have };
                if have == pdu::COMMON_LEN {
                    let ch = self.common_header();
                    pdu::check_received(&ch, self.maxh2cdata.is_some(), self.digests)?;
                } else if have == want {
                    self.rx = Rx::Header { have: 0 };
                    self.header_complete()?;
                }
                Ok(k)
            }
            Rx::Pad { remaining, data } => {
                let k = (remaining as usize).min(input.len());
                let remaining = remaining - k as u32;
                self.rx = if remaining == 0 {
                    Rx::Data(data)
                } else {
                    Rx::Pad { remaining, data }
                };
                Ok(k)
            }
            Rx::Data(mut d) => {
                let k = (d.remaining as usize).min(input.len());
                let s = &mut self.slots[usize::from(d.slot)];
                port.deliver(s.tag, d.offset, &input[..k]);
                if d.digest {
                    self.rx_crc.update(&input[..k]);
                }
                s.done += k as u32;
                d.offset += k as u32;
                d.remaining -= k as u32;
                if d.remaining > 0 {
                    self.rx = Rx::Data(d);
                } else if d.digest {
                    self.rx = Rx::DataDigest { have: 0, data: d };
                } else {
                    self.data_done(d)?;
                }
                Ok(k)
            }
            Rx::DataDigest { have, data } => {
                let k = (pdu::DIGEST_LEN - have).min(input.len());
                self.rx_buf[have..have + k].copy_from_slice(&input[..k]);
                let have = have + k;
                if have < pdu::DIGEST_LEN {
                    self.rx = Rx::DataDigest { have, data };
                    return Ok(k);
                }
                let sent = u32::from_le_bytes([
                    self.rx_buf[0],
                    self.rx_buf[1],
                    self.rx_buf[2],
                    self.rx_buf[3],
                ]);
                if sent != self.rx_crc.value() {
                    // The data in the caller's buffer is not what the target sent; the
                    // stream itself is intact (its headers passed), so only this
                    // command fails, as on Linux's host, with a status worth a retry.
                    self.slots[usize::from(data.slot)].bad_data = true;
                }
                self.data_done(data)?;
                Ok(k)
            }
        }
    }

    /// A C2HData PDU's data (and digest) all arrived.
    fn data_done(&mut self, d: RxData) -> Result<(), ProtocolError> {
        self.rx = Rx::Header { have: 0 };
        if d.success {
            self.complete(d.slot, Status::SUCCESS, 0)?;
        }
        Ok(())
    }

    fn common_header(&self) -> CommonHeader {
        let mut ch = [0u8; pdu::COMMON_LEN];
        ch.copy_from_slice(&self.rx_buf[..pdu::COMMON_LEN]);
        CommonHeader::parse(&ch)
    }

    /// Looks up the slot a command ID from the target names.
    fn slot_of(&self, cid: u16) -> Result<u16, ProtocolError> {
        let index = cid & 0xff;
        match self.slots.get(usize::from(index)) {
            // A command whose capsule is not all sent is unknown to an honest target.
            Some(s)
                if matches!(s.state, SlotState::Active)
                    && !s.capsule_pending
                    && u16::from(s.generation) == cid >> 8 =>
            {
                Ok(index)
            }
            _ => Err(ProtocolError::UnknownCommand(cid)),
        }
    }

    fn header_complete(&mut self) -> Result<(), ProtocolError> {
        let ch = self.common_header();
        if ch.flags & pdu::FLAG_HDGST != 0 {
            let hlen = usize::from(ch.hlen);
            let digest = &self.rx_buf[hlen..hlen + pdu::DIGEST_LEN];
            let sent = u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]);
            if sent != crc32c::checksum(&self.rx_buf[..hlen]) {
                return Err(ProtocolError::HeaderDigest {
                    pdu_type: ch.pdu_type,
                });
            }
        }
        match ch.pdu_type {
            pdu::ICRESP => {
                let mut b = [0u8; pdu::IC_LEN];
                b.copy_from_slice(&self.rx_buf);
                let ic = pdu::parse_icresp(&b, self.asked)?;
                self.maxh2cdata = Some(ic.maxh2cdata);
                self.digests = self.asked;
                Ok(())
            }
            pdu::C2H_TERM => {
                let mut b = [0u8; pdu::TERM_LEN];
                b.copy_from_slice(&self.rx_buf[..pdu::TERM_LEN]);
                Err(ProtocolError::Terminated {
                    fes: pdu::term_fes(&b),
                })
            }
            pdu::CAPSULE_RESP => {
                let dw = |i: usize| {
                    let at = 8 + i * 4;
                    u32::from_le_bytes([
                        self.rx_buf[at],
                        self.rx_buf[at + 1],
                        self.rx_buf[at + 2],
                        self.rx_buf[at + 3],
                    ])
                };
                let result = u64::from(dw(0)) | u64::from(dw(1)) << 32;
                let dw3 = dw(3);
                let cid = dw3 as u16;
                let slot = self.slot_of(cid)?;
                self.complete(slot, Status::from_dw3(dw3), result)
            }
            pdu::C2H_DATA => self.c2h_data(ch),
            pdu::R2T => self.r2t(),
            t => Err(ProtocolError::UnexpectedPduType(t)),
        }
    }

    fn transfer_header(&self) -> TransferHeader {
        let mut b = [0u8; pdu::DATA_HDR_LEN];
        b.copy_from_slice(&self.rx_buf[..pdu::DATA_HDR_LEN]);
        TransferHeader::parse(&b)
    }

    fn c2h_data(&mut self, ch: CommonHeader) -> Result<(), ProtocolError> {
        let th = self.transfer_header();
        let index = self.slot_of(th.cid)?;
        let s = &self.slots[usize::from(index)];
        let Payload::ToHost(len) = s.payload else {
            return Err(ProtocolError::WrongDirection(th.cid));
        };
        let success = ch.flags & pdu::FLAG_DATA_SUCCESS != 0;
        if success && ch.flags & pdu::FLAG_DATA_LAST == 0 {
            return Err(ProtocolError::SuccessWithoutLast(th.cid));
        }
        // check_received made pdo < plen: the PDU carries data (its digest aside), and
        // its DATAL field must say how much; data comes in order and stays inside the
        // buffer.
        let digest = ch.flags & pdu::FLAG_DDGST != 0;
        let carried = ch.plen - u32::from(ch.pdo) - pdu::DIGEST_LEN as u32 * u32::from(digest);
        let in_order = th.offset == s.done && th.len == carried;
        let fits = th.offset.checked_add(th.len).is_some_and(|end| end <= len);
        if !in_order || !fits {
            return Err(ProtocolError::DataOutOfOrder {
                cid: th.cid,
                expected: s.done,
                offset: th.offset,
                len: th.len,
            });
        }
        if success && th.offset + th.len != len {
            return Err(ProtocolError::ShortRead {
                cid: th.cid,
                received: th.offset + th.len,
                expected: len,
            });
        }
        // LAST marks the PDU that ends the transfer, and only that one (FreeBSD's host
        // checks the same).
        let last = ch.flags & pdu::FLAG_DATA_LAST != 0;
        if last != (th.offset + th.len == len) {
            return Err(ProtocolError::BadLastFlag(th.cid));
        }
        let data = RxData {
            slot: index,
            offset: th.offset,
            remaining: th.len,
            success,
            digest,
        };
        if digest {
            self.rx_crc = Running::new();
        }
        let header_digest = self.digests.header_len(true);
        let pad = u32::from(ch.pdo) - u32::from(ch.hlen) - header_digest;
        self.rx = if pad > 0 {
            Rx::Pad {
                remaining: pad,
                data,
            }
        } else {
            Rx::Data(data)
        };
        Ok(())
    }

    fn r2t(&mut self) -> Result<(), ProtocolError> {
        let th = self.transfer_header();
        let index = self.slot_of(th.cid)?;
        let s = &self.slots[usize::from(index)];
        if !s.is_write() {
            return Err(ProtocolError::WrongDirection(th.cid));
        }
        let end = th.offset.checked_add(th.len);
        // One R2T at a time (MAXR2T 0), the next bytes in order, inside the buffer. Data
        // that went in the capsule counts as sent, so no R2T fits after it.
        let ok = th.len > 0
            && s.r2t.is_none()
            && th.offset == s.done
            && end.is_some_and(|e| e <= s.data_len());
        let Some(end) = end.filter(|_| ok) else {
            return Err(ProtocolError::BadR2t {
                cid: th.cid,
                offset: th.offset,
                len: th.len,
            });
        };
        let s = &mut self.slots[usize::from(index)];
        s.r2t = Some((th.ttag, end));
        s.tx_busy = true;
        self.push_tx(index);
        Ok(())
    }

    fn complete(&mut self, index: u16, status: Status, result: u64) -> Result<(), ProtocolError> {
        let s = &mut self.slots[usize::from(index)];
        let cid = u16::from(s.generation) << 8 | index;
        s.status = if s.bad_data {
            Status::DATA_TRANSFER_ERROR
        } else {
            status
        };
        s.result = result;
        if s.status.is_success() {
            // NVMe has no short transfers: a success means all the data moved.
            if s.done != s.data_len() {
                return Err(if s.is_write() {
                    ProtocolError::ResponseDuringTransfer(cid)
                } else {
                    ProtocolError::ShortRead {
                        cid,
                        received: s.done,
                        expected: s.data_len(),
                    }
                });
            }
        }
        // (A success has all data moved, so nothing is left to send: only a failure
        // finds the slot still sending.)
        if s.tx_busy {
            // A failure while the host still sends: take back what is queued, let a PDU
            // already on the wire finish (the stream cannot skip), then complete.
            s.state = SlotState::Deferred;
            let on_wire = self.tx.is_some_and(|t| t.slot == index);
            self.remove_from_tx_ring(index);
            if !on_wire {
                self.slots[usize::from(index)].tx_busy = false;
                self.push_done(index);
            }
            return Ok(());
        }
        self.push_done(index);
        Ok(())
    }

    fn remove_from_tx_ring(&mut self, index: u16) {
        let mut kept = 0;
        for i in 0..self.tx_len {
            let slot = self.tx_ring[(self.tx_head + i) % N];
            if slot != index {
                self.tx_ring[(self.tx_head + kept) % N] = slot;
                kept += 1;
            }
        }
        self.tx_len = kept;
    }
}
