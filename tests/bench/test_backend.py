#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Host tests of tools/bench/backend.py (make bench-backend's table and backend-ratio
lines) against a run written in the layout tests/xen/bench-backend leaves (no Xen):

    python3 -m unittest discover -s tests/bench -v
"""

import io
import json
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools" / "bench"))
import backend  # noqa: E402  (path set up above)

DISK = {"linux-dom0": "xvda", "blkdom": "xvdb"}
JOB = "lg-randread-4k-qd32-q1"
# IOPS by (backend, round).
QD32 = {("linux-dom0", 1): 3000, ("blkdom", 1): 6600,
        ("linux-dom0", 2): 2000, ("blkdom", 2): 4100,
        ("linux-dom0", 3): 3100, ("blkdom", 3): 6000}


def line(iops, ok=True, p50=100.0):
    return json.dumps({"tool": "hostile-load", "vbd": "xvda", "rw": "randread", "bs": 4096,
                       "qd": 32, "queues": 1, "ring_order": 0, "iops": iops,
                       "mib_s": iops / 256, "lat_us": {"p50": p50, "p99": 2 * p50,
                                                       "p99.9": 3 * p50},
                       "cpu_us_per_io": 4.0, "busy_us_per_io": 1.5, "notifies_per_io": 0.01, "ok": ok})


def write_run(root: Path, iops: dict, job=JOB, threads=True) -> None:
    (root / "bench-backend-config.txt").write_text(
        "rounds=3 runtime=10 settle=0 ramp=1 disks=xvda:linux-dom0,xvdb:blkdom "
        "guest_pcpu=3 dom0_pcpus=0 blkdom_pcpus=1,2\n"
        f"jobs={job}\n")
    edges = []
    for (name_backend, rnd), value in iops.items():
        name = f"{job}@{DISK[name_backend]}@{rnd}"
        (root / f"fio-bench-backend-{name}.json").write_text(line(value) + "\n")
        # xl list: dom0 2 s of 10, blkdom 9 s of 10.
        cpu = 2.0 if name_backend == "linux-dom0" else 9.0
        (root / f"cpu-bench-backend-{name}.txt").write_text(
            f"backend=x cpu_s={cpu} wall_s=10.0\n")
        # Outer QEMU threads over 10 s: pCPU 0 ran 3 s, pCPUs 1 and 2 ran 8 s each.
        edges.append(f"BEGIN bench-backend {name} host_s=100.0 thread:CPU_0/TCG=0,0 "
                     "thread:CPU_1/TCG=0,0 thread:CPU_2/TCG=0,0 thread:CPU_3/TCG=0,0")
        edges.append(f"END bench-backend {name} host_s=110.0 thread:CPU_0/TCG=3000000000,0 "
                     "thread:CPU_1/TCG=8000000000,0 thread:CPU_2/TCG=8000000000,0 "
                     "thread:CPU_3/TCG=10000000000,0")
    if threads:
        (root / "host-threads.txt").write_text("\n".join(edges) + "\n")
    # The prefill (round 0) is never a pair.
    (root / f"fio-bench-backend-lg-write-1m-qd4-fill@xvdb@0.json").write_text(line(50))


class BackendTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def summary(self):
        config = backend.read_config(self.root)
        return backend.summarise(backend.load_runs(self.root, config),
                                 config["jobs"].split(","))

    def test_ratio_line_is_exactly_the_documented_form(self):
        write_run(self.root, QD32)
        [entry] = self.summary()
        self.assertEqual(entry["pairs"], 3)
        self.assertEqual(entry["won"], 3)
        self.assertEqual(backend.ratio_lines([entry]), [
            f"backend-ratio {JOB} blkdom/linux-dom0=2.00 iops=6000/3000 cpu=90%/20%"])

    def test_host_cpu_of_the_backends_pcpus(self):
        write_run(self.root, QD32)
        [entry] = self.summary()
        self.assertAlmostEqual(
            entry["backends"]["linux-dom0"]["host_backend_percent"]["median"], 30.0)
        self.assertAlmostEqual(
            entry["backends"]["blkdom"]["host_backend_percent"]["median"], 160.0)
        self.assertAlmostEqual(
            entry["backends"]["blkdom"]["host_guest_vcpu_run_percent"]["median"], 100.0)
        # All four vCPU threads: 3 + 8 + 8 + 10 s of 10 = 2.9 host cores.
        self.assertAlmostEqual(
            entry["backends"]["blkdom"]["iops_per_rig_core"]["median"], 6000 / 2.9)

    def test_failed_runs_and_the_prefill_are_left_out(self):
        write_run(self.root, QD32)
        bad = self.root / f"fio-bench-backend-{JOB}@xvdb@2.json"
        bad.write_text(line(99999, ok=False) + "\n")
        [entry] = self.summary()
        self.assertEqual(entry["pairs"], 2)
        self.assertEqual(entry["backends"]["blkdom"]["iops"]["n"], 2)
        self.assertNotIn("lg-write-1m-qd4-fill", [e["job"] for e in self.summary()])

    def test_main_prints_the_table_and_lines_and_writes_json(self):
        write_run(self.root, QD32, threads=False)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(backend.main(["--nested", str(self.root)]), 0)
        text = out.getvalue()
        self.assertIn("6,000 (4,100-6,600)", text)
        self.assertIn("backend-ratio lg-randread-4k-qd32-q1 blkdom/linux-dom0=2.00", text)
        figures = json.loads((self.root / "backend.json").read_text())
        self.assertEqual(len(figures["runs"]), 6)

    def test_an_idle_job_has_cpu_and_no_ratio_line(self):
        write_run(self.root, QD32)
        for disk, cpu in (("xvda", 0.1), ("xvdb", 0.5)):
            name = f"lg-idle-4k-qd1-q1@{disk}@1"
            data = json.loads(line(0))
            data["idle"] = True
            (self.root / f"fio-bench-backend-{name}.json").write_text(json.dumps(data) + "\n")
            (self.root / f"cpu-bench-backend-{name}.txt").write_text(
                f"backend=x cpu_s={cpu} wall_s=10.0\n")
        idle = [e for e in self.summary() if e["job"] == "lg-idle-4k-qd1-q1"][0]
        self.assertAlmostEqual(
            idle["backends"]["blkdom"]["backend_cpu_percent"]["median"], 5.0)
        self.assertEqual([l for l in backend.ratio_lines([idle])], [])

    def test_idle_line_is_blkdom_cpu_over_all_its_vcpus_and_every_round_counts(self):
        write_run(self.root, QD32)
        edges = []
        # blkdom's two vCPUs over 60 s: round 1 0.2 s + 0.1 s (0.25% of both), round 2
        # 0.9 s + 0.6 s (1.25%): the median is under 1%, one round is not.
        for rnd, cpu, (v0, v1) in ((1, 0.3, (0.2, 0.1)), (2, 1.5, (0.9, 0.6))):
            for disk, used in (("xvda", 3.0), ("xvdb", cpu)):
                name = f"lg-idle-4k-qd1-q1@{disk}@{rnd}"
                data = json.loads(line(0))
                data["idle"] = True
                (self.root / f"fio-bench-backend-{name}.json").write_text(
                    json.dumps(data) + "\n")
                (self.root / f"cpu-bench-backend-{name}.txt").write_text(
                    f"backend=x cpu_s={used} wall_s=60.0\n")
            edges.append(f"begin lg-idle-4k-qd1-q1@xvdb@{rnd} uptime=100 guest_cpu_s=1 "
                         "blkdom_vcpu_s=5.0,7.0 vcpu0: sleeps=1 vcpu1: sleeps=1")
            edges.append(f"end lg-idle-4k-qd1-q1@xvdb@{rnd} uptime=160 guest_cpu_s=2 "
                         f"blkdom_vcpu_s={5 + v0},{7 + v1} vcpu0: sleeps=2 vcpu1: sleeps=2")
        (self.root / "edges-bench-backend.txt").write_text("\n".join(edges) + "\n")
        config = backend.read_config(self.root)
        runs = backend.load_runs(self.root, config)
        summary = backend.summarise(runs, [JOB, "lg-idle-4k-qd1-q1"])
        [idle] = backend.idle_lines(runs, summary)
        self.assertTrue(idle.startswith(
            "backend-idle lg-idle-4k-qd1-q1 blkdom=0.75% of 2 vCPUs (0.25-1.25) "
            "dom0=5.00% (5.00-5.00) window=60s goal<1%=not-met"), idle)
        self.assertIn("round 1: 0.3/0.2; round 2: 1.5/1.0", idle)
        # Without the slow round the goal holds.
        runs = [r for r in runs if r["round"] != 2]
        [idle] = backend.idle_lines(runs, backend.summarise(runs, ["lg-idle-4k-qd1-q1"]))
        self.assertIn("blkdom=0.25% of 2 vCPUs", idle)
        self.assertIn("goal<1%=met", idle)
        busy = [r for r in runs if r["job"] == JOB]
        self.assertEqual(backend.idle_lines(busy, backend.summarise(busy)), [])

    def test_iops_per_backend_cpu(self):
        write_run(self.root, QD32)
        [entry] = self.summary()
        # Round medians: dom0 3,000 IOPS at 20%, blkdom 6,000 at 90%.
        self.assertAlmostEqual(
            entry["backends"]["linux-dom0"]["iops_per_cpu"]["median"], 15_000)
        self.assertAlmostEqual(
            entry["backends"]["blkdom"]["iops_per_cpu"]["median"], 6000 / 0.9)
        header, rows = backend.table_rows([entry])
        column = header.index("IOPS per backend CPU dom0 / blkdom")
        self.assertEqual(rows[0][column], "15,000 / 6,667")

    def test_guest_cpu_and_poller_wake_ups_from_the_job_edges(self):
        write_run(self.root, QD32)
        name = f"{JOB}@xvdb@1"
        (self.root / "edges-bench-backend.txt").write_text(
            f"begin {name} uptime=100.0 guest_cpu_s=50.0 blkdom_vcpu_s=10.0,20.0 "
            "vcpu0: rings=1 loops=5 busy=2 sleeps=10 stray-wakes=3 "
            "vcpu1: rings=0 loops=5 busy=0 sleeps=20 stray-wakes=7 mapped-pages=0\n"
            f"end {name} uptime=110.0 guest_cpu_s=50.5 blkdom_vcpu_s=10.1,20.0 "
            "vcpu0: rings=1 loops=9 busy=2 sleeps=30 stray-wakes=3 "
            "vcpu1: rings=0 loops=9 busy=0 sleeps=40 stray-wakes=17 mapped-pages=0\n"
            "garbage\n")
        runs = backend.load_runs(self.root, backend.read_config(self.root))
        [row] = [r for r in runs if r["backend"] == "blkdom" and r["round"] == 1]
        self.assertAlmostEqual(row["guest_cpu_percent"], 5.0)
        self.assertAlmostEqual(row["poller_sleeps_per_s"], 4.0)
        self.assertAlmostEqual(row["poller_stray_wakes_per_s"], 1.0)
        # Rounds without edges have none of these.
        [other] = [r for r in runs if r["backend"] == "blkdom" and r["round"] == 2]
        self.assertNotIn("guest_cpu_percent", other)

    def test_passed_through_nvme_layout(self):
        # tests/xen/bench-backend-pt: one guest per backend and round, both on xvda.
        (self.root / "bench-backend-pt-config.txt").write_text(
            "layout=pt rounds=2 runtime=10 settle=0 ramp=1 guest_pcpu=3 "
            "linux-dd-pt_pcpus=1,2 blkdom-pt_pcpus=1,2\n"
            f"jobs={JOB}\n")
        edges = []
        for guest, iops, cpu in (("bench-pt-linux", (1000, 1200), 15.0),
                                 ("bench-pt-blkdom", (2100, 2500), 9.0)):
            for rnd, value in zip((1, 2), iops):
                name = f"{JOB}@xvda@{rnd}"
                (self.root / f"fio-{guest}-{name}.json").write_text(line(value) + "\n")
                (self.root / f"cpu-{guest}-{name}.txt").write_text(
                    f"backend=x cpu_s={cpu} wall_s=10.0\n")
                # pCPU 1 ran 4 s of 10 under Linux's jobs, 6 s under blkdom's.
                run = 4 if guest == "bench-pt-linux" else 6
                edges.append(f"BEGIN {guest} {name} host_s=0.0 thread:CPU_1/TCG=0,0")
                edges.append(f"END {guest} {name} host_s=10.0 thread:CPU_1/TCG={run}000000000,0")
        (self.root / "host-threads.txt").write_text("\n".join(edges) + "\n")
        # blkdom's edges are named like Linux's jobs: they must stay on blkdom's rows.
        (self.root / "edges-bench-backend-pt.txt").write_text(
            f"begin {JOB}@xvda@1 uptime=100.0 guest_cpu_s=50.0 blkdom_vcpu_s=1,1 vcpu0: sleeps=0\n"
            f"end {JOB}@xvda@1 uptime=110.0 guest_cpu_s=51.0 blkdom_vcpu_s=2,1 vcpu0: sleeps=50\n")
        # The prefill ran once, on the first guest.
        (self.root / "fio-bench-pt-linux-lg-write-1m-qd4-fill@xvda@0.json").write_text(line(50))
        self.assertIs(backend.layout_of(self.root), backend.PT)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(backend.main(["--nested", str(self.root)]), 0)
        text = out.getvalue()
        self.assertIn(f"backend-ratio {JOB} blkdom/linux-dd-pt=2.09 iops=2300/1100 cpu=90%/150%",
                      text)
        self.assertIn("Linux dd IOPS", text)
        figures = json.loads((self.root / "backend.json").read_text())
        [entry] = figures["summary"]
        self.assertEqual((entry["pairs"], entry["won"]), (2, 2))
        self.assertAlmostEqual(
            entry["backends"]["linux-dd-pt"]["host_backend_percent"]["median"], 40.0)
        self.assertAlmostEqual(
            entry["backends"]["blkdom-pt"]["host_backend_percent"]["median"], 60.0)
        rows = {(r["backend"], r["round"]): r for r in figures["runs"]}
        self.assertAlmostEqual(rows[("blkdom-pt", 1)]["poller_sleeps_per_s"], 5.0)
        self.assertNotIn("poller_sleeps_per_s", rows[("linux-dd-pt", 1)])

    def test_no_results_is_an_error(self):
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
            self.assertEqual(backend.main(["--nested", str(self.root)]), 1)
        self.assertIn("no bench-backend results", err.getvalue())


if __name__ == "__main__":
    unittest.main()
