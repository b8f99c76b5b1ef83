# SPDX-License-Identifier: MIT OR Apache-2.0
# The PV fio guests (sourced by tests/xen/lib.sh): their command line, booting one and
# following its console job by job (CPU samples, fio's JSON, the checks), and the hooks
# a scenario may redefine.
# shellcheck shell=dash disable=SC2034
# (dash: the dialect closest to dom0's busybox sh; SC2034: variables set here are read by
# the scenarios and the other parts)

# Linux blkfront defaults (1 page ring, 32 indirect segments, queues = vCPUs) would
# measure the frontend; raise them so the backend's limits are what gets negotiated.
# Ring order stays at 2 (128 slots per queue, enough for QD32 x 2 jobs): with persistent
# grants blkfront preallocates a page per possible segment, slots x (segments + indirect
# pages) per queue, which at order 4 and 256 segments is 514 MiB per queue (the guest
# OOMs). Order 2: 128 x 257 pages = 129 MiB per queue; the guest has 768 MiB, and one
# queue per vCPU (max_queues is capped by the guest's vCPUs).
BLKFRONT_ARGS="xen_blkfront.max_queues=4 xen_blkfront.max_ring_page_order=2 xen_blkfront.max_indirect_segments=256"
# PV guests' command line: quiet kernel, so fio's JSON on the console stays intact.
GUEST_ARGS="console=hvc0 loglevel=${GUEST_LOGLEVEL:-3} $BLKFRONT_ARGS"

# The fio jobs of the full comparison (see tools/rig/initramfs/guest-init).
FULL_JOBS=prefill,randread-qd32-1j,randread-qd32-2j,randread-qd1,seqread-1m,write-verify

# Records the negotiated blkif keys of a guest's first disk (backend and frontend).
record_negotiation() {
  local guest=$1 backend=$2 gid bid out
  gid=$(domid_of "$guest")
  bid=$(domid_of "$backend")
  out=$RESULTS/xenstore-negotiated-$guest.txt
  {
    xenstore-ls -f "/local/domain/$bid/backend/vbd/$gid" 2>&1
    xenstore-ls -f "/local/domain/$gid/device/vbd" 2>&1
  } > "$out"
  grep -E '/(feature-[a-z-]+|multi-queue-[a-z-]+|max-ring-page-order|ring-page-order|sectors|sector-size|state|hotplug-status) =' "$out" |
    sed 's/^/rig: negotiated /'
}

# watch_domain NAME SECONDS PID FILE: kills PID when domain NAME is gone (four checks in a
# row: a guest that reboots is absent while xl re-creates it, which can take tens of
# seconds on a loaded machine) or SECONDS have passed, writing the reason to FILE. Checks every 10 s:
# each xl call costs dom0 (the baseline's backend) real CPU under TCG.
watch_domain() {
  local name=$1 limit=$2 pid=$3 reason=$4 waited=0 missing=0
  while [ "$waited" -lt "$limit" ]; do
    sleep 10
    waited=$((waited + 10))
    if domid_of "$name" > /dev/null; then missing=0; else missing=$((missing + 1)); fi
    [ "$missing" -ge 4 ] && { echo "powered off before finishing" > "$reason"; break; }
  done
  [ -s "$reason" ] || echo "did not finish within ${limit}s" > "$reason"
  sleep 2   # the console log may still hold the last lines
  kill "$pid" 2>/dev/null
}

# job_edge_hook begin|end GUEST JOB: runs as each fio job starts and ends, right after the
# CPU sample; a scenario may redefine it (tests/xen/bench records backend counters).
job_edge_hook() { :; }
# guest_line_hook GUEST LINE: sees every "rig-guest: ..." console line of a guest while the
# guest runs (tests/xen/blkdom-lifecycle attaches and detaches disks on cue).
guest_line_hook() { :; }
# job_backend JOB BACKEND: the domain whose CPU run_fio_guest samples around JOB; BACKEND
# (the guest's one backend) unless a scenario serves the guest's disks from several
# (tests/xen/paired).
job_backend() { echo "$2"; }
# check_job_count GUEST SAID ASKED: fails GUEST when the number of jobs it said it has
# (its "rig-guest: jobs N" line) is not the number asked for: its command line was cut
# (Xen keeps 1 KiB of a PV guest's) or a name was lost.
check_job_count() {
  [ "$2" = "$3" ] || fail "guest $1 has $2 of the $3 jobs asked for"
}

