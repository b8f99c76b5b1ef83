// SPDX-License-Identifier: MIT OR Apache-2.0
//! The xenstore keys of any xenbus device and of a domain's own directory that blkdom
//! reads or writes, by name. The vbd's own keys are in `blkback::keys`; README.md's
//! "Xenstore keys" lists the keys of both lists, each under its [`Place`], and
//! `xen/blkback/tests/xenstore_keys.rs` checks that the two agree.
//!
//! A key with a number in its name is written with a placeholder (`vdevfn-<N>`) and
//! made with [`numbered`].

use alloc::format;
use alloc::string::{String, ToString};

/// Where a key lives, and which side writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    /// The device's backend directory (`/local/domain/<backend>/backend/<class>/<domid>/<devid>/`),
    /// written by the toolstack or an operator, read by the backend.
    BackendRead,
    /// The device's backend directory, written by the backend.
    BackendWritten,
    /// The frontend's directory (the backend's [`FRONTEND`]), read by the backend.
    FrontendRead,
    /// The domain's own directory (`/local/domain/<domid>/`).
    Home,
    /// dom0's pci backend directory for the domain ([`pci_backend_directory`]), read.
    PciBackend,
    /// blkdom's own vif directory (`/local/domain/<blkdom>/device/vif/<n>/`), where
    /// blkdom is the frontend: the toolstack's keys read, the rings' written.
    VifFrontend,
    /// The vif's backend directory (netback's, in dom0), read.
    VifBackend,
}

/// A key and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The key's path under its directory, with placeholders (`<N>`) for numbers.
    pub name: &'static str,
    pub place: Place,
}

impl Key {
    pub const fn new(name: &'static str, place: Place) -> Self {
        Self { name, place }
    }
}

/// The device's xenbus state ([`super::XenbusState`]), in both directories.
pub const STATE: &str = "state";
/// The path of the frontend's directory.
pub const FRONTEND: &str = "frontend";
pub const FRONTEND_ID: &str = "frontend-id";
/// `0` once the toolstack detached the device.
pub const ONLINE: &str = "online";
/// What the hotplug scripts would have said: `connected`, or `error`.
pub const HOTPLUG_STATUS: &str = "hotplug-status";
pub const HOTPLUG_ERROR: &str = "hotplug-error";
/// Why the device is not served; also the node of the error directory
/// ([`super::error::error_node`]).
pub const ERROR: &str = "error";

pub const DOMID: &str = "domid";
pub const NAME: &str = "name";
/// `xl shutdown`/`xl reboot`'s request.
pub const CONTROL_SHUTDOWN: &str = "control/shutdown";
pub const CONTROL_FEATURE_POWEROFF: &str = "control/feature-poweroff";
pub const CONTROL_FEATURE_REBOOT: &str = "control/feature-reboot";

/// How many PCI devices libxl passed through.
pub const NUM_DEVS: &str = "num_devs";
/// Where passed-through device N sits on the domain's bus.
pub const VDEVFN: &str = "vdevfn-<N>";

/// A vif's keys (`public/io/netif.h`; what Linux netback reads in its `xenbus.c`).
pub mod vif {
    /// The backend's directory, and its domain.
    pub const BACKEND: &str = "backend";
    pub const BACKEND_ID: &str = "backend-id";
    /// `xx:xx:xx:xx:xx:xx`, written by the toolstack.
    pub const MAC: &str = "mac";
    /// The MTU the toolstack allows (libxl writes it, read-only to the frontend;
    /// absent: 1500).
    pub const MTU: &str = "mtu";
    pub const TX_RING_REF: &str = "tx-ring-ref";
    pub const RX_RING_REF: &str = "rx-ring-ref";
    pub const EVENT_CHANNEL: &str = "event-channel";
    /// `1`: netback copies frames into our pages (mandatory since Linux 3.x).
    pub const REQUEST_RX_COPY: &str = "request-rx-copy";
    /// `1`: we notify when posting rx pages (without it netback polls on a timer).
    pub const FEATURE_RX_NOTIFY: &str = "feature-rx-notify";
    /// `0`: checksum offload on (netback's TSO needs it); a received packet may then
    /// come with a blank TCP/UDP checksum, flagged.
    pub const FEATURE_NO_CSUM_OFFLOAD: &str = "feature-no-csum-offload";
    /// `1`: a received packet may span several rx slots.
    pub const FEATURE_SG: &str = "feature-sg";
    /// `1`: netback may hand over a TCPv4 packet of up to 64 KiB (a GSO extra slot).
    pub const FEATURE_GSO_TCPV4: &str = "feature-gso-tcpv4";
    /// The backend's: `1` when it can copy into our pages.
    pub const FEATURE_RX_COPY: &str = "feature-rx-copy";
    /// The backend's: how many queues a frontend may ask for.
    pub const MULTI_QUEUE_MAX_QUEUES: &str = "multi-queue-max-queues";
    /// How many queues the frontend made (written when the backend offers several).
    pub const MULTI_QUEUE_NUM_QUEUES: &str = "multi-queue-num-queues";
    /// Queue N's keys when there are several (one queue: the flat keys above).
    pub const QUEUE_TX_RING_REF: &str = "queue-<N>/tx-ring-ref";
    pub const QUEUE_RX_RING_REF: &str = "queue-<N>/rx-ring-ref";
    pub const QUEUE_EVENT_CHANNEL: &str = "queue-<N>/event-channel";
    /// The backend's: `1` when it takes a control ring (the hash set-up).
    pub const FEATURE_CTRL_RING: &str = "feature-ctrl-ring";
    /// The control ring's grant and event channel.
    pub const CTRL_RING_REF: &str = "ctrl-ring-ref";
    pub const EVENT_CHANNEL_CTRL: &str = "event-channel-ctrl";
}

