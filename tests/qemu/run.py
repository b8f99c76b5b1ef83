#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""`make run`: boot the image under plain QEMU and show its log."""

import argparse
import sys

import qemu_runner


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True)
    parser.add_argument("--append", default="loglevel=info")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--log", default="target/qemu/run.log")
    args = parser.parse_args()

    result = qemu_runner.boot(args.image, args.append, args.log, timeout=args.timeout)
    print(result.log, end="" if result.log.endswith("\n") else "\n")
    print(f"[run] {result.verdict} after {result.seconds:.2f} s (QEMU status {result.status}); log: {args.log}")
    ready = qemu_runner.READY_MARKER in result.log
    return 0 if ready and result.verdict == "poweroff" else 1


if __name__ == "__main__":
    sys.exit(main())
