# blkdom — build, run and test.
#   make          build the image and print its size
#   make run      boot the image under plain QEMU and show its log
#   make test     tier 1 (host cargo test) + tier 2 (image under QEMU) + nested smoke
#   make lint     rustfmt + clippy, host crates and the image

SHELL := /bin/bash
TARGET := x86_64-unknown-none
IMAGE := target/$(TARGET)/release/blkdom
CARGO ?= cargo

.PHONY: all deps image run test test-host test-qemu lint

all: image

# Idempotent: installs only what is missing (Rust target, QEMU from bookworm-backports).
deps:
	@bash tools/install-deps.sh

image:
	$(CARGO) build -p blkdom --release --target $(TARGET)
	@size=$$(stat -c %s $(IMAGE)); \
	  printf 'image: %s, %d bytes (%d KiB; budget 1024 KiB)\n' $(IMAGE) $$size $$((size / 1024)); \
	  [ $$size -le 1048576 ] || { echo "image exceeds 1 MiB" >&2; exit 1; }

run: deps image
	python3 tests/qemu/run.py --image $(IMAGE)

test: deps
	tests/run-all.sh

test-host:
	$(CARGO) test

test-qemu: image
	python3 tests/qemu/tier2.py --image $(IMAGE)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --exclude blkdom --all-targets -- -D warnings
	$(CARGO) clippy -p blkdom --target $(TARGET) -- -D warnings

# --- nested Xen rig (issue 3) ---
# --- end nested Xen rig ---
