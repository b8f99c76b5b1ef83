// SPDX-License-Identifier: MIT OR Apache-2.0
//! Per-vbd I/O limits: the `limit-*` keys of a vbd's backend directory ([`IoLimits`],
//! parsed by [`IoLimits::parse`]) and the token buckets a ring enforces them with
//! ([`Limiter`]).
//!
//! Each bucket is kept as a virtual time (GCRA): `tat`, the time at which the bucket
//! would be full again. A request is admitted while none of its buckets is in debt past
//! the burst window (`tat <= now + burst`), and charged by moving `tat` on by its cost at
//! the bucket's rate. A request larger than the burst is still admitted when the bucket
//! is not in debt, and puts it in debt: it makes progress, and what follows waits for the
//! debt to be repaid. A ring whose next request is not admitted leaves it unanswered
//! until [`Limiter::due`], which the poller's sleep takes into account: no timer, no
//! error, only delay. One `u64` per bucket, no allocation, no lock: each ring owns its
//! buckets and its poller alone touches them.

use core::fmt;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use xen::xenbus::error as xenbus_error;
use xen::xenbus::{StoreError, XenStore, NO_TRANSACTION};

use crate::keys::LIMITS;
pub use crate::keys::{
    LIMIT_BURST_MS, LIMIT_BYTES, LIMIT_IOPS, LIMIT_PREFIX, LIMIT_READ_BYTES, LIMIT_READ_IOPS,
    LIMIT_WRITE_BYTES, LIMIT_WRITE_IOPS,
};

/// The keys, in the order of [`Bucket`] indices, then the burst.
pub const LIMIT_KEYS: [&str; 7] = [
    LIMIT_IOPS,
    LIMIT_READ_IOPS,
    LIMIT_WRITE_IOPS,
    LIMIT_BYTES,
    LIMIT_READ_BYTES,
    LIMIT_WRITE_BYTES,
    LIMIT_BURST_MS,
];

/// The default burst: 100 ms of each rate (QEMU's throttling allows a tenth of a second
/// too when no burst is set).
pub const DEFAULT_BURST_MS: u32 = 100;
/// The longest burst accepted.
pub const MAX_BURST_MS: u32 = 10_000;
/// The highest IOPS limit accepted (far above any device; keeps the arithmetic exact).
pub const MAX_IOPS: u64 = 100_000_000;
/// The highest bandwidth limit accepted: 1 TiB/s.
pub const MAX_BYTES_PER_SEC: u64 = 1 << 40;

/// Total, read and write rates of one kind (0: unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    pub total: u64,
    pub read: u64,
    pub write: u64,
}

/// A vbd's limits: operations and bytes per second, and the burst allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoLimits {
    pub iops: Rates,
    pub bytes: Rates,
    pub burst_ms: u32,
}

impl Default for IoLimits {
    fn default() -> Self {
        Self::NONE
    }
}

/// Why a vbd's limit keys were refused (the limits in force stay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// A key that starts with `limit-` but is none of [`LIMIT_KEYS`].
    UnknownKey(alloc::string::String),
    /// A value that is not a number (with a `K`, `M` or `G` suffix for bytes).
    NotANumber {
        key: &'static str,
        value: alloc::string::String,
    },
    /// A value above the key's maximum (or a burst of 0).
    OutOfRange {
        key: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::UnknownKey(key) => write!(
                f,
                "unknown key {key}: the limit keys are {}",
                LIMIT_KEYS.join(", ")
            ),
            LimitError::NotANumber { key, value } => {
                let want = if key.ends_with("bytes-per-sec") {
                    "bytes per second, a number with an optional K, M or G suffix"
                } else {
                    "a whole number"
                };
                write!(f, "{key}={value:?}: want {want} (0 or empty: unlimited)")
            }
            LimitError::OutOfRange {
                key,
                value,
                min,
                max,
            } => write!(f, "{key}={value}: must be {min}..={max}"),
        }
    }
}

impl IoLimits {
    /// No limit at all.
    pub const NONE: IoLimits = IoLimits {
        iops: Rates {
            total: 0,
            read: 0,
            write: 0,
        },
        bytes: Rates {
            total: 0,
            read: 0,
            write: 0,
        },
        burst_ms: DEFAULT_BURST_MS,
    };

    /// True when no rate is limited.
    pub fn is_unlimited(&self) -> bool {
        self.rates().iter().all(|&rate| rate == 0)
    }

    /// The six rates in [`Bucket`] order.
    fn rates(&self) -> [u64; 6] {
        [
            self.iops.total,
            self.iops.read,
            self.iops.write,
            self.bytes.total,
            self.bytes.read,
            self.bytes.write,
        ]
    }

