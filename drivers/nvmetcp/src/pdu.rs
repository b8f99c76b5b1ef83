// SPDX-License-Identifier: MIT OR Apache-2.0
//! The NVMe/TCP PDU wire format (NVMe-oF TCP transport binding, PDU layouts as in
//! Linux's include/linux/nvme-tcp.h) and the checks on every PDU header the target
//! sends, modelled on FreeBSD's nvmf_tcp_validate_pdu_header: type, flags, digest
//! flags, HLEN, PDO and PLEN, in that order.
//!
//! Digests (negotiated in ICReq/ICResp) are CRC32C: a header digest follows the header
//! of every PDU but ICReq, ICResp and the termination requests; a data digest follows
//! the data of every PDU that carries data.

use crate::{crc32c, ProtocolError};

/// Bytes a digest takes on the wire.
pub const DIGEST_LEN: usize = 4;

/// PDU types.
pub const ICREQ: u8 = 0x00;
pub const ICRESP: u8 = 0x01;
pub const H2C_TERM: u8 = 0x02;
pub const C2H_TERM: u8 = 0x03;
pub const CAPSULE_CMD: u8 = 0x04;
pub const CAPSULE_RESP: u8 = 0x05;
pub const H2C_DATA: u8 = 0x06;
pub const C2H_DATA: u8 = 0x07;
pub const R2T: u8 = 0x09;

/// Common-header flags.
pub const FLAG_HDGST: u8 = 1 << 0;
pub const FLAG_DDGST: u8 = 1 << 1;
/// Last data PDU of a transfer (C2HData, H2CData).
pub const FLAG_DATA_LAST: u8 = 1 << 2;
/// C2HData: the command succeeded, no CapsuleResp follows.
pub const FLAG_DATA_SUCCESS: u8 = 1 << 3;

/// Header lengths (HLEN) per type.
pub const COMMON_LEN: usize = 8;
pub const IC_LEN: usize = 128;
pub const CMD_LEN: usize = 8 + 64;
pub const RESP_LEN: usize = 8 + 16;
pub const DATA_HDR_LEN: usize = 24;
pub const R2T_LEN: usize = 24;
pub const TERM_LEN: usize = 24;
/// A termination request carries at most 128 bytes of the offending header.
pub const TERM_MAX_LEN: u32 = 152;

/// Smallest MAXH2CDATA a controller may offer.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// In-capsule data the admin queue and Fabrics commands may carry (Linux's
/// NVME_TCP_ADMIN_CCSZ: 8 KiB).
pub const ADMIN_INLINE_LIMIT: u32 = 8192;

/// The 8-byte common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn parse(bytes: &[u8; COMMON_LEN]) -> Self {
        CommonHeader {
            pdu_type: bytes[0],
            flags: bytes[1],
            hlen: bytes[2],
            pdo: bytes[3],
            plen: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0] = self.pdu_type;
        out[1] = self.flags;
        out[2] = self.hlen;
        out[3] = self.pdo;
        out[4..8].copy_from_slice(&self.plen.to_le_bytes());
    }
}

/// The digests of a connection: asked for in ICReq, and in force once ICResp agreed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };

    /// ICReq's and ICResp's DGST field.
    pub fn bits(self) -> u8 {
        u8::from(self.header) | u8::from(self.data) << 1
    }

    /// The common-header flags saying which digests a PDU carries.
    fn flags(self) -> u8 {
        (if self.header { FLAG_HDGST } else { 0 }) | if self.data { FLAG_DDGST } else { 0 }
    }

    /// Bytes the header digest adds after a header (`carried`: the PDU type has one).
    pub fn header_len(self, carried: bool) -> u32 {
        if self.header && carried {
            DIGEST_LEN as u32
        } else {
            0
        }
    }

    /// Bytes the data digest adds after `data_len` bytes of data.
    pub fn data_len(self, data_len: u32) -> u32 {
        if self.data && data_len > 0 {
            DIGEST_LEN as u32
        } else {
            0
        }
    }
}

impl core::fmt::Display for Digests {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match (self.header, self.data) {
            (false, false) => "no digests",
            (true, false) => "header digest",
            (false, true) => "data digest",
            (true, true) => "header and data digests",
        })
    }
}

