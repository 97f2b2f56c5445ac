# shellcheck shell=sh
# vnvme-upgrade.sh - guest test (run-vnvme-tests.sh upgrade): the namespace is a `file` namespace whose
# server the host upgrades (vnvme ctl upgrade) 10 times while this runs fio randrw, 4k-128k blocks,
# crc32c verify (verify_backlog: written blocks are read back and checked as it goes, and all at the end),
# for rig.secs (60) seconds after "TEST: upgrade: I/O running". 0 verify errors, no nvme timeout, abort or
# reset in dmesg. Prints the pause the guest saw: fio's largest completion latency, and a per-100 ms IOPS
# trace (fio --write_iops_log, log_avg_msec=100) as RESULT upgrade-trace {"stalls_ms":[..]} (each run of
# 100 ms windows with no completion) and TEST: iops100ms N N N ...
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
D=/dev/nvme0n1
SECS=$(cmdline_get secs 60)
log "upgrade: I/O running"
fio_verify_trace upgrade randrw 4k-128k "$SECS"
[ "$fio_err" = 0 ] && [ $fio_rc = 0 ] || { tail -5 /tmp/upgrade.out; die "fio failed (status $fio_rc, error $fio_err): verify errors or I/O errors across the upgrades"; }
check_no_nvme_errors || die "nvme timeouts or resets in dmesg"
log "upgrade: $SECS s of verified randrw across the upgrades, no error"
