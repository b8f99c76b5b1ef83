#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Host tests of tools/blkdom-stat (no Xen needed):

    python3 -m unittest discover -s tests/bench -v

The tool runs with fake xenstore-read, xenstore-list, xl and sleep first on PATH. They
serve a canned xenstore: a blkdom (domain 1) serving two disks, mq's (2 queues, ring order
2, persistent grants, 128 MiB) and web's (1 queue, 4 GiB of 4 KiB sectors), whose
blkdom-stats and pollers' line change at known times of a fake clock that only `sleep`
moves. The tool's table is checked against the known deltas. When busybox is installed
the tool runs under its sh too (dom0's shell in the rig).

--prometheus (PrometheusTest) runs on lines carrying every word README.md documents; its
output is parsed with prometheus_client and tools/rig/prom_check.py's stricter rules, and
each word's metric, labels and value are checked against the input.
"""

import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "blkdom-stat"
sys.path.insert(0, str(REPO / "tools" / "rig"))
import prom_check  # noqa: E402  (path set up above)
BE = "/local/domain/1/backend/vbd"

# The fakes read $FAKE/store: "TIME<tab>PATH<tab>VALUE" lines; a path's value at clock T
# is that of its last line with TIME <= T ($FAKE/clock, moved on by the fake sleep).
FAKES = {
    "xenstore-read": r"""#!/bin/sh
awk -F '\t' -v p="$1" -v t="$(cat "$FAKE/clock")" '
  $2 == p && $1 <= t { v = $3; found = 1 }
  END { if (!found) { print "could not read path " p > "/dev/stderr"; exit 1 }; print v }
' "$FAKE/store"
""",
    "xenstore-list": r"""#!/bin/sh
awk -F '\t' -v p="$1/" '
  index($2, p) == 1 { c = substr($2, length(p) + 1); sub(/\/.*/, "", c)
                      if (!(c in seen)) print c; seen[c] = 1 }
  END { if (!length(seen)) { print "could not list " p > "/dev/stderr"; exit 1 } }
' "$FAKE/store"
""",
    "xl": r"""#!/bin/sh
[ "$1" = domid ] || { echo "fake xl: only domid" >&2; exit 2; }
awk -F '\t' -v n="$2" '$2 ~ /^\/local\/domain\/[0-9]+\/name$/ && $3 == n {
  split($2, part, "/"); print part[4]; found = 1 }
  END { if (!found) { print "Can'"'"'t get domid of domain name " n > "/dev/stderr"; exit 1 } }
' "$FAKE/store"
""",
    "sleep": """#!/bin/sh
echo $(( $(cat "$FAKE/clock") + $1 )) > "$FAKE/clock"
""",
}


def disk_keys(fid: int, devid: int, dev: str, params: str, sectors: int, sector_size: int,
              frontend: dict) -> dict:
    be = f"{BE}/{fid}/{devid}"
    fe = f"/local/domain/{fid}/device/vbd/{devid}"
    keys = {f"{be}/{k}": v for k, v in {
        "frontend": fe, "frontend-id": fid, "dev": dev, "params": params, "mode": "w",
        "state": 4, "sectors": sectors, "sector-size": sector_size,
        "feature-persistent": 1, "multi-queue-max-queues": 4, "max-ring-page-order": 4,
        "feature-max-indirect-segments": 512}.items()}
    keys.update({f"{fe}/{k}": v for k, v in {"state": 4, "protocol": "x86_64-abi",
                                             **frontend}.items()})
    return keys


STATIC = {
    "/local/domain/0/name": "Domain-0",
    "/local/domain/1/name": "blkdom",
    "/local/domain/3/name": "mq",
    "/local/domain/4/name": "web",
    **disk_keys(3, 51712, "xvda", "ram:128M", 262144, 512,
                {"multi-queue-num-queues": 2, "ring-page-order": 2, "feature-persistent": 1}),
    **disk_keys(4, 51728, "xvdb", "nvme:1", 8388608, 4096, {"feature-persistent": 0}),
}

# Counters at each time blkdom rewrites them (clock 0, 1, 6, 11): (mq, web) as
# (rd_req, rd_sect, wr_req, wr_sect), and the pollers' loop count.
SNAPSHOTS = [
    (0, (100, 800, 50, 400), (0, 0, 10, 20480), 1000),
    # 4 KiB reads and writes on mq, 1 MiB writes on web.
    (1, (1000, 8000, 500, 4000), (0, 0, 20, 40960), 2000),
    # +5 s: mq +4000 reads (+32000 sectors), +1000 writes (+8000); web +500 writes of 1 MiB.
    (6, (5000, 40000, 1500, 12000), (0, 0, 520, 1064960), 3000),
    # +10 s after clock 1: mq +12000 reads (+96000), +2000 writes; web +2000 writes (1 MiB).
    (11, (13000, 104000, 2500, 20000), (0, 0, 2020, 4136960), 4000),
]


# A blkdom with the grant budget adds these: per disk (mq caches, web has no persistent
# grants), and the domain's limits in the pollers' line, after the vCPUs.
GRANTS = {"mq": " persistent-grants=300 grant-cap=4096 capped-requests=12 idle-released=40 "
                "cap-evicted=0",
          "web": " persistent-grants=0 grant-cap=0 capped-requests=0 idle-released=0 "
                 "cap-evicted=0"}
GRANT_BUDGET = (" grant-budget=65536 grant-max-per-ring=8448 grant-idle-s=60 grant-rings=2 "
                "grant-share=8448;")


def stats_line(queues: int, counters: tuple, grants: str = "") -> str:
    rd_req, rd_sect, wr_req, wr_sect = counters
    return (f"queues={queues} oo_req=3 rd_req={rd_req} wr_req={wr_req} f_req=7 ds_req=0 "
            f"rd_sect={rd_sect} wr_sect={wr_sect} indirect=0 errors=0 bad-requests=0 "
            f"polls=99 grants-mapped=300{grants} leaked-pages=0 bounced-bytes=0")


# blkdom's heap on the pollers' line (382 MiB: 381 MiB free, 1 MiB and a bit in use).
HEAP = " heap-free=399486976 heap-used=1069056;"


def store_lines(snapshots=SNAPSHOTS, budget=False, heap=False) -> str:
    lines = [f"0\t{path}\t{value}" for path, value in STATIC.items()]
    for time, mq, web, loops in snapshots:
        mq_grants, web_grants, tail = ((GRANTS["mq"], GRANTS["web"], GRANT_BUDGET) if budget
                                       else ("", "", ""))
        lines.append(f"{time}\t{BE}/3/51712/blkdom-stats\t{stats_line(2, mq, mq_grants)}")
        lines.append(f"{time}\t{BE}/4/51728/blkdom-stats\t{stats_line(1, web, web_grants)}")
        lines.append(f"{time}\t/local/domain/1/data/blkdom-pollers\tvcpu0: rings=2 "
                     f"loops={loops} busy=5 sleeps=9; vcpu1: rings=1 loops={loops} busy=1 "
                     f"sleeps=8;{tail} bounced-bytes=0;{HEAP if heap else ''} "
                     f"mapped-pages=1030")
    return "\n".join(lines) + "\n"


SHELLS = [["sh"]] + ([["busybox", "sh"]] if shutil.which("busybox") else [])


class FakeXenstore(unittest.TestCase):
    """A temporary directory with the fakes in it (`self.fake`)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.fake = Path(self.tmp.name)
        for name, text in FAKES.items():
            (self.fake / name).write_text(text)
            (self.fake / name).chmod(0o755)

    def tearDown(self):
        self.tmp.cleanup()


class BlkdomStatTest(FakeXenstore):
    def setUp(self):
        super().setUp()
        (self.fake / "store").write_text(store_lines())

    def run_tool(self, *args, shell=("sh",)) -> subprocess.CompletedProcess:
        (self.fake / "clock").write_text("0\n")
        env = {"PATH": f"{self.fake}:/usr/bin:/bin", "FAKE": str(self.fake)}
        return subprocess.run([*shell, str(TOOL), *args], env=env, capture_output=True,
                              text=True, timeout=60)

    def clock(self) -> int:
        return int((self.fake / "clock").read_text())

    def rows(self, result) -> dict:
        """Table rows by guest name, split into columns."""
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[1].startswith("GUEST "), result.stdout)
        return {line.split()[0]: line.split() for line in lines[2:]
                if not line.startswith(("pollers:", "grants:"))}

    def test_table_and_rates_over_five_seconds(self):
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                result = self.run_tool(shell=shell)
                rows = self.rows(result)
                lines = result.stdout.splitlines()
                self.assertEqual(lines[0], "blkdom (domain 1): 2 disk(s), rates over 5 s")
                self.assertEqual(lines[1].split(), [
                    "GUEST", "DOMID", "DEVICE", "STATE", "SIZE", "QUEUES", "ORDER",
                    "PERSIST", "INDIRECT", "R-IOPS", "R-MiB/s", "W-IOPS", "W-MiB/s",
                    "BACKING"])
                # 4000 reads and 1000 writes of 4 KiB in 5 s; 500 writes of 1 MiB.
                self.assertEqual(rows["mq"], ["mq", "3", "xvda", "connected", "128M", "2", "2",
                                              "yes", "512", "800", "3.1", "200", "0.8",
                                              "ram:128M"])
                # sectors are 512-byte units whatever sector-size says: 4 GiB.
                self.assertEqual(rows["web"], ["web", "4", "xvdb", "connected", "4G", "1", "0",
                                               "no", "512", "0", "0.0", "100", "100.0",
                                               "nvme:1"])
                self.assertEqual(lines[-1], "pollers: rings vcpu0=2 vcpu1=1; "
                                            "bounced-bytes=0; mapped-pages=1030")
                # Synchronised on the rewrite at 1, then the one at 6.
                self.assertEqual(self.clock(), 6)

    def test_grants_against_the_budget(self):
        (self.fake / "store").write_text(store_lines(budget=True))
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                result = self.run_tool("-1", shell=shell)
                lines = result.stdout.splitlines()
                self.assertEqual(lines[-2], "pollers: rings vcpu0=2 vcpu1=1; "
                                            "bounced-bytes=0; mapped-pages=1030")
                self.assertEqual(lines[-1], "grants: persistent=300 of budget 65536 (2 rings, "
                                            "8448 each, idle release 60s); idle-released=40 "
                                            "capped-requests=12")
                self.assertEqual(len(self.rows(result)), 2)
        # Without a budget in blkdom's statistics, no grants line.
        (self.fake / "store").write_text(store_lines())
        self.assertFalse(self.run_tool("-1").stdout.splitlines()[-1].startswith("grants:"))

    def test_the_heading_names_the_build_blkdom_published(self):
        lines = store_lines().splitlines()
        lines.append("0\t/local/domain/1/data/blkdom-build\t0.1.0 4f2a9c1e")
        (self.fake / "store").write_text("\n".join(lines) + "\n")
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                result = self.run_tool("-1", shell=shell)
                self.assertEqual(result.stdout.splitlines()[0],
                                 "blkdom (domain 1, build 0.1.0 4f2a9c1e): 2 disk(s)")

    def test_limits_of_the_disks_that_have_them(self):
        lines = store_lines(budget=True).splitlines()
        # mq is limited and waited; web's limits were lifted ("none": no line).
        lines.append(f"0\t{BE}/3/51712/blkdom-limits\tiops=2000 burst-ms=100")
        lines.append(f"0\t{BE}/4/51728/blkdom-limits\tnone")
        lines = [line.replace("leaked-pages=0", "throttle-waits=42 throttle-ns=3500000000 "
                              "leaked-pages=0") if "3/51712/blkdom-stats" in line else line
                 for line in lines]
        (self.fake / "store").write_text("\n".join(lines) + "\n")
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                result = self.run_tool("-1", shell=shell)
                out = result.stdout.splitlines()
                self.assertEqual(out[-1], "limits: mq xvda: iops=2000 burst-ms=100; "
                                          "throttle-waits=42 throttle-ms=3500")
                self.assertTrue(out[-2].startswith("grants: "), result.stdout)
        # No disk with limits: no line.
        (self.fake / "store").write_text(store_lines(budget=True))
        self.assertFalse(any(line.startswith("limits:")
                             for line in self.run_tool("-1").stdout.splitlines()))

    def test_heap(self):
        (self.fake / "store").write_text(store_lines(budget=True, heap=True))
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                result = self.run_tool("-1", shell=shell)
                lines = result.stdout.splitlines()
                self.assertEqual(lines[-2], "pollers: rings vcpu0=2 vcpu1=1; "
                                            "bounced-bytes=0; mapped-pages=1030; "
                                            "heap-free=381.0M heap-used=1.0M")
                self.assertTrue(lines[-1].startswith("grants: persistent=300 of budget 65536"),
                                result.stdout)

    def test_longer_interval(self):
        result = self.run_tool("-i", "10")
        self.assertIn("rates over 10 s", result.stdout)
        rows = self.rows(result)
        self.assertEqual(rows["mq"][9:13], ["1200", "4.7", "200", "0.8"])
        self.assertEqual(rows["web"][11:13], ["200", "200.0"])
        self.assertEqual(self.clock(), 11)
        # Rounded up to blkdom's 5 s period.
        self.assertIn("rates over 10 s", self.run_tool("-i", "7").stdout)

    def test_one_snapshot(self):
        result = self.run_tool("-1", "-d", "1")
        rows = self.rows(result)
        self.assertEqual(result.stdout.splitlines()[0], "blkdom (domain 1): 2 disk(s)")
        self.assertEqual(rows["mq"], ["mq", "3", "xvda", "connected", "128M", "2", "2", "yes",
                                      "512", "ram:128M"])
        self.assertEqual(self.clock(), 0)

    def test_idle_counters_give_zero_rates_in_bounded_time(self):
        (self.fake / "store").write_text(store_lines(SNAPSHOTS[:1]))
        rows = self.rows(self.run_tool())
        self.assertEqual(rows["mq"][9:13], ["0", "0.0", "0", "0.0"])
        self.assertEqual(self.clock(), 6 + 4 + 6)

    def test_devices_and_their_stable_names(self):
        dev = "/local/domain/1/data/blkdom-devices"
        listed = [
            "pci=00:04.0 kind=nvme state=up serial=SN-A namespaces=2 model=QEMU NVMe Ctrl",
            "pci=00:04.0 ns=1 bytes=67108864 block=512 nguid=- eui64=0025382b0000000a",
            "pci=00:04.0 ns=2 bytes=1073741824 block=4096 nguid=0123456789abcdef0011223344556677 eui64=-",
            "pci=00:05.0 kind=nvme state=up serial=twin namespaces=1 model=Twin A",
            "pci=00:05.0 ns=1 bytes=512 block=512 nguid=- eui64=00000000000000aa",
            "pci=00:06.0 kind=nvme state=up serial=twin namespaces=1 model=Twin B",
            "pci=00:06.0 ns=1 bytes=512 block=512 nguid=- eui64=-",
            "pci=00:07.0 kind=nvme state=failed serial=- namespaces=0 model=- error=nvme 00:07.0: bring-up: timed out",
            "pci=00:08.0 kind=virtio state=up serial=vd-a bytes=536870912",
            "pci=00:09.0 kind=virtio state=up serial=- bytes=1048576",
            "pci=00:0a.0 kind=virtio state=failed serial=- bytes=- error=virtio 00:0a.0: id: no answer",
        ]
        # Listed out of order, as xenstored may; 10 after 9.
        order = [3, 0, 1, 2, 10, 4, 5, 6, 7, 8, 9]
        # xenstored makes the parent of a node written (empty).
        extra = f"0\t{dev}\t\n" + "".join(f"0\t{dev}/{n}\t{listed[n]}\n" for n in order)
        (self.fake / "store").write_text(store_lines() + extra)
        for shell in SHELLS:
            with self.subTest(shell=shell[0]):
                result = self.run_tool("-D", shell=shell)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(result.stdout.splitlines(), [
                    "blkdom (domain 1): 7 device(s)",
                    "PCI     KIND   STATE  SERIAL               MODEL / NAMESPACE",
                    "00:04.0 nvme   up     SN-A                 QEMU NVMe Ctrl",
                    "       ns 1        64M  nguid=- eui64=0025382b0000000a  target=nvme:serial=SN-A:1",
                    "       ns 2         1G  nguid=0123456789abcdef0011223344556677 eui64=-  "
                    "target=nvme:serial=SN-A:2",
                    # Two controllers share a serial: a name by it would be refused.
                    "00:05.0 nvme   up     twin                 Twin A",
                    "       ns 1        512  nguid=- eui64=00000000000000aa  target=nvme:eui64=00000000000000aa",
                    "00:06.0 nvme   up     twin                 Twin B",
                    "       ns 1        512  nguid=- eui64=-  target=nvme@00:06.0:1",
                    "00:07.0 nvme   failed -                    nvme 00:07.0: bring-up: timed out",
                    "00:08.0 virtio up     vd-a                 512M  target=virtio:serial=vd-a",
                    "00:09.0 virtio up     -                    1M  target=virtio@00:09.0",
                    "00:0a.0 virtio failed -                    virtio 00:0a.0: id: no answer",
                ])
                self.assertEqual(self.clock(), 0)
        # A PVH blkdom drives no PCI device: the node alone.
        (self.fake / "store").write_text(store_lines() + f"0\t{dev}\t\n")
        result = self.run_tool("-D")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines()[0], "blkdom (domain 1): 0 device(s)")
        self.assertEqual(len(result.stdout.splitlines()), 2)
        (self.fake / "store").write_text(store_lines())
        result = self.run_tool("-D")
        self.assertEqual(result.returncode, 1)
        self.assertIn("publishes no device list", result.stderr)

    def test_missing_domain_or_statistics(self):
        for args, message in ((["-d", "nosuch"], "no domain named 'nosuch'"),
                              (["-d", "9"], "no domain with id 9"),
                              (["-d", "Domain-0"], "publishes no blkdom statistics"),
                              (["-i", "x"], "-i wants whole seconds")):
            with self.subTest(args=args):
                result = self.run_tool(*args)
                self.assertEqual(result.returncode, 1)
                self.assertIn(message, result.stderr)
                self.assertEqual(result.stdout, "")


