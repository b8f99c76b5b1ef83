// SPDX-License-Identifier: MIT OR Apache-2.0
//! The blkif wire format (x86_64 ABI, and the x86_32 ABI translated to it) and
//! shared-ring layout, from Xen's `public/io/blkif.h` and `public/io/ring.h`. Requests
//! are decoded from byte copies (through the `wire` views of those copies), never read in
//! place.

/// Xen's page size; rings and grants are counted in these.
pub const PAGE_SIZE: usize = 4096;
/// Sectors are always 512 bytes on the wire.
pub const SECTOR_SHIFT: u32 = 9;
/// 512-byte sectors in one page: `first_sect`/`last_sect` index them.
pub const SECTORS_PER_PAGE: u8 = (PAGE_SIZE >> SECTOR_SHIFT) as u8;

pub const OP_READ: u8 = 0;
pub const OP_WRITE: u8 = 1;
pub const OP_WRITE_BARRIER: u8 = 2;
pub const OP_FLUSH_DISKCACHE: u8 = 3;
pub const OP_DISCARD: u8 = 5;
pub const OP_INDIRECT: u8 = 6;

pub const RSP_OKAY: i16 = 0;
pub const RSP_ERROR: i16 = -1;
pub const RSP_EOPNOTSUPP: i16 = -2;

/// `flag` bit of a discard request asking for secure erase.
pub const DISCARD_SECURE: u8 = 1;

/// Segments carried inside a direct request.
pub const MAX_SEGMENTS_PER_REQUEST: usize = 11;
/// Segment descriptors in one indirect page (4096 / 8).
pub const SEGMENTS_PER_INDIRECT_PAGE: usize = PAGE_SIZE / SEGMENT_SIZE;
/// Indirect pages one request may name.
pub const MAX_INDIRECT_PAGES: usize = 8;
/// What this backend advertises in `feature-max-indirect-segments`.
pub const MAX_INDIRECT_SEGMENTS: u16 = 512;
/// Highest `max-ring-page-order` this backend offers (16 pages, 512 slots).
pub const MAX_RING_PAGE_ORDER: u32 = 4;

/// Size of one ring slot: the union of all request types (and the response).
pub const REQUEST_SIZE: usize = 112;
pub const SEGMENT_SIZE: usize = 8;
pub const DISCARD_REQUEST_SIZE: usize = 32;
pub const INDIRECT_REQUEST_SIZE: usize = 64;
pub const RESPONSE_SIZE: usize = 16;

/// Offsets inside a read/write request.
pub mod request {
    pub const OPERATION: usize = 0;
    pub const NR_SEGMENTS: usize = 1;
    pub const HANDLE: usize = 2;
    pub const ID: usize = 8;
    pub const SECTOR: usize = 16;
    pub const SEGMENTS: usize = 24;
}

/// Offsets inside one segment descriptor.
pub mod segment {
    pub const GREF: usize = 0;
    pub const FIRST_SECT: usize = 4;
    pub const LAST_SECT: usize = 5;
}

/// Offsets inside a discard request.
pub mod discard {
    pub const FLAG: usize = 1;
    pub const NR_SECTORS: usize = 24;
}

/// Offsets inside an indirect request.
pub mod indirect {
    pub const INDIRECT_OP: usize = 1;
    pub const NR_SEGMENTS: usize = 2;
    pub const HANDLE: usize = 24;
    pub const INDIRECT_GREFS: usize = 28;
}

/// Offsets inside a response.
pub mod response {
    pub const ID: usize = 0;
    pub const OPERATION: usize = 8;
    pub const STATUS: usize = 10;
}

/// The shared ring's header (`struct blkif_sring` before `ring[]`).
pub use xen::abi::sring;

