// SPDX-License-Identifier: MIT OR Apache-2.0
//! Which build this is: the linker's build id (a hash of the image), logged at boot,
//! written to xenstore for `blkdom-stat`, and checked by a live upgrade; and the note
//! saying which handover versions this image reads (docs/design.md §4.12).

use handover::block::HANDOVER_VERSION;
use handover::image::{BuildId, BLKDOM_NOTE_HANDOVER};

// The blkdom note: name "blkdom", type BLKDOM_NOTE_HANDOVER, the lowest and the highest
// handover version read. A running image refuses a new one whose range lacks its own.
core::arch::global_asm!(
    r#"
    .pushsection .note.blkdom, "a", @note
    .balign 4
    .long 7
    .long 8
    .long {kind}
    .asciz "blkdom"
    .balign 4
    .long {min}
    .long {max}
    .popsection
    "#,
    kind = const BLKDOM_NOTE_HANDOVER,
    min = const HANDOVER_VERSION,
    max = const HANDOVER_VERSION,
);

/// This image's build id; `None` only if it was linked without `--build-id`.
pub fn build_id() -> Option<BuildId> {
    handover::image::build_id_in(crate::mm::image_notes())
}
