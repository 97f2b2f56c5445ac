#!/usr/bin/env bash
# Runs every test of the project: the cargo workspace's unit and in-process
# tests (controller, protocol, driver end to end over a real socketpair).
# Usage: tests/run-all.sh            (from anywhere; as root on Debian bookworm)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test (workspace)"
cargo test --workspace --all-targets 2>&1
