#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Boots Xen 4.17 + a Linux dom0 under qemu-system-x86_64 (TCG) and runs ONE scenario from
# tests/xen/ inside dom0, non-interactively:
#   tools/rig/run.sh SCENARIO... [--runtime SECONDS]   (fio seconds per job, default 20)
#   tools/rig/run.sh --suite test-xen [--runtime SECONDS]  (every scenario of that suite)
# SCENARIO: a file of tests/xen/ whose header sets its QEMU -smp, budget and the rest.
# XEN_EXTRA_ARGS (words ending in a space) go to the front of Xen's command line.
# Results land in results/xen/<scenario>/ (serial.log, fio-*.json, cpu-*.txt, timings.txt,
# xenstore dumps on failure) and are summarised on stdout. QEMU, the scenario and each
# step inside it run under hard timeouts; on failure the last 50 log lines are printed.
# The last line is "N passed, M failed"; the exit status is 0 only when nothing failed.
# The body is one { } block, which bash reads whole before running it: editing this file
# while a run waits for the rig or runs cannot change what that run does.
{
set -euo pipefail
source "$(dirname "$0")/common.sh"

scenarios=()
runtime=20
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) runtime=${2:?--runtime needs seconds}; shift 2 ;;
    --suite) scenarios+=($(scenario_list "${2:?--suite needs a name}")); shift 2 ;;
    *) scenarios+=("$1"); shift ;;
  esac
done
# Several scenarios: one QEMU boot each, then the total of their checks.
if [ "${#scenarios[@]}" -gt 1 ]; then
  total_passed=0
  total_failed=0
  for scenario in "${scenarios[@]}"; do
    "$0" "$scenario" --runtime "$runtime" | tee "$RIG_CACHE/last-run.out" || true
    read -r p _ f _ < <(tail -n 1 "$RIG_CACHE/last-run.out")
    [[ $p =~ ^[0-9]+$ && $f =~ ^[0-9]+$ ]] || { p=0; f=1; }
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
  done
  echo "$total_passed passed, $total_failed failed"
  [ "$total_failed" = 0 ]
  exit
fi
scenario=${scenarios[0]:-}
# One nested Xen at a time on this machine (2 cores; a second QEMU would starve the first
# and its timings would mean nothing): wait for whoever holds the rig.
exec 8>"$RIG_CACHE/run.lock"
if ! flock -n 8; then
  rig_log "another nested run holds the rig; waiting for it"
  flock 8
fi
# The scenario declares itself in its header (tests/xen/<name>, "# rig-<key>: value"):
#   rig-smp     QEMU -smp: one pCPU per vCPU alive at once (dom0, each HVM/PVH vCPU; PV
#               guests share dom0's): a vCPU sharing a pCPU under TCG loses state
#   rig-budget  seconds for the scenario inside dom0 (shell arithmetic; may use $runtime);
#               QEMU as a whole gets 120 s more for boot and write-back
#   rig-suite   test-xen: part of `make test-xen` (run.sh --suite test-xen)
#   rig-table   backends of the fio table tools/rig/summarize.py prints
#   rig-env     VAR=rig.arg ...: host variables handed to the scenario on dom0's
#               command line (spaces and commas become '+': a comma would split -initrd)
#   rig-devices passthrough: the outer QEMU gets an IOMMU and the disks dom0 hands to an
#               HVM driver domain (an NVMe controller with 2 namespaces, a virtio-blk disk);
#               "passthrough second-nvme": and a second NVMe controller (common.sh)
#   rig-gpt     DISK_SIZE NUMBER:FIRST_LBA:LAST_LBA:NAME...: a GPT for a disk of that size,
#               written on the host by the project's GPT code (drivers/backing's example
#               gpt-image) into images/gpt.img (the disk's first 34 blocks), which dom0
#               writes over the start of the disk (tests/xen/lib/disks.sh, gpt_onto)
file=$REPO_DIR/tests/xen/$scenario
[ -n "$scenario" ] && [ -f "$file" ] ||
  rig_die "usage: $0 SCENARIO... | --suite NAME [--runtime SECONDS] (scenarios: $(scenario_list))"
