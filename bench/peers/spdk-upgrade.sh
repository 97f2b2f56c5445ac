#!/usr/bin/env bash
# Live upgrade under SPDK's NVMe host: SPDK's host (spdk_nvme_perf, and
# bdevperf's verify workload when it was built) runs 4 KiB random I/O on a
# `vnvme serve` disk while the server is upgraded (`vnvme ctl upgrade`)
# several times. Not part of CI.
#
# It runs only what you built: SPDK_DIR must point at an SPDK tree you
# built yourself with its vfio-user support (build/bin/spdk_nvme_perf is
# used; build/examples/bdevperf too if it is there). This script never
# fetches or builds SPDK. vnvme is built here (cargo build --release)
# unless VNVME points at a binary.
#
#   SPDK_DIR=/path/to/spdk bench/peers/spdk-upgrade.sh [--upgrades N]
#       [--every S] [--modes adaptive,mmap-poll] [--qd N]
#
# For each mode (SPDK's host needs the doorbell page, so adaptive and
# mmap-poll): a `file` namespace of 256 MiB (a `ram` one refuses an
# upgrade), the host on core 1, the server on core 0; N upgrades (default
# 5), one every S seconds (default 3) after the first S. It prints each
# upgrade's JSON line (phases in ms), the host's totals, and fails if a run
# reports an I/O error, a miscompare or a refused upgrade. Needs root
# (hugepages) and 2 cores.
set -euo pipefail

upgrades=5
every=3
modes=adaptive,mmap-poll
qd=32
root=$(cd "$(dirname "$0")/../.." && pwd)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    --upgrades) upgrades=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "spdk-upgrade.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

die() { echo "spdk-upgrade.sh: $*" >&2; exit 1; }
. "$root/bench/peers/lib.sh"
need_spdk build/bin/spdk_nvme_perf
vnvme_binary
hugepages

work=$(mktemp -d /tmp/vnvme-spdk-upgrade.XXXXXX)
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
trap 'stop_server; rm -rf "$work"' EXIT

NQN=nqn.2019-07.io.spdk:cnode0
runtime=$(((upgrades + 1) * every + 2))
failed=0

# host NAME CMD...: runs SPDK's host in the background, its output in
# $work/NAME.out; sets host_pid.
host() {
    local name=$1
    shift
    timeout $((runtime + 60)) "$@" >"$work/$name.out" 2>&1 &
    host_pid=$!
}

# upgrade_while_running: N upgrades, one every $every s, while $host_pid runs.
upgrade_while_running() {
    local i
    for i in $(seq "$upgrades"); do
        sleep "$every"
        if ! kill -0 "$host_pid" 2>/dev/null; then
            echo "  the host ended before upgrade $i" >&2
            failed=1
            return
        fi
        if out=$("$VNVME" ctl --control "$work/control.sock" upgrade 2>&1); then
            echo "  upgrade $i: $out"
        else
            echo "  upgrade $i REFUSED: $out"
            failed=1
        fi
    done
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
    taskset -c 0 "$VNVME" serve --socket "$dir/cntrl" --control "$work/control.sock" \
        --ns "256M:file=$work/disk.img" --doorbells "$mode" >"$work/serve-$mode.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do [ -S "$dir/cntrl" ] && break; sleep 0.1; done
    [ -S "$dir/cntrl" ] || die "vnvme serve did not start (see $work/serve-$mode.log)"

    echo "$mode: spdk_nvme_perf randrw QD $qd, ${runtime}s, $upgrades upgrades"
    host perf "$SPDK_DIR/build/bin/spdk_nvme_perf" -r "trtype:VFIOUSER traddr:$dir subnqn:$NQN" \
        -g -c 0x2 -q "$qd" -o 4096 -w randrw -M 50 -t "$runtime"
    upgrade_while_running
    if wait "$host_pid"; then
        awk '/^Total/ { print "  perf total: " $3 " IOPS, average " $5 " us, max " $7 " us" }' "$work/perf.out"
    else
        echo "  spdk_nvme_perf FAILED:"
        tail -20 "$work/perf.out" | sed 's/^/    /'
        failed=1
    fi
    if grep -qE '\*ERROR\*|error' "$work/perf.out"; then
        echo "  spdk_nvme_perf reported:"
        grep -E '\*ERROR\*|error' "$work/perf.out" | head -10 | sed 's/^/    /' || true
        failed=1
    fi

    if [ -x "$SPDK_DIR/build/examples/bdevperf" ]; then
        bdevperf_conf "$dir"
        echo "$mode: bdevperf verify QD $qd, ${runtime}s, $upgrades upgrades"
        # -g: one hugetlbfs file for all of SPDK's memory, as spdk_nvme_perf
        # -g; without it SPDK's host maps several 2 MiB page files' range
        # with the first page's fd, which vnvme refuses (it would read the
        # wrong memory past that file's end).
        host_failed=
        host bdevperf "$SPDK_DIR/build/examples/bdevperf" --json "$work/bdev.json" -m 0x2 -g \
            -q "$qd" -o 4096 -w verify -t "$runtime"
        upgrade_while_running
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
    else
        echo "$mode: no $SPDK_DIR/build/examples/bdevperf: data not verified (spdk_nvme_perf only counts errors)"
    fi
    stop_server
done
exit $failed
