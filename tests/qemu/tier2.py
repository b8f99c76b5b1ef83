#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Test tier 2: the image booted under plain QEMU (PVH entry, TCG), judged by the
isa-debug-exit status and the serial log, each boot under a hard timeout.

`--image` is the test image (built with `--features test-hooks`: the self-tests, disk,
fault, registry and crash tests run through it). `--production-image` is the image an
operator runs: checked to carry no test hook (its symbols and strings, against the test
image's) and booted once.

Prints `tier2: <name> ... ok|FAILED` per test and ends with `tier2: N passed, M failed`.
On a failure the last 50 log lines of that boot are printed.
"""

import argparse
import os
import random
import re
import struct
import subprocess
import sys
import zlib

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
    # The version the boot logs is the image's own build id (its GNU build-id note).
    notes = subprocess.run(["readelf", "-n", suite.image], check=True, capture_output=True,
                           text=True).stdout
    note = re.search(r"Build ID: ([0-9a-f]+)", notes)
    logged = re.search(r"blkdom \S+ build ([0-9a-f]+) starting", r.log)
    if not note or not logged or note.group(1) != logged.group(1):
        problems.append(f"build id logged {logged and logged.group(1)}, image's {note and note.group(1)}")
    # Nothing allocated in the load window a live upgrade's next image goes to (4-12 MiB).
    heap = re.search(r"heap \d+ MiB at (0x[0-9a-f]+)", r.log)
    if not heap or int(heap.group(1), 16) < 0xc00000 or "kept free for a live upgrade" not in r.log:
        problems.append(f"heap at {heap and heap.group(1)}, or the load window not kept free")
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

    # The same boot carries a bad grant limit next to a good one: the bad one is named
    # with its range and its default kept, the good one applies, the boot goes on.
    r = suite.boot("loglevel-bad", "loglevel=loud grants.max-total=lots grants.idle-s=5")
    ok = r.verdict == "poweroff" and "loglevel=loud not understood" in r.log and q.READY_MARKER in r.log
    suite.record("boot.bad-loglevel-warns-and-boots", ok, f"verdict {r.verdict}", r)
    needles = ["grants.max-total=lots: want a whole number 0..=4194304",
               "at most 65536 persistent grants mapped by all rings together, 8448 by one ring",
               "persistent grants unused for 5 s are unmapped"]
    missing = [n for n in needles if n not in r.log]
    suite.record("boot.bad-grant-limit-reported-default-kept",
                 r.verdict == "poweroff" and not missing and q.READY_MARKER in r.log,
                 f"verdict {r.verdict}" + "".join(f"; log lacks {n!r}" for n in missing), r)


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


# The test hooks' code: kernel modules (and the testhooks crate) the production image must
# not have, by the symbol names `nm` demangles. Their distinctive messages, for what the
# compiler may have inlined (crash_test): none may be in the production image.
HOOK_MODULES = re.compile(r"(^|[^A-Za-z0-9_])(selftest|disktest|faulttest|registrytest|nettest|testhooks)::")
HOOK_STRINGS = [b"crashtest panic", b"failing on purpose", b"deliberate failure",
                b"registrytest: done", b"faulttest: PASS", b"disktest: ",
                b"nettest: PASS"]


def hook_traces(image):
    """What of the test hooks `image` carries: (symbols, strings)."""
    out = subprocess.run(["nm", "--demangle", image], check=True, capture_output=True, text=True).stdout
    symbols = sorted({line.split(None, 2)[-1] for line in out.splitlines() if HOOK_MODULES.search(line)})
    with open(image, "rb") as f:
        data = f.read()
    return symbols, [s.decode() for s in HOOK_STRINGS if s in data]


def test_production_image_has_no_test_hooks(suite, production):
    # The check must be able to fail: the test image has every trace it looks for.
    symbols, strings = hook_traces(suite.image)
    missing = [s.decode() for s in HOOK_STRINGS if s.decode() not in strings]
    ok = len(symbols) >= 10 and not missing
    suite.record("image.test-image-has-the-hooks", ok,
                 f"{len(symbols)} hook symbols" + (f"; lacks {missing}" if missing else ""))
    symbols, strings = hook_traces(production)
    ok = not symbols and not strings
    suite.record("image.production-has-no-test-hook", ok,
                 "no hook symbol or message" if ok else f"symbols {symbols[:5]}, strings {strings}")


def test_production_image_boots(suite, production):
    # Test hooks named to the production image are said to be absent, and it comes up.
    append = "loglevel=info selftest disktest=ram:1M"
    r = q.boot(production, append, f"{suite.log_dir}/production.log")
    problems = [f"log lacks {n!r}" for n in [q.READY_MARKER, "powering off",
                                              "test hook selftest not in this image",
                                              "test hook disktest not in this image"] if n not in r.log]
    if r.verdict != "poweroff":
        problems.append(f"verdict {r.verdict}, expected an ACPI power-off")
    if r.selftests():
        problems.append("self-tests ran")
    suite.record("image.production-boots-without-hooks", not problems,
                 "; ".join(problems) or f"up and powered off in {r.seconds:.2f} s", r)


DISK_BYTES = 64 << 20
DISK_WRITES = 24
DISK_TAIL_SECTORS = 2048  # kept out of the write regions (the discard check uses it)
DISK_TIMEOUT = 180


SLICE_FILL = 0xA5  # what a slice test's backing file holds outside the slice


def disk_image(suite, name, initial=None):
    """A fresh backing file for one test: zero-filled, or `initial`'s bytes."""
    path = os.path.join(os.path.dirname(suite.log_dir.rstrip("/")) or ".", f"{name}.img")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        if initial is None:
            f.truncate(DISK_BYTES)
        else:
            f.write(initial)
    return path


def gpt_image(partitions, size=DISK_BYTES, block=512):
    """A disk of `size` bytes holding SLICE_FILL, with a protective MBR and a primary and
    backup GPT (128 entries of 128 bytes, as sgdisk writes them) listing `partitions`:
    (number, first LBA, last LBA, name). Independent of drivers/backing/src/gpt.rs."""
    blocks = size // block
    entries = bytearray(128 * 128)
    linux_data = bytes.fromhex("af3dc60f838472478e793d69d8477de4")
    for number, first, last, name in partitions:
        entry = (linux_data + bytes([number]) * 16 + struct.pack("<QQQ", first, last, 0)
                 + name.encode("utf-16-le").ljust(72, b"\0"))
        entries[(number - 1) * 128:number * 128] = entry
    entries = bytes(entries)

    def header(my_lba, alternate_lba, entries_lba):
        fields = struct.pack("<8sIIIIQQQQ16sQIII", b"EFI PART", 0x10000, 92, 0, 0, my_lba,
                             alternate_lba, 34, blocks - 34, b"blkdom-tier2-gpt", entries_lba,
                             128, 128, zlib.crc32(entries))
        fields = fields[:16] + struct.pack("<I", zlib.crc32(fields)) + fields[20:]
        return fields.ljust(block, b"\0")

    image = bytearray([SLICE_FILL]) * size
    mbr = bytearray(block)
    mbr[446:462] = struct.pack("<B3sB3sII", 0, b"\0\2\0", 0xEE, b"\xff\xff\xff", 1,
                               min(blocks - 1, 0xFFFFFFFF))
    mbr[510:512] = b"\x55\xaa"
    image[0:block] = mbr
    image[block:2 * block] = header(1, blocks - 1, 2)
    image[2 * block:2 * block + len(entries)] = entries
    image[(blocks - 33) * block:(blocks - 33) * block + len(entries)] = entries
    image[(blocks - 1) * block:] = header(blocks - 1, 1, blocks - 33)
    return bytes(image)


def check_backing_file(path, seed, queues, initial=None, slice_at=None):
    """Compares the file with the writes recomputed from the seed (inside the slice
    `slice_at` = (offset, size) if given, the rest unchanged from `initial`): (ok, detail)."""
    with open(path, "rb") as f:
        actual = f.read()
    offset, size = slice_at or (0, DISK_BYTES)
    checked = size - DISK_TAIL_SECTORS * 512
    before = None if initial is None else initial[offset:offset + checked]
    expected = disk_pattern.expected_image(checked, seed, queues, DISK_WRITES, initial=before)
    if len(actual) != DISK_BYTES:
        return False, f"backing file is {len(actual)} bytes"
    inside = actual[offset:offset + checked]
    if inside != expected:
        first = next(i for i in range(checked) if inside[i] != expected[i])
        return False, (f"backing file differs from the seeded writes at byte {offset + first} "
                       f"(sector {first // 512} of the disk tested)")
    detail = f"{checked >> 20} MiB of the backing file match the seeded writes"
    if slice_at:
        for start, end in [(0, offset), (offset + size, DISK_BYTES)]:
            if actual[start:end] != initial[start:end]:
                first = next(i for i in range(start, end) if actual[i] != initial[i])
                return False, f"byte {first}, outside the slice, changed"
        detail += f" at byte {offset}; the {(DISK_BYTES - size) >> 20} MiB outside the slice are unchanged"
    return True, detail


def run_disk_test(suite, name, spec, device_args, smp, expect_queues, options="", expect_in_log=(),
                  initial=None, slice_at=None):
    seed = suite.seed
    image = disk_image(suite, name, initial)
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
        ok, host_detail = check_backing_file(image, seed, queues, initial, slice_at)
        if not ok:
            problems.append(host_detail)
    detail = f"seed {seed}, {expect_queues} queue(s), host check of the backing file passed"
    if slice_at and not problems:
        detail += f" ({host_detail})"
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


SHUTDOWN_DISKTEST = "disktest.writes=4 disktest.random-reads=100 disktest.sequential-mib=1"


def traced_disk_test(suite, name, spec, device, events, shutdown):
    """A short disk test on a fresh disk behind `device`, with QEMU tracing `events` to a
    file; with `shutdown`, followed by the devices' part of a clean shutdown
    (disktest.shutdown). Returns the boot and the trace's lines."""
    trace = os.path.join(suite.log_dir, f"{name}.trace")
    if os.path.exists(trace):
        os.remove(trace)
    image = disk_image(suite, name)
    extra = ["-drive", f"file={image},format=raw,if=none,id=disk0,cache=writeback", "-device", device]
    for event in events:
        extra += ["-trace", f"enable={event}"]
    extra += ["-D", trace]
    append = f"disktest={spec} disktest.seed={suite.seed} {SHUTDOWN_DISKTEST}"
    append += " disktest.shutdown" if shutdown else ""
    r = suite.boot(name, append + " loglevel=info", timeout=DISK_TIMEOUT, smp=2, extra=extra)
    with open(trace, encoding="utf-8", errors="replace") as f:
        return r, f.read().splitlines()


def test_clean_shutdown_reaches_the_devices(suite):
    # The devices' part of `xl shutdown` (disktest.shutdown runs it after the disk test):
    # the cache flushed, then NVMe's shutdown notification or a virtio reset, seen by
    # QEMU's trace events. Each device boots twice, with the shutdown and without it (the
    # same seeded test): the shutdown adds exactly one flush, after every other command,
    # and the stop comes after it.
    def flush_pop(line):  # a virtio-blk flush: the header out, the status in
        return line.startswith("virtqueue_pop ") and line.endswith(" in_num 1 out_num 1")

    cases = [
        ("shutdown.nvme-flushed-then-shutdown-notification", "nvme:1", "nvme,drive=disk0,serial=x",
         ["pci_nvme_io_cmd", "pci_nvme_flush_ns", "pci_nvme_mmio_shutdown_set"],
         lambda l: l.startswith("pci_nvme_flush_ns "), lambda l: l.startswith("pci_nvme_io_cmd "),
         lambda l: l.startswith("pci_nvme_mmio_shutdown_set "),
         ["shutdown: nvme:1: flush done in ", "shutdown: nvme 00:03.0: shutdown notification done in "]),
        ("shutdown.virtio-flushed-then-reset", "virtio:0", "virtio-blk-pci,drive=disk0,num-queues=2",
         ["virtqueue_pop", "virtio_set_status"], flush_pop, lambda l: l.startswith("virtqueue_pop "),
         lambda l: l.startswith("virtio_set_status ") and l.endswith(" val 0"),
         ["shutdown: virtio:0: flush done in ", "shutdown: virtio-blk 00:03.0: reset done in "]),
    ]
    for name, spec, device, events, is_flush, is_request, is_stop, needles in cases:
        r, traced = traced_disk_test(suite, name, spec, device, events, shutdown=True)
        plain, untraced = traced_disk_test(suite, name + "-without", spec, device, events, shutdown=False)
        problems = []
        if r.verdict != "pass" or "disktest: PASS" not in r.log:
            problems.append(f"verdict {r.verdict}")
        if plain.verdict != "pass":
            problems.append(f"verdict {plain.verdict} without the shutdown")
        problems += [f"log lacks {n!r}" for n in needles if n not in r.log]
        flushes = sum(map(is_flush, traced))
        without = sum(map(is_flush, untraced))
        if flushes != without + 1:
            problems.append(f"{flushes} flushes reached the device, {without} without the shutdown")

        def after_last_request(lines):
            last = max((i for i, l in enumerate(lines) if is_request(l)), default=-1)
            return last, [l for l in lines[last + 1:] if is_stop(l)]

        last, stops = after_last_request(traced)
        if not stops:
            problems.append("the device was not stopped after its last request")
        elif last < 0 or not any(map(is_flush, traced[last:])):
            problems.append(f"the last request before the stop was not a flush: {traced[last] if last >= 0 else None!r}")
        if after_last_request(untraced)[1]:
            problems.append("without the shutdown the device was stopped too")
        detail = (f"{flushes} flushes ({without} without the shutdown), then {stops[0].split()[0] if stops else '-'}"
                  f" after the last request; {r.seconds:.1f} s")
        suite.record(name, not problems, "; ".join(problems) or detail, r)


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


def test_nvme_slice(suite):
    # An explicit extent: the test runs inside it, and the 40 MiB around it stay as they were.
    offset, size = 4 << 20, 24 << 20
    run_disk_test(suite, "disk.nvme-slice-verified-on-host", "nvme:1:offset=4M,size=24M",
                  ["-device", "nvme,drive=disk0,serial=blkdom-nvme"], smp=2, expect_queues=2,
                  expect_in_log=[f"the slice is bytes {offset}..{offset + size} (24M at 4M) of the device",
                                 f"a read at sector {size // 512}, past the slice's end, is refused",
                                 "the second open reads queue 0's last write back intact"],
                  initial=bytes([SLICE_FILL]) * DISK_BYTES, slice_at=(offset, size))


# Two partitions on the 64 MiB disk: 1 MiB to 9 MiB and 9 MiB to 33 MiB.
TIER2_PARTITIONS = [(1, 2048, 18431, "blkdom-a"), (2, 18432, 67583, "blkdom-b")]


def test_virtio_gpt_partition(suite):
    # A GPT partition by name: found through the device, and the table (primary and
    # backup) and the other partition are untouched.
    offset, size = 18432 * 512, (67583 - 18432 + 1) * 512
    run_disk_test(suite, "disk.virtio-gpt-partition-verified-on-host", "virtio:0:part=name:blkdom-b",
                  ["-device", "virtio-blk-pci,drive=disk0,num-queues=2"], smp=2, expect_queues=2,
                  expect_in_log=[f"the slice is bytes {offset}..{offset + size} (24M at 9M) of the device",
                                 "past the slice's end, is refused"],
                  initial=gpt_image(TIER2_PARTITIONS), slice_at=(offset, size))


def test_bad_slices_fail_precisely(suite):
    gpt = disk_image(suite, "slices-gpt", gpt_image(TIER2_PARTITIONS))
    blank = disk_image(suite, "slices-blank")
    nvme = lambda image: ["-drive", f"file={image},format=raw,if=none,id=disk0",
                          "-device", "nvme,drive=disk0,serial=x"]
    virtio = lambda image: ["-drive", f"file={image},format=raw,if=none,id=disk0",
                            "-device", "virtio-blk-pci,drive=disk0"]
    cases = [
        ("disk.slice-misaligned-offset-fails", "disktest=nvme:1:offset=1000,size=8M", nvme(blank),
         'nvme: offset="1000" must be a multiple of 4096 bytes'),
        ("disk.slice-zero-partition-fails", "disktest=virtio:0:part=0", virtio(blank),
         "virtio: part=0: partitions are numbered from 1"),
        ("disk.slice-beyond-device-fails", "disktest=nvme:1:offset=60M,size=8M", nvme(blank),
         "the slice (bytes 62914560..71303168 (8M at 60M)) ends beyond the device (67108864 bytes, 64M)"),
        ("disk.slice-unused-partition-fails", "disktest=nvme:1:part=3", nvme(gpt),
         "GPT: partition 3 is unused"),
        ("disk.slice-unknown-partition-name-fails", "disktest=virtio:0:part=name:blkdom-c", virtio(gpt),
         'GPT: no partition is named "blkdom-c"'),
        ("disk.slice-without-partition-table-fails", "disktest=virtio:0:part=1", virtio(blank),
         'GPT: no partition table: LBA 1 starts with "\\0\\0\\0\\0\\0\\0\\0\\0", not "EFI PART"'),
    ]
    for name, append, extra, needle in cases:
        r = suite.boot(name, append + " loglevel=info", timeout=60, extra=extra)
        failed_lines = [l for l in r.lines() if "disktest: FAIL" in l]
        ok = r.verdict == "fail" and bool(failed_lines) and needle in failed_lines[0]
        suite.record(name, ok, f"verdict {r.verdict} in {r.seconds:.1f} s: "
                     + (failed_lines[0].split("disktest: ", 1)[1] if failed_lines else "no FAIL line"), r)


NGUID_B = "0123456789abcdef0011223344556677"
EUI64_A = "0025382b0000000a"


def names_layout(images, slots):
    """QEMU arguments for two NVMe controllers and two virtio disks with serials (and an
    EUI-64 on A's namespace, an NGUID on B's), each in the PCI slot `slots` gives it,
    listed on the command line in slot order."""
    devices = {
        "nvme-a": ["-device", f"nvme,id=nvmea,serial=blkdom-sn-a,addr={slots['nvme-a']:#x}",
                   "-device", f"nvme-ns,drive=nvme-a,bus=nvmea,nsid=1,eui64=0x{EUI64_A}"],
        "nvme-b": ["-device", f"nvme,id=nvmeb,serial=blkdom-sn-b,addr={slots['nvme-b']:#x}",
                   "-device", f"nvme-ns,drive=nvme-b,bus=nvmeb,nsid=1,nguid={NGUID_B}"],
        "vd-a": ["-device", f"virtio-blk-pci,drive=vd-a,serial=vd-a,addr={slots['vd-a']:#x}"],
        "vd-b": ["-device", f"virtio-blk-pci,drive=vd-b,serial=vd-b,num-queues=2,addr={slots['vd-b']:#x}"],
    }
    args = []
    for name, path in images.items():
        args += ["-drive", f"file={path},format=raw,if=none,id={name}"]
    for name in sorted(devices, key=lambda n: slots[n]):
        args += devices[name]
    return args


def registry_steps(suite, name, steps, extra, smp=2, timeout=90):
    """Boots `registrytest=` with `steps` [(step, expected start of its line)]: the boot
    and the problems found."""
    r = suite.boot(name, "registrytest=" + ";".join(step for step, _ in steps) + " loglevel=info",
                   timeout=timeout, smp=smp, extra=extra)
    seen = [l.split("registrytest: ")[-1] for l in r.lines() if "registrytest: " in l]
    problems = []
    for (step, expected), line in zip(steps, seen):
        if not line.startswith(step + expected):
            problems.append(f"{step}: {line!r}, expected {step + expected!r}")
    if len(seen) != len(steps) + 1 or seen[-1:] != ["done"]:
        problems.append(f"{len(seen)} registrytest lines for {len(steps)} steps")
    if r.verdict != "pass":
        problems.append(f"verdict {r.verdict}")
    return r, problems


def test_registry_slices(suite):
    # The device registry without Xen (registrytest=): slices of one NVMe namespace and of
    # one virtio disk (4 virtqueues, 2 CPUs), overlaps refused naming both ranges, queues
    # reused after a release, virtqueues running out, bad slices refused, a slice over the
    # partition table of a partition serving refused.
    gpt = gpt_image(TIER2_PARTITIONS)
    nvme_image = disk_image(suite, "registry-nvme", gpt)
    virtio_image = disk_image(suite, "registry-virtio", gpt)
    whole = "the whole device, bytes 0..67108864 (64M at 0)"
    part_1 = "bytes 1048576..9437184 (8M at 1M)"
    steps = [
        ("+nvme:1:part=1", f": 2 queue(s), 16384 sectors: {part_1} of nvme"),
        ("+nvme:1:offset=8M,size=4M", ": refused: nvme:1:offset=8M,size=4M overlaps nvme:1:part=1, which serves "
         f"another disk: bytes 8388608..12582912 (4M at 8M) against {part_1}"),
        ("+nvme:1:part=name:blkdom-b", ": 2 queue(s), 49152 sectors: bytes 9437184..34603008 (24M at 9M) of nvme"),
        ("+nvme:1", f": refused: nvme:1 overlaps nvme:1:part=1, which serves another disk: {whole} against {part_1}"),
        ("+nvme:1:offset=33M,size=31M", ": 2 queue(s), 63488 sectors: bytes 34603008..67108864 (31M at 33M) of nvme"),
        ("-0", ": released"),
        ("+nvme:1:offset=1M,size=8M", f": 2 queue(s), 16384 sectors: {part_1} of nvme"),
        ("+nvme:1:part=3", ": refused: nvme:1:part=3: GPT: partition 3 is unused"),
        ("+virtio:0:part=2", ": 2 queue(s), 49152 sectors: bytes 9437184..34603008 (24M at 9M) of virtio-blk"),
        ("+virtio:0:part=name:blkdom-a", f": 2 queue(s), 16384 sectors: {part_1} of virtio-blk"),
        ("+virtio:0:offset=40M,size=4M", ": refused: virtio:0:offset=40M,size=4M: all 4 virtqueues of the device "
         "serve other disks"),
        ("-7", ": released"),
        ("+virtio:0:offset=40M,size=4M", ": 2 queue(s), 8192 sectors: bytes 41943040..46137344 (4M at 40M) of virtio-blk"),
        ("+virtio:0", ": refused: virtio:0 overlaps virtio:0:"),
        ("+nvme:1:offset=1000,size=1M", ': refused: params "nvme:1:offset=1000,size=1M": nvme: offset="1000" must be '
         "a multiple of 4096 bytes"),
        ("+nvme:1:offset=60M,size=8M", ": refused: nvme:1:offset=60M,size=8M: the slice (bytes 62914560..71303168 "
         "(8M at 60M)) ends beyond the device (67108864 bytes, 64M)"),
        # Not on the bus: the bus is walked once more, then the same refusal as ever.
        ("+virtio:1", ": refused: virtio:1: no virtio-blk device number 1 on the PCI bus"),
        # A slice over the GPT that part=name:blkdom-b was found by: its guest could
        # rewrite the table.
        ("+nvme:1:offset=0,size=1M", ": refused: nvme:1:offset=0,size=1M (bytes 0..1048576 (1M at 0)) covers the "
         "partition table (bytes 512..17408 (16896 at 512)) that nvme:1:part=name:blkdom-b, which serves another "
         "disk, was found by: its guest could rewrite the table"),
    ]
    extra = ["-drive", f"file={nvme_image},format=raw,if=none,id=disk0", "-device", "nvme,drive=disk0,serial=x",
             "-drive", f"file={virtio_image},format=raw,if=none,id=disk1",
             "-device", "virtio-blk-pci,drive=disk1,num-queues=4"]
    r, problems = registry_steps(suite, "registry.slices", steps, extra, timeout=60)
    for needle in ["blkback: nvme:1:offset=1M,size=8M reused (2 idle queue(s) of 6 made)",
                   "blkback: virtio:0:offset=40M,size=4M reused (2 idle queue(s) of 4 made)",
                   # Both devices brought up before the first disk (Devices::prepare).
                   "NVMe controller brought up at boot, before any disk",
                   "virtio-blk device brought up at boot, before any disk",
                   "pci: walked the bus again for a device the first walk did not find: not there"]:
        if needle not in r.log:
            problems.append(f"log lacks {needle!r}")
    # The bus is walked once (then once more for virtio:1 alone), and no disk's open
    # touches a configuration register. The first disk on the virtio device takes the
    # queues made at boot (its only register accesses are the partition table's reads;
    # bringing the device up is some 50); the first on the NVMe namespace makes its
    # queues (namespace identify, a completion and a submission queue per CPU) and reads
    # its table, with no bring-up phase.
    walks = r.log.count("configuration accesses); kept")
    if walks != 1:
        problems.append(f"the bus was walked {walks} times at boot, expected once")
    costs = re.findall(r"registry: \+(\S+) took .*; (\d+) config and (\d+) register accesses", r.log)
    boot_walk = re.search(r"pci: \d+ functions on the bus \((\d+) configuration accesses\)", r.log)
    for spec, config, _ in costs:
        # virtio:1 costs one walk of the bus, as many accesses as the walk at boot.
        expected = boot_walk.group(1) if spec == "virtio:1" and boot_walk else "0"
        if config != expected:
            problems.append(f"+{spec}: {config} configuration accesses, expected {expected}")
    if len(costs) != len(steps) - 2:
        problems.append(f"{len(costs)} opens timed for {len(steps) - 2} + steps")
    limits = {"virtio:0:part=2": 4, "virtio:1": 0}
    for spec, _, registers in costs:
        if spec in limits and int(registers) > limits[spec]:
            problems.append(f"+{spec}: {registers} register accesses, expected at most {limits[spec]}")
    brought_up = [l for l in r.lines() if "registry: +" in l and "bring-up" in l]
    if brought_up:
        problems.append(f"a device brought up at a disk's open: {brought_up[0]}")
    suite.record("registry.slices-overlaps-and-queues", not problems,
                 "; ".join(problems[:3]) or f"{len(steps)} steps as expected in {r.seconds:.1f} s", r)



def test_stable_device_names(suite):
    # Two NVMe controllers and two virtio disks, each named by what does not change (its
    # serial, its namespace's NGUID or EUI-64, its PCI address). A word is written through
    # each name and found in the right backing file; then the devices move to other PCI
    # slots, and each name still reaches its word, while the positional forms reach
    # another device than before.
    images = {n: disk_image(suite, f"names-{n}") for n in ["nvme-a", "nvme-b", "vd-a", "vd-b"]}
    first = {"nvme-a": 8, "nvme-b": 9, "vd-a": 10, "vd-b": 11}
    moved = {"vd-b": 8, "vd-a": 9, "nvme-b": 10, "nvme-a": 11}
    ok = ": 2 queue(s), 131072 sectors: "
    names = [f"nvme:serial=blkdom-sn-a:1", f"nvme:nguid={NGUID_B}", "virtio:serial=vd-a", "virtio:serial=vd-b"]
    words = ["via-sn-a", "via-nguid-b", "via-vd-a", "via-vd-b"]
    steps = [(f"+{n}", ok) for n in names]
    steps[0] = (steps[0][0], ok + "nvme 00:08.0")
    steps[1] = (steps[1][0], ok + "nvme 00:09.0")
    steps[2] = (steps[2][0], ok + "virtio-blk 00:0a.0")
    steps[3] = (steps[3][0], ok + "virtio-blk 00:0b.0")
    steps += [(f"w{i}={w}", ": written") for i, w in enumerate(words)]
    steps += [
        # Another name of a device serving: the same device, so the same claims.
        (f"+nvme:eui64={EUI64_A}", f": refused: nvme:eui64={EUI64_A} overlaps nvme:serial=blkdom-sn-a:1, which serves"),
        ("+virtio@00:0a.0", ": refused: virtio@00:0a.0 overlaps virtio:serial=vd-a, which serves"),
        ("+nvme:serial=nope:1", ": refused: nvme:serial=nope:1: matches none of the 2 NVMe controller device(s)"),
        ("+virtio:serial=vd-c", ": refused: virtio:serial=vd-c: matches none of the 2 virtio-blk device(s)"),
        ("+nvme@00:0a.0:1", ": refused: nvme@00:0a.0:1: no NVMe controller at PCI 00:0a.0"),
        ("-0", ": released"),
        (f"+nvme:eui64={EUI64_A}", ok + "nvme 00:08.0"),
        ("r9=via-sn-a", ": matches"),
        ("-9", ": released"),
        ("+nvme@00:08.0:1", ok + "nvme 00:08.0"),
        ("r10=via-sn-a", ": matches"),
    ]
    r, problems = registry_steps(suite, "names.first-layout", steps, names_layout(images, first))
    for needle in ["device: pci=00:08.0 kind=nvme state=up serial=blkdom-sn-a namespaces=1 model=QEMU NVMe Ctrl",
                   f"device: pci=00:08.0 ns=1 bytes=67108864 block=512 nguid=- eui64={EUI64_A}",
                   f"device: pci=00:09.0 ns=1 bytes=67108864 block=512 nguid={NGUID_B} eui64=-",
                   "device: pci=00:0a.0 kind=virtio state=up serial=vd-a bytes=67108864",
                   "device: pci=00:0b.0 kind=virtio state=up serial=vd-b bytes=67108864"]:
        if needle not in r.log:
            problems.append(f"log lacks {needle!r}")
    if not problems:
        for (name, path), word in zip(images.items(), words):
            with open(path, "rb") as f:
                head = f.read(4096)
            if head != word.encode().ljust(4096, b"\0"):
                problems.append(f"{name}'s backing file starts {head[:16]!r}, not {word!r}")
    suite.record("names.written-through-stable-names", not problems,
                 "; ".join(problems[:3]) or f"{len(steps)} steps; each word in its own backing file", r)

    steps = [(f"+{n}", ok) for n in names]
    steps[0] = (steps[0][0], ok + "nvme 00:0b.0")
    steps[1] = (steps[1][0], ok + "nvme 00:0a.0")
    steps[2] = (steps[2][0], ok + "virtio-blk 00:09.0")
    steps[3] = (steps[3][0], ok + "virtio-blk 00:08.0")
    steps += [(f"r{i}={w}", ": matches") for i, w in enumerate(words)]
    steps += [(f"-{i}", ": released") for i in range(4)]
    steps += [
        # The positional forms follow the bus: now the other devices.
        ("+nvme:1", ok + "nvme 00:0a.0"),
        ("r4=via-nguid-b", ": matches"),
        ("+virtio:0", ok + "virtio-blk 00:08.0"),
        ("r5=via-vd-b", ": matches"),
    ]
    r, more = registry_steps(suite, "names.moved-layout", steps, names_layout(images, moved))
    if "names a device by its position on the bus (nvme@00:0a.0:1 now)" not in r.log:
        more.append("no warning for the positional name")
    suite.record("names.same-data-after-the-slots-moved", not more,
                 "; ".join(more[:3]) or f"{len(steps)} steps; every stable name reached its word", r)

    # Two controllers with one serial: a name by it is refused, said at boot; the others
    # still serve.
    twins = ["-drive", f"file={images['nvme-a']},format=raw,if=none,id=t0",
             "-drive", f"file={images['nvme-b']},format=raw,if=none,id=t1",
             "-device", "nvme,drive=t0,serial=twin,addr=0x8", "-device", "nvme,drive=t1,serial=twin,addr=0x9"]
    steps = [("+nvme:serial=twin:1", ": refused: nvme:serial=twin:1: matches two NVMe controller devices, "
              "at PCI 00:08.0 and 00:09.0: refused rather than guessed"),
             ("+nvme@00:09.0:1", ok + "nvme 00:09.0"),
             ("r1=via-nguid-b", ": matches")]
    r, more = registry_steps(suite, "names.duplicate-serial", steps, twins)
    if 'nvme 00:08.0 and 00:09.0 both have serial "twin"' not in r.log:
        more.append("no boot-time warning of the duplicate serial")
    suite.record("names.duplicate-serial-refused", not more, "; ".join(more[:3]) or "refused, others serve", r)


def test_ram_disk(suite):
    # The same test through the RAM disk's CPU-copy path (no backing file to check).
    r = suite.boot("disk.ram", f"disktest=ram:32M disktest.seed={suite.seed} loglevel=info", timeout=DISK_TIMEOUT, smp=2)
    verified = len(re.findall(r"disktest: queue \d+ verified \d+ writes", r.log))
    ok = r.verdict == "pass" and "disktest: PASS" in r.log and verified == 2
    suite.record("disk.ram-disk-two-queues", ok, f"verdict {r.verdict}, {verified} queues verified", r)


def test_live_upgrade_jump(suite):
    """upgradetest=3 with 4 CPUs: the test image upgrades to a copy whose build id
    differs (the module), which upgrades to itself twice; each new image must log that it
    booted from the handover (old and new build id, the upgrade count), release the 3
    parked vCPUs into its own AP entry and hand each of them work. A named 1 MiB RAM disk
    goes along: each image checks the word the previous one wrote in its first block,
    that it holds the very stripes handed over, and writes its own."""
    variant = os.path.join(suite.log_dir, "blkdom-variant.elf")
    os.makedirs(suite.log_dir, exist_ok=True)
    ids = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..",
                          "tools", "upgrade", "build_id_variant.py"), suite.image, variant],
                         check=True, capture_output=True, text=True).stdout.split()
    old, new = ids
    r = suite.boot("upgrade.jump", "upgradetest=3 loglevel=info", timeout=90, smp=4,
                   extra=["-initrd", variant])
    problems = []
    if r.verdict != "pass":
        problems.append(f"verdict {r.verdict}")
    started = re.findall(r"blkdom \S+ build ([0-9a-f]+) starting", r.log)
    if started != [old, new, new, new]:
        problems.append(f"images started: {started}, expected {old} then {new} three times")
    booted = re.findall(r"booted from a handover: build ([0-9a-f]+) -> ([0-9a-f]+), upgrade (\d+), (\d+) vCPUs", r.log)
    expected = [(old, new, "1", "4"), (new, new, "2", "4"), (new, new, "3", "4")]
    if booted != expected:
        problems.append(f"handovers {booted}, expected {expected}")
    if r.log.count("upgrade: 3 parked vCPUs released") != 3:
        problems.append("not every new image released its 3 parked vCPUs")
    if r.log.count("4 CPUs online, every released one took work") != 3:
        problems.append("not every new image gave its released CPUs work")
    if r.log.count("upgrade: 3 vCPUs parked; jumping") != 3:
        problems.append("not every jump parked 3 vCPUs first")
    carried = re.findall(r"upgradetest: RAM disk: (upgrade-\d+) matches", r.log)
    if carried != ["upgrade-1", "upgrade-2", "upgrade-3"]:
        problems.append(f"the RAM disk's word read back {carried}, expected upgrade-1..3")
    if r.log.count("RAM disk upgradetest taken over (1 MiB, 16 stripes resident)") != 3:
        problems.append("the RAM disk was not taken over by every new image")
    suite.record("upgrade.jump-three-times-four-cpus", not problems,
                 "; ".join(problems) or f"3 upgrades ({old[:8]} -> {new[:8]} -> {new[:8]} -> "
                 f"{new[:8]}), 3 vCPUs parked and released each time, the RAM disk's contents kept, "
                 f"in {r.seconds:.1f} s", r)


