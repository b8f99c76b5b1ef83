// SPDX-License-Identifier: MIT OR Apache-2.0
//! The state a xenbus device's `state` node holds.

/// `enum xenbus_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XenbusState {
    Unknown = 0,
    Initialising = 1,
    InitWait = 2,
    Initialised = 3,
    Connected = 4,
    Closing = 5,
    Closed = 6,
    Reconfiguring = 7,
    Reconfigured = 8,
}

impl XenbusState {
    /// Decode a `state` node; anything unexpected is `Unknown`.
    pub fn parse(value: &str) -> Self {
        match value.trim().parse::<u32>() {
            Ok(1) => Self::Initialising,
            Ok(2) => Self::InitWait,
            Ok(3) => Self::Initialised,
            Ok(4) => Self::Connected,
            Ok(5) => Self::Closing,
            Ok(6) => Self::Closed,
            Ok(7) => Self::Reconfiguring,
            Ok(8) => Self::Reconfigured,
            _ => Self::Unknown,
        }
    }
}
