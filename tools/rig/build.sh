#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Builds everything the nested Xen rig boots (each step is cached and skipped when its
# inputs are unchanged): the patched QEMU, a static fio, the dom0 and guest initramfs.
set -euo pipefail
here=$(dirname "$0")
qemu=$("$here/build-qemu.sh")
images=$("$here/build-images.sh")
echo "qemu:   $qemu"
echo "images: $images"
sed 's/^/        /' "$images/versions.txt"
