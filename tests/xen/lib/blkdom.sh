# SPDX-License-Identifier: MIT OR Apache-2.0
# What blkdom reports about itself (sourced by tests/xen/lib.sh): its poller line in
# xenstore (rings, mapped pages, heap), whether its domain runs, and its log (Xen's
# console ring and its own console).
# shellcheck shell=dash disable=SC2034
# (dash: the dialect closest to dom0's busybox sh; SC2034: variables set here are read by
# the scenarios and the other parts)

# blkdom_pollers DOMID: blkdom's poller line (data/blkdom-pollers, refreshed every 5 s):
# "vcpu0: rings=.. loops=.. busy=.. sleeps=..; vcpu1: ...; grant-budget=.. ...;
# bounced-bytes=N; heap-free=N heap-used=N; mapped-pages=N" (mapped-pages last).
blkdom_pollers() { xenstore-read "/local/domain/$1/data/blkdom-pollers" 2>/dev/null; }
# pollers_value DOMID NAME: NAME's value on that line (heap-used, mapped-pages, ...); of a
# per-vCPU name (rings, loops, ...) the sum over the vCPUs; nothing if it has none.
pollers_value() {
  blkdom_pollers "$1" | tr ' ;' '\n\n' |
    awk -F= -v name="$2" '$1 == name { n += $2; found = 1 } END { if (found) print n }'
}
# blkdom_holds_nothing DOMID: no ring on either poller and no foreign page mapped.
blkdom_holds_nothing() {
  blkdom_pollers "$1" | grep -q "vcpu0: rings=0.*vcpu1: rings=0.*mapped-pages=0$"
}
# blkdom_up: the blkdom domain runs (not crashed or shut down: on_crash is preserve, so a
# crashed blkdom keeps its domain id).
blkdom_up() {
  case $(xl list blkdom 2>/dev/null | awk 'NR == 2 { print $5 }') in
    *c*|*s*|"") return 1 ;;
    *) return 0 ;;
  esac
}
# record_blkdom_edge EDGE JOB GUEST FILE: a line in FILE at a job's edge (the bench-backend
# scenarios, read by tools/bench/backend.py): GUEST's CPU time, each blkdom vCPU's (xl
# vcpu-list) and blkdom's poller counters (data/blkdom-pollers, refreshed every 5 s).
record_blkdom_edge() {
  local vcpus
  vcpus=$(xl vcpu-list blkdom 2>/dev/null | awk 'NR > 1 { printf "%s%s", sep, $6; sep = "," }')
  echo "$1 $2 uptime=$(now) guest_cpu_s=$(cpu_seconds "$3") blkdom_vcpu_s=$vcpus" \
    "$(blkdom_pollers "$(domid_of blkdom)" | tr -d ';')" >> "$4"
}
# blkdom_log [DOMID]: everything blkdom logged: its early lines (port 0xE9, in Xen's
# console ring, before its console exists) and its console. DOMID defaults to $bid.
blkdom_log() {
  xl dmesg | grep "(d${1:-$bid}) "
  cat "$CONSOLE_DIR/guest-blkdom.log" 2>/dev/null
}
# blkdom_logged PATTERN [SECONDS]: blkdom_log has a line matching PATTERN (grep -E), now
# or within SECONDS (default 10: xenconsoled writes the console log a moment after blkdom
# writes its console). blkdom's earliest lines are in Xen's ring only, and the ring splits
# a line every 200 characters: a check on blkdom's log needs both (DOMID $bid).
blkdom_logged() {
  local i
  for i in $(seq 0 "${2:-10}"); do
    [ "$i" = 0 ] || sleep 1
    blkdom_log | grep -qE "$1" && return 0
  done
  return 1
}
