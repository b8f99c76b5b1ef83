# SPDX-License-Identifier: MIT OR Apache-2.0
# Creating and destroying domains (sourced by tests/xen/lib.sh): blkdom as PVH, as HVM
# and as HVM with passed-through disks (with a command line from dom0's), and the Linux
# driver domain.
# shellcheck shell=dash disable=SC2034
# (dash: the dialect closest to dom0's busybox sh; SC2034: variables set here are read by
# the scenarios and the other parts)

# blkdom_cmdline_from KEY: BLKDOM_CMDLINE (boot_blkdom's) from dom0's KEY= (one word
# there: ':' or '+' between blkdom's words). blkdom_cmdline_config: the "blkdom=" line of
# a scenario's config file, ':' between words again (tools/bench/report.py and paired.py
# name it in their titles; empty when blkdom had none).
blkdom_cmdline_from() { BLKDOM_CMDLINE=$(cmdline_arg "$1" | tr ':+' '  '); }
blkdom_cmdline_config() { echo "blkdom=$(echo "$BLKDOM_CMDLINE" | tr ' ' ':')"; }

# create_domain NAME CONFIG [xl overrides...]: xl create, timed, at most CREATE_TIMEOUT
# (default 60) s. An earlier
# domain's console log of the same name is moved into $RESULTS first: xenconsoled appends
# to guest-NAME.log, and a check reading it (wait_blkdom_up's "blkdom: up") would take
# the earlier boot's lines for the new one's.
create_domain() {
  local name=$1 config=$2 start
  shift 2
  if [ -s "$CONSOLE_DIR/guest-$name.log" ]; then
    mv "$CONSOLE_DIR/guest-$name.log" "$RESULTS/console-$name-until-$(now).log"
  fi
  start=$(now)
  if timeout "${CREATE_TIMEOUT:-60}" xl create "$config" "$@" > "$RESULTS/xl-create-$name.log" 2>&1; then
    timing "xl-create-$name" "$(seconds_since "$start")"
    pass "xl create $name"
  else
    fail "xl create $name ($(grep -m 2 error "$RESULTS/xl-create-$name.log" | tr '\n' ' '))"
    if grep -q "unable to add device with path /local/domain/[1-9]" "$RESULTS/xl-create-$name.log"; then
      echo "rig: the driver domain never took the disk to InitWait (state 2): its blkif backend is missing or failed"
    fi
    dump_state "create-$name"
    return 1
  fi
}

# destroy_domain NAME: waits up to 30 s for it to power off, then destroys it.
destroy_domain() {
  local i
  for i in $(seq 60); do
    domid_of "$1" > /dev/null || return 0
    sleep 0.5
  done
  timeout 30 xl destroy "$1"
}

# wait_blkdom_up NAME TIMEOUT: blkdom logs through I/O port 0xE9, which Xen prints as
# "(d<N>) ..." in its console ring (xl dmesg); later also through its own console.
wait_blkdom_up() {
  local name=$1 limit=$2 start id
  start=$(now)
  id=$(domid_of "$name") || {
    fail "blkdom domain $name alive right after xl create (it crashed at once)"
    xl dmesg | grep -E "d[0-9]+v[0-9]+ (Triple fault|.*crash)|\(d[0-9]+\)" | tail -n 20 |
      sed 's/^/rig: xen: /'
    dump_state "blkdom-gone"
    return 1
  }
  while [ "$(seconds_since "$start" | cut -d. -f1)" -lt "$limit" ]; do
    if xl dmesg | grep -q "(d$id) .*blkdom: up" ||
       grep -q "blkdom: up" "$CONSOLE_DIR/guest-$name.log" 2>/dev/null; then
      timing "blkdom-up-after-create" "$(seconds_since "$start")"
      pass "blkdom reports up"
      return 0
    fi
    if ! domid_of "$name" > /dev/null; then
      break
    fi
    sleep 1
  done
  fail "blkdom reports up within ${limit}s"
  xl dmesg | grep "(d$id)" | tail -n 20 | sed 's/^/rig: blkdom log: /'
  dump_state "blkdom-$name"
  return 1
}

# boot_blkdom [xl overrides...]: creates the blkdom driver domain (tools/xl/blkdom.cfg)
# from the image `make image` built (with BLKDOM_CMDLINE as its kernel command line, if
# set), waits for "blkdom: up", and checks it is still running 3 s later.
boot_blkdom() {
  if [ ! -f "$RIG/images/blkdom" ]; then
    fail "blkdom image present (run make image)"
    return 1
  fi
  create_domain blkdom "$XL_DIR/blkdom.cfg" ${BLKDOM_CMDLINE:+"cmdline=\"$BLKDOM_CMDLINE\""} "$@" ||
    return 1
  wait_blkdom_up blkdom 60 || return 1
  still_running_after_up blkdom-died
}