/// The slot and indirect-page layouts as types, for reading a private copy in place:
/// every field little-endian and of alignment 1 (zerocopy's byte-order types), so a
/// `[u8; REQUEST_SIZE]` copy can be viewed as any request type (`transmute_ref!`: sizes
/// checked at compile time, nothing at run time) and an indirect page read into a slice
/// of segments. Padding is spelled out, so a `Response` goes out with it zeroed. The
/// offsets above stay the reference (the fake frontend encodes with them); the
/// assertions below tie the two together.
///
/// zerocopy (0.8, no_std) replaced offset reads here: the parse path is no slower with
/// it, and the compiler checks the layouts instead of us. We still write no `unsafe`
/// (`deny(unsafe_code)` holds): the `unsafe impl`s of `FromBytes`/`IntoBytes` come from
/// zerocopy's derives, which check each layout (no hidden padding, every bit pattern
/// valid) before emitting them.
pub mod wire {
    use zerocopy::little_endian::{I16, U16, U32, U64};
    use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

    use super::{
        DISCARD_REQUEST_SIZE, INDIRECT_REQUEST_SIZE, MAX_INDIRECT_PAGES, MAX_SEGMENTS_PER_REQUEST,
        REQUEST_SIZE,
    };

    /// `struct blkif_request_segment`.
    #[derive(
        FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug, PartialEq, Eq,
    )]
    #[repr(C)]
    pub struct Segment {
        pub gref: U32,
        pub first_sect: u8,
        pub last_sect: u8,
        pub _pad: [u8; 2],
    }

    /// `struct blkif_request` (read, write, barrier, flush).
    #[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
    #[repr(C)]
    pub struct RwRequest {
        pub operation: u8,
        pub nr_segments: u8,
        pub handle: U16,
        pub _pad: [u8; 4],
        pub id: U64,
        pub sector: U64,
        pub seg: [Segment; MAX_SEGMENTS_PER_REQUEST],
    }

    /// `struct blkif_request_discard`, then the rest of the slot.
    #[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
    #[repr(C)]
    pub struct DiscardRequest {
        pub operation: u8,
        pub flag: u8,
        pub handle: U16,
        pub _pad: [u8; 4],
        pub id: U64,
        pub sector: U64,
        pub nr_sectors: U64,
        pub _rest: [u8; REQUEST_SIZE - DISCARD_REQUEST_SIZE],
    }

    /// `struct blkif_request_indirect`, then the rest of the slot.
    #[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
    #[repr(C)]
    pub struct IndirectRequest {
        pub operation: u8,
        pub indirect_op: u8,
        pub nr_segments: U16,
        pub _pad: [u8; 4],
        pub id: U64,
        pub sector: U64,
        pub handle: U16,
        pub _pad2: [u8; 2],
        pub indirect_grefs: [U32; MAX_INDIRECT_PAGES],
        /// The C struct's tail padding (it is 8-aligned).
        pub _pad3: [u8; 4],
        pub _rest: [u8; REQUEST_SIZE - INDIRECT_REQUEST_SIZE],
    }

    /// `struct blkif_response`.
    #[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
    #[repr(C)]
    pub struct Response {
        pub id: U64,
        pub operation: u8,
        pub _pad: u8,
        pub status: I16,
        pub _pad2: [u8; 4],
    }
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<wire::Segment>() == SEGMENT_SIZE);
    assert!(offset_of!(wire::Segment, gref) == segment::GREF);
    assert!(offset_of!(wire::Segment, first_sect) == segment::FIRST_SECT);
    assert!(offset_of!(wire::Segment, last_sect) == segment::LAST_SECT);
    assert!(size_of::<wire::RwRequest>() == REQUEST_SIZE);
    assert!(offset_of!(wire::RwRequest, operation) == request::OPERATION);
    assert!(offset_of!(wire::RwRequest, nr_segments) == request::NR_SEGMENTS);
    assert!(offset_of!(wire::RwRequest, handle) == request::HANDLE);
    assert!(offset_of!(wire::RwRequest, id) == request::ID);
    assert!(offset_of!(wire::RwRequest, sector) == request::SECTOR);
    assert!(offset_of!(wire::RwRequest, seg) == request::SEGMENTS);
    assert!(size_of::<wire::DiscardRequest>() == REQUEST_SIZE);
    assert!(offset_of!(wire::DiscardRequest, flag) == discard::FLAG);
    assert!(offset_of!(wire::DiscardRequest, id) == request::ID);
    assert!(offset_of!(wire::DiscardRequest, sector) == request::SECTOR);
    assert!(offset_of!(wire::DiscardRequest, nr_sectors) == discard::NR_SECTORS);
    assert!(size_of::<wire::IndirectRequest>() == REQUEST_SIZE);
    assert!(offset_of!(wire::IndirectRequest, indirect_op) == indirect::INDIRECT_OP);
    assert!(offset_of!(wire::IndirectRequest, nr_segments) == indirect::NR_SEGMENTS);
    assert!(offset_of!(wire::IndirectRequest, id) == request::ID);
    assert!(offset_of!(wire::IndirectRequest, sector) == request::SECTOR);
    assert!(offset_of!(wire::IndirectRequest, handle) == indirect::HANDLE);
    assert!(offset_of!(wire::IndirectRequest, indirect_grefs) == indirect::INDIRECT_GREFS);
    assert!(size_of::<wire::Response>() == RESPONSE_SIZE);
    assert!(offset_of!(wire::Response, id) == response::ID);
    assert!(offset_of!(wire::Response, operation) == response::OPERATION);
    assert!(offset_of!(wire::Response, status) == response::STATUS);
};

