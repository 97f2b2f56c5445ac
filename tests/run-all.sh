#!/usr/bin/env bash
# Runs every test of the project: the cargo workspace's unit and in-process
# tests (controller, protocol, driver end to end over a real socketpair), then
# the guest suite: a real Linux guest under QEMU 11.1's vfio-user-pci driving
# `vnvme serve` (tests/guest/, 32 tests, about 15 minutes).
# Usage: tests/run-all.sh            (from anywhere; as root on Debian bookworm)
#        VNVME_SKIP_GUEST=1 tests/run-all.sh   cargo tests only
#        VNVME_FUZZ_SECONDS=N                  run each cargo fuzz target N s
#                                              (default 30 when CI=true, else 0)
set -euo pipefail
cd "$(dirname "$0")/.."

tests/install-deps.sh
echo "== cargo test (workspace)"
cargo test --workspace --all-targets 2>&1

fuzz_seconds=${VNVME_FUZZ_SECONDS:-$([ "${CI:-}" = true ] && echo 30 || echo 0)}
if [ "$fuzz_seconds" -gt 0 ]; then
  echo "== fuzz regression (fuzz/run.sh $fuzz_seconds)"
  fuzz/run.sh "$fuzz_seconds"
fi

if [ "${VNVME_SKIP_GUEST:-0}" = 1 ]; then
  echo "== guest suite skipped (VNVME_SKIP_GUEST=1)"
  exit 0
fi
echo "== guest rig (tests/guest/setup.sh)"
tests/guest/setup.sh
echo "== cargo build --release -p vnvme"
cargo build --release -p vnvme 2>&1
echo "== guest suite (tests/guest/run-vnvme-tests.sh)"
tests/guest/run-vnvme-tests.sh
