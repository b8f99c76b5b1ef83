// SPDX-License-Identifier: MIT OR Apache-2.0
//! The handover block: what the old image leaves the new one (docs/design.md §4.12, 4).
//!
//! Header: magic `BLKDOMHO`, [`HANDOVER_VERSION`], body length, sha256 of the body.
//! Body: fields in a fixed order, each list preceded by its count. [`Handover::decode`]
//! checks all of it before returning anything: the checksum, the version, every count
//! against the bytes left and its bound, every address against RAM and alignment, every
//! memory range against every other, and each reference (a vCPU's `vcpu_info`, a RAM
//! disk's stripe) against the range of its kind.

use alloc::string::String;
use alloc::vec::Vec;
use core::ops::Range;

use crate::image::{sha256, BuildId, MAX_BUILD_ID};
use crate::wire::{Reader, WireError, Writer};

pub const MAGIC: [u8; 8] = *b"BLKDOMHO";
/// The handover ABI this build writes and reads. Raise it for any change of the body;
/// an image's `blkdom` note says which versions it reads.
pub const HANDOVER_VERSION: u32 = 1;
/// Magic, version, body length, sha256.
pub const HEADER_LEN: usize = 8 + 4 + 4 + 32;
/// Largest body accepted (a few MiB: stripe tables of a few hundred GiB of RAM disks).
pub const MAX_BODY: usize = 16 << 20;

pub const PAGE: u64 = 4096;
/// vCPUs a handover may name (`smp::MAX_CPUS`).
pub const MAX_VCPUS: usize = 64;
/// `sizeof(struct vcpu_info)` on x86_64; each lies whole in one page, aligned to it.
pub const VCPU_INFO_SIZE: u64 = 64;
pub const MAX_RANGES: usize = 4096;
pub const MAX_RAM_DISKS: usize = 256;
pub const MAX_VBDS: usize = 1024;
/// `blkback::abi::MAX_RING_PAGE_ORDER`.
pub const MAX_RING_PAGE_ORDER: u8 = 4;
/// Keys a vbd publishes at connect (the `feature-*`, geometry and discard keys).
pub const MAX_PUBLISHED: usize = 32;
/// A RAM disk's stripes (`blkdev`'s 64 KiB).
pub const STRIPE_SIZE: u64 = 64 << 10;

/// What a reserved memory range holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum RangeKind {
    /// Pages holding the vCPUs' `vcpu_info` (registered once, for the domain's life).
    VcpuInfo = 1,
    /// Below 1 MiB: the trampoline, its page tables and the parked vCPUs' mailboxes.
    Park = 2,
    /// RAM disk stripes.
    RamDisk = 3,
    /// The `shared_info` page: Xen took the frame there when it was added to the physmap,
    /// and adding it elsewhere would leave a hole where RAM was.
    SharedInfo = 4,
}

impl RangeKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::VcpuInfo),
            2 => Some(Self::Park),
            3 => Some(Self::RamDisk),
            4 => Some(Self::SharedInfo),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemRange {
    pub kind: RangeKind,
    pub start: u64,
    pub len: u64,
}

