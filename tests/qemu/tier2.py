#!/usr/bin/env python3
"""Test tier 2: the image booted under plain QEMU (PVH entry, TCG), judged by the
isa-debug-exit status and the serial log, each boot under a hard timeout.

Prints `tier2: <name> ... ok|FAILED` per test and ends with `tier2: N passed, M failed`.
On a failure the last 50 log lines of that boot are printed.
"""

import argparse
import sys

import qemu_runner as q

BOOT_BUDGET_SECONDS = 10  # issue 2: boot to Rust and log the essentials within 10 s
TIMEOUT = 60


class Suite:
    def __init__(self, image, log_dir):
        self.image = image
        self.log_dir = log_dir
        self.passed = 0
        self.failed = 0

    def boot(self, name, append, timeout=TIMEOUT, **kwargs):
        return q.boot(self.image, append, f"{self.log_dir}/{name}.log", timeout=timeout, **kwargs)

    def record(self, name, ok, detail, result=None):
        if ok:
            self.passed += 1
            print(f"tier2: {name} ... ok ({detail})")
        else:
            self.failed += 1
            print(f"tier2: {name} ... FAILED: {detail}")
            if result is not None:
                print(f"---- last 50 lines of {result.log_path} ----")
                print(result.tail(50))
                print("----")
        sys.stdout.flush()


def test_boot_logs_essentials(suite):
    r = suite.boot("boot", "loglevel=info blkdom.test=boot-essentials")
    problems = []
    for needle in ["memory map:", " ram", 'command line: "loglevel=info blkdom.test=boot-essentials"',
                   "hypervisor: ", "memory: ", q.READY_MARKER, "powering off"]:
        if needle not in r.log:
            problems.append(f"log lacks {needle!r}")
    if r.verdict != "poweroff":
        problems.append(f"verdict {r.verdict}, expected an ACPI power-off")
    if r.seconds > BOOT_BUDGET_SECONDS:
        problems.append(f"took {r.seconds:.1f} s, budget {BOOT_BUDGET_SECONDS} s")
    suite.record("boot.logs-memory-map-cmdline-hypervisor", not problems,
                 "; ".join(problems) or f"booted, logged and powered off in {r.seconds:.2f} s", r)


def test_log_level_from_cmdline(suite):
    r = suite.boot("loglevel-error", "loglevel=error")
    info_lines = [l for l in r.lines() if l.startswith("INFO")]
    ok = r.verdict == "poweroff" and not info_lines
    suite.record("boot.loglevel-error-silences-info", ok,
                 f"verdict {r.verdict}, {len(info_lines)} INFO lines", r)

    r = suite.boot("loglevel-bad", "loglevel=loud")
    ok = r.verdict == "poweroff" and "loglevel=loud not understood" in r.log and q.READY_MARKER in r.log
    suite.record("boot.bad-loglevel-warns-and-boots", ok, f"verdict {r.verdict}", r)


def test_selftests(suite):
    r = suite.boot("selftest", "selftest selftest.expect-cpus=2 loglevel=info", smp=2)
    for name, passed in r.selftests():
        suite.record(f"selftest.{name}", passed, "in-kernel" if passed else "reported FAILED", None if passed else r)
    ok, why = q.judge_selftests(r)
    suite.record("selftest.verdict", ok, why, r)


def test_runner_catches_failing_selftest(suite):
    r = suite.boot("selftest-injected-failure", "selftest selftest.inject-failure")
    ok, why = q.judge_selftests(r)
    injected = ("selftest.injected-failure", False) in r.selftests()
    # The runner must say "not ok", for the right reason, from the right exit status.
    good = (not ok) and injected and r.verdict == "fail"
    suite.record("runner.catches-failing-selftest", good,
                 f"runner said ok={ok} ({why}); verdict {r.verdict}", r)


def test_exception_is_reported(suite):
    r = suite.boot("crash-page-fault", "crashtest=page-fault")
    ok = (r.verdict == "crash" and "exception #PF page fault (vector 14)" in r.log
          and "cr2=0x7fff0bad0000" in r.log and "rip=0x" in r.log and "blkdom stopped" in r.log)
    suite.record("crash.page-fault-logged-and-stopped", ok, f"verdict {r.verdict} in {r.seconds:.2f} s", r)


def test_panic_is_reported(suite):
    r = suite.boot("crash-panic", "crashtest=panic")
    ok = r.verdict == "crash" and "panic: " in r.log and "crashtest panic" in r.log
    suite.record("crash.panic-logged-and-stopped", ok, f"verdict {r.verdict}", r)


def test_runner_times_out_a_hang(suite):
    limit = 5
    r = suite.boot("hang", "crashtest=hang", timeout=limit)
    ok = r.verdict == "timeout" and r.seconds < limit + 5
    suite.record("runner.kills-hung-image-at-timeout", ok, f"verdict {r.verdict} after {r.seconds:.1f} s", r)


def test_four_cpus_start(suite):
    r = suite.boot("smp4", "loglevel=info", smp=4)
    started = [l for l in r.lines() if " up (APIC id " in l]
    ok = r.verdict == "poweroff" and "cpu: 4 of 4 CPUs online" in r.log and len(started) == 3
    suite.record("boot.four-cpus-online", ok, f"verdict {r.verdict}, {len(started)} APs reported", r)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True)
    parser.add_argument("--log-dir", default="target/qemu/tier2")
    args = parser.parse_args()
    suite = Suite(args.image, args.log_dir)
    for test in [test_boot_logs_essentials, test_log_level_from_cmdline, test_selftests,
                 test_runner_catches_failing_selftest, test_exception_is_reported,
                 test_panic_is_reported, test_runner_times_out_a_hang, test_four_cpus_start]:
        try:
            test(suite)
        except Exception as e:  # a runner bug is a failure, not a crash of the suite
            suite.record(test.__name__, False, f"runner error: {e!r}")
    print(f"tier2: {suite.passed} passed, {suite.failed} failed")
    return 0 if suite.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