/// Checks the common header of a PDU the host received, before the rest of the header is
/// read. `initialized` says whether ICResp has arrived (before it, nothing else is
/// valid; after it, ICResp is not); `digests` are those in force (none before ICResp).
/// Each digest flag must be set exactly when its digest is in force and the PDU type
/// has one. Returns the number of data bytes the PDU carries after PDO, digest not
/// counted.
pub fn check_received(
    ch: &CommonHeader,
    initialized: bool,
    digests: Digests,
) -> Result<u32, ProtocolError> {
    let t = ch.pdu_type;
    let (valid_flags, hlen) = match t {
        ICRESP if !initialized => (0, IC_LEN),
        C2H_TERM => (0, TERM_LEN),
        CAPSULE_RESP if initialized => (FLAG_HDGST, RESP_LEN),
        R2T if initialized => (FLAG_HDGST, R2T_LEN),
        C2H_DATA if initialized => (
            FLAG_HDGST | FLAG_DDGST | FLAG_DATA_LAST | FLAG_DATA_SUCCESS,
            DATA_HDR_LEN,
        ),
        _ => return Err(ProtocolError::UnexpectedPduType(t)),
    };
    // Termination requests with an impossible length end the connection all the same.
    if t == C2H_TERM && !(TERM_LEN as u32..=TERM_MAX_LEN).contains(&ch.plen) {
        return Err(ProtocolError::BadPduLength {
            pdu_type: t,
            plen: ch.plen,
        });
    }
    let digest_flags = FLAG_HDGST | FLAG_DDGST;
    let in_force = digests.flags() & valid_flags;
    if ch.flags & !valid_flags != 0 || ch.flags & digest_flags != in_force {
        return Err(ProtocolError::BadFlags {
            pdu_type: t,
            flags: ch.flags,
        });
    }
    if usize::from(ch.hlen) != hlen {
        return Err(ProtocolError::BadHeaderLength {
            pdu_type: t,
            hlen: ch.hlen,
        });
    }
    let full_hlen = u32::from(ch.hlen) + digests.header_len(valid_flags & FLAG_HDGST != 0);
    let data_len = match t {
        C2H_DATA => {
            // Data must follow the header and its digest, inside the PDU; a C2HData
            // without data is meaningless.
            if u32::from(ch.pdo) < full_hlen || u32::from(ch.pdo) >= ch.plen {
                return Err(ProtocolError::BadDataOffset {
                    pdu_type: t,
                    pdo: ch.pdo,
                });
            }
            let carried = ch.plen - u32::from(ch.pdo);
            let digest = digests.data_len(carried);
            if carried <= digest {
                return Err(ProtocolError::BadPduLength {
                    pdu_type: t,
                    plen: ch.plen,
                });
            }
            carried - digest
        }
        C2H_TERM => {
            if ch.pdo != 0 {
                return Err(ProtocolError::BadDataOffset {
                    pdu_type: t,
                    pdo: ch.pdo,
                });
            }
            ch.plen - TERM_LEN as u32
        }
        _ => {
            if ch.pdo != 0 {
                return Err(ProtocolError::BadDataOffset {
                    pdu_type: t,
                    pdo: ch.pdo,
                });
            }
            if ch.plen != full_hlen {
                return Err(ProtocolError::BadPduLength {
                    pdu_type: t,
                    plen: ch.plen,
                });
            }
            0
        }
    };
    Ok(data_len)
}

/// ICReq: PDU format 1.0, no host data alignment (HPDA 0), the `digests` asked for, one
/// R2T in flight per command (MAXR2T is 0's based).
pub fn icreq(digests: Digests) -> [u8; IC_LEN] {
    let mut pdu = [0u8; IC_LEN];
    CommonHeader {
        pdu_type: ICREQ,
        flags: 0,
        hlen: IC_LEN as u8,
        pdo: 0,
        plen: IC_LEN as u32,
    }
    .write(&mut pdu);
    // pfv (8..10) = 0, hpda (10) = 0, maxr2t (12..16) = 0.
    pdu[11] = digests.bits();
    pdu
}

/// What the target's ICResp settles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    /// Most data bytes per H2CData PDU.
    pub maxh2cdata: u32,
}