/// Slots in a ring of `2^order` pages: `__RING_SIZE` from `ring.h`, i.e. the entries that
/// fit after the header, rounded down to a power of two.
pub const fn ring_slots(order: u32) -> u32 {
    slots_of(order, REQUEST_SIZE)
}

/// `__RING_SIZE` for entries of `entry_size` bytes.
const fn slots_of(order: u32, entry_size: usize) -> u32 {
    let bytes = (PAGE_SIZE << order) - sring::HEADER_SIZE;
    let fit = (bytes / entry_size) as u32;
    // Largest power of two not above `fit` (fit >= 37 for every order and entry size).
    1 << (31 - fit.leading_zeros())
}

/// The frontend's ABI, as its `protocol` node names it: the layout of its ring entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// `x86_64-abi` (also what a frontend that writes no `protocol` gets: every 64-bit
    /// frontend writes it; Linux blkback would assume x86_32 there).
    #[default]
    X86_64,
    /// `x86_32-abi`: a 32-bit x86 frontend; its requests are translated on the copy.
    X86_32,
}

impl Protocol {
    /// The `protocol` node's value, if it names an ABI served here.
    pub fn parse(value: &str) -> Option<Protocol> {
        match value.trim() {
            "x86_64-abi" => Some(Protocol::X86_64),
            "x86_32-abi" => Some(Protocol::X86_32),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Protocol::X86_64 => "x86_64-abi",
            Protocol::X86_32 => "x86_32-abi",
        }
    }

    /// Bytes between two ring slots.
    pub const fn entry_size(self) -> usize {
        match self {
            Protocol::X86_64 => REQUEST_SIZE,
            Protocol::X86_32 => x86_32::REQUEST_SIZE,
        }
    }

    /// Bytes of a response as this ABI lays it out.
    pub const fn response_size(self) -> usize {
        match self {
            Protocol::X86_64 => RESPONSE_SIZE,
            Protocol::X86_32 => x86_32::RESPONSE_SIZE,
        }
    }

    /// Slots in a ring of `2^order` pages of this ABI's entries (the same counts for
    /// both: 37 to 606 entries of 108 bytes fit, 36 to 584 of 112, rounded down alike).
    pub const fn ring_slots(self, order: u32) -> u32 {
        slots_of(order, self.entry_size())
    }
}

/// The x86_32 ABI (`struct blkif_x86_32_request` in Linux's `xen-blkback/common.h`, what
/// a 32-bit guest compiles `blkif.h` to): there `uint64_t` is 4-byte aligned, so `id`
/// follows the first four bytes directly instead of after 4 bytes of padding. Every
/// request type (read/write, discard, indirect, any other) is its x86_64 counterpart
/// without those 4 bytes: bytes 0..4 are the same, everything from `id` on sits 4 bytes
/// earlier. A slot is 108 bytes; a response is 12 (`id`, `operation`, `status` at the
/// x86_64 offsets, no tail padding).
pub mod x86_32 {
    use super::REQUEST_SIZE as NATIVE_REQUEST_SIZE;

