// SPDX-License-Identifier: MIT OR Apache-2.0
//! Asymmetric Namespace Access: the state of a namespace's ANA group through one
//! controller, read from the ANA log page (NVMe base spec, "Asymmetric Namespace Access
//! Log"; Linux's host reads it in nvme_read_ana_log, nvmet writes it in
//! nvmet_execute_get_log_page_ana).
//!
//! A target with several ports (nvmet), listeners (SPDK) or gateways (a Ceph NVMe-oF
//! gateway group) reports through each controller whether the namespace can be served
//! there. Bring-up reads it so that a portal which cannot serve the namespace is left at
//! once, not found out by the first I/O's path error a reconnect delay later.

use core::fmt;

/// Log Identifier of the ANA log page.
pub const LOG_ANA: u8 = 0x0c;
/// Bytes of the log this host reads: the header and 127 group descriptors without
/// their namespace lists (RGO), more groups than nvmet (128) or SPDK enables in practice.
pub const LOG_LEN: u32 = 4096;
const HEADER_LEN: usize = 16;
const DESCRIPTOR_LEN: usize = 32;

/// A group's access state through the controller that reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    /// In transition (ANATT bounds how long).
    Change,
    /// A value the spec reserves.
    Reserved(u8),
}

impl AnaState {
    pub fn from_byte(b: u8) -> Self {
        match b & 0x0f {
            0x01 => AnaState::Optimized,
            0x02 => AnaState::NonOptimized,
            0x03 => AnaState::Inaccessible,
            0x04 => AnaState::PersistentLoss,
            0x0f => AnaState::Change,
            other => AnaState::Reserved(other),
        }
    }

    /// The state's value in the log (its low four bits).
    pub fn code(self) -> u8 {
        match self {
            AnaState::Optimized => 0x01,
            AnaState::NonOptimized => 0x02,
            AnaState::Inaccessible => 0x03,
            AnaState::PersistentLoss => 0x04,
            AnaState::Change => 0x0f,
            AnaState::Reserved(v) => v,
        }
    }

    /// I/O through this controller can succeed now (or soon, for a transition).
    /// Inaccessible and persistent loss cannot; a reserved value is not trusted either
    /// way and counts as usable, as though no state had been read.
    pub fn usable(self) -> bool {
        !matches!(self, AnaState::Inaccessible | AnaState::PersistentLoss)
    }
}

impl fmt::Display for AnaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnaState::Optimized => f.write_str("optimized"),
            AnaState::NonOptimized => f.write_str("non-optimized"),
            AnaState::Inaccessible => f.write_str("inaccessible"),
            AnaState::PersistentLoss => f.write_str("in persistent loss"),
            AnaState::Change => f.write_str("changing"),
            AnaState::Reserved(v) => write!(f, "in reserved state {v:#x}"),
        }
    }
}

/// A namespace's ANA group and its state through one controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnaPath {
    pub group: u32,
    pub state: AnaState,
}

/// The state of `group` in an ANA log page (`log`, as read; possibly cut short). `None`
/// when the log does not describe the group within what was read, or is malformed (a
/// descriptor count or namespace list running past the end): the target's log is
/// untrusted input and only bounds-checked reads touch it.
pub fn group_state(log: &[u8], group: u32) -> Option<AnaState> {
    let count = usize::from(u16::from_le_bytes([*log.get(8)?, *log.get(9)?]));
    let mut at = HEADER_LEN;
    for _ in 0..count {
        let descriptor = log.get(at..at.checked_add(DESCRIPTOR_LEN)?)?;
        let id = u32::from_le_bytes(descriptor[0..4].try_into().ok()?);
        let nsids = u32::from_le_bytes(descriptor[4..8].try_into().ok()?);
        if id == group {
            return Some(AnaState::from_byte(descriptor[16]));
        }
        // Namespace lists follow each descriptor unless the target honoured RGO.
        let list = usize::try_from(nsids).ok()?.checked_mul(4)?;
        at = at.checked_add(DESCRIPTOR_LEN)?.checked_add(list)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(groups: &[(u32, u8, &[u32])]) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN];
        out[8..10].copy_from_slice(&(groups.len() as u16).to_le_bytes());
        for &(id, state, nsids) in groups {
            let mut d = [0u8; DESCRIPTOR_LEN];
            d[0..4].copy_from_slice(&id.to_le_bytes());
            d[4..8].copy_from_slice(&(nsids.len() as u32).to_le_bytes());
            d[16] = state;
            out.extend_from_slice(&d);
            for n in nsids {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn finds_a_group_with_or_without_namespace_lists() {
        let groups_only = log(&[(1, 0x01, &[]), (2, 0x03, &[])]);
        assert_eq!(group_state(&groups_only, 2), Some(AnaState::Inaccessible));
        assert_eq!(group_state(&groups_only, 1), Some(AnaState::Optimized));
        // A target that ignored RGO: the second descriptor starts after the first's list.
        let with_lists = log(&[(1, 0x02, &[1, 4, 9]), (7, 0x0f, &[2])]);
        assert_eq!(group_state(&with_lists, 7), Some(AnaState::Change));
        assert_eq!(group_state(&with_lists, 1), Some(AnaState::NonOptimized));
        assert_eq!(group_state(&with_lists, 3), None);
    }

    #[test]
    fn a_log_that_runs_past_what_was_read_is_not_trusted() {
        let mut short = log(&[(1, 0x01, &[]), (2, 0x03, &[])]);
        short.truncate(HEADER_LEN + DESCRIPTOR_LEN + 10);
        assert_eq!(group_state(&short, 2), None);
        // A namespace count that would jump past the end (or overflow).
        let mut huge = log(&[(1, 0x01, &[]), (2, 0x03, &[])]);
        huge[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(group_state(&huge, 2), None);
        // More descriptors claimed than present.
        let mut claims = log(&[(1, 0x01, &[])]);
        claims[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(group_state(&claims, 5), None);
        assert_eq!(group_state(&[], 1), None);
    }

    #[test]
    fn random_logs_never_panic_and_a_state_found_is_read_inside_the_log() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let len = (next() % 300) as usize;
            let mut log: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Small counts and IDs now and then, so descriptors are walked and matched.
            if len > 10 {
                log[8] = (next() % 5) as u8;
                log[9] = 0;
            }
            for at in (HEADER_LEN..len.saturating_sub(8)).step_by(DESCRIPTOR_LEN) {
                if next() % 2 == 0 {
                    log[at..at + 4].copy_from_slice(&((next() % 4) as u32).to_le_bytes());
                    log[at + 4..at + 8].copy_from_slice(&((next() % 3) as u32).to_le_bytes());
                }
            }
            let group = (next() % 4) as u32;
            if let Some(state) = group_state(&log, group) {
                // The descriptor it came from lies whole inside the log.
                assert!(log.len() >= HEADER_LEN + DESCRIPTOR_LEN);
                assert!(state.code() <= 0x0f);
            }
        }
    }

    #[test]
    fn only_inaccessible_and_persistent_loss_are_unusable() {
        assert!(AnaState::from_byte(0x01).usable());
        assert!(AnaState::from_byte(0x02).usable());
        assert!(!AnaState::from_byte(0x03).usable());
        assert!(!AnaState::from_byte(0x04).usable());
        assert!(AnaState::from_byte(0x0f).usable());
        assert_eq!(AnaState::from_byte(0x13), AnaState::Inaccessible);
        assert!(AnaState::from_byte(0x07).usable());
        for b in 0..16 {
            assert_eq!(AnaState::from_byte(b).code(), b);
        }
    }
}
