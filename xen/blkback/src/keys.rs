// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore keys of a vbd, and of blkdom's own directory for its vbds, by name: the
//! toolstack's, the frontend's, and those blkdom publishes. The keys any xenbus device
//! has (`state`, `frontend`, `online`, ...) and the domain's own (`domid`,
//! `control/shutdown`, ...) are in [`xen::xenbus::keys`]; README.md's "Xenstore keys"
//! lists the keys of both lists, each under its [`Place`], and
//! `tests/xenstore_keys.rs` checks that they agree and that blkdom's sources name no
//! key with a string literal.
//!
//! A key with a number in its name is written with a placeholder (`ring-ref<N>`) and
//! made with [`numbered`].

pub use xen::xenbus::keys::{numbered, Key, Place};

/// The backing store (`target=`); rewritten by an operator to resize the disk.
pub const PARAMS: &str = "params";
/// Writable if it has a `w`.
pub const MODE: &str = "mode";
/// `cdrom` makes a CD-ROM (in the backend's directory or the frontend's).
pub const DEVICE_TYPE: &str = "device-type";
/// `0` turns discard off.
pub const DISCARD_ENABLE: &str = "discard-enable";
/// The vbd's I/O limits (`crate::limits`), read at attach and whenever rewritten;
/// absent, empty or `0`: unlimited.
pub const LIMIT_IOPS: &str = "limit-iops";
pub const LIMIT_READ_IOPS: &str = "limit-read-iops";
pub const LIMIT_WRITE_IOPS: &str = "limit-write-iops";
pub const LIMIT_BYTES: &str = "limit-bytes-per-sec";
pub const LIMIT_READ_BYTES: &str = "limit-read-bytes-per-sec";
pub const LIMIT_WRITE_BYTES: &str = "limit-write-bytes-per-sec";
/// The burst allowance, in milliseconds of each limit's rate.
pub const LIMIT_BURST_MS: &str = "limit-burst-ms";
/// What every limit key's name starts with: an unknown key with it is refused (a typo
/// must not pass for "unlimited").
pub const LIMIT_PREFIX: &str = "limit-";

pub const FEATURE_MAX_INDIRECT_SEGMENTS: &str = "feature-max-indirect-segments";
pub const MULTI_QUEUE_MAX_QUEUES: &str = "multi-queue-max-queues";
pub const MAX_RING_PAGE_ORDER: &str = "max-ring-page-order";
pub const SECTORS: &str = "sectors";
/// `VDISK_*` bits.
pub const INFO: &str = "info";
pub const SECTOR_SIZE: &str = "sector-size";
pub const PHYSICAL_SECTOR_SIZE: &str = "physical-sector-size";
pub const FEATURE_FLUSH_CACHE: &str = "feature-flush-cache";
pub const FEATURE_BARRIER: &str = "feature-barrier";
/// What each side offers (as Linux since 2022: not the negotiated result); persistent
/// grants are used when both wrote 1.
pub const FEATURE_PERSISTENT: &str = "feature-persistent";
pub const FEATURE_DISCARD: &str = "feature-discard";
pub const DISCARD_GRANULARITY: &str = "discard-granularity";
pub const DISCARD_ALIGNMENT: &str = "discard-alignment";
pub const DISCARD_SECURE: &str = "discard-secure";
/// The disk's counters, one line of `name=value` words.
pub const STATS: &str = "blkdom-stats";
/// How the last resize went: "<sectors> sectors", or "refused: <reason>".
pub const RESIZE: &str = "blkdom-resize";
/// Why the disk's device failed; written once, when it is first seen.
pub const FAULT: &str = "blkdom-fault";
/// The I/O limits in force ("none", or the limited rates), or "refused: <why>" when the
/// `limit-*` keys were refused (the limits before stay).
pub const LIMITS: &str = "blkdom-limits";

pub const RING_PAGE_ORDER: &str = "ring-page-order";
pub const MULTI_QUEUE_NUM_QUEUES: &str = "multi-queue-num-queues";
pub const PROTOCOL: &str = "protocol";
/// Non-zero: the frontend counts sectors (`sectors`, `sector_number`, `first_sect`,
/// `last_sect`) in `sector-size` units (Windows PV drivers; QEMU's qdisk serves that).
/// blkdom counts in 512-byte units as Linux does: such a frontend on a disk whose
/// `sector-size` is not 512 is refused (blkif.h deprecated the key in 2024).
pub const FEATURE_LARGE_SECTOR_SIZE: &str = "feature-large-sector-size";
/// A ring's event channel, in the frontend's directory (one queue) or its queue's.
pub const EVENT_CHANNEL: &str = "event-channel";
/// A one-page ring's grant.
pub const RING_REF: &str = "ring-ref";
/// Page N's grant of a ring of several pages.
pub const RING_REF_N: &str = "ring-ref<N>";
/// Queue N's directory under the frontend's, with its [`EVENT_CHANNEL`] and
/// [`RING_REF`] or [`RING_REF_N`] (several queues).
pub const QUEUE_N: &str = "queue-<N>";

