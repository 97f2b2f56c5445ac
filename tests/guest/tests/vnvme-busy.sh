# shellcheck shell=sh
# vnvme-busy.sh - guest side of the "QEMU killed mid-I/O" test (run-vnvme-tests.sh): prints a marker,
# then keeps verified random reads and writes in flight for rig.runtime seconds (default 60) so the
# host can SIGKILL QEMU while commands are outstanding. Passing through to the end is also fine.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
log "BUSY-IO-STARTING"
fio_json busy --filename=/dev/nvme0n1 --rw=randrw --bs=4k --size=64M --ioengine=io_uring --direct=1 \
  --iodepth=32 --time_based --runtime="$(cmdline_get runtime 60)" --verify=crc32c --verify_backlog=256
