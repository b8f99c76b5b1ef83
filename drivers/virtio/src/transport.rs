// SPDX-License-Identifier: MIT OR Apache-2.0
//! The virtio PCI common configuration window.

use crate::Hal;

/// Where the kernel mapped the device's capability windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciRegions {
    pub common: u64,
    /// Start of the notification window; queue q's doorbell is at
    /// `notify + queue_notify_off(q) * notify_multiplier`.
    pub notify: u64,
    pub notify_multiplier: u32,
    pub device: u64,
}

pub(crate) mod common {
    pub const DEVICE_FEATURE_SELECT: u64 = 0x00;
    pub const DEVICE_FEATURE: u64 = 0x04;
    pub const DRIVER_FEATURE_SELECT: u64 = 0x08;
    pub const DRIVER_FEATURE: u64 = 0x0c;
    pub const MSIX_CONFIG: u64 = 0x10;
    pub const NUM_QUEUES: u64 = 0x12;
    pub const DEVICE_STATUS: u64 = 0x14;
    pub const QUEUE_SELECT: u64 = 0x16;
    pub const QUEUE_SIZE: u64 = 0x18;
    pub const QUEUE_MSIX_VECTOR: u64 = 0x1a;
    pub const QUEUE_ENABLE: u64 = 0x1c;
    pub const QUEUE_NOTIFY_OFF: u64 = 0x1e;
    pub const QUEUE_DESC: u64 = 0x20;
    pub const QUEUE_DRIVER: u64 = 0x28;
    pub const QUEUE_DEVICE: u64 = 0x30;
}

pub(crate) mod status {
    pub const ACKNOWLEDGE: u8 = 1;
    pub const DRIVER: u8 = 2;
    pub const DRIVER_OK: u8 = 4;
    pub const FEATURES_OK: u8 = 8;
    pub const NEEDS_RESET: u8 = 0x40;
    pub const FAILED: u8 = 0x80;
}

/// MSI-X "no vector": the driver polls.
pub(crate) const NO_VECTOR: u16 = 0xffff;

pub(crate) struct Common<H: Hal> {
    pub hal: H,
    pub base: u64,
}

impl<H: Hal> Common<H> {
    pub fn status(&self) -> u8 {
        self.hal.read8(self.base + common::DEVICE_STATUS)
    }

    pub fn set_status(&self, value: u8) {
        self.hal.write8(self.base + common::DEVICE_STATUS, value);
    }

    pub fn add_status(&self, bits: u8) {
        self.set_status(self.status() | bits);
    }

    pub fn device_features(&self) -> u64 {
        let mut features = 0;
        for half in 0..2u32 {
            self.hal
                .write32(self.base + common::DEVICE_FEATURE_SELECT, half);
            features |=
                u64::from(self.hal.read32(self.base + common::DEVICE_FEATURE)) << (32 * half);
        }
        features
    }

    pub fn set_driver_features(&self, features: u64) {
        for half in 0..2u32 {
            self.hal
                .write32(self.base + common::DRIVER_FEATURE_SELECT, half);
            self.hal.write32(
                self.base + common::DRIVER_FEATURE,
                (features >> (32 * half)) as u32,
            );
        }
    }

    pub fn read16(&self, register: u64) -> u16 {
        self.hal.read16(self.base + register)
    }

    pub fn write16(&self, register: u64, value: u16) {
        self.hal.write16(self.base + register, value)
    }

    pub fn write64(&self, register: u64, value: u64) {
        self.hal.write32(self.base + register, value as u32);
        self.hal
            .write32(self.base + register + 4, (value >> 32) as u32);
    }
}
