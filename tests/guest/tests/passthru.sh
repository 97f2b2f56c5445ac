# shellcheck shell=sh
# passthru.sh - guest test (run-vnvme-tests.sh): NVMe passthrough from a real Linux guest.
#   * nvme admin-passthru: vendor info (admin C2h, NUMD 15 -> 64 bytes) starts with "VNVMEVND";
#     an unregistered vendor opcode (C4h) fails (Invalid Command Opcode)
#   * nvme io-passthru: vendor checksum (I/O C0h: SLBA cdw10/11, NLB cdw12, CRC32C in dword 0) of a
#     zeroed block is 0x98f94189 (CRC32C of 4096 zero bytes); it changes when the block changes and is
#     the same when asked twice
#   * fio io_uring_cmd (async passthrough) on /dev/ng0n1: a crc32c-verified 4 KiB random write/read of
#     16 MiB, then 4 KiB randread at each QD of rig.qds
#     (default 1,32) for rig.runtime seconds (default 5); no nvme error in dmesg afterwards
# Needs nvme-cli and a kernel with the NVMe generic char device (5.13+) and fio with io_uring_cmd
# (3.31+); without the last two the fio part is skipped (logged), not failed.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
RT=$(cmdline_get runtime 5); QDS=$(cmdline_get qds 1,32 | tr , ' ')
LBA=4096
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
# dword 0 of the completion as 8 lowercase hex digits, from either nvme-cli wording:
#   2.x (trixie): "IO Command Vendor Specific is Success and result: 0x98f94189"
#   older:        "NVMe command result:98f94189"
result_of() {
  _h=$(sed -n 's/.*[Rr]esult: *\(0x\)\{0,1\}\([0-9a-fA-F][0-9a-fA-F]*\).*/\2/p' | head -1)
  [ -n "$_h" ] && printf '%08x\n' "0x$_h"
}
checksum() {   # LBA: logs nvme-cli's output on failure
  _o=$(nvme io-passthru /dev/nvme0n1 --opcode=0xc0 --namespace-id=1 --cdw10="$1" --cdw12=0 2>&1) \
    || { echo "TEST: io-passthru 0xc0 failed: $_o" >&2; return 1; }
  echo "$_o" | result_of
}

# --- admin: vendor info ---
out=$(nvme admin-passthru /dev/nvme0 --opcode=0xc2 --cdw10=15 --data-len=64 --read 2>&1) \
  || fail "admin-passthru 0xc2 failed: $out"
log "vendor info: $(echo "$out" | head -3 | tr '\n' '|')"
case $out in *VNVMEVND*) ;; *) fail "vendor info has no VNVMEVND magic: $out" ;; esac

out=$(nvme admin-passthru /dev/nvme0 --opcode=0xc4 2>&1) && fail "admin-passthru 0xc4 succeeded: $out"
log "unregistered vendor opcode 0xc4: $out"
case $out in *INVALID_OPCODE*|*[Ii]nvalid*[Oo]pcode*|*0x4001*) ;; *) fail "0xc4: not Invalid Command Opcode: $out" ;; esac

# --- I/O: checksum of an LBA range, no data transferred ---
dd if=/dev/zero of=/dev/nvme0n1 bs=4096 count=1 seek=$LBA oflag=direct 2>/dev/null || fail "dd zero write failed"
sum0=$(checksum $LBA)
log "checksum of zeroed LBA $LBA: $sum0"
[ "$sum0" = 98f94189 ] || fail "checksum of a zero block is '$sum0', expected 98f94189"
dd if=/dev/urandom of=/dev/nvme0n1 bs=4096 count=1 seek=$LBA oflag=direct 2>/dev/null || fail "dd random write failed"
sum1=$(checksum $LBA); sum2=$(checksum $LBA)
log "checksum after random write: $sum1, again: $sum2"
[ -n "$sum1" ] && [ "$sum1" != "$sum0" ] || fail "checksum did not change with the data ($sum0 -> '$sum1')"
[ "$sum1" = "$sum2" ] || fail "checksum not repeatable: $sum1 then $sum2"

# --- fio io_uring_cmd: asynchronous passthrough on the generic char device ---
if [ ! -c /dev/ng0n1 ]; then
  log "SKIP fio io_uring_cmd: no /dev/ng0n1 (kernel without the NVMe generic char device)"
elif ! fio --enghelp=io_uring_cmd > /dev/null 2>&1; then
  log "SKIP fio io_uring_cmd: this fio has no io_uring_cmd engine"
else
  # verified write/read through the char device (writes go through passthrough too)
  fio_json io_uring_cmd-verify --filename=/dev/ng0n1 --ioengine=io_uring_cmd --cmd_type=nvme \
    --rw=randwrite --bs=4k --size=16M --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 \
    || fail "fio io_uring_cmd verified write/read"
  for qd in $QDS; do
    fio_randread "io_uring_cmd-qd$qd" io_uring_cmd "$qd" "$RT" /dev/ng0n1 || fail "fio io_uring_cmd randread QD $qd"
  done
fi

result_json "{\"name\":\"passthru\",\"checksum_zero\":\"$sum0\",\"checksum_random\":\"$sum1\"}"
check_no_nvme_errors || rc=1
exit $rc