smp=$(scenario_field "$file" smp)
budget_expr=$(scenario_field "$file" budget)
[[ $smp =~ ^[0-9]+$ ]] && [ -n "$budget_expr" ] || rig_die "$file: no rig-smp/rig-budget header"
eval "budget=\$(( $budget_expr ))"
scenario_args=
for pair in $(scenario_field "$file" env); do
  var=${pair%%=*}
  value=${!var:-}
  value=${value// /+}
  scenario_args="$scenario_args ${pair#*=}=${value//,/+}"
done
table_backends=($(scenario_field "$file" table))
qemu_timeout=$((budget + 120))

qemu=$("$RIG_DIR/build-qemu.sh")
images=$("$RIG_DIR/build-images.sh")
# BLKDOM_IMAGE= (set, empty) runs without an image, e.g. when it does not build.
blkdom_image=${BLKDOM_IMAGE-$REPO_DIR/target/x86_64-unknown-none/release/blkdom}
# The test image (`make image` builds it beside the production one): the self-tests under
# Xen boot it (tests/xen/platform.sh), as the production image has no test hooks.
blkdom_test_image=${BLKDOM_TEST_IMAGE-$REPO_DIR/target/test-hooks/x86_64-unknown-none/release/blkdom}

results=$REPO_DIR/results/xen/$scenario
rm -rf "$results"
mkdir -p "$results"
work=$(mktemp -d "${TMPDIR:-/tmp}/blkdom-rig.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The input disk: a tar dom0 unpacks into /rig (scripts are read at run time, so editing
# a scenario needs no image rebuild).
mkdir -p "$work/in/images" "$work/in/tests" "$work/in/tools"
cp -r "$REPO_DIR/tests/xen" "$work/in/tests/"
cp -r "$REPO_DIR/tools/xl" "$REPO_DIR/tools/blkdom-stat" "$work/in/tools/"
# dom0's live-upgrade tool (tools/upgrade), static as tools/hostile is: dom0 has none of
# its libraries. Read at run time from /rig/tools, like the scripts: no image rebuild.
upgrade_target=x86_64-unknown-linux-gnu
(cd "$REPO_DIR" && RUSTFLAGS="-C target-feature=+crt-static" nice -n 10 \
  cargo build -q -p blkdom-upgrade --release --target "$upgrade_target") ||
  rig_die "building tools/upgrade failed"
cp "${CARGO_TARGET_DIR:-$REPO_DIR/target}/$upgrade_target/release/blkdom-upgrade" "$work/in/tools/"
# dom0.cpio.zst: also the Linux driver domain's initramfs (tools/xl/linux-dd.cfg).
cp "$images/vmlinuz" "$images/guest.cpio.zst" "$images/dom0.cpio.zst" "$work/in/images/"
# A scenario's rig-gpt table, made on the host by the project's GPT code.
gpt=$(scenario_field "$file" gpt)
if [ -n "$gpt" ]; then
  # shellcheck disable=SC2086 # the header's words are the tool's arguments
  (cd "$REPO_DIR" && nice -n 10 cargo run -q --manifest-path drivers/backing/Cargo.toml \
    --example gpt-image -- "$work/in/images/gpt.img" $gpt) ||
    rig_die "$file: gpt-image could not write the table of its rig-gpt header ($gpt)"
fi
if [ -n "$blkdom_image" ] && [ -f "$blkdom_image" ]; then
  cp "$blkdom_image" "$work/in/images/blkdom"
  # The same image in a 32-bit ELF container, for HVM boot (tools/xl/blkdom-hvm.cfg): the
  # Xen device model is qemu-system-i386, whose ELF loader takes EM_386 files only. The
  # PVH entry is 32-bit code and every address is below 4 GiB, so nothing else changes.
  objcopy -O elf32-i386 "$blkdom_image" "$work/in/images/blkdom.elf32"
  # The same image with another build id: the second build a live upgrade alternates
  # with (tests/xen/blkdom-upgrade).
  python3 "$REPO_DIR/tools/upgrade/build_id_variant.py" "$blkdom_image" \
    "$work/in/images/blkdom-variant" > /dev/null ||
    rig_die "tools/upgrade/build_id_variant.py failed on $blkdom_image"
else
  rig_log "no blkdom image (${blkdom_image:-none given}); blkdom scenarios will fail"
fi
if [ -n "$blkdom_test_image" ] && [ -f "$blkdom_test_image" ]; then
  cp "$blkdom_test_image" "$work/in/images/blkdom-test"
else
  rig_log "no blkdom test image (${blkdom_test_image:-none given}); the self-tests under Xen will fail"
fi
tar -cf "$work/in.img" -C "$work/in" .
truncate -s 64M "$work/out.img"
# The passed-through disks start empty (sparse) every run.
PASSTHROUGH_ARGS=()
PASSTHROUGH_XEN_ARGS=
read -r devices devices_extra <<< "$(scenario_field "$file" devices)"
[ "$devices" = passthrough ] && passthrough_qemu_args "$work" "$devices_extra"

serial=$results/serial.log
: > "$serial"
start=$(date +%s.%N)
elapsed() { awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%6.1f", e - s }'; }

rig_log "scenario $scenario: qemu -smp $smp, timeout ${qemu_timeout}s, log $serial"
timeout --kill-after=10 "$qemu_timeout" "$qemu" "${QEMU_FIRMWARE_ARGS[@]}" \
  -machine q35 -accel tcg,thread=multi -cpu max,-fsgsbase -smp "$smp" -m 4096 \
  -name rig,debug-threads=on \
  "${PASSTHROUGH_ARGS[@]}" \
  -display none -monitor none -serial "file:$serial" -no-reboot \
  -kernel "$images/xen" \
  -append "console=com1 com1=115200,8n1 ${PASSTHROUGH_XEN_ARGS}${XEN_EXTRA_ARGS:-}dom0_mem=1024M,max:1024M dom0_max_vcpus=1 dom0_vcpus_pin loglvl=all guest_loglvl=all" \
  -initrd "$images/vmlinuz console=hvc0 earlyprintk=xen loglevel=4 rig.scenario=$scenario rig.timeout=$budget rig.runtime=$runtime ${scenario_args:-},$images/dom0.cpio.zst" \
  -drive "file=$work/in.img,format=raw,if=none,id=rigin,readonly=on" \
  -device virtio-blk-pci,drive=rigin,serial=rig-in \
  -drive "file=$work/out.img,format=raw,if=none,id=rigout" \
  -device virtio-blk-pci,drive=rigout,serial=rig-out \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  </dev/null >"$results/qemu.out" 2>&1 &
qemu_pid=$!
# The host's view of each fio job (host-threads.txt, read by tools/bench/report.py): as a
# guest's job begins and ends ("[GUEST] rig-guest: begin|end JOB" on the console), the
# CPU each QEMU thread has run and has waited for a host core (schedstat, ns; the
# vCPU threads are named "CPU N/TCG"), how often each has slept (voluntary context
# switches: a halt, or a wait for QEMU's global lock) and been preempted, and the host's
# /proc/stat CPU line. On this 2-core machine a nested pCPU that spins holds a host core
# the other vCPUs then wait for.
# RIG_PERF=1 also samples every QEMU thread's stack over each job with perf
# (results/.../perf/GUEST-JOB.data; `perf report -i FILE --sort comm,sym`).
: > "$results/host-threads.txt"
rm -rf "$results/perf" "$results/host-pinning.txt"
host_threads_edge() {  # EDGE GUEST JOB
  local qemu task name run wait _ record key value sleeps preempted
  qemu=$(pgrep -P "$qemu_pid" | head -n 1 || true)
  [ -n "$qemu" ] || return 0
  [ "$1" = END ] && host_perf_stop "$2-$3"
  record="$1 $2 $3 host_s=$(elapsed | tr -d ' ')"
  for task in /proc/"$qemu"/task/*; do
    { read -r name < "$task/comm" && read -r run wait _ < "$task/schedstat"; } 2>/dev/null ||
      continue
    sleeps=0 preempted=0
    # The status file in one read: bash's `read` from a file seeks back after each
    # line, and /proc regenerates the text at the seek, so a line that changed length
    # meanwhile ("R (running)" to "S (sleeping)") shifts the rest (a count read as 0).
    while read -r key value; do
      case $key in
        voluntary_ctxt_switches:) sleeps=$value ;;
        nonvoluntary_ctxt_switches:) preempted=$value ;;
      esac
    done <<< "$(cat "$task/status" 2>/dev/null)"
    record+=" thread:${name// /_}=$run,$wait,$sleeps,$preempted"
  done
  read -r _ name < /proc/stat
  record+=" host_cpu=${name// /,}"
  echo "$record" >> "$results/host-threads.txt"
  [ "$1" = BEGIN ] && host_perf_start "$qemu" "$2-$3"
  return 0
}
# RIG_PIN_PCPU=N (off by default: the rig's threads share the host's 2 cores): once dom0
# is up, the QEMU thread of nested pCPU N (make bench's and bench-paired's fio guest is on
# pCPU 3) gets host core 0 to itself and every other QEMU thread runs on core 1 (threads
# QEMU starts later inherit it). A model of dedicated cores: the guest's emulated CPU is
# never preempted by a backend's, whichever backend serves it.
host_pin_threads() {
  [ -n "${RIG_PIN_PCPU:-}" ] || return 0
  local qemu task name core
  qemu=$(pgrep -P "$qemu_pid" | head -n 1 || true)
  [ -n "$qemu" ] || return 0
  for task in /proc/"$qemu"/task/*; do
    read -r name < "$task/comm" 2>/dev/null || continue
    core=1
    [ "$name" = "CPU $RIG_PIN_PCPU/TCG" ] && core=0
    taskset -p -c "$core" "${task##*/}" > /dev/null 2>&1 &&
      echo "${name// /_} host-core=$core" >> "$results/host-pinning.txt"
  done
  return 0
}
host_perf_start() {  # QEMU_PID NAME
  [ "${RIG_PERF:-0}" = 1 ] || return 0
  mkdir -p "$results/perf"
  perf record -q -F 499 -g -p "$1" -o "$results/perf/$2.data" >/dev/null 2>&1 &
  echo $! > "$results/perf/$2.pid"
}
host_perf_stop() {  # NAME
  local pidfile=$results/perf/$1.pid
  [ -f "$pidfile" ] || return 0
  kill -INT "$(cat "$pidfile")" 2>/dev/null || true
  rm -f "$pidfile"
}
# Progress on stdout while QEMU runs: the rig's markers, stamped with host seconds since
# QEMU started (tail --pid stops following when QEMU is gone).
tail -n +1 -F --pid="$qemu_pid" "$serial" 2>/dev/null | while IFS= read -r line; do
  line=${line%$'\r'}
  case $line in
    "rig: dom0 ready"*)
      echo "dom0-ready-host $(elapsed | tr -d ' ')" >> "$results/host-timings.txt"
      host_pin_threads ;;
  esac
  case $line in
    "["*"] rig-guest: begin "* | "["*"] rig-guest: end "*)
      # dom0's echo of the guest's line keeps the guest's own CR.
      line=${line//$'\r'/}
      guest=${line%%]*}
      set -- ${line#*rig-guest: }
      host_threads_edge "${1^^}" "${guest#[}" "$2" ;;
  esac
  case $line in
    rig:*|rig-check:*|rig-info:*) printf '[%ss] %s\n' "$(elapsed)" "$line" ;;
  esac
