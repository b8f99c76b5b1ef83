#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Builds qemu-system-x86_64 10.0.2 from Debian's bookworm-backports source package with the
# nested-SVM fixes in tools/rig/qemu-*.patch (stock 10.0.x kills every PVH/HVM guest under
# Xen). Cached in $BLKDOM_CACHE/rig/qemu-<hash of inputs>/; prints the binary's path.
# Takes minutes; a lock keeps two builds from running at once.
set -euo pipefail
source "$(dirname "$0")/common.sh"

out_dir=$(dirname "$(rig_qemu_bin)")
bin=$(rig_qemu_bin)
exec 9>"$RIG_CACHE/qemu.lock"
flock 9
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

src_dir=$RIG_CACHE/qemu-src
mkdir -p "$src_dir"
tarball=$src_dir/qemu_${QEMU_UPSTREAM}+ds.orig.tar.xz
if [ ! -f "$tarball" ]; then
  rig_log "downloading the qemu $QEMU_SRC_VERSION source package (needs a bookworm-backports deb-src line)"
  # The mirror may lack the .dsc/.debian.tar.xz of this backport; the patches we need are
  # our own, so the upstream (orig) tarball is enough. apt verifies its checksum.
  (cd "$src_dir" && apt-get source -q --download-only "qemu=$QEMU_SRC_VERSION") \
    > "$src_dir/download.log" 2>&1 || [ -f "$tarball" ] ||
    { cat "$src_dir/download.log" >&2
      rig_die "apt-get source qemu=$QEMU_SRC_VERSION failed (run tools/install-deps.sh --xen)"; }
fi

work=$RIG_CACHE/qemu-build.tmp
rm -rf "$work"
mkdir -p "$work"
rig_log "unpacking and patching qemu $QEMU_UPSTREAM"
tar -xf "$tarball" -C "$work"
tree=$work/qemu-$QEMU_UPSTREAM
for patch in "$RIG_DIR"/qemu-*.patch; do
  patch -d "$tree" -p1 --quiet --forward < "$patch" || rig_die "patch $patch does not apply"
done

rig_log "building qemu (nice -n 10, -j2; ~3 min); log: $work/build.log"
start=$(date +%s)
if ! (cd "$tree" && mkdir build && cd build &&
      nice -n 10 ../configure "${QEMU_CONFIGURE[@]}" &&
      nice -n 10 ninja -j2 qemu-system-x86_64) > "$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log" >&2
  rig_die "qemu build failed (full log: $work/build.log)"
fi
mkdir -p "$out_dir"
cp "$tree/build/qemu-system-x86_64" "$bin.tmp"
mv "$bin.tmp" "$bin"
rig_log "qemu built in $(( $(date +%s) - start )) s: $bin"
rm -rf "$work"
find "$RIG_CACHE" -maxdepth 1 -name 'qemu-*' -type d ! -name "$(basename "$out_dir")" ! -name qemu-src \
  -exec rm -rf {} +
echo "$bin"
