# shellcheck shell=sh
# nvme-smoke.sh - guest script: identify the controller and run fio 4 KiB randread (io_uring) at QD 1 and 32.
#   run-test.sh --qemu-nvme examples/nvme-smoke.sh
#   rig.runtime=SECS on the kernel command line (run-test.sh --append rig.runtime=3) shortens the fio runs.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
nvme list || die "nvme list failed"
nvme id-ctrl /dev/nvme0 > /tmp/idctrl || die "nvme id-ctrl failed"
grep -E '^(vid|sn|mn|fr|mdts|oacs|sqes|cqes|nn) ' /tmp/idctrl
RT=$(cmdline_get runtime 10)
rc=0
for qd in 1 32; do
  fio_randread "randread-io_uring-qd$qd" io_uring $qd "$RT" || rc=1
done
check_no_nvme_errors || rc=1
exit $rc
