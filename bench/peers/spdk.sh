#!/usr/bin/env bash
# vnvme against SPDK's vfio-user NVMe target, both driven by SPDK's own NVMe
# host (spdk_nvme_perf). Not part of CI.
#
# It runs only what you built: SPDK_DIR must point at an SPDK tree you
# built yourself with its vfio-user support (build/bin/nvmf_tgt,
# spdk_nvme_perf, spdk_nvme_identify and scripts/rpc.py are used from it).
# This script never fetches or builds SPDK. vnvme is built here (cargo build --release) unless
# VNVME points at a binary.
#
# Each target is pinned to core 0 (taskset), the host to core 1 (-c 0x2);
# every run is 4 KiB random I/O on a null namespace of 4 KiB blocks.
#
#   SPDK_DIR=/path/to/spdk bench/peers/spdk.sh [--runtime S] [--qd 1,4,32,128]
#       [--workloads randread,randwrite] [--modes adaptive,mmap-poll,trap,shadow]
#       [--rounds N] [--no-spdk] [--json FILE]
#   SPDK_DIR=/path/to/spdk bench/peers/spdk.sh --controllers 1,4,16,64 [--qd 32]
#       [--runtime S] [--modes adaptive] [--rounds N] [--no-spdk] [--poll] [--json FILE]
#
# With --controllers, the scale sweep: each target serves the largest N
# controllers from one process on core 0 (nvmf_tgt: N subsystems, each with
# a null bdev and a vfio-user listener; vnvme: one `vnvme serve --config`
# with N [[controllers]] tables), and `vnvme bench --controllers --attach`
# on core 1 drives the first N of them for each N, one driver client (one
# I/O queue) per controller, randread. It prints aggregate IOPS, the
# slowest and fastest controller, and the target's CPU; the same client
# drives both targets. Against SPDK the client maps the doorbell page, as
# SPDK's own host does (its target polls that page; a doorbell written
# through the socket costs it milliseconds); against vnvme it takes each
# of --modes as the single-controller bench does. The client waits for
# each completion interrupt, as a guest's kernel does; --poll has it poll
# its completion queues instead, as spdk_nvme_perf does (one spinning
# thread per controller on core 1: for N = 1, where it shows what the
# interrupts cost each target).
#
# The machine's speed drifts by minutes: --rounds N (default 3) runs every
# target N times in turn, and the table gives each cell's median (the
# sweep: and its range; the JSON keeps every run). Prints one row per (workload, QD) and writes JSON (default
# target/bench/spdk-peer.json). Needs root (hugepages, taskset) and 2 cores;
# it reserves 1024 2 MiB hugepages and mounts hugetlbfs on /dev/hugepages if
# it is not mounted. `trap` and `shadow` do not offer the doorbell page,
# which SPDK's host requires: their rows say so instead of a figure.
set -euo pipefail

runtime=5
qds=1,4,32,128
workloads=randread,randwrite
modes=adaptive,mmap-poll,trap,shadow
with_spdk=1
rounds=3
controllers=
poll=
json_given=0
root=$(cd "$(dirname "$0")/../.." && pwd)
json=$root/target/bench/spdk-peer.json

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    --runtime) runtime=$2; shift 2 ;;
    --qd) qds=$2; shift 2 ;;
    --workloads) workloads=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-spdk) with_spdk=0; shift ;;
    --controllers) controllers=$2; shift 2 ;;
    --poll) poll=--poll; shift ;;
    --json) json=$2; json_given=1; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "spdk.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

# A failure keeps the work folder: its messages name the logs there.
die() {
    echo "spdk.sh: $*" >&2
    keep_work=1
    exit 1
}
. "$root/bench/peers/lib.sh"
need_spdk build/bin/nvmf_tgt build/bin/spdk_nvme_perf build/bin/spdk_nvme_identify scripts/rpc.py
vnvme_binary

# SPDK's scripts want Debian's python3 (pyenv's may lack its modules).
export PATH=/usr/bin:$PATH
rpc() { "$SPDK_DIR/scripts/rpc.py" "$@" >/dev/null; }

