#!/usr/bin/env bash
# qos-accuracy.sh - how closely a limited disk holds its cap: the measurement behind docs/qos.md,
# "How accurately a cap holds".
#
# usage: qos-accuracy.sh [VNVME] [RUNS] [SECONDS] [BENCH_OPTION]...
#   VNVME    the binary (default: target/release/vnvme)
#   RUNS     runs per limit (default 3)
#   SECONDS  length of each run (default 10)
#   BENCH_OPTION  passed on to vnvme bench (--no-idle-class, --modes trap...)
#
# For each limit below, `vnvme bench --qos` at QD 32 (4 KiB, one queue, null namespace, adaptive
# doorbells) RUNS times; prints the IOPS (or MiB/s) of each run, the cap, and the range of
# measured / cap. The bench's IOPS counts every completion over the run, the first burst (a tenth of
# a second's worth) included, so a perfect limiter reads 1.01.
set -euo pipefail
VNVME=${1:-target/release/vnvme}
RUNS=${2:-3}
SECONDS_EACH=${3:-10}
shift $(( $# < 3 ? $# : 3 ))
[ -x "$VNVME" ] || { echo "qos-accuracy: no binary $VNVME (cargo build --release first)" >&2; exit 2; }
case $RUNS$SECONDS_EACH in *[!0-9]*) echo "qos-accuracy: RUNS and SECONDS are whole numbers" >&2; exit 2 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# rw, limits, cap in IOPS (bytes limits: bytes / 4096)
LIMITS=(
  "randread iops=20000 20000"
  "randwrite write_iops=5000 5000"
  "randread read_bps=40M 10240"
  "randrw iops=8000,bps=64M 8000"
)
printf '%-10s %-22s %8s  %-32s %s\n' rw limits cap "IOPS per run" "measured / cap"
for entry in "${LIMITS[@]}"; do
  read -r rw limits cap <<<"$entry"
  ratios=()
  iops_list=()
  for run in $(seq 1 "$RUNS"); do
    "$VNVME" bench --modes adaptive --qd 32 --backend null --rw "$rw" --runtime "$SECONDS_EACH" \
      --qos "$limits" --json "$tmp/$run.json" "$@" >/dev/null 2>"$tmp/err" \
      || { cat "$tmp/err" >&2; exit 1; }
    iops=$(jq '.runs[0].iops' "$tmp/$run.json")
    iops_list+=("$(printf '%.0f' "$iops")")
    ratios+=("$(awk -v i="$iops" -v c="$cap" 'BEGIN { printf "%.3f", i / c }')")
  done
  lo=$(printf '%s\n' "${ratios[@]}" | sort -n | head -1)
  hi=$(printf '%s\n' "${ratios[@]}" | sort -n | tail -1)
  printf '%-10s %-22s %8s  %-32s %s-%s\n' "$rw" "$limits" "$cap" "${iops_list[*]}" "$lo" "$hi"
done
