//! Per-ring counters, updated by the ring's own poller only (no atomics needed).

/// Counters of one ring. `grants_mapped` is a level, the rest only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    pub reads: u64,
    pub writes: u64,
    /// Flush and barrier requests.
    pub flushes: u64,
    pub discards: u64,
    /// Requests that used indirect descriptors (also counted as read or write).
    pub indirect: u64,
    pub sectors_read: u64,
    pub sectors_written: u64,
    /// Responses with a status other than OKAY.
    pub errors: u64,
    /// Requests refused by parsing or validation.
    pub bad_requests: u64,
    pub polls: u64,
    /// Polls that found nothing to consume or complete.
    pub empty_polls: u64,
    /// Events from the frontend after which the next poll found nothing (XSA-332:
    /// a frontend notifying without work).
    pub spurious_events: u64,
    /// Grants mapped right now (cached plus in-flight transient ones).
    pub grants_mapped: u64,
    pub map_batches: u64,
    pub unmap_batches: u64,
    /// Individual map or unmap entries that failed.
    pub grant_failures: u64,
    pub notifications: u64,
    /// Times the frontend's producer index overflowed and the ring was halted.
    pub ring_overflows: u64,
    /// Submissions put off because the device queue was full.
    pub device_busy: u64,
}
