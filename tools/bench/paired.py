#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Table of `make bench-paired` (tests/xen/paired): Linux blkback in dom0 and blkdom, job
by job in one guest.

    python3 tools/bench/paired.py [--nested results/xen/paired] [--markdown] [--json FILE]

The scenario ran each job on xvda (dom0 blkback) and at once on xvdb (blkdom), in
alternating order, for several rounds: the two halves of a pair are one job apart, so a
drift of the outer machine's speed falls on both. Per job this prints each backend's
median IOPS (min-max over the rounds), the median of the per-pair ratios blkdom / dom0
with their min-max and how many pairs blkdom won, the same for completion-latency p50,
each backend's CPU over the job and the guest's blkif interrupts per I/O. Writes the
figures as JSON (default: paired.json in the nested directory). Standard library only.
"""

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tools" / "bench"))
import fio_results  # noqa: E402  (tools/fio_results.py)
from report import (add_iops_per_cpu, blkdom_cmdline_note, derive_host, fmt,  # noqa: E402
                    read_cpu_figures, read_guest_irqs, read_host_threads, spread)  # (tools/bench/report.py)

GUEST = "fio-paired"
# The guest's disks and who serves them (tests/xen/paired).
BACKENDS = {"xvda": "linux-dom0", "xvdb": "blkdom"}
BASELINE, OURS = "linux-dom0", "blkdom"
# fio-paired's files: fio-fio-paired-JOB@DISK@ROUND.json (round 0: the prefill).
FILE_RE = re.compile(r"^fio-" + GUEST + r"-(fio-[a-z0-9-]+)@(xvd[a-z])@(\d+)\.json$")


def read_words(path: Path) -> dict:
    """A scenario's config file: name=value words; empty if the file is missing."""
    config = {}
    if path.exists():
        for word in path.read_text().split():
            key, _, value = word.partition("=")
            config[key] = value
    return config


def ordered_jobs(runs: list, order=()) -> list:
    """The jobs of `runs`, those named in `order` first and in its order, then the rest."""
    order = list(order)
    return sorted({r["job"] for r in runs},
                  key=lambda j: (order.index(j) if j in order else len(order), j))


def read_config(nested: Path) -> dict:
    config = read_words(nested / "paired-config.txt")
    # RIG_PIN_PCPU (tools/rig/run.sh): which QEMU thread had host core 0 to itself.
    pinning = nested / "host-pinning.txt"
    if pinning.exists():
        alone = [line.split()[0] for line in pinning.read_text().splitlines()
                 if line.endswith("host-core=0")]
        if alone:
            config["pinned_alone"] = alone[0]
    return config


# How far a job's CPU window (dom0 reading its begin and end markers) may be from the
# job's own length (settle, ramp and fio's runtime) before its CPU is left out.
WINDOW_FIT = (0.85, 1.25)


def window_fits(window_s: float, expected_s: float) -> bool:
    """Whether a CPU window of window_s seconds measured a job of expected_s."""
    return WINDOW_FIT[0] * expected_s <= window_s <= WINDOW_FIT[1] * expected_s


def load_runs(nested: Path, settle: float, guest_pcpu=None, ramp: float = 0.0) -> list:
    """One row per job run: job, backend, round, fio's figures, the backend's CPU % over the
    job (its settle seconds left out; none when the window does not fit the job's length,
    `cpu_window_off_s`), the guest's blkif interrupts per I/O and, from the
    outer machine (host-threads.txt, when the guest's pCPU is known), how much of the job
    the guest's vCPU thread ran and waited for a host core and its run time per I/O."""
    edges = read_host_threads(nested / "host-threads.txt")
    irqs = {}
    console = nested / f"guest-{GUEST}.log"
    if console.exists():
        irqs = read_guest_irqs(console)
    runs = []
    for path in sorted(nested.glob(f"fio-{GUEST}-*.json")):
        match = FILE_RE.match(path.name)
        if not match or match[3] == "0" or match[2] not in BACKENDS:
            continue
        job, disk, round_ = match[1], match[2], int(match[3])
        try:
            figures = fio_results.load(path)
        except ValueError:
            continue
        row = {"job": job, "backend": BACKENDS[disk], "round": round_,
               "iops": figures["iops"], "mib_s": figures["mib_s"],
               "p50_us": figures["p50_us"], "p99_us": figures["p99_us"]}
        name = f"{job}@{disk}@{round_}"
        cpu = read_cpu_figures(nested / f"cpu-{GUEST}-{name}.txt")
        window = cpu.get("wall_s")
        if "cpu_s" in cpu and window is not None:
            if not window_fits(window, settle + ramp + figures["runtime_s"]):
                # dom0 took the job's markers late: the CPU over it is not the job's.
                row["cpu_window_off_s"] = window
            elif window > settle:
                row["backend_cpu_percent"] = 100.0 * cpu["cpu_s"] / (window - settle)
                add_iops_per_cpu(row)
                if "blkdom_cpu_s" in cpu:
                    row["blkdom_cpu_percent"] = 100.0 * cpu["blkdom_cpu_s"] / (window - settle)
        if name in irqs and figures["total_ios"] > 0:
            before, after = irqs[name]
            row["guest_irq_per_io"] = (after - before) / figures["total_ios"]
        # The outer machine's edges are dom0's markers too.
        if guest_pcpu is not None and "cpu_window_off_s" not in row:
            derive_host(row, edges, GUEST, name, guest_pcpu, settle)
        runs.append(row)
    return runs


