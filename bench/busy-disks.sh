#!/usr/bin/env bash
# busy-disks.sh - N busy vnvme disks against N busy disks of QEMU's built-in nvme, in one Linux guest (the
# rig, tests/guest): fio on all N vnvme disks at once, then on all N QEMU disks at once, in alternation,
# ROUNDS times (issue 34 item 5: "eight busy disks in one VM >= eight disks of QEMU's nvme"). Both kinds
# read from nothing: vnvme's `null` namespaces, QEMU's null-co driver (read-zeroes=off), 1 GiB each.
#
# usage: bench/busy-disks.sh [--processes] [--disks N] [--rounds R] [--secs S] [--qd Q] [--rw RW] [-- SERVE_ARGS...]
#   --processes   one `vnvme serve` per disk (default: one `vnvme serve --config F` with a [[controllers]]
#                 table per disk)
#   --disks N     disks of each kind (default 8)
#   --rounds R    passes of each kind (default 3)
#   --secs S      seconds per pass (default 10)
#   --qd Q        iodepth per disk (default 32)
#   --rw RW       fio's rw (default randread)
#   SERVE_ARGS    more `vnvme serve` options for every server (e.g. --doorbells shadow)
#   VNVME         the server binary (default target/release/vnvme); RIG_SMP, RIG_MEM as for the rig
# Prints one line per round ("busy-disks: round 1: vnvme 123456 IOPS, QEMU 100000 IOPS, 1.23x") and the
# median of the ratios; the guest's RESULT lines go to --results-like JSON in $BUSY_JSON if set.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VNVME=${VNVME:-$ROOT/target/release/vnvme}
N=8 ROUNDS=3 SECS=10 QD=32 RW=randread PROCS=0 EXTRA=()
while [ $# -gt 0 ]; do
  case $1 in
    --processes) PROCS=1 ;;
    --disks) N=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --secs) SECS=$2; shift ;;
    --qd) QD=$2; shift ;;
    --rw) RW=$2; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "busy-disks: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in N ROUNDS SECS QD; do
  case ${!v} in ''|*[!0-9]*|0) echo "busy-disks: --$(echo "$v" | tr 'A-Z' 'a-z') takes a positive whole number" >&2; exit 2 ;; esac
done
[ -x "$VNVME" ] || { echo "busy-disks: no server binary $VNVME (cargo build --release -p vnvme)" >&2; exit 2; }
. "$ROOT/bench/disks-lib.sh"
start_disks busy-disks "$PROCS" "$N" 1G null "${EXTRA[@]}"
ARGS=("${DISK_ARGS[@]}")
for i in $(seq "$N"); do
  ARGS+=(--qemu-arg -drive --qemu-arg "id=q$i,if=none,file=null-co://,file.read-zeroes=off,format=raw")
  ARGS+=(--qemu-arg -device --qemu-arg "nvme,serial=qemu$i,drive=q$i")
done
"$ROOT/tests/guest/run-test.sh" "${ARGS[@]}" --log "$TMP/console" --results "$TMP/results" \
  --timeout $((ROUNDS * 2 * (SECS + 15) + 400)) \
  --append "rig.disks=$N rig.rounds=$ROUNDS rig.secs=$SECS rig.qd=$QD rig.rw=$RW" \
  "$ROOT/tests/guest/tests/vnvme-busy-disks.sh" > /dev/null 2> "$TMP/harness" \
  || { echo "busy-disks: the guest failed: $(grep 'TEST:' "$TMP/console" | tail -3; tail -3 "$TMP/harness")" >&2; exit 1; }
[ -n "${BUSY_JSON:-}" ] && cp "$TMP/results" "$BUSY_JSON"
echo "busy-disks: $N disks each, vnvme as $WHAT${EXTRA[*]:+ (${EXTRA[*]})}, $RW 4k QD $QD per disk, $ROUNDS rounds of $SECS s"
awk -F'[:,}]' '
  { for (i = 1; i < NF; i++) { gsub(/[ "{]/, "", $i) }
    k = ""; r = 0; v = 0; e = 0
    for (i = 1; i < NF; i++) {
      if ($i == "kind") k = $(i + 1); if ($i == "round") r = $(i + 1)
      if ($i == "iops") v = $(i + 1); if ($i == "err") e = $(i + 1)
    }
    gsub(/[ "]/, "", k); iops[k, r] = v; errs += e; if (r > n) n = r }
  END {
    if (errs > 0) { printf "busy-disks: fio reported %d errors\n", errs; exit 1 }
    for (r = 1; r <= n; r++) {
      ratio[r] = iops["vnvme", r] / (iops["qemu", r] > 0 ? iops["qemu", r] : 1)
      printf "busy-disks: round %d: vnvme %d IOPS, QEMU %d IOPS, %.2fx\n", r, iops["vnvme", r], iops["qemu", r], ratio[r]
    }
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (ratio[j] < ratio[i]) { t = ratio[i]; ratio[i] = ratio[j]; ratio[j] = t }
    printf "busy-disks: vnvme/QEMU %.2f-%.2fx, median %.2fx\n", ratio[1], ratio[n], ratio[int((n + 1) / 2)]
  }' "$TMP/results"
