# shellcheck shell=sh
# vnvme-crash.sh - guest test (run-vnvme-tests.sh crash): the namespace is a `file` namespace served by
# `vnvme serve --supervise`, whose server the host SIGKILLs 5 times while this runs fio randwrite, 4k-64k
# blocks, crc32c verify (verify_backlog: written blocks are read back and checked as it goes, and all at
# the end), for rig.secs (40) seconds after "TEST: crash: I/O running". The commands in flight at each kill
# come back as Command Interrupted, which the nvme driver retries. 0 verify errors, no nvme timeout, abort
# or reset in dmesg (every nvme line of dmesg is printed). Prints the pause the guest saw: fio's largest
# completion latency, and a per-100 ms IOPS trace as RESULT crash-trace {"stalls_ms":[..]} (each run of
# 100 ms windows with no completion) and TEST: iops100ms N N N ...
# The test crash-upgrade runs it as rig.name=crash-upgrade (its marker and RESULT name), while the host
# upgrades the supervised server too.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
D=/dev/nvme0n1
SECS=$(cmdline_get secs 40)
NAME=$(cmdline_get name crash)
log "$NAME: I/O running"
fio_verify_trace "$NAME" randwrite 4k-64k "$SECS"
echo "TEST: dmesg nvme lines: $(dmesg | grep -ic nvme)"
dmesg | grep -i nvme | sed 's/^/TEST: dmesg: /'
[ "$fio_err" = 0 ] && [ $fio_rc = 0 ] || { tail -5 "/tmp/$NAME.out"; die "fio failed (status $fio_rc, error $fio_err): verify errors or I/O errors across the kills"; }
check_no_nvme_errors || die "nvme timeouts or resets in dmesg"
log "$NAME: $SECS s of verified randwrite across the kills, no error"
