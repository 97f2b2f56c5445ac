#!/usr/bin/env bash
# sched-waits.sh - how often the host kept each thread of a guest benchmark waiting for a core, per
# device: the measurement behind docs/guest-benchmark.md, "Why QD 1 stays close".
#
# usage: sched-waits.sh [--over MS] BENCH_DIR TIMEHIST
#   BENCH_DIR  a folder `vnvme bench --guest` kept (VNVME_BENCH_KEEP=1): its markers.txt gives the
#              CLOCK_MONOTONIC time at which the host saw each slice marker on the console
#   TIMEHIST   the text of `perf sched timehist -i perf.data` for a recording made on the host, as
#              root, during the run with the same clock:
#                perf sched record -k CLOCK_MONOTONIC -o perf.data -- sleep SECONDS
#   --over MS  count the waits longer than MS milliseconds (default 0.3)
#
# For every device and thread kind (QEMU's vCPU threads, QEMU's other threads, vnvme's I/O workers,
# all threads of those names), over that device's slices only (ramps included): how many times a
# thread of the kind became runnable, how many of those times it waited longer than MS for a core
# (and per second of slice), and the cores' worth of time it waited and ran. A vCPU's wait is the guest's
# wait; the device on which it waits more is the one that needs more of the host.
set -euo pipefail
OVER=0.3
[ "${1:-}" = --over ] && { OVER=${2:-}; shift; shift || true; }
case $OVER in
  ''|.|*[!0-9.]*|*.*.*) echo "sched-waits: --over takes milliseconds, a number such as 0.3 (got '$OVER')" >&2; exit 2 ;;
esac
[ $# -eq 2 ] || { sed -n '4,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
MARKERS=$1/markers.txt
[ -r "$MARKERS" ] || { echo "sched-waits: no $MARKERS (a bench --guest folder kept with VNVME_BENCH_KEEP=1?)" >&2; exit 2; }
[ -r "$2" ] || { echo "sched-waits: cannot read $2" >&2; exit 2; }

awk -v over="$OVER" '
  # markers.txt: "SECONDS VNVME-BENCH-SLICE point@serial" opens a slice, "... SLICE -" closes it
  FNR == NR {
    if ($2 != "VNVME-BENCH-SLICE") next
    if ($3 == "-") { if (open != "") { n++; S[n] = t0; E[n] = $1; D[n] = open; open = "" } }
    else { split($3, p, "@"); open = p[2]; t0 = $1 }
    next
  }
  # timehist: TIME [CPU] NAME[TID/PID] WAIT SCH-DELAY RUN; NAME may hold spaces
  $1 ~ /^[0-9]+\.[0-9]+$/ && NF >= 6 {
    t = $1 + 0
    while (i <= n && t > E[i]) i++
    if (i > n) exit
    if (t < S[i]) next
    name = $3; for (k = 4; k <= NF - 3; k++) name = name " " $k
    if (name ~ /^CPU [0-9]+\/TCG/) kind = "vCPU"
    else if (name ~ /^qemu-system/) kind = "QEMU"
    else if (name ~ /^vnvme-io/ && D[i] ~ /^vnvme/) kind = "worker"
    else next
    key = D[i] SUBSEP kind; dev[D[i]] = 1
    runs[key]++; waited[key] += $(NF - 1); ran[key] += $NF
    if ($(NF - 1) > over) long[key]++
  }
  END {
    for (k = 1; k <= n; k++) secs[D[k]] += E[k] - S[k]
    printf "%-22s %6s  %-6s %9s %11s %8s %10s %10s\n", "device", "secs", "thread", "runnable", \
      "waits>" over "ms", "per s", "wait cores", "ran cores"
    for (d in dev) for (j = 1; j <= 3; j++) {
      kind = j == 1 ? "vCPU" : j == 2 ? "QEMU" : "worker"; key = d SUBSEP kind
      if (!(key in runs)) continue
      printf "%-22s %6.1f  %-6s %9d %11d %8.1f %10.3f %10.3f\n", d, secs[d], kind, runs[key], \
        long[key], long[key] / secs[d], waited[key] / 1000 / secs[d], ran[key] / 1000 / secs[d]
    }
  }' "$MARKERS" "$2" | { IFS= read -r head; echo "$head"; sort; }
