# shellcheck shell=sh
# vnvme-multipath.sh - guest test (run-vnvme-tests.sh multipath): one VM attached to two controllers of one
# vnvme subsystem (`vnvme serve --socket A --socket B`). Linux's native multipath (nvme_core.multipath=Y) must
# join them into one nvme-subsystem with one /dev/nvmeXn1 and a path per controller, each reporting its ANA
# state. Then fio writes and verifies (crc32c) for rig.runtime seconds with the round-robin I/O policy while
# the host flips the second controller's ANA state every 3 s: no error may reach fio. The host reads each
# controller's counters to check where the I/O went; this script logs the ANA states it saw.
# The multipath disk is named after its nvme-subsystem's instance (nvmeXn1, X not always 0); its paths
# are the hidden nvmeXcYn1.
#   rig.runtime=30   seconds of fio
. /guest-lib.sh
RUNTIME=$(cmdline_get runtime 30)
paths() { ls /sys/block 2>/dev/null | grep -E "^${DISK%n1}c[0-9]+n1\$" | tr '\n' ' '; }
i=0
while :; do
  DISK=$(ls /sys/block 2>/dev/null | grep -E '^nvme[0-9]+n1$' | head -1)
  [ -n "$DISK" ] && [ "$(paths | wc -w)" -ge 2 ] && break
  [ $i -ge 300 ] && die "no multipath disk with two paths within 30 s: /sys/block holds $(ls /sys/block | tr '\n' ' ')"
  sleep 0.1; i=$((i + 1))
done
DEV=/dev/$DISK
wait_nvme 10 "$DEV" || die "no $DEV"
mp=$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)
[ "$mp" = Y ] || die "the guest kernel's nvme_core.multipath is '$mp', not Y"
ctrls=$(ls -d /sys/class/nvme/nvme[0-9]* 2>/dev/null | wc -l)
subsys=$(ls -d /sys/class/nvme-subsystem/nvme-subsys* 2>/dev/null | wc -l)
disks=$(grep -cE ' nvme[0-9]+n[0-9]+$' /proc/partitions)
paths=$(paths)
log "$ctrls controllers, $subsys subsystem, $disks block device ($DISK), paths: $paths"
dup=$(dmesg | grep -iE 'duplicate cntlid|duplicate IDs|rejecting')
[ -z "$dup" ] || die "Linux found duplicates: $(echo "$dup" | head -2 | tr '\n' ' ')"
[ "$ctrls" = 2 ] || die "$ctrls controllers, expected 2"
[ "$subsys" = 1 ] || die "$subsys nvme subsystems, expected 1 (one NQN)"
[ "$disks" = 1 ] || die "$disks nvme block devices, expected 1: $(grep nvme /proc/partitions | tr '\n' ' ')"
[ "$(echo $paths | wc -w)" = 2 ] || die "paths of $DISK: '$paths', expected 2"
for c in /sys/class/nvme/nvme[0-9]*; do
  log "${c##*/}: cntlid $(cat "$c/cntlid"), serial $(cat "$c/serial" | tr -d ' '), $(cat "$c/subsysnqn")"
done
for p in $(paths); do p=/sys/block/$p
  s=$(cat "$p/ana_state" 2>/dev/null)
  [ "$s" = optimized ] || die "${p##*/}: ANA state '$s' at start, expected optimized"
done
sub=$(ls -d /sys/class/nvme-subsystem/nvme-subsys*)
echo round-robin > "$sub/iopolicy" || die "setting the round-robin I/O policy"
log "iopolicy $(cat "$sub/iopolicy")"

# The ANA states as the guest sees them, twice a second, while fio runs.
rm -f /tmp/stop
( while [ ! -f /tmp/stop ]; do
    for p in $(paths); do p=/sys/block/$p; printf '%s=%s ' "${p##*/}" "$(cat "$p/ana_state")"; done
    echo; sleep 0.5
  done ) > /tmp/ana.log &
log "fio starts"
end=$(( $(date +%s) + RUNTIME ))
pass=0 rc=0
while [ "$(date +%s)" -lt "$end" ]; do
  fio_json "multipath-$pass" --filename=$DEV --rw=randwrite --bs=4k --size=16M \
    --offset=$(( (pass % 8) * 16 ))M --ioengine=io_uring --direct=1 --iodepth=16 --verify=crc32c \
    --verify_fatal=1 --do_verify=1 --randrepeat=0 > /tmp/fio.out || { rc=1; cat /tmp/fio.out; break; }
  pass=$((pass + 1))
done
log "fio done"
touch /tmp/stop; wait
[ $rc = 0 ] || die "fio verify pass $pass failed (see above)"
inacc=$(grep -c 'inaccessible' /tmp/ana.log)
both=$(grep -v 'inaccessible' /tmp/ana.log | grep -c 'optimized.*optimized')
log "$pass fio verify passes of 16 MiB, 0 errors; ANA samples: $inacc with a path inaccessible, $both with both optimized"
[ "$inacc" -gt 0 ] || die "no path was ever seen inaccessible: $(head -3 /tmp/ana.log | tr '\n' '|')"
[ "$both" -gt 0 ] || die "both paths were never seen optimized"
# Path errors are expected (they are how the I/O moves); anything else is not.
bad=$(nvme_errors | grep -viE 'ANA|path|failover|requeue')
[ -z "$bad" ] || die "nvme errors in dmesg: $(echo "$bad" | head -3 | tr '\n' ' ')"
dmesg | grep -iE 'nvme' | grep -iE 'ANA|path' | tail -4 | sed 's/^/TEST: dmesg: /'
exit 0
