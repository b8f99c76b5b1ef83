// SPDX-License-Identifier: MIT OR Apache-2.0
//! Decoding and checking requests. Input is always a private copy of a ring slot (or of
//! an indirect page): nothing here reads shared memory, so nothing can change under it.

use blkdev::Geometry;
use zerocopy::transmute_ref;

use crate::abi::{
    self, wire, DISCARD_SECURE, MAX_INDIRECT_PAGES, MAX_SEGMENTS_PER_REQUEST, REQUEST_SIZE,
    RSP_EOPNOTSUPP, RSP_ERROR, SECTORS_PER_PAGE, SECTOR_SHIFT,
};
use crate::ring::Response;
use xen::abi::grant_table::RawGrantStatus;
// The tests build slots by offset.
#[cfg(test)]
use crate::abi::request;

/// One segment descriptor: a granted page and the 512-byte sectors used inside it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentDesc {
    pub gref: u32,
    pub first_sect: u8,
    pub last_sect: u8,
}

impl SegmentDesc {
    pub fn from_wire(seg: &wire::Segment) -> Self {
        Self {
            gref: seg.gref.get(),
            first_sect: seg.first_sect,
            last_sect: seg.last_sect,
        }
    }

    /// `first_sect <= last_sect < 8`: the sectors lie inside one page.
    pub fn check(&self) -> Result<(), RequestError> {
        if self.first_sect > self.last_sect || self.last_sect >= SECTORS_PER_PAGE {
            return Err(RequestError::BadSegment {
                first_sect: self.first_sect,
                last_sect: self.last_sect,
            });
        }
        Ok(())
    }

    /// Sectors covered; only meaningful after `check`.
    pub fn sectors(&self) -> u64 {
        u64::from(self.last_sect - self.first_sect) + 1
    }

    pub fn byte_offset(&self) -> u32 {
        u32::from(self.first_sect) << SECTOR_SHIFT
    }

    pub fn byte_len(&self) -> u32 {
        (self.sectors() as u32) << SECTOR_SHIFT
    }
}

/// What a read/write-style request does with its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOp {
    Read,
    Write,
    /// `WRITE_BARRIER`: flush, then write any data.
    Barrier,
    /// `FLUSH_DISKCACHE`: flush, then write any data.
    Flush,
}

impl DataOp {
    /// The op code echoed in the response.
    pub fn code(self) -> u8 {
        match self {
            DataOp::Read => abi::OP_READ,
            DataOp::Write => abi::OP_WRITE,
            DataOp::Barrier => abi::OP_WRITE_BARRIER,
            DataOp::Flush => abi::OP_FLUSH_DISKCACHE,
        }
    }

    /// Whether the device reads guest memory (anything but a read).
    pub fn writes_disk(self) -> bool {
        self != DataOp::Read
    }
}

/// A request whose segments sit in the slot itself. The descriptors stay in the copied
/// slot and are decoded on use (all were checked by `parse_request`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectRequest<'a> {
    pub op: DataOp,
    pub id: u64,
    pub handle: u16,
    pub sector: u64,
    pub nr_segments: u8,
    segments: &'a [wire::Segment],
}

impl DirectRequest<'_> {
    /// The `nr_segments` descriptors, in order.
    pub fn segments(&self) -> impl Iterator<Item = SegmentDesc> + '_ {
        self.segments.iter().map(SegmentDesc::from_wire)
    }
}

/// A request whose segments sit in up to eight granted pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndirectRequest {
    /// Read or write only.
    pub op: DataOp,
    pub id: u64,
    pub handle: u16,
    pub sector: u64,
    pub nr_segments: u16,
    pub indirect_grefs: [u32; MAX_INDIRECT_PAGES],
}

