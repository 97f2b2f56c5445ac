#!/usr/bin/env bash
# nbd-vs-fio.sh - vnvme's NBD backend against fio's own NBD client (libnbd) on the same server, in one run:
# nbdkit's memory plugin on a UNIX socket; 4 KiB random reads at QD 32 from
#   * vnvme: `vnvme bench --nbd URI` (the in-process driver through a vfio-user connection to the
#     controller, whose worker reads from the NBD export), and
#   * fio --ioengine=nbd straight to the server,
# alternated ROUNDS times; prints each figure and the ratio vnvme / fio of the medians.
#
# usage: bench/nbd-vs-fio.sh [ROUNDS] [SECONDS]     (defaults 3 rounds of 5 s each)
# Needs: nbdkit, fio (Debian's has the nbd engine), a release build (built if missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${1:-3} SECS=${2:-5}
BIN=${VNVME:-${CARGO_TARGET_DIR:-$ROOT/target}/release/vnvme}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p vnvme)
for tool in nbdkit fio; do
  command -v $tool >/dev/null || { echo "nbd-vs-fio: $tool is missing (apt-get install nbdkit fio)" >&2; exit 1; }
done
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "nbd-vs-fio: this fio has no nbd engine" >&2; exit 1; }

DIR=$(mktemp -d)
SOCK=$DIR/nbd.sock URI="nbd+unix:///?socket=$DIR/nbd.sock"
nbdkit --foreground --exit-with-parent --unix "$SOCK" memory size=1G &
NBDKIT=$!
trap 'kill $NBDKIT 2>/dev/null; wait $NBDKIT 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
# The memory plugin reads unwritten blocks as zeroes without touching memory: fill it first, so both
# clients read real data.
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=4 --size=1G >/dev/null

vnvme_iops() {
  "$BIN" bench --nbd "$URI" --size 1G --modes adaptive --qd 32 --rw randread --runtime "$SECS" \
    --json "$DIR/bench.json" >/dev/null 2>"$DIR/bench.err" || { cat "$DIR/bench.err" >&2; exit 1; }
  grep -o '"iops": *[0-9.]*' "$DIR/bench.json" | head -1 | grep -o '[0-9.]*$' | cut -d. -f1
}
fio_iops() {
  fio --name=nbd --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --iodepth=32 --size=1G \
    --runtime="$SECS" --time_based --output-format=json | grep -o '"iops" *: *[0-9.]*' | head -1 \
    | grep -o '[0-9.]*$' | cut -d. -f1
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

V=() F=()
for r in $(seq "$ROUNDS"); do
  V+=("$(vnvme_iops)"); F+=("$(fio_iops)")
  echo "round $r: vnvme ${V[-1]} IOPS, fio nbd ${F[-1]} IOPS"
done
v=$(printf '%s\n' "${V[@]}" | median) f=$(printf '%s\n' "${F[@]}" | median)
echo "median: vnvme $v IOPS, fio --ioengine=nbd $f IOPS, ratio $(awk -v v="$v" -v f="$f" 'BEGIN {printf "%.2f", v / f}')"
