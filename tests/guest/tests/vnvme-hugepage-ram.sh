# shellcheck shell=sh
# vnvme-hugepage-ram.sh - guest test (run-vnvme-tests.sh hugepage-ram): the guest's RAM is a hugetlbfs file
# (QEMU memory-backend-file,share=on), so the server maps it in huge pages. A controller reset (the queues
# are created again, in that memory), then fio randrw with 4k-128k blocks and crc32c verify, read back.
#   rig.size=64M  rig.name=PREFIX (result names)
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
SIZE=$(cmdline_get size 64M); NAME=$(cmdline_get name hugepage)
C=/sys/class/nvme/nvme0
echo 1 > $C/reset_controller || die "writing reset_controller failed"
n=0
while [ "$(cat $C/state)" != live ]; do
  [ $n -ge 300 ] && die "controller state '$(cat $C/state)' 30 s after the reset"
  sleep 0.1; n=$((n + 1))
done
log "reset: controller live again after ~$((n / 10)).$((n % 10)) s"
fio_json "$NAME-randrw" --filename=/dev/nvme0n1 --rw=randrw --bsrange=4k-128k --size="$SIZE" --ioengine=io_uring \
  --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 || die "randrw verify"
check_no_nvme_errors || exit 1
