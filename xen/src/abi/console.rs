// SPDX-License-Identifier: MIT OR Apache-2.0
//! The PV console ring (`public/io/console.h`).

pub const XENCONS_IN_SIZE: usize = 1024;
pub const XENCONS_OUT_SIZE: usize = 2048;

/// `struct xencons_interface`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XenconsInterface {
    pub in_: [u8; XENCONS_IN_SIZE],
    pub out: [u8; XENCONS_OUT_SIZE],
    pub in_cons: u32,
    pub in_prod: u32,
    pub out_cons: u32,
    pub out_prod: u32,
    pub connection: u8,
}

pub const XENCONSOLE_CONNECTED: u8 = 0;
pub const XENCONSOLE_DISCONNECTED: u8 = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn console_interface_layout() {
        assert_eq!(size_of::<XenconsInterface>(), 3092);
        assert_eq!(offset_of!(XenconsInterface, out), 1024);
        assert_eq!(offset_of!(XenconsInterface, in_cons), 3072);
        assert_eq!(offset_of!(XenconsInterface, in_prod), 3076);
        assert_eq!(offset_of!(XenconsInterface, out_cons), 3080);
        assert_eq!(offset_of!(XenconsInterface, out_prod), 3084);
        assert_eq!(offset_of!(XenconsInterface, connection), 3088);
    }
}