/// Parses and checks an ICResp (its common header already passed [`check_received`]).
/// The target must turn on exactly the digests `asked` for (as Linux's host insists).
pub fn parse_icresp(pdu: &[u8; IC_LEN], asked: Digests) -> Result<IcResp, ProtocolError> {
    let pfv = u16::from_le_bytes([pdu[8], pdu[9]]);
    if pfv != 0 {
        return Err(ProtocolError::BadVersion(pfv));
    }
    let cpda = pdu[10];
    if cpda != 0 {
        return Err(ProtocolError::UnsupportedAlignment(cpda));
    }
    let dgst = pdu[11];
    if dgst != asked.bits() {
        return Err(ProtocolError::DigestMismatch(dgst));
    }
    let maxh2cdata = u32::from_le_bytes([pdu[12], pdu[13], pdu[14], pdu[15]]);
    if maxh2cdata < MIN_MAXH2CDATA || !maxh2cdata.is_multiple_of(4) {
        return Err(ProtocolError::BadMaxH2cData(maxh2cdata));
    }
    Ok(IcResp { maxh2cdata })
}

/// The fields of a C2HData or R2T header after the common header (both 24 bytes):
/// command ID, transfer tag, offset, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferHeader {
    pub cid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub len: u32,
}

impl TransferHeader {
    pub fn parse(pdu: &[u8; DATA_HDR_LEN]) -> Self {
        TransferHeader {
            cid: u16::from_le_bytes([pdu[8], pdu[9]]),
            ttag: u16::from_le_bytes([pdu[10], pdu[11]]),
            offset: u32::from_le_bytes([pdu[12], pdu[13], pdu[14], pdu[15]]),
            len: u32::from_le_bytes([pdu[16], pdu[17], pdu[18], pdu[19]]),
        }
    }

    /// Writes a whole data PDU header of type `pdu_type` carrying `self.len` bytes of
    /// data right after it (and its digest); returns its length on the wire.
    pub fn write(
        &self,
        pdu_type: u8,
        flags: u8,
        digests: Digests,
        out: &mut [u8; MAX_TX_HEADER],
    ) -> u8 {
        *out = [0; MAX_TX_HEADER];
        CommonHeader {
            pdu_type,
            flags,
            hlen: DATA_HDR_LEN as u8,
            pdo: 0,
            plen: 0,
        }
        .write(&mut out[..]);
        out[8..10].copy_from_slice(&self.cid.to_le_bytes());
        out[10..12].copy_from_slice(&self.ttag.to_le_bytes());
        out[12..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..20].copy_from_slice(&self.len.to_le_bytes());
        seal_header(out, DATA_HDR_LEN, self.len, digests)
    }
}

/// Room for the longest header this host sends (CapsuleCmd) and its digest.
pub const MAX_TX_HEADER: usize = CMD_LEN + DIGEST_LEN;

/// Finishes a header the host sends of `hlen` bytes at the start of `out` that carries
/// `data_len` bytes of data: digest flags, PDO and PLEN as `digests` say, then the header
/// digest. Returns the header's length on the wire, digest included.
fn seal_header(out: &mut [u8; MAX_TX_HEADER], hlen: usize, data_len: u32, digests: Digests) -> u8 {
    let header_digest = digests.header_len(true);
    let data_digest = digests.data_len(data_len);
    out[1] |= Digests {
        header: header_digest > 0,
        data: data_digest > 0,
    }
    .flags();
    let full_hlen = hlen as u32 + header_digest;
    out[3] = if data_len > 0 { full_hlen as u8 } else { 0 };
    out[4..8].copy_from_slice(&(full_hlen + data_len + data_digest).to_le_bytes());
    if header_digest > 0 {
        let crc = crc32c::checksum(&out[..hlen]);
        out[hlen..hlen + DIGEST_LEN].copy_from_slice(&crc.to_le_bytes());
    }
    full_hlen as u8
}

/// Writes the CapsuleCmd header for `sqe` with `inline_len` bytes of in-capsule data
/// following it; returns its length on the wire (with its digest).
pub fn capsule_header(
    sqe: &[u8; 64],
    inline_len: u32,
    digests: Digests,
    out: &mut [u8; MAX_TX_HEADER],
) -> u8 {
    *out = [0; MAX_TX_HEADER];
    CommonHeader {
        pdu_type: CAPSULE_CMD,
        flags: 0,
        hlen: CMD_LEN as u8,
        pdo: 0,
        plen: 0,
    }
    .write(&mut out[..]);
    out[8..CMD_LEN].copy_from_slice(sqe);
    seal_header(out, CMD_LEN, inline_len, digests)
}

/// Fatal error status of a C2HTermReq.
pub fn term_fes(pdu: &[u8; TERM_LEN]) -> u16 {
    u16::from_le_bytes([pdu[8], pdu[9]])
}
