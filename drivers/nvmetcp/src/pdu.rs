// SPDX-License-Identifier: MIT OR Apache-2.0
//! The NVMe/TCP PDU wire format (NVMe-oF TCP transport binding, PDU layouts as in
//! Linux's include/linux/nvme-tcp.h) and the checks on every PDU header the target
//! sends, modelled on FreeBSD's nvmf_tcp_validate_pdu_header: type, flags, digest
//! flags, HLEN, PDO and PLEN, in that order.

use crate::ProtocolError;

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

/// Checks the common header of a PDU the host received, before the rest of the header is
/// read. `initialized` says whether ICResp has arrived (before it, nothing else is
/// valid; after it, ICResp is not). Digests are never negotiated by this host, so any
/// digest flag is an error. Returns the number of data bytes the PDU carries after PDO.
pub fn check_received(ch: &CommonHeader, initialized: bool) -> Result<u32, ProtocolError> {
    let t = ch.pdu_type;
    let (valid_flags, hlen) = match t {
        ICRESP if !initialized => (0, IC_LEN),
        C2H_TERM => (0, TERM_LEN),
        CAPSULE_RESP if initialized => (0, RESP_LEN),
        R2T if initialized => (0, R2T_LEN),
        C2H_DATA if initialized => (FLAG_DATA_LAST | FLAG_DATA_SUCCESS, DATA_HDR_LEN),
        _ => return Err(ProtocolError::UnexpectedPduType(t)),
    };
    // Termination requests with an impossible length end the connection all the same.
    if t == C2H_TERM && !(TERM_LEN as u32..=TERM_MAX_LEN).contains(&ch.plen) {
        return Err(ProtocolError::BadPduLength {
            pdu_type: t,
            plen: ch.plen,
        });
    }
    if ch.flags & !valid_flags != 0 {
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
    let data_len = match t {
        C2H_DATA => {
            // Data must follow the header (no digest here), inside the PDU; a C2HData
            // without data is meaningless.
            if ch.pdo < ch.hlen || u32::from(ch.pdo) >= ch.plen {
                return Err(ProtocolError::BadDataOffset {
                    pdu_type: t,
                    pdo: ch.pdo,
                });
            }
            ch.plen - u32::from(ch.pdo)
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
            if ch.plen != hlen as u32 {
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

/// ICReq: PDU format 1.0, no host data alignment (HPDA 0), no digests, one R2T in
/// flight per command (MAXR2T is 0's based).
pub fn icreq() -> [u8; IC_LEN] {
    let mut pdu = [0u8; IC_LEN];
    CommonHeader {
        pdu_type: ICREQ,
        flags: 0,
        hlen: IC_LEN as u8,
        pdo: 0,
        plen: IC_LEN as u32,
    }
    .write(&mut pdu);
    // pfv (8..10) = 0, hpda (10) = 0, dgst (11) = 0, maxr2t (12..16) = 0.
    pdu
}

/// What the target's ICResp settles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    /// Most data bytes per H2CData PDU.
    pub maxh2cdata: u32,
}

/// Parses and checks an ICResp (its common header already passed [`check_received`]).
pub fn parse_icresp(pdu: &[u8; IC_LEN]) -> Result<IcResp, ProtocolError> {
    let pfv = u16::from_le_bytes([pdu[8], pdu[9]]);
    if pfv != 0 {
        return Err(ProtocolError::BadVersion(pfv));
    }
    let cpda = pdu[10];
    if cpda != 0 {
        return Err(ProtocolError::UnsupportedAlignment(cpda));
    }
    let dgst = pdu[11];
    if dgst != 0 {
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

    /// Writes a whole 24-byte data PDU header of type `pdu_type` carrying `self.len`
    /// bytes of data right after it.
    pub fn write(&self, pdu_type: u8, flags: u8, out: &mut [u8; DATA_HDR_LEN]) {
        *out = [0; DATA_HDR_LEN];
        CommonHeader {
            pdu_type,
            flags,
            hlen: DATA_HDR_LEN as u8,
            pdo: DATA_HDR_LEN as u8,
            plen: DATA_HDR_LEN as u32 + self.len,
        }
        .write(out);
        out[8..10].copy_from_slice(&self.cid.to_le_bytes());
        out[10..12].copy_from_slice(&self.ttag.to_le_bytes());
        out[12..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..20].copy_from_slice(&self.len.to_le_bytes());
    }
}

/// Writes the CapsuleCmd header for `sqe` with `inline_len` bytes of in-capsule data
/// following it.
pub fn capsule_header(sqe: &[u8; 64], inline_len: u32, out: &mut [u8; CMD_LEN]) {
    CommonHeader {
        pdu_type: CAPSULE_CMD,
        flags: 0,
        hlen: CMD_LEN as u8,
        pdo: if inline_len > 0 { CMD_LEN as u8 } else { 0 },
        plen: CMD_LEN as u32 + inline_len,
    }
    .write(out);
    out[8..].copy_from_slice(sqe);
}

/// Fatal error status of a C2HTermReq.
pub fn term_fes(pdu: &[u8; TERM_LEN]) -> u16 {
    u16::from_le_bytes([pdu[8], pdu[9]])
}
