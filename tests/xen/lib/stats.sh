# SPDX-License-Identifier: MIT OR Apache-2.0
# Reading what a run left in $RESULTS (sourced by tests/xen/lib.sh): IOPS and latency
# from fio's JSON, the backend's CPU, medians over rounds, blkdom's counters per job.
# shellcheck shell=dash disable=SC2034
# (dash: the dialect closest to dom0's busybox sh; SC2034: variables set here are read by
# the scenarios and the other parts)

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