impl IndirectRequest {
    pub fn nr_indirect_pages(&self) -> usize {
        abi::indirect_pages(usize::from(self.nr_segments))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscardRequest {
    pub id: u64,
    pub handle: u16,
    pub sector: u64,
    pub nr_sectors: u64,
    pub secure: bool,
}

/// A request that passed the syntactic checks (borrowing the copied slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Direct(DirectRequest<'a>),
    Indirect(IndirectRequest),
    Discard(DiscardRequest),
}

/// Why a request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// Operation code we do not implement (answered EOPNOTSUPP).
    UnsupportedOperation,
    /// An indirect request whose inner op is not read or write.
    BadIndirectOperation,
    /// Zero segments on a data op, or more than the limit.
    BadSegmentCount(u16),
    /// `first_sect`/`last_sect` out of order or past the page.
    BadSegment { first_sect: u8, last_sect: u8 },
    /// Start or length not a multiple of the logical block size.
    Misaligned,
    /// `sector + length` overflows.
    SectorOverflow,
    /// The range ends past the device.
    OutOfRange,
    /// A write to a read-only device.
    ReadOnly,
    /// Discard (or secure discard) is not offered by the device.
    DiscardUnsupported,
    /// A grant map, unmap or copy failed (status from Xen).
    GrantFailed(RawGrantStatus),
    /// The device refused the request.
    DeviceRefused,
    /// The device finished the request with an error.
    DeviceError,
}

impl core::fmt::Display for RequestError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RequestError::UnsupportedOperation => f.write_str("unsupported operation"),
            RequestError::BadIndirectOperation => {
                f.write_str("indirect request with an operation other than read or write")
            }
            RequestError::BadSegmentCount(n) => write!(f, "bad segment count {n}"),
            RequestError::BadSegment {
                first_sect,
                last_sect,
            } => write!(f, "bad segment: sectors {first_sect}..={last_sect}"),
            RequestError::Misaligned => f.write_str("not aligned to the logical block size"),
            RequestError::SectorOverflow => f.write_str("sector range overflows"),
            RequestError::OutOfRange => f.write_str("sector range ends past the device"),
            RequestError::ReadOnly => f.write_str("write to a read-only device"),
            RequestError::DiscardUnsupported => f.write_str("discard is not offered"),
            RequestError::GrantFailed(status) => write!(f, "grant operation failed ({status})"),
            RequestError::DeviceRefused => f.write_str("the device refused the request"),
            RequestError::DeviceError => f.write_str("the device failed the request"),
        }
    }
}

impl core::error::Error for RequestError {}

impl RequestError {
    /// The status sent back for this error.
    pub fn status(self) -> i16 {
        match self {
            RequestError::UnsupportedOperation | RequestError::DiscardUnsupported => RSP_EOPNOTSUPP,
            _ => RSP_ERROR,
        }
    }
}

/// A refused request: enough to answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub id: u64,
    /// Op code echoed in the response (the inner op for indirect requests).
    pub operation: u8,
    pub error: RequestError,
}

impl core::fmt::Display for Rejected {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "request {:#x} (operation {}): {}",
            self.id, self.operation, self.error
        )
    }
}

impl core::error::Error for Rejected {}

impl Rejected {
    pub fn response(&self) -> Response {
        Response {
            id: self.id,
            operation: self.operation,
            status: self.error.status(),
        }
    }
}

