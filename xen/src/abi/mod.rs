// SPDX-License-Identifier: MIT OR Apache-2.0
//! Xen's public ABI, hand-written from `xen/include/public/` (x86_64 layout).
//!
//! Every struct carries a layout test. The expected sizes and offsets were produced by
//! compiling Xen's own headers (xen-project/xen at c447b7308b, `__XEN_INTERFACE_VERSION__`
//! 0x00040e00) with gcc on x86_64 and printing `sizeof`/`offsetof`, so the tests compare
//! against the C compiler's view of the headers, not against our reading of them.
//!
//! Pure data: no unsafe code lives here.

pub mod console;
pub mod cpuid;
pub mod errno;
pub mod event_channel;
pub mod grant_table;
pub mod hvm;
pub mod memory;
pub mod netif;
pub mod sched;
pub mod shared_info;
pub mod sring;
pub mod vcpu;
pub mod version;
pub mod xs_wire;

/// `hvm_start_info` and friends already live in the boot crate; re-exported, not copied.
pub use boot::start_info;

/// `domid_t`.
pub type DomId = u16;

/// `DOMID_SELF`: "the calling domain" in hypercall arguments.
pub const DOMID_SELF: DomId = 0x7FF0;
/// `DOMID_FIRST_RESERVED`: ids at or above this are not ordinary domains.
pub const DOMID_FIRST_RESERVED: DomId = 0x7FF0;

/// Size of a Xen page on x86.
pub const PAGE_SIZE: usize = 4096;
pub const PAGE_SHIFT: u32 = 12;

/// Hypercall numbers (`__HYPERVISOR_*` in `xen.h`) that blkdom issues.
pub mod hypercall_nr {
    pub const MEMORY_OP: u64 = 12;
    pub const MULTICALL: u64 = 13;
    pub const XEN_VERSION: u64 = 17;
    pub const CONSOLE_IO: u64 = 18;
    pub const GRANT_TABLE_OP: u64 = 20;
    pub const VCPU_OP: u64 = 24;
    pub const SCHED_OP: u64 = 29;
    pub const EVENT_CHANNEL_OP: u64 = 32;
    pub const HVM_OP: u64 = 34;
}

/// `CONSOLEIO_*` commands of `console_io`.
pub const CONSOLEIO_WRITE: u64 = 0;
pub const CONSOLEIO_READ: u64 = 1;
