# Helpers for the nested-Xen scenario scripts (sourced). They run in dom0, started by
# dom0's /init (tools/rig/initramfs/dom0-init) with:
#   $RIG      the unpacked input disk: tests/xen/, tools/xl/, images/ (vmlinuz,
#             guest.cpio.zst, blkdom when built)
#   $RESULTS  a directory copied back to the host (results/xen/<scenario>/ there)
# Every check prints "rig-check: PASS|FAIL <what>"; the host counts those lines. Every
# step is bounded by a timeout, so a hung guest fails the check instead of hanging.

XL_DIR=$RIG/tools/xl
CONSOLE_DIR=/var/log/xen/console
checks_failed=0

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
RAMDISK_MIB=256   # the same size blkdom's RAM disk uses

# Prints the value of NAME=value on dom0's kernel command line (tools/rig/run.sh passes
# scenario arguments there).
cmdline_arg() {
  for word in $(cat /proc/cmdline); do
    case $word in "$1="*) echo "${word#*=}" ;; esac
  done
}

# blkdom_cmdline_from KEY: BLKDOM_CMDLINE (boot_blkdom's) from dom0's KEY= (one word
# there: ':' or '+' between blkdom's words). blkdom_cmdline_config: the "blkdom=" line of
# a scenario's config file, ':' between words again (tools/bench/report.py and paired.py
# name it in their titles; empty when blkdom had none).
blkdom_cmdline_from() { BLKDOM_CMDLINE=$(cmdline_arg "$1" | tr ':+' '  '); }
blkdom_cmdline_config() { echo "blkdom=$(echo "$BLKDOM_CMDLINE" | tr ' ' ':')"; }

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
# CPU seconds a domain has used so far (xl list's Time(s) column).
cpu_seconds() { xl list "$1" 2>/dev/null | awk 'NR == 2 { print $6 }'; }

