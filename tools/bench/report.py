#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Report of `make bench`: one bench.json per run, a table of medians and a plot.

    python3 tools/bench/report.py [--nested results/xen/bench] [--engine FILE]
        [--out-root results/bench] [--svg docs/bench-iops-by-block-size.svg] [--markdown]

Reads what tests/xen/bench left in the nested directory (per round and system: fio JSON,
through tools/fio_results.py like the demo's table, and backend CPU per job, the backend's counters at each job's edges, the guest's console
with its blkif interrupt counts) and the engine benchmark's JSON (BENCH_JSON of
xen/blkback/examples/bench_engine.rs, and its multi-queue scaling's beside it,
engine-scale.json). Writes <out-root>/<UTC timestamp>/bench.json
(commit, date, machine, every measurement, the summary) and tables.md (the tables in
Markdown, for BENCHMARKS.md), prints the tables, and draws IOPS by block size (the
random-read QD32 sweep), one line per system, as a hand-written SVG. Standard library only.
"""

import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import fio_results  # noqa: E402  (tools/fio_results.py, the fio JSON reader the demo shares)

# Result folders of tests/xen/bench (round-N/<system>/), in the scenario's order: three
# systems on RAM disks, then two HVM driver domains on the passed-through NVMe controller.
SYSTEMS = ["linux-dom0", "linux-dd", "blkdom", "linux-dd-pt", "blkdom-pt"]
SYSTEM_LABELS = {"linux-dom0": "Linux dom0 blkback", "linux-dd": "Linux driver domain",
                 "blkdom": "blkdom", "linux-dd-pt": "Linux HVM dd, passthrough NVMe",
                 "blkdom-pt": "blkdom HVM, passthrough NVMe"}
SHORT_LABELS = {"linux-dom0": "Linux dom0", "linux-dd": "Linux dd", "blkdom": "blkdom",
                "linux-dd-pt": "Linux dd-pt", "blkdom-pt": "blkdom-pt"}
SYSTEM_COLOURS = {"linux-dom0": "#1f77b4", "linux-dd": "#2ca02c", "blkdom": "#d62728",
                  "linux-dd-pt": "#9467bd", "blkdom-pt": "#ff7f0e"}
# The comparisons, (ours, baseline): blkdom with each Linux system on a RAM disk, and
# blkdom-pt with Linux on the same passed-through device. Key in bench.json: "ours/baseline".
RATIOS = [("blkdom", "linux-dom0"), ("blkdom", "linux-dd"), ("blkdom-pt", "linux-dd-pt")]
# The systems blkdom serves (its counters: the cost table).
OURS = ["blkdom", "blkdom-pt"]
# Job names of the guest's generic arm: fio-<rw>-<bs>-qd<depth>-<N>j or ...-fill, and
# ...-<N>j-r<IOPS> paced at that rate (fio --rate_iops).
JOB_RE = re.compile(
    r"^fio-(randread|randwrite|read|write)-(\d+[kmg]?)-qd(\d+)-(\d+j|fill)(?:-r(\d+))?$")
GUEST_FILE_RE = re.compile(r"^(fio|cpu|counters|guest)-(fio-[a-z0-9]+-r\d+)(?:-(.+))?\.(json|txt|log)$")
# The sweep drawn in the plot: random reads, QD32, one job, any block size.
SWEEP_RE = re.compile(r"^fio-randread-(\d+[kmg]?)-qd32-1j$")


def size_bytes(text: str) -> int:
    """fio's block size notation (k = 1024) in bytes."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    match = re.fullmatch(r"(\d+)([kmg]?)", text.lower())
    if not match:
        raise ValueError(f"bad block size {text!r}")
    return int(match[1]) * units[match[2]]


