#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Builds a static fio (libaio engine, no Ceph/Gluster/RDMA) from Debian's source package
# for the guest initramfs. Cached in $BLKDOM_CACHE/rig/fio-<hash>/fio; prints its path.
set -euo pipefail
source "$(dirname "$0")/common.sh"

key=$(rig_hash "$RIG_DIR/build-fio.sh" "$RIG_FIO_VERSION" "${RIG_FIO_CONFIGURE[*]}")
bin=$RIG_CACHE/fio-$key/fio
exec 9>"$RIG_CACHE/fio.lock"
flock 9
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
[ -f /usr/lib/x86_64-linux-gnu/libaio.a ] || rig_die "libaio-dev missing (run tools/install-deps.sh --xen)"

work=$RIG_CACHE/fio-build.tmp
rm -rf "$work"
mkdir -p "$work"
rig_log "downloading the fio $RIG_FIO_VERSION source package"
(cd "$work" && apt-get source -q --download-only "fio=$RIG_FIO_VERSION") >"$work/download.log" 2>&1 ||
  { cat "$work/download.log" >&2; rig_die "apt-get source fio failed (needs a bookworm deb-src line)"; }
tar -xzf "$work"/fio_*.orig.tar.gz -C "$work"
rig_log "building a static fio (nice -n 10, -j2)"
if ! (cd "$work"/fio-*/ && nice -n 10 ./configure "${RIG_FIO_CONFIGURE[@]}" &&
      nice -n 10 make -j2 fio) >"$work/build.log" 2>&1; then
  tail -n 30 "$work/build.log" >&2
  rig_die "fio build failed (log: $work/build.log)"
fi
grep -q '^Linux AIO support  *yes' "$work/build.log" || rig_die "fio was configured without libaio"
mkdir -p "$(dirname "$bin")"
strip -o "$bin.tmp" "$work"/fio-*/fio
mv "$bin.tmp" "$bin"
rm -rf "$work"
echo "$bin"
