# SPDX-License-Identifier: MIT OR Apache-2.0
# The disks the backends serve (sourced by tests/xen/lib.sh): dom0's RAM disk, the
# emulated NVMe's backing file and the GPT the host made for it, the pattern the slice
# guests write, the outer disks dom0 hands over for passthrough, and disks attached to a
# running guest (blkdom's backend keys of one, a RAM disk as a guest's cue).
# shellcheck shell=dash disable=SC2034
# (dash: the dialect closest to dom0's busybox sh; SC2034: variables set here are read by
# the scenarios and the other parts)

RAMDISK_MIB=256   # the same size blkdom's RAM disk uses

# load_ramdisk: /dev/ram0, $RAMDISK_MIB MiB, served by dom0's blkback in the baseline.
load_ramdisk() {
  [ -b /dev/ram0 ] && return 0
  insmod /lib/modules/brd.ko rd_nr=1 rd_size=$((RAMDISK_MIB * 1024)) max_part=0 &&
    pass "brd ram disk $RAMDISK_MIB MiB" || fail "brd ram disk"
}

# The emulated NVMe disk of the HVM driver domains (blkdom-hvm.cfg, linux-hvm-dd.cfg):
# a fresh sparse file in dom0 each time.
NVME_IMAGE=/var/lib/xen/blkdom-nvme.img
NVME_MIB=256
emulated_nvme_disk() {
  rm -f "$NVME_IMAGE"
  truncate -s "${NVME_MIB}M" "$NVME_IMAGE" || { fail "NVMe backing file $NVME_IMAGE"; return 1; }
}

# gpt_onto FILE: the GPT of the scenario's rig-gpt header (tools/rig/run.sh wrote it on the
# host into images/gpt.img with drivers/backing's gpt-image: the disk's first blocks) over
# the start of FILE.
gpt_onto() {
  [ -f "$RIG/images/gpt.img" ] && dd if="$RIG/images/gpt.img" of="$1" conv=notrunc 2>/dev/null
}
# slice_pattern NAME BYTES: BYTES bytes of lines that name NAME. The guests'
# slice-fill/slice-check jobs (tools/rig/initramfs/guest-init) make the same bytes.
slice_pattern() {
  local line=$1 i
  for i in 1 2 3 4 5 6 7; do line="$line $line"; done
  yes "$line" | head -c "$2"
}

# The disks the outer QEMU gives dom0 for passthrough (tools/rig/common.sh,
# passthrough_qemu_args): the NVMe controllers by their class (nvme the first on the bus,
# nvme2 the second, which only "rig-devices: passthrough second-nvme" adds), the
# virtio-blk disk by its modern-only device id (the rig's own virtio disks are
# transitional, 1af4:1001).
passthrough_bdf() {  # passthrough_bdf nvme|nvme2|virtio
  local dev skip=0
  [ "$1" = nvme2 ] && skip=1
  for dev in /sys/bus/pci/devices/*; do
    case ${1%2}:$(cat "$dev/class"):$(cat "$dev/vendor"):$(cat "$dev/device") in
      nvme:0x010802:*)
        [ "$skip" = 0 ] && { basename "$dev"; return 0; }
        skip=$((skip - 1)) ;;
      virtio:*:0x1af4:0x1042) basename "$dev"; return 0 ;;
    esac
  done
  return 1
}
# assign_passthrough_disks: xen-pciback takes the disks from dom0's drivers; sets
# PT_NVME and PT_VIRTIO to their addresses, and PT_NVME2 to the second NVMe controller's
# when the outer QEMU has one (empty otherwise).
assign_passthrough_disks() {
  local kind bdf
  PT_NVME2=
  for kind in nvme virtio nvme2; do
    if ! bdf=$(passthrough_bdf "$kind"); then
      [ "$kind" = nvme2 ] && return 0
      fail "dom0 sees the outer $kind disk for passthrough"
      return 1
    fi
    # A domain that had the device gives it back to pciback when it is destroyed, which
    # takes a moment (until then pci-assignable-add says it is already assigned).
    listed() { xl pci-assignable-list | grep -qi "$bdf"; }
    if listed || { xl pci-assignable-add "$bdf" > "$RESULTS/assignable-$kind.log" 2>&1; wait_for 30 listed; }; then
      pass "$kind disk $bdf assignable"
    else
      fail "$kind disk $bdf assignable ($(tail -n 2 "$RESULTS/assignable-$kind.log" | tr '\n' ' '))"
      return 1
    fi
    case $kind in nvme) PT_NVME=$bdf ;; nvme2) PT_NVME2=$bdf ;; virtio) PT_VIRTIO=$bdf ;; esac
  done
}

# --- disks attached to a running guest (blkdom $bid their backend) ---------------------
# vbd_id xvdX: the device number (xen-vbd-interface: 202 << 8 | disk << 4).
vbd_id() {
  local disk
  case $1 in
    xvda) disk=0 ;; xvdb) disk=1 ;; xvdc) disk=2 ;; xvdd) disk=3 ;;
    xvde) disk=4 ;; xvdf) disk=5 ;; xvdg) disk=6 ;; *) disk=15 ;;
  esac
  echo $(((202 << 8) | (disk << 4)))
}
# backend_node GUEST VDEV KEY: a key of blkdom's backend directory of that disk.
# shellcheck disable=SC2154 # bid: the scenario's blkdom
backend_node() {
  xenstore-read "/local/domain/$bid/backend/vbd/$(domid_of "$1")/$(vbd_id "$2")/$3" 2>/dev/null
}
# attach_ok GUEST VDEV TARGET: xl block-attach of a disk that must work.
attach_ok() {
  if timeout 90 xl block-attach "$1" "backend=blkdom,vdev=$2,access=rw,target=$3" \
       > "$RESULTS/block-attach-$1-$2.log" 2>&1; then
    pass "$1: xl block-attach $3 as $2"
  else
    fail "$1: xl block-attach $3 as $2 ($(tail -n 2 "$RESULTS/block-attach-$1-$2.log" | tr '\n' ' '))"
  fi
}
# go GUEST VDEV: attaches a small RAM disk as VDEV to GUEST: its cue to go on (guest-init's
# job await-VDEV). Once per cue, whoever gives it first.
go() {
  [ -f "/tmp/go-$1-$2" ] && return 0
  touch "/tmp/go-$1-$2"
  attach_ok "$1" "$2" ram:4M
}
