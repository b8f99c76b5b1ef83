#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Tables of `make bench-backend`: Linux blkback in dom0 and blkdom at the backend's own
limit, driven by `hostile load` in one guest (tests/xen/bench-backend), and a Linux HVM
driver domain against blkdom as HVM on a passed-through NVMe, one at a time
(tests/xen/bench-backend-pt; the layout is told by the config file the run left).

    python3 tools/bench/backend.py [--nested results/xen/bench-backend] [--markdown]
        [--json FILE]

Per job and backend: the medians (min-max over the rounds) of IOPS, completion latency
p50/p99/p99.9, the backend's CPU over the measured window (Xen's runstate through
`xl list`: Domain-0 for xvda, blkdom for xvdb), the outer QEMU's CPU on the backend's
pCPUs (host-threads.txt), the generator's own CPU per request (all of it, and only the
loop passes that found work: a polling loop's CPU is its whole window) and its event
sends per request, how long the guest's vCPU thread waited for a host core and how many
host cores all the rig's vCPU threads got (when the host is short of cores, that and not
the backend sets the pace) and IOPS per host core the rig got; the blkdom / dom0 ratio of the medians and how many of the pairs (same round,
one job apart) blkdom won. Then one line per job, which other tools read:

    backend-ratio <job> blkdom/linux-dom0=<x.xx> iops=<blkdom>/<dom0> cpu=<blkdom%>/<dom0%>

(`blkdom/linux-dd-pt=` on the passed-through NVMe)

and for an idle job (`lg-idle-*`: connected, no I/O) blkdom's CPU in % of all its vCPUs
against the goal, under 1% in every round (`backend-idle ...`, see idle_lines).

Writes the figures as JSON (default: backend.json in the nested directory). Standard
library only.
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "bench"))
from paired import fmt_spread, ordered_jobs, read_words  # noqa: E402  (tools/bench/paired.py)
from report import (add_iops_per_cpu, blkdom_cmdline_note, derive_host, fmt,  # noqa: E402
                    markdown_table, read_cpu, read_host_threads, spread,
                    text_table)  # (tools/bench/report.py)



@dataclass(frozen=True)
class Layout:
    """Where a run left its files and which backend each is."""
    config: str
    edges: str
    # fio-GUEST-JOB@DISK@ROUND.json: hostile's JSON line (round 0: the prefill); groups
    # guest, job, disk, round.
    file_re: re.Pattern
    # (guest, disk) -> backend
    backends: dict
    baseline: str
    ours: str
    # The backends' short names in the table's header.
    short: tuple
    # backend -> the config key naming its pCPUs
    pcpu_keys: dict
    what: str


DOM0 = Layout(
    config="bench-backend-config.txt", edges="edges-bench-backend.txt",
    file_re=re.compile(r"^fio-(bench-backend)-(lg-[a-z0-9-]+)@(xvd[a-z])@(\d+)\.json$"),
    backends={("bench-backend", "xvda"): "linux-dom0", ("bench-backend", "xvdb"): "blkdom"},
    baseline="linux-dom0", ours="blkdom", short=("dom0", "blkdom"),
    pcpu_keys={"linux-dom0": "dom0_pcpus", "blkdom": "blkdom_pcpus"},
    what="dom0 blkback (xvda) and blkdom (xvdb) in one guest, {rounds} round(s) of {runtime} "
         "s jobs, each job on both disks back to back (order alternating by round)")
PT = Layout(
    config="bench-backend-pt-config.txt", edges="edges-bench-backend-pt.txt",
    file_re=re.compile(
        r"^fio-(bench-pt-linux|bench-pt-blkdom)-(lg-[a-z0-9-]+)@(xvda)@(\d+)\.json$"),
    backends={("bench-pt-linux", "xvda"): "linux-dd-pt",
              ("bench-pt-blkdom", "xvda"): "blkdom-pt"},
    baseline="linux-dd-pt", ours="blkdom-pt", short=("Linux dd", "blkdom"),
    pcpu_keys={"linux-dd-pt": "linux-dd-pt_pcpus", "blkdom-pt": "blkdom-pt_pcpus"},
    what="a Linux HVM driver domain and blkdom as HVM, each on the passed-through NVMe "
         "for its part of a round (order alternating), a fresh guest on each, "
         "{rounds} round(s) of {runtime} s jobs")
