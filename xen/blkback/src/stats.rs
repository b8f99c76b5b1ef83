//! Per-ring counters, updated by the ring's own poller only (no atomics needed).

/// Declares `RingStats` from one list, so the struct, the sum over rings and the names
/// shown in xenstore and on the console can never disagree.
macro_rules! ring_stats {
    ($($(#[doc = $doc:literal])* $field:ident => $name:literal,)*) => {
        /// Counters of one ring. `grants_mapped` is a level, the rest only grow.
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
    reads => "reads",
    writes => "writes",
    /// Flush and barrier requests.
    flushes => "flushes",
    discards => "discards",
    /// Requests that used indirect descriptors (also counted as read or write).
    indirect => "indirect",
    sectors_read => "sectors-read",
    sectors_written => "sectors-written",
    /// Responses with a status other than OKAY.
    errors => "errors",
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
    /// GNTTABOP_map_grant_ref hypercalls (each maps a batch).
    map_batches => "map-batches",
    /// GNTTABOP_unmap_grant_ref hypercalls.
    unmap_batches => "unmap-batches",
    /// Individual map or unmap entries that failed.
    grant_failures => "grant-failures",
    /// Event-channel notifications sent to the frontend.
    notifications => "notifications",
    /// Times the frontend's producer index overflowed and the ring was halted.
    ring_overflows => "ring-overflows",
    /// Submissions put off because the device queue was full.
    device_busy => "device-busy",
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
        assert_eq!(names.first(), Some(&"reads"));
        assert_eq!(names.last(), Some(&"device-busy"));
        assert_eq!(names.len(), 20);
        assert_eq!(
            total.fields().find(|(name, _)| *name == "writes"),
            Some(("writes", 4))
        );
        let mut seen = std::collections::BTreeSet::new();
        assert!(
            names.iter().all(|name| seen.insert(*name)),
            "duplicate names"
        );
    }
}
