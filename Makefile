# SPDX-License-Identifier: MIT OR Apache-2.0
# blkdom — build, run and test.
#   make          build the image and the test image and print their sizes
#   make run      boot the image under plain QEMU and show its log
#   make test     tier 1 (host cargo test) + tier 2 (image under QEMU) + nested smoke
#   make lint     rustfmt + clippy, host crates and the image

SHELL := /bin/bash
TARGET := x86_64-unknown-none
IMAGE := target/$(TARGET)/release/blkdom
# The test image: the same kernel with its test hooks (selftest, disktest=, faulttest=,
# registrytest=, crashtest=), for tier 2 and the nested rig's self-test step. Built in a
# target directory of its own, so that neither build makes cargo redo the other.
TEST_TARGET_DIR := target/test-hooks
TEST_IMAGE := $(TEST_TARGET_DIR)/$(TARGET)/release/blkdom
CARGO ?= cargo
# The symbol table is not loaded and nothing reads it at run time: both images keep only
# the test hooks' symbols (module paths as the legacy mangling spells them), so tier 2's
# check that the production image carries no hook can still find one.
KEEP_HOOK_SYMBOLS := --wildcard $(foreach m,8selftest 8disktest 9faulttest 12registrytest 7nettest 9testhooks,-K '*$(m)*')

.PHONY: all deps image run test test-host test-qemu lint fuzz fuzz-long bench-engine bench bench-paired bench-nvmetcp bench-backend

all: image

# Idempotent: installs only what is missing (Rust target, QEMU from bookworm-backports).
deps:
	@bash tools/install-deps.sh

image:
	$(CARGO) build -p blkdom --release --target $(TARGET)
	$(CARGO) build -p blkdom --release --target $(TARGET) --features test-hooks --target-dir $(TEST_TARGET_DIR)
	objcopy --strip-all $(KEEP_HOOK_SYMBOLS) $(IMAGE)
	objcopy --strip-all $(KEEP_HOOK_SYMBOLS) $(TEST_IMAGE)
	@size=$$(stat -c %s $(TEST_IMAGE)); \
	  printf 'test image: %s, %d bytes (%d KiB; with the test hooks)\n' $(TEST_IMAGE) $$size $$((size / 1024))
	@size=$$(stat -c %s $(IMAGE)); \
	  printf 'image: %s, %d bytes (%d KiB; budget 1024 KiB)\n' $(IMAGE) $$size $$((size / 1024)); \
	  [ $$size -le 1048576 ] || { echo "image exceeds 1 MiB" >&2; exit 1; }
	@# Both pass the checks a running blkdom makes before a live upgrade to them.
	$(CARGO) run -q -p blkdom-handover --example check_image -- $(IMAGE) $(TEST_IMAGE)

run: deps image
	python3 tests/qemu/run.py --image $(IMAGE)

test: deps
	tests/run-all.sh

test-host:
	$(CARGO) test

test-qemu: image
	python3 tests/qemu/tier2.py --image $(TEST_IMAGE) --production-image $(IMAGE)

# Every cargo-fuzz target for FUZZ_SECONDS each (make test runs a 15 s pass).
FUZZ_SECONDS ?= 60
fuzz:
	tools/fuzz.sh $(FUZZ_SECONDS)

# make fuzz-long (not in CI, not in make test): every target for FUZZ_LONG_SECONDS (an
# hour each by default: seven hours for the seven targets), one at a time, niced; each
# continues from what earlier runs found (target/fuzz/corpus/). The logs, any crashing
# input and a summary (runs, coverage, crashes: summary.txt, summary.json) go to
# results/fuzz/<UTC time>/. FUZZ_TARGETS="gpt x86_32" runs only those.
FUZZ_LONG_SECONDS ?= 3600
fuzz-long:
	@out=results/fuzz/$$(date -u +%Y%m%dT%H%M%SZ); mkdir -p $$out; \
	  FUZZ_RESULTS=$$out nice -n 10 tools/fuzz.sh $(FUZZ_LONG_SECONDS)