impl MemRange {
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripe {
    /// Its place in the disk (byte offset / [`STRIPE_SIZE`]).
    pub index: u32,
    pub paddr: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamDiskRecord {
    pub name: String,
    pub capacity: u64,
    /// Resident stripes; those absent read as zeroes.
    pub stripes: Vec<Stripe>,
}

/// Protocol numbers in the block (not `blkback::abi::Protocol`'s own representation).
pub const PROTOCOL_X86_64: u8 = 0;
pub const PROTOCOL_X86_32: u8 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueRecord {
    pub ring_refs: Vec<u32>,
    /// The frontend's port, unbound since the old image closed its end.
    pub frontend_port: u32,
    /// The old image's port (closed; for the log).
    pub backend_port: u32,
    /// Where the old image stopped: every request before it was answered.
    pub rsp_prod: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VbdRecord {
    pub backend_path: String,
    pub frontend_path: String,
    pub frontend_id: u16,
    /// The backing store it serves (its `params`).
    pub params: String,
    pub ring_order: u8,
    pub protocol: u8,
    pub persistent_grants: bool,
    pub read_only: bool,
    pub discard: bool,
    pub max_indirect_segments: u16,
    pub queues: Vec<QueueRecord>,
    /// Every key published at connect, with its value: the new image publishes the same.
    pub published: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    pub old_build_id: BuildId,
    /// Upgrades since the domain was built.
    pub generation: u32,
    /// vCPUs online at the jump: vCPU 0 jumped, the others wait in the park area.
    pub vcpus: u32,
    /// vCPU n's `vcpu_info` address; empty without Xen.
    pub vcpu_info: Vec<u64>,
    /// Where `shared_info` is; 0 without Xen.
    pub shared_info: u64,
    /// The page the parked vCPUs wait in.
    pub park_page: u64,
    pub ranges: Vec<MemRange>,
    pub ram_disks: Vec<RamDiskRecord>,
    pub vbds: Vec<VbdRecord>,
}

/// What the new image knows of its machine, to check the block against.
#[derive(Clone, Copy, Debug)]
pub struct Limits<'a> {
    /// RAM, from the memory map it was booted with.
    pub ram: &'a [Range<u64>],
    /// vCPUs the domain has.
    pub vcpus: usize,
    /// Queues a frontend may have (`multi-queue-max-queues`).
    pub max_queues: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandoverError {
    Wire(WireError),
    Magic,
    Version(u32),
    BodyLength(usize),
    Checksum,
    TrailingBytes,
    BadBuildId,
    VcpuCount(usize),
    SharedInfo(u64),
    VcpuInfo {
        vcpu: usize,
        addr: u64,
    },
    RangeKind(u8),
    RangeNotInRam {
        start: u64,
        len: u64,
    },
    RangesOverlap {
        first: u64,
        second: u64,
    },
    NoParkRange(u64),
    TooMany {
        what: &'static str,
        count: usize,
    },
    RamDiskCapacity {
        name: String,
        capacity: u64,
    },
    Stripe {
        name: String,
        index: u32,
        paddr: u64,
    },
    StripesOverlap {
        name: String,
        paddr: u64,
    },
    DuplicateName(String),
    RingOrder {
        path: String,
        order: u8,
    },
    Protocol {
        path: String,
        protocol: u8,
    },
    Queues {
        path: String,
        queues: usize,
    },
    RingRefs {
        path: String,
        queue: usize,
        refs: usize,
    },
    Port {
        path: String,
        queue: usize,
    },
    PublishedKey {
        path: String,
        key: String,
    },
}

impl From<WireError> for HandoverError {
    fn from(e: WireError) -> Self {
        HandoverError::Wire(e)
    }
}

impl core::fmt::Display for HandoverError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use HandoverError::*;
        match self {
            Wire(e) => write!(f, "{e}"),
            Magic => f.write_str("no handover magic"),
            Version(v) => write!(
                f,
                "handover version {v}, this image reads {HANDOVER_VERSION}"
            ),
            BodyLength(n) => write!(f, "body of {n} bytes does not fit"),
            Checksum => f.write_str("handover checksum differs"),
            TrailingBytes => f.write_str("bytes after the last record"),
            BadBuildId => f.write_str("bad build id"),
            VcpuCount(n) => write!(f, "{n} vCPUs handed over"),
            SharedInfo(a) => write!(f, "shared_info at {a:#x} is not a shared_info range"),
            VcpuInfo { vcpu, addr } => {
                write!(
                    f,
                    "vCPU {vcpu}'s vcpu_info at {addr:#x} is not in a vcpu_info range"
                )
            }
            RangeKind(k) => write!(f, "unknown range kind {k}"),
            RangeNotInRam { start, len } => {
                write!(f, "range {start:#x}+{len:#x} is not page-aligned RAM")
            }
            RangesOverlap { first, second } => {
                write!(f, "ranges at {first:#x} and {second:#x} overlap")
            }
            NoParkRange(p) => write!(f, "park page {p:#x} is not a park range"),
            TooMany { what, count } => write!(f, "{count} {what}: too many"),
            RamDiskCapacity { name, capacity } => {
                write!(f, "RAM disk {name}: capacity {capacity} not whole sectors")
            }
            Stripe { name, index, paddr } => write!(
                f,
                "RAM disk {name}: stripe {index} at {paddr:#x} outside the disk or its memory"
            ),
            StripesOverlap { name, paddr } => {
                write!(f, "RAM disk {name}: stripes overlap at {paddr:#x}")
            }
            DuplicateName(n) => write!(f, "{n} handed over twice"),
            RingOrder { path, order } => write!(f, "{path}: ring order {order}"),
            Protocol { path, protocol } => write!(f, "{path}: protocol {protocol}"),
            Queues { path, queues } => write!(f, "{path}: {queues} queues"),
            RingRefs { path, queue, refs } => {
                write!(f, "{path}: queue {queue} has {refs} ring references")
            }
            Port { path, queue } => write!(f, "{path}: queue {queue} has no frontend port"),
            PublishedKey { path, key } => write!(f, "{path}: published key {key:?}"),
        }
    }
}

impl core::error::Error for HandoverError {}

impl Handover {
    /// The whole block: header and body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(self.old_build_id.as_bytes());
        w.u32(self.generation);
        w.u32(self.vcpus);
        w.count(self.vcpu_info.len());
        self.vcpu_info.iter().for_each(|&a| w.u64(a));
        w.u64(self.shared_info);
        w.u64(self.park_page);
        w.count(self.ranges.len());
        for r in &self.ranges {
            w.u8(r.kind as u8);
            w.u64(r.start);
            w.u64(r.len);
        }
        w.count(self.ram_disks.len());
        for d in &self.ram_disks {
            w.str(&d.name);
            w.u64(d.capacity);
            w.count(d.stripes.len());
            for s in &d.stripes {
                w.u32(s.index);
                w.u64(s.paddr);
            }
        }
        w.count(self.vbds.len());
        for v in &self.vbds {
            w.str(&v.backend_path);
            w.str(&v.frontend_path);
            w.u16(v.frontend_id);
            w.str(&v.params);
            w.u8(v.ring_order);
            w.u8(v.protocol);
            w.u8(v.persistent_grants as u8 | (v.read_only as u8) << 1 | (v.discard as u8) << 2);
            w.u16(v.max_indirect_segments);
            w.count(v.queues.len());
            for q in &v.queues {
                w.count(q.ring_refs.len());
                q.ring_refs.iter().for_each(|&r| w.u32(r));
                w.u32(q.frontend_port);
                w.u32(q.backend_port);
                w.u32(q.rsp_prod);
            }
            w.count(v.published.len());
            for (k, value) in &v.published {
                w.str(k);
                w.str(value);
            }
        }
        let body = w.bytes;
        let mut block = Vec::with_capacity(HEADER_LEN + body.len());
        block.extend_from_slice(&MAGIC);
        block.extend_from_slice(&HANDOVER_VERSION.to_le_bytes());
        block.extend_from_slice(&(body.len() as u32).to_le_bytes());
        block.extend_from_slice(&sha256(&body));
        block.extend_from_slice(&body);
        block
    }

