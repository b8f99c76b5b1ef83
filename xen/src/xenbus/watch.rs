// SPDX-License-Identifier: MIT OR Apache-2.0
//! Which devices a batch of xenstore watch events concerns, so that the control path
//! steps only those: a frontend rewriting its own `state` node in a loop costs one step
//! of its own device per event, however many devices there are.
//!
//! The control path watches, per device, the paths of blkback's
//! `BlkifBackend::watched_paths` (the frontend's `state` node and the backend directory)
//! with the device's backend path as token, and the whole device directory
//! (`backend/vbd`) with one token of its own, for devices the toolstack adds or removes. Events of that directory watch under
//! a device the control path holds (its own writes of `state`, the toolstack's `online`)
//! concern that device alone; only a change at a level above the devices, or under a
//! device it does not hold, needs a rescan of the directory.

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::{String, ToString};

/// What a batch of watch events asks of the control path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchWork {
    /// Look for devices added or removed (a rescan steps every device).
    pub rescan: bool,
    /// Devices to step, by backend path: each once, however many events named it.
    pub devices: BTreeSet<String>,
}

/// How the control path's watches are named.
#[derive(Clone, Copy, Debug)]
pub struct WatchRouter<'a> {
    /// Our domain's home, `/local/domain/<id>`: xenstored reports the paths of a watch
    /// set on a relative path relative to it.
    pub home: &'a str,
    /// The device directory relative to `home` (`backend/vbd`), watched with
    /// `directory_token`.
    pub directory: &'a str,
    pub directory_token: &'a str,
    /// The name of a node of ours written often that needs no reaction (statistics).
    pub ignored_node: &'a str,
}

