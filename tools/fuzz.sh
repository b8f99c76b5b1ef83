#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Run every cargo-fuzz target in fuzz/ for a bounded time, starting from the committed
# seed corpus (fuzz/corpus/<target>); new inputs go to target/fuzz/corpus, crashes to
# fuzz/artifacts/<target>.
# Usage: tools/fuzz.sh [seconds-per-target]   (default 30)
#
# Stable Rust only: `-s none` builds without a sanitizer (AddressSanitizer needs
# nightly's -Zsanitizer). The code under test has no unsafe, so ASan would add little;
# libFuzzer's coverage instrumentation (-Cpasses=sancov-module) works on stable.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-30}"
if ! command -v cargo-fuzz >/dev/null; then
    echo "fuzz: installing cargo-fuzz (about a minute)"
    cargo install cargo-fuzz --locked
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/fuzz}"
cd "$root/fuzz"
cargo fuzz build -s none
passed=0
failed=0
for target in $(cargo fuzz list); do
    work="$CARGO_TARGET_DIR/corpus/$target"
    log="$CARGO_TARGET_DIR/$target.log"
    mkdir -p "$work"
    echo "fuzz: $target for ${seconds}s"
    if ! cargo fuzz run -s none "$target" "$work" "corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz: $target FAILED (log: $log)"
        failed=$((failed + 1))
        continue
    fi
    passed=$((passed + 1))
    grep -E '^Done|stat::number_of_executed_units|stat::peak_rss_mb' "$log" || true
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" = 0 ]