def size_label(size: int) -> str:
    for unit, factor in (("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def describe_job(job: str) -> str:
    """A human name: 'randread 4K QD32 x2' for fio-randread-4k-qd32-2j."""
    match = JOB_RE.match(job)
    if not match:
        return job
    rw, bs, depth, count, rate = match.groups()
    label = f"{rw} {size_label(size_bytes(bs))} QD{depth}"
    if count == "fill":
        return label + " (prefill)"
    label += f" x{count[:-1]}" if count != "1j" else ""
    return label + (f" at {int(rate):,} IOPS" if rate else "")


def job_sort_key(job: str) -> tuple:
    """Jobs missing from the scenario's list: the prefill, the others, then the sweep."""
    match = JOB_RE.match(job)
    if not match:
        return (3, job)
    rw, bs, depth, count, _rate = match.groups()
    if count == "fill":
        return (0, job)
    sweep = SWEEP_RE.match(job) is not None and bs != "4k"
    return (2 if sweep else 1, rw not in ("randread", "randwrite"), size_bytes(bs),
            rw, -int(depth), count, int(_rate or 0))


# --- reading one run -------------------------------------------------------------------

def parse_key_values(tokens: list) -> dict:
    """key=value tokens into numbers; a token 'vcpu0:' prefixes the keys after it."""
    values = {}
    prefix = ""
    for token in tokens:
        if token.endswith(":") and "=" not in token:
            prefix = token[:-1] + "."
            continue
        key, sep, value = token.partition("=")
        if not sep:
            continue
        try:
            values[prefix + key] = float(value)
        except ValueError:
            pass
    return values


# Linux blkback's per-vbd counters (sysfs statistics/), which blkdom-stats carries under
# the same names: the requests of each kind, and oo_req (a request had to wait).
LINUX_REQUESTS = ("rd_req", "wr_req", "f_req", "ds_req")
# blkdom-stats recorded before it took the Linux names.
OLD_BLKDOM_NAMES = {"reads": "rd_req", "writes": "wr_req", "flushes": "f_req",
                    "discards": "ds_req", "sectors-read": "rd_sect",
                    "sectors-written": "wr_sect", "device-busy": "oo_req"}


def read_counters(path: Path) -> dict:
    """counters-<guest>.txt: 'EDGE JOB SOURCE uptime=T key=value...' per line, into
    {(job, edge, source): {key: number}} (the last line wins)."""
    edges = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0] not in ("begin", "end"):
            continue
        values = parse_key_values(fields[3:])
        if fields[2] == "blkdom-stats":
            values = {OLD_BLKDOM_NAMES.get(k, k): v for k, v in values.items()}
        edges[(fields[1], fields[0], fields[2])] = values
    return edges


def read_guest_irqs(path: Path) -> dict:
    """The guest's blkif interrupt counts around each job: {job: (before, after)}. With
    several fio threads each prints 'after'; the last (largest) one counts."""
    before, after = {}, {}
    for line in path.read_text(errors="replace").splitlines():
        match = re.search(r"rig-guest: irq (before|after) (\S+) (\d+)", line)
        if match:
            side, job, count = match[1], match[2], int(match[3])
            if side == "before":
                before.setdefault(job, count)
            else:
                after[job] = max(after.get(job, 0), count)
    return {job: (before[job], after[job]) for job in before if job in after}


def add_iops_per_cpu(row: dict) -> None:
    """IOPS per backend CPU: the requests a second one fully busy backend vCPU served at
    this job's rate (IOPS / (backend CPU % / 100)); what a backend's CPU buys, set beside
    every IOPS figure. None without both figures."""
    cpu = row.get("backend_cpu_percent", 0.0)
    if cpu > 0 and row.get("iops", 0) > 0:
        row["iops_per_cpu"] = row["iops"] / (cpu / 100.0)


def read_cpu_figures(path: Path) -> dict:
    """The figures of a cpu-*.txt file (tests/xen/lib/fio.sh) that are numbers: `cpu_s`,
    `wall_s`, and `blkdom_cpu_s` (blkdom's part of a backend that adds dom0 and blkdom
    up) when there; empty when the file is missing."""
    if not path.exists():
        return {}
    figures = {}
    for key, _, value in (kv.partition("=") for kv in path.read_text().split() if "=" in kv):
        try:
            figures[key] = float(value)
        except ValueError:
            pass
    return figures


def read_cpu(path: Path):
    figures = read_cpu_figures(path)
    if "cpu_s" in figures and "wall_s" in figures:
        return figures["cpu_s"], figures["wall_s"]
    return None


def read_host_threads(path: Path) -> dict:
    """host-threads.txt (tools/rig/run.sh, on the outer machine): per fio job edge
    'BEGIN|END GUEST JOB host_s=S thread:NAME=RUN_NS,WAIT_NS[,SLEEPS,PREEMPTED]...
    host_cpu=J,J,...', into {(guest, job, edge): {"host_s": S, "threads": {name: [run_ns,
    wait_ns]}, "switches": {name: [sleeps, preempted]}, "host_cpu": [jiffies...]}};
    threads of the same name are added up. Older files have no context switches."""
    edges = {}
    if not path.exists():
        return edges
    # Lines end at "\n" only: a stray CR (the guest's, through dom0's echo) is whitespace.
    for line in path.read_bytes().decode(errors="replace").split("\n"):
        fields = line.split()
        if len(fields) < 4 or fields[0] not in ("BEGIN", "END"):
            continue
        edge = {"host_s": None, "threads": {}, "switches": {}, "host_cpu": []}
        try:
            for token in fields[3:]:
                key, _, value = token.partition("=")
                if key == "host_s":
                    edge["host_s"] = float(value)
                elif key.startswith("thread:"):
                    numbers = [int(v) for v in value.split(",")]
                    if len(numbers) not in (2, 4):
                        raise ValueError(token)
                    name = key[len("thread:"):]
                    total = edge["threads"].setdefault(name, [0, 0])
                    total[0] += numbers[0]
                    total[1] += numbers[1]
                    if len(numbers) == 4:
                        switches = edge["switches"].setdefault(name, [0, 0])
                        switches[0] += numbers[2]
                        switches[1] += numbers[3]
                elif key == "host_cpu":
                    edge["host_cpu"] = [int(v) for v in value.split(",")]
        except ValueError:
            continue
        if edge["host_s"] is not None:
            edges[(fields[1], fields[2], fields[0].lower())] = edge
    return edges


# USER_HZ of /proc/stat; the vCPU threads QEMU names with debug-threads=on.
CLOCK_TICKS = 100
VCPU_THREAD_RE = re.compile(r"^CPU_(\d+)/")


def derive_host(row: dict, edges: dict, guest: str, job: str, guest_pcpu, settle: float):
    """The outer machine over one job: how much the guest's vCPU thread ran and how long
    it waited for a host core, and what all vCPU threads ran (in cores), per second of
    the job's busy time (the settle taken off, as for the backend's CPU); how busy the
    host's cores were over the whole job."""
    begin, end = edges.get((guest, job, "begin")), edges.get((guest, job, "end"))
    # The prefill's I/O lasts a second or two: the console's lag at its edges would be
    # most of it.
    if not begin or not end or job.endswith("-fill"):
        return
    busy_wall = end["host_s"] - begin["host_s"] - settle
    if busy_wall <= 0:
        return

    def delta(name, index):
        if name not in begin["threads"] or name not in end["threads"]:
            return None
        return (end["threads"][name][index] - begin["threads"][name][index]) / 1e9

    vcpu_run = 0.0
    for name in end["threads"]:
        match = VCPU_THREAD_RE.match(name)
        if not match:
            continue
        run, wait = delta(name, 0), delta(name, 1)
        if run is None:
            continue
        vcpu_run += run
        if guest_pcpu is not None and int(match[1]) == guest_pcpu:
            row["host_guest_vcpu_run_percent"] = 100.0 * run / busy_wall
            row["host_guest_vcpu_wait_percent"] = 100.0 * wait / busy_wall
            # The guest's whole cost of one I/O (fio, its kernel, blkfront, interrupts,
            # its copies) in host CPU time: what a backend can shrink, or not.
            if row.get("iops", 0) > 0:
                ios = row["iops"] * busy_wall
                row["host_guest_vcpu_us_per_io"] = 1e6 * run / ios
                # Each sleep is a halt or a wait for QEMU's global lock (a futex), each
                # preemption a host core taken by another thread.
                if name in begin["switches"] and name in end["switches"]:
                    sleeps, preempted = (after - before for after, before in
                                         zip(end["switches"][name], begin["switches"][name]))
                    # The counts only grow: one that fell was misread (an edge's status
                    # file read out of step), so the job gets no figure rather than a
                    # negative one.
                    if sleeps >= 0 and preempted >= 0:
                        row["host_guest_vcpu_sleeps_per_io"] = sleeps / ios
                        row["host_guest_vcpu_preempted_per_io"] = preempted / ios
    row["host_vcpus_cores"] = vcpu_run / busy_wall
    before, after = begin["host_cpu"], end["host_cpu"]
    if len(before) >= 5 and len(after) == len(before):
        ticks = [a - b for a, b in zip(after, before)]
        idle = ticks[3] + ticks[4]  # idle, iowait
        # Over the whole job: the host does not go quiet while the guest settles.
        row["host_busy_cores"] = (sum(ticks) - idle) / CLOCK_TICKS / (busy_wall + settle)


def counter_deltas(edges: dict, job: str, source: str) -> dict:
    begin, end = edges.get((job, "begin", source)), edges.get((job, "end", source))
    if not begin or not end:
        return {}
    return {k: end[k] - begin[k] for k in end if k in begin and k != "uptime"}


def sum_matching(values: dict, suffix: str) -> float:
    """Adds every 'vcpuN.<suffix>' value (pollers publish one set per vCPU)."""
    return sum(v for k, v in values.items() if k.endswith("." + suffix))


def derive_costs(row: dict, deltas: dict, source: str) -> None:
    """Per-request and per-second costs from the backend's counter deltas over one job.
    Counter windows include fio's ramp-up second, so costs are per backend request and
    scaled to seconds with fio's IOPS."""
    iops = row["iops"]
    requests = sum(deltas.get(k, 0) for k in LINUX_REQUESTS)
    row["backend_requests"] = requests
    if requests <= 0:
        return
    row["backend_oo_req"] = deltas.get("oo_req", 0)
    if source == "linux-vbd":
        return
    per_request = {k: v / requests for k, v in deltas.items()
                   if not k.startswith("vcpu") and k not in ("queues", "grants-mapped")}
    row["blkdom_per_request"] = per_request
    # Hypercalls the backend made: grant map and unmap batches, plus event-channel sends
    # when blkdom publishes them (notifications=...; derive_pollers takes out those that
    # went with a poller's sleep).
    hypercalls = deltas.get("map-batches", 0) + deltas.get("unmap-batches", 0)
    if "notifications" in deltas:
        hypercalls += deltas["notifications"]
        row["notifications_per_s"] = deltas["notifications"] / requests * iops
    if "events" in deltas:  # the frontend's notifications to blkdom
        row["events_per_s"] = deltas["events"] / requests * iops
    row["hypercalls_per_request"] = hypercalls / requests
    row["hypercalls_counted"] = "map+unmap" + ("+notify" if "notifications" in deltas else "")


def derive_pollers(row: dict, deltas: dict) -> None:
    requests = row.get("backend_requests", 0)
    if requests <= 0 or not deltas:
        return
    for name in ("loops", "busy", "sleeps"):
        row[f"poller_{name}_per_request"] = sum_matching(deltas, name) / requests
    row["poller_sleeps_per_s"] = sum_matching(deltas, "sleeps") / requests * row["iops"]
    # Wake-ups meant for another vCPU (every poller of more than one port wakes at any of
    # the domain's events); missing in older runs.
    if any(k.endswith(".stray-wakes") for k in deltas):
        row["poller_stray_wakes_per_s"] = (sum_matching(deltas, "stray-wakes") / requests
                                           * row["iops"])
    # Sends that went with a poller's sleep in one multicall (sends-with-sleep; missing in
    # older runs) are no hypercall of their own, and their time is the sleep's.
    with_sleep = sum_matching(deltas, "sends-with-sleep")
    if with_sleep and "hypercalls_per_request" in row:
        row["hypercalls_per_request"] = max(
            0.0, row["hypercalls_per_request"] - with_sleep / requests)
    # What one event to the frontend cost blkdom (the send hypercall), when it says.
    sends = sum_matching(deltas, "notifications") - with_sleep
    if sends > 0:
        row["notify_us_per_send"] = sum_matching(deltas, "notify-ns") / sends / 1e3


def load_nested(nested: Path) -> dict:
    """Every measurement of one tests/xen/bench run."""
    config = {}
    config_path = nested / "bench-config.txt"
    if config_path.exists():
        for line in config_path.read_text().splitlines():
            for token in line.split():
                key, sep, value = token.partition("=")
                if sep:
                    config[key] = value.split(",") if key == "jobs" else value
    settle = float(config.get("settle", 0))
    ramp = float(config.get("ramp", 1))
    guest_pcpu = int(config["guest_pcpu"]) if config.get("guest_pcpu", "").isdigit() else None
    host_edges = read_host_threads(nested / "host-threads.txt")
    runs = []
    for round_dir in sorted(nested.glob("round-*"), key=lambda p: int(p.name.split("-")[1])):
        round_no = int(round_dir.name.split("-")[1])
        for system in SYSTEMS:
            directory = round_dir / system
            if not directory.is_dir():
                continue
            edges, irqs = {}, {}
            for path in directory.iterdir():
                match = GUEST_FILE_RE.match(path.name)
                if match and match[1] == "counters":
                    edges.update(read_counters(path))
                elif match and match[1] == "guest":
                    irqs.update(read_guest_irqs(path))
            for path in sorted(directory.glob("fio-fio-*.json")):
                match = GUEST_FILE_RE.match(path.name)
                if not match:
                    continue
                guest, job = match[2], match[3]
                try:
                    row = fio_results.load(path)
                except ValueError as err:
                    print(f"warning: {path}: unreadable fio JSON ({err})", file=sys.stderr)
                    continue
                row.update({"system": system, "round": round_no, "job": job})
                cpu = read_cpu(directory / f"cpu-{guest}-{job}.txt")
                if cpu:
                    cpu_s, wall_s = cpu
                    row["backend_cpu_s"] = cpu_s
                    row["job_wall_s"] = wall_s
                    busy_wall = wall_s - settle
                    if busy_wall > 0:
                        row["backend_cpu_percent"] = 100.0 * cpu_s / busy_wall
                        add_iops_per_cpu(row)
                if job in irqs:
                    before, after = irqs[job]
                    row["guest_irqs"] = after - before
                    seconds = row["runtime_s"] + (ramp if JOB_RE.match(job) and
                                                  not job.endswith("-fill") else 0)
                    if seconds > 0:
                        row["guest_irqs_per_s"] = (after - before) / seconds
                    if row["iops"] > 0 and seconds > 0:
                        row["guest_irqs_per_io"] = row["guest_irqs_per_s"] / row["iops"]
                for source in ("linux-vbd", "blkdom-stats"):
                    deltas = counter_deltas(edges, job, source)
                    if deltas:
                        row["counters_" + source.replace("-", "_")] = deltas
                        derive_costs(row, deltas, source)
                derive_host(row, host_edges, guest, job, guest_pcpu, settle)
                pollers = counter_deltas(edges, job, "blkdom-pollers")
                if pollers:
                    row["counters_blkdom_pollers"] = pollers
                    derive_pollers(row, pollers)
                runs.append(row)
    xen = {}
    info = nested / "xl-info.txt"
    if info.exists():
        for line in info.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("xen_version", "nr_cpus", "cpu_mhz", "virt_caps"):
                xen[key.strip()] = value.strip()
    return {"config": config, "xen": xen, "runs": runs}


# --- summary ---------------------------------------------------------------------------

SUMMARY_FIELDS = ["iops", "iops_per_cpu", "mib_s", "p50_us", "p99_us", "backend_cpu_percent",
                  "guest_irqs_per_s", "guest_irqs_per_io", "hypercalls_per_request",
                  "notifications_per_s", "events_per_s", "poller_sleeps_per_s",
                  "poller_loops_per_request", "poller_stray_wakes_per_s",
                  "notify_us_per_send",
                  "host_guest_vcpu_run_percent",
                  "host_guest_vcpu_wait_percent", "host_guest_vcpu_us_per_io",
                  "host_vcpus_cores", "host_busy_cores"]


def spread(values: list) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def summarise(runs: list, order=()) -> list:
    """Median, min and max over the rounds of each (job, system), with the ratios of the
    medians of each RATIOS pair present; jobs in the given order (the scenario's list),
    others after."""
    by_key = {}
    for row in runs:
        by_key.setdefault((row["job"], row["system"]), []).append(row)
    order = list(order)
    jobs = sorted({job for job, _ in by_key},
                  key=lambda j: (order.index(j) if j in order else len(order), job_sort_key(j)))
    summary = []
    for job in jobs:
        entry = {"job": job, "description": describe_job(job), "systems": {}}
        for system in SYSTEMS:
            rows = by_key.get((job, system), [])
            figures = {}
            for field in SUMMARY_FIELDS:
                values = [r[field] for r in rows if field in r]
                if values:
                    figures[field] = spread(values)
            if figures:
                entry["systems"][system] = figures
        entry["ratios"] = {}
        for ours_name, baseline in RATIOS:
            ours = entry["systems"].get(ours_name)
            linux = entry["systems"].get(baseline)
            if linux and ours:
                entry["ratios"][f"{ours_name}/{baseline}"] = {
                    field: ours[field]["median"] / linux[field]["median"]
                    for field in ("iops", "mib_s", "p50_us", "p99_us")
                    if field in linux and field in ours and linux[field]["median"] > 0}
        summary.append(entry)
    return summary


# --- output ----------------------------------------------------------------------------

def fmt(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def fmt_spread(figure, digits: int = 0) -> str:
    if not figure:
        return "-"
    if figure["n"] == 1:
        return fmt(figure["median"], digits)
    return (f"{fmt(figure['median'], digits)} ({fmt(figure['min'], digits)}–"
            f"{fmt(figure['max'], digits)})")


def present_systems(summary: list) -> list:
    found = {system for entry in summary for system in entry["systems"]}
    return [system for system in SYSTEMS if system in found]


def present_ratios(systems: list) -> list:
    """The RATIOS pairs whose two systems are both among systems."""
    return [(ours, base) for ours, base in RATIOS if ours in systems and base in systems]


def median_of(figures: dict, field: str, digits: int) -> str:
    return fmt(figures[field]["median"], digits) if field in figures else "-"


def main_table(summary: list) -> tuple:
    """The comparison: per job, IOPS and MiB/s of each system (median, min–max), the
    IOPS ratio of each RATIOS pair present, backend CPU and, for QD1 jobs, latency."""
    systems = present_systems(summary)
    pairs = present_ratios(systems)
    header = (["job"] + [f"{SHORT_LABELS[s]} IOPS" for s in systems]
              + [f"{SHORT_LABELS[o]}/{SHORT_LABELS[b]}" for o, b in pairs]
              + [f"{SHORT_LABELS[s]} IOPS per backend CPU" for s in systems]
              + [f"{SHORT_LABELS[s]} MiB/s" for s in systems]
              + ["backend CPU % " + "/".join(SHORT_LABELS[s] for s in systems),
                 "QD1 p50/p99 µs " + ", ".join(SHORT_LABELS[s] for s in systems)])
    rows = []
    for entry in summary:
        figures = [entry["systems"].get(s, {}) for s in systems]
        ratios = []
        for ours, baseline in pairs:
            ratio = entry["ratios"].get(f"{ours}/{baseline}", {}).get("iops")
            ratios.append(f"{ratio:.2f}x" if ratio else "-")
        latency = ""
        if "-qd1-" in entry["job"]:
            latency = ", ".join(f"{median_of(f, 'p50_us', 0)}/{median_of(f, 'p99_us', 0)}"
                                for f in figures)
        rows.append([entry["description"]] + [fmt_spread(f.get("iops")) for f in figures]
                    + ratios + [median_of(f, "iops_per_cpu", 0) for f in figures] + [fmt_spread(f.get("mib_s"), 1) for f in figures]
                    + ["/".join(median_of(f, "backend_cpu_percent", 0) for f in figures),
                       latency])
    return header, rows


# The cost table's columns of each blkdom system: (header with {} for its name, field,
# digits).
COST_COLUMNS = [("{} hypercalls/req", "hypercalls_per_request", 3),
                ("{}→guest notify/s", "notifications_per_s", 0),
                ("guest→{} events/s", "events_per_s", 0),
                ("{} sleeps/s", "poller_sleeps_per_s", 0),
                ("{} poll loops/req", "poller_loops_per_request", 1),
                ("{} us/notify", "notify_us_per_send", 1),
                ("{} stray wakes/s", "poller_stray_wakes_per_s", 0)]


def cost_table(summary: list) -> tuple:
    """What the numbers cost: blkdom's hypercalls, notifications and poller sleeps (of
    each blkdom system present, or blkdom's columns empty if none is), and the interrupts
    every system's guest took."""
    systems = present_systems(summary)
    ours = [s for s in OURS if s in systems] or ["blkdom"]
    header = (["job"] + [title.format(SHORT_LABELS[o]) for title, _, _ in COST_COLUMNS
                         for o in ours]
              + [f"guest irq/s {SHORT_LABELS[s]}" for s in systems]
              + [f"guest irq/IO {SHORT_LABELS[s]}" for s in systems])
    rows = []
    for entry in summary:
        ours_figures = [entry["systems"].get(o, {}) for o in ours]
        figures = [entry["systems"].get(s, {}) for s in systems]
        rows.append([entry["description"]]
                    + [median_of(f, field, digits) for _, field, digits in COST_COLUMNS
                       for f in ours_figures]
                    + [median_of(f, "guest_irqs_per_s", 0) for f in figures]
                    + [median_of(f, "guest_irqs_per_io", 3) for f in figures])
    return header, rows


def host_table(summary: list):
    """The outer machine per job and system: the guest's vCPU thread's run and wait (for
    a host core) in % of the job and its run time per I/O, all vCPU threads' and the
    host's busy cores; None when the run recorded no host threads."""
    systems = present_systems(summary)
    if not any("host_vcpus_cores" in entry["systems"].get(s, {})
               for entry in summary for s in systems):
        return None
    header = (["job"] + [f"guest vCPU run/wait % {SHORT_LABELS[s]}" for s in systems]
              + [f"guest vCPU µs/IO {SHORT_LABELS[s]}" for s in systems]
              + [f"vCPU threads / host busy cores {SHORT_LABELS[s]}" for s in systems])
    rows = []
    for entry in summary:
        figures = [entry["systems"].get(s, {}) for s in systems]
        rows.append([entry["description"]]
                    + [f"{median_of(f, 'host_guest_vcpu_run_percent', 0)}/"
                       f"{median_of(f, 'host_guest_vcpu_wait_percent', 0)}" for f in figures]
                    + [median_of(f, "host_guest_vcpu_us_per_io", 0) for f in figures]
                    + [f"{median_of(f, 'host_vcpus_cores', 2)}/"
                       f"{median_of(f, 'host_busy_cores', 2)}" for f in figures])
    return header, rows


def engine_rows(engine: dict) -> list:
    return [[str(r["ring_order"]), str(r["queues"]), "on" if r["persistent_grants"] else "off",
             fmt(r["threaded_req_per_s"]), fmt(r["lockstep_req_per_s_per_core"]),
             fmt(r["lockstep_ns_per_req"], 1), fmt(r["plain_req_per_s_per_core"]),
             fmt(r["plain_ns_per_req"], 1),
             # The kernel's ring access (xen::SharedMem); older results lack it.
             fmt(r["kernel_req_per_s_per_core"]) if "kernel_ns_per_req" in r else "-",
             fmt(r["kernel_ns_per_req"], 1) if "kernel_ns_per_req" in r else "-",
             fmt(r["grant_batches_per_req"], 3)]
            for r in engine.get("results", [])]


def scale_spread(figure: dict, digits: int) -> str:
    return (f"{fmt(figure['median'], digits)} ({fmt(figure['min'], digits)}–"
            f"{fmt(figure['max'], digits)})")


def engine_scale_rows(scale: dict) -> list:
    """The engine's multi-queue scaling (BENCH_MODE=scale of bench_engine.rs)."""
    return [[str(r["ring_order"]), "on" if r["persistent_grants"] else "off", r["sharing"],
             str(r["pollers"]), scale_spread(r["aggregate_req_per_s"], 0),
             fmt(r["cores_used"], 2), fmt(100 * r["wall_efficiency"]) + "%",
             scale_spread(r["thread_cpu_ns_per_req"], 1),
             fmt(100 * r["cpu_efficiency"]) + "%", scale_spread(r["engine_ns_per_req"], 1)]
            for r in scale.get("results", [])]


ENGINE_SCALE_HEADER = ["ring order", "persistent", "sharing", "pollers", "aggregate req/s",
                       "cores", "wall eff.", "thread CPU ns/req", "CPU eff.",
                       "engine ns/req"]


ENGINE_HEADER = ["ring order", "queues", "persistent", "threaded req/s",
                 "lockstep req/s/core", "ns/req", "plain req/s/core", "ns/req",
                 "kernel req/s/core", "ns/req", "map+unmap batches/req"]


def text_table(header: list, rows: list) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def markdown_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def sweep_points(summary: list) -> dict:
    """{system: [(block size, median, min, max)]} of the random-read QD32 sweep."""
    points = {}
    for entry in summary:
        match = SWEEP_RE.match(entry["job"])
        if not match:
            continue
        for system, figures in entry["systems"].items():
            if "iops" in figures:
                iops = figures["iops"]
                points.setdefault(system, []).append(
                    (size_bytes(match[1]), iops["median"], iops["min"], iops["max"]))
    return {system: sorted(values) for system, values in points.items()}


def log_ticks(low: float, high: float) -> list:
    """1, 2, 5 x 10^n ticks from the last at or below low to the first at or above high
    (both > 0)."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    candidates = [step * 10.0 ** e for e in range(first, last + 1) for step in (1, 2, 5)]
    below = max(c for c in candidates if c <= low)
    above = min(c for c in candidates if c >= high)
    return [c for c in candidates if below <= c <= above]


def svg_plot(points: dict, title: str, subtitle: str) -> str:
    """IOPS (log scale) by block size (log2), median per system with min–max whiskers."""
    # The legend sits right of the plot, 124 px wide: enough for the RAM-disk systems'
    # labels (20 characters at most); 8 px more per character beyond (12 px sans-serif).
    longest = max((len(SYSTEM_LABELS[s]) for s in points), default=0)
    extra = 8 * max(0, longest - 20)
    width, height = 720 + extra, 440
    left, right, top, bottom = 80, 170 + extra, 60, 60
    plot_w, plot_h = width - left - right, height - top - bottom
    sizes = sorted({p[0] for values in points.values() for p in values})
    lows = [p[2] for values in points.values() for p in values if p[2] > 0]
    highs = [p[3] for values in points.values() for p in values]
    ticks = log_ticks(min(lows, default=1), max(highs, default=10))
    y_lo, y_hi = math.log10(ticks[0]), math.log10(ticks[-1])
    lo, hi = (sizes[0], sizes[-1]) if sizes else (512, 1 << 20)
    span = max(hi.bit_length() - lo.bit_length(), 1)

    def x_of(size):
        return left + plot_w * (size.bit_length() - lo.bit_length()) / span

    def y_of(iops):
        value = math.log10(max(iops, ticks[0]))
        return top + plot_h * (1 - (value - y_lo) / max(y_hi - y_lo, 1e-9))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="24" font-size="16" font-weight="bold">{escape(title)}</text>',
           f'<text x="{left}" y="42" fill="#555">{escape(subtitle)}</text>']
    for value in ticks:
        y = y_of(value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{fmt(value)}</text>')
    for size in sizes:
        x = x_of(size)
        out.append(f'<line x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" '
                   f'y2="{top + plot_h + 5}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 20}" text-anchor="middle">'
                   f'{size_label(size)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
               f'stroke="#333"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 16}" text-anchor="middle">'
               f'block size (fio randread, QD32, 1 job)</text>')
    out.append(f'<text x="20" y="{top + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 20 {top + plot_h / 2})">IOPS, log scale (median, min–max)'
               f'</text>')
    for index, system in enumerate(s for s in SYSTEMS if s in points):
        colour = SYSTEM_COLOURS[system]
        values = points[system]
        path = " ".join(f"{x_of(s):.1f},{y_of(m):.1f}" for s, m, _, _ in values)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                   f'stroke-width="2"/>')
        for size, median, low, high in values:
            x = x_of(size)
            out.append(f'<line x1="{x:.1f}" y1="{y_of(low):.1f}" x2="{x:.1f}" '
                       f'y2="{y_of(high):.1f}" stroke="{colour}"/>')
            out.append(f'<circle cx="{x:.1f}" cy="{y_of(median):.1f}" r="3.5" '
                       f'fill="{colour}"><title>{escape(SYSTEM_LABELS[system])} '
                       f'{size_label(size)}: {fmt(median)} IOPS</title></circle>')
        y = top + 10 + 22 * index
        out.append(f'<line x1="{left + plot_w + 15}" y1="{y}" x2="{left + plot_w + 40}" '
                   f'y2="{y}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{left + plot_w + 46}" y="{y + 4}">'
                   f'{escape(SYSTEM_LABELS[system])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    info = {"nproc": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    info["kernel"] = os.uname().release
    return info


def build_report(nested: Path, engine_path, now: datetime.datetime) -> dict:
    report = {
        "schema": 1,
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "machine": machine(),
        "nested": None,
        "engine": None,
        "engine_scale": None,
    }
    if nested and nested.is_dir():
        data = load_nested(nested)
        data["summary"] = summarise(data["runs"], data["config"].get("jobs", ()))
        report["nested"] = data
    if engine_path and Path(engine_path).exists():
        report["engine"] = json.loads(Path(engine_path).read_text())
        # tools/bench-engine.sh writes the scaling beside it.
        scale = Path(engine_path).with_name(Path(engine_path).stem + "-scale.json")
        if scale.exists():
            report["engine_scale"] = json.loads(scale.read_text())
    return report


def blkdom_cmdline_note(config: dict) -> str:
    """A title's mention of blkdom's command line (a scenario's `blkdom=` config line,
    ':' between words), empty when it had none."""
    cmdline = config.get("blkdom")
    return f"; blkdom's command line: {cmdline.replace(':', ' ')}" if cmdline else ""


def render_tables(report: dict, markdown: bool) -> str:
    table = markdown_table if markdown else text_table
    parts = []
    nested = report.get("nested")
    if nested and nested["summary"]:
        config = nested["config"]
        rounds = len({r["round"] for r in nested["runs"]})
        order = " ".join(SHORT_LABELS[s] for s in present_systems(nested["summary"]))
        parts.append(f"Nested Xen, {rounds} round(s) of {order} in turn, "
                     f"{config.get('runtime', '?')} s per job{blkdom_cmdline_note(config)}"
                     "; medians (min–max over rounds):")
        parts.append(table(*main_table(nested["summary"])))
        parts.append("Costs (medians; blkdom hypercalls = grant map + unmap batches + event"
                     " sends per backend request; per second = per request x fio IOPS;"
                     " guest irq = blkif interrupts in the guest):")
        parts.append(table(*cost_table(nested["summary"])))
        host = host_table(nested["summary"])
        if host:
            parts.append("The outer machine (QEMU's threads on its "
                         f"{report.get('machine', {}).get('nproc', '?')} cores, medians): the guest's"
                         " vCPU thread ran / waited for a host core, in % of the job, and"
                         " ran per I/O; all vCPU threads and the host in busy cores:")
            parts.append(table(*host))
    if report.get("engine"):
        parts.append("Engine on the host (4 KiB reads, null device, one poller):")
        parts.append(table(ENGINE_HEADER, engine_rows(report["engine"])))
    if report.get("engine_scale"):
        parts.append("Engine on the host, 1 to 8 pollers (one ring each, frontend in the same"
                     " thread; medians, min–max over threads, windows and rounds):")
        parts.append(table(ENGINE_SCALE_HEADER, engine_scale_rows(report["engine_scale"])))
    return "\n\n".join(parts) + "\n" if parts else "no results\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nested", type=Path, default=REPO / "results/xen/bench")
    parser.add_argument("--engine", type=Path, default=REPO / "results/bench/engine.json")
    parser.add_argument("--out-root", type=Path, default=REPO / "results/bench")
    parser.add_argument("--svg", type=Path, default=REPO / "docs/bench-iops-by-block-size.svg")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args(argv)

    now = datetime.datetime.now(datetime.timezone.utc)
    report = build_report(args.nested, args.engine, now)
    if not report["nested"] and not report["engine"]:
        print(f"no results in {args.nested} or {args.engine}", file=sys.stderr)
        return 1
    out_dir = args.out_root / now.strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    (out_dir / "tables.md").write_text(render_tables(report, markdown=True))
    print(render_tables(report, markdown=args.markdown), end="")
    points = sweep_points(report["nested"]["summary"]) if report["nested"] else {}
    if points:
        config = report["nested"]["config"]
        rounds = len({r["round"] for r in report["nested"]["runs"]})
        subtitle = (f"nested Xen under QEMU TCG, {rounds} round(s) of "
                    f"{config.get('runtime', '?')} s per job, {report['date'][:10]}, commit "
                    f"{report['commit']}, {report['machine'].get('nproc')} host cores")
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(svg_plot(points, "IOPS by block size: blkdom and Linux blkback",
                                     subtitle))
        print(f"plot: {args.svg}")
    print(f"json: {out_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
