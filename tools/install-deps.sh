#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Installs what building and testing blkdom needs, idempotently.
#   tools/install-deps.sh          tier 1 + 2 (Rust target, QEMU from bookworm-backports)
#   tools/install-deps.sh --xen    also what the nested Xen rig needs (tools/rig/)
#
# Why bookworm-backports: this machine carries qemu-utils 10.0.2 from backports, which
# Breaks: qemu-system-common (< 1:8.0), so bookworm's own qemu-system-x86 7.2 cannot be
# installed next to it (and 7.2 crashes Xen's dom0 with -cpu max anyway).
set -euo pipefail

want_xen=0
[ "${1:-}" = "--xen" ] && want_xen=1

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

log() { printf '[install-deps] %s\n' "$*"; }

# --- Rust target -----------------------------------------------------------------------
if ! rustup target list --installed | grep -qx x86_64-unknown-none; then
  log "adding rustup target x86_64-unknown-none"
  rustup target add x86_64-unknown-none
fi
for comp in rustfmt clippy; do
  if ! rustup component list --installed | grep -q "^$comp"; then
    log "adding rustup component $comp"
    rustup component add "$comp"
  fi
done

# --- apt sources -----------------------------------------------------------------------
backports=/etc/apt/sources.list.d/blkdom-bookworm-backports.sources
apt_updated=0
apt_update() {
  if [ "$apt_updated" = 0 ]; then
    $SUDO apt-get update -qq
    apt_updated=1
  fi
}
# The Debian mirror this machine already uses: the first URI serving "bookworm" in its
# deb822 or one-line sources (no mirror host is written into this repository).
debian_mirror() {
  local uri
  uri=$(awk '/^URIs:/ {u = $2} /^Suites:/ && / bookworm( |$)/ && u != "" {print u; exit}' \
          /etc/apt/sources.list.d/*.sources 2>/dev/null)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' \
          /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
  [ -n "$uri" ] || { echo "install-deps: no Debian bookworm source in /etc/apt" >&2; exit 1; }
  printf '%s\n' "$uri"
}
sources_added=0
if [ ! -f "$backports" ]; then
  sources_added=1
  mirror=$(debian_mirror)
  log "adding bookworm-backports (deb and deb-src) from this machine's Debian mirror"
  $SUDO tee "$backports" >/dev/null <<SRC
Types: deb deb-src
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
# The rig builds fio from bookworm's source package (tools/rig/build-fio.sh).
bookworm_src=/etc/apt/sources.list.d/blkdom-bookworm-src.sources
if [ "$want_xen" = 1 ] && [ ! -f "$bookworm_src" ]; then
  sources_added=1
  mirror=$(debian_mirror)
  log "adding bookworm deb-src"
  $SUDO tee "$bookworm_src" >/dev/null <<SRC
Types: deb-src
URIs: $mirror
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
# New sources need fresh indexes even when every package is already installed
# (apt-get source / download use them).
[ "$sources_added" = 1 ] && apt_update

missing=()
missing_bpo=()
need() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || missing+=("$1"); }
need_bpo() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || missing_bpo+=("$1"); }

need_bpo qemu-system-x86
need python3
# prometheus_client: tests/bench parses `blkdom-stat --prometheus` with the real parser
# (and the rig, tools/rig/prom_check.py, what blkdom-stat wrote in dom0). Debian's own
# python3 gets Debian's package (pip may not write there, PEP 668); another python3 on
# PATH (a venv, pyenv) gets it from PyPI with its own pip, below.
pip_packages=()
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
  if [ "$(python3 -c 'import sys; print(sys.prefix)')" = /usr ]; then
    need python3-prometheus-client
  else
    pip_packages+=(prometheus_client)
  fi
fi
if [ "$want_xen" = 1 ]; then
  # Build tools only. The rig's dom0/guest contents (Xen 4.17, Linux 6.1, busybox) are
  # Debian packages that tools/rig/build-images.sh downloads and unpacks into its cache:
  # installing xen-hypervisor or linux-image here would rewrite this machine's boot
  # loader and initramfs. QEMU and fio are built from source packages (tools/rig/).
  # e2fsprogs: its mke2fs/e2fsck go into the guest image (the mkfs/fsck checks).
  # busybox: tests/bench runs the rig's shell library under busybox sh and awk too, as
  # dom0 runs it (without it those tests run under sh alone and one is skipped).
  for p in zstd cpio binutils dpkg-dev build-essential pkg-config ninja-build flex bison \
           libglib2.0-dev libpixman-1-dev libfdt-dev zlib1g-dev python3-venv python3-tomli \
           libaio-dev seabios ipxe-qemu e2fsprogs busybox; do
    need "$p"
  done
  # Building QEMU 10.0.2 needs meson >= 1.5 and python3-pycotap from backports.
  need_bpo meson
  need_bpo python3-pycotap
fi

export DEBIAN_FRONTEND=noninteractive
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing: ${missing[*]}"
  apt_update
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ "${#missing_bpo[@]}" -gt 0 ]; then
  log "installing from bookworm-backports: ${missing_bpo[*]}"
  apt_update
  $SUDO apt-get install -y -q --no-install-recommends -t bookworm-backports "${missing_bpo[@]}"
fi
if [ "${#pip_packages[@]}" -gt 0 ]; then
  log "installing with $(command -v python3)'s pip: ${pip_packages[*]}"
  python3 -m pip install -q "${pip_packages[@]}"
fi
python3 -c 'import prometheus_client' ||
  { echo "install-deps: python3 cannot import prometheus_client" >&2; exit 1; }
log "ok"
