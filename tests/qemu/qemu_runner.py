# SPDX-License-Identifier: MIT OR Apache-2.0
"""Boot the blkdom image under plain QEMU (PVH loader via -kernel, TCG) and judge it.

The image reports through COM1 (kept as a log file) and ends with one of:
  - QEMU's isa-debug-exit: status 33 = self-tests passed, 35 = a self-test failed,
    37 = the kernel crashed (exception or panic, logged first);
  - an ACPI power-off: status 0;
  - nothing, if it hangs: the runner kills QEMU at the hard timeout.
"""

import dataclasses
import os
import signal
import subprocess
import time

VERDICT_BY_STATUS = {33: "pass", 35: "fail", 37: "crash", 0: "poweroff"}
READY_MARKER = "blkdom: up"


@dataclasses.dataclass
class Boot:
    verdict: str  # pass | fail | crash | poweroff | timeout | error
    status: int | None
    seconds: float
    log: str
    log_path: str
    command: list

    def lines(self):
        return self.log.splitlines()

    def tail(self, n=50):
        return "\n".join(self.lines()[-n:])

    def selftests(self):
        """(name, passed) for each `selftest: <name> ... ok|FAILED` line."""
        results = []
        for line in self.lines():
            if " selftest: " not in line or " ... " not in line:
                continue
            body = line.split(" selftest: ", 1)[1]
            name, outcome = body.split(" ... ", 1)
            results.append((name.strip(), outcome.startswith("ok")))
        return results

    def selftest_summary(self):
        """(passed, failed) from the kernel's own summary line, or None."""
        for line in self.lines():
            if " selftest: " in line and " passed, " in line and line.rstrip().endswith(" failed"):
                words = line.split(" selftest: ", 1)[1].split()
                return int(words[0]), int(words[2])
        return None


def qemu_command(image, append, log_path, smp=1, memory_mib=256, extra=()):
    return [
        os.environ.get("QEMU", "qemu-system-x86_64"),
        "-machine", "q35",
        "-accel", "tcg",
        "-cpu", "max",
        "-smp", str(smp),
        "-m", str(memory_mib),
        "-display", "none",
        "-monitor", "none",
        "-no-reboot",
        "-serial", f"file:{log_path}",
        "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-kernel", image,
        "-append", append,
        *extra,
    ]


def boot(image, append="", log_path="target/qemu/boot.log", timeout=60, **kwargs):
    """Boots the image once; never takes longer than `timeout` seconds (plus the kill)."""
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    if os.path.exists(log_path):
        os.remove(log_path)
    command = qemu_command(image, append, log_path, **kwargs)
    start = time.monotonic()
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        status = process.returncode
        verdict = VERDICT_BY_STATUS.get(status, "error")
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        status = None
        verdict = "timeout"
    seconds = time.monotonic() - start
    log = ""
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8", errors="replace") as f:
            log = f.read().replace("\r\n", "\n")
    if verdict == "error":
        log += "\n[runner] QEMU exited with status %s: %s" % (status, output.decode(errors="replace"))
    return Boot(verdict, status, seconds, log, log_path, command)


def judge_selftests(result):
    """The runner's verdict on a self-test boot: (ok, reason)."""
    if result.verdict != "pass":
        return False, f"verdict {result.verdict} (QEMU status {result.status})"
    tests = result.selftests()
    summary = result.selftest_summary()
    if not tests or summary is None:
        return False, "no self-test results in the log"
    failed = [name for name, ok in tests if not ok]
    if failed:
        return False, "failed: " + ", ".join(failed)
    if summary != (len(tests), 0):
        return False, f"summary {summary} disagrees with {len(tests)} reported tests"
    return True, f"{len(tests)} self-tests passed"
