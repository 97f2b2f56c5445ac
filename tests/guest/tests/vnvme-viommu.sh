# shellcheck shell=sh
# vnvme-viommu.sh - guest test (run-vnvme-tests.sh viommu; bench): the guest runs behind a virtual IOMMU
# (QEMU -device intel-iommu,caching-mode=on, kernel intel_iommu=on), so its nvme driver maps and unmaps each
# I/O buffer and QEMU sends the device a DMA_MAP and a DMA_UNMAP for each. Checks that the controller sits in
# an IOMMU group with DMA translation on, then fio randrw 4k-128k at QD 16 with crc32c verify.
#   rig.size=128M  rig.name=PREFIX (result names)  rig.runtime=SECS (0: one pass, else time based)  rig.verify=0|1
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
SIZE=$(cmdline_get size 128M); NAME=$(cmdline_get name viommu); RUNTIME=$(cmdline_get runtime 0)
VERIFY=$(cmdline_get verify 1)
dev=$(readlink -f /sys/class/nvme/nvme0/device)
[ -e "$dev/iommu_group" ] || die "the controller ($dev) has no IOMMU group: is the vIOMMU on?"
domain=$(cat "$dev/iommu_group/type" 2>/dev/null)
log "controller $(basename "$dev") in IOMMU group $(basename "$(readlink -f "$dev/iommu_group")"), domain type ${domain:-unknown}"
case $domain in identity) die "the IOMMU domain is identity (passthrough): buffers are not mapped" ;; esac
set -- --filename=/dev/nvme0n1 --rw=randrw --bsrange=4k-128k --size="$SIZE" --ioengine=io_uring --direct=1 \
  --iodepth=16 --randrepeat=0
# rig.verify=0: no verify, for a device whose backend keeps no data (QEMU's nvme on null-co, as a peer)
[ "$VERIFY" = 0 ] || set -- "$@" --verify=crc32c --verify_fatal=1 --do_verify=1
[ "$RUNTIME" = 0 ] || set -- "$@" --time_based=1 --runtime="$RUNTIME"
fio_json "$NAME-randrw" "$@" || die "randrw verify behind the vIOMMU"
check_no_nvme_errors || exit 1
