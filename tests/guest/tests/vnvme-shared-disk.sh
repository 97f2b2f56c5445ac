# shellcheck shell=sh
# vnvme-shared-disk.sh - guest test (run-vnvme-tests.sh shared-disk): one of two VMs running at once, each on
# its own controller of one vnvme subsystem (`vnvme serve --socket A --socket B`). Both must see the same
# namespace (the host compares the NGUIDs they log); each writes 1 MiB of its own pattern at its own offset
# and flushes, then waits (120 s at most) until it reads the other VM's pattern at the other offset,
# O_DIRECT (no page cache in between).
#   rig.role=a|b   which VM this is
. /guest-lib.sh
ROLE=$(cmdline_get role a)
case $ROLE in a) OTHER=b MINE=0 THEIRS=1 ;; b) OTHER=a MINE=1 THEIRS=0 ;; *) die "rig.role=$ROLE" ;; esac
wait_nvme 30 || die "no /dev/nvme0n1"
log "role $ROLE: cntlid $(cat /sys/class/nvme/nvme0/cntlid), nguid $(cat /sys/block/nvme0n1/nguid)"
log "NGUID=$(cat /sys/block/nvme0n1/nguid)"
pattern() { yes "vnvme shared disk, written by VM $1" | head -c 1048576; }
want=$(pattern $OTHER | md5sum | cut -d' ' -f1)
# Before writing, the other VM's area may hold nothing yet: it must not already match by chance.
pattern $ROLE > /tmp/mine
dd if=/tmp/mine of=/dev/nvme0n1 bs=1M seek=$MINE count=1 oflag=direct conv=fsync 2>/dev/null \
  || die "writing 1 MiB at $MINE MiB"
log "wrote and flushed 1 MiB at $MINE MiB"
i=0
while :; do
  got=$(dd if=/dev/nvme0n1 bs=1M skip=$THEIRS count=1 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
  [ "$got" = "$want" ] && break
  [ $i -ge 240 ] && die "VM $OTHER's data never appeared at $THEIRS MiB (last md5 $got)"
  sleep 0.5; i=$((i + 1))
done
log "read VM $OTHER's 1 MiB at $THEIRS MiB after ~$((i / 2)) s"
# Mine is still mine: the other VM did not write over it.
got=$(dd if=/dev/nvme0n1 bs=1M skip=$MINE count=1 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$got" = "$(md5sum < /tmp/mine | cut -d' ' -f1)" ] || die "my own 1 MiB at $MINE MiB changed"
check_no_nvme_errors || exit 1
exit 0