impl WatchRouter<'_> {
    /// Adds to `work` what the event `(token, path)` asks for. `is_device(path)` says
    /// whether the control path holds a device with that backend path; it is asked at
    /// most once per event, and nothing here depends on how many devices there are.
    pub fn route(
        &self,
        work: &mut WatchWork,
        token: &str,
        path: &str,
        is_device: impl Fn(&str) -> bool,
    ) {
        if path.rsplit('/').next() == Some(self.ignored_node) {
            return;
        }
        if token == self.directory_token {
            self.route_directory(work, path, is_device);
        } else if work.devices.contains(token) {
            // Already due this round.
        } else if is_device(token) {
            work.devices.insert(token.to_string());
        }
        // Any other token: a device already gone (its last events), or not ours.
    }

    /// An event of the device directory watch.
    fn route_directory(&self, work: &mut WatchWork, path: &str, is_device: impl Fn(&str) -> bool) {
        if work.rescan {
            return;
        }
        let home = self.home.trim_end_matches('/');
        let relative = if path.starts_with('/') {
            match path.strip_prefix(home) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                    &rest[rest.len().min(1)..]
                }
                _ => return, // not under our home
            }
        } else {
            path
        };
        let Some(below) = relative.strip_prefix(self.directory) else {
            return;
        };
        if !(below.is_empty() || below.starts_with('/')) {
            return; // a sibling such as `backend/vbd2`
        }
        let mut parts = below.split('/').filter(|p| !p.is_empty());
        let (Some(frontend), Some(device)) = (parts.next(), parts.next()) else {
            // The directory itself or a frontend's directory under it.
            work.rescan = true;
            return;
        };
        let backend_path = format!("{home}/{}/{frontend}/{device}", self.directory);
        if work.devices.contains(&backend_path) {
            return;
        }
        if is_device(&backend_path) {
            work.devices.insert(backend_path);
        } else {
            // A device being created, removed, or one that failed: the scan finds out.
            work.rescan = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::{BTreeMap, HashSet};
    use std::string::String;
    use std::vec::Vec;

    const HOME: &str = "/local/domain/1";

    fn router() -> WatchRouter<'static> {
        WatchRouter {
            home: HOME,
            directory: "backend/vbd",
            directory_token: "vbd",
            ignored_node: "blkdom-stats",
        }
    }

    fn backend(frontend: u32, device: u32) -> String {
        format!("{HOME}/backend/vbd/{frontend}/{device}")
    }

    /// 100 devices, frontends 10..20 with 10 disks each.
    fn devices() -> HashSet<String> {
        (10..20)
            .flat_map(|fe| (0..10).map(move |d| backend(fe, 51712 + d * 16)))
            .collect()
    }

    fn route_one(devices: &HashSet<String>, token: &str, path: &str) -> WatchWork {
        let mut work = WatchWork::default();
        router().route(&mut work, token, path, |p| devices.contains(p));
        work
    }

    fn only(path: &str) -> WatchWork {
        WatchWork {
            rescan: false,
            devices: [path.to_string()].into(),
        }
    }

    #[test]
    fn an_event_for_one_device_steps_that_device_only() {
        let devices = devices();
        let a = backend(12, 51712);
        // Its frontend's state node, and its backend directory.
        assert_eq!(
            route_one(&devices, &a, "/local/domain/12/device/vbd/51712/state"),
            only(&a)
        );
        assert_eq!(route_one(&devices, &a, &format!("{a}/state")), only(&a));
        // The directory watch under a device we hold (our own write of its state, the
        // toolstack's online = 0, its removal), reported relative or absolute.
        assert_eq!(
            route_one(&devices, "vbd", "backend/vbd/12/51712/state"),
            only(&a)
        );
        assert_eq!(route_one(&devices, "vbd", &format!("{a}/online")), only(&a));
        assert_eq!(route_one(&devices, "vbd", &a), only(&a));
    }

    #[test]
    fn directory_changes_above_or_outside_known_devices_rescan() {
        let devices = devices();
        let rescan = WatchWork {
            rescan: true,
            devices: BTreeSet::new(),
        };
        for path in [
            "backend/vbd",
            "backend/vbd/30",
            "backend/vbd/30/51712",
            "backend/vbd/30/51712/params",
            "/local/domain/1/backend/vbd/12",
        ] {
            assert_eq!(route_one(&devices, "vbd", path), rescan, "{path}");
        }
    }

    #[test]
    fn statistics_stale_tokens_and_foreign_paths_ask_for_nothing() {
        let devices = devices();
        let a = backend(12, 51712);
        let nothing = WatchWork::default();
        for (token, path) in [
            (a.as_str(), format!("{a}/blkdom-stats")),
            ("vbd", "backend/vbd/12/51712/blkdom-stats".to_string()),
            // A device removed earlier: the last events of its watches.
            (
                "/local/domain/1/backend/vbd/99/1",
                "/local/domain/99/device/vbd/1/state".to_string(),
            ),
            (
                "vbd",
                "/local/domain/2/backend/vbd/12/51712/state".to_string(),
            ),
            ("vbd", "/local/domain/10/backend/vbd/12/51712".to_string()),
            ("vbd", "backend/vbd2/12/51712".to_string()),
            ("something-else", "data/x".to_string()),
        ] {
            assert_eq!(route_one(&devices, token, &path), nothing, "{token} {path}");
        }
    }

    #[test]
    fn a_storm_of_events_for_one_device_costs_one_step_per_event() {
        let devices = devices();
        let a = backend(15, 51712 + 3 * 16);
        let frontend_state = "/local/domain/15/device/vbd/51760/state";
        let lookups = Cell::new(0usize);
        let is_device = |p: &str| {
            lookups.set(lookups.get() + 1);
            devices.contains(p)
        };
        // Worst case: every event arrives alone, so each is one round of the control
        // path. Count the steps each device gets.
        let events = 10_000;
        let mut steps: BTreeMap<String, usize> = BTreeMap::new();
        for n in 0..events {
            let mut work = WatchWork::default();
            // The frontend's write, and every other time our own answer under the
            // device (both its watch and the directory watch fire).
            router().route(&mut work, &a, frontend_state, is_device);
            if n % 2 == 0 {
                router().route(&mut work, &a, &format!("{a}/state"), is_device);
                router().route(&mut work, "vbd", &format!("{a}/state"), is_device);
            }
            assert!(!work.rescan);
            for device in work.devices {
                *steps.entry(device).or_default() += 1;
            }
        }
        assert_eq!(
            steps,
            [(a.clone(), events)].into(),
            "device A only, once each"
        );
        assert!(lookups.get() <= 2 * events, "{} lookups", lookups.get());

        // The same storm in one batch: one step.
        let mut work = WatchWork::default();
        for _ in 0..events {
            router().route(&mut work, &a, frontend_state, |p| devices.contains(p));
        }
        assert_eq!(work, only(&a));
    }

    #[test]
    fn one_batch_collects_every_device_named_once() {
        let devices = devices();
        let names: Vec<String> = devices.iter().take(5).cloned().collect();
        let mut work = WatchWork::default();
        for _ in 0..3 {
            for name in &names {
                router().route(&mut work, name, "/x/state", |p| devices.contains(p));
            }
        }
        assert_eq!(work.devices, names.iter().cloned().collect());
        assert!(!work.rescan);
    }
}
