# SPDX-License-Identifier: MIT OR Apache-2.0
"""The one reader of fio's JSON output (--output-format=json, group_reporting: one job
entry) for every table of the repository: tools/rig/summarize.py (make demo and the rig
scenarios) and tools/bench/report.py (make bench). Standard library only; the scripts
import it by putting tools/ on sys.path.

A job's read and write halves ran side by side (randrw and the like) and are added; but
when the job's rw is write-only (write, randwrite, trimwrite) its read half can only be
fio's verification pass (do_verify), which runs after the writes with its own runtime, so
the figures are those of the write half alone: adding the two rates of consecutive
phases would measure neither.
"""

import json
from pathlib import Path

# rw= values whose jobs issue no reads of their own (fio's "rw=randwrite:8" form included).
WRITE_ONLY = {"write", "randwrite", "trimwrite"}


def verify_pass(job: dict) -> bool:
    """Whether the job's read half is fio's verification of what it wrote."""
    rw = job.get("job options", {}).get("rw", "").split(":")[0]
    return rw in WRITE_ONLY and job["read"]["io_bytes"] > 0


def figures(result: dict) -> dict:
    """IOPS, MiB/s, I/O count, runtime, completion-latency mean and p50/p99 (µs), guest
    CPU % and fio's error of one parsed fio JSON result. rw names the halves counted
    ('read', 'write', 'read+write', or 'write+verify': the write half, verified). The
    latency is that of the half that moved more bytes."""
    job = result["jobs"][0]
    if verify_pass(job):
        sides, rw = ["write"], "write+verify"
    else:
        sides = [s for s in ("read", "write") if job[s]["io_bytes"] > 0] or ["read"]
        rw = "+".join(sides)
    main = job[max(sides, key=lambda s: job[s]["io_bytes"])]
    clat = main.get("clat_ns", {})
    percentiles = clat.get("percentile", {})
    return {
        "rw": rw,
        "iops": sum(job[s]["iops"] for s in sides),
        "mib_s": sum(job[s]["bw"] for s in sides) / 1024.0,
        "total_ios": sum(job[s].get("total_ios", 0) for s in sides),
        "runtime_s": max(job[s].get("runtime", 0) for s in sides) / 1000.0,
        "lat_mean_us": clat.get("mean", 0) / 1000.0,
        "p50_us": percentiles.get("50.000000", 0) / 1000.0,
        "p99_us": percentiles.get("99.000000", 0) / 1000.0,
        "guest_cpu_percent": job.get("usr_cpu", 0) + job.get("sys_cpu", 0),
        "fio_errors": job.get("error", 0),
    }


def load(path: Path) -> dict:
    """figures() of the fio JSON file at path; ValueError if it is not one (a console
    capture cut short, say)."""
    try:
        return figures(json.loads(Path(path).read_text()))
    except (KeyError, IndexError, TypeError, AttributeError) as err:
        raise ValueError(str(err)) from err
