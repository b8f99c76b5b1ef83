#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Host tests of the nested rig's shell helpers (tests/xen/lib.sh, which sources
tests/xen/lib/*.sh from $RIG: here the repository): those that read
blkdom's statistics (pollers_value, blkdom_holds_nothing, with a fake xenstore-read first
on PATH) and its log (blkdom_logged, with a fake xl and console log), what the scenarios
check blkdom's log with, the GPT of tests/xen/blkdom-operator (made on the host by
drivers/backing's gpt-image from the scenario's rig-gpt header, put on the disk by
gpt_onto, read back by a parser of its own here, with zlib's CRC-32), the pattern its
guests write (slice_pattern, the same in the guests' init), and what the sweeps print
from fio's JSON, the backend's CPU and blkdom's counters (fio_read_stats, job_stats,
variants_summary, notify_counters). Under sh, and under busybox sh (dom0's shell in the
rig) when it is installed:

    python3 -m unittest discover -s tests/bench -v
"""

import re
import shutil
import struct
import subprocess
import tempfile
import unittest
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "tests" / "xen" / "lib.sh"
GUEST_INIT = REPO / "tools" / "rig" / "initramfs" / "guest-init"
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
               "RIG": str(REPO)}
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

    def test_blkdom_logged_reads_xens_ring_and_the_console(self):
        """blkdom's earliest line is in Xen's ring only, a long later one whole only in
        its console (the ring splits it at 200 characters), another domain's lines are
        not blkdom's, and a console line written a moment later is still found."""
        console = self.fake / "console"
        console.mkdir()
        (self.fake / "xl").write_text(
            '#!/bin/sh\n[ "$1" = dmesg ] || exit 1\n'
            "echo '(d7) INFO  [   0.01] blkdom: devices: a command not completed in 5000 ms "
            "fails and stops its device'\n"
            "echo '(d7) ERROR [  57.79] backend::control: blkback: nvme:1: the device failed "
            "(another queue of the device failed; every request an'\n"
            "echo '(d7)  swered with an error); it serves no disk until blkdom restarts'\n"
            "echo '(d17) INFO  bus mastering off: the device reaches no memory any more'\n")
        (self.fake / "xl").chmod(0o755)
        (console / "guest-blkdom.log").write_text(
            "INFO  [  57.79] backend::control: blkback: nvme:1: the device failed (another "
            "queue of the device failed; every request answered with an error); it serves "
            "no disk until blkdom restarts\n")
        checks = [
            ("a command not completed in 5000 ms fails", 0, True),
            (r"nvme:1: the device failed \(.*it serves no disk until blkdom restarts", 0, True),
            ("bus mastering off", 0, False),
            ("the device model still holds the command", 2, True),
        ]
        for shell in SHELLS:
            (console / "guest-blkdom.log").write_text(
                (console / "guest-blkdom.log").read_text().splitlines()[0] + "\n")
            script = (f'CONSOLE_DIR="{console}"; bid=7; '
                      f'(sleep 1; echo "blkback: 51728/2: the device model still holds the '
                      f'command" >> "{console}/guest-blkdom.log") & ')
            for pattern, seconds, found in checks:
                script += (f"blkdom_logged '{pattern}' {seconds} && echo found || "
                           "echo missing; ")
            with self.subTest(shell=shell[0]):
                out = self.run_lib("", script + "wait", shell)
                self.assertEqual(out.split(),
                                 ["found" if found else "missing" for _, _, found in checks])


class RigScenarioTest(unittest.TestCase):
    """What the scenarios check blkdom's log with, and which suite they are in."""

    XEN = Path(__file__).resolve().parents[1] / "xen"

    def test_blkdom_faults_runs_in_test_xen(self):
        header = (self.XEN / "blkdom-faults").read_text()
        self.assertIn("\n# rig-suite: test-xen\n", header)

    def test_checks_on_blkdoms_lines_read_its_whole_log(self):
        # Xen's ring alone misses nothing early but splits long lines and wraps; the
        # console alone misses the earliest lines: blkdom_log / blkdom_logged read both.
        for name in ("blkdom-faults", "blkdom-grants", "blkdom-shutdown"):
            text = (self.XEN / name).read_text()
            with self.subTest(scenario=name):
                self.assertNotRegex(text, r'xl dmesg \| grep "\(d\$bid\) "')


def fio_json(read_iops: float, read_p50_ns: int, write_iops: float = 0.0,
             write_p50_ns: int = 0) -> str:
    """A fio JSON output (--output-format=json, one job) cut down to the lines around what
    the rig reads, laid out as fio 3.x prints them."""
    def side(name, iops, p50):
        lines = [f'      "{name}" : {{', '        "io_bytes" : 4096,', '        "bw" : 1000,',
                 f'        "iops" : {iops:.6f},', '        "iops_min" : 1,',
                 '        "iops_max" : 99999,', '        "slat_ns" : {', '          "min" : 1,',
                 '          "mean" : 2.0', '        },', '        "clat_ns" : {',
                 '          "min" : 1,', '          "mean" : 2.0,']
        if iops:
            lines += ['          "percentile" : {', f'            "1.000000" : {p50 // 2},',
                      f'            "50.000000" : {p50},',
                      f'            "99.000000" : {p50 * 3}', '          }']
        lines += ['        },', '        "lat_ns" : {', '          "min" : 1,',
                  '          "mean" : 2.0', '        }', '      },']
        return "\n".join(lines) + "\n"
    return ('{\n  "fio version" : "fio-3.33",\n  "jobs" : [\n    {\n'
            '      "jobname" : "fio-randread-4k-qd32-1j",\n      "job options" : {\n'
            '        "rw" : "randread"\n      },\n'
            + side("read", read_iops, read_p50_ns) + side("write", write_iops, write_p50_ns)
            + side("trim", 0, 0) + '      "sync" : {\n        "total_ios" : 0\n      }\n'
            '    }\n  ]\n}\n')


class RigSweepTest(unittest.TestCase):
    """What tests/xen/spin-sweep and notify-sweep print: fio_read_stats, backend_cpu_percent,
    job_stats, variants_summary and notify_counters."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_lib(self, script: str, shell) -> str:
        env = {"PATH": f"{self.dir}/bin:/usr/bin:/bin", "RIG": str(REPO),
               "RESULTS": str(self.dir)}
        result = subprocess.run([*shell, "-c", f'. "{LIB}"; {script}'], env=env,
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.stderr, "")
        return result.stdout

    def test_blkdoms_command_line_from_dom0s_and_into_the_config(self):
        # cmdline_arg stands in for dom0's /proc/cmdline.
        stub = ('cmdline_arg() { [ "$1" = rig.x.blkdom ] && '
                'echo "poll.idle=pause:notify.hold-us=0+poll.spin-us=20-200"; }; ')
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                self.assertEqual(self.run_lib(
                    stub + 'blkdom_cmdline_from rig.x.blkdom; echo "[$BLKDOM_CMDLINE]"; '
                    "blkdom_cmdline_config", shell),
                    "[poll.idle=pause notify.hold-us=0 poll.spin-us=20-200]\n"
                    "blkdom=poll.idle=pause:notify.hold-us=0:poll.spin-us=20-200\n")
                self.assertEqual(self.run_lib(
                    stub + "blkdom_cmdline_from rig.y.blkdom; blkdom_cmdline_config", shell),
                    "blkdom=\n")

    def test_cpu_seconds_of_one_domain_or_of_several_together(self):
        # A fake xl list: a header and the domain's line, Time(s) in the sixth column.
        (self.dir / "bin").mkdir()
        (self.dir / "bin" / "xl").write_text(
            "#!/bin/sh\n"
            'echo "Name ID Mem VCPUs State Time(s)"\n'
            'case $2 in\n'
            '  Domain-0) echo "Domain-0 0 2048 2 r----- 1234.5" ;;\n'
            '  blkdom) echo "blkdom 5 128 2 -b---- 99.25" ;;\n'
            "esac\n")
        (self.dir / "bin" / "xl").chmod(0o755)
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                self.assertEqual(self.run_lib("cpu_seconds blkdom", shell), "99.2\n")
                self.assertEqual(self.run_lib("cpu_seconds Domain-0+blkdom", shell),
                                 "1333.8\n")
                # A domain that is gone: no figure, not a partial sum.
                self.assertEqual(self.run_lib("cpu_seconds Domain-0+gone", shell), "")

    def test_fio_read_stats_reads_the_read_side(self):
        (self.dir / "r.json").write_text(fio_json(1261.4, 20578304))
        (self.dir / "w.json").write_text(fio_json(0, 0, 500.0, 99000))
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                self.assertEqual(self.run_lib(f'fio_read_stats "{self.dir}/r.json"', shell),
                                 "iops=1261 p50_us=20578\n")
                # A write job: 0 read IOPS, not the write side's figures.
                self.assertEqual(self.run_lib(f'fio_read_stats "{self.dir}/w.json"', shell),
                                 "iops=0 p50_us=0\n")
                self.assertEqual(self.run_lib(f'fio_read_stats "{self.dir}/none.json"', shell),
                                 "")

    def test_job_stats_divide_iops_by_the_backends_cpu(self):
        (self.dir / "fio-g-j.json").write_text(fio_json(1000.0, 99840))
        (self.dir / "cpu-g-j.txt").write_text("backend=blkdom cpu_s=12.5 wall_s=31.0\n")
        (self.dir / "fio-g-k.json").write_text(fio_json(1000.0, 99840))
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                # 12.5 s of CPU over 31 s less the 6 s the guest idled: 50%.
                self.assertEqual(self.run_lib("job_stats g j 6", shell),
                                 "iops=1000 p50_us=100 cpu_pct=50.0 iops_per_cpu_pct=20.0\n")
                self.assertEqual(self.run_lib("backend_cpu_percent "
                                              f'"{self.dir}/cpu-g-j.txt"', shell), "40.3\n")
                # No CPU sample: IOPS and p50 only.
                self.assertEqual(self.run_lib("job_stats g k", shell),
                                 "iops=1000 p50_us=100\n")
                self.assertEqual(self.run_lib("job_stats g missing", shell), "no fio results\n")

    def test_variants_summary_takes_medians_over_rounds_in_order(self):
        (self.dir / "v.txt").write_text(
            "default q32 iops=100 p50_us=20 cpu_pct=90\n"
            "poll.idle=yield q32 iops=120 p50_us=25 cpu_pct=50\n"
            "default q32 iops=300 p50_us=10 cpu_pct=95\n"
            "poll.idle=yield q32 iops=110 p50_us=24 cpu_pct=60\n"
            "default q32 iops=200 p50_us=15 cpu_pct=91\n"
            "default q1 no fio results\n")
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                self.assertEqual(self.run_lib(f'variants_summary "{self.dir}/v.txt"', shell), (
                    "default q32: rounds=3 iops=200 (100-300) p50_us=15 cpu_pct=91\n"
                    "poll.idle=yield q32: rounds=2 iops=115 (110-120) p50_us=24.5 cpu_pct=55\n"
                    "default q1: rounds=1 without-results=1\n"))

    def test_notify_counters_never_subtract_a_missing_sample(self):
        stats = ("queues=1 rd_req={} notifications={} responses={} notifications-held={} "
                 "notify-holds-wasted=1 notify-holds-declined=0 notify-holds-deadline={} "
                 "notify-holds-quiet=2 notify-holds-depth={} notify-holds-drained=0 "
                 "notify-holds-sleep=3")
        (self.dir / "counters-g.txt").write_text(
            "begin q32 " + stats.format(0, 0, 0, 0, 0, 0) + "\n"
            "end q32 " + stats.format(1000, 100, 1000, 90, 7, 83) + "\n"
            "begin q1 " + stats.format(1010, 101, 1010, 90, 7, 83) + "\n"
            # The guest was gone when its last job's end was read: nothing.
            "end q1 \n")
        (self.dir / "guest-g.log").write_text(
            "rig-guest: irq before q32 5\r\nrig-guest: irq after q32 105\r\n"
            "rig-guest: irq before q1 110\r\nrig-guest: irq after q1 400\r\n")
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                out = sorted(self.run_lib("notify_counters g", shell).splitlines())
                self.assertEqual(out, [
                    "rig: g q1: counters missing at the end of the job",
                    "rig: g q32: requests=1000 events=100 held=90 wasted=0 declined=0 "
                    "guest_irqs=100 ended_deadline=7 ended_quiet=0 ended_depth=83 "
                    "ended_drained=0 ended_sleep=0 events/request=0.100 irqs/io=0.100"])

    def test_run_variants_alternates_rounds(self):
        # Stand-ins for the rig: each blkdom boot notes its command line, each guest writes
        # a fio result whose IOPS say which boot it was.
        stubs = f'''
boot_blkdom() {{ n=$((n + 1)); echo "boot $n [$BLKDOM_CMDLINE]" >> "{self.dir}/boots"; }}
run_fio_guest() {{
  for job in $(echo "$4" | tr , ' '); do
    fio_json > "$RESULTS/fio-$1-$job.json"
    sed -i "s/\\"iops\\" : 1000.0/\\"iops\\" : $((n * 100)).0/" "$RESULTS/fio-$1-$job.json"
    echo "backend=blkdom cpu_s=5 wall_s=10" > "$RESULTS/cpu-$1-$job.txt"
  done
}}
blkdom_pollers() {{ echo pollers; }}
domid_of() {{ echo 3; }}
n=0
'''
        (self.dir / "template.json").write_text(fio_json(1000.0, 50000))
        (self.dir / "bin").mkdir()
        (self.dir / "bin" / "xl").write_text("#!/bin/sh\n")
        (self.dir / "bin" / "xl").chmod(0o755)
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                (self.dir / "boots").write_text("")
                out = self.run_lib(
                    f'fio_json() {{ cat "{self.dir}/template.json"; }}; {stubs}'
                    'run_variants t 2 a,b 0 default poll.idle=yield:poll.spin-us=20-200',
                    shell)
                self.assertEqual((self.dir / "boots").read_text().splitlines(), [
                    "boot 1 []", "boot 2 [poll.idle=yield poll.spin-us=20-200]",
                    "boot 3 []", "boot 4 [poll.idle=yield poll.spin-us=20-200]"])
                lines = [line for line in out.splitlines() if " median: " in line]
                self.assertEqual(lines, [
                    "rig: t median: default a: rounds=2 iops=200 (100-300) p50_us=50 "
                    "cpu_pct=50 iops_per_cpu_pct=4",
                    "rig: t median: default b: rounds=2 iops=200 (100-300) p50_us=50 "
                    "cpu_pct=50 iops_per_cpu_pct=4",
                    "rig: t median: poll.idle=yield:poll.spin-us=20-200 a: rounds=2 iops=300 "
                    "(200-400) p50_us=50 cpu_pct=50 iops_per_cpu_pct=6",
                    "rig: t median: poll.idle=yield:poll.spin-us=20-200 b: rounds=2 iops=300 "
                    "(200-400) p50_us=50 cpu_pct=50 iops_per_cpu_pct=6"])
                self.assertIn("rig: t poll.idle=yield:poll.spin-us=20-200 round 2 b: iops=400 "
                              "p50_us=50 cpu_pct=50.0 iops_per_cpu_pct=8.0", out)

    def test_a_guest_short_of_its_jobs_fails(self):
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                out = self.run_lib("CHECK_TAG=rig-check; check_job_count g 30 39;"
                                   " check_job_count g 39 39; echo failed=$checks_failed",
                                   shell)
                self.assertEqual(out.splitlines(), [
                    "rig-check: FAIL guest g has 30 of the 39 jobs asked for", "failed=1"])

    def run_guest_function(self, name: str, script: str, shell) -> str:
        """guest-init's shell function NAME defined, then SCRIPT run, under SHELL."""
        function = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", GUEST_INIT.read_text(),
                             re.MULTILINE | re.DOTALL)
        self.assertIsNotNone(function, f"guest-init defines {name}")
        result = subprocess.run([*shell, "-c", function.group(0) + script],
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.stderr, "")
        return result.stdout

    def test_the_guest_runs_a_paired_job_on_its_disk(self):
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                out = self.run_guest_function(
                    "job_target", "disk=/dev/xvda; job_target fio-read-1m-qd4-1j@xvdb@2;"
                    " job_target fio-read-1m-qd4-1j; job_target verify-4k", shell)
                self.assertEqual(out.splitlines(), [
                    "fio-read-1m-qd4-1j /dev/xvdb", "fio-read-1m-qd4-1j /dev/xvda",
                    "verify-4k /dev/xvda"])

    def test_the_guest_pairs_its_jobs_and_alternates_the_first_disk_by_round(self):
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                out = self.run_guest_function("paired_jobs", 'paired_jobs "x-fill a b" 3',
                                              shell).split()
                self.assertEqual(out, [
                    "await-xvdb", "x-fill@xvda@0", "x-fill@xvdb@0",
                    "a@xvda@1", "a@xvdb@1", "b@xvda@1", "b@xvdb@1",
                    "a@xvdb@2", "a@xvda@2", "b@xvdb@2", "b@xvda@2",
                    "a@xvda@3", "a@xvdb@3", "b@xvda@3", "b@xvdb@3"])
                # 3 + 2 x rounds x jobs: the count tests/xen/paired expects.
                self.assertEqual(len(out), 3 + 2 * 3 * 2)

    def test_the_guest_lingers_before_powering_off(self):
        # notify-sweep reads its last job's end counters from the guest's vbd.
        text = GUEST_INIT.read_text()
        self.assertIn('sleep "$(arg rig.linger | grep . || echo 0)"\npoweroff -f\n', text)
        self.assertTrue(text.endswith("poweroff -f\n"))


# GPT's "Linux filesystem data" type, as stored (mixed-endian GUID).
LINUX_DATA = bytes.fromhex("af3dc60f838472478e793d69d8477de4")
DISK_BYTES = 256 << 20
# tests/xen/blkdom-operator's table: partitions at 100M and 228M, 16 MiB each.
PARTS = [(1, 204800, 237567, "p1-data"), (2, 466944, 499711, "guest7")]
OPERATOR = REPO / "tests" / "xen" / "blkdom-operator"


def rig_gpt_header(scenario: Path) -> list:
    """The words of a scenario's "# rig-gpt:" header (tools/rig/run.sh hands them to
    gpt-image)."""
    found = re.search(r"^# rig-gpt: *(.*)$", scenario.read_text(), re.MULTILINE)
    return found.group(1).split() if found else []


class RigGptTest(unittest.TestCase):
    """The GPT of tests/xen/blkdom-operator: made on the host from its rig-gpt header by
    drivers/backing's gpt-image (as tools/rig/run.sh makes it), put over the start of a
    disk by lib.sh's gpt_onto under each shell, and read back by a parser of its own here
    (with zlib's CRC-32). And the pattern its guests write (slice_pattern)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_sh(self, script: str, shell, rig: Path = REPO) -> bytes:
        env = {"PATH": "/usr/bin:/bin", "RIG": str(rig), "TMPDIR": str(self.dir)}
        result = subprocess.run([*shell, "-c", script], env=env, capture_output=True,
                                timeout=60)
        self.assertEqual(result.stderr, b"")
        self.assertEqual(result.returncode, 0)
        return result.stdout

    def test_the_header_is_the_scenarios_disk(self):
        words = rig_gpt_header(OPERATOR)
        self.assertEqual(words[1:], [f"{n}:{first}:{last}:{name}"
                                     for n, first, last, name in PARTS])
        nvme_mib = self.run_sh(f'. "{LIB}"; echo "$NVME_MIB"', SHELLS[0]).decode().strip()
        self.assertEqual(words[0], f"{nvme_mib}M", "the table is for lib.sh's NVMe disk")
        self.assertEqual(DISK_BYTES, int(nvme_mib) << 20)

    def written_gpt(self, shell) -> bytes:
        """The host's table (images/gpt.img of an input disk) put on a fresh disk by dom0's
        gpt_onto; the disk's first 2 MiB."""
        rig = self.dir / "rig"
        if not rig.exists():
            (rig / "images").mkdir(parents=True)
            (rig / "tests").symlink_to(REPO / "tests")
            result = subprocess.run(
                ["cargo", "run", "-q", "--manifest-path",
                 str(REPO / "drivers" / "backing" / "Cargo.toml"), "--example", "gpt-image",
                 "--", str(rig / "images" / "gpt.img"), *rig_gpt_header(OPERATOR)],
                capture_output=True, text=True, timeout=600)
            self.assertEqual(result.returncode, 0, result.stderr)
        image = self.dir / "disk.img"
        with open(image, "wb") as f:
            f.truncate(DISK_BYTES)
        self.run_sh(f'. "{LIB}"; gpt_onto "{image}"', shell, rig)
        self.assertEqual(image.stat().st_size, DISK_BYTES)
        with open(image, "rb") as f:
            return f.read(2 << 20)

    @unittest.skipUnless(shutil.which("cargo"), "no cargo to build gpt-image with")
    def test_the_operators_gpt(self):
        blocks = DISK_BYTES // 512
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                disk = self.written_gpt(shell)
                # Protective MBR: one partition of type 0xEE from LBA 1 over the disk.
                status, kind, start, size = struct.unpack_from("<B3xB3xII", disk, 446)
                self.assertEqual((status, kind, start, size), (0, 0xEE, 1, blocks - 1))
                self.assertEqual(disk[510:512], b"\x55\xaa")
                # Primary header at LBA 1, its CRC over its 92 bytes with the field zero.
                header = disk[512:512 + 92]
                (signature, revision, size, crc, _, my_lba, alternate, first_usable,
                 last_usable, _guid, entries_lba, count, entry_size,
                 entries_crc) = struct.unpack("<8sIIIIQQQQ16sQIII", header)
                self.assertEqual(signature, b"EFI PART")
                self.assertEqual((revision, size), (0x10000, 92))
                self.assertEqual(crc, zlib.crc32(header[:16] + bytes(4) + header[20:]))
                self.assertEqual((my_lba, alternate, first_usable, last_usable),
                                 (1, blocks - 1, 34, blocks - 34))
                self.assertEqual((entries_lba, count, entry_size), (2, 128, 128))
                entries = disk[1024:1024 + 128 * 128]
                self.assertEqual(entries_crc, zlib.crc32(entries))
                for number in range(1, 129):
                    entry = entries[(number - 1) * 128:number * 128]
                    wanted = [p for p in PARTS if p[0] == number]
                    if not wanted:
                        self.assertEqual(entry, bytes(128), f"entry {number}")
                        continue
                    _, first, last, name = wanted[0]
                    kind, unique, lba0, lba1, attributes = struct.unpack_from("<16s16sQQQ", entry)
                    self.assertEqual((kind, unique), (LINUX_DATA, bytes([number]) * 16))
                    self.assertEqual((lba0, lba1, attributes), (first, last, 0))
                    self.assertEqual(entry[56:], name.encode("utf-16-le").ljust(72, b"\0"))
                # Nothing else written: the rest of the header's block and what follows
                # the entry array are zero.
                self.assertEqual(disk[0:446], bytes(446))
                self.assertEqual(disk[512 + 92:1024], bytes(512 - 92))
                self.assertEqual(disk[1024 + 128 * 128:], bytes(len(disk) - 1024 - 128 * 128))

    def test_gpt_onto_without_a_table_fails(self):
        image = self.dir / "disk.img"
        image.write_bytes(bytes(4096))
        rig = self.dir / "rig-without-images"
        rig.mkdir()
        (rig / "tests").symlink_to(REPO / "tests")
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                out = self.run_sh(f'. "{LIB}"; gpt_onto "{image}" && echo wrote || echo none',
                                  shell, rig)
                self.assertEqual(out, b"none\n")
                self.assertEqual(image.read_bytes(), bytes(4096))

    def test_slice_pattern_is_the_guests(self):
        guest = re.search(r"^slice_pattern\(\) \{\n.*?^\}\n", GUEST_INIT.read_text(),
                          re.MULTILINE | re.DOTALL)
        self.assertIsNotNone(guest, "guest-init defines slice_pattern")
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                dom0 = self.run_sh(f'. "{LIB}"; slice_pattern slice-b 100000', shell)
                guests = self.run_sh(guest.group(0) + "slice_pattern slice-b 100000", shell)
                self.assertEqual(dom0, guests)
                self.assertEqual(len(dom0), 100000)
                self.assertTrue(dom0.startswith(b"slice-b slice-b "))
                self.assertNotEqual(dom0, self.run_sh(f'. "{LIB}"; slice_pattern slice-a 100000',
                                                      shell))


class RigNvmeHostTest(unittest.TestCase):
    """dom0 as an NVMe/TCP host (tests/xen/lib/nvmet.sh): the options it writes to
    /dev/nvme-fabrics, the namespace's block device found from the controller in sysfs
    (with and without native multipath), and a disconnect that deletes only the
    controllers of the subsystem named; over a fake /sys/class/nvme."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.sys = Path(self.tmp.name) / "class-nvme"

    def tearDown(self):
        self.tmp.cleanup()

    def controller(self, name: str, subsysnqn: str, *children: str) -> Path:
        ctrl = self.sys / name
        ctrl.mkdir(parents=True)
        (ctrl / "subsysnqn").write_text(subsysnqn + "\n")
        (ctrl / "delete_controller").write_text("")
        for child in children:
            (ctrl / child).mkdir()
        return ctrl

    def run_lib(self, script: str, shell) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "RIG": str(REPO)}
        return subprocess.run([*shell, "-c", f'. "{LIB}"; NVME_CLASS="{self.sys}"; {script}'],
                              env=env, capture_output=True, text=True, timeout=30)

    def test_the_options_are_nvme_connects(self):
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                out = self.run_lib("dom0_nvme_options nqn.x:y; dom0_nvme_options nqn.x:y nqn.h:z",
                                   shell).stdout.splitlines()
                self.assertEqual(out, [
                    "transport=tcp,traddr=10.9.0.1,trsvcid=4420,nqn=nqn.x:y,"
                    "hostnqn=nqn.2026-12.dev.blkdom:rig-dom0,ctrl_loss_tmo=30",
                    "transport=tcp,traddr=10.9.0.1,trsvcid=4420,nqn=nqn.x:y,"
                    "hostnqn=nqn.h:z,ctrl_loss_tmo=30"])

    def test_the_namespace_with_and_without_multipath(self):
        self.controller("nvme0", "nqn.pci", "nvme0n1")
        self.controller("nvme2", "nqn.x:y", "nvme1c2n1", "power")
        self.controller("nvme3", "nqn.x:y")
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                result = self.run_lib("nvme_namespace_dev nvme0; nvme_namespace_dev nvme2;"
                                      " nvme_namespace_dev nvme3 || echo none", shell)
                self.assertEqual(result.stderr, "")
                self.assertEqual(result.stdout.splitlines(),
                                 ["/dev/nvme0n1", "/dev/nvme1n1", "none"])

    def test_a_disconnect_deletes_the_subsystems_controllers_only(self):
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                if self.sys.exists():
                    shutil.rmtree(self.sys)
                ours = [self.controller("nvme2", "nqn.x:y"), self.controller("nvme4", "nqn.x:y")]
                other = self.controller("nvme0", "nqn.pci")
                result = self.run_lib("dom0_nvme_disconnect nqn.x:y && echo gone;"
                                      " dom0_nvme_disconnect nqn.none || echo none", shell)
                self.assertEqual(result.stderr, "")
                self.assertEqual(result.stdout.splitlines(), ["gone", "none"])
                for ctrl in ours:
                    self.assertEqual((ctrl / "delete_controller").read_text(), "1\n")
                self.assertEqual((other / "delete_controller").read_text(), "")


if __name__ == "__main__":
    unittest.main()
