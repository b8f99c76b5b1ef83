# SPDX-License-Identifier: MIT OR Apache-2.0
# Shared settings for the nested Xen rig scripts (sourced, not run).
# Everything built or downloaded lives outside git, under $BLKDOM_CACHE, keyed by a hash
# of its inputs so that a change of patch, package version or script rebuilds it.

RIG_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$RIG_DIR/../.." && pwd)
BLKDOM_CACHE=${BLKDOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blkdom}
RIG_CACHE=$BLKDOM_CACHE/rig
mkdir -p "$RIG_CACHE"

# QEMU 10.0.2 from Debian bookworm-backports (source package), patched.
QEMU_SRC_VERSION=1:10.0.2+ds-2+deb13u1~bpo12+1
QEMU_UPSTREAM=10.0.2
# The distro python (meson >= 1.5 from backports is installed for it), not a pyenv shim.
QEMU_CONFIGURE=(--python=/usr/bin/python3 --target-list=x86_64-softmmu --without-default-features --disable-docs
  --disable-werror --disable-rust --disable-install-blobs)
# Firmware (SeaBIOS, option ROMs such as multiboot_dma.bin) comes from the distro packages
# qemu-system-data, seabios and ipxe-qemu.
QEMU_FIRMWARE_ARGS=(-L /usr/share/qemu -L /usr/share/seabios -L /usr/lib/ipxe/qemu)

rig_log() { printf '[rig] %s\n' "$*" >&2; }
rig_die() { printf '[rig] error: %s\n' "$*" >&2; exit 1; }

# Prints a short hash of files and strings given as arguments (files by content).
rig_hash() {
  local arg
  for arg in "$@"; do
    if [ -f "$arg" ]; then
      printf 'file %s\n' "$(basename "$arg")"
      cat "$arg"
    else
      printf 'str %s\n' "$arg"
    fi
  done | sha256sum | cut -c1-16
}

# The QEMU build takes minutes, so its key is what shapes the binary: the patches, the
# source version and the configure flags. Bump QEMU_BUILD_REV when build-qemu.sh changes
# in a way that matters for the binary.
QEMU_BUILD_REV=1
rig_qemu_key() {
  rig_hash "$RIG_DIR"/qemu-*.patch "$QEMU_SRC_VERSION" "${QEMU_CONFIGURE[*]}" "rev $QEMU_BUILD_REV"
}
rig_qemu_bin() { printf '%s/qemu-%s/qemu-system-x86_64\n' "$RIG_CACHE" "$(rig_qemu_key)"; }

# Debian bookworm packages the dom0 and guest images are made of. They are downloaded
# (`apt-get download`) and unpacked into the cache, never installed on the host: installing
# xen-hypervisor or linux-image would rewrite the host's boot loader and initramfs.
RIG_KERNEL_META=linux-image-amd64
RIG_PACKAGES=(xen-hypervisor-4.17-amd64 xen-utils-4.17 xen-utils-common xenstore-utils
  libxencall1 libxendevicemodel1 libxenevtchn1 libxenforeignmemory1 libxengnttab1
  libxenhypfs1 libxenmisc4.17 libxenstore4 libxentoolcore1 libxentoollog1 libyajl2
  busybox-static
  # The HVM driver domain's device model (tests/xen/blkdom-hvm): qemu-xen runs in dom0,
  # hvmloader (xen-utils-4.17) and SeaBIOS boot the domain, libspice-server's libraries
  # that the host lacks come along (xen-qemu-system-i386 links them).
  qemu-system-xen seabios libspice-server1 libgstreamer-plugins-base1.0-0 libopus0
  liborc-0.4-0)
# fio is built from Debian's source package: the binary package links Ceph, GlusterFS,
# RDMA and PMEM libraries (75 MB of initramfs); a static build with libaio is ~3 MB.
RIG_FIO_VERSION=3.33-3
RIG_FIO_CONFIGURE=(--disable-native --build-static --disable-numa --disable-rdma
  --disable-gfapi --disable-rados --disable-rbd --disable-http --disable-pmem
  --disable-libnfs --disable-xnvme --disable-dfs --disable-tcmalloc)

