#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Summarises a nested-Xen rig run: a table of fio results per backend and job, plus the
timings and negotiated blkif keys the scenario recorded.

    python3 tools/rig/summarize.py results/xen/<scenario> [BACKEND...]

BACKENDs (linux-dom0, linux-dd, blkdom, linux-dd-nvme, blkdom-nvme, linux-dd-pt, blkdom-pt)
get a row per job even when they produced no result.

Reads fio-<guest>-<job>.json (fio --output-format=json, through tools/fio_results.py like
make bench's report: a write+verify job counts its write half), cpu-<guest>-<job>.txt
(backend domain CPU seconds over the job), timings.txt, host-timings.txt and
xenstore-negotiated-*.txt. Guests are named after their backend: fio-dom0 (Linux
blkback in dom0), fio-linuxdd (Linux blkback in a PVH driver domain), fio-blkdom (blkdom),
on an emulated NVMe disk with HVM driver domains fio-ddnvme (Linux) and fio-blkdomnvme, and
on a passed-through NVMe controller with HVM driver domains fio-ddpt and fio-blkdompt.
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fio_results  # noqa: E402  (tools/fio_results.py, the fio JSON reader make bench shares)

BACKENDS = {"fio-dom0": "linux-dom0", "fio-linuxdd": "linux-dd", "fio-blkdom": "blkdom",
            "fio-ddnvme": "linux-dd-nvme", "fio-blkdomnvme": "blkdom-nvme",
            "fio-ddpt": "linux-dd-pt", "fio-blkdompt": "blkdom-pt"}
# blkdom's ratios: (ours, baseline, label).
RATIOS = [("blkdom", "linux-dom0", "blkdom/dom0"), ("blkdom", "linux-dd", "blkdom/linux-dd"),
          ("blkdom-nvme", "linux-dd-nvme", "nvme blkdom/dd"),
          ("blkdom-pt", "linux-dd-pt", "pt blkdom/dd")]
JOB_ORDER = ["prefill", "randread-qd32-1j", "randread-qd32-2j", "randread-qd1", "seqread-1m",
             "write-verify", "write-verify-quick"]


def backend_cpu_percent(path: Path) -> str:
    """Backend domain CPU use over the job, as % of one CPU, from cpu-*.txt."""
    if not path.exists():
        return "-"
    fields = dict(kv.split("=", 1) for kv in path.read_text().split())
    wall = float(fields.get("wall_s", 0))
    return f"{100.0 * float(fields.get('cpu_s', 0)) / wall:.0f}" if wall > 0 else "-"


def load_rows(results: Path) -> dict:
    rows = {}
    for path in sorted(results.glob("fio-fio-*.json")):
        # fio-<guest>-<job>.json, where the guest's name itself is fio-<backend>.
        match = re.match(r"fio-(fio-[a-z0-9]+)-(.+)\.json$", path.name)
        if not match:
            continue
        guest, job = match.groups()
        try:
            row = fio_results.load(path)
        except ValueError as err:
            print(f"warning: {path.name}: unreadable fio JSON ({err})")
            continue
        row["backend_cpu"] = backend_cpu_percent(results / f"cpu-{guest}-{job}.txt")
        rows[(job, BACKENDS.get(guest, guest))] = row
    return rows


def print_table(rows: dict, wanted: list) -> None:
    backends = sorted({backend for _, backend in rows} | set(wanted),
                      key=lambda b: list(BACKENDS.values()).index(b)
                      if b in BACKENDS.values() else 99)
    jobs = sorted({job for job, _ in rows},
                  key=lambda j: JOB_ORDER.index(j) if j in JOB_ORDER else 99)
    header = (f"{'job':<20} {'backend':<16} {'IOPS':>8} {'MiB/s':>8} {'p50 us':>9} "
              f"{'p99 us':>9} {'guest CPU%':>10} {'backend CPU%':>12}")
    print(header)
    print("-" * len(header))
    for job in jobs:
        for backend in backends:
            row = rows.get((job, backend))
            if row is None:
                served = any(b == backend for _, b in rows)
                why = "no result for this job" if served else "not run / not serving"
                print(f"{job:<20} {backend:<16} {why:>40}")
                continue
            label = job if row["rw"] == "read" or job.startswith("write") else job + " (w)"
            print(f"{label:<20} {backend:<16} {row['iops']:>8.0f} {row['mib_s']:>8.1f} "
                  f"{row['p50_us']:>9.0f} {row['p99_us']:>9.0f} {row['guest_cpu_percent']:>10.1f} "
                  f"{row['backend_cpu']:>12}")
        for ours_name, base_name, label in RATIOS:
            ours, base = rows.get((job, ours_name)), rows.get((job, base_name))
            if base and ours and base["iops"] > 0:
                print(f"{'':<20} {label:<16} {ours['iops'] / base['iops']:>8.2f}x")


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    results = Path(sys.argv[1])
    rows = load_rows(results)
    if rows:
        print_table(rows, sys.argv[2:])
    else:
        print("no fio results")
    for name in ("host-timings.txt", "timings.txt"):
        path = results / name
        if path.exists():
            print(f"{name[:-4]}: " + ", ".join(
                f"{k}={v}s" for k, v in (line.split() for line in path.read_text().splitlines()
                                          if len(line.split()) == 2)))
    for path in sorted(results.glob("xenstore-negotiated-*.txt")):
        keys = {}
        for line in path.read_text().splitlines():
            match = re.match(r"(/local/domain/\d+/(backend|device)/vbd/\S+?)/([a-z-]+) = \"(.*)\"", line)
            if match and re.match(r"(feature-|multi-queue-|max-ring|ring-page-order)", match[3]):
                keys[f"{match[2][:4]}.{match[3]}"] = match[4]
        print(f"negotiated ({path.stem[len('xenstore-negotiated-'):]}): " +
              " ".join(f"{k}={v}" for k, v in sorted(keys.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