# Host benchmark of the blkif engine (a benchmark, not a test); JSON in results/bench
# (engine.json, engine-scale.json).
bench-engine:
	@mkdir -p results/bench
	BENCH_JSON=$(CURDIR)/results/bench/engine.json tools/bench-engine.sh

# make bench (BENCHMARKS.md): the engine on the host, then the nested comparison
# (tests/xen/bench: Linux dom0 blkback, a Linux driver domain and blkdom on RAM disks,
# then Linux blkback in an HVM driver domain and blkdom as HVM on a passed-through NVMe
# controller, alternating A B C D E A B C D E, BENCH_REPEATS rounds, BENCH_RUNTIME s per
# job, BENCH_JOBS / BENCH_SYSTEMS to cut the lists), then tools/bench/report.py: the
# table, results/bench/<UTC time>/bench.json and docs/bench-iops-by-block-size.svg.
# Over an hour at the defaults (2 rounds of 17 jobs x 5 systems; the repeats show the
# noise).
BENCH_RUNTIME ?= 10
bench: deps-xen
	@mkdir -p results/bench
	BENCH_JSON=$(CURDIR)/results/bench/engine.json tools/bench-engine.sh
	@rc=0; if $(MAKE) --no-print-directory image; then \
	  $(RIG)/run.sh bench --runtime $(BENCH_RUNTIME) || rc=$$?; \
	  else echo "blkdom image does not build: no nested comparison"; rc=1; fi; \
	  python3 tools/bench/report.py || rc=1; exit $$rc

# make bench-paired (BENCHMARKS.md): Linux dom0 blkback and blkdom job by job in one
# guest with a disk from each (tests/xen/paired), PAIRED_ROUNDS rounds (default 3) of
# PAIRED_JOBS, BENCH_RUNTIME s per job; the two halves of each pair are one job apart,
# so the outer machine's drift between make bench's turns does not enter the ratios.
# Then tools/bench/paired.py: per job the ratio of each pair, median and min-max.
# Defaults: 3 rounds of 6 jobs, 10 s each.
bench-paired: deps-xen
	@rc=0; if $(MAKE) --no-print-directory image; then \
	  $(RIG)/run.sh paired --runtime $(BENCH_RUNTIME) || rc=$$?; \
	  else echo "blkdom image does not build: no nested comparison"; rc=1; fi; \
	  python3 tools/bench/paired.py || rc=1; exit $$rc

# make bench-nvmetcp (BENCHMARKS.md): bench-paired with both disks on one Linux nvmet-tcp
# target in dom0: xvda through dom0's own NVMe/TCP host and blkback, xvdb through blkdom
# over its vif (PAIRED_DISKS=nvmetcp); CPU is dom0's and blkdom's together.
bench-nvmetcp: deps-xen
	@PAIRED_DISKS=nvmetcp $(MAKE) --no-print-directory bench-paired

# make bench-backend (BENCHMARKS.md): Linux dom0 blkback and blkdom at the backend's own
# limit: one guest whose frontend is tools/hostile's load generator (`hostile load`)
# drives a disk from each (tests/xen/bench-backend), BENCH_BACKEND_ROUNDS rounds (default
# 3) of BENCH_BACKEND_JOBS (default: 4 KiB QD1/QD32/QD128, 2 queues, writes, 64 KiB and
# 1 MiB, QD1 at 100 and 1,000 IOPS, idle), BENCH_RUNTIME s per job (the idle job
# BENCH_BACKEND_IDLE_S, default 60), each job on both disks back to back. Then
# tools/bench/backend.py: the table, one `backend-ratio` line per job and a
# `backend-idle` line. Then the same on the passed-through NVMe (tests/xen/bench-backend-pt:
# a Linux HVM driver domain and blkdom as HVM, one at a time, BENCH_BACKEND_PT_JOBS,
# default the seven throughput jobs; BENCH_BACKEND_PT=0 leaves it out) and its table.
# About 35 + 30 minutes at the defaults; BENCH_BACKEND_JOBS=lg-randread-4k-qd32-q1,lg-randread-4k-qd1-q1
# BENCH_BACKEND_PT=0 BENCH_RUNTIME=5 is a 10-minute check.
BENCH_BACKEND_PT ?= 1
bench-backend: deps-xen
	@rc=0; if $(MAKE) --no-print-directory image; then \
	  $(RIG)/run.sh bench-backend --runtime $(BENCH_RUNTIME) || rc=$$?; \
	  if [ "$(BENCH_BACKEND_PT)" != 0 ]; then \
	    $(RIG)/run.sh bench-backend-pt --runtime $(BENCH_RUNTIME) || rc=$$?; fi; \
	  else echo "blkdom image does not build: no nested comparison"; rc=1; fi; \
	  python3 tools/bench/backend.py || rc=1; \
	  if [ "$(BENCH_BACKEND_PT)" != 0 ]; then echo; \
	    python3 tools/bench/backend.py --nested results/xen/bench-backend-pt || rc=1; fi; \
	  exit $$rc

