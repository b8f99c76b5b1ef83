#!/usr/bin/env python3
"""Test tier 2: the image booted under plain QEMU (PVH entry, TCG), judged by the
isa-debug-exit status and the serial log, each boot under a hard timeout.

Prints `tier2: <name> ... ok|FAILED` per test and ends with `tier2: N passed, M failed`.
On a failure the last 50 log lines of that boot are printed.
"""

import argparse
import os
import random
import re
import sys

import disk_pattern
import qemu_runner as q

BOOT_BUDGET_SECONDS = 10  # boot to Rust and log the essentials within 10 s
TIMEOUT = 60


class Suite:
    def __init__(self, image, log_dir, seed=None):
        self.image = image
        self.log_dir = log_dir
        self.seed = seed if seed is not None else random.randrange(1, 1 << 48)
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


DISK_BYTES = 64 << 20
DISK_WRITES = 24
DISK_TAIL_SECTORS = 2048  # kept out of the write regions (the discard check uses it)
DISK_TIMEOUT = 180


def disk_image(suite, name):
    """A fresh zero-filled backing file for one test."""
    path = os.path.join(os.path.dirname(suite.log_dir.rstrip("/")) or ".", f"{name}.img")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(DISK_BYTES)
    return path


def check_backing_file(path, seed, queues):
    """Compares the file with the writes recomputed from the seed: (ok, detail)."""
    with open(path, "rb") as f:
        actual = f.read()
    checked = DISK_BYTES - DISK_TAIL_SECTORS * 512
    expected = disk_pattern.expected_image(checked, seed, queues, DISK_WRITES)
    if len(actual) != DISK_BYTES:
        return False, f"backing file is {len(actual)} bytes"
    if actual[:checked] != expected:
        first = next(i for i in range(checked) if actual[i] != expected[i])
        return False, f"backing file differs from the seeded writes at byte {first} (sector {first // 512})"
    return True, f"{checked >> 20} MiB of the backing file match the seeded writes"


def run_disk_test(suite, name, spec, device_args, smp, expect_queues, options="", expect_in_log=()):
    seed = suite.seed
    image = disk_image(suite, name)
    extra = ["-drive", f"file={image},format=raw,if=none,id=disk0,cache=writeback", *device_args]
    r = suite.boot(name, f"disktest={spec} disktest.seed={seed} disktest.writes={DISK_WRITES} {options} loglevel=info",
                   timeout=DISK_TIMEOUT, smp=smp, extra=extra)
    problems = []
    if r.verdict != "pass" or "disktest: PASS" not in r.log:
        problems.append(f"verdict {r.verdict}")
    queues_line = re.search(r"disktest: (\d+) queue\(s\), regions of", r.log)
    queues = int(queues_line.group(1)) if queues_line else None
    if queues != expect_queues:
        problems.append(f"{queues} queues driven, expected {expect_queues}")
    problems += [f"log lacks {needle!r}" for needle in expect_in_log if needle not in r.log]
    verified = len(re.findall(r"disktest: queue \d+ verified \d+ writes", r.log))
    if verified != expect_queues:
        problems.append(f"{verified} queues verified their writes")
    throughput = re.search(r"random 4 KiB reads (\d+) IOPS, sequential 256 KiB reads ([\d.]+) MB/s", r.log)
    if not problems:
        ok, detail = check_backing_file(image, seed, queues)
        if not ok:
            problems.append(detail)
    detail = f"seed {seed}, {expect_queues} queue(s), host check of the backing file passed"
    if throughput:
        detail += f"; {throughput.group(1)} IOPS 4 KiB random read, {throughput.group(2)} MB/s 256 KiB sequential read"
    suite.record(name, not problems, "; ".join(problems) or detail, r)


def test_nvme_disk_two_queues(suite):
    # QEMU's controller takes SGLs: requests the PRP rules would split go out as SGLs.
    run_disk_test(suite, "disk.nvme-two-queues-verified-on-host", "nvme:1",
                  ["-device", "nvme,drive=disk0,serial=blkdom-nvme"], smp=2, expect_queues=2,
                  expect_in_log=["data by PRP and SGL",
                                 "the second open reads queue 0's last write back intact"])


def test_nvme_disk_prp_only(suite):
    # PRPs only: the same layouts now need split commands.
    run_disk_test(suite, "disk.nvme-prp-only-one-cpu", "nvme:1",
                  ["-device", "nvme,drive=disk0,serial=blkdom-nvme"], smp=1, expect_queues=1,
                  options="disktest.nvme-prp-only", expect_in_log=["data by PRP only"])


def test_disks_through_bounce_buffers(suite):
    # The path a device emulated by Xen's device model takes (devices/bounce.rs): every
    # segment copied through the queue's own pages, on the way in and on the way out.
    run_disk_test(suite, "disk.nvme-through-bounce-buffers", "nvme:1",
                  ["-device", "nvme,drive=disk0,serial=blkdom-nvme"], smp=2, expect_queues=2,
                  options="disktest.bounce",
                  expect_in_log=["through bounce buffers", "outside its buffers is refused"])
    run_disk_test(suite, "disk.virtio-blk-through-bounce-buffers", "virtio:0",
                  ["-device", "virtio-blk-pci,drive=disk0,num-queues=2"], smp=2, expect_queues=2,
                  options="disktest.bounce",
                  expect_in_log=["through bounce buffers", "outside its buffers is refused"])


