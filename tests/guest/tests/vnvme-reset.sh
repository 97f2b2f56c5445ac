# shellcheck shell=sh
# vnvme-reset.sh - guest test (run-vnvme-tests.sh): I/O, then a controller reset from inside the guest
# (sysfs reset_controller: disable, re-enable, queues re-created), then verified I/O again.
# NVM Subsystem Reset is not offered (CAP.NSSRS clear, as in QEMU: Linux would notice it only by a
# command timeout): `nvme subsystem-reset` is refused and the next I/O completes at once.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
fio_randread reset-before io_uring 8 2 || die "I/O before the reset failed"
for i in 1 2; do
  reset_live "reset $i"
done
if out=$(nvme subsystem-reset /dev/nvme0 2>&1); then
  die "nvme subsystem-reset succeeded: $out"
fi
log "subsystem-reset refused: $out"
t0=$(cut -d' ' -f1 /proc/uptime)
dd if=/dev/nvme0n1 of=/dev/null bs=4k count=16 iflag=direct 2>/dev/null || die "read after subsystem-reset failed"
t1=$(cut -d' ' -f1 /proc/uptime)
awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 5) }' || die "read after subsystem-reset took $t0 -> $t1 s"
fio_json reset-after-verify --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=32M --ioengine=io_uring \
  --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 || die "verified I/O after the reset failed"
fio_randread reset-after io_uring 32 2 || die "randread after the reset failed"
check_no_nvme_errors || exit 1
exit 0