/// The vbds the toolstack creates, under blkdom's own directory (watched).
pub const VBD_DIRECTORY: &str = "backend/vbd";
/// The pollers' counters.
pub const POLLERS: &str = "data/blkdom-pollers";
/// The storage network's vif: its counters, one line of `name=value` words.
pub const NET: &str = "data/blkdom-net";
/// Each remote namespace blkdom serves disks from, `<n>` by its number: its state and
/// counters as `name=value` words, then `target=` with the target (last: it may hold
/// spaces). A remote that is forgotten loses its node.
pub const REMOTES: &str = "data/blkdom-remotes";
/// The devices blkdom drives and the names that reach them: `<n>` per controller or
/// device, one line of `name=value` words each (and one per NVMe namespace), written at
/// boot.
pub const DEVICES: &str = "data/blkdom-devices";
/// Which build of blkdom runs: "<version> <build id>", written at boot (`blkdom-stat`
/// shows it; a live upgrade changes it).
pub const BUILD: &str = "data/blkdom-build";
/// A live upgrade's request, written by dom0's `tools/blkdom-upgrade` (watched; taken
/// only from the toolstack: `handover::request`).
pub const UPGRADE: &str = "control/blkdom-upgrade";
/// What blkdom answers a live upgrade's request (`handover::receive::Answer`).
pub const UPGRADE_ANSWER: &str = "data/blkdom-upgrade";
/// Writing anything non-empty here (`xenstore-write /local/domain/<id>/data/blkdom-report
/// 1` in dom0) has the statistics printed on the console.
pub const REPORT: &str = "data/blkdom-report";

/// Every key of a vbd and of blkdom's own directory blkdom uses, where it uses it.
pub const ALL: &[Key] = &[
    Key::new(PARAMS, Place::BackendRead),
    Key::new(MODE, Place::BackendRead),
    Key::new(DEVICE_TYPE, Place::BackendRead),
    Key::new(DISCARD_ENABLE, Place::BackendRead),
    Key::new(LIMIT_IOPS, Place::BackendRead),
    Key::new(LIMIT_READ_IOPS, Place::BackendRead),
    Key::new(LIMIT_WRITE_IOPS, Place::BackendRead),
    Key::new(LIMIT_BYTES, Place::BackendRead),
    Key::new(LIMIT_READ_BYTES, Place::BackendRead),
    Key::new(LIMIT_WRITE_BYTES, Place::BackendRead),
    Key::new(LIMIT_BURST_MS, Place::BackendRead),
    Key::new(FEATURE_MAX_INDIRECT_SEGMENTS, Place::BackendWritten),
    Key::new(MULTI_QUEUE_MAX_QUEUES, Place::BackendWritten),
    Key::new(MAX_RING_PAGE_ORDER, Place::BackendWritten),
    Key::new(SECTORS, Place::BackendWritten),
    Key::new(INFO, Place::BackendWritten),
    Key::new(SECTOR_SIZE, Place::BackendWritten),
    Key::new(PHYSICAL_SECTOR_SIZE, Place::BackendWritten),
    Key::new(FEATURE_FLUSH_CACHE, Place::BackendWritten),
    Key::new(FEATURE_BARRIER, Place::BackendWritten),
    Key::new(FEATURE_PERSISTENT, Place::BackendWritten),
    Key::new(FEATURE_DISCARD, Place::BackendWritten),
    Key::new(DISCARD_GRANULARITY, Place::BackendWritten),
    Key::new(DISCARD_ALIGNMENT, Place::BackendWritten),
    Key::new(DISCARD_SECURE, Place::BackendWritten),
    Key::new(STATS, Place::BackendWritten),
    Key::new(RESIZE, Place::BackendWritten),
    Key::new(FAULT, Place::BackendWritten),
    Key::new(LIMITS, Place::BackendWritten),
    // Written back as served when a resize is refused.
    Key::new(PARAMS, Place::BackendWritten),
    Key::new(RING_PAGE_ORDER, Place::FrontendRead),
    Key::new(MULTI_QUEUE_NUM_QUEUES, Place::FrontendRead),
    Key::new(PROTOCOL, Place::FrontendRead),
    Key::new(FEATURE_PERSISTENT, Place::FrontendRead),
    Key::new(FEATURE_LARGE_SECTOR_SIZE, Place::FrontendRead),
    Key::new(EVENT_CHANNEL, Place::FrontendRead),
    Key::new(RING_REF, Place::FrontendRead),
    Key::new(RING_REF_N, Place::FrontendRead),
    // Several queues: each queue's keys in its QUEUE_N directory.
    Key::new("queue-<N>/event-channel", Place::FrontendRead),
    Key::new("queue-<N>/ring-ref", Place::FrontendRead),
    Key::new("queue-<N>/ring-ref<M>", Place::FrontendRead),
    Key::new(DEVICE_TYPE, Place::FrontendRead),
    Key::new(VBD_DIRECTORY, Place::Home),
    Key::new(POLLERS, Place::Home),
    Key::new(NET, Place::Home),
    Key::new("data/blkdom-remotes/<n>", Place::Home),
    Key::new("data/blkdom-devices/<n>", Place::Home),
    Key::new(REPORT, Place::Home),
    Key::new(BUILD, Place::Home),
    Key::new(UPGRADE, Place::Home),
    Key::new(UPGRADE_ANSWER, Place::Home),
    // Linux's error node, made by `xen::xenbus::error::error_node` from the backend path.
    Key::new("error/backend/vbd/<domid>/<devid>/error", Place::Home),
];