# Saves what explains a failure: xenstore, domain list, Xen's log, guest consoles.
dump_state() {
  local tag=$1
  xenstore-ls -fp > "$RESULTS/xenstore-$tag.txt" 2>&1
  xl list -v > "$RESULTS/xl-list-$tag.txt" 2>&1
  xl dmesg > "$RESULTS/xl-dmesg-$tag.txt" 2>&1
  cp "$CONSOLE_DIR"/*.log /var/log/xen/*.log "$RESULTS/" 2>/dev/null
  echo "rig: state dumped as $tag: $(xl list | awk 'NR > 1 { printf "%s(%s) ", $1, $5 }')"
}

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

# load_ramdisk: /dev/ram0, $RAMDISK_MIB MiB, served by dom0's blkback in the baseline.
load_ramdisk() {
  [ -b /dev/ram0 ] && return 0
  insmod /lib/modules/brd.ko rd_nr=1 rd_size=$((RAMDISK_MIB * 1024)) max_part=0 &&
    pass "brd ram disk $RAMDISK_MIB MiB" || fail "brd ram disk"
}

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
# row: a guest that reboots is absent while xl re-creates it, which took over 20 s on a
# loaded machine) or SECONDS have passed, writing the reason to FILE. Checks every 10 s:
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
  local fifo=/tmp/console-$name reason=/tmp/watch-$name tail_pid watch_pid cr
  # GUEST_JOBS: how many jobs the guest runs when it builds its list itself
  # (tests/xen/paired); else one per name in JOBS.
  job_count=${GUEST_JOBS:-$(echo "$jobs" | tr ',' '\n' | grep -c .)}
  budget=$((120 + job_count * (runtime + 60)))
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
  # No command substitution per line: a fork costs dom0 tens of ms under TCG, and fio's
  # JSON is hundreds of lines (the markers would reach dom0 seconds late).
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
        wall0=$(now)
        job_edge_hook begin "$name" "$job" ;;
      "rig-guest: end "*)
        cpu1=$(cpu_seconds "$job_domain")
        echo "backend=$job_domain cpu_s=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.1f", b - a }') wall_s=$(seconds_since "$wall0")" \
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

# boot_blkdom: creates the blkdom driver domain (tools/xl/blkdom.cfg) from the image
# `make image` built (with BLKDOM_CMDLINE as its kernel command line, if set), waits for
# "blkdom: up", and checks it is still running 3 s later.
boot_blkdom() {
  if [ ! -f "$RIG/images/blkdom" ]; then
    fail "blkdom image present (run make image)"
    return 1
  fi
  create_domain blkdom "$XL_DIR/blkdom.cfg" ${BLKDOM_CMDLINE:+"cmdline=\"$BLKDOM_CMDLINE\""} ||
    return 1
  wait_blkdom_up blkdom 60 || return 1
  still_running_after_up blkdom-died
}

# fio_read_stats FILE: the read side of a fio JSON (one job, or group_reporting) as
# "iops=<n> p50_us=<n>" (p50: completion latency); nothing if it has no read side.
fio_read_stats() {
  awk '
    $2 == ":" && $3 == "{" { if ($1 ~ /^"(read|write|trim|sync)"$/) side = $1; if ($1 == "\"clat_ns\"") clat = 1 }
    side == "\"read\"" && $1 == "\"iops\"" && iops == "" { iops = $3 + 0 }
    side == "\"read\"" && clat && $1 == "\"50.000000\"" && p50 == "" { p50 = $3 + 0 }
    END { if (iops != "") printf "iops=%.0f p50_us=%.0f\n", iops, p50 / 1000 }' "$1" 2>/dev/null
}

# backend_cpu_percent FILE [SETTLE]: the backend's CPU over a job (run_fio_guest's
# cpu-NAME-JOB.txt: cpu_s over wall_s less the SETTLE seconds the guest idled at its end),
# in percent of one CPU; nothing if the file says nothing.
backend_cpu_percent() {
  awk -v settle="${2:-0}" '
    { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
    END { w = v["wall_s"] - settle; if (v["cpu_s"] != "" && w > 0) printf "%.1f\n", 100 * v["cpu_s"] / w }' \
    "$1" 2>/dev/null
}

# job_stats GUEST JOB [SETTLE]: one line for a job run_fio_guest ran:
# "iops=<n> p50_us=<n> cpu_pct=<n> iops_per_cpu_pct=<n>" (missing values left out).
job_stats() {
  local io cpu
  io=$(fio_read_stats "$RESULTS/fio-$1-$2.json")
  [ -n "$io" ] || { echo "no fio results"; return 0; }
  cpu=$(backend_cpu_percent "$RESULTS/cpu-$1-$2.txt" "${3:-0}")
  echo "$io${cpu:+ cpu_pct=$cpu}" | awk -v cpu="$cpu" '
    { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "iops") iops = kv[2] } }
    { printf "%s", $0; if (iops != "" && cpu + 0 > 0) printf " iops_per_cpu_pct=%.1f", iops / cpu; print "" }'
}

# variants_summary FILE: FILE has "VARIANT JOB key=value..." lines, one per round; prints
# per variant and job (in the order first seen) the median of each key over the rounds,
# with the rounds' IOPS range: "VARIANT JOB: rounds=N iops=<median> (<min>-<max>) ..."
# (and without-results=N for rounds that had none).
variants_summary() {
  awk '
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
      lo = a[1]; hi = a[n]
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    NF >= 2 {
      id = $1 " " $2
      if (!(id in rounds)) { order[++ids] = id }
      rounds[id]++
      got = 0
      for (i = 3; i <= NF; i++) {
        if (split($i, kv, "=") != 2) continue
        got = 1
        if (!((id, kv[1]) in vals)) { keys[id] = keys[id] " " kv[1] }
        vals[id, kv[1]] = vals[id, kv[1]] " " kv[2]
      }
      if (!got) missing[id]++
    }
    END {
      for (k = 1; k <= ids; k++) {
        id = order[k]
        printf "%s: rounds=%d", id, rounds[id]
        if (missing[id]) printf " without-results=%d", missing[id]
        n = split(keys[id], ks, " ")
        for (i = 1; i <= n; i++) {
          m = median(vals[id, ks[i]])
          printf " %s=%g", ks[i], m
          if (ks[i] == "iops") printf " (%g-%g)", lo, hi
        }
        print ""
      }
    }' "$1"
}

# notify_counters GUEST: per job of GUEST, blkdom's counter deltas over the job (from
# counters-GUEST.txt: "begin|end JOB key=value..." lines of blkdom-stats, as
# tests/xen/notify-sweep's job edge hook writes them) and the guest's blkif interrupts
# (its console's "irq before|after JOB N" lines), with events per request and interrupts
# per I/O, and what ended the holds; a job whose counters are missing at an edge says so.
notify_counters() {
  local guest=$1
  awk -v guest="$guest" '
    FNR == 1 { file++ }
    file == 1 {
      for (i = 3; i <= NF; i++) { split($i, kv, "="); v[$1, $2, kv[1]] = kv[2] }
      jobs[$2] = 1; next
    }
    /rig-guest: irq (before|after) / {
      for (i = 1; i <= NF; i++) if ($i == "irq") { irq[$(i + 1), $(i + 2)] = $(i + 3) }
    }
    function delta(j, key) { return v["end", j, key] - v["begin", j, key] }
    END {
      for (j in jobs) {
        if (!(("begin", j, "rd_req") in v) || !(("end", j, "rd_req") in v)) {
          printf "rig: %s %s: counters missing at the %s of the job\n", guest, j,
            (("begin", j, "rd_req") in v) ? "end" : "begin"
          continue
        }
        req = delta(j, "rd_req")
        ev = delta(j, "notifications")
        irqs = irq["after", j] - irq["before", j]
        printf "rig: %s %s: requests=%d events=%d held=%d wasted=%d declined=%d guest_irqs=%d", \
          guest, j, req, ev, delta(j, "notifications-held"), delta(j, "notify-holds-wasted"), \
          delta(j, "notify-holds-declined"), irqs
        # What ended the holds (a blkdom without these counters gives 0s).
        printf " ended_deadline=%d ended_quiet=%d ended_depth=%d ended_drained=%d ended_sleep=%d", \
          delta(j, "notify-holds-deadline"), delta(j, "notify-holds-quiet"), \
          delta(j, "notify-holds-depth"), delta(j, "notify-holds-drained"), \
          delta(j, "notify-holds-sleep")
        if (req > 0) printf " events/request=%.3f irqs/io=%.3f", ev / req, irqs / req
        printf "\n"
      }
    }' "$RESULTS/counters-$guest.txt" "$RESULTS/guest-$guest.log" 2>/dev/null
}

# variant_hook VARIANT GUEST: runs after each variant's guest (run_variants); a scenario
# may redefine it (tests/xen/notify-sweep prints blkdom's counters).
variant_hook() { :; }

# run_variants TAG ROUNDS JOBS SETTLE VARIANT...: ROUNDS rounds of every variant in turn
# (A B C A B C ...: the rig's drift falls on all alike). A variant is blkdom's command
# line with ':' between words ("default": none). Per round and variant: blkdom booted with
# it, a fio guest fio-TAG-<variant>-r<round> runs JOBS, one "rig: TAG VARIANT round N JOB:
# iops=.. p50_us=.. cpu_pct=.. iops_per_cpu_pct=.." line per job (job_stats; SETTLE: the
# guest's idle seconds after each job, GUEST_ARGS' rig.settle), blkdom destroyed. Then
# per variant and job the medians over the rounds ("rig: TAG median: ...").
run_variants() {
  local tag=$1 rounds=$2 jobs=$3 settle=$4 round=1 variant slug guest start job stats
  shift 4
  : > "$RESULTS/variants-$tag.txt"
  while [ "$round" -le "$rounds" ]; do
    for variant in "$@"; do
      slug=$(echo "$variant" | tr -c 'a-zA-Z0-9\n' '-')
      guest=fio-$tag-$slug-r$round
      start=$(now)
      case $variant in
        default) BLKDOM_CMDLINE= ;;
        *) BLKDOM_CMDLINE=$(echo "$variant" | tr ':' ' ') ;;
      esac
      echo "rig: $tag round $round of $rounds: $variant"
      if boot_blkdom; then
        run_fio_guest "$guest" fio-guest-blkdom.cfg blkdom "$jobs" "${RIG_RUNTIME:-15}" \
          "name=\"$guest\""
        for job in $(echo "$jobs" | tr ',' ' '); do
          stats=$(job_stats "$guest" "$job" "$settle")
          echo "rig: $tag $variant round $round $job: $stats"
          echo "$variant $job $stats" >> "$RESULTS/variants-$tag.txt"
        done
        variant_hook "$variant" "$guest"
      fi
      echo "rig: $tag $variant round $round pollers: $(blkdom_pollers "$(domid_of blkdom)")"
      timeout 60 xl destroy blkdom
      timing "$tag-$slug-r$round" "$(seconds_since "$start")"
    done
    round=$((round + 1))
  done
  BLKDOM_CMDLINE=
  variants_summary "$RESULTS/variants-$tag.txt" | sed "s/^/rig: $tag median: /"
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
# (tools/xl/blkdom-hvm.cfg, on a fresh emulated NVMe disk, unless CONFIG says otherwise);
# waits for "blkdom: up" and logs what the HVM boot found.
boot_blkdom_hvm() {
  local config=${1:-blkdom-hvm.cfg} start id
  [ $# -gt 0 ] && shift
  if [ ! -f "$RIG/images/blkdom.elf32" ]; then
    fail "blkdom image (ELF32 copy) present (run make image)"
    return 1
  fi
  if [ "$config" = blkdom-hvm.cfg ]; then emulated_nvme_disk || return 1; fi
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

# The disks the outer QEMU gives dom0 for passthrough (tools/rig/common.sh,
# passthrough_qemu_args): the NVMe controller by its class, the virtio-blk disk by its
# modern-only device id (the rig's own virtio disks are transitional, 1af4:1001).
passthrough_bdf() {  # passthrough_bdf nvme|virtio
  local dev
  for dev in /sys/bus/pci/devices/*; do
    case $1:$(cat "$dev/class"):$(cat "$dev/vendor"):$(cat "$dev/device") in
      nvme:0x010802:*|virtio:*:0x1af4:0x1042) basename "$dev"; return 0 ;;
    esac
  done
  return 1
}
# assign_passthrough_disks: xen-pciback takes both disks from dom0's drivers; sets
# PT_NVME and PT_VIRTIO to their addresses.
assign_passthrough_disks() {
  local kind bdf
  for kind in nvme virtio; do
    bdf=$(passthrough_bdf "$kind") || { fail "dom0 sees the outer $kind disk for passthrough"; return 1; }
    # A domain that had the device gives it back to pciback when it is destroyed, which
    # takes a moment (until then pci-assignable-add says it is already assigned).
    listed() { xl pci-assignable-list | grep -qi "$bdf"; }
    if listed || { xl pci-assignable-add "$bdf" > "$RESULTS/assignable-$kind.log" 2>&1; wait_for 30 listed; }; then
      pass "$kind disk $bdf assignable"
    else
      fail "$kind disk $bdf assignable ($(tail -n 2 "$RESULTS/assignable-$kind.log" | tr '\n' ' '))"
      return 1
    fi
    case $kind in nvme) PT_NVME=$bdf ;; virtio) PT_VIRTIO=$bdf ;; esac
  done
}
# boot_blkdom_passthrough: blkdom as an HVM driver domain from the operator's config
# (tools/xl/blkdom-hvm-passthrough.cfg) with the rig's image, vCPUs and both disks.
boot_blkdom_passthrough() {
  assign_passthrough_disks || return 1
  boot_blkdom_hvm blkdom-hvm-passthrough.cfg 'kernel="/rig/images/blkdom.elf32"' \
    'memory=512' 'vcpus=2' 'cpus=["1","2"]' "pci=[\"$PT_NVME\",\"$PT_VIRTIO\"]" \
    ${BLKDOM_CMDLINE:+"cmdline=\"$BLKDOM_CMDLINE\""}
}

# The jobs of the emulated-NVMe comparison (no 2-job read: the HVM domains are slow).
NVME_JOBS_DEFAULT=prefill,randread-qd32-1j,randread-qd1,seqread-1m,write-verify
# compare_on_emulated_nvme JOBS RUNTIME: the same PV guest and fio jobs on an emulated NVMe
# disk (qemu-xen in dom0, a fresh file each time), served first by Linux blkback in an
# HVM driver domain (tools/xl/linux-hvm-dd.cfg), then by blkdom booted as HVM on the same
# kind of controller (tools/xl/blkdom-hvm.cfg), each on pCPUs 1-2, the guest on pCPU 3.
# Guests fio-ddnvme and fio-blkdomnvme (tools/rig/summarize.py's NVMe rows).
compare_on_emulated_nvme() {
  local jobs=$1 runtime=$2
  if emulated_nvme_disk && boot_linux_dd linux-hvm-dd.cfg; then
    run_fio_guest fio-ddnvme fio-guest-linuxdd.cfg linux-dd "$jobs" "$runtime" \
      'name="fio-ddnvme"' 'disk=["backend=linux-dd,vdev=xvda,access=rw,target=/dev/nvme0n1"]'
    cp /var/log/xen/qemu-dm-linux-dd.log "$RESULTS/" 2>/dev/null
    timeout 60 xl destroy linux-dd
  fi
  boot_blkdom_hvm &&
    run_fio_guest fio-blkdomnvme fio-guest-blkdom.cfg blkdom "$jobs" "$runtime" \
      'name="fio-blkdomnvme"' 'disk=["backend=blkdom,vdev=xvda,access=rw,target=nvme:1"]'
  cp /var/log/xen/qemu-dm-blkdom.log "$RESULTS/" 2>/dev/null
  timeout 60 xl destroy blkdom
}

# compare_on_passthrough_nvme JOBS RUNTIME: the same PV guest and fio jobs on namespace 1
# of the NVMe controller passed through from the outer machine (scenarios with
# "rig-devices: passthrough"), served first by Linux blkback in an HVM driver domain
# (tools/xl/linux-hvm-dd.cfg with the controller instead of the emulated one, and without
# swiotlb=force: the device reaches grant-mapped pages through the IOMMU), then by blkdom
# (tools/xl/blkdom-hvm-passthrough.cfg), each on pCPUs 1-2, the guest on pCPU 3.
# Guests fio-ddpt and fio-blkdompt (tools/rig/summarize.py's passthrough rows).
# The Linux side needs the rig's iommu=no-intremap (tools/rig/common.sh): with the
# emulated VT-d's interrupt remapping its NVMe interrupts never arrived and it hung in
# the driver's probe (tests/xen/pt-linux-probe).
compare_on_passthrough_nvme() {
  local jobs=$1 runtime=$2
  assign_passthrough_disks || return 1
  if boot_linux_dd linux-hvm-dd.cfg 'device_model_args_hvm=[]' "pci=[\"$PT_NVME\"]" \
       'extra="console=hvc0 earlyprintk=xen loglevel=4 rig.role=driver-domain rig.dd_disk=nvme0n1"'; then
    run_fio_guest fio-ddpt fio-guest-linuxdd.cfg linux-dd "$jobs" "$runtime" \
      'name="fio-ddpt"' 'disk=["backend=linux-dd,vdev=xvda,access=rw,target=/dev/nvme0n1"]'
    cp /var/log/xen/qemu-dm-linux-dd.log "$RESULTS/qemu-dm-linux-dd-pt.log" 2>/dev/null
  fi
  domid_of linux-dd > /dev/null && timeout 60 xl destroy linux-dd
  boot_blkdom_passthrough &&
    run_fio_guest fio-blkdompt fio-guest-blkdom.cfg blkdom "$jobs" "$runtime" \
      'name="fio-blkdompt"' 'disk=["backend=blkdom,vdev=xvda,access=rw,target=nvme:1"]'
  cp /var/log/xen/qemu-dm-blkdom.log "$RESULTS/qemu-dm-blkdom-pt.log" 2>/dev/null
  timeout 60 xl destroy blkdom
}

# The fio jobs of the full comparison (see tools/rig/initramfs/guest-init).
FULL_JOBS=prefill,randread-qd32-1j,randread-qd32-2j,randread-qd1,seqread-1m,write-verify