# run_fio_guest NAME CONFIG BACKEND JOBS RUNTIME [xl overrides...]
# Boots a PV fio guest (tools/xl/CONFIG), follows its console, and as each fio job starts
# and ends samples the backend domain's CPU time (cpu-NAME-JOB.txt). Saves each job's
# JSON (fio-NAME-JOB.json) and checks that every job ran and exited 0. Following the
# console is one `tail -f` (no polling loop in dom0, which is the baseline's backend).
run_fio_guest() {
  local name=$1 config=$2 backend=$3 jobs=$4 runtime=$5
  shift 5
  local job_count budget log start line job job_domain cpu0 wall0 cpu1 ready=0 done=0 in_json=0
  local blkdom_cpu0 part
  local fifo=/tmp/console-$name reason=/tmp/watch-$name tail_pid watch_pid cr
  # GUEST_JOBS: how many jobs the guest runs when it builds its list itself
  # (tests/xen/paired); else one per name in JOBS. GUEST_EXTRA_S: seconds some jobs run
  # beyond the runtime (bench-backend's idle window).
  job_count=${GUEST_JOBS:-$(echo "$jobs" | tr ',' '\n' | grep -c .)}
  budget=$((120 + job_count * (runtime + 60) + ${GUEST_EXTRA_S:-0}))
  log=$CONSOLE_DIR/guest-$name.log
  start=$(now)
  create_domain "$name" "$XL_DIR/$config" \
    "extra=\"$GUEST_ARGS rig.jobs=$jobs rig.runtime=$runtime\"" "$@" || return 1
  rm -f "$fifo" "$reason"
  mkfifo "$fifo"
  touch "$log"
  tail -n +1 -f "$log" > "$fifo" &
  tail_pid=$!
  watch_domain "$name" "$budget" "$tail_pid" "$reason" &
  watch_pid=$!
  cr=$(printf '\r')
  # No command substitution per line: a fork is slow in an emulated dom0, and fio's
  # JSON is hundreds of lines (the markers would reach dom0 late).
  while IFS= read -r line; do
    line=${line%"$cr"}
    # Guest console lines go to the serial log too, except the fio JSON itself.
    case $line in
      "rig-guest: json-begin "*) in_json=1 ;;
      "rig-guest: json-end "*) in_json=0 ;;
    esac
    [ "$in_json" = 1 ] || echo "[$name] $line"
    case $line in "rig-guest: "*) guest_line_hook "$name" "$line" ;; esac
    case $line in
      "rig-guest: disk ready"*)
        ready=1
        timing "guest-disk-ready-$name" "$(seconds_since "$start")"
        record_negotiation "$name" "$backend" ;;
      "rig-guest: begin "*)
        job=${line#rig-guest: begin }
        job_domain=$(job_backend "$job" "$backend")
        cpu0=$(cpu_seconds "$job_domain")
        # With dom0's work and blkdom's added up (NVMe/TCP), blkdom's part apart too.
        case $job_domain in *+blkdom) blkdom_cpu0=$(cpu_seconds blkdom) ;; esac
        wall0=$(now)
        job_edge_hook begin "$name" "$job" ;;
      "rig-guest: end "*)
        cpu1=$(cpu_seconds "$job_domain")
        part=
        case $job_domain in
          *+blkdom) part=" blkdom_cpu_s=$(awk -v a="$blkdom_cpu0" -v b="$(cpu_seconds blkdom)" 'BEGIN { printf "%.1f", b - a }')" ;;
        esac
        echo "backend=$job_domain cpu_s=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.1f", b - a }') wall_s=$(seconds_since "$wall0")$part" \
          > "$RESULTS/cpu-$name-$job.txt"
        job_edge_hook end "$name" "$job"
        case $line in
          *" rc=0") pass "job $job ($name)" ;;
          *) fail "job $job ($name): ${line#rig-guest: }" ;;
        esac ;;
      "rig-guest: done") done=1; break ;;
      "rig-guest: no /dev/xvda"*) fail "guest $name: disk never appeared"; break ;;
      "rig-guest: jobs "*) check_job_count "$name" "${line#rig-guest: jobs }" "$job_count" ;;
      "rig-guest: unknown job "*) fail "guest $name: ${line#rig-guest: }" ;;
    esac
  done < "$fifo"
  kill "$tail_pid" "$watch_pid" 2>/dev/null
  wait "$tail_pid" "$watch_pid" 2>/dev/null
  rm -f "$fifo"
  if [ "$done" = 1 ]; then
    pass "guest $name ran every fio job"
  else
    fail "guest $name $(cat "$reason" 2>/dev/null || echo "stopped early")"
    dump_state "fio-$name"
  fi
  [ "$ready" = 1 ] && pass "guest $name disk ready" || fail "guest $name disk ready"
  # The JSON of each job sits between json-begin/json-end markers on the console.
  tr -d '\r' < "$log" | awk -v prefix="$RESULTS/fio-$name-" '
    /^rig-guest: json-begin / { out = prefix $3 ".json"; next }
    /^rig-guest: json-end /   { close(out); out = ""; next }
    out != ""                 { print > out }'
  cp "$log" "$RESULTS/"
  domid_of "$name" > /dev/null && destroy_domain "$name"
  timing "guest-total-$name" "$(seconds_since "$start")"
  [ "$done" = 1 ]
}
