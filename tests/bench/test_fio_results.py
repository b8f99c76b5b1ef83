#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Host tests of tools/fio_results.py, the fio JSON reader of both the demo table
(tools/rig/summarize.py) and make bench's report (tools/bench/report.py):

    python3 -m unittest discover -s tests/bench -v

fixtures/fio-qd1.json is fio 3.33's output for a 4 KiB random-read job;
fixtures/fio-write-verify.json is written by hand in the same shape for the rig's
write-verify job (16 KiB randwrite QD16, crc32c, do_verify=1): 4096 writes in 8.192 s
(500 IOPS), then the verification pass's 4096 reads in 2.048 s (2000 IOPS).
"""

import contextlib
import copy
import io
import json
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parents[1] / "tools"
for folder in (TOOLS, TOOLS / "bench", TOOLS / "rig"):
    sys.path.insert(0, str(folder))
import fio_results  # noqa: E402  (paths set up above)
import report  # noqa: E402
import summarize  # noqa: E402

FIXTURES = HERE / "fixtures"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class FiguresTest(unittest.TestCase):
    def test_real_fio_read_job(self):
        figures = fio_results.figures(fixture("fio-qd1.json"))
        self.assertEqual(figures["rw"], "read")
        self.assertAlmostEqual(figures["iops"], 214.523651)
        self.assertAlmostEqual(figures["mib_s"], 858 / 1024)
        self.assertEqual(figures["total_ios"], 644)
        self.assertAlmostEqual(figures["runtime_s"], 3.002)
        self.assertAlmostEqual(figures["p50_us"], 1089.536)
        self.assertAlmostEqual(figures["p99_us"], 16908.288)
        self.assertGreater(figures["p99_us"], figures["p50_us"])
        self.assertAlmostEqual(figures["guest_cpu_percent"], 11.592272 + 27.448368)
        self.assertEqual(figures["fio_errors"], 0)

    def test_write_verify_counts_the_write_half(self):
        figures = fio_results.figures(fixture("fio-write-verify.json"))
        self.assertEqual(figures["rw"], "write+verify")
        # Not 500 + 2000: the verification reads ran after the writes, on their own clock.
        self.assertAlmostEqual(figures["iops"], 500.0)
        self.assertAlmostEqual(figures["mib_s"], 8000 / 1024)
        self.assertEqual(figures["total_ios"], 4096)
        self.assertAlmostEqual(figures["runtime_s"], 8.192)
        self.assertAlmostEqual(figures["p50_us"], 28966.912)
        self.assertAlmostEqual(figures["p99_us"], 71827.456)

    def test_verify_seen_through_rw_modifiers(self):
        result = fixture("fio-write-verify.json")
        result["jobs"][0]["job options"]["rw"] = "randwrite:8"
        self.assertEqual(fio_results.figures(result)["rw"], "write+verify")
        self.assertAlmostEqual(fio_results.figures(result)["iops"], 500.0)

    def test_mixed_job_adds_its_halves(self):
        """randrw: reads and writes ran side by side, so both count."""
        result = fixture("fio-qd1.json")
        job = result["jobs"][0]
        job["job options"]["rw"] = "randrw"
        job["write"] = copy.deepcopy(job["read"])
        job["write"]["iops"] = 100.0
        job["write"]["io_bytes"] = 1 << 20
        figures = fio_results.figures(result)
        self.assertEqual(figures["rw"], "read+write")
        self.assertAlmostEqual(figures["iops"], 314.523651)
        self.assertAlmostEqual(figures["mib_s"], 2 * 858 / 1024)
        self.assertEqual(figures["total_ios"], 2 * 644)
        # The latency is the half that moved more bytes (the reads here).
        self.assertAlmostEqual(figures["p50_us"], 1089.536)

    def test_write_job_without_verify(self):
        result = fixture("fio-write-verify.json")
        job = result["jobs"][0]
        job["job options"]["do_verify"] = "0"
        job["read"] = copy.deepcopy(fixture("fio-qd1.json")["jobs"][0]["write"])
        figures = fio_results.figures(result)
        self.assertEqual(figures["rw"], "write")
        self.assertAlmostEqual(figures["iops"], 500.0)

    def test_without_job_options_halves_are_added(self):
        """Only a write-only rw= says the reads were verification; without it, add."""
        result = fixture("fio-write-verify.json")
        del result["jobs"][0]["job options"]
        self.assertEqual(fio_results.figures(result)["rw"], "read+write")
        self.assertAlmostEqual(fio_results.figures(result)["iops"], 2500.0)

    def test_unreadable_file_is_a_value_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "fio.json"
            for text in ('{"jobs": [{"jobname": "cut', '{"jobs": []}', '{"fio version": 3}',
                         '[]'):
                path.write_text(text)
                with self.assertRaises(ValueError):
                    fio_results.load(path)
            path.write_text(json.dumps(fixture("fio-qd1.json")))
            self.assertEqual(fio_results.load(path)["rw"], "read")


class SameFiguresInBothTablesTest(unittest.TestCase):
    """The demo table and make bench's report read one fio JSON to the same figures."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def both(self, fixture_name: str, job: str) -> tuple:
        """The fixture as blkdom's result of JOB in a rig scenario's results and in a
        make bench round; the rows each script makes of it."""
        text = (FIXTURES / fixture_name).read_text()
        scenario = self.root / "scenario"
        scenario.mkdir()
        (scenario / f"fio-fio-blkdom-{job}.json").write_text(text)
        nested = self.root / "bench"
        (nested / "round-1" / "blkdom").mkdir(parents=True)
        (nested / "round-1" / "blkdom" / f"fio-fio-blkdom-r1-{job}.json").write_text(text)
        demo_rows = summarize.load_rows(scenario)
        bench_rows = report.load_nested(nested)["runs"]
        self.assertEqual(list(demo_rows), [(job, "blkdom")])
        self.assertEqual(len(bench_rows), 1)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            summarize.print_table(demo_rows, ["blkdom"])
        return demo_rows[(job, "blkdom")], bench_rows[0], printed.getvalue()

    def test_write_verify(self):
        demo, bench, table = self.both("fio-write-verify.json", "write-verify")
        for field in ("iops", "mib_s", "p50_us", "p99_us"):
            self.assertEqual(demo[field], bench[field], field)
        self.assertAlmostEqual(demo["iops"], 500.0)
        self.assertRegex(table, r"\nwrite-verify +blkdom +500 +7\.8 +28967 +71827 ")
        summary = report.summarise([bench])
        self.assertEqual(summary[0]["systems"]["blkdom"]["iops"]["median"], demo["iops"])

    def test_read(self):
        demo, bench, table = self.both("fio-qd1.json", "randread-qd1")
        for field in ("iops", "mib_s", "p50_us", "p99_us"):
            self.assertEqual(demo[field], bench[field], field)
        self.assertRegex(table, r"\nrandread-qd1 +blkdom +215 ")


if __name__ == "__main__":
    unittest.main()
