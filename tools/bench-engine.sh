#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Host benchmark of the blkif engine (frontend thread + poller over shared memory, null
# device, 4 KiB reads, ring order 0 and 4, 1 and 2 queues, persistent grants on and off;
# requests/s and ns per request per poller core), then large requests (the engine in front
# of a RAM disk: 4 KiB, 8 KiB and 1 MiB reads and writes; ns per request and per KiB, the
# bare copy, grant map/unmap calls per request: examples/bench_large.rs), then multi-queue
# scaling (1, 2, 4 and 8 poller threads, each with its own ring and engine, sharing the
# domain's grant budget: aggregate requests/s, thread CPU and engine ns per request;
# BENCH_MODE=scale of examples/bench_engine.rs, rounds of BENCH_SCALE_ROUNDS, default 3).
# Usage: tools/bench-engine.sh [seconds-per-measurement]   (default 2; scaling: windows of
# 50 ms per second given)
# BENCH_JSON=FILE also writes the results as JSON (make bench: results/bench/engine.json),
# the scaling's beside it (FILE without .json, then -scale.json).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-2}"
run() { cargo run --quiet --release -p blkdom-blkback --features fake --example "$@"; }
BENCH_SECONDS="$seconds" run bench_engine
echo
BENCH_SECONDS="$seconds" run bench_large
echo
window_ms=$(python3 -c "print(max(10, round(float('$seconds') * 50)))")
BENCH_MODE=scale BENCH_SCALE_WINDOW_MS="${BENCH_SCALE_WINDOW_MS:-$window_ms}" \
  BENCH_JSON="${BENCH_JSON:+${BENCH_JSON%.json}-scale.json}" run bench_engine