def test_virtio_disk_two_queues(suite):
    run_disk_test(suite, "disk.virtio-blk-two-queues-verified-on-host", "virtio:0",
                  ["-device", "virtio-blk-pci,drive=disk0,num-queues=2"], smp=2, expect_queues=2,
                  expect_in_log=["a second open is refused: virtio-blk 00:03.0 is already in use"])


def test_virtio_disk_direct_descriptors(suite):
    # No indirect descriptors: each request part takes a run of the ring's descriptors.
    run_disk_test(suite, "disk.virtio-blk-direct-descriptors", "virtio:0",
                  ["-device", "virtio-blk-pci,drive=disk0,num-queues=2,indirect_desc=off,queue-size=1024"],
                  smp=2, expect_queues=2, expect_in_log=["direct descriptors"])


def test_virtio_disk_single_queue(suite):
    # A device offering one queue on a two-CPU machine: one queue is driven.
    run_disk_test(suite, "disk.virtio-blk-single-queue-device", "virtio:0",
                  ["-device", "virtio-blk-pci,drive=disk0,num-queues=1"], smp=2, expect_queues=1)


def test_ram_disk(suite):
    # The same test through the RAM disk's CPU-copy path (no backing file to check).
    r = suite.boot("disk.ram", f"disktest=ram:32M disktest.seed={suite.seed} loglevel=info", timeout=DISK_TIMEOUT, smp=2)
    verified = len(re.findall(r"disktest: queue \d+ verified \d+ writes", r.log))
    ok = r.verdict == "pass" and "disktest: PASS" in r.log and verified == 2
    suite.record("disk.ram-disk-two-queues", ok, f"verdict {r.verdict}, {verified} queues verified", r)


def test_missing_or_failing_disk_fails_cleanly(suite):
    # QEMU's blkdebug driver fails every read of the backing file with EIO.
    blkdebug = os.path.join(os.path.dirname(suite.log_dir.rstrip("/")) or ".", "blkdebug-eio.conf")
    with open(blkdebug, "w") as f:
        f.write('[inject-error]\nevent = "read_aio"\nerrno = "5"\n')
    failing = ["-drive", f"if=none,id=disk0,format=raw,file=blkdebug:{blkdebug}:null-co://"]
    cases = [
        ("disk.failing-nvme-fails", "disktest=nvme:1", failing + ["-device", "nvme,drive=disk0,serial=x"],
         "the device answered Error"),
        ("disk.failing-virtio-fails", "disktest=virtio:0", failing + ["-device", "virtio-blk-pci,drive=disk0"],
         "the device answered Error"),
        ("disk.missing-nvme-fails", "disktest=nvme:1", [], "no NVMe controller on the PCI bus"),
        ("disk.missing-virtio-fails", "disktest=virtio:1",
         ["-drive", "file=null-co://,format=raw,if=none,id=disk0", "-device", "virtio-blk-pci,drive=disk0"],
         "no virtio-blk device number 1 on the PCI bus"),
        ("disk.absent-namespace-fails", "disktest=nvme:2",
         ["-drive", "file=null-co://,format=raw,if=none,id=disk0", "-device", "nvme,drive=disk0,serial=x"],
         "no active namespace 2"),
        ("disk.malformed-store-name-fails", "disktest=scsi:1", [], "unknown backing store \"scsi\""),
    ]
    for name, append, extra, needle in cases:
        r = suite.boot(name, append + " loglevel=info", timeout=60, extra=extra)
        failed_lines = [l for l in r.lines() if "disktest: FAIL" in l]
        ok = r.verdict == "fail" and bool(failed_lines) and needle in failed_lines[0]
        suite.record(name, ok, f"verdict {r.verdict} in {r.seconds:.1f} s: "
                     + (failed_lines[0].split("disktest: ", 1)[1] if failed_lines else "no FAIL line"), r)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True)
    parser.add_argument("--log-dir", default="target/qemu/tier2")
    parser.add_argument("--seed", type=int, help="seed of the disk tests' writes (default: random, printed)")
    args = parser.parse_args()
    disk_pattern.self_check()
    suite = Suite(args.image, args.log_dir, args.seed)
    print(f"tier2: disk test seed {suite.seed}")
    for test in [test_boot_logs_essentials, test_log_level_from_cmdline, test_selftests,
                 test_runner_catches_failing_selftest, test_exception_is_reported,
                 test_panic_is_reported, test_runner_times_out_a_hang, test_four_cpus_start,
                 test_nvme_disk_two_queues, test_nvme_disk_prp_only, test_disks_through_bounce_buffers,
                 test_virtio_disk_two_queues,
                 test_virtio_disk_direct_descriptors, test_virtio_disk_single_queue, test_ram_disk,
                 test_missing_or_failing_disk_fails_cleanly]:
        try:
            test(suite)
        except Exception as e:  # a runner bug is a failure, not a crash of the suite
            suite.record(test.__name__, False, f"runner error: {e!r}")
    print(f"tier2: {suite.passed} passed, {suite.failed} failed")
    return 0 if suite.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
