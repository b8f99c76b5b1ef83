// SPDX-License-Identifier: MIT OR Apache-2.0
//! The devices' part of a clean shutdown: every device with a volatile write cache is
//! flushed, then every device is told to stop (NVMe's shutdown notification, a virtio
//! reset), each within a deadline of its own. Every device is asked at once and each is
//! waited for until it answers or its deadline passes, so a device that does not answer
//! costs its own deadline and holds up no other; what became of each is an [`Outcome`].

use crate::{BlockDevice, IoOp, IoRequest, IoStatus, NoBuffers, SubmitError};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

/// The shutdown's clock, and what to do between two looks at the devices.
pub trait Clock {
    /// Monotonic nanoseconds.
    fn now_ns(&mut self) -> u64;
    /// Called between two looks (a pause, a short delay).
    fn relax(&mut self) {}
}

/// What became of one device's step (its flush, or its stop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The device answered that it is done, this long after it was asked.
    Done { ns: u64 },
    /// Nothing to do: the device has no volatile write cache.
    NotNeeded,
    /// The device answered with an error, or could not be asked (why).
    Failed(String),
    /// No answer within the deadline (this long): given up.
    GivenUp { ns: u64 },
}

impl Outcome {
    /// Whether the step is done or had nothing to do.
    pub fn ok(&self) -> bool {
        matches!(self, Outcome::Done { .. } | Outcome::NotNeeded)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done { ns } => write!(f, "done in {} ms", ns / 1_000_000),
            Outcome::NotNeeded => f.write_str("not needed"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
            Outcome::GivenUp { ns } => {
                write!(f, "given up: no answer in {} ms", ns / 1_000_000)
            }
        }
    }
}

/// A device being told to stop: NVMe's shutdown notification, a virtio reset.
pub trait Stop {
    /// Asks the device to stop; `Err`: it cannot be asked (why).
    fn begin_stop(&mut self) -> Result<(), String>;
    /// Whether the device has stopped; `Err`: it reported a failure (why).
    fn stopped(&mut self) -> Result<bool, String>;
    /// How long the device may take to stop, in ns.
    fn stop_deadline_ns(&self) -> u64;
}

/// The tag of a shutdown flush (the queues are idle: no other request is in flight).
const FLUSH_TAG: u32 = u32::MAX;

/// Flushes every device whose queue is in `queues` at once and waits for each until it
/// answers or `deadline_ns` has passed since the flushes began. A queue whose device has
/// no volatile write cache (`Geometry::flush` false) is not asked (`NotNeeded`); one
/// whose device failed, or that refuses the flush, `Failed`. The queues must be idle:
/// their devices hold no other request of theirs.
pub fn flush_all(
    queues: &mut [&mut dyn BlockDevice],
    deadline_ns: u64,
    clock: &mut dyn Clock,
) -> Vec<Outcome> {
    let start = clock.now_ns();
    let mut outcomes: Vec<Option<Outcome>> = queues
        .iter_mut()
        .map(|queue| {
            if let Some(fault) = queue.fault() {
                return Some(Outcome::Failed(fault.to_string()));
            }
            if !queue.geometry().flush {
                return Some(Outcome::NotNeeded);
            }
            None
        })
        .collect();
    let mut submitted = alloc::vec![false; queues.len()];
    let flush = IoRequest {
        tag: FLUSH_TAG,
        op: IoOp::Flush,
        sector: 0,
        nr_sectors: 0,
        preflush: false,
        segments: &[],
    };
    loop {
        let now = clock.now_ns();
        let elapsed = now.saturating_sub(start);
        for (i, queue) in queues.iter_mut().enumerate() {
            if outcomes[i].is_some() {
                continue;
            }
            if !submitted[i] {
                match queue.submit(&flush, &NoBuffers) {
                    Ok(()) => submitted[i] = true,
                    // Tried again at the next look, until the deadline.
                    Err(SubmitError::QueueFull) => {}
                    Err(error) => {
                        outcomes[i] = Some(Outcome::Failed(error.to_string()));
                        continue;
                    }
                }
            }
            let mut status = None;
            queue.poll_completions(&mut |completion| {
                if completion.tag == FLUSH_TAG {
                    status = Some(completion.status);
                }
            });
            outcomes[i] = match status {
                Some(IoStatus::Ok) => Some(Outcome::Done { ns: elapsed }),
                Some(IoStatus::Unsupported) => Some(Outcome::Failed(
                    "the device does not take flushes".to_string(),
                )),
                Some(IoStatus::Error) => Some(Outcome::Failed(
                    "the device answered the flush with an error".to_string(),
                )),
                None if elapsed >= deadline_ns => Some(Outcome::GivenUp { ns: elapsed }),
                None => None,
            };
        }
        if outcomes.iter().all(Option::is_some) {
            return outcomes.into_iter().flatten().collect();
        }
        clock.relax();
    }
}