    /// The limits from a vbd's `limit-*` keys, given as (key, value) for every key of
    /// the backend directory that starts with [`LIMIT_PREFIX`]. Absent, empty or `0`:
    /// unlimited. IOPS are whole numbers; bytes per second take a binary `K`, `M` or
    /// `G` suffix (`8M` is 8 MiB/s); the burst is 1..=10,000 ms.
    pub fn parse<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<IoLimits, LimitError> {
        let mut limits = IoLimits::NONE;
        for (key, value) in entries {
            let Some(&known) = LIMIT_KEYS.iter().find(|&&k| k == key) else {
                return Err(LimitError::UnknownKey(key.into()));
            };
            let value = value.trim();
            let bytes = known.ends_with("bytes-per-sec");
            let number = if value.is_empty() {
                0
            } else {
                parse_number(value, bytes).ok_or_else(|| LimitError::NotANumber {
                    key: known,
                    value: value.into(),
                })?
            };
            let (min, max) = match known {
                LIMIT_BURST_MS => (1, u64::from(MAX_BURST_MS)),
                _ if bytes => (0, MAX_BYTES_PER_SEC),
                _ => (0, MAX_IOPS),
            };
            // An empty burst is the default, not 0.
            let number = if known == LIMIT_BURST_MS && value.is_empty() {
                u64::from(DEFAULT_BURST_MS)
            } else {
                number
            };
            if number < min || number > max {
                return Err(LimitError::OutOfRange {
                    key: known,
                    value: number,
                    min,
                    max,
                });
            }
            match known {
                LIMIT_IOPS => limits.iops.total = number,
                LIMIT_READ_IOPS => limits.iops.read = number,
                LIMIT_WRITE_IOPS => limits.iops.write = number,
                LIMIT_BYTES => limits.bytes.total = number,
                LIMIT_READ_BYTES => limits.bytes.read = number,
                LIMIT_WRITE_BYTES => limits.bytes.write = number,
                _ => limits.burst_ms = number as u32,
            }
        }
        Ok(limits)
    }

    /// What each of `queues` rings enforces: every rate split evenly (rounded up, never
    /// below 1 where limited), the burst as it is.
    pub fn per_queue(&self, queues: usize) -> IoLimits {
        let queues = queues.max(1) as u64;
        let split = |rate: u64| if rate == 0 { 0 } else { rate.div_ceil(queues) };
        let rates = |r: Rates| Rates {
            total: split(r.total),
            read: split(r.read),
            write: split(r.write),
        };
        IoLimits {
            iops: rates(self.iops),
            bytes: rates(self.bytes),
            burst_ms: self.burst_ms,
        }
    }
}

/// What one queue of a disk did over a span: requests and bytes it let through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueUse {
    pub ops: u64,
    pub bytes: u64,
}

impl QueueUse {
    /// A ring's counters as a running total (`RingStats`: requests of every kind, bytes
    /// read and written).
    pub fn of(stats: &crate::stats::RingStats) -> Self {
        QueueUse {
            ops: stats.reads + stats.writes + stats.flushes + stats.discards,
            bytes: (stats.sectors_read + stats.sectors_written) * 512,
        }
    }

    /// What was done since `earlier` (0 where a counter went back: a ring reconnected).
    pub fn since(self, earlier: QueueUse) -> Self {
        QueueUse {
            ops: self.ops.saturating_sub(earlier.ops),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

impl IoLimits {
    /// Each queue's part of these limits in proportion to what it used over the last
    /// span (`used`, one per queue), so that a guest that keeps one of several queues
    /// busy gets nearly the whole limit. Every queue keeps a floor of 1/16 of an even
    /// share of what was used (an idle queue can start at once, and is given more at the
    /// next split); nothing used: an even split ([`IoLimits::per_queue`]). Operations
    /// are split by requests, bytes by bytes; a limited rate never becomes 0. The parts
    /// add up to the limit (give or take rounding up). On the control path: allocates.
    pub fn split_by_use(&self, used: &[QueueUse]) -> Vec<IoLimits> {
        let queues = used.len().max(1);
        let even = self.per_queue(queues);
        let part = |rate: u64, weights: &[u64], q: usize| -> u64 {
            let total: u64 = weights.iter().sum();
            if rate == 0 || total == 0 {
                return if rate == 0 {
                    0
                } else {
                    rate.div_ceil(queues as u64)
                };
            }
            let floor = (total / (16 * queues as u64)).max(1);
            let sum = total + floor * queues as u64;
            let share = u128::from(rate) * u128::from(weights[q] + floor) / u128::from(sum);
            (share as u64).max(1)
        };
        let ops: Vec<u64> = used.iter().map(|u| u.ops).collect();
        let bytes: Vec<u64> = used.iter().map(|u| u.bytes).collect();
        (0..used.len())
            .map(|q| IoLimits {
                iops: Rates {
                    total: part(self.iops.total, &ops, q),
                    read: part(self.iops.read, &ops, q),
                    write: part(self.iops.write, &ops, q),
                },
                bytes: Rates {
                    total: part(self.bytes.total, &bytes, q),
                    read: part(self.bytes.read, &bytes, q),
                    write: part(self.bytes.write, &bytes, q),
                },
                ..even
            })
            .collect()
    }

    /// Whether `other` differs from these limits by more than `1/parts` of any rate (or
    /// limits another rate, or has another burst): a new split worth handing to a ring.
    pub fn differs_from(&self, other: &IoLimits, parts: u64) -> bool {
        self.burst_ms != other.burst_ms
            || self
                .rates()
                .iter()
                .zip(other.rates())
                // A rate limited on one side only differs by all of it.
                .any(|(&a, b)| a.abs_diff(b) > a.max(b) / parts.max(1))
    }
}

/// The limits as an operator reads them in `blkdom-limits`: `none`, or the limited
/// rates (`iops=1000 read-bytes-per-sec=8388608 burst-ms=100`).
impl fmt::Display for IoLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unlimited() {
            return f.write_str("none");
        }
        for (key, rate) in LIMIT_KEYS.iter().zip(self.rates()) {
            if rate != 0 {
                write!(f, "{}={rate} ", &key[LIMIT_PREFIX.len()..])?;
            }
        }
        write!(f, "burst-ms={}", self.burst_ms)
    }
}

/// A decimal number, with a binary K/M/G suffix where `suffixed`.
fn parse_number(text: &str, suffixed: bool) -> Option<u64> {
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' | b'k' if suffixed => (&text[..text.len() - 1], 10),
        b'M' | b'm' if suffixed => (&text[..text.len() - 1], 20),
        b'G' | b'g' if suffixed => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number: u64 = digits.parse().ok()?;
    number.checked_mul(1u64 << shift)
}

/// What a request is charged to: its kind's buckets and the totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Read,
    /// Writes, flushes and discards.
    Write,
}

