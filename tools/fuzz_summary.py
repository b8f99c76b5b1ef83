#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""The summary of a tools/fuzz.sh run kept with FUZZ_RESULTS=dir (make fuzz-long).

  tools/fuzz_summary.py DIR

Reads DIR/status.txt (target and exit status, one a line), DIR/<target>.log (libFuzzer's
output with -print_final_stats=1) and DIR/run.txt, prints one line per target (runs,
executions per second, coverage: edges and features, corpus, crash) and writes them to
DIR/summary.txt and DIR/summary.json.
"""
import json
import pathlib
import re
import sys

STATUS_LINE = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
FINAL_STAT = re.compile(r"^stat::(\w+):\s+(\d+)")


def target_summary(name, status, log):
    """What one target's log says."""
    summary = {"target": name, "exit": status, "runs": None, "exec_per_sec": None,
               "cov": None, "ft": None, "corpus": None, "new_units": None,
               "peak_rss_mb": None, "crash": None, "artifact": None}
    lines = log.splitlines()
    for line in lines:
        m = STATUS_LINE.match(line)
        if m:
            summary["cov"], summary["ft"], summary["corpus"] = map(int, m.groups()[1:])
        m = FINAL_STAT.match(line)
        if m:
            key = {"number_of_executed_units": "runs",
                   "average_exec_per_sec": "exec_per_sec",
                   "new_units_added": "new_units",
                   "peak_rss_mb": "peak_rss_mb"}.get(m.group(1))
            if key:
                summary[key] = int(m.group(2))
        m = re.search(r"Test unit written to (\S+)", line)
        if m:
            summary["artifact"] = m.group(1)
    # A Rust panic: the location line and the message after it.
    for i, line in enumerate(lines):
        if " panicked at " in line:
            summary["crash"] = " ".join(lines[i:i + 2]).strip()
            break
    else:
        for line in lines:
            if "ERROR: libFuzzer:" in line:
                summary["crash"] = line.split("ERROR: ", 1)[1].strip()
                break
    return summary


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = pathlib.Path(argv[1])
    run = {}
    if (out / "run.txt").exists():
        for line in (out / "run.txt").read_text().splitlines():
            key, _, value = line.partition(" ")
            run[key] = value
    targets = []
    for line in (out / "status.txt").read_text().splitlines():
        name, status = line.split()
        log = out / f"{name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        targets.append(target_summary(name, int(status), text))

    def show(value):
        return "-" if value is None else str(value)

    header = f"{'target':<14} {'runs':>12} {'exec/s':>8} {'cov':>6} {'ft':>7} {'corpus':>7}  result"
    rows = [f"fuzz run: commit {run.get('commit', '?')}, {run.get('seconds', '?')} s per "
            f"target, started {run.get('started', '?')}", header]
    for t in targets:
        result = "ok" if t["exit"] == 0 else f"FAILED: {t['crash'] or 'exit ' + str(t['exit'])}"
        if t["artifact"]:
            result += f" ({t['artifact']})"
        rows.append(f"{t['target']:<14} {show(t['runs']):>12} {show(t['exec_per_sec']):>8} "
                    f"{show(t['cov']):>6} {show(t['ft']):>7} {show(t['corpus']):>7}  {result}")
    text = "\n".join(rows) + "\n"
    (out / "summary.txt").write_text(text)
    (out / "summary.json").write_text(json.dumps({**run, "targets": targets}, indent=2) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
