#!/usr/bin/env bash
# wakeup-split.sh - where one wake-up of a sleeping thread spends its CPU: traces the thread (perf's
# sched_switch, sched_wakeup and raw_syscalls tracepoints, all CPUs) for SECS seconds and splits each
# wake-up, median and mean over them, into the kernel's part before the thread's system call returns
# (switch in, the sleep's end), the thread's own code up to its next system call (user space), and the
# kernel's part from that call until the thread is switched out. Made for the poll-group thread of an
# idle server (one sleep per wake-up, see docs/deployment.md "What an idle disk costs"); a thread that
# makes several system calls per wake-up has them counted, and their kernel time lands in "user".
#
# usage: bench/wakeup-split.sh [--secs S] [--thread NAME] [PID]
#   PID           the process whose thread to trace (default: the first with a thread NAME)
#   --thread NAME the thread's name (default vnvme-pg0)
#   --secs S      how long to trace (default 4)
# Needs perf and root (tracepoints on all CPUs). Tracing costs each event about a microsecond, so the
# figures are a little above the untraced ones; compare them with each other, and take the untraced
# CPU per wake-up from /proc/PID/task/TID/schedstat (bench/idle-cost.sh with IDLE_THREADS=1).
set -u
SECS=4 NAME=vnvme-pg0 PID=
while [ $# -gt 0 ]; do
  case $1 in
    --secs) SECS=$2; shift ;;
    --thread) NAME=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "wakeup-split: unknown option $1" >&2; exit 2 ;;
    *) PID=$1 ;;
  esac
  shift
done
command -v perf > /dev/null || { echo "wakeup-split: no perf" >&2; exit 2; }
TID=
for f in /proc/${PID:-[0-9]*}/task/*/comm; do
  if [ "$(cat "$f" 2> /dev/null)" = "$NAME" ]; then TID=$(basename "$(dirname "$f")"); break; fi
done
[ -n "$TID" ] || { echo "wakeup-split: no thread named $NAME${PID:+ in $PID}" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
perf record -q -a -o "$TMP/perf.data" \
  -e raw_syscalls:sys_enter --filter "common_pid == $TID" \
  -e raw_syscalls:sys_exit --filter "common_pid == $TID" \
  -e sched:sched_switch -e sched:sched_wakeup --filter "pid == $TID" \
  -- sleep "$SECS" > /dev/null 2> "$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
perf script --ns -i "$TMP/perf.data" -F tid,time,event,trace 2> /dev/null > "$TMP/trace"
# One wake-up: woken, switched in, its sleep's call returns, its next call enters, switched out.
awk -v t="$TID" -v name="$NAME" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" '
  function med(a, n,   i, j, x) {   # insertion sort: a few thousand wake-ups at most
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j > 0 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    tid = $1; ts = $2; sub(":", "", ts); ts *= 1e6; ev = $3; sub(":$", "", ev)
    if (ev == "sched:sched_wakeup" && $0 ~ ("pid=" t " ")) { st = 1; calls = 0 }
    else if (ev == "sched:sched_switch" && $0 ~ ("next_pid=" t " ") && st == 1) { tin = ts; st = 2 }
    else if (ev == "raw_syscalls:sys_exit" && tid == t && st == 2) { tret = ts; st = 3 }
    else if (ev == "raw_syscalls:sys_enter" && tid == t && st >= 3) { if (st == 3) tcall = ts; calls++; st = 4 }
    else if (ev == "sched:sched_switch" && $0 ~ ("prev_pid=" t " ") && st == 4) {
      n++; a[n] = tret - tin; b[n] = tcall - tret; c[n] = ts - tcall; d[n] = ts - tin; k += calls
      sa += a[n]; sb += b[n]; sc += c[n]; sd += d[n]; st = 0
    }
  }
  END {
    if (n == 0) { print "wakeup-split: no complete wake-up traced" > "/dev/stderr"; exit 1 }
    printf "%s (tid %s), %d wake-ups, load %s; per wake-up, median (mean) in us:\n", name, t, n, load
    printf "  kernel, switch in to the sleep'"'"'s return  %6.2f (%.2f)\n", med(a, n), sa / n
    printf "  user, to the next system call           %6.2f (%.2f)\n", med(b, n), sb / n
    printf "  kernel, that call to switch out         %6.2f (%.2f)\n", med(c, n), sc / n
    printf "  on the CPU in all                       %6.2f (%.2f)\n", med(d, n), sd / n
    printf "  system calls per wake-up                %6.2f\n", k / n
  }' "$TMP/trace"
