// SPDX-License-Identifier: MIT OR Apache-2.0
//! Views of the `shared_info` page and of `vcpu_info` slots, through [`SharedMem`].

use crate::abi::event_channel::EvtchnPort;
use crate::abi::shared_info::{
    SharedInfo, VcpuInfo, VcpuTimeInfo, BITS_PER_XEN_ULONG, EVTCHN_2L_NR_CHANNELS, EVTCHN_2L_WORDS,
    XEN_LEGACY_MAX_VCPUS,
};
use crate::evtchn::EventBits;
use crate::SharedMem;
use core::mem::{offset_of, size_of};
use core::sync::atomic::Ordering;

const PENDING: usize = offset_of!(SharedInfo, evtchn_pending);
const MASK: usize = offset_of!(SharedInfo, evtchn_mask);

/// The `shared_info` page after `XENMEM_add_to_physmap(XENMAPSPACE_shared_info)`.
#[derive(Clone, Copy, Debug)]
pub struct SharedInfoPage {
    mem: SharedMem,
}

impl SharedInfoPage {
    /// `None` if the window is smaller than `struct shared_info`.
    pub fn new(mem: SharedMem) -> Option<Self> {
        (mem.len() >= size_of::<SharedInfo>()).then_some(Self { mem })
    }

    /// The legacy `vcpu_info` slot of `vcpu` (< 32) inside the page.
    pub fn legacy_vcpu_info(&self, vcpu: u32) -> Option<VcpuInfoView> {
        let vcpu = usize::try_from(vcpu).ok()?;
        if vcpu >= XEN_LEGACY_MAX_VCPUS {
            return None;
        }
        let offset = offset_of!(SharedInfo, vcpu_info) + vcpu * size_of::<VcpuInfo>();
        VcpuInfoView::new(self.mem.window(offset, size_of::<VcpuInfo>())?)
    }

    pub fn pending_word(&self, word: usize) -> u64 {
        assert!(word < EVTCHN_2L_WORDS);
        self.mem.load_u64(PENDING + word * 8, Ordering::Acquire)
    }

    pub fn mask_word(&self, word: usize) -> u64 {
        assert!(word < EVTCHN_2L_WORDS);
        self.mem.load_u64(MASK + word * 8, Ordering::Acquire)
    }

    fn port_bit(port: EvtchnPort) -> Option<(usize, u64)> {
        let port = port as usize;
        (port < EVTCHN_2L_NR_CHANNELS).then(|| {
            (
                port / BITS_PER_XEN_ULONG * 8,
                1u64 << (port % BITS_PER_XEN_ULONG),
            )
        })
    }

    pub fn is_pending(&self, port: EvtchnPort) -> bool {
        Self::port_bit(port).is_some_and(|(off, bit)| {
            self.mem.load_u64(PENDING + off, Ordering::Acquire) & bit != 0
        })
    }

    /// Clears the pending bit (the guest's job after taking an event).
    pub fn clear_pending(&self, port: EvtchnPort) {
        if let Some((off, bit)) = Self::port_bit(port) {
            self.mem
                .fetch_and_u64(PENDING + off, !bit, Ordering::AcqRel);
        }
    }

    /// Marks a port pending from inside the guest: a vCPU in `SCHEDOP_poll` on it, or
    /// about to be, returns (Xen checks the polled ports' bits after blocking the vCPU).
    /// Raises no upcall.
    pub fn set_pending(&self, port: EvtchnPort) {
        if let Some((off, bit)) = Self::port_bit(port) {
            self.mem.fetch_or_u64(PENDING + off, bit, Ordering::AcqRel);
        }
    }

    /// Masks a port locally (no upcall while set). Unmasking must go through
    /// `EVTCHNOP_unmask` so that Xen re-raises an event that arrived meanwhile.
    pub fn mask(&self, port: EvtchnPort) {
        if let Some((off, bit)) = Self::port_bit(port) {
            self.mem.fetch_or_u64(MASK + off, bit, Ordering::AcqRel);
        }
    }

    pub fn is_masked(&self, port: EvtchnPort) -> bool {
        Self::port_bit(port)
            .is_some_and(|(off, bit)| self.mem.load_u64(MASK + off, Ordering::Acquire) & bit != 0)
    }

    /// Test and fake support: what Xen does when an event arrives on `port` bound to the
    /// vCPU whose `vcpu_info` is `target`. Returns whether an upcall is due.
    pub fn raise(&self, port: EvtchnPort, target: &VcpuInfoView) -> bool {
        let Some((off, bit)) = Self::port_bit(port) else {
            return false;
        };
        let was = self.mem.fetch_or_u64(PENDING + off, bit, Ordering::AcqRel);
        if was & bit != 0 || self.is_masked(port) {
            return false;
        }
        let word = port as usize / BITS_PER_XEN_ULONG;
        target.mem.fetch_or_u64(SEL, 1 << word, Ordering::AcqRel);
        target.mem.swap_u8(UPCALL_PENDING, 1, Ordering::AcqRel) == 0
    }
}