/// Every key of this list blkdom uses, where it uses it.
pub const ALL: &[Key] = &[
    Key::new(FRONTEND, Place::BackendRead),
    Key::new(FRONTEND_ID, Place::BackendRead),
    Key::new(ONLINE, Place::BackendRead),
    Key::new(STATE, Place::BackendWritten),
    Key::new(HOTPLUG_STATUS, Place::BackendWritten),
    Key::new(HOTPLUG_ERROR, Place::BackendWritten),
    Key::new(ERROR, Place::BackendWritten),
    Key::new(STATE, Place::FrontendRead),
    Key::new(DOMID, Place::Home),
    Key::new(NAME, Place::Home),
    Key::new(CONTROL_SHUTDOWN, Place::Home),
    Key::new(CONTROL_FEATURE_POWEROFF, Place::Home),
    Key::new(CONTROL_FEATURE_REBOOT, Place::Home),
    Key::new(NUM_DEVS, Place::PciBackend),
    Key::new(VDEVFN, Place::PciBackend),
    Key::new(vif::BACKEND, Place::VifFrontend),
    Key::new(vif::BACKEND_ID, Place::VifFrontend),
    Key::new(vif::MAC, Place::VifFrontend),
    Key::new(vif::MTU, Place::VifFrontend),
    Key::new(STATE, Place::VifFrontend),
    Key::new(vif::TX_RING_REF, Place::VifFrontend),
    Key::new(vif::RX_RING_REF, Place::VifFrontend),
    Key::new(vif::EVENT_CHANNEL, Place::VifFrontend),
    Key::new(vif::REQUEST_RX_COPY, Place::VifFrontend),
    Key::new(vif::FEATURE_RX_NOTIFY, Place::VifFrontend),
    Key::new(vif::FEATURE_NO_CSUM_OFFLOAD, Place::VifFrontend),
    Key::new(vif::FEATURE_SG, Place::VifFrontend),
    Key::new(vif::FEATURE_GSO_TCPV4, Place::VifFrontend),
    Key::new(vif::MULTI_QUEUE_NUM_QUEUES, Place::VifFrontend),
    Key::new(vif::QUEUE_TX_RING_REF, Place::VifFrontend),
    Key::new(vif::QUEUE_RX_RING_REF, Place::VifFrontend),
    Key::new(vif::QUEUE_EVENT_CHANNEL, Place::VifFrontend),
    Key::new(vif::CTRL_RING_REF, Place::VifFrontend),
    Key::new(vif::EVENT_CHANNEL_CTRL, Place::VifFrontend),
    Key::new(STATE, Place::VifBackend),
    Key::new(vif::FEATURE_RX_COPY, Place::VifBackend),
    Key::new(vif::MULTI_QUEUE_MAX_QUEUES, Place::VifBackend),
    Key::new(vif::FEATURE_CTRL_RING, Place::VifBackend),
    Key::new(vif::FEATURE_SG, Place::VifBackend),
    Key::new(vif::FEATURE_GSO_TCPV4, Place::VifBackend),
];

/// `key` with its placeholder `<N>` replaced by `n` (`vdevfn-<N>`, 2: `vdevfn-2`).
pub fn numbered(key: &str, n: u32) -> String {
    key.replacen("<N>", &n.to_string(), 1)
}

/// dom0's pci backend directory for domain `domid`, where libxl lists the devices it
/// passed through ([`NUM_DEVS`], [`VDEVFN`]).
pub fn pci_backend_directory(domid: u32) -> String {
    format!("/local/domain/0/backend/pci/{domid}/0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_keys_fill_their_placeholder() {
        assert_eq!(numbered(VDEVFN, 2), "vdevfn-2");
        assert_eq!(numbered("queue-<N>", 10), "queue-10");
        assert_eq!(numbered(STATE, 1), "state");
        assert_eq!(pci_backend_directory(3), "/local/domain/0/backend/pci/3/0");
    }
}