def test_live_upgrade_brings_devices_back(suite):
    """upgradetest=3 upgradetest.devices with an NVMe controller and a virtio disk: each
    image checks the word the previous one wrote in the first block of nvme:1 and
    virtio:0, writes its own, then flushes and stops both devices as a switch does (NVMe
    CC.EN = 0, virtio reset, bus mastering off); the new image's probe must bring them up
    again and read the word back."""
    variant = os.path.join(suite.log_dir, "blkdom-variant.elf")
    os.makedirs(suite.log_dir, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..",
                    "tools", "upgrade", "build_id_variant.py"), suite.image, variant],
                   check=True, capture_output=True)
    disks = []
    for name in ("upgrade-nvme.img", "upgrade-virtio.img"):
        path = os.path.join(suite.log_dir, name)
        with open(path, "wb") as f:
            f.truncate(16 << 20)
        disks.append(path)
    extra = ["-initrd", variant,
             "-drive", f"file={disks[0]},format=raw,if=none,id=upnvme,cache=writeback",
             "-device", "nvme,drive=upnvme,serial=upgrade-nvme",
             "-drive", f"file={disks[1]},format=raw,if=none,id=upvirtio,cache=writeback",
             "-device", "virtio-blk-pci,drive=upvirtio,num-queues=2"]
    r = suite.boot("upgrade.devices", "upgradetest=3 upgradetest.devices loglevel=info", timeout=120,
                   smp=2, extra=extra)
    problems = []
    if r.verdict != "pass":
        problems.append(f"verdict {r.verdict}")
    seen = re.findall(r"upgradetest: RAM disk: (.*)", r.log)
    for n in (1, 2, 3):
        line = next((l for l in seen if l.startswith(f"upgrade-{n} matches")), "")
        for spec in ("nvme:1", "virtio:0"):
            if f"{spec}: upgrade-{n} matches" not in line:
                problems.append(f"{spec} after upgrade {n}: {line or 'no line'}")
    # Each of the 4 images stops them (the last one before it powers off).
    if sum("2 device(s) stopped" in l for l in seen) != 4:
        problems.append(f"the devices were not stopped by each of the 4 images: {seen}")
    with open(disks[0], "rb") as f:
        if b"upgrade-4" not in f.read(512):
            problems.append("the NVMe disk's first block lacks the last image's word")
    suite.record("upgrade.devices-brought-up-again", not problems,
                 "; ".join(problems[:3]) or f"nvme:1 and virtio:0 stopped before 3 jumps, brought up by "
                 f"each new image, their first blocks carried, in {r.seconds:.1f} s", r)