done
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
wall=$(elapsed | tr -d ' ')
echo "qemu-total $wall" >> "$results/host-timings.txt"
tar -xf "$work/out.img" -C "$results" 2>/dev/null || true

# --- checks -----------------------------------------------------------------------------
log=$(tr -d '\r' < "$serial")
passed=0
failed=0
check() {  # check DESCRIPTION COMMAND...: counts COMMAND's success as a passed check
  local what=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $what"; fi
}
log_has() { grep -qE "$1" <<<"$log"; }
log_lacks() { ! log_has "$1"; }
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then echo "QEMU killed after ${qemu_timeout}s"; fi
check "Xen boots and dom0 is ready" log_has '^rig: dom0 ready'
passed=$((passed + $(grep -c '^rig-check: PASS' <<<"$log" || true)))
failed=$((failed + $(grep -c '^rig-check: FAIL' <<<"$log" || true)))
grep '^rig-check: FAIL' <<<"$log" | sed 's/^rig-check: /  /' || true
# Signatures of guest state corruption under the emulated SVM, or of a crash.
signatures='segfault|Segmentation fault|general protection|corrupted|Triple fault|Kernel panic'
check "no crash/corruption signatures in the log: $(grep -E "$signatures" <<<"$log" | head -n 3)" \
  log_lacks "$signatures"
