// SPDX-License-Identifier: MIT OR Apache-2.0
//! Checks image files the way a running blkdom checks the image a live upgrade hands it
//! (`handover::image::check`, against the file's own size and sha256): `make image` runs
//! it on both images it builds, so every image built can be upgraded to.
//!
//! Usage: `check_image IMAGE...`; one line per image, exit status 1 if one is refused.

use std::process::ExitCode;

use handover::block::HANDOVER_VERSION;
use handover::image::{check, sha256, Expected};

fn main() -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    for path in std::env::args().skip(1) {
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("{path}: {e}");
                status = ExitCode::FAILURE;
                continue;
            }
        };
        let expected = Expected {
            size: bytes.len(),
            sha256: sha256(&bytes),
            handover_version: HANDOVER_VERSION,
        };
        match check(&bytes, &expected) {
            Ok(image) => println!(
                "{path}: upgradable: build {}, PVH entry {:#x}, {} segments up to {:#x}, \
                 handover versions {}..={}",
                image.build_id,
                image.entry32,
                image.segments.len(),
                image
                    .segments
                    .iter()
                    .map(|s| s.paddr + s.memsz)
                    .max()
                    .unwrap_or(0),
                image.handover_versions.start(),
                image.handover_versions.end()
            ),
            Err(e) => {
                eprintln!("{path}: refused: {e}");
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}