def summarise(runs: list, order=()) -> list:
    """Per job: each backend's figures over the rounds, and the per-pair ratios (blkdom /
    dom0 of the same round) of IOPS and p50, with how many pairs blkdom won."""
    by_key = {(r["job"], r["backend"], r["round"]): r for r in runs}
    jobs = ordered_jobs(runs, order)
    summary = []
    for job in jobs:
        entry = {"job": job, "backends": {}, "pairs": []}
        for backend in (BASELINE, OURS):
            rows = [r for (j, b, _), r in by_key.items() if j == job and b == backend]
            figures = {}
            for field in ("iops", "iops_per_cpu", "mib_s", "p50_us", "p99_us",
                          "backend_cpu_percent", "blkdom_cpu_percent",
                          "guest_irq_per_io", "host_guest_vcpu_run_percent",
                          "host_guest_vcpu_wait_percent", "host_guest_vcpu_us_per_io",
                          "host_guest_vcpu_sleeps_per_io",
                          "host_guest_vcpu_preempted_per_io"):
                values = [r[field] for r in rows if field in r]
                if values:
                    figures[field] = spread(values)
            entry["backends"][backend] = figures
        rounds = sorted({rnd for (j, _, rnd) in by_key if j == job})
        for rnd in rounds:
            base, ours = by_key.get((job, BASELINE, rnd)), by_key.get((job, OURS, rnd))
            if base and ours and base["iops"] > 0:
                pair = {"round": rnd, "iops": ours["iops"] / base["iops"]}
                if base["p50_us"] > 0:
                    pair["p50_us"] = ours["p50_us"] / base["p50_us"]
                entry["pairs"].append(pair)
        for field, better in (("iops", lambda x: x > 1.0), ("p50_us", lambda x: x < 1.0)):
            ratios = [p[field] for p in entry["pairs"] if field in p]
            if ratios:
                entry[f"{field}_ratio"] = spread(ratios)
                entry[f"{field}_won"] = sum(1 for x in ratios if better(x))
        summary.append(entry)
    return summary


def fmt_spread(figure, digits=0, suffix="") -> str:
    if not figure:
        return "-"
    if figure["n"] == 1:
        return fmt(figure["median"], digits) + suffix
    return (f"{fmt(figure['median'], digits)}{suffix} "
            f"({fmt(figure['min'], digits)}-{fmt(figure['max'], digits)})")


