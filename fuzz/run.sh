#!/usr/bin/env bash
# Runs the cargo fuzz (libFuzzer) targets, each for SECONDS (default 60), and
# fails on the first crash, panic, hang (an input taking over 30 s) or leak of
# the RSS limit. Usage: fuzz/run.sh [SECONDS] [TARGET...]
# Targets: controller, vfio_user_server, driver, saved_state (default: all).
#
# cargo fuzz passes nightly-only flags (-Zsanitizer=address); RUSTC_BOOTSTRAP=1
# lets the stable toolchain accept them. New inputs go to a scratch corpus;
# the committed seeds in corpus/<target>/ are only read. A crash leaves its
# input in artifacts/<target>/: reproduce with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> artifacts/<target>/crash-...
# then make it a regular test in the crate it concerns.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(controller vfio_user_server driver saved_state)
fi
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR=never
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== cargo install cargo-fuzz"
  cargo install --locked cargo-fuzz 2>&1 | tail -n 2
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  echo "== cargo fuzz build $t"
  if ! cargo fuzz build "$t" >"$scratch/build-$t.log" 2>&1; then
    tail -n 40 "$scratch/build-$t.log"
    echo "FAIL: cargo fuzz build $t"
    exit 1
  fi
done
for t in "${targets[@]}"; do
  echo "== cargo fuzz run $t for ${secs}s"
  mkdir -p "$scratch/$t" "corpus/$t"
  log="$scratch/$t.log"
  if ! cargo fuzz run "$t" "$scratch/$t" "corpus/$t" -- \
      -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 \
      -print_final_stats=1 >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "FAIL: fuzz target $t found a problem (input in fuzz/artifacts/$t/)"
    exit 1
  fi
  grep -E '^(#[0-9]+\s+DONE|stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb|new_units_added))' "$log" || tail -n 5 "$log"
done
echo "fuzz: ${#targets[@]} targets ran ${secs}s each without a crash"
