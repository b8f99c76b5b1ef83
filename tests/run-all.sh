#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# `make test`: every tier that runs on this machine, with one closing line
# `N passed, M failed` that counts them all.
#   lint     rustfmt and clippy (-D warnings), host crates and the image (with and without
#            its test hooks); a licence line in every source file (tools/spdx.py)
#   tier 1   host `cargo test` of the logic crates
#   tools    python unit tests of the fio JSON reader and the benchmark report (tests/bench)
#   fuzz     every cargo-fuzz target for 15 s (tools/fuzz.sh)
#   tier 2   the image under plain QEMU (tests/qemu/tier2.py)
#   nested   the nested-Xen smoke (`make smoke-xen`), when the rig is present
# Each stage's output is kept under target/test-logs/.
set -uo pipefail
cd "$(dirname "$0")/.."

logs=target/test-logs
mkdir -p "$logs"
rm -f "$logs"/*.log  # a stage that does not run this time leaves no stale failures behind
passed=0
failed=0
summary=()

note() { summary+=("$(printf '%-8s %s' "$1" "$2")"); }

# Adds the counts of a stage whose output ends with "N passed, M failed".
count_plain() { # stage logfile status
  local line p f
  line=$(grep -E '(^|: )[0-9]+ passed, [0-9]+ failed' "$2" | tail -n 1)
  if [ -z "$line" ]; then
    failed=$((failed + 1)); note "$1" "FAILED: no result line (exit $3), see $2"; return
  fi
  p=$(sed -E 's/.*(^|: )([0-9]+) passed, ([0-9]+) failed.*/\2/' <<<"$line")
  f=$(sed -E 's/.*(^|: )([0-9]+) passed, ([0-9]+) failed.*/\3/' <<<"$line")
  if [ "$3" != 0 ] && [ "$f" = 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  note "$1" "$p passed, $f failed (exit $3)"
}

echo "== lint"
lint_ok=0
lint_failed=()
lint_checks=("fmt:cargo fmt --all -- --check" \
             "clippy-host:cargo clippy --workspace --exclude blkdom --all-targets -- -D warnings" \
             "clippy-image:cargo clippy -p blkdom --target x86_64-unknown-none -- -D warnings" \
             "clippy-image-hooks:cargo clippy -p blkdom --target x86_64-unknown-none --features test-hooks -- -D warnings" \
             "spdx:python3 tools/spdx.py")
for check in "${lint_checks[@]}"; do
  name=${check%%:*}
  if ${check#*:} >"$logs/lint-$name.log" 2>&1; then
    passed=$((passed + 1)); lint_ok=$((lint_ok + 1))
  else
    failed=$((failed + 1)); lint_failed+=("lint: $name FAILED"); echo "lint: $name FAILED:"; tail -n 40 "$logs/lint-$name.log"
  fi
done
note lint "$lint_ok of ${#lint_checks[@]} checks clean"

echo "== tier 1: host cargo test"
cargo test 2>&1 | tee "$logs/tier1.log"
status=${PIPESTATUS[0]}
read -r p f < <(awk '/^test result:/ {p += $4; f += $6} END {print p + 0, f + 0}' "$logs/tier1.log")
if [ "$status" != 0 ] && [ "$f" = 0 ]; then f=1; fi
passed=$((passed + p)); failed=$((failed + f))
note "tier 1" "$p passed, $f failed (exit $status)"

echo "== tools: python unit tests (tests/bench: the fio JSON reader, the benchmark report)"
python3 -m unittest discover -s tests/bench -v 2>&1 | tee "$logs/tools.log"
status=${PIPESTATUS[0]}
read -r p f < <(awk '/\.\.\. ok$/ {p++} /\.\.\. (FAIL|ERROR)$/ {f++} END {print p + 0, f + 0}' "$logs/tools.log")
if [ "$status" != 0 ] && [ "$f" = 0 ]; then f=1; fi
passed=$((passed + p)); failed=$((failed + f))
note tools "$p passed, $f failed (exit $status)"

echo "== fuzz: every cargo-fuzz target, 15 s each"
tools/fuzz.sh 15 2>&1 | tee "$logs/fuzz.log"
count_plain fuzz "$logs/fuzz.log" "${PIPESTATUS[0]}"

echo "== tier 2: the test image under plain QEMU (and the production image: no test hooks, boots)"
if make --no-print-directory image 2>&1 | tee "$logs/image.log"; then
  python3 tests/qemu/tier2.py --image target/test-hooks/x86_64-unknown-none/release/blkdom \
    --production-image target/x86_64-unknown-none/release/blkdom 2>&1 | tee "$logs/tier2.log"
  count_plain "tier 2" "$logs/tier2.log" "${PIPESTATUS[0]}"
else
  failed=$((failed + 1)); note "tier 2" "FAILED: image did not build"
fi

echo "== nested Xen smoke"
if make --no-print-directory -n smoke-xen >/dev/null 2>&1; then
  make --no-print-directory smoke-xen 2>&1 | tee "$logs/nested.log"
  count_plain nested "$logs/nested.log" "${PIPESTATUS[0]}"
else
  note nested "not run: no smoke-xen target yet"
fi

# What failed, by name, next to the summary: CI shows only the output's tail.
failures=$({ [ ${#lint_failed[@]} = 0 ] || printf '%s\n' "${lint_failed[@]}"
            grep -h -E '^test .* FAILED$|\.\.\. (FAIL|ERROR)$|^tier2: .* FAILED|^fuzz: .* FAILED' \
              "$logs"/tier1.log "$logs"/tools.log "$logs"/fuzz.log "$logs"/tier2.log 2>/dev/null
            # The seed repeats a failed disk test: tier2.py --seed.
            if grep -q '^tier2: .* FAILED' "$logs"/tier2.log 2>/dev/null; then grep -h '^tier2: disk test seed' "$logs"/tier2.log; fi
            grep -h -E '^FAIL: |^  FAIL' "$logs"/nested.log 2>/dev/null; } | head -n 20)

echo
if [ -n "$failures" ]; then
  echo "== failures (the first 20; each stage's log is under $logs/)"
  cut -c 1-400 <<<"$failures"
  echo
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