# still_running_after_up TAG: blkdom neither crashed nor stopped in the 3 s after "up"
# (state dumped as TAG if it did).
still_running_after_up() {
  sleep 3
  case $(xl list blkdom 2>/dev/null | awk 'NR == 2 { print $5 }') in
    *c*|*s*|"") fail "blkdom still running 3 s after up ($(xl list blkdom 2>&1 | tail -n 1))"
                dump_state "$1"
                return 1 ;;
    *) pass "blkdom still running 3 s after up" ;;
  esac
}

# boot_linux_dd [CONFIG [xl overrides...]]: creates the Linux driver domain
# (tools/xl/linux-dd.cfg: blkback on a brd RAM disk of the same size as blkdom's;
# linux-hvm-dd.cfg: HVM, on the emulated NVMe of emulated_nvme_disk) and waits until its
# `xl devd` is up.
boot_linux_dd() {
  local config=${1:-linux-dd.cfg} start id i
  [ $# -gt 0 ] && shift
  start=$(now)
  create_domain linux-dd "$XL_DIR/$config" "$@" || return 1
  id=$(domid_of linux-dd)
  for i in $(seq 300); do
    if [ "$(xenstore-read "/local/domain/$id/data/rig-driver-domain" 2>/dev/null)" = ready ]; then
      timing linux-dd-ready-after-create "$(seconds_since "$start")"
      pass "Linux driver domain up (blkback, its disk, xl devd)"
      return 0
    fi
    domid_of linux-dd > /dev/null || break
    sleep 1
  done
  fail "Linux driver domain up within 300 s"
  xl dmesg | grep "(d$id)" | tail -n 40 | sed 's/^/rig: linux-dd: /'
  tail -n 20 "$CONSOLE_DIR/guest-linux-dd.log" 2>/dev/null | sed 's/^/rig: linux-dd: /'
  dump_state linux-dd
  return 1
}

# first_line_after NAME START: seconds from START until the domain's first own log line
# (through port 0xE9, in Xen's console ring) appears, at most 60 s.
first_line_after() {
  local id=$1 start=$2 i
  for i in $(seq 240); do
    if xl dmesg | grep -q "(d$id) .*blkdom .* starting"; then
      timing "blkdom-hvm-first-log-line-after-create" "$(seconds_since "$start")"
      return 0
    fi
    sleep 0.25
  done
  return 1
}

# boot_blkdom_hvm [CONFIG [xl overrides...]]: blkdom as an HVM driver domain
# (tools/xl/blkdom-hvm.cfg, on a fresh emulated NVMe disk, unless CONFIG says otherwise,
# or NVME_KEEP=1 keeps the disk an earlier blkdom had); waits for "blkdom: up" and logs
# what the HVM boot found.
boot_blkdom_hvm() {
  local config=${1:-blkdom-hvm.cfg} start id
  [ $# -gt 0 ] && shift
  if [ ! -f "$RIG/images/blkdom.elf32" ]; then
    fail "blkdom image (ELF32 copy) present (run make image)"
    return 1
  fi
  if [ "$config" = blkdom-hvm.cfg ] && [ "${NVME_KEEP:-0}" != 1 ]; then
    emulated_nvme_disk || return 1
  fi
  create_domain blkdom "$XL_DIR/$config" "$@" || return 1
  start=$(now)
  id=$(domid_of blkdom) || { fail "blkdom alive after xl create"; dump_state hvm-gone; return 1; }
  echo "rig: device model: $(ps | grep -c '[q]emu-system') process(es)"
  if ! first_line_after "$id" "$start"; then
    fail "blkdom (HVM) logs its first line within 60 s"
    xl dmesg | grep "(d$id)" | tail -n 40 | sed 's/^/rig: hvm boot: /'
    dump_state hvm-no-log
    return 1
  fi
  wait_blkdom_up blkdom 90 || return 1
  # What the HVM boot looked like from inside: memory map, CPUs, PCI, map space.
  xl dmesg | grep "(d$id)" | grep -E "memory map|  0x|cpu:|pci|nvme|virtio|BARs|map space|rsdp|passed through" |
    sed 's/^/rig: hvm: /'
  still_running_after_up hvm-died
}
# boot_blkdom_passthrough: blkdom as an HVM driver domain from the operator's config
# (tools/xl/blkdom-hvm-passthrough.cfg) with the rig's image, vCPUs and every outer disk;
# PCI: the xl pci list to give instead (the device model puts the devices on blkdom's bus
# in its order).
boot_blkdom_passthrough() {
  assign_passthrough_disks || return 1
  boot_blkdom_hvm blkdom-hvm-passthrough.cfg 'kernel="/rig/images/blkdom.elf32"' \
    'memory=512' 'vcpus=2' 'cpus=["1","2"]' \
    "pci=${PCI:-[\"$PT_NVME\",\"$PT_VIRTIO\"${PT_NVME2:+,\"$PT_NVME2\"}]}" \
    ${BLKDOM_CMDLINE:+"cmdline=\"$BLKDOM_CMDLINE\""}
}
