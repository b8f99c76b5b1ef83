// SPDX-License-Identifier: MIT OR Apache-2.0
//! CRC32C (Castagnoli), the NVMe/TCP digest. The `crc` crate's byte table (1 KiB)
//! computes it unless the platform installs a faster way once, before any connection
//! ([`accelerate`]): blkdom's arch layer installs the CPU's `crc32` instruction (SSE4.2)
//! where it measures faster. Both ways update the raw register, as the instruction
//! does: the CRC32C of `data` is `!update(!0, data)`.

use crc::{Algorithm, Crc, Table};

/// A raw register update: no initial value, no final inversion.
pub type Update = fn(u32, &[u8]) -> u32;

/// CRC32C's polynomial, reflected, without its initial value and final inversion.
const RAW: Algorithm<u32> = Algorithm {
    width: 32,
    poly: 0x1edc_6f41,
    init: 0,
    refin: true,
    refout: true,
    xorout: 0,
    check: 0,
    residue: 0,
};
static TABLE: Crc<u32, Table<1>> = Crc::<u32, Table<1>>::new(&RAW);
static FASTER: spin::Once<Update> = spin::Once::new();

/// The raw update by the `crc` crate's table.
pub fn software_update(register: u32, data: &[u8]) -> u32 {
    // A reflected algorithm takes its initial value bit-reversed into the register.
    let mut digest = TABLE.digest_with_initial(register.reverse_bits());
    digest.update(data);
    digest.finalize()
}

/// Every digest from now on is computed by `update` (the first call wins). It must
/// compute exactly what [`software_update`] does: the caller checks it does first.
pub fn accelerate(update: Update) {
    FASTER.call_once(|| update);
}

/// Whether [`accelerate`] installed a way.
pub fn accelerated() -> bool {
    FASTER.get().is_some()
}

#[inline]
fn update(register: u32, data: &[u8]) -> u32 {
    match FASTER.get() {
        Some(update) => update(register, data),
        None => software_update(register, data),
    }
}

/// The CRC32C of `data`.
pub fn checksum(data: &[u8]) -> u32 {
    !update(!0, data)
}

/// A CRC32C over bytes that arrive in pieces.
#[derive(Clone, Copy, Debug)]
pub struct Running(u32);

impl Running {
    pub const fn new() -> Running {
        Running(!0)
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0 = update(self.0, data);
    }

    /// The CRC32C of the bytes so far.
    pub fn value(&self) -> u32 {
        !self.0
    }
}

impl Default for Running {
    fn default() -> Running {
        Running::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicUsize, Ordering};

    /// The check value of CRC-32C (Castagnoli), as the catalogues give it.
    const CHECK: u32 = 0xe306_9283;

    #[test]
    fn the_table_computes_crc32c() {
        assert_eq!(!software_update(!0, b"123456789"), CHECK);
        assert_eq!(checksum(b"123456789"), CHECK);
        // The `crc` crate's own CRC32C agrees on longer input.
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let catalogued = Crc::<u32, Table<1>>::new(&crc::CRC_32_ISCSI);
        assert_eq!(checksum(&data), catalogued.checksum(&data));
    }

    #[test]
    fn a_running_digest_adds_up_pieces() {
        let mut running = Running::new();
        running.update(b"1234");
        running.update(b"");
        running.update(b"56789");
        assert_eq!(running.value(), CHECK);
        assert_eq!(Running::new().value(), checksum(b""));
    }

    static CALLS: AtomicUsize = AtomicUsize::new(0);

    fn counted(register: u32, data: &[u8]) -> u32 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        software_update(register, data)
    }

    fn other(_: u32, _: &[u8]) -> u32 {
        0
    }

    #[test]
    fn an_installed_way_computes_every_digest_from_then_on() {
        // Other tests of this binary may run through it: it computes the same.
        accelerate(counted);
        accelerate(other);
        assert!(accelerated());
        let before = CALLS.load(Ordering::Relaxed);
        assert_eq!(checksum(b"123456789"), CHECK);
        let mut running = Running::new();
        running.update(b"123456789");
        assert_eq!(running.value(), CHECK);
        assert!(CALLS.load(Ordering::Relaxed) >= before + 2);
    }
}
