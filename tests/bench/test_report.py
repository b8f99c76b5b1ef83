#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Host tests of tools/bench/report.py against fixture results (no Xen needed):

    python3 -m unittest discover -s tests/bench -v

A nested run is written into a temporary directory in the layout tests/xen/bench leaves
(round-N/<system>/ with fio JSON, cpu-*.txt, counters-*.txt and the guest console), with
known figures, and the report's numbers, tables, JSON and plot are checked against them.
fixtures/ holds one fio JSON exactly as the guest's fio 3.33 wrote it; the reader of fio
JSON itself (tools/fio_results.py) is tested in test_fio_results.py.
"""

import io
import json
import statistics
import sys
import tempfile
import re
import unittest
from contextlib import redirect_stdout
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools" / "bench"))
import report  # noqa: E402  (path set up above)

SETTLE = 6
RAMP = 1
RUNTIME = 10


def fio_json(iops: float, rw: str = "read", block: int = 4096, p50_ns: int = 400_000,
             p99_ns: int = 2_000_000) -> dict:
    """The part of fio's JSON output the report reads (group_reporting: one job)."""
    def side(active: bool) -> dict:
        ios = int(iops * RUNTIME) if active else 0
        return {"io_bytes": ios * block, "iops": iops if active else 0,
                "bw": iops * block / 1024 if active else 0, "total_ios": ios,
                "runtime": RUNTIME * 1000 if active else 0,
                "clat_ns": {"mean": p50_ns * 1.1,
                            "percentile": {"50.000000": p50_ns, "99.000000": p99_ns}}}
    return {"jobs": [{"jobname": "x", "error": 0, "usr_cpu": 1.5, "sys_cpu": 8.5,
                      "read": side(rw == "read"), "write": side(rw == "write")}]}


# (job, rw, block size, IOPS by (system, round))
JOBS = [
    ("fio-write-1m-qd4-fill", "write", 1 << 20,
     {("linux-dom0", 1): 100, ("linux-dom0", 2): 110, ("blkdom", 1): 90, ("blkdom", 2): 95}),
    ("fio-randread-4k-qd32-1j", "read", 4096,
     {("linux-dom0", 1): 700, ("linux-dom0", 2): 800, ("blkdom", 1): 1400, ("blkdom", 2): 1800}),
    ("fio-randread-4k-qd1-1j", "read", 4096,
     {("linux-dom0", 1): 500, ("linux-dom0", 2): 500, ("blkdom", 1): 250, ("blkdom", 2): 250}),
    ("fio-randread-512-qd32-1j", "read", 512,
     {("linux-dom0", 1): 900, ("linux-dom0", 2): 1000, ("blkdom", 1): 2000, ("blkdom", 2): 2200}),
    ("fio-randread-1m-qd32-1j", "read", 1 << 20,
     {("linux-dom0", 1): 90, ("linux-dom0", 2): 100, ("blkdom", 1): 120, ("blkdom", 2): 130}),
]
GUESTS = {"linux-dom0": "fio-dom0", "linux-dd": "fio-linuxdd", "blkdom": "fio-blkdom",
          "linux-dd-pt": "fio-ddpt", "blkdom-pt": "fio-blkdompt"}
# The systems without figures in JOBS: (system whose figures they scale, numerator,
# denominator).
SCALED = {"linux-dd": ("linux-dom0", 1, 2), "linux-dd-pt": ("linux-dom0", 1, 4),
          "blkdom-pt": ("blkdom", 3, 4)}
ALL_SYSTEMS = ("linux-dom0", "linux-dd", "blkdom", "linux-dd-pt", "blkdom-pt")


