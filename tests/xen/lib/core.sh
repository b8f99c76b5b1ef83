# SPDX-License-Identifier: MIT OR Apache-2.0
# The rig's basics (sourced by tests/xen/lib.sh, which says how scenarios run): dom0's
# command line, time, the checks (pass, fail, finish), waiting, domain ids and CPU time,
# and the state dump that explains a failure.
# shellcheck shell=dash disable=SC2034
# (dash: the dialect closest to dom0's busybox sh; SC2034: variables set here are read by
# the scenarios and the other parts)

XL_DIR=$RIG/tools/xl
CONSOLE_DIR=/var/log/xen/console
checks_failed=0

# Prints the value of NAME=value on dom0's kernel command line (tools/rig/run.sh passes
# scenario arguments there).
cmdline_arg() {
  for word in $(cat /proc/cmdline); do
    case $word in "$1="*) echo "${word#*=}" ;; esac
  done
}

now() { cut -d' ' -f1 /proc/uptime; }
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.2f", end - start }'; }
timing() {
  echo "$1 $2" >> "$RESULTS/timings.txt"
  echo "rig: timing $1 ${2}s"
}
# A scenario may set CHECK_TAG=rig-info for a part whose failures are reported but do not
# count (the demo's blkdom half, until blkdom serves).
CHECK_TAG=rig-check
pass() { echo "$CHECK_TAG: PASS $*"; }
fail() {
  [ "$CHECK_TAG" = rig-check ] && checks_failed=$((checks_failed + 1))
  echo "$CHECK_TAG: FAIL $*"
}
# Exit status of the scenario: 0 only when no check failed.
finish() { [ "$checks_failed" = 0 ]; }

domid_of() { xl domid "$1" 2>/dev/null; }

# wait_for SECONDS COMMAND...: true once COMMAND succeeds (tried once a second).
wait_for() {
  local limit=$1 i
  shift
  for i in $(seq "$limit"); do
    "$@" && return 0
    sleep 1
  done
  return 1
}
# cpu_seconds DOMAIN[+DOMAIN...]: CPU seconds the domain (or the domains together: a
# storage path that spans domains) has used so far (xl list's Time(s) column).
cpu_seconds() {
  local domain total=0 one
  for domain in $(echo "$1" | tr '+' ' '); do
    one=$(xl list "$domain" 2>/dev/null | awk 'NR == 2 { print $6 }')
    [ -n "$one" ] || return 0
    total=$(awk -v a="$total" -v b="$one" 'BEGIN { printf "%.1f", a + b }')
  done
  echo "$total"
}

# Saves what explains a failure: xenstore, domain list, Xen's log, guest consoles.
dump_state() {
  local tag=$1
  xenstore-ls -fp > "$RESULTS/xenstore-$tag.txt" 2>&1
  xl list -v > "$RESULTS/xl-list-$tag.txt" 2>&1
  xl dmesg > "$RESULTS/xl-dmesg-$tag.txt" 2>&1
  cp "$CONSOLE_DIR"/*.log /var/log/xen/*.log "$RESULTS/" 2>/dev/null
  echo "rig: state dumped as $tag: $(xl list | awk 'NR > 1 { printf "%s(%s) ", $1, $5 }')"
}
