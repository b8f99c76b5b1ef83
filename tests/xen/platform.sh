# SPDX-License-Identifier: MIT OR Apache-2.0
# blkdom's Xen platform checks (sourced after lib.sh by blkdom-platform and smoke).
# wait_gone NAME SECONDS: true once the domain no longer exists.
wait_gone() {
  local i
  for i in $(seq "$2"); do
    domid_of "$1" > /dev/null || return 0
    sleep 1
  done
  return 1
}

# The self-tests are test hooks: they boot the test image (tools/rig/run.sh copies it to
# images/blkdom-test), in the driver domain's own configuration.
selftests_under_xen() {
  local id summary i value
  if [ ! -f "$RIG/images/blkdom-test" ]; then
    fail "blkdom test image present (run make image)"
    return 1
  fi
  create_domain blkdom "$XL_DIR/blkdom.cfg" 'kernel="/rig/images/blkdom-test"' \
    'cmdline="selftest selftest.expect-cpus=2 selftest.await-dom0 loglevel=info"' || return 1
  id=$(domid_of blkdom)
  # The xenstore self-test leaves a key; once it has, dom0 reads it and answers with a
  # write of its own, which blkdom's watch must see (xen.watch-sees-dom0-write).
  for i in $(seq 90); do
    xl dmesg | grep "(d$id) " | grep -q "xen.xenstore-write-read-watch \.\.\. " && break
    domid_of blkdom > /dev/null || break
    sleep 1
  done
  value=$(xenstore-read "/local/domain/$id/data/blkdom-selftest" 2>&1)
  [ "$value" = written-by-blkdom ] && pass "dom0 reads the key blkdom wrote" ||
    fail "dom0 reads the key blkdom wrote (got: $value)"
  xenstore-write "/local/domain/$id/data/blkdom-ack" seen
  for i in $(seq 120); do
    summary=$(xl dmesg | grep "(d$id) " | grep -o "selftest: [0-9]* passed, [0-9]* failed" | tail -n 1)
    [ -n "$summary" ] && break
    domid_of blkdom > /dev/null || break
    sleep 1
  done
  xl dmesg | grep "(d$id) .*selftest: " | sed 's/^.*selftest: /rig: blkdom selftest: /'
  case $summary in
    "selftest: "*" passed, 0 failed") pass "blkdom self-tests under Xen ($summary)" ;;
    *) fail "blkdom self-tests under Xen (${summary:-no summary})"; dump_state blkdom-selftest ;;
  esac
  if wait_gone blkdom 30; then
    pass "blkdom powered itself off after its self-tests"
  else
    fail "blkdom powered itself off after its self-tests"
    timeout 30 xl destroy blkdom
  fi
}

shutdown_by_toolstack() {
  local start
  boot_blkdom || return 1
  if grep -q "blkdom: up" "$CONSOLE_DIR/guest-blkdom.log" 2>/dev/null; then
    pass "blkdom's log on its Xen console (xenconsoled log)"
  else
    fail "blkdom's log on its Xen console (xenconsoled log)"
  fi
  start=$(now)
  if ! timeout 30 xl shutdown blkdom > "$RESULTS/xl-shutdown-blkdom.log" 2>&1; then
    fail "xl shutdown blkdom accepted ($(tail -n 1 "$RESULTS/xl-shutdown-blkdom.log"))"
  fi
  if wait_gone blkdom 30; then
    timing "blkdom-shutdown" "$(seconds_since "$start")"
    pass "xl shutdown powers blkdom off"
  else
    fail "xl shutdown powers blkdom off"
    dump_state blkdom-shutdown
    timeout 30 xl destroy blkdom
  fi
  grep "toolstack asked" "$CONSOLE_DIR/guest-blkdom.log" 2>/dev/null | sed 's/^/rig: blkdom log: /'
}

