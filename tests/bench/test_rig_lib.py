#!/usr/bin/env python3
"""Host tests of the nested rig's shell helpers that read blkdom's statistics
(tests/xen/lib.sh: pollers_value, blkdom_holds_nothing), with a fake xenstore-read first
on PATH. Under sh, and under busybox sh (dom0's shell in the rig) when it is installed:

    python3 -m unittest discover -s tests/bench -v
"""

import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "xen" / "lib.sh"
SHELLS = [["sh"]] + ([["busybox", "sh"]] if shutil.which("busybox") else [])


def pollers_line(rings=(0, 0), mapped=0, heap=(399486976, 1069056)) -> str:
    """data/blkdom-pollers as kernel/src/backend/control.rs writes it (2 vCPUs)."""
    vcpus = "; ".join(f"vcpu{cpu}: rings={n} loops={100 + cpu} busy=7 sleeps=3"
                      for cpu, n in enumerate(rings))
    return (f"{vcpus}; grant-budget=65536 grant-max-per-ring=8448 grant-idle-s=60 "
            f"grant-rings={sum(rings)} grant-share=8448; bounced-bytes=0; "
            f"heap-free={heap[0]} heap-used={heap[1]}; mapped-pages={mapped}")


class RigLibTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.fake = Path(self.tmp.name)
        reader = self.fake / "xenstore-read"
        reader.write_text('#!/bin/sh\n[ "$1" = /local/domain/7/data/blkdom-pollers ] || exit 1\n'
                          'cat "$FAKE/pollers"\n')
        reader.chmod(0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def run_lib(self, line: str, script: str, shell) -> str:
        (self.fake / "pollers").write_text(line + "\n")
        env = {"PATH": f"{self.fake}:/usr/bin:/bin", "FAKE": str(self.fake),
               "RIG": "/nonexistent"}
        result = subprocess.run([*shell, "-c", f'. "{LIB}"; {script}'], env=env,
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.stderr, "")
        return result.stdout

    def test_pollers_value(self):
        line = pollers_line(rings=(2, 1), mapped=1030)
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                out = self.run_lib(line, "for name in heap-free heap-used mapped-pages rings "
                                   "loops grant-budget missing; do "
                                   'echo "$name=$(pollers_value 7 "$name")"; done', shell)
                self.assertEqual(out.split(), [
                    "heap-free=399486976", "heap-used=1069056", "mapped-pages=1030",
                    # Per-vCPU names: the sum over the vCPUs.
                    "rings=3", "loops=201", "grant-budget=65536", "missing="])
                # Another domain: no line, no value.
                self.assertEqual(self.run_lib(line, "pollers_value 8 heap-used", shell), "")

    def test_holds_nothing_with_the_heap_on_the_line(self):
        cases = [
            (pollers_line(), True),
            (pollers_line(rings=(0, 1)), False),
            (pollers_line(mapped=4), False),
            (pollers_line(mapped=40), False),
        ]
        for shell in SHELLS:
            for line, empty in cases:
                with self.subTest(shell=shell[0], line=line):
                    out = self.run_lib(line, "blkdom_holds_nothing 7 && echo empty || echo holds",
                                       shell)
                    self.assertEqual(out.strip(), "empty" if empty else "holds")


if __name__ == "__main__":
    unittest.main()
