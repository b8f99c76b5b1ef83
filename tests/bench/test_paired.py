#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Host tests of tools/bench/paired.py (make bench-paired's table) against a paired run
written in the layout tests/xen/paired leaves (no Xen needed):

    python3 -m unittest discover -s tests/bench -v
"""

import io
import json
import sys
import tempfile
import unittest
import unittest.mock
from contextlib import redirect_stdout
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools" / "bench"))
sys.path.insert(0, str(HERE))
import paired  # noqa: E402  (path set up above)
from test_report import fio_json  # noqa: E402  (the fio JSON the reports read)

SETTLE = 1
DISK = {"linux-dom0": "xvda", "blkdom": "xvdb"}
# IOPS by (backend, round). Round 2 ran on a machine twice as slow for both backends: the
# medians of each backend over rounds mislead, the pairs do not.
QD32 = {("linux-dom0", 1): 1000, ("blkdom", 1): 1200,
        ("linux-dom0", 2): 500, ("blkdom", 2): 650,
        ("linux-dom0", 3): 1100, ("blkdom", 3): 1000}


def write_run(root: Path, iops: dict, job="fio-randread-4k-qd32-1j", p50_ns=None) -> None:
    (root / "paired-config.txt").write_text(
        f"rounds=3 runtime=10 settle={SETTLE} ramp=1 disks=xvda:linux-dom0,xvdb:blkdom\n"
        f"jobs={job}\n")
    console = []
    irq = 0
    for (backend, rnd), value in sorted(iops.items(), key=lambda kv: kv[0][1]):
        name = f"{job}@{DISK[backend]}@{rnd}"
        p50 = p50_ns[(backend, rnd)] if p50_ns else 400_000
        (root / f"fio-fio-paired-{name}.json").write_text(
            json.dumps(fio_json(value, p50_ns=p50)))
        # The backend's CPU: 5 s of 10 + ramp + settle for dom0, 9 s for blkdom.
        cpu = 5.0 if backend == "linux-dom0" else 9.0
        (root / f"cpu-fio-paired-{name}.txt").write_text(
            f"backend=x cpu_s={cpu} wall_s={10 + SETTLE}\n")
        ios = int(value * 10)
        per_io = 1.0 if backend == "linux-dom0" else 0.25
        console.append(f"[fio-paired] rig-guest: irq before {name} {irq}")
        irq += int(ios * per_io)
        console.append(f"[fio-paired] rig-guest: irq after {name} {irq}")
    # The prefill (round 0) is never a pair.
    (root / "fio-fio-paired-fio-write-1m-qd4-fill@xvdb@0.json").write_text(
        json.dumps(fio_json(50, rw="write", block=1 << 20)))
    (root / "guest-fio-paired.log").write_text("\n".join(console) + "\n")



def write_guest_thread_edges(root, name, guest_begin, other_begin, guest_end, other_end):
    """host-threads.txt for job run `name` (edges 11 s apart): the guest's pCPU 3 thread
    and another's (pCPU 1) counters at its begin and end; the config names pCPU 3."""
    (root / "host-threads.txt").write_text(
        f"BEGIN fio-paired {name} host_s=100.0 thread:CPU_3/TCG={guest_begin} "
        f"thread:CPU_1/TCG={other_begin}\n"
        f"END fio-paired {name} host_s=111.0 thread:CPU_3/TCG={guest_end} "
        f"thread:CPU_1/TCG={other_end}\n")
    config = root / "paired-config.txt"
    if "guest_pcpu=" not in config.read_text():
        config.write_text(config.read_text().replace("ramp=1", "ramp=1 guest_pcpu=3"))

class PairedTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def entry(self):
        config = paired.read_config(self.root)
        runs = paired.load_runs(self.root, float(config["settle"]))
        [entry] = paired.summarise(runs, config["jobs"].split(","))
        return entry

    def test_ratios_are_taken_pair_by_pair(self):
        write_run(self.root, QD32)
        entry = self.entry()
        ratios = sorted(p["iops"] for p in entry["pairs"])
        self.assertEqual(ratios, sorted([1.2, 1.3, 1000 / 1100]))
        self.assertAlmostEqual(entry["iops_ratio"]["median"], 1.2)
        self.assertAlmostEqual(entry["iops_ratio"]["min"], 1000 / 1100)
        self.assertAlmostEqual(entry["iops_ratio"]["max"], 1.3)
        self.assertEqual(entry["iops_won"], 2)
        # The medians over rounds alone would say 1000 / 1000.
        self.assertEqual(entry["backends"]["linux-dom0"]["iops"]["median"], 1000)
        self.assertEqual(entry["backends"]["blkdom"]["iops"]["median"], 1000)

    def test_a_round_with_one_half_missing_is_no_pair(self):
        runs = dict(QD32)
        del runs[("blkdom", 2)]
        write_run(self.root, runs)
        entry = self.entry()
        self.assertEqual([p["round"] for p in entry["pairs"]], [1, 3])
        self.assertEqual(entry["backends"]["blkdom"]["iops"]["n"], 2)

    def test_the_prefill_is_left_out(self):
        write_run(self.root, QD32)
        config = paired.read_config(self.root)
        runs = paired.load_runs(self.root, SETTLE)
        self.assertEqual({r["job"] for r in runs}, {"fio-randread-4k-qd32-1j"})
        self.assertEqual(len(runs), 6)
        self.assertEqual(config["disks"], "xvda:linux-dom0,xvdb:blkdom")

    def test_latency_pairs_win_when_lower(self):
        p50 = {("linux-dom0", r): 300_000 for r in (1, 2, 3)}
        p50.update({("blkdom", 1): 150_000, ("blkdom", 2): 240_000, ("blkdom", 3): 330_000})
        write_run(self.root, QD32, p50_ns=p50)
        entry = self.entry()
        self.assertAlmostEqual(entry["p50_us_ratio"]["median"], 0.8)
        self.assertEqual(entry["p50_us_won"], 2)

    def test_cpu_without_the_settle_and_interrupts_per_io(self):
        write_run(self.root, QD32)
        backends = self.entry()["backends"]
        self.assertAlmostEqual(backends["linux-dom0"]["backend_cpu_percent"]["median"], 50.0)
        self.assertAlmostEqual(backends["blkdom"]["backend_cpu_percent"]["median"], 90.0)
        self.assertAlmostEqual(backends["linux-dom0"]["guest_irq_per_io"]["median"], 1.0)
        self.assertAlmostEqual(backends["blkdom"]["guest_irq_per_io"]["median"], 0.25)

    def test_blkdoms_part_of_a_backend_cpu_that_adds_dom0_and_blkdom_up(self):
        write_run(self.root, QD32)
        # Plain runs have no part: no column.
        self.assertNotIn("of it blkdom's", paired.render([self.entry()], {}, markdown=False))
        # Over NVMe/TCP: 1 s of blkdom's on the dom0 path, 6 s of the 9 on blkdom's.
        for path in self.root.glob("cpu-fio-paired-*@xvd?@[123].txt"):
            part = 1.0 if "@xvda@" in path.name else 6.0
            path.write_text(path.read_text().rstrip("\n") + f" blkdom_cpu_s={part}\n")
        entry = self.entry()
        backends = entry["backends"]
        self.assertAlmostEqual(backends["linux-dom0"]["blkdom_cpu_percent"]["median"], 10.0)
        self.assertAlmostEqual(backends["blkdom"]["blkdom_cpu_percent"]["median"], 60.0)
        header, [row] = paired.table_rows([entry])
        self.assertEqual(row[header.index("of it blkdom's % dom0 / blkdom")], "10 / 60")
        self.assertEqual(row[header.index("backend CPU % dom0 / blkdom")], "50 / 90")

    def test_a_cpu_window_that_does_not_fit_the_job_gives_no_cpu(self):
        write_run(self.root, QD32)
        # dom0 read round 2's markers late: 3.8 s and 17.6 s windows for 11 s jobs.
        for backend, wall in (("linux-dom0", 3.8), ("blkdom", 17.6)):
            path = self.root / f"cpu-fio-paired-fio-randread-4k-qd32-1j@{DISK[backend]}@2.txt"
            path.write_text(f"backend=x cpu_s=5.0 wall_s={wall}\n")
        backends = self.entry()["backends"]
        self.assertEqual(backends["linux-dom0"]["backend_cpu_percent"]["n"], 2)
        self.assertEqual(backends["blkdom"]["backend_cpu_percent"]["n"], 2)
        self.assertTrue(paired.window_fits(11.0, 11.0))
        self.assertFalse(paired.window_fits(9.0, 11.0))
        self.assertFalse(paired.window_fits(14.0, 11.0))
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(paired.main(["--nested", str(self.root)]), 0)
        self.assertIn("CPU left out of 2 of 6 runs", out.getvalue())
        self.assertIn("fio-randread-4k-qd32-1j@blkdom@2 (17.6 s)", out.getvalue())

    def test_main_prints_the_table_and_writes_json(self):
        write_run(self.root, QD32)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(paired.main(["--nested", str(self.root), "--markdown"]), 0)
        text = out.getvalue()
        self.assertIn("| fio-randread-4k-qd32-1j | 1,000 (500-1,100) | 1,000 (650-1,200) "
                      "| 1.20x (0.91-1.30) | 2/3 |", text)
        saved = json.loads((self.root / "paired.json").read_text())
        self.assertEqual(len(saved["summary"][0]["pairs"]), 3)

    def test_a_blkdom_variant_is_named_in_the_title(self):
        write_run(self.root, QD32)
        config = self.root / "paired-config.txt"
        config.write_text(config.read_text() + "blkdom=poll.spin-us=20-200:poll.idle=yield\n")
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(paired.main(["--nested", str(self.root)]), 0)
        self.assertIn("blkdom's command line: poll.spin-us=20-200 poll.idle=yield", out.getvalue())
        without = io.StringIO()
        write_run(self.root, QD32)
        with redirect_stdout(without):
            paired.main(["--nested", str(self.root)])
        self.assertNotIn("command line", without.getvalue())

    def test_the_guests_vcpu_thread_per_job_from_the_outer_machine(self):
        write_run(self.root, QD32)
        name = "fio-randread-4k-qd32-1j@xvdb@1"
        # 11 s between the edges, 1 of them settle: the guest's pCPU 3 ran 8 s and waited
        # 1 s of the 10 s busy; its 12,000 I/Os (1,200 IOPS) cost 8 s / 12,000 each.
        write_guest_thread_edges(self.root, name, "1000000000,0", "0,0",
                                 "9000000000,1000000000", "9000000000,0")
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(paired.main(["--nested", str(self.root)]), 0)
        runs = json.loads((self.root / "paired.json").read_text())["runs"]
        [row] = [r for r in runs if r["backend"] == "blkdom" and r["round"] == 1]
        self.assertAlmostEqual(row["host_guest_vcpu_run_percent"], 80.0)
        self.assertAlmostEqual(row["host_guest_vcpu_wait_percent"], 10.0)
        self.assertAlmostEqual(row["host_guest_vcpu_us_per_io"], 8e6 / 12000)
        # Without the guest's pCPU in the config there is no host view.
        self.assertNotIn("host_guest_vcpu_run_percent",
                         paired.load_runs(self.root, SETTLE)[0])

    def blkdom_round_one(self, name, guest_begin, other_begin, guest_end, other_end):
        """blkdom's first-round row of job NAME with these thread edges written."""
        write_guest_thread_edges(self.root, name, guest_begin, other_begin, guest_end,
                                 other_end)
        [row] = [r for r in paired.load_runs(self.root, SETTLE, 3)
                 if r["backend"] == "blkdom" and r["round"] == 1]
        return row

    def test_the_guests_vcpu_sleeps_and_preemptions_per_io(self):
        write_run(self.root, QD32)
        name = "fio-randread-4k-qd32-1j@xvdb@1"
        # 12,000 I/Os over the 10 s busy: 6,000 sleeps (half a sleep per I/O) and 1,200
        # preemptions; another thread's switches are not the guest's.
        row = self.blkdom_round_one(name, "1000000000,0,500,20", "0,0,0,0",
                                    "9000000000,1000000000,6500,1220",
                                    "9000000000,0,90000,90000")
        self.assertAlmostEqual(row["host_guest_vcpu_us_per_io"], 8e6 / 12000)
        self.assertAlmostEqual(row["host_guest_vcpu_sleeps_per_io"], 0.5)
        self.assertAlmostEqual(row["host_guest_vcpu_preempted_per_io"], 0.1)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(paired.main(["--nested", str(self.root)]), 0)
        self.assertIn("0.50/0.10", out.getvalue())
        # A file from before the switches were recorded: run and wait, no switches.
        row = self.blkdom_round_one(name, "1000000000,0", "0,0", "9000000000,1000000000",
                                    "9000000000,0")
        self.assertAlmostEqual(row["host_guest_vcpu_us_per_io"], 8e6 / 12000)
        self.assertNotIn("host_guest_vcpu_sleeps_per_io", row)

    def test_a_switch_count_that_fell_gives_no_figure(self):
        write_run(self.root, QD32)
        name = "fio-randread-4k-qd32-1j@xvdb@1"
        # The end's preemptions read as 0 (its status file misread): no sleeps or
        # preemptions per I/O for the job, the run and wait figures as ever.
        row = self.blkdom_round_one(name, "1000000000,0,500,20", "0,0,0,0",
                                    "9000000000,1000000000,6500,0", "9000000000,0,0,0")
        self.assertAlmostEqual(row["host_guest_vcpu_us_per_io"], 8e6 / 12000)
        self.assertNotIn("host_guest_vcpu_sleeps_per_io", row)
        self.assertNotIn("host_guest_vcpu_preempted_per_io", row)

    def test_the_title_says_when_the_guests_thread_had_a_host_core_alone(self):
        write_run(self.root, QD32)
        out = io.StringIO()
        with redirect_stdout(out):
            paired.main(["--nested", str(self.root)])
        self.assertNotIn("host core 0", out.getvalue())
        (self.root / "host-pinning.txt").write_text(
            "CPU_0/TCG host-core=1\nCPU_3/TCG host-core=0\nqemu-system-x86 host-core=1\n")
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(paired.main(["--nested", str(self.root)]), 0)
        self.assertIn("host core 0 for CPU_3/TCG alone", out.getvalue())

    def test_no_results_is_an_error(self):
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), unittest.mock.patch("sys.stderr", err):
            self.assertEqual(paired.main(["--nested", str(self.root)]), 1)
        self.assertIn("no paired results", err.getvalue())


if __name__ == "__main__":
    unittest.main()