hugepages

work=$(mktemp -d /tmp/vnvme-spdk-peer.XXXXXX)
target_pid=
stop_target() {
    if [ -n "$target_pid" ]; then
        kill -TERM "$target_pid" 2>/dev/null || true
        wait "$target_pid" 2>/dev/null || true
        target_pid=
    fi
    rm -f /dev/hugepages/spdk_pid* 2>/dev/null || true
}
trap 'stop_target; [ -n "${keep_work:-}" ] || rm -rf "$work"' EXIT

NQN=nqn.2019-07.io.spdk:cnode0
# waits for a socket to appear
wait_for() {
    for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done
    return 1
}

# start_spdk / start_vnvme MODE: start a target on core 0; sets `dir` (the
# listener directory holding the socket `cntrl`) and `target_pid`.
start_spdk() {
    dir=$work/spdk
    mkdir -p "$dir"
    taskset -c 0 "$SPDK_DIR/build/bin/nvmf_tgt" -m 0x1 -r "$work/spdk.sock" >"$work/spdk-target.log" 2>&1 &
    target_pid=$!
    wait_for "$work/spdk.sock" || die "nvmf_tgt did not start (see $work/spdk-target.log)"
    sleep 0.5
    rpc -s "$work/spdk.sock" nvmf_create_transport -t VFIOUSER
    rpc -s "$work/spdk.sock" bdev_null_create Null0 1024 4096
    rpc -s "$work/spdk.sock" nvmf_create_subsystem "$NQN" -a -s SPDK0
    rpc -s "$work/spdk.sock" nvmf_subsystem_add_ns "$NQN" Null0
    rpc -s "$work/spdk.sock" nvmf_subsystem_add_listener "$NQN" -t VFIOUSER -a "$dir" -s 0
    wait_for "$dir/cntrl" || die "SPDK's listener socket did not appear"
}

start_vnvme() {
    local mode=$1
    dir=$work/vnvme-$1
    mkdir -p "$dir"
    taskset -c 0 "$VNVME" serve --socket "$dir/cntrl" --ns 1G:null --doorbells "$mode" \
        >"$work/vnvme-$mode.log" 2>&1 &
    target_pid=$!
    wait_for "$dir/cntrl" || die "vnvme serve did not start (see $work/vnvme-$mode.log)"
}

# perf DIR QD WORKLOAD -> "IOPS AVG_US" or "error: ..."
perf() {
    local out
    if ! out=$(timeout $((runtime + 60)) "$SPDK_DIR/build/bin/spdk_nvme_perf" \
        -r "trtype:VFIOUSER traddr:$1 subnqn:$NQN" -g -c 0x2 \
        -q "$2" -o 4096 -w "$3" -t "$runtime" 2>&1); then
        echo "error: $(echo "$out" | grep -iE 'error|fail' | head -1 | tr -s ' ')"
        return
    fi
    echo "$out" | awk '/^Total/ { print $3, $5; found=1 } END { if (!found) print "error: no Total line" }'
}

# --- the scale sweep (--controllers) ---
# start_spdk_many N / start_vnvme_many MODE N: N controllers in one target
# process on core 0; set `sockets` (comma separated) and `target_pid`.
start_spdk_many() {
    local n=$1 i d
    taskset -c 0 "$SPDK_DIR/build/bin/nvmf_tgt" -m 0x1 -r "$work/spdk.sock" >"$work/spdk-target.log" 2>&1 &
    target_pid=$!
    wait_for "$work/spdk.sock" || die "nvmf_tgt did not start (see $work/spdk-target.log)"
    sleep 0.5
    # One rpc.py for every call (it reads them from stdin): 4 N separate
    # rpc.py runs, a Python start each, took minutes at N = 64.
    {
        echo "nvmf_create_transport -t VFIOUSER"
        for i in $(seq 0 $((n - 1))); do
            d=$work/spdk-many/$i
            mkdir -p "$d"
            echo "bdev_null_create Null$i 1024 4096"
            echo "nvmf_create_subsystem nqn.2019-07.io.spdk:cnode$i -a -s SPDK$i"
            echo "nvmf_subsystem_add_ns nqn.2019-07.io.spdk:cnode$i Null$i"
            echo "nvmf_subsystem_add_listener nqn.2019-07.io.spdk:cnode$i -t VFIOUSER -a $d -s 0"
        done
    } >"$work/spdk-many.rpc"
    "$SPDK_DIR/scripts/rpc.py" -s "$work/spdk.sock" <"$work/spdk-many.rpc" >"$work/spdk-many-rpc.log" 2>&1 ||
        die "setting up $n subsystems in nvmf_tgt failed: $(tail -3 "$work/spdk-many-rpc.log") (target log: $work/spdk-target.log)"
    sockets=
    for i in $(seq 0 $((n - 1))); do
        d=$work/spdk-many/$i
        wait_for "$d/cntrl" || die "SPDK's listener socket $d/cntrl did not appear"
        sockets=${sockets:+$sockets,}$d/cntrl
    done
}