/// Indices of the six buckets.
const TOTAL_IOPS: usize = 0;
const TOTAL_BYTES: usize = 3;

impl Class {
    /// The buckets a request of this class is checked against and charged to: total and
    /// own IOPS, total and own bytes.
    fn buckets(self) -> [usize; 4] {
        let own = match self {
            Class::Read => 1,
            Class::Write => 2,
        };
        [TOTAL_IOPS, own, TOTAL_BYTES, TOTAL_BYTES + own]
    }
}

/// One rate's bucket: its price per unit and its virtual time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Bucket {
    /// Nanoseconds per unit at the rate, fixed point with 32 fraction bits (1 GiB/s is
    /// 0.93 ns per byte); 0: unlimited.
    ns_per_unit: u64,
    /// When the bucket is full again (ns on the poller's clock): ahead of `now` by the
    /// debt the requests charged to it ran up.
    tat: u64,
}

impl Bucket {
    fn limited(self) -> bool {
        self.ns_per_unit != 0
    }

    /// What `units` cost in ns of this bucket's time (saturating).
    fn cost(self, units: u64) -> u64 {
        let ns = (u128::from(units) * u128::from(self.ns_per_unit)) >> 32;
        ns.min(u128::from(u64::MAX)) as u64
    }

    fn charge(&mut self, units: u64, now: u64) {
        if self.limited() {
            self.tat = self.tat.max(now).saturating_add(self.cost(units));
        }
    }
}

/// A ring's token buckets: total, read and write IOPS, then the same for bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limiter {
    buckets: [Bucket; 6],
    burst_ns: u64,
    /// Some rate is limited (else nothing is checked or charged).
    active: bool,
    limits: IoLimits,
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

impl Limiter {
    /// Unlimited.
    pub const fn new() -> Self {
        Limiter {
            buckets: [Bucket {
                ns_per_unit: 0,
                tat: 0,
            }; 6],
            burst_ns: DEFAULT_BURST_MS as u64 * 1_000_000,
            active: false,
            limits: IoLimits::NONE,
        }
    }

    /// The limits enforced now.
    pub fn limits(&self) -> IoLimits {
        self.limits
    }

    /// True when some rate is limited.
    pub fn active(&self) -> bool {
        self.active
    }

    /// Enforce `limits` from `now` on. A bucket whose rate changed keeps its debt in
    /// units (requests, bytes), repaid at the new rate: raised tenfold, a second behind
    /// becomes a tenth; a bucket not behind stays as it was, with no new burst. A rate
    /// of 0 lifts that limit (a limit set again later starts with its burst).
    pub fn set(&mut self, limits: &IoLimits, now: u64) {
        for (bucket, rate) in self.buckets.iter_mut().zip(limits.rates()) {
            let ns_per_unit = if rate == 0 {
                0
            } else {
                // At most 1e9 << 32 (rate 1): fits; at least 2^32 / 1.1 (1 TiB/s).
                ((1_000_000_000u128 << 32) / u128::from(rate)) as u64
            };
            if ns_per_unit != bucket.ns_per_unit {
                // The debt is kept in units, repaid at the new rate: a change (an
                // operator's, or a new split between queues) never hands out a burst.
                let debt = bucket.tat.saturating_sub(now);
                let debt = match bucket.ns_per_unit {
                    0 => 0,
                    old => {
                        let scaled = u128::from(debt) * u128::from(ns_per_unit) / u128::from(old);
                        scaled.min(u128::from(u64::MAX)) as u64
                    }
                };
                *bucket = Bucket {
                    ns_per_unit,
                    tat: now.saturating_add(debt),
                };
            }
        }
        self.burst_ns = u64::from(limits.burst_ms.clamp(1, MAX_BURST_MS)) * 1_000_000;
        self.active = !limits.is_unlimited();
        self.limits = *limits;
    }