VCPU_THREAD_RE = re.compile(r"^CPU_(\d+)/")
FIELDS = ("iops", "iops_per_cpu", "mib_s", "p50_us", "p99_us", "p999_us", "backend_cpu_percent",
          "host_backend_percent", "gen_cpu_us_per_io", "gen_busy_us_per_io",
          "notifies_per_io", "host_guest_vcpu_run_percent", "host_guest_vcpu_wait_percent",
          "host_vcpus_cores", "host_busy_cores", "iops_per_rig_core", "guest_cpu_percent",
          "poller_sleeps_per_s", "poller_stray_wakes_per_s")


def layout_of(nested: Path) -> Layout:
    return PT if (nested / PT.config).exists() else DOM0


def read_config(nested: Path, layout: Layout = DOM0) -> dict:
    return read_words(nested / layout.config)


def pcpus(text) -> set:
    return {int(p) for p in (text or "").split(",") if p.strip().isdigit()}


def host_backend_percent(edges: dict, guest: str, name: str, cpus: set):
    """The outer QEMU threads of the backend's pCPUs: their run time over the job's
    window, in % of one host core."""
    begin, end = edges.get((guest, name, "begin")), edges.get((guest, name, "end"))
    if not begin or not end or not cpus:
        return None
    wall = end["host_s"] - begin["host_s"]
    if wall <= 0:
        return None
    run = 0.0
    for thread, numbers in end["threads"].items():
        match = VCPU_THREAD_RE.match(thread)
        if match and int(match[1]) in cpus and thread in begin["threads"]:
            run += (numbers[0] - begin["threads"][thread][0]) / 1e9
    return 100.0 * run / wall


def read_edges(path: Path) -> dict:
    """edges-bench-backend.txt (blkdom's jobs): '<begin|end> JOB uptime=S guest_cpu_s=S
    blkdom_vcpu_s=S,S vcpu0: rings=.. sleeps=.. stray-wakes=.. vcpu1: ...' into
    {(JOB, edge): {"uptime": S, "guest_cpu_s": S, "vcpu_s": [S, S], "sleeps": N,
    "stray-wakes": N}} (the poller counters summed over the vCPUs)."""
    edges = {}
    if not path.exists():
        return edges
    for line in path.read_text().splitlines():
        words = line.split()
        if len(words) < 3 or words[0] not in ("begin", "end"):
            continue
        figures = {"sleeps": 0.0, "stray-wakes": 0.0}
        for word in words[2:]:
            key, sep, value = word.partition("=")
            if key == "blkdom_vcpu_s":
                try:
                    figures["vcpu_s"] = [float(v) for v in value.split(",")]
                except ValueError:
                    pass
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            if key in ("uptime", "guest_cpu_s"):
                figures[key] = number
            elif key in ("sleeps", "stray-wakes"):
                figures[key] += number
        edges[(words[1], words[0])] = figures
    return edges


def add_edge_figures(row: dict, edges: dict, name: str) -> None:
    """The guest's CPU % over the job's window (in the idle job: an idle Linux domain,
    the rig's floor), blkdom's vCPU count and each vCPU's CPU % (xl vcpu-list), and its
    poller sleeps and stray wake-ups a second (its counters are refreshed every 5 s: a
    rough rate)."""
    begin, end = edges.get((name, "begin")), edges.get((name, "end"))
    if not begin or not end or "uptime" not in begin or "uptime" not in end:
        return
    wall = end["uptime"] - begin["uptime"]
    if wall <= 0:
        return
    if "guest_cpu_s" in begin and "guest_cpu_s" in end:
        row["guest_cpu_percent"] = 100.0 * (end["guest_cpu_s"] - begin["guest_cpu_s"]) / wall
    vcpus_begin, vcpus_end = begin.get("vcpu_s", []), end.get("vcpu_s", [])
    if vcpus_begin and len(vcpus_begin) == len(vcpus_end):
        row["blkdom_vcpus"] = len(vcpus_end)
        row["vcpu_percent"] = [100.0 * (b - a) / wall for a, b in zip(vcpus_begin, vcpus_end)]
    row["poller_sleeps_per_s"] = (end["sleeps"] - begin["sleeps"]) / wall
    row["poller_stray_wakes_per_s"] = (end["stray-wakes"] - begin["stray-wakes"]) / wall


