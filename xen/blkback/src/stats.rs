// SPDX-License-Identifier: MIT OR Apache-2.0
//! Per-ring counters, updated by the ring's own poller only (no atomics needed).
//!
//! The first seven carry the names and meanings of Linux blkback's per-vbd statistics
//! (sysfs `.../statistics/{oo_req,rd_req,wr_req,f_req,ds_req,rd_sect,wr_sect}`, summed
//! over the rings like ours), so tools written for Linux read blkdom's `blkdom-stats`.

/// Declares `RingStats` from one list, so the struct, the sum over rings and the names
/// shown in xenstore and on the console can never disagree.
macro_rules! ring_stats {
    ($($(#[doc = $doc:literal])* $field:ident => $name:literal,)*) => {
        /// Counters of one ring. `grants_mapped`, `persistent_grants`, `grant_cap` and
        /// `in_flight_cap` are levels, the rest only grow.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct RingStats {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl RingStats {
            /// Every counter as (name, value), in declaration order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$(($name, self.$field)),*].into_iter()
            }
        }

        impl core::ops::AddAssign<&RingStats> for RingStats {
            fn add_assign(&mut self, other: &RingStats) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

ring_stats! {
    /// Submissions put off because the device queue was full (Linux's `oo_req`, which
    /// counts the times its ring had to wait for a free request slot: blkdom has a slot
    /// for every ring entry, so the device queue is the resource a request can wait for).
    device_busy => "oo_req",
    /// Read requests (Linux's `rd_req`).
    reads => "rd_req",
    /// Write requests (Linux's `wr_req`).
    writes => "wr_req",
    /// Flush and barrier requests (Linux's `f_req`).
    flushes => "f_req",
    /// Discard requests (Linux's `ds_req`).
    discards => "ds_req",
    /// 512-byte sectors read (Linux's `rd_sect`).
    sectors_read => "rd_sect",
    /// 512-byte sectors written, by writes and by flushes that carry data (Linux's
    /// `wr_sect`, counted the same way).
    sectors_written => "wr_sect",
    /// Requests that used indirect descriptors (also counted as read or write).
    indirect => "indirect",
    /// Responses with a status other than OKAY.
    errors => "errors",
    /// Requests the device answered with an error (a failed command: NVMe status,
    /// virtio IOERR), or that were answered with one because the device failed (a
    /// command past its deadline, a fatal status): the frontend got `BLKIF_RSP_ERROR`.
    device_errors => "device-errors",
    /// Requests refused by parsing or validation.
    bad_requests => "bad-requests",
    polls => "polls",
    /// Polls that found nothing to consume or complete.
    empty_polls => "empty-polls",
    /// Event-channel notifications received from the frontend.
    events => "events",
    /// Events from the frontend after which the next poll found nothing (XSA-332:
    /// a frontend notifying without work).
    spurious_events => "spurious-events",
    /// Grants mapped right now (cached plus in-flight transient ones).
    grants_mapped => "grants-mapped",
    /// Persistent grants mapped right now (the ring's cache; bounded by its cap).
    persistent_grants => "persistent-grants",
    /// The most persistent grants the ring may keep mapped now: its share of the
    /// domain's budget (0 without persistent grants).
    grant_cap => "grant-cap",
    /// Requests that had grants mapped for them alone because the ring's cache was at
    /// its cap (served as if the frontend had no persistent grants).
    capped_requests => "capped-requests",
    /// Persistent grants unmapped after going unused for the idle timeout.
    idle_released => "idle-released",
    /// Persistent grants unmapped because the ring's cap dropped below what it held.
    cap_evicted => "cap-evicted",
    /// The most grants the ring may have mapped for its requests in flight now: what it
    /// holds of the domain's budget for them (0 for a ring that copies: it maps none).
    in_flight_cap => "in-flight-cap",
    /// Times the ring left requests waiting in its ring because its grants in flight
    /// were at `in-flight-cap` (taken once its own requests gave grants back).
    grant_waits => "grant-waits",
    /// Times a request waited because the ring was at its I/O limits (`limit-*` keys):
    /// it stays unanswered until the ring's token buckets let it go.
    throttle_waits => "throttle-waits",
    /// Nanoseconds requests spent waiting for the ring's I/O limits (counted when each
    /// wait ends).
    throttle_ns => "throttle-ns",
    /// GNTTABOP_map_grant_ref hypercalls (each maps a batch).
    map_batches => "map-batches",
    /// GNTTABOP_unmap_grant_ref hypercalls.
    unmap_batches => "unmap-batches",
    /// Individual map or unmap entries that failed.
    grant_failures => "grant-failures",
    /// Event-channel notifications sent to the frontend.
    notifications => "notifications",
    /// Responses published to the frontend (responses per notification: this over
    /// `notifications`).
    responses => "responses",
    /// Notifications held back so that one event carries more responses (each is sent
    /// later unless the frontend meanwhile took every response it was due for).
    notifications_held => "notifications-held",
    /// Holds that ended with no other response to carry (at the deadline, or when the
    /// frontend had gone quiet or the poller went to sleep: the frontend waited for
    /// nothing).
    notify_holds_wasted => "notify-holds-wasted",
    /// Due events sent at once although more responses were expected, because recent
    /// holds did not pay (no other response came within the window): moderation is
    /// off for now, and these are watched to see whether holding would pay again.
    notify_holds_declined => "notify-holds-declined",
    /// Holds ended by their window running out (`notify.hold-us`, or 50 us for a
    /// device): the frontend was still sending, or the device still busy. The five
    /// `notify-holds-<why>` add up to the holds that ended (teardown aside).
    notify_holds_deadline => "notify-holds-deadline",
    /// Holds for requests on the device ended because none were left there.
    notify_holds_drained => "notify-holds-drained",
    /// Holds for the frontend's queue ended because it sent nothing for twice its
    /// average gap between requests.
    notify_holds_quiet => "notify-holds-quiet",
    /// Holds for the frontend's queue ended because it was back at the depth it keeps
    /// (or had filled its ring) and would send nothing more before it heard.
    notify_holds_depth => "notify-holds-depth",
    /// Holds ended because the poller was about to sleep.
    notify_holds_sleep => "notify-holds-sleep",
    /// Times the frontend's producer index overflowed and the ring was halted.
    ring_overflows => "ring-overflows",
}

/// What a device refused over its whole life. A ring's own counters start again with each
/// connection (a frontend that reconnects, or one that breaks its ring and is connected
/// anew, would wipe its record); these add up every ring the device had, and the
/// connections its negotiation refused. Published after the ring counters in
/// `blkdom-stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Requests refused by parsing or validation (`bad-requests` of every ring).
    pub requests: u64,
    /// Responses with a status other than OKAY (`errors` of every ring).
    pub error_responses: u64,
    /// Rings halted for a broken producer index (`ring-overflows` of every ring).
    pub halted_rings: u64,
    /// Connections refused at negotiation: bad frontend keys, or rings that could not be
    /// mapped or bound.
    pub connections: u64,
}

impl Refusals {
    /// Adds what one ring refused (a ring that went away, or a live one when publishing).
    pub fn add_ring(&mut self, ring: &RingStats) {
        self.requests += ring.bad_requests;
        self.error_responses += ring.errors;
        self.halted_rings += ring.ring_overflows;
    }

    /// Every counter as (name, value).
    pub fn fields(&self) -> [(&'static str, u64); 4] {
        [
            ("refused-requests", self.requests),
            ("error-responses", self.error_responses),
            ("halted-rings", self.halted_rings),
            ("refused-connections", self.connections),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_adds_every_counter_and_names_follow_the_fields() {
        let one = RingStats {
            reads: 1,
            writes: 2,
            grants_mapped: 3,
            device_busy: 4,
            ..RingStats::default()
        };
        let mut total = RingStats::default();
        total += &one;
        total += &one;
        assert_eq!(total.reads, 2);
        assert_eq!(total.writes, 4);
        assert_eq!(total.grants_mapped, 6);
        assert_eq!(total.device_busy, 8);
        let names: Vec<_> = total.fields().map(|(name, _)| name).collect();
        assert_eq!(names.last(), Some(&"ring-overflows"));
        assert_eq!(names.len(), 39);
        assert_eq!(
            total.fields().find(|(name, _)| *name == "wr_req"),
            Some(("wr_req", 4))
        );
        assert_eq!(
            total.fields().find(|(name, _)| *name == "oo_req"),
            Some(("oo_req", 8))
        );
        let mut seen = std::collections::BTreeSet::new();
        assert!(
            names.iter().all(|name| seen.insert(*name)),
            "duplicate names"
        );
    }

    #[test]
    fn linux_blkback_counters_come_first_under_their_sysfs_names() {
        let stats = RingStats {
            device_busy: 1,
            reads: 2,
            writes: 3,
            flushes: 4,
            discards: 5,
            sectors_read: 6,
            sectors_written: 7,
            ..RingStats::default()
        };
        let linux: Vec<_> = stats.fields().take(7).collect();
        assert_eq!(
            linux,
            [
                ("oo_req", 1),
                ("rd_req", 2),
                ("wr_req", 3),
                ("f_req", 4),
                ("ds_req", 5),
                ("rd_sect", 6),
                ("wr_sect", 7),
            ]
        );
    }

    #[test]
    fn refusals_add_up_the_refusal_counters_of_every_ring() {
        let ring = RingStats {
            bad_requests: 3,
            errors: 5,
            ring_overflows: 1,
            reads: 100,
            grant_failures: 2,
            ..RingStats::default()
        };
        let mut refusals = Refusals {
            connections: 7,
            ..Refusals::default()
        };
        refusals.add_ring(&ring);
        refusals.add_ring(&RingStats {
            bad_requests: 1,
            ..RingStats::default()
        });
        assert_eq!(
            refusals.fields(),
            [
                ("refused-requests", 4),
                ("error-responses", 5),
                ("halted-rings", 1),
                ("refused-connections", 7),
            ]
        );
        // Names of their own: a line carries both sets.
        let ring_names: Vec<_> = ring.fields().map(|(name, _)| name).collect();
        assert!(refusals
            .fields()
            .iter()
            .all(|(name, _)| !ring_names.contains(name)));
    }
}
