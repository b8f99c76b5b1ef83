#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Every source file git tracks names its licence in an SPDX line near its top.

  tools/spdx.py          list the files without one; exit 1 if there are any
  tools/spdx.py --fix    add `SPDX-License-Identifier: MIT OR Apache-2.0` where missing
                         (after a shebang line, in the file's own comment syntax)

Documents, data, lock files, patches to other projects and test fixtures are not source
and are left alone (see `comment_prefix`).
"""
import os
import subprocess
import sys

LICENSE = "MIT OR Apache-2.0"
TAG = "SPDX-License-Identifier:"
# How far down the tag may stand: after a shebang and an encoding or tool line.
HEAD_LINES = 3


def comment_prefix(path, first_line):
    """The line-comment syntax of a source file, or None for what is not source."""
    name = os.path.basename(path)
    ext = os.path.splitext(name)[1]
    if path.startswith(("fuzz/corpus/", "tests/bench/fixtures/")):
        return None
    if ext == ".rs":
        return "//"
    if ext in (".sh", ".py", ".toml", ".cfg") or name in ("Makefile", ".gitignore"):
        return "#"
    if not ext and first_line.startswith("#!"):
        return "#"
    return None


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                         capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def first_lines(full, count):
    with open(full, encoding="utf-8", errors="replace") as f:
        return [f.readline() for _ in range(count)]


def add_tag(full, prefix):
    with open(full, encoding="utf-8") as f:
        lines = f.readlines()
    at = 1 if lines and lines[0].startswith("#!") else 0
    lines.insert(at, f"{prefix} {TAG} {LICENSE}\n")
    with open(full, "w", encoding="utf-8") as f:
        f.writelines(lines)


def main(argv):
    fix = "--fix" in argv[1:]
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                          capture_output=True, text=True).stdout.strip()
    missing = []
    checked = 0
    for path in tracked_files(root):
        full = os.path.join(root, path)
        if not os.path.isfile(full) or os.path.islink(full):
            continue
        head = first_lines(full, HEAD_LINES)
        prefix = comment_prefix(path, head[0])
        if prefix is None:
            continue
        checked += 1
        if any(TAG in line for line in head):
            continue
        if fix:
            add_tag(full, prefix)
        else:
            missing.append(path)
    for path in missing:
        print(f"spdx: no '{TAG}' line in the first {HEAD_LINES} lines of {path}")
    print(f"spdx: {checked} source files, {len(missing)} without a licence line")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