# scenario_field FILE KEY: the value of the "# rig-KEY: value" header line of a scenario
# (tests/xen/FILE), empty if it has none.
scenario_field() {
  sed -n "s/^# rig-$2: *//p" "$1" | head -n 1
}
# scenario_list [SUITE]: the scenarios of tests/xen/ (those of SUITE, if given).
scenario_list() {
  local file
  for file in "$REPO_DIR"/tests/xen/*; do
    [ -f "$file" ] && [ -n "$(scenario_field "$file" smp)" ] || continue
    if [ -z "${1:-}" ] || [ "$(scenario_field "$file" suite)" = "$1" ]; then
      basename "$file"
    fi
  done
}

# Outer devices for scenarios with "rig-devices: passthrough": an emulated VT-d (before
# every PCI device: QEMU wants the IOMMU first) and, at fixed addresses dom0 makes
# assignable (tests/xen/lib.sh), an NVMe controller with two namespaces and a virtio-blk
# disk with two queues that goes through the IOMMU (iommu_platform: without it QEMU's
# virtio would DMA to outer-guest-physical addresses, which are not the driver domain's).
# "rig-devices: passthrough second-nvme" adds a second NVMe controller (serial pt-nvme-1,
# one namespace with the NGUID PASSTHROUGH_NVME2_NGUID): two drives that only their
# stable names tell apart (tests/xen/blkdom-pt-names).
# passthrough_qemu_args DIR [second-nvme]: sets PASSTHROUGH_ARGS, with fresh sparse disk
# files in DIR, and PASSTHROUGH_XEN_ARGS for Xen's command line: iommu=no-sharept,no-intremap.
# no-sharept: Xen shares its p2m
# with VT-d when it thinks the CPU has EPT ("Intel VT-d Shared EPT tables enabled"), but
# the TCG CPU runs SVM: the VT-d then walks NPT-format tables and no IOTLB flush follows a
# p2m change, so once a grant-mapped frame was unmapped and the same guest-physical page
# mapped to another grant, the device kept DMAing to the old frame (fio verify read
# other blocks' data, a rebooted guest's kernel was overwritten). Separate VT-d
# tables are flushed on every map and unmap. Real hardware has EPT with VT-d.
# no-intremap: with interrupt remapping on, Xen runs its APICs in x2APIC mode, and every
# interrupt of a passed-through device (MSI-X and INTx alike) reached pCPU 0 whatever
# CPU Xen had routed it to ("CPU0: No irq handler for vector 49", hundreds of thousands
# of times for a level-triggered INTx: the machine stalls). blkdom polls its devices and
# never noticed; a Linux driver domain hung in its NVMe probe waiting for the first
# admin completion (tests/xen/pt-linux-probe). With remapping off it boots and serves.
# Real hardware keeps interrupt remapping on: it is what stops a device from injecting
# interrupts into other domains.
PASSTHROUGH_DISK_MIB=256
PASSTHROUGH_NVME_BDF=0000:00:10.0
PASSTHROUGH_VIRTIO_BDF=0000:00:11.0
PASSTHROUGH_NVME2_BDF=0000:00:12.0
# tests/xen/blkdom-pt-names names the second controller's namespace by this NGUID.
PASSTHROUGH_NVME2_NGUID=b1d0a11c0ffee0000000000000000002
passthrough_qemu_args() {
  local dir=$1
  truncate -s "${PASSTHROUGH_DISK_MIB}M" "$dir/pt-nvme-ns1.img" "$dir/pt-nvme-ns2.img" \
    "$dir/pt-virtio.img"
  PASSTHROUGH_XEN_ARGS="iommu=no-sharept,no-intremap "
  PASSTHROUGH_ARGS=(
    -device intel-iommu,intremap=on
    -drive "file=$dir/pt-nvme-ns1.img,format=raw,if=none,id=ptns1"
    -drive "file=$dir/pt-nvme-ns2.img,format=raw,if=none,id=ptns2"
    -device "nvme,id=ptnvme,serial=pt-nvme-0,addr=${PASSTHROUGH_NVME_BDF:8:2}.0"
    -device nvme-ns,drive=ptns1,bus=ptnvme,nsid=1
    -device nvme-ns,drive=ptns2,bus=ptnvme,nsid=2
    -drive "file=$dir/pt-virtio.img,format=raw,if=none,id=ptvirtio"
    -device "virtio-blk-pci,drive=ptvirtio,serial=pt-virtio-0,addr=${PASSTHROUGH_VIRTIO_BDF:8:2}.0,num-queues=2,iommu_platform=on,disable-legacy=on"
  )
  [ "${2:-}" = second-nvme ] || return 0
  truncate -s "${PASSTHROUGH_DISK_MIB}M" "$dir/pt-nvme2-ns1.img"
  PASSTHROUGH_ARGS+=(
    -drive "file=$dir/pt-nvme2-ns1.img,format=raw,if=none,id=pt2ns1"
    -device "nvme,id=ptnvme2,serial=pt-nvme-1,addr=${PASSTHROUGH_NVME2_BDF:8:2}.0"
    -device "nvme-ns,drive=pt2ns1,bus=ptnvme2,nsid=1,nguid=$PASSTHROUGH_NVME2_NGUID"
  )
}
