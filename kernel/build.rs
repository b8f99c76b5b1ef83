// SPDX-License-Identifier: MIT OR Apache-2.0
//! Links the image at its physical address (linker.ld) and generates the 256 trap entry
//! stubs, which differ only in their vector number and whether the CPU pushes an error code.
use std::fmt::Write;

/// Exceptions for which the CPU pushes an error code (Intel SDM vol. 3, table 6-1).
const ERROR_CODE_VECTORS: [u32; 10] = [8, 10, 11, 12, 13, 14, 17, 21, 29, 30];

fn trap_stubs() -> String {
    let mut asm = String::from(".pushsection .text.trap_stubs, \"ax\"\n");
    for vector in 0..256u32 {
        let _ = writeln!(asm, ".balign 16\ntrap_stub_{vector}:");
        if !ERROR_CODE_VECTORS.contains(&vector) {
            asm.push_str("    push 0\n");
        }
        let _ = writeln!(asm, "    push {vector}\n    jmp trap_common");
    }
    asm.push_str(".popsection\n.pushsection .rodata.trap_stub_table, \"a\"\n.balign 8\n");
    asm.push_str(".global trap_stub_table\ntrap_stub_table:\n");
    for vector in 0..256u32 {
        let _ = writeln!(asm, "    .quad trap_stub_{vector}");
    }
    asm.push_str(".popsection\n");
    asm
}

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = std::path::Path::new(&dir).join("../linker.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-link-arg-bins=-T{}", script.display());
    // The image's version: a hash of its contents, which a live upgrade checks and logs.
    println!("cargo:rustc-link-arg-bins=--build-id=sha1");

    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(
        std::path::Path::new(&out).join("trap_stubs.s"),
        trap_stubs(),
    )
    .expect("write trap stubs");
}
