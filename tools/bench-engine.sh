#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Host benchmark of the blkif engine (frontend thread + poller over shared memory, null
# device, 4 KiB reads, ring order 0 and 4, 1 and 2 queues, persistent grants on and off;
# requests/s and ns per request per poller core), then large requests (the engine in front
# of a RAM disk: 4 KiB, 8 KiB and 1 MiB reads and writes; ns per request and per KiB, the
# bare copy, grant map/unmap calls per request: examples/bench_large.rs).
# Usage: tools/bench-engine.sh [seconds-per-measurement]   (default 2)
# BENCH_JSON=FILE also writes the results as JSON (make bench: results/bench/engine.json).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_SECONDS="${1:-2}" cargo run --quiet --release -p blkdom-blkback --features fake --example bench_engine
echo
BENCH_SECONDS="${1:-2}" exec cargo run --quiet --release -p blkdom-blkback --features fake --example bench_large