lint:
	$(CARGO) fmt --all -- --check
	cd fuzz && $(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --exclude blkdom --all-targets -- -D warnings
	$(CARGO) clippy -p blkdom --target $(TARGET) -- -D warnings
	$(CARGO) clippy -p blkdom --target $(TARGET) --features test-hooks -- -D warnings

# --- nested Xen rig (tools/rig/README.md) ---
# Xen 4.17 + a Linux dom0 under QEMU TCG; see tools/rig/README.md. Everything built or
# downloaded is cached in ~/.cache/blkdom/rig (BLKDOM_CACHE), results go to results/xen/.
#   make rig        build the patched QEMU, a static fio, the dom0 and guest initramfs
#   make smoke-xen  Xen boots, a 5 s baseline fio, blkdom boots as PVH (< 10 min cold);
#                   its last line is "N passed, M failed"
#   make test-xen   every scenario whose header says "rig-suite: test-xen" (tests/xen/)
#   make demo       Linux dom0, a Linux driver domain and blkdom side by side, fio table
#                   (RUNTIME=20 s per job)
#   make soak       one blkdom, three guests coming and going for SOAK_MINUTES (30);
#                   not in CI, not in test-xen
RIG := tools/rig
RUNTIME ?= 20
.PHONY: deps-xen rig smoke-xen test-xen demo soak

# Idempotent: the Xen/Linux packages and QEMU's build dependencies, only what is missing.
deps-xen:
	@bash tools/install-deps.sh --xen

rig: deps-xen
	$(RIG)/build.sh

# A blkdom image that does not build counts as one failed check, not a stale image run.
define rig_with_image
	@if $(MAKE) --no-print-directory image; then $(RIG)/run.sh $(1); \
	  else echo "blkdom image does not build (make image)"; echo "0 passed, 1 failed"; exit 1; fi
endef

smoke-xen: deps-xen
	$(call rig_with_image,smoke)

test-xen: deps-xen
	$(call rig_with_image,--suite test-xen --runtime $(RUNTIME))

# The demo shows the baseline even while blkdom does not build or serve yet.
demo: deps-xen
	@if $(MAKE) --no-print-directory image; then image=$(IMAGE); \
	  else echo "blkdom image does not build: the demo shows the baseline only"; image=; fi; \
	  BLKDOM_IMAGE=$$image $(RIG)/run.sh demo --runtime $(RUNTIME)
# tests/xen/soak: one blkdom serves three guests for SOAK_MINUTES minutes: one verifies
# its disk throughout while a second disk is hot-plugged on it again and again, one is
# created, verified, mkfs/fsck'd, rebooted and destroyed in a loop, one destroyed mid-I/O
# in a loop. Prints the cycles of each kind, the errors (goal 0), blkdom's heap and
# mapped pages at the start and end (goal: back to the start). Takes SOAK_MINUTES plus
# ~5-10 minutes (boot, the last cycles, the checks).
export SOAK_MINUTES ?= 30
soak: deps-xen
	$(call rig_with_image,soak)
# --- end nested Xen rig ---