def test_live_upgrade_refuses_a_corrupt_block(suite):
    """upgradetest.corrupt: the old image flips the last byte of the handover block before
    the jump; the new image must find the block, refuse it (its checksum), keep nothing
    it lists and boot cold."""
    variant = os.path.join(suite.log_dir, "blkdom-variant.elf")
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..",
                    "tools", "upgrade", "build_id_variant.py"), suite.image, variant],
                   check=True, capture_output=True)
    r = suite.boot("upgrade.corrupt", "upgradetest=1 upgradetest.corrupt loglevel=info",
                   timeout=90, smp=2, extra=["-initrd", variant])
    problems = []
    if r.verdict != "pass":
        problems.append(f"verdict {r.verdict}")
    for needle in ["last byte flipped on purpose", "handover block refused: handover checksum differs",
                   "the corrupted block was refused; booted cold"]:
        if needle not in r.log:
            problems.append(f"log lacks {needle!r}")
    if "booted from a handover" in r.log or "kept as the handover lists them" in r.log:
        problems.append("the corrupt block was used")
    suite.record("upgrade.corrupt-block-refused", not problems,
                 "; ".join(problems) or f"refused, booted cold, in {r.seconds:.1f} s", r)


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


def test_device_faults(suite):
    # QEMU's own devices fail (faulttest=, a test hook): blkdebug answers EIO for reads
    # touching one sector, and null-co completes reads only after 4 s (latency-ns). The
    # read of the failing sector, and only it, must be answered Error with the device
    # serving on; the stalled read must be given up at its deadline (device.timeout-ms)
    # with the device's bus mastering off, while the other device serves reads all
    # along; later requests to the stopped device fail at once; and when the device does
    # complete the read, its data must not reach memory. QEMU maps a command's memory
    # when it starts it, so that last holds through bounce buffers (faulttest.bounce: the
    # path emulated devices take under Xen), not for direct DMA: a real device stops at
    # bus mastering off. A virtio-blk device is not stalled here: QEMU drains its
    # requests when its bus mastering goes off (the vCPU waits for the stall); the host
    # tests stall one. The error sector is 2048, as the config says. That case runs
    # without recovery (device.max-resets=0); the last one recovers the stalled device.
    blkdebug = os.path.join(os.path.dirname(suite.log_dir.rstrip("/")) or ".", "blkdebug-sector.conf")
    os.makedirs(os.path.dirname(blkdebug) or ".", exist_ok=True)
    with open(blkdebug, "w") as f:
        f.write('[inject-error]\nevent = "read_aio"\nerrno = "5"\nsector = "2048"\n')
    image = disk_image(suite, "faults-error")
    failing = ["-drive", f"if=none,id=disk0,format=raw,file=blkdebug:{blkdebug}:{image}"]
    stalling = ["-blockdev", "driver=null-co,node-name=stall0,size=67108864,latency-ns=4000000000,read-zeroes=on"]
    # A controller whose first namespace takes 3 s a read (null-co's latency holds every
    # read: QEMU 10.0's blkdebug cannot delay one) and whose second answers at once: with
    # recovery (device.max-resets, default 3) the stalled read is aborted or the
    # controller reset, after which both namespaces serve.
    recovering = ["-blockdev", "driver=null-co,node-name=slow0,size=67108864,latency-ns=3000000000,read-zeroes=on",
                  "-blockdev", "driver=null-co,node-name=fast0,size=67108864,read-zeroes=on",
                  "-device", "nvme,id=nvme0,serial=recovers",
                  "-device", "nvme-ns,drive=slow0,bus=nvme0,nsid=1",
                  "-device", "nvme-ns,drive=fast0,bus=nvme0,nsid=2"]
    cases = [
        ("faults.virtio-error-and-nvme-stall",
         "faulttest=virtio:0 faulttest.stall=nvme:1 faulttest.bounce faulttest.late-ms=4000 device.timeout-ms=1000 device.max-resets=0",
         failing + ["-device", "virtio-blk-pci,drive=disk0"] + stalling + ["-device", "nvme,drive=stall0,serial=stall"],
         ["virtio:0: the read of sector 2048 answered Error, the reads around it Ok; the device serves on",
          "nvme:1: the stalled read answered Error after", "device stopped (bus mastering off)",
          "pci 00:04.0: bus mastering off", "nvme:1: a later read answered Error in",
          "nvme:1: the device completed the stalled read after 4000 ms: nothing reached memory",
          "virtio:0 still serves"]),
        ("faults.nvme-error",
         "faulttest=nvme:1",
         failing + ["-device", "nvme,drive=disk0,serial=x"],
         ["nvme:1: the read of sector 2048 answered Error, the reads around it Ok; the device serves on"]),
        ("faults.nvme-stall-recovers",
         "faulttest=virtio:0 faulttest.stall=nvme:1 faulttest.after-reset=nvme:2 faulttest.bounce faulttest.late-ms=3000 device.timeout-ms=1000",
         failing + ["-device", "virtio-blk-pci,drive=disk0"] + recovering,
         ["nvme: q1 command 0 got no completion in", "nvme: the controller: resetting",
          "nvme: q1 serves again after the controller reset; 1 requests it held fail",
          "bus mastering on again", "the device recovered",
          "nvme:1: nothing of the stalled read reached memory",
          "nvme:2: 8 reads after the reset answered Ok within the deadline",
          "nvme:1: a read after the reset answered Ok", "virtio:0 still serves"]),
    ]
    for name, append, extra, needles in cases:
        r = suite.boot(name, append + " loglevel=info", timeout=60, extra=extra)
        problems = [] if r.verdict == "pass" and "faulttest: PASS" in r.log else [f"verdict {r.verdict}"]
        problems += [f"log lacks {n!r}" for n in needles if n not in r.log]
        stalled = re.search(r"the stalled read answered Error after (\d+) ms .*; virtio:0 served (\d+) reads", r.log)
        detail = f"in {r.seconds:.1f} s"
        if stalled:
            detail += f"; stalled read answered after {stalled.group(1)} ms (deadline 1000 ms), {stalled.group(2)} reads served on the other device meanwhile"
        abort = re.search(r"nvme: q1 command 0 (not aborted|aborted)|nvme: abort of q1 command 0: [^\n]*", r.log)
        if abort and "resetting" in r.log:
            detail += f"; abort: {abort.group(0).split(': ', 1)[1]}, then a reset"
        failed = [l for l in r.lines() if "faulttest: FAIL" in l]
        if failed:
            problems.append(failed[0].split("faulttest: ", 1)[1])
        suite.record(name, not problems, "; ".join(problems) or detail, r)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True, help="the test image (built with --features test-hooks)")
    parser.add_argument("--production-image", help="the production image: checked for test hooks, booted once")
    parser.add_argument("--log-dir", default="target/qemu/tier2")
    parser.add_argument("--seed", type=int, help="seed of the disk tests' writes (default: random, printed)")
    parser.add_argument("--only", help="run only the tests whose function name contains this (e.g. device_faults)")
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
                 test_nvme_slice, test_virtio_gpt_partition, test_bad_slices_fail_precisely,
                 test_registry_slices, test_stable_device_names,
                 test_missing_or_failing_disk_fails_cleanly, test_device_faults,
                 test_clean_shutdown_reaches_the_devices, test_live_upgrade_jump,
                 test_live_upgrade_brings_devices_back, test_live_upgrade_refuses_a_corrupt_block]:
        if args.only and args.only not in test.__name__:
            continue
        try:
            test(suite)
        except Exception as e:  # a runner bug is a failure, not a crash of the suite
            suite.record(test.__name__, False, f"runner error: {e!r}")
    for test in [test_production_image_has_no_test_hooks, test_production_image_boots]:
        if args.only and args.only not in test.__name__:
            continue
        if not args.production_image:
            print(f"tier2: {test.__name__} not run: no --production-image")
            continue
        try:
            test(suite, args.production_image)
        except Exception as e:
            suite.record(test.__name__, False, f"runner error: {e!r}")
    print(f"tier2: {suite.passed} passed, {suite.failed} failed")
    return 0 if suite.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
