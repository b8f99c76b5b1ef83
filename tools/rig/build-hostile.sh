#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Builds tools/hostile (the hostile frontend the guest of tests/xen/hostile runs) as a
# static Linux x86_64 program (glibc linked in: the guest has no libraries), stripped,
# into $BLKDOM_CACHE/rig/hostile-<hash>/hostile; prints that path. Cargo rebuilds only
# what changed; build-images.sh keys the guest image on the binary's bytes.
set -euo pipefail
source "$(dirname "$0")/common.sh"

target=x86_64-unknown-linux-gnu   # the host's own target: no extra rustup target
target_dir=${CARGO_TARGET_DIR:-$REPO_DIR/target}
# An explicit --target keeps these flags (and the artifacts) apart from host builds.
(cd "$REPO_DIR" && RUSTFLAGS="-C target-feature=+crt-static" nice -n 10 \
  cargo build -q -p blkdom-hostile --release --target "$target") >&2 ||
  rig_die "building tools/hostile failed"
built=$target_dir/$target/release/hostile
# A dynamic program names its loader (INTERP); the guest has no libraries to load.
if readelf -l "$built" | grep -q 'program interpreter'; then
  rig_die "$built is not statically linked"
fi
# Kept under its own hash: a build from another tree (make rig) cannot swap the file
# under a build-images.sh that already hashed it.
tmp=$(mktemp "$RIG_CACHE/hostile.XXXXXX")
strip -o "$tmp" "$built"
chmod 755 "$tmp"
out=$RIG_CACHE/hostile-$(sha256sum "$tmp" | cut -c1-16)
mkdir -p "$out"
mv "$tmp" "$out/hostile"
# Earlier builds (1-2 MB each), once a day old.
find "$RIG_CACHE" -maxdepth 1 -name 'hostile-*' ! -path "$out" -mmin +1440 -exec rm -rf {} +
echo "$out/hostile"