check "scenario $scenario finished and passed (qemu exit $qemu_rc after ${wall}s)" \
  log_has "^rig: scenario $scenario PASS"

# Metrics a scenario had `blkdom-stat --prometheus` write in dom0 (which has no python),
# parsed here with the real parser and checked against FILE.expect (tools/rig/prom_check.py).
for prom in "$results"/*.prom; do
  [ -f "$prom" ] || continue
  expects=()
  if [ -f "$prom.expect" ]; then
    while IFS= read -r expect; do
      [ -n "$expect" ] && expects+=(--expect "$expect")
    done < "$prom.expect"
  fi
  check "${prom##*/} parses with prometheus_client and holds its $((${#expects[@]} / 2)) expectation(s)" \
    python3 "$RIG_DIR/prom_check.py" "$prom" "${expects[@]}"
done

# Reported but not counted: the demo's blkdom half until blkdom serves.
grep '^rig-info: FAIL' <<<"$log" | sed 's/^rig-info: FAIL /  not counted: /' || true
python3 "$RIG_DIR/summarize.py" "$results" "${table_backends[@]}" | tee "$results/summary.txt"
if [ "$failed" != 0 ]; then
  echo "--- last 50 lines of $serial ---"
  tail -n 50 <<<"$log"
  echo "---"
fi
echo "results: $results"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
exit
}
