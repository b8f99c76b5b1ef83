#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Run every cargo-fuzz target in fuzz/ for a bounded time, one after another, starting
# from the committed seed corpus (fuzz/corpus/<target>) and what earlier runs found
# (target/fuzz/corpus/<target>, where new inputs go); crashes go to
# fuzz/artifacts/<target>. Ends with "fuzz: N passed, M failed" (make test counts it).
# Usage: tools/fuzz.sh [seconds-per-target]   (default 30)
#   FUZZ_TARGETS="gpt x86_32"  only these targets
#   FUZZ_RESULTS=dir           also keep each target's log, any crashing input, and a
#                              summary (tools/fuzz_summary.py: runs, coverage, crashes)
#                              in dir (make fuzz-long: results/fuzz/<UTC time>/)
#
# Stable Rust only: `-s none` builds without a sanitizer (AddressSanitizer needs
# nightly's -Zsanitizer). The code under test has no unsafe, so ASan would add little;
# libFuzzer's coverage instrumentation (-Cpasses=sancov-module) works on stable.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-30}"
results="${FUZZ_RESULTS:-}"
if [ -n "$results" ]; then
    mkdir -p "$results"
    results="$(cd "$results" && pwd)"
fi
if ! command -v cargo-fuzz >/dev/null; then
    echo "fuzz: installing cargo-fuzz (about a minute)"
    cargo install cargo-fuzz --locked
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/fuzz}"
cd "$root/fuzz"
cargo fuzz build -s none
targets="${FUZZ_TARGETS:-$(cargo fuzz list)}"
if [ -n "$results" ]; then
    printf 'commit %s\nseconds %s\nstarted %s\n' \
        "$(git -C "$root" describe --always --dirty)" "$seconds" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$results/run.txt"
fi
passed=0
failed=0
for target in $targets; do
    work="$CARGO_TARGET_DIR/corpus/$target"
    log="$CARGO_TARGET_DIR/$target.log"
    mkdir -p "$work"
    echo "fuzz: $target for ${seconds}s"
    status=0
    cargo fuzz run -s none "$target" "$work" "corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || status=$?
    if [ -n "$results" ]; then
        cp "$log" "$results/$target.log"
        echo "$target $status" >>"$results/status.txt"
        # The input that crashed (libFuzzer names it in the log).
        sed -nE 's/.*Test unit written to (\S+).*/\1/p' "$log" | while read -r unit; do
            cp "$unit" "$results/$target-$(basename "$unit")" 2>/dev/null || true
        done
    fi
    if [ "$status" != 0 ]; then
        tail -n 60 "$log"
        echo "fuzz: $target FAILED (log: $log)"
        failed=$((failed + 1))
        continue
    fi
    passed=$((passed + 1))
    grep -E '^Done|stat::number_of_executed_units|stat::peak_rss_mb' "$log" || true
    grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true
done
if [ -n "$results" ]; then
    python3 "$root/tools/fuzz_summary.py" "$results" || true
fi
echo "fuzz: $passed passed, $failed failed"
[ "$failed" = 0 ]