    /// Whether a request of `class` may go at `now`: none of its buckets is in debt past
    /// the burst window.
    pub fn admits(&self, class: Class, now: u64) -> bool {
        !self.active || now >= self.due(class)
    }

    /// The earliest time a request of `class` is admitted (0: now).
    pub fn due(&self, class: Class) -> u64 {
        class
            .buckets()
            .iter()
            .map(|&i| self.buckets[i])
            .filter(|bucket| bucket.limited())
            .map(|bucket| bucket.tat.saturating_sub(self.burst_ns))
            .max()
            .unwrap_or(0)
    }

    /// Charges one operation of `class` (at admission).
    pub fn charge_op(&mut self, class: Class, now: u64) {
        if self.active {
            let [total, own, ..] = class.buckets();
            self.buckets[total].charge(1, now);
            self.buckets[own].charge(1, now);
        }
    }

    /// Charges `bytes` of `class` (once the request's size is known).
    pub fn charge_bytes(&mut self, class: Class, bytes: u64, now: u64) {
        if self.active && bytes > 0 {
            let [.., total, own] = class.buckets();
            self.buckets[total].charge(bytes, now);
            self.buckets[own].charge(bytes, now);
        }
    }
}

/// Follows a vbd's `limit-*` keys on the control path: at each step of the vbd (its
/// backend directory changed) it lists the directory, reads the limit keys, and when they
/// changed says what to enforce, or refuses them: the reason goes to the console, to
/// [`LIMITS`] (`refused: <why>`) and, as EINVAL, to Linux's error node, and the limits in
/// force stay.
#[derive(Debug, Default)]
pub struct LimitKeys {
    /// The keys and values as last read (`key=value;...`): unchanged keys cost a listing.
    seen: Option<String>,
    /// The last keys read were refused (their error node is ours to clear).
    refused: bool,
    limits: IoLimits,
}

impl LimitKeys {
    /// The limits in force.
    pub fn limits(&self) -> IoLimits {
        self.limits
    }

