# shellcheck shell=sh
# vnvme-format.sh - guest test (run-vnvme-tests.sh): Format NVM from nvme-cli changes the LBA size the
# block layer uses. Server: --ns 256M:ram (LBA format 3, 4096+0).
#   * `nvme format /dev/nvme0n1 --lbaf=0` (512+0): id-ns FLBAS = 0, the block device's logical block
#     size is 512 and its size unchanged; a verified fio write/read (512 B and 4 KiB blocks) passes
#   * `nvme format --lbaf=3` back: logical block size 4096, verified fio again
#   * no nvme errors in dmesg
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
NS_BYTES=$(cmdline_get ns_bytes $((256 << 20)))
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }
verify() {   # NAME BS [SIZE]
  fio_json "$1" --filename=/dev/nvme0n1 --rw=randwrite --bs="$2" --size="${3:-16M}" --ioengine=io_uring --direct=1 \
    --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 || fail "$1: fio verify with bs $2"
}
# format to LBAF, check FLBAS and the block layer's view (it may take a moment to revalidate)
format_to() {   # LBAF LBA_BYTES
  out=$(nvme format /dev/nvme0n1 --lbaf="$1" --force 2>&1) || { fail "format --lbaf=$1: $out"; return 1; }
  log "format --lbaf=$1: $(echo "$out" | tr '\n' ' ')"
  nvme id-ns /dev/nvme0n1 > /tmp/id-ns || fail "id-ns after format"
  flbas=$(field flbas /tmp/id-ns)
  [ $((flbas & 0xf)) = "$1" ] || fail "flbas $flbas after format --lbaf=$1"
  _i=0
  while [ "$(blockdev --getss /dev/nvme0n1 2>/dev/null)" != "$2" ] && [ $_i -lt 50 ]; do sleep 0.1; _i=$((_i + 1)); done
  ss=$(blockdev --getss /dev/nvme0n1); sz=$(blockdev --getsize64 /dev/nvme0n1)
  log "after format --lbaf=$1: logical block size $ss, $sz bytes"
  [ "$ss" = "$2" ] || fail "logical block size $ss after format --lbaf=$1, expected $2"
  [ "$sz" = "$NS_BYTES" ] || fail "size $sz after format --lbaf=$1, expected $NS_BYTES"
}

[ "$(blockdev --getss /dev/nvme0n1)" = 4096 ] || fail "logical block size at boot $(blockdev --getss /dev/nvme0n1), expected 4096"
format_to 0 512
verify lbaf0-512 512 4M
verify lbaf0-4k 4k
format_to 3 4096
verify lbaf3-4k 4k
result_json "{\"name\":\"format\",\"ok\":$((1 - rc))}"
check_no_nvme_errors || rc=1
exit $rc
