# shellcheck shell=sh
# vnvme-idle.sh - guest side of bench/idle-cost.sh: wait for the disks, then send them nothing while the host
# measures what its servers cost.
#   rig.disks=N   how many disks QEMU was given
#   rig.idle=S    how long to stay idle (seconds)
. /guest-lib.sh
N=$(cmdline_get disks 8)
S=$(cmdline_get idle 30)
i=0
while [ "$(ls -d /sys/block/nvme*n1 2>/dev/null | wc -l)" -lt "$N" ]; do
  [ $i -ge 600 ] && die "$(ls -d /sys/block/nvme*n1 2>/dev/null | wc -l) of $N disks after 60 s"
  sleep 0.1; i=$((i + 1))
done
# Let the udev-less boot's probing (partition scans, identify) finish before the host starts its clock.
sleep 3
log "idle: $N disks, $S s"
sleep "$S"
log "idle done"
