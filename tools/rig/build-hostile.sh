#!/usr/bin/env bash
# Builds tools/hostile (the hostile frontend the guest of tests/xen/hostile runs) as a
# static Linux x86_64 program (glibc linked in: the guest has no libraries), stripped,
# into $BLKDOM_CACHE/rig/hostile/hostile; prints that path. Cargo rebuilds only what
# changed; build-images.sh keys the guest image on the binary's bytes.
set -euo pipefail
source "$(dirname "$0")/common.sh"

target=x86_64-unknown-linux-gnu   # the host's own target: no extra rustup target
target_dir=${CARGO_TARGET_DIR:-$REPO_DIR/target}
# An explicit --target keeps these flags (and the artifacts) apart from host builds.
(cd "$REPO_DIR" && RUSTFLAGS="-C target-feature=+crt-static" nice -n 10 \
  cargo build -q -p hostile --release --target "$target") >&2 ||
  rig_die "building tools/hostile failed"
built=$target_dir/$target/release/hostile
# A dynamic program names its loader (INTERP); the guest has no libraries to load.
if readelf -l "$built" | grep -q 'program interpreter'; then
  rig_die "$built is not statically linked"
fi
out=$RIG_CACHE/hostile
mkdir -p "$out"
strip -o "$out/hostile.tmp" "$built"
mv "$out/hostile.tmp" "$out/hostile"
echo "$out/hostile"
