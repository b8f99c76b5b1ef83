//! Why a vbd could not be set up or connected. Their texts go to the vbd's xenstore
//! `hotplug-error`/`error` nodes and to the console, which operators and the tests
//! read: each `Display` keeps the wording it had as a formatted string.

use alloc::vec::Vec;
use core::fmt;
use xen::XenError;

/// Why connecting a frontend's rings failed (after "connecting rings: " in `error`).
#[derive(Debug)]
pub enum ConnectError {
    /// Not running under Xen (no hypercalls).
    NoXen,
    /// Every map region is serving a ring.
    NoMapSpace,
    /// The ring's grants did not map (none stays mapped).
    MapRing {
        refs: Vec<u32>,
        error: xen::grant::MapError,
    },
    BindEventChannel {
        port: u32,
        error: XenError,
    },
    /// A real disk's queues are all taken by rings already.
    AllQueuesServing {
        opened: usize,
    },
    /// The mapped ring does not fit what the frontend negotiated.
    Ring(blkback::ring::RingError),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::NoXen => f.write_str("no Xen platform"),
            ConnectError::NoMapSpace => {
                f.write_str("no guest-physical map space left for another ring")
            }
            ConnectError::MapRing { refs, error } => {
                write!(f, "mapping ring grants {refs:?}: {error:?}")
            }
            ConnectError::BindEventChannel { port, error } => {
                write!(f, "binding event channel {port}: {error:?}")
            }
            ConnectError::AllQueuesServing { opened } => {
                write!(f, "all {opened} queues of the device are serving rings")
            }
            ConnectError::Ring(error) => write!(f, "ring: {error:?}"),
        }
    }
}

impl core::error::Error for ConnectError {}