def load_runs(nested: Path, config: dict, layout: Layout = DOM0) -> list:
    """One row per measured run (the prefill left out): job, backend, round, hostile's
    figures, the backend's CPU % over the window and the outer machine's view."""
    edges = read_host_threads(nested / "host-threads.txt")
    job_edges = read_edges(nested / layout.edges)
    guest_pcpu = config.get("guest_pcpu")
    guest_pcpu = int(guest_pcpu) if guest_pcpu and guest_pcpu.isdigit() else None
    backend_cpus = {backend: pcpus(config.get(key)) for backend, key in layout.pcpu_keys.items()}
    runs = []
    for path in sorted(nested.glob("fio-*.json")):
        match = layout.file_re.match(path.name)
        if not match or match[4] == "0" or (match[1], match[3]) not in layout.backends:
            continue
        try:
            data = json.loads(path.read_text().strip().splitlines()[-1])
        except (ValueError, IndexError):
            continue
        # An idle job (connected, no I/O) has no IOPS, only the backend's CPU.
        if (data.get("tool") != "hostile-load" or not data.get("ok")
                or not (data.get("iops") or data.get("idle"))):
            continue
        guest, job, disk, round_ = match[1], match[2], match[3], int(match[4])
        backend = layout.backends[(guest, disk)]
        lat = data.get("lat_us", {})
        row = {"job": job, "backend": backend, "round": round_, "iops": data["iops"],
               "mib_s": data["mib_s"], "p50_us": lat.get("p50", 0.0),
               "p99_us": lat.get("p99", 0.0), "p999_us": lat.get("p99.9", 0.0),
               "gen_cpu_us_per_io": data.get("cpu_us_per_io", 0.0),
               "notifies_per_io": data.get("notifies_per_io", 0.0),
               "queues": data.get("queues"), "ring_order": data.get("ring_order"),
               "backend_persistent": data.get("backend_persistent")}
        if "busy_us_per_io" in data:  # (hostile builds since it was added)
            row["gen_busy_us_per_io"] = data["busy_us_per_io"]
        name = f"{job}@{disk}@{round_}"
        cpu = read_cpu(nested / f"cpu-{guest}-{name}.txt")
        if cpu and cpu[1] > 0:
            row["backend_cpu_percent"] = 100.0 * cpu[0] / cpu[1]
            row["window_s"] = cpu[1]
            add_iops_per_cpu(row)
        # Recorded around blkdom's jobs only (and named alike for both backends on the
        # passed-through NVMe, where each has its own guest).
        if backend == layout.ours:
            add_edge_figures(row, job_edges, name)
        host = host_backend_percent(edges, guest, name, backend_cpus[backend])
        if host is not None:
            row["host_backend_percent"] = host
        if guest_pcpu is not None:
            derive_host(row, edges, guest, name, guest_pcpu, 0.0)
        # Requests per second of host CPU the whole rig got: the IOPS the rig would do
        # if the host were not short of cores (all of dom0, blkdom, the guest).
        if row.get("host_vcpus_cores", 0) > 0:
            row["iops_per_rig_core"] = row["iops"] / row["host_vcpus_cores"]
        runs.append(row)
    return runs