/// Decode a copied slot. `max_indirect_segments` is what we advertised.
#[cfg_attr(feature = "profile-passes", inline(never))]
pub fn parse_request(
    raw: &[u8; REQUEST_SIZE],
    max_indirect_segments: u16,
) -> Result<Request<'_>, Rejected> {
    let rw: &wire::RwRequest = transmute_ref!(raw);
    let operation = rw.operation;
    // Every request type keeps `id` at the same offset, so even garbage can be answered.
    let id = rw.id.get();
    let sector = rw.sector.get();
    let reject = |operation, error| Rejected {
        id,
        operation,
        error,
    };
    let data_op = match operation {
        abi::OP_READ => DataOp::Read,
        abi::OP_WRITE => DataOp::Write,
        abi::OP_WRITE_BARRIER => DataOp::Barrier,
        abi::OP_FLUSH_DISKCACHE => DataOp::Flush,
        abi::OP_DISCARD => {
            let discard: &wire::DiscardRequest = transmute_ref!(raw);
            return Ok(Request::Discard(DiscardRequest {
                id,
                handle: discard.handle.get(),
                sector,
                nr_sectors: discard.nr_sectors.get(),
                secure: discard.flag & DISCARD_SECURE != 0,
            }));
        }
        abi::OP_INDIRECT => {
            let indirect: &wire::IndirectRequest = transmute_ref!(raw);
            let inner = indirect.indirect_op;
            let op = match inner {
                abi::OP_READ => DataOp::Read,
                abi::OP_WRITE => DataOp::Write,
                _ => return Err(reject(inner, RequestError::BadIndirectOperation)),
            };
            let nr_segments = indirect.nr_segments.get();
            let limit = max_indirect_segments
                .min((abi::SEGMENTS_PER_INDIRECT_PAGE * MAX_INDIRECT_PAGES) as u16);
            if nr_segments == 0 || nr_segments > limit {
                return Err(reject(inner, RequestError::BadSegmentCount(nr_segments)));
            }
            return Ok(Request::Indirect(IndirectRequest {
                op,
                id,
                handle: indirect.handle.get(),
                sector,
                nr_segments,
                indirect_grefs: indirect.indirect_grefs.map(|gref| gref.get()),
            }));
        }
        _ => return Err(reject(operation, RequestError::UnsupportedOperation)),
    };
    let nr_segments = rw.nr_segments;
    let flush_only = matches!(data_op, DataOp::Barrier | DataOp::Flush);
    if (nr_segments == 0 && !flush_only) || usize::from(nr_segments) > MAX_SEGMENTS_PER_REQUEST {
        return Err(reject(
            operation,
            RequestError::BadSegmentCount(nr_segments.into()),
        ));
    }
    let segments = &rw.seg[..usize::from(nr_segments)];
    for segment in segments {
        SegmentDesc::from_wire(segment)
            .check()
            .map_err(|error| reject(operation, error))?;
    }
    Ok(Request::Direct(DirectRequest {
        op: data_op,
        id,
        handle: rw.handle.get(),
        sector,
        nr_segments,
        segments,
    }))
}

/// Checks of a data request against the device: alignment of the start and of every
/// segment to the logical block size, no overflow, nothing past the end, no writes to a
/// read-only device. `segments` are already individually checked.
#[cfg_attr(feature = "profile-passes", inline(never))]
pub fn check_data_access(
    op: DataOp,
    sector: u64,
    segments: &[SegmentDesc],
    geometry: &Geometry,
) -> Result<u64, RequestError> {
    if op.writes_disk() && !segments.is_empty() && geometry.read_only {
        return Err(RequestError::ReadOnly);
    }
    let block_sectors = u64::from(geometry.logical_block_size >> SECTOR_SHIFT).max(1);
    let align_mask = block_sectors - 1;
    let mut nr_sectors = 0u64;
    for seg in segments {
        if (sector | seg.sectors()) & align_mask != 0 {
            return Err(RequestError::Misaligned);
        }
        nr_sectors += seg.sectors();
    }
    check_range(sector, nr_sectors, geometry)?;
    Ok(nr_sectors)
}

/// `sector + nr_sectors` neither overflows nor passes the end of the device.
pub fn check_range(sector: u64, nr_sectors: u64, geometry: &Geometry) -> Result<(), RequestError> {
    if nr_sectors == 0 {
        return Ok(());
    }
    let end = sector
        .checked_add(nr_sectors)
        .ok_or(RequestError::SectorOverflow)?;
    if end > geometry.sectors {
        return Err(RequestError::OutOfRange);
    }
    Ok(())
}