def write_run(root: Path, rounds: int = 2, systems=("linux-dom0", "blkdom")) -> None:
    """A tests/xen/bench result directory with the figures of JOBS. The Linux driver
    domains (linux-dd, linux-dd-pt) get a half and a quarter of dom0's IOPS and no
    counters (they live in their sysfs); blkdom-pt gets 3/4 of blkdom's, and counters."""
    (root / "bench-config.txt").write_text(
        f"repeats={rounds} runtime={RUNTIME} settle={SETTLE} ramp={RAMP} guest_pcpu=3\n"
        f"jobs={','.join(j[0] for j in JOBS)}\n")
    (root / "xl-info.txt").write_text("nr_cpus                : 4\nxen_version            : 4.17.5\n")
    host_threads = []
    for round_no in range(1, rounds + 1):
        for system in systems:
            guest = f"{GUESTS[system]}-r{round_no}"
            directory = root / f"round-{round_no}" / system
            directory.mkdir(parents=True)
            counters, console = [], ["rig-guest: disk ready"]
            total = {"reads": 0, "writes": 0, "map": 0, "unmap": 0, "notify": 0,
                     "loops": 0, "sleeps": 0, "irqs": 1000}
            for job, rw, block, figures in JOBS:
                if system in SCALED:
                    source, num, den = SCALED[system]
                    iops = figures[(source, round_no)] * num // den
                else:
                    iops = figures[(system, round_no)]
                p50 = 1_000_000 // iops * 1000 if "qd1-" in job else 400_000
                (directory / f"fio-{guest}-{job}.json").write_text(
                    json.dumps(fio_json(iops, rw, block, p50_ns=p50)))
                # Backend CPU: 10% of the busy time, plus nothing during the settle.
                wall = RUNTIME + RAMP + SETTLE
                (directory / f"cpu-{guest}-{job}.txt").write_text(
                    f"backend={system} cpu_s={0.1 * (wall - SETTLE):.1f} wall_s={wall:.2f}\n")
                # The outer machine: 11 s busy (+ the settle); the guest's vCPU thread
                # (pCPU 3) runs 80% and waits 10% of it under blkdom, 90%/1% otherwise;
                # blkdom's poller thread (pCPU 1) runs 99%; QEMU's main thread 5%; two
                # host cores busy 1.5 (blkdom) or 1.0.
                ours = system in ("blkdom", "blkdom-pt")
                busy = RUNTIME + RAMP
                guest_run, guest_wait = (0.8, 0.1) if ours else (0.9, 0.01)
                poller_run = 0.99 if ours else 0.0
                start = 100.0 * len(host_threads)
                for edge, at, share in (("BEGIN", start, 0), ("END", start + wall, 1)):
                    ns = int(share * busy * 1e9)
                    host_cpu = ",".join(str(v) for v in (
                        1000 + share * int(busy * (150 if ours else 100)
                                           + SETTLE * (50 if ours else 0)), 0, 0,
                        5000 + share * int(busy * (50 if ours else 100)
                                           + SETTLE * (150 if ours else 200)),
                        0, 0, 0, 0, 0, 0))
                    # A CR after the job's name, as the guest's console line had it.
                    host_threads.append(
                        f"{edge} {guest} {job}\r host_s={at:.1f} "
                        f"thread:qemu-system-x86={int(ns * 0.05)},0 "
                        f"thread:CPU_1/TCG={int(ns * poller_run)},0 "
                        f"thread:CPU_3/TCG={int(ns * guest_run)},{int(ns * guest_wait)} "
                        f"host_cpu={host_cpu}")
                requests = iops * (RUNTIME + RAMP)
                console.append(f"rig-guest: irq before {job} {total['irqs']}\r")
                before = dict(total)
                total["reads" if rw == "read" else "writes"] += requests
                total["map"] += requests // 4
                total["unmap"] += requests // 4
                total["notify"] += requests // 2
                total["loops"] += requests * 3
                total["sleeps"] += requests // 10
                total["irqs"] += requests // 2
                console.append(f"rig-guest: irq after {job} {total['irqs'] - 7}")
                console.append(f"rig-guest: irq after {job} {total['irqs']}")
                for edge, values in (("begin", before), ("end", total)):
                    if system == "linux-dom0":
                        counters.append(
                            f"{edge} {job} linux-vbd uptime=50.0 rd_req={values['reads']} "
                            f"wr_req={values['writes']} oo_req=0 f_req=0 ds_req=0")
                    elif system in ("blkdom", "blkdom-pt"):
                        counters.append(
                            f"{edge} {job} blkdom-stats uptime=50.0 queues=1 oo_req=0 "
                            f"rd_req={values['reads']} wr_req={values['writes']} f_req=0 "
                            f"ds_req=0 grants-mapped=300 map-batches={values['map']} "
                            f"unmap-batches={values['unmap']} "
                            f"notifications={values['notify']} events={values['notify'] // 2}")
                        counters.append(
                            f"{edge} {job} blkdom-pollers uptime=50.0 vcpu0: rings=0 loops=5 "
                            f"busy=1 sleeps=2 notifications=3 notify-ns=999999 "
                            f"vcpu1: rings=1 loops={values['loops']} "
                            f"busy=9 sleeps={values['sleeps']} "
                            f"stray-wakes={values['sleeps'] // 2} "
                            f"notifications={values['notify']} "
                            f"notify-ns={values['notify'] * 40000}")
            (directory / f"counters-{guest}.txt").write_text("\n".join(counters) + "\n")
            (directory / f"guest-{guest}.log").write_text("\n".join(console) + "\n")
    (root / "host-threads.txt").write_text("\n".join(host_threads) + "\n")


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.nested = self.root / "xen-bench"
        self.nested.mkdir()
        write_run(self.nested)

    def tearDown(self):
        self.tmp.cleanup()

    def summary_of(self, job: str) -> dict:
        data = report.load_nested(self.nested)
        return {e["job"]: e for e in report.summarise(data["runs"])}[job]

    def test_every_measurement_is_read(self):
        data = report.load_nested(self.nested)
        self.assertEqual(len(data["runs"]), 2 * 2 * len(JOBS))
        self.assertEqual(data["config"]["settle"], str(SETTLE))
        self.assertEqual(data["xen"]["xen_version"], "4.17.5")
        row = next(r for r in data["runs"] if r["system"] == "blkdom" and r["round"] == 2
                   and r["job"] == "fio-randread-4k-qd32-1j")
        self.assertEqual(row["iops"], 1800)
        self.assertAlmostEqual(row["mib_s"], 1800 * 4096 / 1024 / 1024)

    def test_median_min_max_and_ratio(self):
        entry = self.summary_of("fio-randread-4k-qd32-1j")
        linux = entry["systems"]["linux-dom0"]["iops"]
        ours = entry["systems"]["blkdom"]["iops"]
        self.assertEqual((linux["median"], linux["min"], linux["max"]), (750, 700, 800))
        self.assertEqual((ours["median"], ours["min"], ours["max"]), (1600, 1400, 1800))
        self.assertAlmostEqual(entry["ratios"]["blkdom/linux-dom0"]["iops"], 1600 / 750)

    def test_latency_percentiles(self):
        entry = self.summary_of("fio-randread-4k-qd1-1j")
        self.assertAlmostEqual(entry["systems"]["linux-dom0"]["p50_us"]["median"], 2000)
        self.assertAlmostEqual(entry["systems"]["blkdom"]["p50_us"]["median"], 4000)
        self.assertAlmostEqual(entry["ratios"]["blkdom/linux-dom0"]["p50_us"], 2.0)

    def test_backend_cpu_excludes_the_settle(self):
        entry = self.summary_of("fio-randread-4k-qd32-1j")
        self.assertAlmostEqual(entry["systems"]["blkdom"]["backend_cpu_percent"]["median"], 10.0)

    def test_iops_per_backend_cpu_beside_the_iops(self):
        # 1,600 IOPS at 10% of a backend vCPU: 16,000 a second per backend CPU.
        entry = self.summary_of("fio-randread-4k-qd32-1j")
        self.assertAlmostEqual(entry["systems"]["blkdom"]["iops_per_cpu"]["median"], 16_000)
        self.assertAlmostEqual(entry["systems"]["linux-dom0"]["iops_per_cpu"]["median"], 7_500)
        header, rows = report.main_table([entry])
        column = header.index("blkdom IOPS per backend CPU")
        self.assertEqual(rows[0][column], "16,000")
        # No CPU figure (or none used): no figure per CPU, not a division by zero.
        row = {"iops": 100.0, "backend_cpu_percent": 0.0}
        report.add_iops_per_cpu(row)
        self.assertNotIn("iops_per_cpu", row)

    def test_host_threads_per_job_without_the_settle(self):
        entry = self.summary_of("fio-randread-4k-qd32-1j")
        ours, linux = entry["systems"]["blkdom"], entry["systems"]["linux-dom0"]
        self.assertAlmostEqual(ours["host_guest_vcpu_run_percent"]["median"], 80.0, places=1)
        self.assertAlmostEqual(ours["host_guest_vcpu_wait_percent"]["median"], 10.0, places=1)
        self.assertAlmostEqual(linux["host_guest_vcpu_wait_percent"]["median"], 1.0, places=1)
        # 80% of each busy second over 1,600 IOPS (blkdom's median), 90% over 750.
        self.assertAlmostEqual(ours["host_guest_vcpu_us_per_io"]["median"],
                               statistics.median([0.8e6 / 1400, 0.8e6 / 1800]), places=1)
        self.assertAlmostEqual(linux["host_guest_vcpu_us_per_io"]["median"],
                               statistics.median([0.9e6 / 700, 0.9e6 / 800]), places=1)
        # vCPU threads only (QEMU's main thread left out): guest + poller.
        self.assertAlmostEqual(ours["host_vcpus_cores"]["median"], 1.79, places=2)
        self.assertAlmostEqual(linux["host_vcpus_cores"]["median"], 0.9, places=2)
        # The host's cores over the whole job, settle included (the host does not idle
        # with the guest): 11 s at 1.5 (or 1.0) + 6 s at 0.5 (or 0), over 17 s.
        self.assertAlmostEqual(ours["host_busy_cores"]["median"], (16.5 + 3) / 17, places=2)
        self.assertAlmostEqual(linux["host_busy_cores"]["median"], 11 / 17, places=2)

    def test_no_host_figures_for_the_prefill(self):
        entry = self.summary_of("fio-write-1m-qd4-fill")
        self.assertNotIn("host_vcpus_cores", entry["systems"]["blkdom"])

    def test_host_table_only_when_host_threads_were_recorded(self):
        data = report.load_nested(self.nested)
        summary = report.summarise(data["runs"])
        header, rows = report.host_table(summary)
        self.assertIn("guest vCPU run/wait % blkdom", header)
        row = next(r for r in rows if r[0] == summary[1]["description"])
        self.assertEqual(row[1:3], ["90/1", "80/10"])
        self.assertEqual(row[3:5], ["1,205", "508"])
        (self.nested / "host-threads.txt").unlink()
        data = report.load_nested(self.nested)
        self.assertIsNone(report.host_table(report.summarise(data["runs"])))

    def test_the_title_gives_blkdoms_command_line_when_one_was_set(self):
        def title():
            data = report.load_nested(self.nested)
            summary = report.summarise(data["runs"])
            text = report.render_tables({"nested": {**data, "summary": summary}},
                                        markdown=False)
            return text.splitlines()[0]
        self.assertNotIn("command line", title())
        config = self.nested / "bench-config.txt"
        config.write_text(config.read_text() + "blkdom=\n")
        self.assertNotIn("command line", title())
        config.write_text(config.read_text() + "blkdom=poll.idle=pause:notify.hold-us=0\n")
        self.assertIn("; blkdom's command line: poll.idle=pause notify.hold-us=0;", title())

    def test_host_threads_lines_cut_short_are_skipped(self):
        path = self.nested / "host-threads.txt"
        lines = path.read_bytes().decode().rstrip("\n").split("\n")
        # A truncated last line (the run was killed mid-write) and a mangled one.
        path.write_text("\n".join(lines[:-1] + [lines[-1][:40], "END x y host_s=1 thread:a=b"])
                        + "\n")
        edges = report.read_host_threads(path)
        self.assertEqual(len(edges), len(lines) - 1)

    def test_costs_from_counter_deltas(self):
        entry = self.summary_of("fio-randread-4k-qd32-1j")
        ours = entry["systems"]["blkdom"]
        # map/4 + unmap/4 + notify/2 per request.
        self.assertAlmostEqual(ours["hypercalls_per_request"]["median"], 1.0, places=2)
        self.assertAlmostEqual(ours["notifications_per_s"]["median"], 1600 / 2, delta=1)
        self.assertAlmostEqual(ours["events_per_s"]["median"], 1600 / 4, delta=1)
        self.assertAlmostEqual(ours["poller_loops_per_request"]["median"], 3.0, places=2)
        self.assertAlmostEqual(ours["poller_sleeps_per_s"]["median"], 160, delta=1)
        # Half of the sleeps ended in a wake-up for another vCPU.
        self.assertAlmostEqual(ours["poller_stray_wakes_per_s"]["median"], 80, delta=1)
        # 40 us per send on vCPU 1; vCPU 0's sends did not change over the job.
        self.assertAlmostEqual(ours["notify_us_per_send"]["median"], 40.0, places=2)
        # rd_req, wr_req, f_req and ds_req, named as Linux blkback's: the same sum for both.
        row = next(r for r in report.load_nested(self.nested)["runs"]
                   if r["system"] == "blkdom" and r["round"] == 1
                   and r["job"] == "fio-randread-4k-qd32-1j")
        self.assertEqual(row["backend_requests"], 1400 * (RUNTIME + RAMP))
        self.assertEqual(row["backend_oo_req"], 0)
        # Guest interrupts: the last "after" line counts; per second over runtime + ramp.
        linux = entry["systems"]["linux-dom0"]
        self.assertAlmostEqual(linux["guest_irqs_per_s"]["median"], 750 / 2, delta=1)
        self.assertAlmostEqual(linux["guest_irqs_per_io"]["median"], 0.5, places=2)

    def test_sends_that_went_with_a_sleep_are_not_hypercalls_of_their_own(self):
        # Half of vCPU 1's sends went with its sleep (sends-with-sleep): they are no
        # hypercall of their own, and the time it spent sending is the other half's.
        for path in self.nested.glob("round-*/blkdom/counters-*"):
            path.write_text(re.sub(
                r"(vcpu1: .*notifications=(\d+) notify-ns=\d+)",
                lambda m: f"{m[1]} sends-with-sleep={int(m[2]) // 2}", path.read_text()))
        ours = self.summary_of("fio-randread-4k-qd32-1j")["systems"]["blkdom"]
        # map/4 + unmap/4 + (notify/2 - notify/4) per request.
        self.assertAlmostEqual(ours["hypercalls_per_request"]["median"], 0.75, places=2)
        self.assertAlmostEqual(ours["notify_us_per_send"]["median"], 80.0, places=1)
        self.assertAlmostEqual(ours["notifications_per_s"]["median"], 1600 / 2, delta=1)

    def test_blkdom_stats_recorded_under_the_old_names_give_the_same_costs(self):
        renamed = {"oo_req=": "device-busy=", "rd_req=": "reads=", "wr_req=": "writes=",
                   "f_req=": "flushes=", "ds_req=": "discards="}
        for path in self.nested.glob("round-*/blkdom/counters-*"):
            text = path.read_text()
            for new_name, old_name in renamed.items():
                text = text.replace(new_name, old_name)
            self.assertNotIn("rd_req", text)
            path.write_text(text)
        ours = self.summary_of("fio-randread-4k-qd32-1j")["systems"]["blkdom"]
        self.assertAlmostEqual(ours["hypercalls_per_request"]["median"], 1.0, places=2)
        row = next(r for r in report.load_nested(self.nested)["runs"]
                   if r["system"] == "blkdom" and r["round"] == 1
                   and r["job"] == "fio-randread-4k-qd32-1j")
        self.assertEqual(row["backend_requests"], 1400 * (RUNTIME + RAMP))
        self.assertIn("rd_req", row["counters_blkdom_stats"])
        self.assertNotIn("reads", row["counters_blkdom_stats"])

    def test_jobs_in_list_order(self):
        data = report.load_nested(self.nested)
        reversed_list = [job for job, _, _, _ in reversed(JOBS)]
        listed = [e["job"] for e in report.summarise(data["runs"], reversed_list)]
        self.assertEqual(listed, reversed_list)
        # Without the list: the prefill, then the other jobs, then the sweep by size.
        unlisted = [e["job"] for e in report.summarise(data["runs"])]
        self.assertEqual(unlisted, ["fio-write-1m-qd4-fill", "fio-randread-4k-qd32-1j",
                                    "fio-randread-4k-qd1-1j", "fio-randread-512-qd32-1j",
                                    "fio-randread-1m-qd32-1j"])

    def test_missing_system_or_counters_still_reports(self):
        for path in self.nested.glob("round-2/blkdom/*"):
            path.unlink()
        for path in self.nested.glob("round-*/*/counters-*"):
            path.unlink()
        entry = self.summary_of("fio-randread-4k-qd32-1j")
        self.assertEqual(entry["systems"]["blkdom"]["iops"]["n"], 1)
        self.assertNotIn("hypercalls_per_request", entry["systems"]["blkdom"])
        text = report.render_tables(
            {"nested": {**report.load_nested(self.nested),
                        "summary": report.summarise(report.load_nested(self.nested)["runs"])}},
            markdown=False)
        self.assertIn("1,400", text)

    def test_engine_rows_show_the_kernel_ring_when_measured(self):
        row = {"ring_order": 4, "queues": 2, "persistent_grants": True,
               "threaded_req_per_s": 1e6, "lockstep_req_per_s_per_core": 5e6,
               "plain_req_per_s_per_core": 2e7, "lockstep_ns_per_req": 200.0,
               "plain_ns_per_req": 50.0, "grant_batches_per_req": 0.0}
        self.assertEqual(report.engine_rows({"results": [row]})[0][8:10], ["-", "-"])
        row.update(kernel_req_per_s_per_core=2.5e7, kernel_ns_per_req=40.0)
        self.assertEqual(report.engine_rows({"results": [row]})[0][8:10],
                         ["25,000,000", "40.0"])
        self.assertEqual(len(report.ENGINE_HEADER), len(report.engine_rows({"results": [row]})[0]))

    def test_main_writes_json_tables_and_plot(self):
        engine = self.root / "engine.json"
        engine.write_text(json.dumps({"benchmark": "blkback-engine", "results": [
            {"ring_order": 0, "queues": 1, "persistent_grants": False,
             "threaded_req_per_s": 1e6, "lockstep_req_per_s_per_core": 5e6,
             "plain_req_per_s_per_core": 1e7, "lockstep_ns_per_req": 200.0,
             "plain_ns_per_req": 100.0, "grant_batches_per_req": 0.25}]}))
        spread = {"median": 45.0, "min": 41.0, "max": 60.0}
        (self.root / "engine-scale.json").write_text(json.dumps({
            "benchmark": "blkback-engine-scale", "results": [
                {"ring_order": 4, "persistent_grants": True, "sharing": "shared",
                 "pollers": 8, "aggregate_req_per_s": {"median": 2e7, "min": 1e7, "max": 3e7},
                 "cores_used": 1.5, "wall_efficiency": 0.9, "thread_cpu_ns_per_req": spread,
                 "cpu_efficiency": 1.0, "engine_ns_per_req": spread, "dropped_polls": 0.01}]}))
        svg = self.root / "plot.svg"
        out = io.StringIO()
        with redirect_stdout(out):
            status = report.main(["--nested", str(self.nested), "--engine", str(engine),
                                  "--out-root", str(self.root / "out"), "--svg", str(svg),
                                  "--markdown"])
        self.assertEqual(status, 0)
        printed = out.getvalue()
        self.assertIn("| job | Linux dom0 IOPS | blkdom IOPS | blkdom/Linux dom0 |", printed)
        self.assertIn("| randread 4K QD32 | 750 (700–800) | 1,600 (1,400–1,800) | 2.13x |",
                      printed)
        self.assertIn("| 2,000/2,000, 4,000/2,000 |", printed)
        self.assertIn("| 0 | 1 | off |", printed)
        self.assertIn("| 4 | on | shared | 8 | 20,000,000 (10,000,000–30,000,000) | 1.50 | 90% |"
                      " 45.0 (41.0–60.0) | 100% | 45.0 (41.0–60.0) |", printed)
        written = list((self.root / "out").glob("*/bench.json"))
        self.assertEqual(len(written), 1)
        saved = json.loads(written[0].read_text())
        self.assertEqual(saved["engine"]["results"][0]["plain_ns_per_req"], 100.0)
        self.assertEqual(saved["engine_scale"]["results"][0]["pollers"], 8)
        self.assertEqual(len(saved["nested"]["runs"]), 2 * 2 * len(JOBS))
        self.assertIn("nproc", saved["machine"])
        self.assertTrue(saved["commit"])
        plot = svg.read_text()
        self.assertTrue(plot.startswith("<svg"))
        # One line per system, one point per swept block size (512, 4K, 1M).
        self.assertEqual(plot.count("<polyline"), 2)
        self.assertEqual(plot.count("<circle"), 6)
        self.assertIn("512", plot)
        self.assertIn("1M", plot)

    def test_third_system(self):
        nested = self.root / "three"
        nested.mkdir()
        write_run(nested, systems=("linux-dom0", "linux-dd", "blkdom"))
        data = report.load_nested(nested)
        entry = {e["job"]: e for e in report.summarise(data["runs"])}["fio-randread-4k-qd32-1j"]
        self.assertEqual(entry["systems"]["linux-dd"]["iops"]["median"], 375)
        self.assertAlmostEqual(entry["ratios"]["blkdom/linux-dd"]["iops"], 1600 / 375)
        self.assertAlmostEqual(entry["ratios"]["blkdom/linux-dom0"]["iops"], 1600 / 750)
        self.assertNotIn("hypercalls_per_request", entry["systems"]["linux-dd"])
        header, rows = report.main_table(report.summarise(data["runs"]))
        self.assertEqual(header[1:6], ["Linux dom0 IOPS", "Linux dd IOPS", "blkdom IOPS",
                                       "blkdom/Linux dom0", "blkdom/Linux dd"])
        self.assertEqual(rows[1][4:6], ["2.13x", "4.27x"])
        points = report.sweep_points(report.summarise(data["runs"]))
        self.assertEqual(sorted(points), ["blkdom", "linux-dd", "linux-dom0"])
        self.assertEqual(report.svg_plot(points, "t", "s").count("<polyline"), 3)

    def test_five_systems(self):
        """The passthrough pair beside the RAM-disk systems: its own ratio, its columns."""
        nested = self.root / "five"
        nested.mkdir()
        write_run(nested, systems=ALL_SYSTEMS)
        data = report.load_nested(nested)
        self.assertEqual(len(data["runs"]), 2 * 5 * len(JOBS))
        summary = report.summarise(data["runs"])
        entry = {e["job"]: e for e in summary}["fio-randread-4k-qd32-1j"]
        self.assertEqual(sorted(entry["systems"]), sorted(ALL_SYSTEMS))
        self.assertEqual(sorted(entry["ratios"]),
                         ["blkdom-pt/linux-dd-pt", "blkdom/linux-dd", "blkdom/linux-dom0"])
        # linux-dd-pt: 700/4, 800/4; blkdom-pt: 1400 x 3/4, 1800 x 3/4.
        self.assertEqual(entry["systems"]["linux-dd-pt"]["iops"]["median"], 187.5)
        self.assertEqual(entry["systems"]["blkdom-pt"]["iops"]["median"], 1200)
        self.assertAlmostEqual(entry["ratios"]["blkdom-pt/linux-dd-pt"]["iops"], 1200 / 187.5)
        self.assertAlmostEqual(entry["ratios"]["blkdom/linux-dd"]["iops"], 1600 / 375)
        self.assertAlmostEqual(entry["ratios"]["blkdom/linux-dom0"]["iops"], 1600 / 750)
        # blkdom-pt's counters are read as blkdom's; Linux's in a driver domain are absent.
        self.assertAlmostEqual(
            entry["systems"]["blkdom-pt"]["hypercalls_per_request"]["median"], 1.0, places=2)
        self.assertNotIn("hypercalls_per_request", entry["systems"]["linux-dd-pt"])
        self.assertIn("backend_cpu_percent", entry["systems"]["linux-dd-pt"])

        header, rows = report.main_table(summary)
        self.assertEqual(header[1:9], ["Linux dom0 IOPS", "Linux dd IOPS", "blkdom IOPS",
                                       "Linux dd-pt IOPS", "blkdom-pt IOPS",
                                       "blkdom/Linux dom0", "blkdom/Linux dd",
                                       "blkdom-pt/Linux dd-pt"])
        self.assertEqual(header[9:14], [f"{s} IOPS per backend CPU" for s in (
            "Linux dom0", "Linux dd", "blkdom", "Linux dd-pt", "blkdom-pt")])
        self.assertEqual(header[14:19], [f"{s} MiB/s" for s in (
            "Linux dom0", "Linux dd", "blkdom", "Linux dd-pt", "blkdom-pt")])
        self.assertEqual(rows[1][4:9], ["188 (175–200)", "1,200 (1,050–1,350)",
                                        "2.13x", "4.27x", "6.40x"])
        self.assertEqual(len(rows[1]), len(header))
        cost_header, cost_rows = report.cost_table(summary)
        self.assertEqual(cost_header[1:3], ["blkdom hypercalls/req", "blkdom-pt hypercalls/req"])
        self.assertIn("guest→blkdom-pt events/s", cost_header)
        self.assertIn("guest irq/s Linux dd-pt", cost_header)
        self.assertEqual(cost_rows[1][1:3], ["1.000", "1.000"])
        self.assertEqual(len(cost_rows[1]), len(cost_header))
        text = report.render_tables({"nested": {**data, "summary": summary}}, markdown=False)
        self.assertIn("Linux dom0 Linux dd blkdom Linux dd-pt blkdom-pt in turn", text)
        self.assertIn("blkdom-pt/Linux dd-pt", text)

        points = report.sweep_points(summary)
        self.assertEqual(sorted(points), sorted(ALL_SYSTEMS))
        plot = report.svg_plot(points, "t", "s")
        self.assertEqual(plot.count("<polyline"), 5)
        self.assertIn(">Linux HVM dd, passthrough NVMe</text>", plot)
        self.assertIn(">blkdom HVM, passthrough NVMe</text>", plot)
        self.assertIn(report.SYSTEM_COLOURS["blkdom-pt"], plot)

        svg = self.root / "five.svg"
        with redirect_stdout(io.StringIO()):
            status = report.main(["--nested", str(nested), "--engine", str(self.root / "none"),
                                  "--out-root", str(self.root / "out5"), "--svg", str(svg)])
        self.assertEqual(status, 0)
        saved = json.loads(next((self.root / "out5").glob("*/bench.json")).read_text())
        saved_entry = {e["job"]: e for e in saved["nested"]["summary"]}["fio-randread-4k-qd32-1j"]
        self.assertAlmostEqual(saved_entry["ratios"]["blkdom-pt/linux-dd-pt"]["iops"], 6.4)

    def test_three_systems_keep_the_old_ratios(self):
        nested = self.root / "three"
        nested.mkdir()
        write_run(nested, systems=("linux-dom0", "linux-dd", "blkdom"))
        summary = report.summarise(report.load_nested(nested)["runs"])
        for entry in summary:
            self.assertEqual(sorted(entry["ratios"]), ["blkdom/linux-dd", "blkdom/linux-dom0"])
        header, _ = report.main_table(summary)
        self.assertFalse([h for h in header if "-pt" in h])
        cost_header, _ = report.cost_table(summary)
        self.assertEqual(cost_header[1:6], ["blkdom hypercalls/req", "blkdom→guest notify/s",
                                            "guest→blkdom events/s", "blkdom sleeps/s",
                                            "blkdom poll loops/req"])
        self.assertNotIn("passthrough", report.svg_plot(report.sweep_points(summary), "t", "s"))

    def test_passthrough_pair_alone(self):
        nested = self.root / "pt"
        nested.mkdir()
        write_run(nested, systems=("linux-dd-pt", "blkdom-pt"))
        summary = report.summarise(report.load_nested(nested)["runs"])
        entry = {e["job"]: e for e in summary}["fio-randread-4k-qd32-1j"]
        self.assertEqual(list(entry["ratios"]), ["blkdom-pt/linux-dd-pt"])
        header, rows = report.main_table(summary)
        self.assertEqual(header[1:4], ["Linux dd-pt IOPS", "blkdom-pt IOPS",
                                       "blkdom-pt/Linux dd-pt"])
        self.assertEqual(rows[1][3], "6.40x")
        cost_header, _ = report.cost_table(summary)
        self.assertEqual(cost_header[1], "blkdom-pt hypercalls/req")

    def test_real_fio_output(self):
        """The fixture in a bench round (its figures: tests/bench/test_fio_results.py)."""
        directory = self.root / "real" / "round-1" / "blkdom"
        directory.mkdir(parents=True)
        (directory / "fio-fio-blkdom-r1-fio-randread-4k-qd1-1j.json").write_text(
            (HERE / "fixtures" / "fio-qd1.json").read_text())
        # The passthrough guests' file names (tests/xen/bench: fio-blkdompt-rN).
        directory = self.root / "real" / "round-1" / "blkdom-pt"
        directory.mkdir(parents=True)
        (directory / "fio-fio-blkdompt-r1-fio-randread-4k-qd1-1j.json").write_text(
            (HERE / "fixtures" / "fio-qd1.json").read_text())
        runs = report.load_nested(self.root / "real")["runs"]
        self.assertEqual(sorted(r["system"] for r in runs), ["blkdom", "blkdom-pt"])
        self.assertEqual({r["job"] for r in runs}, {"fio-randread-4k-qd1-1j"})
        figures = runs[0]
        self.assertEqual(figures["rw"], "read")
        self.assertGreater(figures["iops"], 0)
        self.assertGreater(figures["p99_us"], figures["p50_us"])
        self.assertGreater(figures["p50_us"], 0)


class HelpersTest(unittest.TestCase):
    def test_block_sizes(self):
        self.assertEqual(report.size_bytes("512"), 512)
        self.assertEqual(report.size_bytes("4k"), 4096)
        self.assertEqual(report.size_bytes("1m"), 1 << 20)
        self.assertEqual(report.size_label(2048), "2K")
        self.assertEqual(report.describe_job("fio-randwrite-4k-qd32-2j"), "randwrite 4K QD32 x2")
        with self.assertRaises(ValueError):
            report.size_bytes("4q")

    def test_poller_counters_are_prefixed_by_vcpu(self):
        values = report.parse_key_values("vcpu0: loops=3 sleeps=1 vcpu1: loops=4".split())
        self.assertEqual(values, {"vcpu0.loops": 3, "vcpu0.sleeps": 1, "vcpu1.loops": 4})
        self.assertEqual(report.sum_matching(values, "loops"), 7)

    def test_log_ticks(self):
        self.assertEqual(report.log_ticks(90, 2200), [50, 100, 200, 500, 1000, 2000, 5000])
        self.assertEqual(report.log_ticks(100, 100), [100])
        self.assertEqual(report.log_ticks(3, 7), [2, 5, 10])


if __name__ == "__main__":
    unittest.main()