def summarise(runs: list, order=(), layout: Layout = DOM0) -> list:
    """Per job: each backend's figures over the rounds, the ratio of the medians (blkdom /
    the other) of IOPS and p50, and the pairs (same round) blkdom won on IOPS."""
    base_name, ours_backend = layout.baseline, layout.ours
    by_key = {(r["job"], r["backend"], r["round"]): r for r in runs}
    jobs = ordered_jobs(runs, order)
    summary = []
    for job in jobs:
        entry = {"job": job, "backends": {}}
        for backend in (base_name, ours_backend):
            rows = [r for (j, b, _), r in by_key.items() if j == job and b == backend]
            entry["backends"][backend] = {
                field: spread([r[field] for r in rows if field in r])
                for field in FIELDS if any(field in r for r in rows)}
        base, ours = entry["backends"][base_name], entry["backends"][ours_backend]
        for field in ("iops", "p50_us", "iops_per_rig_core"):
            if field in base and field in ours and base[field]["median"] > 0:
                entry[f"{field}_ratio"] = ours[field]["median"] / base[field]["median"]
        rounds = sorted({rnd for (j, _, rnd) in by_key if j == job})
        pairs = [(by_key[(job, ours_backend, rnd)]["iops"], by_key[(job, base_name, rnd)]["iops"])
                 for rnd in rounds if (job, ours_backend, rnd) in by_key and (job, base_name, rnd) in by_key]
        entry["pairs"] = len(pairs)
        entry["won"] = sum(1 for ours_iops, base_iops in pairs if ours_iops > base_iops)
        summary.append(entry)
    return summary


def median(figures: dict, field: str, digits: int) -> str:
    return fmt(figures[field]["median"], digits) if field in figures else "-"


def table_rows(summary: list, layout: Layout = DOM0) -> tuple:
    other, ours_name = layout.short
    pair = f"{other} / {ours_name}"
    header = ["job", f"{other} IOPS", f"{ours_name} IOPS", f"{ours_name}/{other}", "won",
              f"IOPS per backend CPU {pair}",
              f"p50 us {pair}", f"p99 us {pair}", f"p99.9 us {pair}",
              f"backend CPU % {pair}", f"host CPU % of backend pCPUs {pair}",
              f"generator CPU / busy us/IO {pair}", f"events/request {pair}",
              f"guest vCPU waited % {pair}", f"rig's vCPUs host cores {pair}",
              f"IOPS per rig host core {pair} (ratio)",
              "guest domain CPU % (blkdom's jobs)", "blkdom poller sleeps/stray wakes per s"]
    base_name, ours_backend = layout.baseline, layout.ours
    rows = []
    for entry in summary:
        base, ours = entry["backends"][base_name], entry["backends"][ours_backend]

        def both(field, digits):
            return f"{median(base, field, digits)} / {median(ours, field, digits)}"
        ratio = entry.get("iops_ratio")
        p50 = entry.get("p50_us_ratio")
        rows.append([
            entry["job"], fmt_spread(base.get("iops")), fmt_spread(ours.get("iops")),
            (f"{ratio:.2f}x" if ratio is not None else "-")
            + (f" (p50 {p50:.2f}x)" if p50 is not None else ""),
            f"{entry['won']}/{entry['pairs']}", both("iops_per_cpu", 0),
            both("p50_us", 0), both("p99_us", 0), both("p999_us", 0),
            both("backend_cpu_percent", 0), both("host_backend_percent", 0),
            f"{median(base, 'gen_cpu_us_per_io', 0)}/{median(base, 'gen_busy_us_per_io', 1)} / "
            f"{median(ours, 'gen_cpu_us_per_io', 0)}/{median(ours, 'gen_busy_us_per_io', 1)}",
            both("notifies_per_io", 3), both("host_guest_vcpu_wait_percent", 0),
            both("host_vcpus_cores", 2),
            both("iops_per_rig_core", 0) + (f" ({entry['iops_per_rig_core_ratio']:.2f}x)"
                                             if "iops_per_rig_core_ratio" in entry else ""),
            median(ours, "guest_cpu_percent", 1),
            f"{median(ours, 'poller_sleeps_per_s', 0)}/"
            f"{median(ours, 'poller_stray_wakes_per_s', 0)}",
        ])
    return header, rows


