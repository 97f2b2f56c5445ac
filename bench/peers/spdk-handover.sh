#!/usr/bin/env bash
# The server replaced under SPDK's NVMe host: SPDK's host (spdk_nvme_perf,
# and bdevperf's verify workload when it was built) runs 4 KiB random I/O
# on a `vnvme serve` disk while the server is upgraded (`vnvme ctl
# upgrade`) or, with --crash, while the child of `vnvme serve --supervise`
# is SIGKILLed, several times. Not part of CI.
#
# It runs only what you built: SPDK_DIR must point at an SPDK tree you
# built yourself with its vfio-user support (build/bin/spdk_nvme_perf is
# used; build/examples/bdevperf too if it is there). This script never
# fetches or builds SPDK. vnvme is built here (cargo build --release)
# unless VNVME points at a binary.
#
#   SPDK_DIR=/path/to/spdk bench/peers/spdk-handover.sh [--crash] [--times N]
#       [--every S] [--modes adaptive,mmap-poll] [--qd N]
#
# For each mode (SPDK's host needs the doorbell page, so adaptive and
# mmap-poll): a `file` namespace of 256 MiB (a `ram` one refuses an
# upgrade), the host on core 1, the server on core 0; N upgrades or kills
# (default 5), one every S seconds (default 3) after the first S. It prints
# each upgrade's JSON line (phases in ms) or each kill's pid, the host's
# totals, and fails if a run reports an I/O error, a failed, timed-out or
# miscompared I/O, or a refused upgrade. After a kill the supervisor's log
# lines (commands completed with Command Interrupted) are printed too.
# Needs root (hugepages) and 2 cores.
set -euo pipefail

times=5
crash=
every=3
modes=adaptive,mmap-poll
qd=32
root=$(cd "$(dirname "$0")/../.." && pwd)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    --times) times=$2; shift 2 ;;
    --crash) crash=1; shift ;;
    --every) every=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "spdk-handover.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

# A failure keeps the work folder: its messages name the logs there.
die() {
    echo "spdk-handover.sh: $*" >&2
    keep_work=1
    exit 1
}
. "$root/bench/peers/lib.sh"
need_spdk build/bin/spdk_nvme_perf
vnvme_binary
hugepages

work=$(mktemp -d /tmp/vnvme-spdk-handover.XXXXXX)
server_pid=
stop_server() {
    if [ -n "$server_pid" ]; then
        # After an upgrade the server is another process: stop it by its
        # control socket, then the one we started if it is still there.
        "$VNVME" ctl --control "$work/control.sock" shutdown >/dev/null 2>&1 || true
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=
    fi
}
host_pid=
trap '[ -z "$host_pid" ] || kill "$host_pid" 2>/dev/null || true; stop_server; [ -n "${keep_work:-}" ] || rm -rf "$work"' EXIT

NQN=nqn.2019-07.io.spdk:cnode0
runtime=$(((times + 1) * every + 2))
event=upgrade
[ -z "$crash" ] || event=kill
failed=0

# host NAME CMD...: runs SPDK's host in the background, its output in
# $work/NAME.out; sets host_pid.
host() {
    local name=$1
    shift
    timeout $((runtime + 60)) "$@" >"$work/$name.out" 2>&1 &
    host_pid=$!
}

# replace_while_running: N upgrades or kills, one every $every s, while
# $host_pid runs.
replace_while_running() {
    local i child
    for i in $(seq "$times"); do
        sleep "$every"
        if ! kill -0 "$host_pid" 2>/dev/null; then
            echo "  the host ended before $event $i" >&2
            failed=1
            return
        fi
        if [ -n "$crash" ]; then
            child=$(pgrep -P "$server_pid" | head -1 || true)
            if [ -z "$child" ]; then
                echo "  kill $i: the supervisor has no child; its log ends:"
                tail -5 "$work/serve-$mode.log" | sed 's/^/    /'
                failed=1
                return
            fi
            kill -KILL "$child"
            echo "  kill $i: SIGKILL to the server, pid $child"
        elif out=$("$VNVME" ctl --control "$work/control.sock" upgrade 2>&1); then
            echo "  upgrade $i: $out"
        else
            echo "  upgrade $i REFUSED: $out"
            failed=1
        fi
    done
}

# crash_account NAME: after a host's run with --crash, the supervisor's log
# lines since the host started (mark: $log_mark).
crash_account() {
    [ -n "$crash" ] || return 0
    tail -n "+$((log_mark + 1))" "$work/serve-$mode.log" >"$work/$1.supervisor"
    awk '/died .* holding a client/ { died++ }
         /completed with Command Interrupted/ { n += substr($0, index($0, "restore: ") + 9) + 0 }
         /cannot be restored|restoring the client failed/ { lost++ }
         END { printf "  the supervisor: %d deaths with a client, %d commands completed with Command Interrupted, %d clients not restored\n", died, n, lost }' \
        "$work/$1.supervisor"
    if grep -qE 'cannot be restored|restoring the client failed' "$work/$1.supervisor"; then
        failed=1
    fi
}