/// Tells every device in `devices` to stop at once and waits for each until it says it
/// has or its own deadline (`Stop::stop_deadline_ns`) has passed.
pub fn stop_all(devices: &mut [&mut dyn Stop], clock: &mut dyn Clock) -> Vec<Outcome> {
    let start = clock.now_ns();
    let mut outcomes: Vec<Option<Outcome>> = devices
        .iter_mut()
        .map(|device| device.begin_stop().err().map(Outcome::Failed))
        .collect();
    loop {
        let elapsed = clock.now_ns().saturating_sub(start);
        for (i, device) in devices.iter_mut().enumerate() {
            if outcomes[i].is_some() {
                continue;
            }
            outcomes[i] = match device.stopped() {
                Ok(true) => Some(Outcome::Done { ns: elapsed }),
                Err(why) => Some(Outcome::Failed(why)),
                Ok(false) if elapsed >= device.stop_deadline_ns() => {
                    Some(Outcome::GivenUp { ns: elapsed })
                }
                Ok(false) => None,
            };
        }
        if outcomes.iter().all(Option::is_some) {
            return outcomes.into_iter().flatten().collect();
        }
        clock.relax();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BufferAccess, Completion, DeviceFault, FaultKind, Geometry};
    use std::format;

    /// A clock that moves 1 ms per look.
    struct Steps(u64);
    impl Clock for Steps {
        fn now_ns(&mut self) -> u64 {
            self.0
        }
        fn relax(&mut self) {
            self.0 += 1_000_000;
        }
    }

    /// A queue that answers a flush after `answer_after` polls (never: `None`).
    struct Queue {
        cache: bool,
        answer_after: Option<usize>,
        status: IoStatus,
        full_for: usize,
        fault: Option<DeviceFault>,
        flushes: usize,
        polls: usize,
        pending: Option<u32>,
    }

    fn queue(cache: bool, answer_after: Option<usize>) -> Queue {
        Queue {
            cache,
            answer_after,
            status: IoStatus::Ok,
            full_for: 0,
            fault: None,
            flushes: 0,
            polls: 0,
            pending: None,
        }
    }

    impl BlockDevice for Queue {
        fn geometry(&self) -> Geometry {
            Geometry {
                sectors: 8,
                logical_block_size: 512,
                physical_block_size: 512,
                read_only: false,
                flush: self.cache,
                discard: None,
            }
        }
        fn queue_depth(&self) -> usize {
            1
        }
        fn submit(
            &mut self,
            request: &IoRequest<'_>,
            _: &dyn BufferAccess,
        ) -> Result<(), SubmitError> {
            assert_eq!(request.op, IoOp::Flush);
            if self.full_for > 0 {
                self.full_for -= 1;
                return Err(SubmitError::QueueFull);
            }
            self.flushes += 1;
            self.pending = Some(request.tag);
            Ok(())
        }
        fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
            self.polls += 1;
            // Another request's completion is not the flush's.
            sink(Completion {
                tag: 7,
                status: IoStatus::Ok,
            });
            match (self.pending, self.answer_after) {
                (Some(tag), Some(after)) if self.polls > after => {
                    self.pending = None;
                    sink(Completion {
                        tag,
                        status: self.status,
                    });
                    2
                }
                _ => 1,
            }
        }
        fn fault(&self) -> Option<DeviceFault> {
            self.fault
        }
    }

    #[test]
    fn every_cache_is_flushed_and_a_device_without_one_is_not_asked() {
        let (mut a, mut b, mut c) = (
            queue(true, Some(0)),
            queue(false, Some(0)),
            queue(true, Some(3)),
        );
        let outcomes = flush_all(&mut [&mut a, &mut b, &mut c], 1_000_000_000, &mut Steps(0));
        assert_eq!(
            outcomes,
            [
                Outcome::Done { ns: 0 },
                Outcome::NotNeeded,
                Outcome::Done { ns: 3_000_000 }
            ]
        );
        assert_eq!((a.flushes, b.flushes, c.flushes), (1, 0, 1));
    }

    #[test]
    fn a_device_that_does_not_answer_is_given_up_at_its_deadline_and_holds_up_no_other() {
        let (mut stuck, mut late) = (queue(true, None), queue(true, Some(40)));
        let outcomes = flush_all(&mut [&mut stuck, &mut late], 50_000_000, &mut Steps(0));
        assert_eq!(
            outcomes,
            [
                Outcome::GivenUp { ns: 50_000_000 },
                Outcome::Done { ns: 40_000_000 }
            ]
        );
        // Asked once, not again while it said nothing.
        assert_eq!(stuck.flushes, 1);
        assert_eq!(stuck.polls, 51);
    }

    #[test]
    fn errors_failed_devices_and_full_queues() {
        let mut error = queue(true, Some(0));
        error.status = IoStatus::Error;
        let mut unsupported = queue(true, Some(0));
        unsupported.status = IoStatus::Unsupported;
        let mut failed = queue(true, Some(0));
        failed.fault = Some(DeviceFault {
            kind: FaultKind::Fatal,
            dma_stopped: true,
        });
        let mut full = queue(true, Some(0));
        full.full_for = 2;
        let mut always_full = queue(true, Some(0));
        always_full.full_for = usize::MAX;
        let outcomes = flush_all(
            &mut [
                &mut error,
                &mut unsupported,
                &mut failed,
                &mut full,
                &mut always_full,
            ],
            10_000_000,
            &mut Steps(0),
        );
        assert_eq!(
            outcomes[0],
            Outcome::Failed("the device answered the flush with an error".into())
        );
        assert_eq!(
            outcomes[1],
            Outcome::Failed("the device does not take flushes".into())
        );
        assert!(
            matches!(&outcomes[2], Outcome::Failed(why) if why.starts_with("the device reported a fatal error"))
        );
        assert_eq!(failed.flushes, 0);
        assert_eq!(outcomes[3], Outcome::Done { ns: 2_000_000 });
        assert_eq!(outcomes[4], Outcome::GivenUp { ns: 10_000_000 });
        assert!(!outcomes[4].ok() && outcomes[3].ok() && Outcome::NotNeeded.ok());
    }

    /// A device that stops after `after` looks (never: `None`).
    struct Device {
        after: Option<u32>,
        looks: u32,
        begun: bool,
        refuse: bool,
        deadline_ns: u64,
    }

    impl Stop for Device {
        fn begin_stop(&mut self) -> Result<(), String> {
            if self.refuse {
                return Err("not now".into());
            }
            self.begun = true;
            Ok(())
        }
        fn stopped(&mut self) -> Result<bool, String> {
            assert!(self.begun);
            self.looks += 1;
            Ok(self.after.is_some_and(|after| self.looks > after))
        }
        fn stop_deadline_ns(&self) -> u64 {
            self.deadline_ns
        }
    }

    #[test]
    fn devices_stop_each_within_its_own_deadline() {
        let device = |after, deadline_ms: u64| Device {
            after,
            looks: 0,
            begun: false,
            refuse: false,
            deadline_ns: deadline_ms * 1_000_000,
        };
        let (mut quick, mut stuck, mut slow) =
            (device(Some(0), 5), device(None, 5), device(Some(20), 60));
        let mut refusing = device(Some(0), 5);
        refusing.refuse = true;
        let outcomes = stop_all(
            &mut [&mut quick, &mut stuck, &mut slow, &mut refusing],
            &mut Steps(0),
        );
        assert_eq!(
            outcomes,
            [
                Outcome::Done { ns: 0 },
                Outcome::GivenUp { ns: 5_000_000 },
                Outcome::Done { ns: 20_000_000 },
                Outcome::Failed("not now".into()),
            ]
        );
        // Each looked at until it answered or its deadline came, not after.
        assert_eq!(
            (quick.looks, stuck.looks, slow.looks, refusing.looks),
            (1, 6, 21, 0)
        );
    }

    #[test]
    fn outcomes_say_what_happened() {
        let text = |o: Outcome| format!("{o}");
        assert_eq!(text(Outcome::Done { ns: 3_400_000 }), "done in 3 ms");
        assert_eq!(text(Outcome::NotNeeded), "not needed");
        assert_eq!(text(Outcome::Failed("x".into())), "failed: x");
        assert_eq!(
            text(Outcome::GivenUp { ns: 5_000_000_000 }),
            "given up: no answer in 5000 ms"
        );
    }
}