    pub const REQUEST_SIZE: usize = 108;
    pub const RESPONSE_SIZE: usize = 12;
    /// How much earlier than in the x86_64 layout every field from `id` on sits.
    pub const SHIFT: usize = 4;

    /// Offsets inside a read/write request (operation, nr_segments and handle as
    /// x86_64's).
    pub mod request {
        pub const ID: usize = 4;
        pub const SECTOR: usize = 12;
        pub const SEGMENTS: usize = 20;
    }

    /// Offsets inside a discard request (`flag` as x86_64's).
    pub mod discard {
        pub const NR_SECTORS: usize = 20;
    }

    /// Offsets inside an indirect request (`indirect_op`, `nr_segments` as x86_64's).
    pub mod indirect {
        pub const HANDLE: usize = 20;
        pub const INDIRECT_GREFS: usize = 24;
    }

    /// The x86_64 request for a copied x86_32 slot (Linux's `blkif_get_x86_32_req`,
    /// done once for every request type: the layouts differ only by the shift).
    pub fn to_native(raw: &[u8; REQUEST_SIZE]) -> [u8; NATIVE_REQUEST_SIZE] {
        let mut native = [0u8; NATIVE_REQUEST_SIZE];
        native[..SHIFT].copy_from_slice(&raw[..SHIFT]);
        native[SHIFT + SHIFT..].copy_from_slice(&raw[SHIFT..]);
        native
    }
}

// Each x86_32 field sits exactly `SHIFT` bytes before its x86_64 twin, so `to_native`
// moves every field to its place.
const _: () = {
    use x86_32::SHIFT;
    assert!(x86_32::REQUEST_SIZE + SHIFT == REQUEST_SIZE);
    assert!(x86_32::request::ID + SHIFT == request::ID);
    assert!(x86_32::request::SECTOR + SHIFT == request::SECTOR);
    assert!(x86_32::request::SEGMENTS + SHIFT == request::SEGMENTS);
    assert!(x86_32::discard::NR_SECTORS + SHIFT == discard::NR_SECTORS);
    assert!(x86_32::indirect::HANDLE + SHIFT == indirect::HANDLE);
    assert!(x86_32::indirect::INDIRECT_GREFS + SHIFT == indirect::INDIRECT_GREFS);
    assert!(request::NR_SEGMENTS < SHIFT && request::HANDLE < SHIFT);
    assert!(indirect::INDIRECT_OP < SHIFT && indirect::NR_SEGMENTS < SHIFT);
    assert!(discard::FLAG < SHIFT);
    assert!(x86_32::RESPONSE_SIZE > response::STATUS + 1);
};

