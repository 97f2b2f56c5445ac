# shellcheck shell=sh
# vnvme-hugepage-ram.sh - guest test (run-vnvme-tests.sh hugepage-ram): the guest's RAM is a hugetlbfs file
# (QEMU memory-backend-file,share=on), so the server maps it in huge pages. A controller reset (the queues
# are created again, in that memory), then fio randrw with 4k-128k blocks and crc32c verify, read back.
#   rig.size=64M  rig.name=PREFIX (result names)
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
SIZE=$(cmdline_get size 64M); NAME=$(cmdline_get name hugepage)
reset_live reset
fio_json "$NAME-randrw" --filename=/dev/nvme0n1 --rw=randrw --bsrange=4k-128k --size="$SIZE" --ioengine=io_uring \
  --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 || die "randrw verify"
check_no_nvme_errors || exit 1
