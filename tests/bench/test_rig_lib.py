#!/usr/bin/env python3
"""Host tests of the nested rig's shell helpers (tests/xen/lib.sh): those that read
blkdom's statistics (pollers_value, blkdom_holds_nothing, with a fake xenstore-read first
on PATH) and its log (blkdom_logged, with a fake xl and console log), what the scenarios
check blkdom's log with, and the GPT dom0 writes for tests/xen/blkdom-operator (write_gpt, read back by
a parser of its own here, with zlib's CRC-32) and the pattern its guests write
(slice_pattern, the same in the guests' init). Under sh, and under busybox sh (dom0's shell in the rig) when it is installed:

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

LIB = Path(__file__).resolve().parents[1] / "xen" / "lib.sh"
GUEST_INIT = Path(__file__).resolve().parents[2] / "tools" / "rig" / "initramfs" / "guest-init"
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
        for name in ("blkdom-faults", "blkdom-grants"):
            text = (self.XEN / name).read_text()
            with self.subTest(scenario=name):
                self.assertNotRegex(text, r'xl dmesg \| grep "\(d\$bid\) "')


# GPT's "Linux filesystem data" type, as stored (mixed-endian GUID).
LINUX_DATA = bytes.fromhex("af3dc60f838472478e793d69d8477de4")
DISK_BYTES = 256 << 20
PARTS = [(1, 204800, 237567, "p1-data"), (2, 466944, 499711, "guest7")]


class RigGptTest(unittest.TestCase):
    """write_gpt and slice_pattern, run under each shell with a crc32 of zlib's on PATH
    (busybox's own is checked against it separately: dom0 uses busybox's)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        (self.dir / "bin").mkdir()
        crc32 = self.dir / "bin" / "crc32"
        crc32.write_text("#!/usr/bin/env python3\nimport sys, zlib\n"
                         "print('%08x %s' % (zlib.crc32(open(sys.argv[1], 'rb').read()), "
                         "sys.argv[1]))\n")
        crc32.chmod(0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def run_sh(self, script: str, shell) -> bytes:
        env = {"PATH": f"{self.dir / 'bin'}:/usr/bin:/bin", "RIG": "/nonexistent",
               "TMPDIR": str(self.dir)}
        result = subprocess.run([*shell, "-c", script], env=env, capture_output=True,
                                timeout=60)
        self.assertEqual(result.stderr, b"")
        self.assertEqual(result.returncode, 0)
        return result.stdout

    def written_gpt(self, shell) -> bytes:
        image = self.dir / "disk.img"
        with open(image, "wb") as f:
            f.truncate(DISK_BYTES)
        parts = "\n".join(f"{n} {first} {last} {name}" for n, first, last, name in PARTS)
        self.run_sh(f'. "{LIB}"; write_gpt "{image}" {DISK_BYTES} "{parts}"', shell)
        self.assertEqual(image.stat().st_size, DISK_BYTES)
        with open(image, "rb") as f:
            return f.read(2 << 20)

    def test_write_gpt(self):
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
                self.assertEqual(disk[512 + 92:1024], bytes(512 - 92))
                self.assertEqual(disk[1024 + 128 * 128:], bytes(len(disk) - 1024 - 128 * 128))

    @unittest.skipUnless(shutil.which("busybox"), "no busybox")
    def test_busybox_crc32_is_gpts_crc(self):
        data = self.dir / "data"
        data.write_bytes(b"123456789")
        out = subprocess.run(["busybox", "crc32", str(data)], capture_output=True, text=True,
                             timeout=30).stdout
        self.assertEqual(out.split()[0], "%08x" % zlib.crc32(b"123456789"))

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


if __name__ == "__main__":
    unittest.main()