def readme_table(heading: str) -> list:
    """The rows of the first table under README.md's `heading`, split into cells."""
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n{heading}\n")
    body = text[start + len(heading) + 2:]
    body = body[:body.find("\n#")] if "\n#" in body else body
    rows = [line for line in body.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def tool_table() -> list:
    """blkdom-stat's metrics table: (scope, field, metric, type, scale, help) rows."""
    text = TOOL.read_text()
    body = text[text.index("metrics_table() {"):]
    body = body[body.index("<<'EOF'\n") + 8:body.index("\nEOF\n")]
    return [line.split("|") for line in body.splitlines()]


# Every word blkdom publishes, as README.md documents them: a disk's blkdom-stats and
# the pollers' line (per vCPU, then the domain's).
STATS_WORDS = [row[0].strip("`") for row in readme_table("### Statistics: `blkdom-stats`")]
POLLER_WORDS = [(row[0].strip("`"), row[1].startswith("per vCPU"))
                for row in readme_table("### Statistics: `data/blkdom-pollers`")]
NET_WORDS = [row[0].strip("`") for row in readme_table("### Statistics: `data/blkdom-net`")]
REMOTE_WORDS = [row[0].strip("`")
                for row in readme_table("### Statistics: `data/blkdom-remotes/<n>`")]
# Two remote namespaces (by number, their target): one plain, one whose subsystem NQN has
# a space and a quote (an NQN may), which must reach its label whole and escaped.
REMOTES = {0: "nvme-tcp:10.9.0.1:4420:1:nqn=nqn.2026-12.dev.blkdom:disk",
           2: 'nvme-tcp:10.9.0.7:4420:3:nqn=nqn.2026-12.dev.blkdom:odd "one"'}


def net_keys() -> dict:
    """data/blkdom-net and data/blkdom-remotes/<n> as blkdom writes them: the vif's n-th
    word worth 7000 + n, remote r's n-th word 8000 + 100 r + n, then its target."""
    home = "/local/domain/1/data"
    keys = {f"{home}/blkdom-net": " ".join(f"{w}={7000 + n}" for n, w in enumerate(NET_WORDS))}
    for r, target in REMOTES.items():
        words = " ".join(f"{w}={8000 + 100 * r + n}" for n, w in enumerate(REMOTE_WORDS))
        keys[f"{home}/blkdom-remotes/{r}"] = f"{words} target={target}"
    return keys


def full_stats_line(base: int) -> str:
    """Every blkdom-stats word, the n-th worth base + n."""
    return " ".join(f"{word}={base + n}" for n, word in enumerate(STATS_WORDS))


def full_pollers_line() -> str:
    """The pollers' line of a 2-vCPU blkdom as blkdom writes it, every field distinct."""
    vcpu = [w for w, per_vcpu in POLLER_WORDS if per_vcpu]
    rest = [w for w, per_vcpu in POLLER_WORDS if not per_vcpu]
    cpus = "; ".join(f"vcpu{c}: " + " ".join(f"{w}={1000 * (c + 1) + n}"
                                              for n, w in enumerate(vcpu)) for c in (0, 1))
    # grant-*, then bounced-bytes, the heap, and mapped-pages last, ";" between groups.
    groups = [[w for w in rest if w.startswith("grant-")], ["bounced-bytes"],
              ["heap-free", "heap-used"], ["mapped-pages"]]
    assert sorted(sum(groups, [])) == sorted(rest), rest
    tail = "; ".join(" ".join(f"{w}={5000 + rest.index(w)}" for w in group)
                     for group in groups)
    return f"{cpus}; {tail}"


class PrometheusTest(FakeXenstore):
    """--prometheus against the same fake xenstore, with every word blkdom publishes."""

    def setUp(self):
        super().setUp()
        self.write_store()
        # dom0 runs busybox: its awk, tr and mv too, not only its sh.
        self.busybox_bin = self.fake / "busybox-bin"
        if shutil.which("busybox"):
            self.busybox_bin.mkdir()
            for tool in ("awk", "tr", "mv", "rm", "cat", "sed"):
                (self.busybox_bin / tool).symlink_to(shutil.which("busybox"))

    def write_store(self, extra: dict = None, mq_words: str = ""):
        keys = {**STATIC, **net_keys(), **(extra or {})}
        lines = [f"0\t{path}\t{value}" for path, value in keys.items()]
        lines.append(f"0\t{BE}/3/51712/blkdom-stats\t{full_stats_line(100)}{mq_words}")
        lines.append(f"0\t{BE}/4/51728/blkdom-stats\t{full_stats_line(200)}")
        lines.append(f"0\t/local/domain/1/data/blkdom-pollers\t{full_pollers_line()}")
        (self.fake / "store").write_text("\n".join(lines) + "\n")

    def shells(self):
        yield "sh", ["sh"], ""
        if shutil.which("busybox"):
            yield "busybox", ["busybox", "sh"], f"{self.busybox_bin}:"

    def run_tool(self, *args, shell=("sh",), path_prefix="", umask=-1):
        (self.fake / "clock").write_text("0\n")
        env = {"PATH": f"{path_prefix}{self.fake}:/usr/bin:/bin", "FAKE": str(self.fake)}
        return subprocess.run([*shell, str(TOOL), *args], env=env, capture_output=True,
                              text=True, timeout=60, umask=umask)

    def metrics(self, *args, **kwargs) -> dict:
        result = self.run_tool("--prometheus", *args, **kwargs)
        self.assertEqual(result.returncode, 0, result.stderr)
        return prom_check.parse(result.stdout)

    @staticmethod
    def sample(families, name, **labels):
        found = [s for f in families.values() for s in f.samples
                 if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    def test_every_word_with_its_metric_labels_and_value(self):
        table = {(row[0], row[1]): row for row in tool_table()}
        for name, shell, prefix in self.shells():
            with self.subTest(shell=name):
                families = self.metrics(shell=shell, path_prefix=prefix)
                # The metric names dashboards use, by hand (the rest follow the table).
                mq = {"domain": "mq", "vdev": "xvda"}
                first = {word: 100 + n for n, word in enumerate(STATS_WORDS)}
                self.assertEqual(self.sample(families, "blkdom_vbd_read_requests_total",
                                             **mq).value, first["rd_req"])
                self.assertEqual(self.sample(families, "blkdom_vbd_read_bytes_total",
                                             **mq).value, first["rd_sect"] * 512)
                self.assertEqual(self.sample(families, "blkdom_vbd_written_bytes_total",
                                             domain="web").value,
                                 (200 + STATS_WORDS.index("wr_sect")) * 512)
                self.assertEqual(families["blkdom_vbd_write_requests"].type, "counter")
                self.assertEqual(families["blkdom_vbd_grants_mapped"].type, "gauge")
                self.assertEqual(self.sample(families, "blkdom_vbd_size_bytes",
                                             domain="web").value, 4 << 30)
                self.assertEqual(self.sample(families, "blkdom_vbd_sector_size_bytes",
                                             domain="web").value, 4096)
                self.assertEqual(self.sample(families, "blkdom_vbd_persistent_grants_enabled",
                                             **mq).value, 1)
                self.assertEqual(self.sample(families, "blkdom_vbd_persistent_grants_enabled",
                                             domain="web").value, 0)
                self.assertEqual(self.sample(families, "blkdom_vbd_ring_page_order",
                                             **mq).value, 2)
                self.assertEqual(self.sample(families, "blkdom_vbd_backend_state",
                                             **mq).value, 4)
                self.assertEqual(self.sample(families, "blkdom_up").value, 1)
                notify = self.sample(families, "blkdom_poller_notify_seconds_total", vcpu="1")
                vcpu_words = [w for w, per_vcpu in POLLER_WORDS if per_vcpu]
                self.assertAlmostEqual(notify.value,
                                       (2000 + vcpu_words.index("notify-ns")) * 1e-9)
                # Every word of each disk's line, with the disk's labels.
                for domid, guest, vdev, devid, target, base in (
                        ("3", "mq", "xvda", "51712", "ram:128M", 100),
                        ("4", "web", "xvdb", "51728", "nvme:1", 200)):
                    labels = {"driver": "blkdom", "domid": domid, "domain": guest,
                              "vdev": vdev, "devid": devid, "target": target}
                    for n, word in enumerate(STATS_WORDS):
                        _, _, metric, kind, scale, _ = table[("vbd", word)]
                        s = self.sample(families, metric, **labels)
                        self.assertEqual(s.labels, labels)
                        self.assertAlmostEqual(s.value, (base + n) * float(scale),
                                               msg=word, delta=1e-12)
                        family = metric[:-len("_total")] if kind == "counter" else metric
                        self.assertEqual(families[family].type, kind, word)
                # Every vCPU's and the domain's words.
                rest = [w for w, per_vcpu in POLLER_WORDS if not per_vcpu]
                for word, per_vcpu in POLLER_WORDS:
                    scope = "poller" if per_vcpu else "domain"
                    _, _, metric, kind, scale, _ = table[(scope, word)]
                    cpus = (0, 1) if per_vcpu else (None,)
                    for cpu in cpus:
                        labels = {"driver": "blkdom"}
                        if cpu is not None:
                            labels["vcpu"] = str(cpu)
                            raw = 1000 * (cpu + 1) + vcpu_words.index(word)
                        else:
                            raw = 5000 + rest.index(word)
                        s = self.sample(families, metric, **labels)
                        self.assertEqual(s.labels, labels)
                        self.assertAlmostEqual(s.value, raw * float(scale), msg=word)
                # The storage network: the vif's words, and each remote's with its target.
                for n, word in enumerate(NET_WORDS):
                    _, _, metric, kind, scale, _ = table[("vif", word)]
                    s = self.sample(families, metric)
                    self.assertEqual(s.labels, {"driver": "blkdom"})
                    self.assertAlmostEqual(s.value, (7000 + n) * float(scale), msg=word)
                for r, target in REMOTES.items():
                    labels = {"driver": "blkdom", "target": target}
                    for n, word in enumerate(REMOTE_WORDS):
                        _, _, metric, kind, scale, _ = table[("remote", word)]
                        s = self.sample(families, metric, target=target)
                        self.assertEqual(s.labels, labels)
                        self.assertAlmostEqual(s.value, (8000 + 100 * r + n) * float(scale),
                                               msg=word)
                        family = metric[:-len("_total")] if kind == "counter" else metric
                        self.assertEqual(families[family].type, kind, word)
                self.assertAlmostEqual(
                    self.sample(families, "blkdom_remote_request_seconds_total",
                                target=REMOTES[0]).value,
                    (8000 + REMOTE_WORDS.index("held-ms")) / 1000)
                # Nothing else: no word fell through to an untyped metric.
                vbd_metrics = {row[2] for row in tool_table()}
                for family in families.values():
                    for s in family.samples:
                        self.assertIn(s.name, vbd_metrics)

    def test_label_values_are_escaped(self):
        odd = 'm"q\\x y,z}'
        self.write_store({"/local/domain/3/name": odd,
                          f"{BE}/3/51712/params": 'ram:128M:a"b\\c'})
        for name, shell, prefix in self.shells():
            with self.subTest(shell=name):
                families = self.metrics(shell=shell, path_prefix=prefix)
                s = self.sample(families, "blkdom_vbd_read_requests_total", domid="3")
                self.assertEqual(s.labels["domain"], odd)
                self.assertEqual(s.labels["target"], 'ram:128M:a"b\\c')
                self.assertEqual(s.value, 100 + STATS_WORDS.index("rd_req"))

    def test_a_word_this_tool_does_not_know_is_untyped_not_lost(self):
        # Also a word twice (one series can have only one value): the first counts.
        self.write_store(mq_words=" throttled-ios=17 not-a-number=x throttled-ios=18")
        result = self.run_tool("--prometheus")
        self.assertEqual(result.returncode, 0, result.stderr)
        with self.assertRaisesRegex(ValueError, "blkdom_vbd_throttled_ios: no TYPE"):
            prom_check.parse(result.stdout)
        families = prom_check.parse(result.stdout, allow_untyped=True)
        self.assertEqual(families["blkdom_vbd_throttled_ios"].type, "unknown")
        self.assertEqual(self.sample(families, "blkdom_vbd_throttled_ios",
                                     domain="mq").value, 17)
        self.assertNotIn("blkdom_vbd_not_a_number", families)

    def test_the_checks_fail_on_malformed_output(self):
        """The parser and prom_check's rules catch what a broken exporter would write."""
        good = self.run_tool("--prometheus").stdout
        prom_check.parse(good)
        broken = {
            "unescaped quote": good.replace('domain="mq"', 'domain="m"q"', 1),
            "label without quotes": good.replace('domain="mq"', "domain=mq", 1),
            "bad label name": good.replace('vdev="xvda"', 'v-dev="xvda"', 1),
            "bad metric name": good.replace("blkdom_up{", "blkdom-up{"),
            "value not a number": re.sub(r"(blkdom_up\{[^}]*\}) 1", r"\1 one", good),
            "no TYPE": good.replace("# TYPE blkdom_mapped_pages gauge\n", ""),
            "split family": good + 'blkdom_vbd_queues{domain="late"} 1\n',
            "sample twice": good + good.splitlines()[2] + "\n",
            "counter not _total": good.replace("blkdom_vbd_read_requests_total",
                                               "blkdom_vbd_read_requests"),
            "timestamp": re.sub(r"(blkdom_up\{[^}]*\} 1)", r"\1 1700000000000", good),
        }
        for what, text in broken.items():
            with self.subTest(what):
                with self.assertRaises(ValueError):
                    prom_check.parse(text)
        # The line grammar sees a bad label whatever the parser's version (Debian's 0.16
        # reads domain="m"q" as "m" without a word).
        for what in ("unescaped quote", "label without quotes"):
            with self.assertRaisesRegex(ValueError, "not a sample line"):
                prom_check.parse(broken[what])
        # And the escaped values the tool writes read back as written, parser and all.
        families = list(text_string_to_metric_families(good))
        self.assertEqual(len(families), len(prom_check.parse(good)))

    def test_output_replaces_the_file_atomically(self):
        out = self.fake / "textfile" / "blkdom.prom"
        out.parent.mkdir()
        out.write_text("old\n")
        inode = out.stat().st_ino
        for name, shell, prefix in self.shells():
            with self.subTest(shell=name):
                # Under a umask that would make the file unreadable to others.
                result = self.run_tool("--prometheus", "--output", str(out), shell=shell,
                                       path_prefix=prefix, umask=0o077)
                self.assertEqual((result.returncode, result.stdout), (0, ""), result.stderr)
                self.assertEqual(out.read_text(), self.run_tool("--prometheus").stdout)
                prom_check.parse(out.read_text())
                # A new file renamed over the old one (never rewritten in place), readable
                # by node_exporter's user, and no temporary file left beside it.
                self.assertNotEqual(out.stat().st_ino, inode)
                inode = out.stat().st_ino
                self.assertEqual(out.stat().st_mode & 0o777, 0o644)
                self.assertEqual(sorted(p.name for p in out.parent.iterdir()),
                                 ["blkdom.prom"])
        # -o FILE and --output=FILE too.
        for args in (["-p", "-o", str(out)], ["--prometheus", f"--output={out}"]):
            out.unlink()
            self.assertEqual(self.run_tool(*args).returncode, 0, args)
            self.assertTrue(out.exists(), args)

    def test_a_domain_without_statistics_writes_blkdom_up_0(self):
        out = self.fake / "blkdom.prom"
        for args in (["-d", "Domain-0"], ["-d", "nosuch"]):
            with self.subTest(args=args):
                out.write_text(self.run_tool("--prometheus").stdout)
                result = self.run_tool("--prometheus", "--output", str(out), *args)
                self.assertEqual(result.returncode, 1)
                self.assertIn("blkdom-stat:", result.stderr)
                families = prom_check.parse(out.read_text())
                self.assertEqual([f.name for f in families.values()], ["blkdom_up"])
                self.assertEqual(families["blkdom_up"].samples[0].value, 0)
        # Without --output nothing is written on stdout, as before.
        result = self.run_tool("--prometheus", "-d", "Domain-0")
        self.assertEqual((result.returncode, result.stdout), (1, ""))
        result = self.run_tool("--output", str(out))
        self.assertIn("--output goes with --prometheus", result.stderr)

    def test_the_rigs_expectations(self):
        """prom_check --expect, as tools/rig/run.sh checks what dom0 wrote."""
        self.write_store({"/local/domain/4/name": 'w"b'})
        families = self.metrics()
        # queues is the first word of the lines: 100 on mq's, 200 on web's.
        holds = ['blkdom_vbd_queues{domain="mq",vdev="xvda"} == 100',
                 'blkdom_vbd_queues{domain="w\\"b"} == 200',
                 "blkdom_mapped_pages > 0",
                 'blkdom_poller_rings{vcpu="1"} >= 1']
        for spec in holds:
            self.assertEqual(prom_check.check_expectation(families, spec), "", spec)
        fails = {'blkdom_vbd_queues{domain="mq"} == 3': "found 100",
                 'blkdom_vbd_queues{domain="nosuch"} > 0': "no such sample",
                 'blkdom_vbd_queues{domain=mq} > 0': "labels not understood",
                 "blkdom_vbd_queues 2": "not understood"}
        for spec, why in fails.items():
            self.assertIn(why, prom_check.check_expectation(families, spec), spec)

    def test_readme_lists_every_metric_of_the_tool(self):
        rows = readme_table("### Metrics")
        documented = {(row[0].strip("`"), row[1]) for row in rows}
        self.assertEqual(documented, {(row[2], row[3]) for row in tool_table()})
        # Each row says where its number comes from (the word, or the key for xs.*).
        source = {row[0].strip("`"): row[2] for row in rows}
        for _, field, metric, *_ in tool_table():
            self.assertIn(f"`{field.removeprefix('xs.')}`", source[metric], metric)
        # And every word blkdom publishes has its row (none falls through as untyped).
        known = {(row[0], row[1]) for row in tool_table()}
        for word in STATS_WORDS:
            self.assertIn(("vbd", word), known)
        for word, per_vcpu in POLLER_WORDS:
            self.assertIn(("poller" if per_vcpu else "domain", word), known)
        for word in NET_WORDS:
            self.assertIn(("vif", word), known)
        for word in REMOTE_WORDS:
            self.assertIn(("remote", word), known)

    def test_without_a_storage_network_there_is_no_vif_or_remote_metric(self):
        lines = [line for line in (self.fake / "store").read_text().splitlines()
                 if "blkdom-net" not in line and "blkdom-remotes" not in line]
        (self.fake / "store").write_text("\n".join(lines) + "\n")
        families = self.metrics()
        self.assertFalse([name for name in families if name.startswith(("blkdom_vif",
                                                                        "blkdom_remote"))])
        self.assertEqual(self.sample(families, "blkdom_up").value, 1)

    def test_the_table_shows_the_vif_and_each_remote(self):
        for name, shell, prefix in self.shells():
            with self.subTest(shell=name):
                result = self.run_tool("-1", shell=shell, path_prefix=prefix)
                self.assertEqual(result.returncode, 0, result.stderr)
                lines = result.stdout.splitlines()
                self.assertIn("vif: " + net_keys()["/local/domain/1/data/blkdom-net"], lines)
                remotes = [line for line in lines if line.startswith("remote ")]
                self.assertEqual(len(remotes), 2, result.stdout)
                # Remote 0's words: state 8001 is no state this tool knows; requests
                # 8006 took 8007 ms in all (1 ms on average), 8008 at most.
                words = dict(zip(REMOTE_WORDS, range(8000, 8100)))
                self.assertEqual(
                    remotes[0],
                    f"remote {REMOTES[0]}: unknown, {words['io-queues']} I/O queue(s); "
                    f"{words['requests']} requests, "
                    f"{words['held-ms'] // words['requests']} ms on average, "
                    f"{words['held-max-ms']} ms at most; {words['in-flight']} in flight; "
                    f"{words['losses']} lost, {words['failed-attempts']} failed attempts, "
                    f"{words['transfer-errors']} transfer errors, "
                    f"{words['path-errors']} path errors, "
                    f"{words['ana-transitions']} ANA transitions, "
                    f"{words['path-moves']} moves to an optimized portal; "
                    f"on portal {words['portal']}, "
                    f"ANA state {words['ana']}")  # 80xx is no state the tool names
                self.assertTrue(remotes[1].startswith(f"remote {REMOTES[2]}: "), remotes[1])
        # Each ANA state by its name, and none reported.
        for ana, said in ((1, "ANA optimized"), (2, "ANA non-optimized"),
                          (3, "ANA inaccessible"), (4, "ANA persistent loss"),
                          (15, "ANA changing"), (0, "no ANA")):
            self.write_store({"/local/domain/1/data/blkdom-remotes/0":
                              f"up=1 state=1 requests=0 ana={ana} target=nvme-tcp:x"})
            result = self.run_tool("-1")
            self.assertIn(f"on portal 0, {said}\n", result.stdout)
        # Each state by its name.
        for state, said in ((0, "connecting"), (1, "live"), (2, "reconnecting, I/O held"),
                            (3, "given up, I/O fails"), (4, "bring-up failed")):
            self.write_store({"/local/domain/1/data/blkdom-remotes/0":
                              f"up=0 state={state} requests=0 target=nvme-tcp:x"})
            result = self.run_tool("-1")
            self.assertIn(f"remote nvme-tcp:x: {said}, 0 I/O queue(s); 0 requests, 0 ms",
                          result.stdout)


if __name__ == "__main__":
    unittest.main()