start_vnvme_many() {
    local mode=$1 n=$2 i conf=$work/vnvme-many.toml
    mkdir -p "$work/vnvme-many"
    : >"$conf"
    for i in $(seq 0 $((n - 1))); do
        printf '[[controllers]]\nsocket = "%s"\ndoorbells = "%s"\nmax_io_queues = 1\n[[controllers.namespaces]]\nsize = "1G"\nbackend = "null"\n\n' \
            "$work/vnvme-many/$i.sock" "$mode" >>"$conf"
    done
    taskset -c 0 "$VNVME" serve --config "$conf" >"$work/vnvme-many-$mode.log" 2>&1 &
    target_pid=$!
    sockets=
    for i in $(seq 0 $((n - 1))); do
        wait_for "$work/vnvme-many/$i.sock" || die "vnvme serve did not start (see $work/vnvme-many-$mode.log)"
        sockets=${sockets:+$sockets,}$work/vnvme-many/$i.sock
    done
}

if [ -n "$controllers" ]; then
    IFS=, read -ra count_list <<<"$controllers"
    most=$(printf '%s\n' "${count_list[@]}" | sort -n | tail -1)
    IFS=, read -ra mode_list <<<"$modes"
    [ "$qds" = 1,4,32,128 ] && qds=32
    [ "$json_given" = 1 ] || json=$root/target/bench/spdk-scale.json
    targets=()
    [ "$with_spdk" = 1 ] && targets+=(spdk)
    for m in "${mode_list[@]}"; do targets+=("vnvme:$m"); done
    for round in $(seq "$rounds"); do
        for t in "${targets[@]}"; do
            case $t in
            spdk) start_spdk_many "$most"; mode=mmap-poll ;;
            vnvme:*) mode=${t#vnvme:}; start_vnvme_many "$mode" "$most" ;;
            esac
            echo "round $round $t: $most controllers, driving $controllers of them" >&2
            taskset -c 1 "$VNVME" bench --controllers "$controllers" --attach "$sockets" \
                --server-pid "$target_pid" --modes "$mode" --qd "$qds" --runtime "$runtime" $poll \
                --json "$work/scale-$round-${t/:/-}.json" >&2 ||
                echo "spdk.sh: the sweep against $t failed (see above)" >&2
            stop_target
        done
    done
    mkdir -p "$(dirname "$json")"
    python3 - "$work" "$json" <<'EOF'
import glob, json, os, statistics, sys
work, out_path = sys.argv[1], sys.argv[2]
rows = []
for path in sorted(glob.glob(os.path.join(work, "scale-*.json"))):
    _, rnd, target = os.path.basename(path)[:-5].split("-", 2)
    for r in json.load(open(path))["scale"]:
        r.update(round=int(rnd), target=target.replace("-", ":", 1))
        rows.append(r)
json.dump({"pinning": "target core 0, vnvme bench (client) core 1", "runs": rows},
          open(out_path, "w"), indent=2)
cells = {}
for r in rows:
    cells.setdefault((r["target"], r["qd"], r["controllers"]), []).append(r)
def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"
print("| target | QD | controllers | IOPS: median (range) | min/max per controller | target CPU (cores) |")
print("|---|---|---|---|---|---|")
for (t, qd, n), rs in sorted(cells.items(), key=lambda c: (c[0][0], c[0][1], c[0][2])):
    iops = [x["iops"] for x in rs]
    mega = lambda v: f"{v/1e6:.2f}M"
    fair = [x["min_controller_iops"] / max(x["max_controller_iops"], 1e-9) for x in rs]
    cpu = [x["server_cpu_cores"] for x in rs]
    print(f"| {t} | {qd} | {n} | {mega(statistics.median(iops))} ({span(iops, mega)}) "
          f"| {span(fair, lambda v: f'{v:.2f}')} | {span(cpu, lambda v: f'{v:.2f}')} |")
print(f"\nmedian and range of {max(len(v) for v in cells.values()) if cells else 0} run(s) per cell; JSON: {out_path}")
EOF
    exit 0
fi

results=$work/results.tsv
: >"$results"
targets=()
[ "$with_spdk" = 1 ] && targets+=(spdk)
IFS=, read -ra mode_list <<<"$modes"
for m in "${mode_list[@]}"; do targets+=("vnvme:$m"); done
IFS=, read -ra qd_list <<<"$qds"
IFS=, read -ra wl_list <<<"$workloads"

for round in $(seq "$rounds"); do
    for t in "${targets[@]}"; do
        case $t in
        spdk) start_spdk ;;
        vnvme:*) start_vnvme "${t#vnvme:}" ;;
        esac
        for w in "${wl_list[@]}"; do
            for q in "${qd_list[@]}"; do
                r=$(perf "$dir" "$q" "$w")
                printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$t" "$w" "$q" "$r" >>"$results"
                printf 'round %s %-16s %-9s QD %-4s %s\n' "$round" "$t" "$w" "$q" "$r" >&2
            done
        done
        stop_target
    done
