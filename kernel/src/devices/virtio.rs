//! virtio-blk over the modern PCI transport.

use super::open::OpenedDisk;
use super::platform::PciConfig;
use alloc::format;
use alloc::string::String;
use pci::Function;

pub fn open(
    _pci: &PciConfig,
    function: Function,
    _wanted_queues: usize,
) -> Result<OpenedDisk, String> {
    Err(format!(
        "{}: virtio-blk driver not wired yet",
        function.address
    ))
}
