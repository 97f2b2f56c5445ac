# shellcheck shell=sh
# vnvme-ns-ready.sh - guest test (run-vnvme-tests.sh): a namespace that is Not Ready at enable.
# Server: --ns 256M:ram --ns 64M:ram,ready=5s.
# Linux enables the controller with CC.CRIME clear (Controller Ready With Media: it stopped setting
# CRIME in 2024), so the controller holds CSTS.RDY until nsid 2 is ready, and Linux, which waits for
# RDY up to CRTO.CRWMT, then finds both namespaces ready in its first scan:
#   * between "pci function" and the queues line, dmesg shows Linux waited at least rig.ready
#     seconds (default 5) less half a second for RDY
#   * both namespaces are there at once (no async event, no rescan), each with its configured
#     size (matched by /sys/block/*/nsid: Linux names disks in the order its scan finishes)
#   * each passes a verified fio write/read; no nvme errors in dmesg
# The event path for namespaces that turn ready later (CC.CRIME set) is a controller and driver
# test; a namespace attached later is the ns-attach guest test.
. /guest-lib.sh
wait_nvme 30 || die "no /dev/nvme0n1 within 30 s"
READY=$(cmdline_get ready 5); NS1_BYTES=$(cmdline_get ns1_bytes $((256 << 20)))
NS2_BYTES=$(cmdline_get ns2_bytes $((64 << 20)))
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
# dmesg's seconds for the first line matching $1
stamp() { dmesg | grep -m1 "$1" | sed -n 's/^\[ *\([0-9.]*\)\].*/\1/p'; }

t0=$(stamp 'nvme nvme0: pci function'); t1=$(stamp 'nvme nvme0: .*queues')
log "pci function at ${t0:-?}s, queues at ${t1:-?}s"
if [ -z "$t0" ] || [ -z "$t1" ]; then
  fail "dmesg lacks the nvme probe lines"
elif ! awk -v a="$t0" -v b="$t1" -v r="$READY" 'BEGIN { exit !(b - a >= r - 0.5) }'; then
  fail "Linux did not wait for CSTS.RDY: $t0 -> $t1, expected at least ${READY}s"
fi

for want in "1 $NS1_BYTES" "2 $NS2_BYTES"; do
  set -- $want
  dev=''
  for d in /sys/block/nvme0n*; do
    [ "$(cat "$d/nsid" 2>/dev/null)" = "$1" ] && dev=/dev/${d##*/}
  done
  if [ -z "$dev" ]; then
    fail "no block device for nsid $1 in the first scan: $(ls /sys/block | tr '\n' ' ')"
    continue
  fi
  sz=$(blockdev --getsize64 "$dev" 2>/dev/null)
  log "nsid $1 is $dev, $sz bytes"
  [ "$sz" = "$2" ] || fail "$dev (nsid $1) is '$sz' bytes, expected $2"
  fio_json "ns$1-verify" --filename="$dev" --rw=randwrite --bs=4k --size=8M --ioengine=io_uring --direct=1 \
    --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 || fail "$dev (nsid $1) verify"
done
dmesg | grep -i nvme | tail -6 | sed 's/^/TEST: dmesg: /'
result_json "{\"name\":\"ns-ready\",\"probe_s\":${t0:-0},\"queues_s\":${t1:-0}}"
check_no_nvme_errors || rc=1
exit $rc
