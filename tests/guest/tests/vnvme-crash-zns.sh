# shellcheck shell=sh
# vnvme-crash-zns.sh - guest test (run-vnvme-tests.sh crash-zns): as vnvme-crash.sh, on a zoned `file`
# namespace (zones of 2 MiB) served by `vnvme serve --supervise`, whose server the host SIGKILLs 5 times:
# rounds of fio --zonemode=zbd randwrite 4 KiB, crc32c verify of each round, 64 MiB over the zones at
# io_uring QD 8, at most 4 zones open, the zones reset between rounds, for rig.secs (40) seconds after
# "TEST: crash: I/O running". Linux (zone write plugging) retries a write completed with Command
# Interrupted at its write pointer: the restore must give it back (no Zone Invalid Write). 0 verify
# errors, no I/O error, no nvme timeout, abort or reset in dmesg.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
D=/dev/nvme0n1
SECS=$(cmdline_get secs 40)
[ "$(cat /sys/block/nvme0n1/queue/zoned)" = host-managed ] || die "nvme0n1 is not zoned"
log "crash: I/O running"
end=$(($(date +%s) + SECS))
rounds=0
while [ "$(date +%s)" -lt $end ]; do
  blkzone reset "$D" || die "blkzone reset failed"
  fio --name=zbd --filename="$D" --direct=1 --ioengine=io_uring --iodepth=8 --zonemode=zbd --rw=randwrite \
    --bs=4k --size=64M --max_open_zones=4 --verify=crc32c --do_verify=1 --verify_fatal=1 \
    --output-format=terse --terse-version=3 > /tmp/fio.out 2>&1
  frc=$?
  rounds=$((rounds + 1))
  log "round $rounds: fio exit $frc: $(awk -F';' '/^3;/ {print "errors " $5 ", written KiB " $47 ", verified KiB " $6 ", write clat max us " $56}' /tmp/fio.out)"
  [ $frc = 0 ] || { tail -5 /tmp/fio.out; die "fio --zonemode=zbd randwrite with verify failed in round $rounds"; }
done
echo "TEST: dmesg nvme lines: $(dmesg | grep -ic nvme)"
dmesg | grep -i nvme | sed 's/^/TEST: dmesg: /'
check_no_nvme_errors || die "nvme timeouts or resets in dmesg"
log "crash: $rounds verified zbd rounds in $SECS s across the kills, no error"
