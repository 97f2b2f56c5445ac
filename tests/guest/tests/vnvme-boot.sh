# shellcheck shell=sh
# vnvme-boot.sh - guest test (run-vnvme-tests.sh boot-uefi, boot-bios): the guest was booted by firmware from
# the vnvme disk, namespace 1 (make-boot-image.sh), not by QEMU's -kernel. Checks that the command line is the
# boot entry's (rig.boot=uefi|bios), the firmware kind (/sys/firmware/efi only under UEFI), that the boot disk
# has 512-byte blocks and shows its partition (the server took the image's sector size) holding the FAT32
# file system the kernel was loaded from; then fio verify on namespace 2 (rig.size, 64M):
# 4 KiB random writes and 128 KiB sequential writes with crc32c headers, read back verified.
. /guest-lib.sh
KIND=$(cmdline_get boot none); SIZE=$(cmdline_get size 64M)
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
case $KIND in
  uefi) [ -d /sys/firmware/efi ] || fail "booted by UEFI, but no /sys/firmware/efi" ;;
  bios) [ ! -d /sys/firmware/efi ] || fail "booted by BIOS, but /sys/firmware/efi exists" ;;
  *) fail "no rig.boot=uefi|bios on the command line: not the boot entry's ($(cat /proc/cmdline))" ;;
esac
wait_nvme 10 || die "no /dev/nvme0n1"
# Linux numbers nvme0nX in the order its scan finds the namespaces, not by NSID: find them by nsid
by_nsid() {
  local n i=0
  while [ $i -lt 50 ]; do
    for n in /sys/block/nvme0n*; do [ "$(cat "$n/nsid" 2>/dev/null)" = "$1" ] && { echo "${n##*/}"; return 0; }; done
    sleep 0.1; i=$((i + 1))
  done
  return 1
}
BOOT=$(by_nsid 1) || die "no namespace 1 (the boot disk): $(ls /sys/block)"
DATA=$(by_nsid 2) || die "no namespace 2 (the fio namespace): $(ls /sys/block)"
# the partition scan runs as the namespace appears; give it a moment
i=0; while [ ! -b "/dev/${BOOT}p1" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
lbs=$(cat "/sys/block/$BOOT/queue/logical_block_size")
[ "$lbs" = 512 ] || fail "boot disk $BOOT: logical block size $lbs, want 512 (the image's)"
if [ -b "/dev/${BOOT}p1" ]; then
  sectors=$(cat "/sys/block/$BOOT/${BOOT}p1/size")
  [ "$sectors" = 131072 ] || fail "boot partition ${BOOT}p1 has $sectors sectors, want 131072 (64 MiB)"
  # FAT32 boot sector: the file system type at byte 82
  fstype=$(dd if="/dev/${BOOT}p1" bs=512 count=1 2>/dev/null | dd bs=1 skip=82 count=5 2>/dev/null)
  [ "$fstype" = FAT32 ] || fail "${BOOT}p1 holds '$fstype', want FAT32"
else
  fail "boot disk $BOOT shows no partition: $(ls /dev/nvme*)"
fi
log "booted by $KIND from nsid 1 ($BOOT: logical block $lbs, partition ${BOOT}p1 ${sectors:-?} sectors, ${fstype:-?})"
for pass in "4k randwrite" "128k write"; do
  set -- $pass
  fio_json "boot-$KIND-$1" --filename="/dev/$DATA" --rw="$2" --bs="$1" --size="$SIZE" --ioengine=io_uring \
    --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 \
    || fail "$1 $2 verify on $DATA"
done
check_no_nvme_errors || rc=1
exit $rc
