#![no_std]
#![no_main]

// The PVH entry lives in `boot` and is reached only through the linker script's ENTRY.
extern crate boot;

#[no_mangle]
pub extern "C" fn kernel_main(_start_info_paddr: u64) -> ! {
    loop {
        x86_64::instructions::hlt();
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {
        x86_64::instructions::hlt();
    }
}
