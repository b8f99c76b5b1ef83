#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Instructions per request of each pass of the blkif engine (copy, parse, dispatch,
# check, stage, submit, reap, respond), counted by valgrind's cachegrind over
# bench_engine's plain loop (BENCH_PROFILE) built with the `profile-passes` feature,
# which keeps each pass out of line. Two runs with different request counts: the
# difference over the difference in requests is the cost per request, set-up excluded.
# Usage: tools/engine-passes.sh [order,queues,on|off ...]   (default: all 8 of the table)
# PASSES_RING=kernel: the ring through xen::SharedMem, as blkdom maps it; fake: in the
# fake Xen's pages, as the lockstep column (default: plain memory).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install -y valgrind)"; exit 1; }
# PASSES_BIN=FILE: count with that build (e.g. a copy of an earlier one) instead.
bin="${PASSES_BIN:-}"
if [ -z "$bin" ]; then
  target="${PASSES_TARGET_DIR:-$PWD/target/passes}"
  CARGO_PROFILE_RELEASE_DEBUG=true CARGO_TARGET_DIR="$target" \
    cargo build --quiet --release -p blkdom-blkback --features fake,profile-passes --example bench_engine
  bin="$target/release/examples/bench_engine"
fi
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(0,1,on 0,1,off 0,2,on 0,2,off 4,1,on 4,1,off 4,2,on 4,2,off)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
small=100000 large=300000
for config in "${configs[@]}"; do
  for n in $small $large; do
    BENCH_PROFILE="$config,$n${PASSES_RING:+,$PASSES_RING}" valgrind --tool=cachegrind --cache-sim=no \
      --cachegrind-out-file="$work/$n.out" "$bin" >/dev/null 2>"$work/$n.err" ||
      { cat "$work/$n.err"; exit 1; }
  done
  cg_diff "$work/$small.out" "$work/$large.out" >"$work/diff.out" 2>/dev/null
  cg_annotate --auto=no --threshold=0 "$work/diff.out" 2>/dev/null |
    python3 tools/bench/engine_passes.py "$config${PASSES_RING:+ $PASSES_RING}" $((large - small))
done
