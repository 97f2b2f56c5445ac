# shellcheck shell=sh
# vnvme-pi.sh - guest test (run-vnvme-tests.sh): end-to-end data protection with Linux's block integrity.
# Server: --ns 64M:file=F (LBA format 3, 4096+0; metadata and PI are stored in the file with the data).
# For each of: --lbaf=4 (4096+8) with --pi=1, 2 and 3, --lbaf=6 (4096+16, 64-bit guard) with --pi=1 and 3:
#   * `nvme format --lbaf=N --pi=T` succeeds and id-ns shows FLBAS N and DPS T;
#     /sys/block/nvme0n1/integrity/format is the profile Linux picks for it (T10-DIF-TYPE1-CRC for
#     types 1 and 2, T10-DIF-TYPE3-CRC, EXT-DIF-TYPE1-CRC64, EXT-DIF-TYPE3-CRC64)
#   * fio writes 8 MiB (4 KiB random, direct) and reads it back with crc32c verify: the kernel generates
#     the PI on writes and checks it on reads, the controller checks it too
#   * nvme write --prinfo=4 (guard check) of a block whose metadata carries a wrong guard is refused with
#     the End-to-end Guard Check Error (0x282); nvme read --prinfo=2 with an application tag the block
#     does not carry gets the Application Tag Check Error (0x283); with type 2, a reference tag check
#     against another initial tag gets the Reference Tag Check Error (0x284)
# --lbaf=5 (4096+64) --pi=1 with --pil=0 (PI in the last 8 bytes: the guard covers the 56 bytes before it)
# and --pil=1 (first): DPS PIP, T10-DIF-TYPE1-CRC, fio verify;
# then --lbaf=3 --pi=0 back: integrity/format "none"; no nvme errors in dmesg.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }
DEV=/dev/nvme0n1
INTEG=/sys/block/nvme0n1/integrity/format

# format_pi LBAF PI PROFILE [PIL]: format, then wait for the block layer to show PROFILE
format_pi() {
  out=$(nvme format $DEV --lbaf="$1" --pi="$2" --pil="${4:-0}" --force 2>&1) || { fail "format --lbaf=$1 --pi=$2: $out"; return 1; }
  nvme id-ns $DEV > /tmp/id-ns || fail "id-ns after format"
  flbas=$(field flbas /tmp/id-ns); dps=$(field dps /tmp/id-ns)
  [ $((flbas & 0xf)) = "$1" ] || fail "flbas $flbas after format --lbaf=$1"
  [ $((dps & 7)) = "$2" ] || fail "dps $dps after format --pi=$2"
  [ $(((dps >> 3) & 1)) = "${4:-0}" ] || fail "dps $dps after format --pil=${4:-0}"
  _i=0
  while [ "$(cat $INTEG 2>/dev/null)" != "$3" ] && [ $_i -lt 50 ]; do sleep 0.1; _i=$((_i + 1)); done
  got=$(cat $INTEG 2>/dev/null)
  log "format --lbaf=$1 --pi=$2: dps $dps, integrity/format '$got', tag_size $(cat /sys/block/nvme0n1/integrity/tag_size 2>/dev/null)"
  if [ "$got" = nop ] && [ "${4:-0}" = 0 ] && [ "$1" = 5 ] && kernel_before 6.12; then
    # the device said what it should (FLBAS and DPS checked above: PI type 1, last in 64 bytes of metadata);
    # Linux 6.1 takes PI only first in the metadata or as all of it (nvme_init_ms: first || ms == pi_size),
    # so it registers no profile: checked on 6.1 (nop) and 6.12 (T10-DIF-TYPE1-CRC)
    skip_check "integrity/format for PI last in 64-byte metadata (lbaf 5, pil 0): Linux $(uname -r) uses PI only first in the metadata (integrity '$got'; 6.12 does)"
    return 2
  fi
  [ "$got" = "$3" ] || { fail "integrity/format '$got' after --lbaf=$1 --pi=$2, expected '$3'"; return 1; }
  return 0
}

