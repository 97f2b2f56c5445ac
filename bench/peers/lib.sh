# What the SPDK peer scripts share (sourced, not run): the checks that SPDK_DIR
# holds an SPDK the user built, the vnvme binary, and the hugepages SPDK
# needs. The caller sets `root` (the checkout) and defines `die`.

# need_spdk FILE...: each FILE (relative to SPDK_DIR) is an executable there.
need_spdk() {
    [ -n "${SPDK_DIR:-}" ] || die "set SPDK_DIR to an SPDK tree built with --with-vfio-user (see --help)"
    local b
    for b in "$@"; do
        [ -x "$SPDK_DIR/$b" ] || die "$SPDK_DIR/$b is missing: SPDK_DIR must be an SPDK tree built with vfio-user support"
    done
    [ "$(id -u)" = 0 ] || die "run as root: SPDK needs hugepages"
    [ "$(nproc)" -ge 2 ] || die "needs 2 cores (target on core 0, host on core 1)"
}

# vnvme_binary: sets VNVME, building vnvme (release) unless it is given.
vnvme_binary() {
    if [ -z "${VNVME:-}" ]; then
        echo "building vnvme (release)..." >&2
        (cd "$root" && cargo build --release -q -p vnvme)
        VNVME=$root/target/release/vnvme
    fi
    [ -x "$VNVME" ] || die "VNVME=$VNVME is not an executable"
}

# hugepages: at least 1024 2 MiB pages, hugetlbfs on /dev/hugepages. The
# kernel gives fewer than asked when memory is fragmented (SPDK's host then
# fails later, e.g. bdevperf's "Unable to allocate requested large iobuf
# pool size"): compact once and ask again, then say so.
hugepages() {
    local have
    if [ "$(cat /proc/sys/vm/nr_hugepages)" -lt 1024 ]; then
        echo 1024 >/proc/sys/vm/nr_hugepages
        if [ "$(cat /proc/sys/vm/nr_hugepages)" -lt 1024 ]; then
            echo 1 >/proc/sys/vm/compact_memory
            echo 1024 >/proc/sys/vm/nr_hugepages
        fi
        have=$(cat /proc/sys/vm/nr_hugepages)
        [ "$have" -ge 1024 ] || die "only $have of 1024 2 MiB hugepages could be reserved (memory too fragmented or too little free): free memory (drop caches: echo 3 >/proc/sys/vm/drop_caches) and retry"
    fi
    mkdir -p /dev/hugepages
    mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages
}
