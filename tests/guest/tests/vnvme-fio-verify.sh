# shellcheck shell=sh
# vnvme-fio-verify.sh - guest test (run-vnvme-tests.sh): fio writes the whole namespace (or rig.size) with
# crc32c verify headers, 4 KiB random writes then 128 KiB sequential writes, and reads each back verified
# (io_uring, direct). Any verify error fails the test.   rig.size=256M  rig.name=PREFIX (result names)
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
SIZE=$(cmdline_get size 256M); NAME=$(cmdline_get name verify)
rc=0
for pass in "4k randwrite" "128k write"; do
  set -- $pass
  fio_json "$NAME-$1" --filename=/dev/nvme0n1 --rw="$2" --bs="$1" --size="$SIZE" --ioengine=io_uring --direct=1 \
    --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 || { echo "TEST: FAIL: $1 $2 verify"; rc=1; }
done
check_no_nvme_errors || rc=1
exit $rc