done

mkdir -p "$(dirname "$json")"
python3 - "$results" "$json" "$runtime" <<'EOF'
import json, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
out = {"runtime_s": int(sys.argv[3]), "io_size": 4096, "namespace": "null, 4 KiB blocks",
       "pinning": "target core 0, spdk_nvme_perf core 1", "runs": []}
runs = {}
for rnd, target, wl, qd, res in rows:
    run = {"round": int(rnd), "target": target, "workload": wl, "qd": int(qd)}
    if res.startswith("error"):
        run["error"] = res[len("error: "):]
    else:
        iops, lat = res.split()
        run["iops"] = float(iops)
        run["avg_latency_us"] = float(lat)
        runs.setdefault((target, wl, int(qd)), []).append(float(iops))
    out["runs"].append(run)
fig = {k: statistics.median(v) for k, v in runs.items()}
out["median_iops"] = [{"target": t, "workload": w, "qd": q, "iops": v,
                       "runs": len(runs[(t, w, q)])} for (t, w, q), v in fig.items()]
json.dump(out, open(sys.argv[2], "w"), indent=2)
rows = [r[1:] for r in rows]
targets = list(dict.fromkeys(r[0] for r in rows))
cols = [t for t in targets]
print("| workload | QD | " + " | ".join(cols) + " |")
print("|---|---|" + "---|" * len(cols))
for wl in dict.fromkeys(r[1] for r in rows):
    for qd in dict.fromkeys(int(r[2]) for r in rows):
        cells = []
        base = fig.get(("spdk", wl, qd))
        for t in cols:
            v = fig.get((t, wl, qd))
            if v is None:
                cells.append("no attach" if t != "spdk" else "error")
            elif base and t != "spdk":
                cells.append(f"{v/1e6:.2f}M ({v/base:.2f}x)")
            else:
                cells.append(f"{v/1e6:.2f}M")
        print(f"| {wl} | {qd} | " + " | ".join(cells) + " |")
print(f"\nmedian IOPS of {max(len(v) for v in runs.values()) if runs else 0} run(s) per cell; JSON: {sys.argv[2]}")
EOF
