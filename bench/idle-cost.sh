#!/usr/bin/env bash
# idle-cost.sh - what idle disks cost their server: N vnvme disks (64 MiB ram namespaces, default settings)
# attached to one Linux guest (the rig, tests/guest) that sends them nothing; the server's CPU over SECS
# seconds, from /proc/PID/stat (utime + stime, summed over the server processes).
#
# usage: bench/idle-cost.sh [--processes] [--disks N] [--secs S] [-- SERVE_ARGS...]
#   --processes   one `vnvme serve --socket S --ns 64M:ram` per disk (default: one `vnvme serve --config F`
#                 with a [[controllers]] table per disk, served by one poll-group thread)
#   --disks N     disks (default 8)
#   --secs S      the measured idle time (default 20)
#   SERVE_ARGS    more `vnvme serve` options for every server (e.g. --doorbells shadow)
#   VNVME         the server binary (default target/release/vnvme)
# Prints one line: "idle-cost: 8 disks, one process: 0.30% of a core over 20 s (6 ticks of 100/s)".
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VNVME=${VNVME:-$ROOT/target/release/vnvme}
N=8 SECS=20 PROCS=0 EXTRA=()
while [ $# -gt 0 ]; do
  case $1 in
    --processes) PROCS=1 ;;
    --disks) N=$2; shift ;;
    --secs) SECS=$2; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "idle-cost: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$VNVME" ] || { echo "idle-cost: no server binary $VNVME (cargo build --release -p vnvme)" >&2; exit 2; }
. "$ROOT/bench/disks-lib.sh"
start_disks idle-cost "$PROCS" "$N" 64M ram "${EXTRA[@]}"
ARGS=("${DISK_ARGS[@]}")
LOG=$TMP/console
"$ROOT/tests/guest/run-test.sh" "${ARGS[@]}" --log "$LOG" --timeout $((SECS + 400)) \
  --append "rig.disks=$N rig.idle=$((SECS + 10))" "$ROOT/tests/guest/tests/vnvme-idle.sh" \
  > /dev/null 2> "$TMP/harness" &
GUEST=$!
ticks() {   # the servers' utime + stime, in clock ticks
  local t=0 p f
  for p in "${PIDS[@]}"; do
    # fields 14 and 15 (utime, stime), counted after the ") " that ends the command name
    read -ra f <<< "$(sed 's/^.*) //' "/proc/$p/stat")"
    t=$((t + f[11] + f[12]))
  done
  echo $t
}
until grep -q 'TEST: idle:' "$LOG" 2>/dev/null; do
  kill -0 $GUEST 2>/dev/null || { echo "idle-cost: the guest ended first: $(tail -3 "$TMP/harness")" >&2; exit 1; }
  sleep 0.5
done
threads() {   # per thread: TID NAME CPU-NS (from schedstat, finer than the ticks) SLEEPS
  local p t
  for p in "${PIDS[@]}"; do
    for t in /proc/"$p"/task/*; do
      echo "${t##*/} $(tr -d ' ' < "$t/comm") $(cut -d' ' -f1 "$t/schedstat") $(awk '/^voluntary_ctxt/ { print $2 }' "$t/status")"
    done
  done
}
t0=$(ticks)
threads > "$TMP/threads0"
sleep "$SECS"
t1=$(ticks)
threads > "$TMP/threads1"
wait $GUEST || { echo "idle-cost: guest failed: $(tail -3 "$TMP/harness")" >&2; exit 1; }
# With IDLE_THREADS=1, each thread's share (the ones that ran), by name.
if [ "${IDLE_THREADS:-0}" = 1 ]; then
  awk -v s="$SECS" 'NR == FNR { a[$1] = $3; w[$1] = $4; next }
    ($1 in a) { d[$2] += $3 - a[$1]; v[$2] += $4 - w[$1]; c[$2]++ }
    END { for (n in d) if (d[n] > 0) printf "  %-16s x%-3d %.3f%% of a core, %.0f sleeps/s\n", n, c[n], 100 * d[n] / 1e9 / s, v[n] / s }' \
    "$TMP/threads0" "$TMP/threads1" | sort -t% -k1 >&2
fi
HZ=$(getconf CLK_TCK)
awk -v t=$((t1 - t0)) -v hz="$HZ" -v s="$SECS" -v n="$N" -v what="$WHAT" -v extra="${EXTRA[*]}" 'BEGIN {
  printf "idle-cost: %d disks, %s%s: %.2f%% of a core over %d s (%d ticks of %d/s)\n",
    n, what, (extra == "" ? "" : ", " extra), 100 * t / hz / s, s, t, hz }'
