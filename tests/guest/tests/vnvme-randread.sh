# shellcheck shell=sh
# vnvme-randread.sh - guest test (run-vnvme-tests.sh): fio 4 KiB random reads (io_uring, direct) complete
# at each queue depth of rig.qds (default 1,32) for rig.runtime seconds (default 5), and the kernel log
# has no nvme timeout/reset/error line afterwards.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
RT=$(cmdline_get runtime 5); QDS=$(cmdline_get qds 1,32 | tr , ' ')
log "oacs $(nvme id-ctrl /dev/nvme0 | grep -E '^oacs' | awk '{print $3}'), $(ls /sys/block/nvme0n1/mq | wc -l) hardware queues"
rc=0
for qd in $QDS; do
  fio_randread "randread-qd$qd" io_uring "$qd" "$RT" || { echo "TEST: FAIL: randread QD $qd"; rc=1; }
done
check_no_nvme_errors || rc=1
exit $rc