const UPCALL_PENDING: usize = offset_of!(VcpuInfo, evtchn_upcall_pending);
const SEL: usize = offset_of!(VcpuInfo, evtchn_pending_sel);

/// One vCPU's `vcpu_info` (the legacy slot, or where `VCPUOP_register_vcpu_info` put it).
#[derive(Clone, Copy, Debug)]
pub struct VcpuInfoView {
    mem: SharedMem,
}

impl VcpuInfoView {
    /// Where the `vcpu_info` lies (what a live upgrade hands over).
    pub fn address(&self) -> u64 {
        self.mem.base_addr() as u64
    }

    /// `None` if the window is smaller than `struct vcpu_info` or not 8-aligned.
    pub fn new(mem: SharedMem) -> Option<Self> {
        (mem.len() >= size_of::<VcpuInfo>() && mem.base_addr().is_multiple_of(8))
            .then_some(Self { mem })
    }

    pub fn upcall_pending(&self) -> bool {
        self.mem.load_u8(UPCALL_PENDING, Ordering::Acquire) != 0
    }

    /// Cleared before scanning, so an event after the scan sets it (and upcalls) again.
    pub fn clear_upcall_pending(&self) {
        self.mem.store_u8(UPCALL_PENDING, 0, Ordering::SeqCst);
    }

    /// Atomically takes the pending-word selector.
    pub fn take_selector(&self) -> u64 {
        self.mem.swap_u64(SEL, 0, Ordering::AcqRel)
    }
}

const TIME: usize = offset_of!(VcpuInfo, time);

/// A consistent copy of `vcpu_time_info`: converts TSC readings to Xen system time
/// (nanoseconds since Xen booted, the clock of `SCHEDOP_poll` timeouts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XenClock {
    pub tsc_timestamp: u64,
    pub system_time: u64,
    pub tsc_to_system_mul: u32,
    pub tsc_shift: i8,
}

impl XenClock {
    /// `system_time + ((tsc - tsc_timestamp) << shift) * mul >> 32` (Xen's formula).
    ///
    /// The difference is signed, as Xen means it. An HVM/PVH domain's TSC starts at 0
    /// when the domain is created, and Xen stamps `tsc_timestamp` from the pCPU's last
    /// calibration (every second) shifted into the domain's TSC: until the first
    /// calibration after the domain was created, that is below zero (wrapped), and the
    /// wrapped difference is the true one. A reading from before the timestamp (another
    /// pCPU's, or an older snapshot's) gives `system_time`, never a time wrapped ~forever
    /// into the future.
    pub fn system_time_at(&self, tsc: u64) -> u64 {
        let delta = tsc.wrapping_sub(self.tsc_timestamp) as i64;
        let delta = u64::try_from(delta).unwrap_or(0);
        self.system_time.wrapping_add(self.ticks_to_ns(delta))
    }

    /// `ticks` of the TSC in nanoseconds at this snapshot's rate.
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        let ticks = if self.tsc_shift >= 0 {
            ticks << self.tsc_shift
        } else {
            ticks >> -i32::from(self.tsc_shift)
        };
        ((u128::from(ticks) * u128::from(self.tsc_to_system_mul)) >> 32) as u64
    }

    /// Whether Xen has filled in the rate: with a zero multiplier every TSC reading
    /// converts to the same time, and every difference to 0.
    pub fn has_rate(&self) -> bool {
        self.tsc_to_system_mul != 0
    }
}

impl VcpuInfoView {
    /// Reads `vcpu_info.time` under its version counter (odd = Xen is updating).
    pub fn clock(&self) -> XenClock {
        let field = |name: usize| TIME + name;
        loop {
            let version = self
                .mem
                .load_u32(field(offset_of!(VcpuTimeInfo, version)), Ordering::Acquire);
            if version & 1 != 0 {
                core::hint::spin_loop();
                continue;
            }
            let clock = XenClock {
                tsc_timestamp: self.mem.load_u64(
                    field(offset_of!(VcpuTimeInfo, tsc_timestamp)),
                    Ordering::Acquire,
                ),
                system_time: self.mem.load_u64(
                    field(offset_of!(VcpuTimeInfo, system_time)),
                    Ordering::Acquire,
                ),
                tsc_to_system_mul: self.mem.load_u32(
                    field(offset_of!(VcpuTimeInfo, tsc_to_system_mul)),
                    Ordering::Acquire,
                ),
                tsc_shift: self.mem.load_u8(
                    field(offset_of!(VcpuTimeInfo, tsc_shift)),
                    Ordering::Acquire,
                ) as i8,
            };
            if self
                .mem
                .load_u32(field(offset_of!(VcpuTimeInfo, version)), Ordering::Acquire)
                == version
            {
                return clock;
            }
        }
    }
}