# expect_status NAME WANT CMD...: the nvme-cli command fails with status WANT (e.g. 0x282)
expect_status() {
  _name=$1 _want=$2; shift 2
  _out=$("$@" 2>&1) && { fail "$_name: succeeded, expected status $_want"; return; }
  # nvme-cli prints the status with DNR (0x4282) or without it
  _low=$(echo "$_want" | sed 's/^0x//')
  if echo "$_out" | grep -qiE "\(0x(4)?0?$_low\)"; then
    log "$_name: refused as expected: $(echo "$_out" | tail -1)"
  else
    fail "$_name: expected status $_want, got: $(echo "$_out" | tr '\n' ' ')"
  fi
}

dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null

case_pi() {   # LBAF PI PROFILE MS
  lbaf=$1 pi=$2 ms=$4
  format_pi "$lbaf" "$pi" "$3" || return
  fio_json "pi-l$lbaf-t$pi" --filename=$DEV --rw=randwrite --bs=4k --size=8M --ioengine=io_uring --direct=1 \
    --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 \
    || fail "lbaf $lbaf pi $pi: fio verify"
  # metadata of MS bytes with a guard that cannot be the block's (the tuple starts the metadata: the
  # format's metadata is the tuple alone), application tag 0, reference tag 1 (the LBA written)
  if [ "$ms" = 8 ]; then
    printf '\336\255\000\000\000\000\000\001' > /tmp/badmeta
  else
    printf '\336\255\276\357\336\255\276\357\000\000\000\000\000\000\000\001' > /tmp/badmeta
  fi
  expect_status "lbaf $lbaf pi $pi: write with a wrong guard" 0x282 \
    nvme write $DEV --start-block=1 --block-count=0 --data-size=4096 --data=/tmp/blk \
    --metadata-size="$ms" --metadata=/tmp/badmeta --prinfo=4
  # a block the kernel wrote (application tag 0) read with an application tag check against 1234h
  expect_status "lbaf $lbaf pi $pi: read with another application tag" 0x283 \
    nvme read $DEV --start-block=2 --block-count=0 --data-size=4096 --data=/tmp/out \
    --metadata-size="$ms" --metadata=/tmp/outmeta --prinfo=2 --app-tag=0x1234 --app-tag-mask=0xffff
  if [ "$pi" = 2 ]; then
    expect_status "lbaf $lbaf pi $pi: read with another reference tag" 0x284 \
      nvme read $DEV --start-block=2 --block-count=0 --data-size=4096 --data=/tmp/out \
      --metadata-size="$ms" --metadata=/tmp/outmeta --prinfo=1 --ref-tag=7
  fi
}

case_pi 4 1 T10-DIF-TYPE1-CRC 8
case_pi 4 2 T10-DIF-TYPE1-CRC 8
case_pi 4 3 T10-DIF-TYPE3-CRC 8
case_pi 6 1 EXT-DIF-TYPE1-CRC64 16
case_pi 6 3 EXT-DIF-TYPE3-CRC64 16
# 4096+64: 56 bytes of metadata besides the tuple, PI last (guard over data and those bytes) or first
for pil in 0 1; do
  format_pi 5 1 T10-DIF-TYPE1-CRC $pil
  case $? in 1) continue ;; 2) log "lbaf 5 pil $pil: fio verify with the guest's own metadata (no PI from the kernel)" ;; esac
  fio_json "pi-l5-pil$pil" --filename=$DEV --rw=randwrite --bs=4k --size=8M --ioengine=io_uring --direct=1 \
    --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 \
    || fail "lbaf 5 pil $pil: fio verify"
done
format_pi 3 0 none
result_json "{\"name\":\"pi\",\"ok\":$((1 - rc))}"
check_no_nvme_errors || rc=1
exit $rc