    /// Reads and checks a block (see the module's comment). `block` may be longer than
    /// the block (the rest of its last page).
    pub fn decode(block: &[u8], limits: &Limits<'_>) -> Result<Self, HandoverError> {
        let mut header = Reader::new(block);
        if header.array::<8>()? != MAGIC {
            return Err(HandoverError::Magic);
        }
        let version = header.u32()?;
        if version != HANDOVER_VERSION {
            return Err(HandoverError::Version(version));
        }
        let len = header.u32()? as usize;
        let sum = header.array::<32>()?;
        if len > MAX_BODY || HEADER_LEN + len > block.len() {
            return Err(HandoverError::BodyLength(len));
        }
        let body = &block[HEADER_LEN..HEADER_LEN + len];
        if sha256(body) != sum {
            return Err(HandoverError::Checksum);
        }
        let handover = Self::read_body(&mut Reader::new(body))?;
        handover.check(limits)?;
        Ok(handover)
    }

    fn read_body(r: &mut Reader<'_>) -> Result<Self, HandoverError> {
        let old_build_id =
            BuildId::new(r.bytes("build id", MAX_BUILD_ID)?).ok_or(HandoverError::BadBuildId)?;
        let generation = r.u32()?;
        let vcpus = r.u32()?;
        let n = bounded(r.count("vCPUs", 8)?, MAX_VCPUS, "vCPUs")?;
        let vcpu_info = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
        let shared_info = r.u64()?;
        let park_page = r.u64()?;
        let n = bounded(r.count("ranges", 17)?, MAX_RANGES, "ranges")?;
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            let kind = r.u8()?;
            let kind = RangeKind::from_u8(kind).ok_or(HandoverError::RangeKind(kind))?;
            ranges.push(MemRange {
                kind,
                start: r.u64()?,
                len: r.u64()?,
            });
        }
        let n = bounded(r.count("RAM disks", 16)?, MAX_RAM_DISKS, "RAM disks")?;
        let mut ram_disks = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.string("RAM disk name")?;
            let capacity = r.u64()?;
            let n = r.count("stripes", 12)?;
            let stripes = (0..n)
                .map(|_| {
                    Ok(Stripe {
                        index: r.u32()?,
                        paddr: r.u64()?,
                    })
                })
                .collect::<Result<_, WireError>>()?;
            ram_disks.push(RamDiskRecord {
                name,
                capacity,
                stripes,
            });
        }
        let n = bounded(r.count("vbds", 32)?, MAX_VBDS, "vbds")?;
        let mut vbds = Vec::with_capacity(n);
        for _ in 0..n {
            let backend_path = r.string("backend path")?;
            let frontend_path = r.string("frontend path")?;
            let frontend_id = r.u16()?;
            let params = r.string("params")?;
            let ring_order = r.u8()?;
            let protocol = r.u8()?;
            let flags = r.u8()?;
            let max_indirect_segments = r.u16()?;
            let n = r.count("queues", 16)?;
            let mut queues = Vec::with_capacity(n);
            for _ in 0..n {
                let refs = bounded(
                    r.count("ring references", 4)?,
                    1 << MAX_RING_PAGE_ORDER,
                    "ring references",
                )?;
                let ring_refs = (0..refs).map(|_| r.u32()).collect::<Result<_, _>>()?;
                queues.push(QueueRecord {
                    ring_refs,
                    frontend_port: r.u32()?,
                    backend_port: r.u32()?,
                    rsp_prod: r.u32()?,
                });
            }
            let n = bounded(
                r.count("published keys", 8)?,
                MAX_PUBLISHED,
                "published keys",
            )?;
            let published = (0..n)
                .map(|_| Ok((r.string("key")?, r.string("value")?)))
                .collect::<Result<_, WireError>>()?;
            vbds.push(VbdRecord {
                backend_path,
                frontend_path,
                frontend_id,
                params,
                ring_order,
                protocol,
                persistent_grants: flags & 1 != 0,
                read_only: flags & 2 != 0,
                discard: flags & 4 != 0,
                max_indirect_segments,
                queues,
                published,
            });
        }
        if !r.is_empty() {
            return Err(HandoverError::TrailingBytes);
        }
        Ok(Self {
            old_build_id,
            generation,
            vcpus,
            vcpu_info,
            shared_info,
            park_page,
            ranges,
            ram_disks,
            vbds,
        })
    }

    /// Every rule a field obeys beyond its encoding.
    fn check(&self, limits: &Limits<'_>) -> Result<(), HandoverError> {
        // Ranges: page-aligned, non-empty, in RAM, and disjoint.
        for r in &self.ranges {
            let in_ram = limits.ram.iter().any(|ram| {
                ram.start <= r.start && r.start.checked_add(r.len).is_some_and(|end| end <= ram.end)
            });
            if r.len == 0 || !r.start.is_multiple_of(PAGE) || !r.len.is_multiple_of(PAGE) || !in_ram
            {
                return Err(HandoverError::RangeNotInRam {
                    start: r.start,
                    len: r.len,
                });
            }
        }
        let mut sorted: Vec<&MemRange> = self.ranges.iter().collect();
        sorted.sort_by_key(|r| r.start);
        for pair in sorted.windows(2) {
            if pair[1].start < pair[0].end() {
                return Err(HandoverError::RangesOverlap {
                    first: pair[0].start,
                    second: pair[1].start,
                });
            }
        }
        let inside = |kind: RangeKind, start: u64, len: u64| {
            start.checked_add(len).is_some_and(|end| {
                self.ranges
                    .iter()
                    .any(|r| r.kind == kind && r.start <= start && end <= r.end())
            })
        };

        // Under Xen every vCPU has its `vcpu_info`; without Xen none has.
        let vcpus = self.vcpus as usize;
        if vcpus == 0
            || vcpus > limits.vcpus
            || (!self.vcpu_info.is_empty() && self.vcpu_info.len() != vcpus)
        {
            return Err(HandoverError::VcpuCount(vcpus.max(self.vcpu_info.len())));
        }
        let xen = !self.vcpu_info.is_empty();
        let shared_info_ok = match xen {
            true => {
                self.shared_info.is_multiple_of(PAGE)
                    && inside(RangeKind::SharedInfo, self.shared_info, PAGE)
            }
            false => self.shared_info == 0,
        };
        if !shared_info_ok {
            return Err(HandoverError::SharedInfo(self.shared_info));
        }
        for (vcpu, &addr) in self.vcpu_info.iter().enumerate() {
            if !addr.is_multiple_of(VCPU_INFO_SIZE)
                || !inside(RangeKind::VcpuInfo, addr, VCPU_INFO_SIZE)
            {
                return Err(HandoverError::VcpuInfo { vcpu, addr });
            }
        }
        if !self.park_page.is_multiple_of(PAGE) || !inside(RangeKind::Park, self.park_page, PAGE) {
            return Err(HandoverError::NoParkRange(self.park_page));
        }

        for (i, disk) in self.ram_disks.iter().enumerate() {
            if self.ram_disks[..i].iter().any(|d| d.name == disk.name) {
                return Err(HandoverError::DuplicateName(disk.name.clone()));
            }
            if !disk.capacity.is_multiple_of(512) {
                return Err(HandoverError::RamDiskCapacity {
                    name: disk.name.clone(),
                    capacity: disk.capacity,
                });
            }
            let stripes_in_disk = disk.capacity.div_ceil(STRIPE_SIZE);
            if disk.stripes.len() as u64 > stripes_in_disk {
                return Err(HandoverError::TooMany {
                    what: "stripes",
                    count: disk.stripes.len(),
                });
            }
            let mut seen: Vec<&Stripe> = disk.stripes.iter().collect();
            for s in &seen {
                if u64::from(s.index) >= stripes_in_disk
                    || !s.paddr.is_multiple_of(PAGE)
                    || !inside(RangeKind::RamDisk, s.paddr, STRIPE_SIZE)
                {
                    return Err(HandoverError::Stripe {
                        name: disk.name.clone(),
                        index: s.index,
                        paddr: s.paddr,
                    });
                }
            }
            seen.sort_by_key(|s| s.index);
            if let Some(pair) = seen.windows(2).find(|p| p[0].index == p[1].index) {
                return Err(HandoverError::Stripe {
                    name: disk.name.clone(),
                    index: pair[1].index,
                    paddr: pair[1].paddr,
                });
            }
        }
        // No two stripes, of one disk or of two, share memory.
        let mut all: Vec<u64> = self
            .ram_disks
            .iter()
            .flat_map(|d| d.stripes.iter().map(|s| s.paddr))
            .collect();
        all.sort_unstable();
        if let Some(pair) = all.windows(2).find(|p| p[1] < p[0] + STRIPE_SIZE) {
            let name = self
                .ram_disks
                .iter()
                .find(|d| d.stripes.iter().any(|s| s.paddr == pair[1]))
                .map(|d| d.name.clone())
                .unwrap_or_default();
            return Err(HandoverError::StripesOverlap {
                name,
                paddr: pair[1],
            });
        }

        for (i, vbd) in self.vbds.iter().enumerate() {
            let path = || vbd.backend_path.clone();
            if self.vbds[..i]
                .iter()
                .any(|v| v.backend_path == vbd.backend_path)
            {
                return Err(HandoverError::DuplicateName(path()));
            }
            if vbd.ring_order > MAX_RING_PAGE_ORDER {
                return Err(HandoverError::RingOrder {
                    path: path(),
                    order: vbd.ring_order,
                });
            }
            if vbd.protocol != PROTOCOL_X86_64 && vbd.protocol != PROTOCOL_X86_32 {
                return Err(HandoverError::Protocol {
                    path: path(),
                    protocol: vbd.protocol,
                });
            }
            if vbd.queues.is_empty() || vbd.queues.len() > limits.max_queues {
                return Err(HandoverError::Queues {
                    path: path(),
                    queues: vbd.queues.len(),
                });
            }
            for (queue, q) in vbd.queues.iter().enumerate() {
                if q.ring_refs.len() != 1 << vbd.ring_order {
                    return Err(HandoverError::RingRefs {
                        path: path(),
                        queue,
                        refs: q.ring_refs.len(),
                    });
                }
                if q.frontend_port == 0 {
                    return Err(HandoverError::Port {
                        path: path(),
                        queue,
                    });
                }
            }
            for (k, (key, _)) in vbd.published.iter().enumerate() {
                let bad = key.is_empty()
                    || key.contains('/')
                    || key == "state"
                    || vbd.published[..k].iter().any(|(other, _)| other == key);
                if bad {
                    return Err(HandoverError::PublishedKey {
                        path: path(),
                        key: key.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn bounded(count: usize, max: usize, what: &'static str) -> Result<usize, HandoverError> {
    if count > max {
        return Err(HandoverError::TooMany { what, count });
    }
    Ok(count)
}