    /// Reads the keys under `backend`; `Some` with the limits to enforce when they
    /// changed. Store errors leave everything as it was (the next step reads again).
    pub fn step(&mut self, store: &mut dyn XenStore, backend: &str) -> Option<IoLimits> {
        let mut names = store.directory(NO_TRANSACTION, backend).ok()?;
        names.retain(|name| name.starts_with(LIMIT_PREFIX));
        names.sort_unstable();
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            match store.read(NO_TRANSACTION, &format!("{backend}/{name}")) {
                Ok(value) => entries.push((name, value)),
                // Removed since the listing: as if absent.
                Err(StoreError::NotFound) => {}
                Err(_) => return None,
            }
        }
        let seen: String = entries.iter().map(|(k, v)| format!("{k}={v};")).collect();
        if self.seen.as_deref() == Some(seen.as_str()) {
            return None;
        }
        self.seen = Some(seen);
        match IoLimits::parse(entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            Ok(limits) => {
                let was_refused = core::mem::replace(&mut self.refused, false);
                if was_refused {
                    if let Some(directory) = xenbus_error::error_directory(backend) {
                        let _ = store.rm(NO_TRANSACTION, &directory);
                    }
                }
                if limits == self.limits && !was_refused {
                    return None;
                }
                log::info!("blkback: {backend}: I/O limits: {limits}");
                let _ = store.write(
                    NO_TRANSACTION,
                    &format!("{backend}/{LIMITS}"),
                    &limits.to_string(),
                );
                let changed = limits != self.limits;
                self.limits = limits;
                changed.then_some(limits)
            }
            Err(error) => {
                log::error!(
                    "blkback: {backend}: I/O limits refused: {error}; keeping {}",
                    self.limits
                );
                self.refused = true;
                let _ = store.write(
                    NO_TRANSACTION,
                    &format!("{backend}/{LIMITS}"),
                    &format!("refused: {error}; keeping {}", self.limits),
                );
                if let Some(node) = xenbus_error::error_node(backend) {
                    let text = format!("I/O limits refused: {error}");
                    let _ = store.write(
                        NO_TRANSACTION,
                        &node,
                        &xenbus_error::error_text(xenbus_error::errno::EINVAL, &text),
                    );
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;
    const UNLIMITED: u64 = 2_000_000;

    fn limits(entries: &[(&str, &str)]) -> IoLimits {
        IoLimits::parse(entries.iter().copied()).unwrap()
    }

    fn limiter(entries: &[(&str, &str)], now: u64) -> Limiter {
        let mut limiter = Limiter::new();
        limiter.set(&limits(entries), now);
        limiter
    }

    /// Requests of `class` and `bytes` each, sent as fast as admitted from `start` for
    /// `span` ns (each at the first ns it is admitted): how many went (at most
    /// `UNLIMITED`, reached only when nothing holds them back).
    fn admitted(limiter: &mut Limiter, class: Class, bytes: u64, start: u64, span: u64) -> u64 {
        let (mut now, mut count) = (start, 0);
        while now < start + span && count < UNLIMITED {
            if limiter.admits(class, now) {
                limiter.charge_op(class, now);
                limiter.charge_bytes(class, bytes, now);
                count += 1;
            } else {
                now = limiter.due(class).max(now + 1);
            }
        }
        count
    }

    #[test]
    fn keys_parse_with_their_units_and_defaults() {
        let parsed = limits(&[
            (LIMIT_IOPS, "1000"),
            (LIMIT_READ_IOPS, " 300 "),
            (LIMIT_WRITE_IOPS, "0"),
            (LIMIT_BYTES, "8M"),
            (LIMIT_READ_BYTES, "512k"),
            (LIMIT_WRITE_BYTES, "1G"),
        ]);
        assert_eq!(
            parsed,
            IoLimits {
                iops: Rates {
                    total: 1000,
                    read: 300,
                    write: 0
                },
                bytes: Rates {
                    total: 8 << 20,
                    read: 512 << 10,
                    write: 1 << 30
                },
                burst_ms: DEFAULT_BURST_MS,
            }
        );
        assert_eq!(limits(&[]), IoLimits::NONE);
        assert!(limits(&[(LIMIT_IOPS, ""), (LIMIT_BYTES, "0")]).is_unlimited());
        assert_eq!(limits(&[(LIMIT_BURST_MS, "250")]).burst_ms, 250);
        assert_eq!(limits(&[(LIMIT_BURST_MS, "")]).burst_ms, DEFAULT_BURST_MS);
        assert_eq!(
            parsed.to_string(),
            "iops=1000 read-iops=300 bytes-per-sec=8388608 read-bytes-per-sec=524288 \
             write-bytes-per-sec=1073741824 burst-ms=100"
        );
        assert_eq!(IoLimits::NONE.to_string(), "none");
    }

    #[test]
    fn bad_values_are_refused_with_the_key_named() {
        let refused = |key, value| IoLimits::parse([(key, value)]).unwrap_err();
        assert_eq!(
            refused("limit-iopz", "5"),
            LimitError::UnknownKey("limit-iopz".into())
        );
        for bad in ["abc", "-5", "1.5", "10 0", "M", "+3"] {
            assert!(
                matches!(
                    refused(LIMIT_BYTES, bad),
                    LimitError::NotANumber {
                        key: LIMIT_BYTES,
                        ..
                    }
                ),
                "{bad}"
            );
        }
        // Suffixes are for bytes only.
        assert!(matches!(
            refused(LIMIT_IOPS, "5K"),
            LimitError::NotANumber { .. }
        ));
        assert_eq!(
            refused(LIMIT_IOPS, "100000001"),
            LimitError::OutOfRange {
                key: LIMIT_IOPS,
                value: 100_000_001,
                min: 0,
                max: MAX_IOPS
            }
        );
        assert!(matches!(
            refused(LIMIT_WRITE_BYTES, "2048G"),
            LimitError::OutOfRange { .. }
        ));
        // 2^64 overflows: not a number rather than a wrapped one.
        assert!(matches!(
            refused(LIMIT_READ_BYTES, "17179869184G"),
            LimitError::NotANumber { .. }
        ));
        assert!(matches!(
            refused(LIMIT_BURST_MS, "0"),
            LimitError::OutOfRange { min: 1, .. }
        ));
        assert!(matches!(
            refused(LIMIT_BURST_MS, "10001"),
            LimitError::OutOfRange { .. }
        ));
        assert_eq!(
            refused(LIMIT_WRITE_IOPS, "x").to_string(),
            "limit-write-iops=\"x\": want a whole number (0 or empty: unlimited)"
        );
        assert!(IoLimits::parse([(LIMIT_BYTES, "1024G")]).is_ok());
    }

    #[test]
    fn an_iops_limit_holds_over_time_after_one_burst() {
        // 1000 IOPS, 100 ms burst: 100 at once (plus the one that runs into debt), then
        // one a millisecond.
        let mut l = limiter(&[(LIMIT_IOPS, "1000")], 5 * SEC);
        assert_eq!(admitted(&mut l, Class::Read, 4096, 5 * SEC, 1), 101);
        let mut l = limiter(&[(LIMIT_IOPS, "1000")], 5 * SEC);
        let ten_s = admitted(&mut l, Class::Read, 4096, 5 * SEC, 10 * SEC);
        assert_eq!(ten_s, 10_000 + 100);
        // Writes share the total.
        assert!(!l.admits(Class::Write, 15 * SEC - 1));
    }

    #[test]
    fn a_bandwidth_limit_holds_and_counts_bytes() {
        // 8 MiB/s of 64 KiB requests: 128 a second.
        let mut l = limiter(&[(LIMIT_BYTES, "8M"), (LIMIT_BURST_MS, "1")], 0);
        let count = admitted(&mut l, Class::Write, 64 << 10, SEC, 30 * SEC);
        assert!((30 * 128..=30 * 128 + 2).contains(&count), "{count}");
        // Without the bytes charged, it would not be limited at all.
        let mut free = l;
        free.set(
            &limits(&[(LIMIT_BYTES, "8M"), (LIMIT_BURST_MS, "1")]),
            100 * SEC,
        );
        assert!(admitted(&mut free, Class::Write, 0, 100 * SEC, SEC) == UNLIMITED);
    }

    #[test]
    fn read_and_write_limits_are_separate() {
        let mut l = limiter(&[(LIMIT_READ_IOPS, "100"), (LIMIT_BURST_MS, "10")], 0);
        // rate x (span + burst): 100 x 1.01 s.
        assert_eq!(admitted(&mut l, Class::Read, 512, 0, SEC), 100 + 1);
        // Reads are at their cap; writes are not limited.
        assert!(!l.admits(Class::Read, SEC - 1));
        assert!(l.admits(Class::Write, SEC - 1));
        let mut l = limiter(&[(LIMIT_WRITE_BYTES, "1M"), (LIMIT_BURST_MS, "10")], 0);
        assert!(admitted(&mut l, Class::Read, 1 << 20, 0, SEC) == UNLIMITED);
        assert_eq!(admitted(&mut l, Class::Write, 1 << 20, 0, 10 * SEC), 10 + 1);
    }

    #[test]
    fn a_request_larger_than_the_burst_goes_and_runs_into_debt() {
        // 1 MiB/s with a 10 ms burst (10 KiB); a 4 MiB request.
        let mut l = limiter(&[(LIMIT_BYTES, "1M"), (LIMIT_BURST_MS, "10")], 0);
        assert!(l.admits(Class::Write, 0));
        l.charge_op(Class::Write, 0);
        l.charge_bytes(Class::Write, 4 << 20, 0);
        // 4 s of debt, less the burst.
        assert!(!l.admits(Class::Read, 3_990 * MS - 1));
        assert_eq!(l.due(Class::Read), 3_990 * MS);
        assert!(l.admits(Class::Read, 3_990 * MS));
        // Over a long run, large requests still average the rate: one every 4 s, the
        // first at once (40 s and the burst's 10 ms are 10.0025 requests' worth; the one
        // admitted into debt is the eleventh).
        let count = admitted(&mut l, Class::Read, 4 << 20, 4 * SEC, 40 * SEC);
        assert_eq!(count, 11);
    }

    #[test]
    fn a_limit_changed_online_takes_effect_and_keeps_the_debt_in_units() {
        let mut l = limiter(&[(LIMIT_IOPS, "10"), (LIMIT_BURST_MS, "1")], 0);
        assert_eq!(admitted(&mut l, Class::Read, 0, 0, SEC), 10 + 1);
        // 100 ms behind at 10 IOPS (one request) at 1 s, less the 1 ms burst.
        assert!(!l.admits(Class::Read, SEC));
        assert_eq!(l.due(Class::Read), SEC + 99 * MS);
        // Raised to 1000: that request's debt is 1 ms now.
        l.set(&limits(&[(LIMIT_IOPS, "1000"), (LIMIT_BURST_MS, "1")]), SEC);
        assert_eq!(l.due(Class::Read), SEC);
        assert!(l.admits(Class::Read, SEC));
        // rate x (span + burst) - the one request of debt carried over.
        assert_eq!(admitted(&mut l, Class::Read, 0, SEC, SEC), 1000);
        // Lowered: the new rate from then on.
        l.set(
            &limits(&[(LIMIT_IOPS, "50"), (LIMIT_BURST_MS, "1")]),
            2 * SEC,
        );
        // 50 x 2.001 s, less the 1 ms (one request) behind at 1000 IOPS carried over.
        assert_eq!(admitted(&mut l, Class::Read, 0, 2 * SEC, 2 * SEC), 100);
        // A key rewritten to the same value keeps the bucket's state (no free burst).
        let before = l;
        l.set(
            &limits(&[(LIMIT_IOPS, "50"), (LIMIT_BURST_MS, "1")]),
            4 * SEC,
        );
        assert_eq!(l.buckets, before.buckets);
    }

    #[test]
    fn a_limit_removed_online_lifts_it_at_once() {
        let mut l = limiter(&[(LIMIT_IOPS, "10"), (LIMIT_BYTES, "1K")], 0);
        admitted(&mut l, Class::Write, 4096, 0, SEC);
        assert!(!l.admits(Class::Write, SEC));
        // Only the byte limit removed: the IOPS one still holds.
        l.set(&limits(&[(LIMIT_IOPS, "10")]), SEC);
        assert!(l.active());
        // Its bucket kept its state (full by then): 10 x (1 s + the 100 ms burst).
        assert_eq!(admitted(&mut l, Class::Write, 4096, 2 * SEC, SEC), 11);
        l.set(&IoLimits::NONE, 3 * SEC);
        assert!(!l.active());
        assert!(l.admits(Class::Write, 3 * SEC));
        assert!(admitted(&mut l, Class::Write, 4096, 3 * SEC, 1) == UNLIMITED);
        assert_eq!(l.due(Class::Write), 0);
    }

    #[test]
    fn a_split_between_queues_adds_up_to_the_limit() {
        let disk = limits(&[(LIMIT_IOPS, "1000"), (LIMIT_READ_BYTES, "10")]);
        let q = disk.per_queue(3);
        assert_eq!(q.iops.total, 334);
        assert_eq!(q.bytes.read, 4);
        assert_eq!(q.iops.write, 0);
        assert_eq!(disk.per_queue(0), disk);
        assert_eq!(disk.per_queue(1), disk);
    }

    #[test]
    fn extreme_rates_keep_their_arithmetic() {
        let mut l = limiter(&[(LIMIT_BYTES, "1024G"), (LIMIT_IOPS, "1")], 0);
        // One 2 MiB request at 1 TiB/s: 1.9 us; one operation at 1 IOPS: 1 s.
        l.charge_op(Class::Read, 0);
        l.charge_bytes(Class::Read, 2 << 20, 0);
        assert_eq!(l.buckets[TOTAL_BYTES].tat, 1_907);
        assert_eq!(l.buckets[TOTAL_IOPS].tat, SEC);
        // Near the end of time the clock saturates instead of wrapping.
        l.charge_op(Class::Read, u64::MAX - 10);
        assert_eq!(l.buckets[TOTAL_IOPS].tat, u64::MAX);
    }

    #[test]
    fn a_split_by_use_follows_the_busy_queue() {
        let disk = limits(&[(LIMIT_IOPS, "1000"), (LIMIT_READ_BYTES, "64M")]);
        let busy = QueueUse {
            ops: 5000,
            bytes: 5000 * 4096,
        };
        let idle = QueueUse::default();
        // One busy queue of two gets 97% (the idle one keeps 1/16 of an even share of
        // what was used: 156 of 5312 weight).
        let parts = disk.split_by_use(&[busy, idle]);
        assert_eq!(parts[0].iops.total, 970);
        assert_eq!(parts[1].iops.total, 29);
        assert_eq!(parts[0].bytes.read, 65_135_073);
        assert_eq!(parts[0].burst_ms, disk.burst_ms);
        // Both busy alike: even.
        let parts = disk.split_by_use(&[busy, busy]);
        assert_eq!((parts[0].iops.total, parts[1].iops.total), (500, 500));
        // Nothing used: even, limits kept.
        let parts = disk.split_by_use(&[idle, idle, idle]);
        assert!(parts.iter().all(|p| *p == disk.per_queue(3)));
        // Unlimited rates stay unlimited; a tiny limit never becomes 0.
        let tiny = limits(&[(LIMIT_WRITE_IOPS, "1")]);
        let parts = tiny.split_by_use(&[busy, idle]);
        assert_eq!((parts[0].iops.write, parts[1].iops.write), (1, 1));
        assert_eq!(parts[0].iops.total, 0);
        // Proportional when nobody is held: 800 and 100 used of 1000, each with head room
        // (the next split follows if the first wants more).
        let parts = disk.split_by_use(&[
            QueueUse { ops: 800, bytes: 0 },
            QueueUse { ops: 100, bytes: 0 },
        ]);
        assert_eq!((parts[0].iops.total, parts[1].iops.total), (866, 133));
        // Bytes are split by bytes: 64M read limit, no bytes used: even.
        assert_eq!(parts[0].bytes.read, 32 << 20);
    }

    #[test]
    fn a_split_counts_what_each_ring_did_since_the_last() {
        let stats = crate::stats::RingStats {
            reads: 10,
            writes: 5,
            flushes: 2,
            discards: 1,
            sectors_read: 8,
            sectors_written: 16,
            ..Default::default()
        };
        let now = QueueUse::of(&stats);
        assert_eq!(
            now,
            QueueUse {
                ops: 18,
                bytes: 24 * 512
            }
        );
        let before = QueueUse { ops: 8, bytes: 512 };
        assert_eq!(
            now.since(before),
            QueueUse {
                ops: 10,
                bytes: 23 * 512
            }
        );
        // A ring that reconnected counts from 0 again: nothing negative.
        assert_eq!(before.since(now), QueueUse::default());
    }

    #[test]
    fn only_a_split_that_moved_is_worth_handing_over() {
        let a = limits(&[(LIMIT_IOPS, "1000")]);
        assert!(!a.differs_from(&limits(&[(LIMIT_IOPS, "960")]), 20));
        assert!(a.differs_from(&limits(&[(LIMIT_IOPS, "940")]), 20));
        assert!(a.differs_from(&limits(&[(LIMIT_IOPS, "1000"), (LIMIT_READ_IOPS, "5")]), 20));
        assert!(a.differs_from(&limits(&[(LIMIT_IOPS, "1000"), (LIMIT_BURST_MS, "5")]), 20));
        assert!(!a.differs_from(&a, 20));
    }

    mod keys {
        use super::*;
        use xen::xenbus::fake::MemStore;

        const BE: &str = "/local/domain/1/backend/vbd/5/51712";
        const ERROR_NODE: &str = "/local/domain/1/error/backend/vbd/5/51712/error";

        fn key(name: &str) -> String {
            format!("{BE}/{name}")
        }

        #[test]
        fn limits_follow_the_keys_as_they_are_written_and_removed() {
            let mut store = MemStore::new();
            store.set(&key("params"), "ram:1M");
            let mut keys = LimitKeys::default();
            // None set: nothing to do, nothing written.
            assert_eq!(keys.step(&mut store, BE), None);
            assert_eq!(store.get(&key(LIMITS)), None);
            store.set(&key(LIMIT_IOPS), "1000");
            store.set(&key(LIMIT_WRITE_BYTES), "8M");
            let set = keys.step(&mut store, BE).expect("limits set");
            assert_eq!((set.iops.total, set.bytes.write), (1000, 8 << 20));
            assert_eq!(
                store.get(&key(LIMITS)),
                Some("iops=1000 write-bytes-per-sec=8388608 burst-ms=100")
            );
            // Another key changing (our own node, say) changes nothing.
            store.set(&key("blkdom-stats"), "x");
            assert_eq!(keys.step(&mut store, BE), None);
            // Changed online.
            store.set(&key(LIMIT_IOPS), "2000");
            assert_eq!(keys.step(&mut store, BE).unwrap().iops.total, 2000);
            // Rewritten to what is in force: nothing to apply.
            store.set(&key(LIMIT_WRITE_BYTES), "8192K");
            assert_eq!(keys.step(&mut store, BE), None);
            // Removed online.
            store.remove_tree(&key(LIMIT_IOPS));
            store.remove_tree(&key(LIMIT_WRITE_BYTES));
            assert_eq!(keys.step(&mut store, BE), Some(IoLimits::NONE));
            assert_eq!(store.get(&key(LIMITS)), Some("none"));
            assert_eq!(keys.limits(), IoLimits::NONE);
        }

        #[test]
        fn bad_keys_are_refused_and_the_limits_in_force_stay() {
            let mut store = MemStore::new();
            store.set(&key(LIMIT_READ_IOPS), "500");
            let mut keys = LimitKeys::default();
            assert!(keys.step(&mut store, BE).is_some());
            store.set(&key(LIMIT_READ_IOPS), "lots");
            assert_eq!(keys.step(&mut store, BE), None);
            assert_eq!(keys.limits().iops.read, 500);
            assert_eq!(
                store.get(&key(LIMITS)),
                Some(
                    "refused: limit-read-iops=\"lots\": want a whole number (0 or empty: \
                     unlimited); keeping read-iops=500 burst-ms=100"
                )
            );
            assert_eq!(
                store.get(ERROR_NODE),
                Some(
                    "22 I/O limits refused: limit-read-iops=\"lots\": want a whole number \
                     (0 or empty: unlimited)"
                )
            );
            // Refused once, not again at every step while it stays.
            store.set(ERROR_NODE, "seen");
            assert_eq!(keys.step(&mut store, BE), None);
            assert_eq!(store.get(ERROR_NODE), Some("seen"));
            // A misspelt key is refused too, rather than read as "unlimited".
            store.set(&key(LIMIT_READ_IOPS), "500");
            store.set(&key("limit-write-iop"), "10");
            assert_eq!(keys.step(&mut store, BE), None);
            assert!(store
                .get(&key(LIMITS))
                .unwrap()
                .starts_with("refused: unknown key limit-write-iop: the limit keys are"));
            // Put right (to the limits in force): the refusal and its error node go.
            store.remove_tree(&key("limit-write-iop"));
            assert_eq!(keys.step(&mut store, BE), None);
            assert_eq!(store.get(&key(LIMITS)), Some("read-iops=500 burst-ms=100"));
            assert_eq!(store.get(ERROR_NODE), None);
        }
    }
}
