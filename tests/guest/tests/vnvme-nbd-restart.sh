# shellcheck shell=sh
# vnvme-nbd-restart.sh - guest test (run-vnvme-tests.sh nbd-restart): the namespace is an NBD export
# (nbdkit's file plugin on the host). 16 MiB written and verified; then "TEST: nbd-restart: I/O running",
# at which the host kills nbdkit and starts it again a few seconds later, while fio reads at random for
# 20 s carrying on past errors: fio must finish on time (no command hangs), the reads must fail while the
# server is away (Linux logs I/O errors) and work again once it is back; the 16 MiB written before read
# back intact (fio verify_only); new verified writes; no nvme timeout, abort or reset in dmesg.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
D=/dev/nvme0n1
BEFORE="--filename=$D --rw=write --bs=128k --size=16M --ioengine=io_uring --direct=1 --iodepth=8 --verify=crc32c"
# shellcheck disable=SC2086
fio_json nbd-before $BEFORE --verify_fatal=1 --do_verify=1 || die "verified write before the kill failed"
errors_before=$(dmesg | grep -ciE 'I/O error|medium error|I/O Cmd')
log "nbd-restart: I/O running"
t0=$(cut -d' ' -f1 /proc/uptime)
# errnos EIO, ENODATA (medium error), EILSEQ, ENOLINK: fio names only some
fio --name=through --filename=$D --rw=randread --bs=4k --ioengine=io_uring --direct=1 --iodepth=16 \
  --time_based --runtime=20 --continue_on_error=all --ignore_error=5:61:84:67 \
  --output-format=terse --terse-version=3 >/tmp/through 2>&1
t1=$(cut -d' ' -f1 /proc/uptime)
grep -q '^3;' /tmp/through || { tail -5 /tmp/through; die "fio stopped at an error instead of going on"; }
awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a >= 19 && b - a < 45) }' || die "20 s of reads across the restart took $t0 -> $t1 s"
errors=$(( $(dmesg | grep -ciE 'I/O error|medium error|I/O Cmd') - errors_before ))
[ "$errors" -gt 0 ] || die "no I/O error while the NBD server was away (was it killed?)"
log "reads across the restart: done in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, $errors I/O errors logged"
n=0
until dd if=$D of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; do
  [ $n -ge 60 ] && die "reads still fail 30 s after the reads across the restart"
  sleep 0.5; n=$((n + 1))
done
# shellcheck disable=SC2086
fio_json nbd-after-old $BEFORE --verify_only || die "the 16 MiB written before the kill did not read back intact"
fio_json nbd-after-new --filename=$D --offset=16M --rw=randwrite --bs=4k --size=16M --ioengine=io_uring \
  --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 || die "verified I/O after the restart failed"
if dmesg | grep -iE 'nvme' | grep -iE 'timeout|timed out|abort|reset|disabl|offline|dead|removing'; then
  die "nvme timeouts or resets in dmesg"
fi
log "nbd-restart: data kept, I/O back"