def table_rows(summary: list) -> tuple:
    header = ["job", "dom0 IOPS", "blkdom IOPS", "blkdom / dom0 (pairs)", "won",
              "IOPS per backend CPU dom0 / blkdom",
              "p50 us dom0 / blkdom", "p50 ratio (pairs)", "backend CPU % dom0 / blkdom",
              "guest irq/IO dom0 / blkdom", "guest vCPU ran/waited % dom0 / blkdom",
              "guest vCPU us/IO dom0 / blkdom",
              "guest vCPU sleeps/preempted per IO dom0 / blkdom"]
    rows = []
    for entry in summary:
        base, ours = entry["backends"][BASELINE], entry["backends"][OURS]

        def median(figures, field, digits):
            return fmt(figures[field]["median"], digits) if field in figures else "-"
        pairs = len(entry["pairs"])
        rows.append([
            entry["job"], fmt_spread(base.get("iops")), fmt_spread(ours.get("iops")),
            fmt_spread(entry.get("iops_ratio"), 2, "x"),
            f"{entry.get('iops_won', 0)}/{pairs}",
            f"{median(base, 'iops_per_cpu', 0)} / {median(ours, 'iops_per_cpu', 0)}",
            f"{median(base, 'p50_us', 0)} / {median(ours, 'p50_us', 0)}",
            fmt_spread(entry.get("p50_us_ratio"), 2, "x"),
            f"{median(base, 'backend_cpu_percent', 0)} / {median(ours, 'backend_cpu_percent', 0)}",
            f"{median(base, 'guest_irq_per_io', 2)} / {median(ours, 'guest_irq_per_io', 2)}",
            f"{median(base, 'host_guest_vcpu_run_percent', 0)}/"
            f"{median(base, 'host_guest_vcpu_wait_percent', 0)} / "
            f"{median(ours, 'host_guest_vcpu_run_percent', 0)}/"
            f"{median(ours, 'host_guest_vcpu_wait_percent', 0)}",
            f"{median(base, 'host_guest_vcpu_us_per_io', 0)} / "
            f"{median(ours, 'host_guest_vcpu_us_per_io', 0)}",
            f"{median(base, 'host_guest_vcpu_sleeps_per_io', 2)}/"
            f"{median(base, 'host_guest_vcpu_preempted_per_io', 2)} / "
            f"{median(ours, 'host_guest_vcpu_sleeps_per_io', 2)}/"
            f"{median(ours, 'host_guest_vcpu_preempted_per_io', 2)}",
        ])
    # Over NVMe/TCP the backend's CPU is dom0's and blkdom's: blkdom's part apart.
    if any("blkdom_cpu_percent" in e["backends"][b] for e in summary for b in (BASELINE, OURS)):
        header.insert(9, "of it blkdom's % dom0 / blkdom")
        for row, entry in zip(rows, summary):
            base, ours = entry["backends"][BASELINE], entry["backends"][OURS]
            row.insert(9, " / ".join(
                fmt(f["blkdom_cpu_percent"]["median"], 0) if "blkdom_cpu_percent" in f else "-"
                for f in (base, ours)))
    return header, rows


def render(summary: list, config: dict, markdown: bool) -> str:
    header, rows = table_rows(summary)
    title = (f"Paired: dom0 blkback (xvda) and blkdom (xvdb) in one guest, "
             f"{config.get('rounds', '?')} round(s) of {config.get('runtime', '?')} s jobs, "
             "each job on both disks back to back (order alternating by round); "
             "ratios per pair, median (min-max); won = pairs where blkdom did better"
             + blkdom_cmdline_note(config)
             + (f"; host core 0 for {config['pinned_alone']} alone, the other threads on "
                "core 1 (RIG_PIN_PCPU)" if config.get("pinned_alone") else ""))
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
                 for line in [header] + rows]
    return title + ":\n\n" + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nested", type=Path, default=REPO / "results/xen/paired")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--json", type=Path, help="where to write the figures")
    args = parser.parse_args(argv)
    config = read_config(args.nested)
    pcpu = config.get("guest_pcpu")
    runs = load_runs(args.nested, float(config.get("settle", 0)),
                     int(pcpu) if pcpu and pcpu.isdigit() else None,
                     float(config.get("ramp", 0)))
    if not runs:
        print(f"no paired results in {args.nested}", file=sys.stderr)
        return 1
    summary = summarise(runs, config.get("jobs", "").split(","))
    if not any(entry["pairs"] for entry in summary):
        print(f"no complete pair in {args.nested}", file=sys.stderr)
        return 1
    out = args.json or args.nested / "paired.json"
    out.write_text(json.dumps({"config": config, "runs": runs, "summary": summary},
                              indent=1, sort_keys=True) + "\n")
    print(render(summary, config, args.markdown), end="")
    off = [f"{r['job']}@{r['backend']}@{r['round']} ({r['cpu_window_off_s']:.1f} s)"
           for r in runs if "cpu_window_off_s" in r]
    if off:
        print(f"CPU left out of {len(off)} of {len(runs)} runs whose window did not fit the "
              f"job (dom0 read its markers late): {', '.join(off)}")
    print(f"json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