def ratio_lines(summary: list, layout: Layout = DOM0) -> list:
    """`backend-ratio <job> blkdom/<other>=<x.xx> iops=<b>/<o> cpu=<b%>/<o%>`: other is
    linux-dom0 or, on the passed-through NVMe, linux-dd-pt."""
    base_name, ours_backend = layout.baseline, layout.ours
    lines = []
    for entry in summary:
        base, ours = entry["backends"][base_name], entry["backends"][ours_backend]
        if "iops_ratio" not in entry:
            continue

        def cpu(figures):
            return (f"{figures['backend_cpu_percent']['median']:.0f}%"
                    if "backend_cpu_percent" in figures else "-")
        lines.append(
            f"backend-ratio {entry['job']} blkdom/{base_name}={entry['iops_ratio']:.2f} "
            f"iops={ours['iops']['median']:.0f}/{base['iops']['median']:.0f} "
            f"cpu={cpu(ours)}/{cpu(base)}")
    return lines


def idle_lines(runs: list, summary: list, layout: Layout = DOM0) -> list:
    """Per idle job (connected, no I/O): blkdom's CPU in % of all its vCPUs (the goal:
    under 1% in every round) beside dom0's in % of its one vCPU, medians (min-max) over
    the rounds, and each round's per-vCPU figures:
    `backend-idle <job> blkdom=<x.xx>% of <n> vCPUs (<min>-<max>) dom0=<y.yy>% ...
    window=<s>s goal<1%=met|not-met (blkdom per vCPU %: round 1: a/b; ...)`
    """
    base_name, ours_backend = layout.baseline, layout.ours
    lines = []
    for entry in summary:
        job = entry["job"]
        ours = [r for r in runs if r["job"] == job and r["backend"] == ours_backend
                and r.get("blkdom_vcpus") and "backend_cpu_percent" in r]
        if not job.startswith("lg-idle-") or not ours:
            continue
        share = spread([r["backend_cpu_percent"] / r["blkdom_vcpus"] for r in ours])
        base = entry["backends"][base_name].get("backend_cpu_percent")
        rounds = "; ".join(
            f"round {r['round']}: " + "/".join(f"{p:.1f}" for p in r["vcpu_percent"])
            for r in sorted(ours, key=lambda r: r["round"]))
        # Every row with a backend CPU figure has its window (load_runs sets both).
        window = spread([r["window_s"] for r in ours])
        lines.append(
            f"backend-idle {job} blkdom={share['median']:.2f}% of {ours[0]['blkdom_vcpus']} "
            f"vCPUs ({share['min']:.2f}-{share['max']:.2f}) dom0="
            + (f"{base['median']:.2f}% ({base['min']:.2f}-{base['max']:.2f})" if base else "-")
            + f" window={window['median']:.0f}s"
            + f" goal<1%={'met' if share['max'] < 1.0 else 'not-met'}"
            + f" (blkdom per vCPU %: {rounds})")
    return lines


def render(summary: list, config: dict, markdown: bool, runs=(), layout: Layout = DOM0) -> str:
    header, rows = table_rows(summary, layout)
    what = layout.what.format(rounds=config.get("rounds", "?"),
                              runtime=config.get("runtime", "?"))
    title = (f"Backend at its limit (hostile load): {what}; "
             "medians (min-max); ratio of the medians; won = pairs where blkdom served more"
             + blkdom_cmdline_note(config))
    table = markdown_table(header, rows) if markdown else text_table(header, rows)
    lines = ratio_lines(summary, layout) + idle_lines(list(runs), summary, layout)
    return title + ":\n\n" + table + "\n\n" + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nested", type=Path, default=REPO / "results/xen/bench-backend")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--json", type=Path, help="where to write the figures")
    args = parser.parse_args(argv)
    layout = layout_of(args.nested)
    config = read_config(args.nested, layout)
    runs = load_runs(args.nested, config, layout)
    if not runs:
        print(f"no bench-backend results in {args.nested}", file=sys.stderr)
        return 1
    summary = summarise(runs, config.get("jobs", "").split(","), layout)
    if not any(entry["pairs"] for entry in summary):
        print(f"no complete pair in {args.nested}", file=sys.stderr)
        return 1
    out = args.json or args.nested / "backend.json"
    out.write_text(json.dumps({"config": config, "runs": runs, "summary": summary},
                              indent=1, sort_keys=True) + "\n")
    print(render(summary, config, args.markdown, runs, layout), end="")
    print(f"json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