/// Indirect pages needed to hold `nr_segments` descriptors.
pub const fn indirect_pages(nr_segments: usize) -> usize {
    nr_segments.div_ceil(SEGMENTS_PER_INDIRECT_PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    // C mirrors of Xen's structures (x86_64), used only to check the byte offsets above
    // against the compiler's layout rules.
    #[repr(C)]
    struct Segment {
        gref: u32,
        first_sect: u8,
        last_sect: u8,
    }
    #[repr(C)]
    struct RwRequest {
        operation: u8,
        nr_segments: u8,
        handle: u16,
        id: u64,
        sector_number: u64,
        seg: [Segment; MAX_SEGMENTS_PER_REQUEST],
    }
    #[repr(C)]
    struct DiscardRequest {
        operation: u8,
        flag: u8,
        handle: u16,
        id: u64,
        sector_number: u64,
        nr_sectors: u64,
    }
    #[repr(C)]
    struct IndirectRequest {
        operation: u8,
        indirect_op: u8,
        nr_segments: u16,
        id: u64,
        sector_number: u64,
        handle: u16,
        indirect_grefs: [u32; MAX_INDIRECT_PAGES],
    }
    #[repr(C)]
    struct Response {
        id: u64,
        operation: u8,
        status: i16,
    }
    #[repr(C)]
    struct SringHeader {
        req_prod: u32,
        req_event: u32,
        rsp_prod: u32,
        rsp_event: u32,
        pvt: [u8; 4],
        pad: [u8; 44],
    }

    #[test]
    fn request_layouts_match_blkif_h() {
        assert_eq!(size_of::<Segment>(), SEGMENT_SIZE);
        assert_eq!(offset_of!(Segment, gref), segment::GREF);
        assert_eq!(offset_of!(Segment, first_sect), segment::FIRST_SECT);
        assert_eq!(offset_of!(Segment, last_sect), segment::LAST_SECT);

        assert_eq!(size_of::<RwRequest>(), REQUEST_SIZE);
        assert_eq!(offset_of!(RwRequest, operation), request::OPERATION);
        assert_eq!(offset_of!(RwRequest, nr_segments), request::NR_SEGMENTS);
        assert_eq!(offset_of!(RwRequest, handle), request::HANDLE);
        assert_eq!(offset_of!(RwRequest, id), request::ID);
        assert_eq!(offset_of!(RwRequest, sector_number), request::SECTOR);
        assert_eq!(offset_of!(RwRequest, seg), request::SEGMENTS);

        assert_eq!(size_of::<DiscardRequest>(), DISCARD_REQUEST_SIZE);
        assert_eq!(offset_of!(DiscardRequest, flag), discard::FLAG);
        assert_eq!(offset_of!(DiscardRequest, nr_sectors), discard::NR_SECTORS);
        assert_eq!(offset_of!(DiscardRequest, id), request::ID);

        assert_eq!(size_of::<IndirectRequest>(), INDIRECT_REQUEST_SIZE);
        assert_eq!(
            offset_of!(IndirectRequest, indirect_op),
            indirect::INDIRECT_OP
        );
        assert_eq!(
            offset_of!(IndirectRequest, nr_segments),
            indirect::NR_SEGMENTS
        );
        assert_eq!(offset_of!(IndirectRequest, id), request::ID);
        assert_eq!(offset_of!(IndirectRequest, sector_number), request::SECTOR);
        assert_eq!(offset_of!(IndirectRequest, handle), indirect::HANDLE);
        assert_eq!(
            offset_of!(IndirectRequest, indirect_grefs),
            indirect::INDIRECT_GREFS
        );
    }

    #[test]
    fn response_and_ring_header_layouts_match_ring_h() {
        assert_eq!(size_of::<Response>(), RESPONSE_SIZE);
        assert_eq!(offset_of!(Response, id), response::ID);
        assert_eq!(offset_of!(Response, operation), response::OPERATION);
        assert_eq!(offset_of!(Response, status), response::STATUS);
        assert_eq!(size_of::<SringHeader>(), sring::HEADER_SIZE);
        assert_eq!(offset_of!(SringHeader, req_prod), sring::REQ_PROD);
        assert_eq!(offset_of!(SringHeader, req_event), sring::REQ_EVENT);
        assert_eq!(offset_of!(SringHeader, rsp_prod), sring::RSP_PROD);
        assert_eq!(offset_of!(SringHeader, rsp_event), sring::RSP_EVENT);
    }

    // The same structures as a 32-bit x86 guest compiles them (`uint64_t` 4-byte
    // aligned: `packed(4)` caps every field's alignment at 4, as Linux's and QEMU's
    // `#pragma pack(push, 4)` copies of them do).
    #[repr(C, packed(4))]
    struct RwRequest32 {
        operation: u8,
        nr_segments: u8,
        handle: u16,
        id: u64,
        sector_number: u64,
        seg: [Segment; MAX_SEGMENTS_PER_REQUEST],
    }
    #[repr(C, packed(4))]
    struct DiscardRequest32 {
        operation: u8,
        flag: u8,
        handle: u16,
        id: u64,
        sector_number: u64,
        nr_sectors: u64,
    }
    #[repr(C, packed(4))]
    struct IndirectRequest32 {
        operation: u8,
        indirect_op: u8,
        nr_segments: u16,
        id: u64,
        sector_number: u64,
        handle: u16,
        _pad: u16,
        indirect_grefs: [u32; MAX_INDIRECT_PAGES],
        _pad2: u64,
    }
    #[repr(C, packed(4))]
    struct Response32 {
        id: u64,
        operation: u8,
        status: i16,
    }

    #[test]
    fn x86_32_layouts_match_a_32_bit_guest() {
        assert_eq!(size_of::<RwRequest32>(), x86_32::REQUEST_SIZE);
        assert_eq!(offset_of!(RwRequest32, operation), request::OPERATION);
        assert_eq!(offset_of!(RwRequest32, nr_segments), request::NR_SEGMENTS);
        assert_eq!(offset_of!(RwRequest32, handle), request::HANDLE);
        assert_eq!(offset_of!(RwRequest32, id), x86_32::request::ID);
        assert_eq!(
            offset_of!(RwRequest32, sector_number),
            x86_32::request::SECTOR
        );
        assert_eq!(offset_of!(RwRequest32, seg), x86_32::request::SEGMENTS);
        assert_eq!(offset_of!(DiscardRequest32, flag), discard::FLAG);
        assert_eq!(offset_of!(DiscardRequest32, id), x86_32::request::ID);
        assert_eq!(
            offset_of!(DiscardRequest32, sector_number),
            x86_32::request::SECTOR
        );
        assert_eq!(
            offset_of!(DiscardRequest32, nr_sectors),
            x86_32::discard::NR_SECTORS
        );
        assert_eq!(size_of::<IndirectRequest32>(), INDIRECT_REQUEST_SIZE);
        assert_eq!(
            offset_of!(IndirectRequest32, indirect_op),
            indirect::INDIRECT_OP
        );
        assert_eq!(
            offset_of!(IndirectRequest32, nr_segments),
            indirect::NR_SEGMENTS
        );
        assert_eq!(offset_of!(IndirectRequest32, id), x86_32::request::ID);
        assert_eq!(
            offset_of!(IndirectRequest32, sector_number),
            x86_32::request::SECTOR
        );
        assert_eq!(
            offset_of!(IndirectRequest32, handle),
            x86_32::indirect::HANDLE
        );
        assert_eq!(
            offset_of!(IndirectRequest32, indirect_grefs),
            x86_32::indirect::INDIRECT_GREFS
        );
        assert_eq!(size_of::<Response32>(), x86_32::RESPONSE_SIZE);
        assert_eq!(offset_of!(Response32, id), response::ID);
        assert_eq!(offset_of!(Response32, operation), response::OPERATION);
        assert_eq!(offset_of!(Response32, status), response::STATUS);
    }

    #[test]
    fn x86_32_requests_become_their_x86_64_twins_byte_for_byte() {
        // A read of two segments, written by a 32-bit guest field by field.
        let mut raw = [0xeeu8; x86_32::REQUEST_SIZE];
        raw[0] = OP_READ;
        raw[1] = 2;
        raw[2..4].copy_from_slice(&0x0ca0u16.to_le_bytes());
        raw[4..12].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        raw[12..20].copy_from_slice(&0x0102_0304_0506u64.to_le_bytes());
        raw[20..24].copy_from_slice(&77u32.to_le_bytes());
        raw[24] = 1;
        raw[25] = 6;
        raw[28..32].copy_from_slice(&78u32.to_le_bytes());
        raw[32] = 0;
        raw[33] = 7;
        let native = x86_32::to_native(&raw);
        assert_eq!(native[request::OPERATION], OP_READ);
        assert_eq!(native[request::NR_SEGMENTS], 2);
        assert_eq!(native[request::HANDLE..request::HANDLE + 2], [0xa0, 0x0c]);
        assert_eq!(native[4..8], [0; 4], "the x86_64 padding is zero");
        assert_eq!(
            native[request::ID..request::ID + 8],
            0x1122_3344_5566_7788u64.to_le_bytes()
        );
        assert_eq!(
            native[request::SECTOR..request::SECTOR + 8],
            0x0102_0304_0506u64.to_le_bytes()
        );
        let seg = request::SEGMENTS;
        assert_eq!(native[seg..seg + 4], 77u32.to_le_bytes());
        assert_eq!((native[seg + 4], native[seg + 5]), (1, 6));
        assert_eq!(native[seg + 8..seg + 12], 78u32.to_le_bytes());
        assert_eq!((native[seg + 12], native[seg + 13]), (0, 7));
        // The last byte of the 32-bit slot is the last byte of the 64-bit one.
        assert_eq!(native[REQUEST_SIZE - 1], raw[x86_32::REQUEST_SIZE - 1]);

        // A discard and an indirect request: their fields after `id` move alike.
        let mut raw = [0u8; x86_32::REQUEST_SIZE];
        raw[0] = OP_DISCARD;
        raw[discard::FLAG] = DISCARD_SECURE;
        raw[20..28].copy_from_slice(&4096u64.to_le_bytes());
        let native = x86_32::to_native(&raw);
        assert_eq!(native[discard::FLAG], DISCARD_SECURE);
        assert_eq!(
            native[discard::NR_SECTORS..discard::NR_SECTORS + 8],
            4096u64.to_le_bytes()
        );
        let mut raw = [0u8; x86_32::REQUEST_SIZE];
        raw[0] = OP_INDIRECT;
        raw[indirect::INDIRECT_OP] = OP_WRITE;
        raw[2..4].copy_from_slice(&300u16.to_le_bytes());
        raw[20..22].copy_from_slice(&0x0ca0u16.to_le_bytes());
        for (i, gref) in [901u32, 902].iter().enumerate() {
            raw[24 + 4 * i..28 + 4 * i].copy_from_slice(&gref.to_le_bytes());
        }
        let native = x86_32::to_native(&raw);
        assert_eq!(native[indirect::INDIRECT_OP], OP_WRITE);
        assert_eq!(
            native[indirect::NR_SEGMENTS..indirect::NR_SEGMENTS + 2],
            300u16.to_le_bytes()
        );
        assert_eq!(native[indirect::HANDLE..indirect::HANDLE + 2], [0xa0, 0x0c]);
        let grefs = indirect::INDIRECT_GREFS;
        assert_eq!(native[grefs..grefs + 4], 901u32.to_le_bytes());
        assert_eq!(native[grefs + 4..grefs + 8], 902u32.to_le_bytes());
    }

    #[test]
    fn protocols_by_name_and_their_ring_sizes() {
        assert_eq!(Protocol::parse("x86_64-abi"), Some(Protocol::X86_64));
        assert_eq!(Protocol::parse(" x86_32-abi\n"), Some(Protocol::X86_32));
        assert_eq!(Protocol::parse("arm-abi"), None);
        assert_eq!(Protocol::default(), Protocol::X86_64);
        for order in 0..=MAX_RING_PAGE_ORDER {
            // (4096 * 2^order - 64) / 108 = 37, 75, 151, 302, 606 before rounding.
            assert_eq!(Protocol::X86_32.ring_slots(order), ring_slots(order));
            assert_eq!(Protocol::X86_64.ring_slots(order), ring_slots(order));
        }
        assert_eq!(Protocol::X86_32.entry_size(), 108);
        assert_eq!(Protocol::X86_32.response_size(), 12);
    }

    #[test]
    fn ring_slots_round_down_to_a_power_of_two() {
        // (4096 * 2^order - 64) / 112 = 36, 72, 145, 292, 584 before rounding.
        let slots: Vec<u32> = (0..=MAX_RING_PAGE_ORDER).map(ring_slots).collect();
        assert_eq!(slots, [32, 64, 128, 256, 512]);
        assert_eq!(SEGMENTS_PER_INDIRECT_PAGE, 512);
        assert_eq!(indirect_pages(1), 1);
        assert_eq!(indirect_pages(512), 1);
        assert_eq!(indirect_pages(513), 2);
        assert_eq!(indirect_pages(4096), MAX_INDIRECT_PAGES);
    }
}
