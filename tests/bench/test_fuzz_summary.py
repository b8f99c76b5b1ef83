#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Host tests of tools/fuzz_summary.py (make fuzz-long's summary) against the logs
tools/fuzz.sh keeps, one target that ran clean and one that crashed:

    python3 -m unittest discover -s tests/bench -v
"""

import io
import json
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools"))
import fuzz_summary  # noqa: E402  (path set up above)

CLEAN = """\
INFO: Seed: 1234
#2\tINITED cov: 700 ft: 2000 corp: 200/300Kb exec/s: 0 rss: 40Mb
#9000\tNEW    cov: 801 ft: 2590 corp: 280/470Kb lim: 4366 exec/s: 2250 rss: 34Mb L: 9/9 MS: 1
#137750\tDONE   cov: 800 ft: 2596 corp: 281/476Kb lim: 4366 exec/s: 2258 rss: 34Mb
Done 137750 runs in 61 second(s)
stat::number_of_executed_units: 137750
stat::average_exec_per_sec:     2258
stat::new_units_added:          81
stat::slowest_unit_time_sec:    0
stat::peak_rss_mb:              34
"""

CRASHED = """\
#2\tINITED cov: 450 ft: 980 corp: 169/19Kb exec/s: 0 rss: 40Mb

thread '<unnamed>' (6823) panicked at fuzz_targets/gpt.rs:59:5:
a partition found leaves the disk
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace
==6823== ERROR: libFuzzer: deadly signal
MS: 1 ChangeBit-; base unit: 0000
artifact_prefix='/w/fuzz/artifacts/gpt/'; Test unit written to /w/fuzz/artifacts/gpt/crash-3e40
stat::number_of_executed_units: 449
stat::average_exec_per_sec:     0
stat::peak_rss_mb:              74
"""


class FuzzSummaryTest(unittest.TestCase):
    def test_a_clean_target_and_a_crashed_one(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            (out / "run.txt").write_text("commit abc123\nseconds 3600\nstarted 2026-01-01T00:00:00Z\n")
            (out / "status.txt").write_text("x86_32 0\ngpt 1\n")
            (out / "x86_32.log").write_text(CLEAN)
            (out / "gpt.log").write_text(CRASHED)
            printed = io.StringIO()
            with redirect_stdout(printed):
                self.assertEqual(fuzz_summary.main(["fuzz_summary.py", tmp]), 0)
            summary = json.loads((out / "summary.json").read_text())
            text = (out / "summary.txt").read_text()

        self.assertEqual(printed.getvalue(), text)
        self.assertEqual((summary["commit"], summary["seconds"]), ("abc123", "3600"))
        clean, crashed = summary["targets"]
        self.assertEqual(
            {k: clean[k] for k in ("target", "exit", "runs", "exec_per_sec", "cov", "ft",
                                   "corpus", "new_units", "peak_rss_mb", "crash")},
            {"target": "x86_32", "exit": 0, "runs": 137750, "exec_per_sec": 2258,
             "cov": 800, "ft": 2596, "corpus": 281, "new_units": 81, "peak_rss_mb": 34,
             "crash": None})
        self.assertEqual((crashed["exit"], crashed["runs"], crashed["cov"]), (1, 449, 450))
        self.assertEqual(
            crashed["crash"],
            "thread '<unnamed>' (6823) panicked at fuzz_targets/gpt.rs:59:5: "
            "a partition found leaves the disk")
        self.assertEqual(crashed["artifact"], "/w/fuzz/artifacts/gpt/crash-3e40")
        lines = text.splitlines()
        self.assertIn("commit abc123, 3600 s per target", lines[0])
        self.assertRegex(lines[2], r"^x86_32\s+137750\s+2258\s+800\s+2596\s+281\s+ok$")
        self.assertIn("FAILED: thread '<unnamed>' (6823) panicked at", lines[3])
        self.assertIn("(/w/fuzz/artifacts/gpt/crash-3e40)", lines[3])


if __name__ == "__main__":
    unittest.main()
