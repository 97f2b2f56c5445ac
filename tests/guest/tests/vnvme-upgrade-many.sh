# shellcheck shell=sh
# vnvme-upgrade-many.sh - guest test (run-vnvme-tests.sh upgrade-many): two disks of one `[[controllers]]`
# server (two controllers, one process) whose process the host upgrades (vnvme ctl upgrade on the first
# controller's control socket) 5 times while this runs fio randrw 4k-64k with crc32c verify on both disks at
# once for rig.secs (40) seconds after "TEST: upgrade-many: I/O running". 0 verify errors on either disk, no
# nvme timeout, abort or reset in dmesg.
. /guest-lib.sh
wait_nvme 10 /dev/nvme0n1 || die "no /dev/nvme0n1"
wait_nvme 10 /dev/nvme1n1 || die "no /dev/nvme1n1"
SECS=$(cmdline_get secs 40)
log "upgrade-many: I/O running"
(cd /tmp && fio --rw=randrw --bsrange=4k-64k --size=64M --ioengine=io_uring --direct=1 --iodepth=8 \
  --time_based --runtime="$SECS" --verify=crc32c --verify_fatal=1 --verify_backlog=64 \
  --output-format=terse --terse-version=3 \
  --name=a --filename=/dev/nvme0n1 --name=b --filename=/dev/nvme1n1 > /tmp/upgrade-many.out 2>&1)
rc=$?
n=0
for line in $(grep '^3;' /tmp/upgrade-many.out | tr ' ' '_'); do
  n=$((n + 1))
  err=$(echo "$line" | cut -d';' -f5)
  echo "$line" | awk -F';' '{ printf "RESULT {\"name\":\"%s\",\"err\":%d,\"read_iops\":%d,\"write_iops\":%d,\"read_clat_max_us\":%d,\"write_clat_max_us\":%d}\n", $3, $5, $8, $49, $15, $56 }'
  [ "$err" = 0 ] || { tail -5 /tmp/upgrade-many.out; die "fio job $n: error $err across the upgrades"; }
done
[ $n = 2 ] && [ $rc = 0 ] || { tail -5 /tmp/upgrade-many.out; die "fio failed (status $rc, $n job results)"; }
check_no_nvme_errors || die "nvme timeouts or resets in dmesg"
log "upgrade-many: $SECS s of verified randrw on both disks across the upgrades, no error"