/// What one vCPU scans: the shared bitmaps plus its own selector.
#[derive(Clone, Copy, Debug)]
pub struct VcpuEvents {
    pub shared: SharedInfoPage,
    pub vcpu_info: VcpuInfoView,
}

impl EventBits for VcpuEvents {
    fn take_selector(&self) -> u64 {
        self.vcpu_info.take_selector()
    }

    fn pending_word(&self, word: usize) -> u64 {
        self.shared.pending_word(word)
    }

    fn mask_word(&self, word: usize) -> u64 {
        self.shared.mask_word(word)
    }

    fn clear_pending(&self, port: EvtchnPort) {
        self.shared.clear_pending(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_sets_pending_selector_and_upcall() {
        let page = SharedInfoPage::new(SharedMem::alloc_leaked(4096)).unwrap();
        let v1 = page.legacy_vcpu_info(1).unwrap();
        assert!(page.raise(130, &v1));
        assert!(page.is_pending(130));
        assert!(v1.upcall_pending());
        // Word 2 holds ports 128..191.
        assert_eq!(v1.take_selector(), 1 << 2);
        assert_eq!(v1.take_selector(), 0);
        // Already pending: no new upcall.
        assert!(!page.raise(130, &v1));
        page.clear_pending(130);
        assert!(!page.is_pending(130));
        // Masked: pending is set but no selector/upcall.
        v1.clear_upcall_pending();
        page.mask(131);
        assert!(!page.raise(131, &v1));
        assert!(page.is_pending(131));
        assert!(!v1.upcall_pending());
        assert_eq!(page.pending_word(2), 1 << 3);
    }

    #[test]
    fn clock_converts_tsc_to_system_time() {
        // 2 GHz TSC: mul = 2^32 / 2 with shift 0 gives 0.5 ns per tick.
        let clock = XenClock {
            tsc_timestamp: 1000,
            system_time: 5_000,
            tsc_to_system_mul: 1 << 31,
            tsc_shift: 0,
        };
        assert_eq!(clock.system_time_at(1000), 5_000);
        assert_eq!(clock.system_time_at(3000), 6_000);
        let shifted = XenClock {
            tsc_shift: -1,
            ..clock
        };
        assert_eq!(shifted.system_time_at(3000), 5_500);
        let up = XenClock {
            tsc_shift: 2,
            ..clock
        };
        assert_eq!(up.system_time_at(3000), 9_000);
        // A reading just before the timestamp: no wrap into the far future.
        assert_eq!(clock.system_time_at(999), 5_000);
        assert_eq!(clock.system_time_at(0), 5_000);
        // A timestamp below zero (a domain younger than the pCPU's last calibration):
        // time runs from it, it does not stand still at `system_time`.
        let young = XenClock {
            tsc_timestamp: (-4000i64) as u64,
            ..clock
        };
        assert_eq!(young.system_time_at(0), 7_000);
        assert_eq!(young.system_time_at(2000), 8_000);
        assert_eq!(clock.ticks_to_ns(2000), 1_000);
        assert!(clock.has_rate());
        assert!(!XenClock::default().has_rate());
        // Read back through the shared page.
        let page = SharedInfoPage::new(SharedMem::alloc_leaked(4096)).unwrap();
        let v0 = page.legacy_vcpu_info(0).unwrap();
        v0.mem.store_u64(TIME + 8, 1000, Ordering::Relaxed);
        v0.mem.store_u64(TIME + 16, 5_000, Ordering::Relaxed);
        v0.mem.store_u32(TIME + 24, 1 << 31, Ordering::Relaxed);
        v0.mem.store_u8(TIME + 28, 0xff, Ordering::Relaxed); // shift -1
        v0.mem.store_u32(TIME, 2, Ordering::Release);
        assert_eq!(v0.clock(), shifted);
    }

    #[test]
    fn legacy_slots_are_64_bytes_apart_and_bounded() {
        let mem = SharedMem::alloc_leaked(4096);
        let page = SharedInfoPage::new(mem).unwrap();
        page.legacy_vcpu_info(3)
            .unwrap()
            .mem
            .store_u8(0, 1, Ordering::Relaxed);
        assert_eq!(mem.load_u8(3 * 64, Ordering::Relaxed), 1);
        assert!(page.legacy_vcpu_info(32).is_none());
        assert!(SharedInfoPage::new(SharedMem::alloc_leaked(1024)).is_none());
        assert!(!page.is_pending(5000));
    }
}