/// Checks of a discard against the device. A read-only disk refuses it as a write (an
/// error, as Linux blkback answers) before asking whether discard is offered: a read-only
/// disk offers none, and "not supported" would invite the frontend to just stop trying.
pub fn check_discard(request: &DiscardRequest, geometry: &Geometry) -> Result<(), RequestError> {
    if geometry.read_only {
        return Err(RequestError::ReadOnly);
    }
    match geometry.discard {
        None => return Err(RequestError::DiscardUnsupported),
        Some(d) if request.secure && !d.secure => return Err(RequestError::DiscardUnsupported),
        Some(_) => {}
    }
    check_range(request.sector, request.nr_sectors, geometry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::wire::{encode_direct, encode_discard, encode_indirect};
    use blkdev::DiscardGeometry;

    fn seg(gref: u32, first_sect: u8, last_sect: u8) -> SegmentDesc {
        SegmentDesc {
            gref,
            first_sect,
            last_sect,
        }
    }

    fn geometry(sectors: u64) -> Geometry {
        Geometry {
            sectors,
            logical_block_size: 512,
            physical_block_size: 4096,
            read_only: false,
            flush: true,
            discard: Some(DiscardGeometry {
                granularity: 512,
                alignment: 0,
                secure: false,
            }),
        }
    }

    #[test]
    fn direct_read_decodes_every_field() {
        let segs = [seg(77, 0, 7), seg(78, 2, 3)];
        let mut raw = encode_direct(abi::OP_READ, 0xDEAD_BEEF_0123, 4096, &segs);
        raw[request::HANDLE..request::HANDLE + 2].copy_from_slice(&0x51u16.to_le_bytes());
        let Ok(Request::Direct(req)) = parse_request(&raw, 512) else {
            panic!()
        };
        assert_eq!(
            (req.op, req.id, req.sector, req.handle),
            (DataOp::Read, 0xDEAD_BEEF_0123, 4096, 0x51)
        );
        assert_eq!(req.nr_segments, 2);
        let parsed: Vec<SegmentDesc> = req.segments().collect();
        assert_eq!(parsed, segs);
        assert_eq!((parsed[1].sectors(), parsed[1].byte_offset()), (2, 1024));
    }

    #[test]
    fn bad_segment_counts_are_rejected() {
        let one = [seg(1, 0, 7)];
        let twelve = [seg(1, 0, 7); 12];
        for (op, segs) in [
            (abi::OP_READ, &[][..]),
            (abi::OP_WRITE, &[][..]),
            (abi::OP_WRITE, &twelve[..]),
        ] {
            let err = parse_request(&encode_direct(op, 9, 0, segs), 512).unwrap_err();
            assert_eq!(err.error, RequestError::BadSegmentCount(segs.len() as u16));
            assert_eq!(
                (err.id, err.operation, err.response().status),
                (9, op, RSP_ERROR)
            );
        }
        // A flush may carry no data, or data like a write.
        assert!(parse_request(&encode_direct(abi::OP_FLUSH_DISKCACHE, 1, 0, &[]), 512).is_ok());
        assert!(parse_request(&encode_direct(abi::OP_WRITE_BARRIER, 1, 0, &one), 512).is_ok());
        // Indirect: zero, above the advertised count, above the protocol ceiling.
        for (count, advertised) in [(0u16, 512u16), (33, 32), (513, 512), (4097, u16::MAX)] {
            let err = parse_request(
                &encode_indirect(abi::OP_WRITE, 5, 0, count, &[1]),
                advertised,
            )
            .unwrap_err();
            assert_eq!(err.error, RequestError::BadSegmentCount(count));
            assert_eq!(err.operation, abi::OP_WRITE);
        }
        let Ok(Request::Indirect(req)) =
            parse_request(&encode_indirect(abi::OP_READ, 5, 8, 513, &[3, 4]), 4096)
        else {
            panic!()
        };
        assert_eq!((req.nr_indirect_pages(), req.indirect_grefs[1]), (2, 4));
    }

    #[test]
    fn first_and_last_sect_must_stay_in_the_page_and_in_order() {
        for (first, last) in [(3, 2), (0, 8), (8, 8), (255, 255)] {
            let raw = encode_direct(abi::OP_READ, 3, 0, &[seg(1, 0, 7), seg(2, first, last)]);
            let err = parse_request(&raw, 512).unwrap_err();
            assert_eq!(
                err.error,
                RequestError::BadSegment {
                    first_sect: first,
                    last_sect: last
                }
            );
        }
        assert!(parse_request(&encode_direct(abi::OP_READ, 3, 0, &[seg(1, 7, 7)]), 512).is_ok());
    }

    #[test]
    fn unknown_op_is_eopnotsupp_with_the_id() {
        for op in [4u8, 7, 0x80, 0xFF] {
            let err = parse_request(&encode_direct(op, 0x1234_5678_9ABC, 0, &[]), 512).unwrap_err();
            let rsp = err.response();
            assert_eq!(
                (rsp.id, rsp.operation, rsp.status),
                (0x1234_5678_9ABC, op, RSP_EOPNOTSUPP)
            );
        }
        let err = parse_request(&encode_indirect(abi::OP_DISCARD, 6, 0, 1, &[1]), 512).unwrap_err();
        assert_eq!(
            (err.error, err.operation, err.id),
            (RequestError::BadIndirectOperation, abi::OP_DISCARD, 6)
        );
    }

    #[test]
    fn out_of_range_and_overflowing_sectors_are_rejected() {
        let g = geometry(1000);
        let full_page = [seg(1, 0, 7)];
        assert_eq!(check_data_access(DataOp::Read, 992, &full_page, &g), Ok(8));
        assert_eq!(
            check_data_access(DataOp::Read, 993, &full_page, &g),
            Err(RequestError::OutOfRange)
        );
        assert_eq!(
            check_data_access(DataOp::Read, u64::MAX - 3, &full_page, &g),
            Err(RequestError::SectorOverflow)
        );
        let discard = DiscardRequest {
            id: 1,
            handle: 0,
            sector: 10,
            nr_sectors: u64::MAX,
            secure: false,
        };
        assert_eq!(
            check_discard(&discard, &g),
            Err(RequestError::SectorOverflow)
        );
        let discard = DiscardRequest {
            nr_sectors: 991,
            ..discard
        };
        assert_eq!(check_discard(&discard, &g), Err(RequestError::OutOfRange));
        let discard = DiscardRequest {
            nr_sectors: 990,
            ..discard
        };
        assert_eq!(check_discard(&discard, &g), Ok(()));
        let secure = DiscardRequest {
            secure: true,
            ..discard
        };
        assert_eq!(
            check_discard(&secure, &g).unwrap_err().status(),
            RSP_EOPNOTSUPP
        );
        let Ok(Request::Discard(parsed)) = parse_request(&encode_discard(4, 10, 990, true), 512)
        else {
            panic!()
        };
        assert_eq!(parsed, DiscardRequest { id: 4, ..secure });
    }

    #[test]
    fn writes_to_read_only_devices_are_rejected() {
        let g = Geometry {
            read_only: true,
            ..geometry(64)
        };
        let page = [seg(1, 0, 7)];
        assert_eq!(check_data_access(DataOp::Read, 0, &page, &g), Ok(8));
        for op in [DataOp::Write, DataOp::Flush, DataOp::Barrier] {
            assert_eq!(
                check_data_access(op, 0, &page, &g),
                Err(RequestError::ReadOnly)
            );
        }
        // A flush without data writes nothing.
        assert_eq!(check_data_access(DataOp::Flush, 0, &[], &g), Ok(0));
        let discard = DiscardRequest {
            id: 1,
            handle: 0,
            sector: 0,
            nr_sectors: 8,
            secure: false,
        };
        assert_eq!(check_discard(&discard, &g), Err(RequestError::ReadOnly));
        // A read-only disk offers no discard (the kernel publishes none): still an error,
        // as a write, not "not supported" (tests/xen/hostile saw -2 before).
        let offers_none = Geometry { discard: None, ..g };
        assert_eq!(
            check_discard(&discard, &offers_none),
            Err(RequestError::ReadOnly)
        );
    }

    #[test]
    fn misaligned_io_on_4k_devices_is_rejected() {
        let g = Geometry {
            logical_block_size: 4096,
            ..geometry(64)
        };
        assert_eq!(
            check_data_access(DataOp::Read, 8, &[seg(1, 0, 7)], &g),
            Ok(8)
        );
        assert_eq!(
            check_data_access(DataOp::Read, 4, &[seg(1, 0, 7)], &g),
            Err(RequestError::Misaligned)
        );
        assert_eq!(
            check_data_access(DataOp::Read, 8, &[seg(1, 0, 3)], &g),
            Err(RequestError::Misaligned)
        );
    }
}