bdevperf_conf() {
    cat >"$work/bdev.json" <<EOF
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_nvme_attach_controller",
 "params":{"name":"Nvme0","trtype":"vfiouser","traddr":"$1","subnqn":"$NQN"}}]}]}
EOF
}

IFS=, read -ra mode_list <<<"$modes"
for mode in "${mode_list[@]}"; do
    dir=$work/$mode
    mkdir -p "$dir"
    truncate -s 256M "$work/disk.img"
    taskset -c 0 "$VNVME" serve ${crash:+--supervise} --socket "$dir/cntrl" --control "$work/control.sock" \
        --ns "256M:file=$work/disk.img" --doorbells "$mode" >"$work/serve-$mode.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do [ -S "$dir/cntrl" ] && break; sleep 0.1; done
    [ -S "$dir/cntrl" ] || die "vnvme serve did not start (see $work/serve-$mode.log)"

    echo "$mode: spdk_nvme_perf randrw QD $qd, ${runtime}s, $times ${event}s"
    log_mark=$(wc -l <"$work/serve-$mode.log")
    host perf "$SPDK_DIR/build/bin/spdk_nvme_perf" -r "trtype:VFIOUSER traddr:$dir subnqn:$NQN" \
        -g -c 0x2 -q "$qd" -o 4096 -w randrw -M 50 -t "$runtime"
    replace_while_running
    perf_ok=1
    wait "$host_pid" || perf_ok=
    if [ -n "$crash" ]; then
        # spdk_nvme_perf counts every error status and retries none: the
        # commands a kill interrupted come back as Command Interrupted
        # (sct 0, sc 0x21 = 33), which a host's block layer (bdevperf's
        # bdev_nvme below, Linux) retries. Any other error fails the run.
        interrupted=$(grep -c 'completed with error (sct=0, sc=33)' "$work/perf.out" || true)
        echo "  perf: $interrupted I/Os completed with Command Interrupted (perf does not retry them)"
        grep -v 'completed with error (sct=0, sc=33)' "$work/perf.out" | grep -v 'errors occurred' >"$work/perf.rest"
        if grep -q '^Total' "$work/perf.rest"; then
            perf_ok=1
        fi
        mv "$work/perf.rest" "$work/perf.out"
    fi
    if [ -n "$perf_ok" ]; then
        awk '/^Total/ { print "  perf total: " $3 " IOPS, average " $5 " us, max " $7 " us" }' "$work/perf.out"
    else
        echo "  spdk_nvme_perf FAILED:"
        tail -20 "$work/perf.out" | sed 's/^/    /'
        failed=1
    fi
    crash_account perf
    if grep -qE '\*ERROR\*|error' "$work/perf.out"; then
        echo "  spdk_nvme_perf reported:"
        grep -E '\*ERROR\*|error' "$work/perf.out" | head -10 | sed 's/^/    /' || true
        failed=1
    fi

    if [ -x "$SPDK_DIR/build/examples/bdevperf" ]; then
        bdevperf_conf "$dir"
        echo "$mode: bdevperf verify QD $qd, ${runtime}s, $times ${event}s"
        # -g: one hugetlbfs file for all of SPDK's memory, as spdk_nvme_perf
        # -g; without it SPDK's host maps several 2 MiB page files' range
        # with the first page's fd, which vnvme refuses (it would read the
        # wrong memory past that file's end).
        host_failed=
        log_mark=$(wc -l <"$work/serve-$mode.log")
        host bdevperf "$SPDK_DIR/build/examples/bdevperf" --json "$work/bdev.json" -m 0x2 -g \
            -q "$qd" -o 4096 -w verify -t "$runtime"
        replace_while_running
        wait "$host_pid" || host_failed=1
        # Its progress line ends in carriage returns.
        tr '\r' '\n' <"$work/bdevperf.out" >"$work/bdevperf.txt"
        # Total : IOPS MiB/s Fail/s TO/s average min max
        if [ -z "${host_failed:-}" ] && ! grep -qiE 'miscompare|\*ERROR\*' "$work/bdevperf.txt" &&
            awk '/^ *Total/ { t = 1; if ($5 != 0 || $6 != 0) bad = 1 } END { exit !(t && !bad) }' "$work/bdevperf.txt"; then
            awk '/^ *Total/ { print "  bdevperf total: " $3 " IOPS, 0 failed, 0 timed out, average " $7 " us, max " $9 " us"; exit }' "$work/bdevperf.txt"
        else
            echo "  bdevperf verify FAILED:"
            grep -iE 'miscompare|\*ERROR\*|^ *Total' "$work/bdevperf.txt" | head -20 | sed 's/^/    /' || true
            failed=1
        fi
        crash_account bdevperf
    else
        echo "$mode: no $SPDK_DIR/build/examples/bdevperf: data not verified (spdk_nvme_perf only counts errors)"
    fi
    stop_server
done
exit $failed
