# shellcheck shell=sh
# vnvme-many-disks.sh - guest test (run-vnvme-tests.sh many-disks): one VM with several vnvme disks, each its
# own server started with default settings. Linux must keep every controller (one controller per subsystem
# NQN and CNTLID: "Duplicate cntlid ... rejecting" otherwise) and trust every namespace's identifiers (it
# clears ones it sees twice: "clearing duplicate IDs"), and a name made from a namespace's wwid, as udev
# makes /dev/disk/by-id/nvme-WWID, must reach that disk and no other.
#   rig.disks=N   how many disks QEMU was given
. /guest-lib.sh
N=$(cmdline_get disks 8)
i=0
while [ "$(ls -d /sys/block/nvme*n1 2>/dev/null | wc -l)" -lt "$N" ]; do
  [ $i -ge 300 ] && break
  sleep 0.1; i=$((i + 1))
done
ctrls=$(ls -d /sys/class/nvme/nvme* 2>/dev/null | wc -l)
disks=$(ls -d /sys/block/nvme*n1 2>/dev/null | wc -l)
log "$ctrls controllers, $disks namespaces after ~$((i / 10)) s"
dup=$(dmesg | grep -iE 'duplicate cntlid|duplicate IDs|rejecting')
[ -z "$dup" ] || die "Linux found duplicates: $(echo "$dup" | head -2 | tr '\n' ' ')"
[ "$ctrls" = "$N" ] || die "$ctrls controllers, expected $N"
[ "$disks" = "$N" ] || die "$disks namespaces, expected $N"

# Every identifier distinct: the controllers' serial numbers and NQNs, the namespaces' EUI-64, NGUID, UUID, wwid.
distinct() {   # WHAT FILES...: dies unless each file holds a non-empty value no other file holds
  _what=$1; shift
  _all=$(for f in "$@"; do cat "$f" 2>/dev/null || echo; done)
  [ "$(echo "$_all" | grep -c .)" = "$N" ] || die "$_what: $(echo "$_all" | grep -c .) of $N reported"
  [ "$(echo "$_all" | sort -u | wc -l)" = "$N" ] || die "$_what not distinct: $(echo "$_all" | sort | uniq -d | head -1)"
}
distinct serial /sys/class/nvme/nvme*/serial
distinct subsysnqn /sys/class/nvme/nvme*/subsysnqn
distinct eui64 /sys/block/nvme*n1/eui
distinct nguid /sys/block/nvme*n1/nguid
distinct uuid /sys/block/nvme*n1/uuid
distinct wwid /sys/block/nvme*n1/wwid
log "serials: $(cat /sys/class/nvme/nvme*/serial | tr -d ' ' | tr '\n' ' ')"
log "wwid of nvme0n1: $(cat /sys/block/nvme0n1/wwid)"

# The by-id names (this guest has no udev: made here as its rule does, nvme-$wwid), each written through its
# name and read back through the disk it should be.
mkdir -p /tmp/by-id
for b in /sys/block/nvme*n1; do
  ln -s "/dev/${b##*/}" "/tmp/by-id/nvme-$(cat "$b/wwid")" || die "by-id link for ${b##*/}"
done
[ "$(ls /tmp/by-id | wc -l)" = "$N" ] || die "$(ls /tmp/by-id | wc -l) by-id names for $N disks"
for l in /tmp/by-id/*; do
  printf '%-512s' "${l##*/}" | dd of="$l" bs=512 count=1 conv=fsync 2>/dev/null || die "writing through $l"
done
sync; echo 3 > /proc/sys/vm/drop_caches   # read back from the disks, not the page cache
for b in /sys/block/nvme*n1; do
  got=$(dd if="/dev/${b##*/}" bs=512 count=1 2>/dev/null | tr -d ' ')
  [ "$got" = "nvme-$(cat "$b/wwid")" ] || die "/dev/${b##*/} holds '$got', written through another disk's name"
done
log "$N by-id names, each wrote its own disk"
check_no_nvme_errors || exit 1
