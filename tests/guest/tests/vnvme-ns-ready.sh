# shellcheck shell=sh
# vnvme-ns-ready.sh - guest test (run-vnvme-tests.sh): a namespace that is Not Ready at boot shows up later
# without a reboot. Server: --ns 256M:ram --ns 64M:ram,ready=5s.
#   * nvme0n1 is usable at once (a verified 4 KiB write/read) while nsid 2 is still not ready
#   * /dev/nvme0n2 appears within rig.wait seconds (default 30) of boot with no help from the guest: the
#     controller sends a Namespace Attribute Changed async event when nsid 2 becomes ready and Linux
#     rescans. We require the event path (no `nvme ns-rescan`): it is what a host relies on. If it did
#     not happen, the test fails, and logs whether a manual `nvme ns-rescan` would have found it (so a
#     failure tells the event path from the readiness itself).
#   * the late namespace has the configured size and passes a verified fio write/read
#   * no nvme errors in dmesg
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
WAIT=$(cmdline_get wait 30); NS2_BYTES=$(cmdline_get ns2_bytes $((64 << 20)))
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
up() { cut -d' ' -f1 /proc/uptime; }

t1=$(up)
log "nvme0n1 at ${t1}s uptime; nvme0n2 present: $([ -b /dev/nvme0n2 ] && echo yes || echo no)"
fio_json ns1-verify --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=8M --ioengine=io_uring --direct=1 \
  --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 || fail "nvme0n1 not usable at once"

# wait for nsid 2 without touching the controller: the async event must do it
i=0 path=''
while [ $i -lt $((WAIT * 10)) ]; do
  [ -b /dev/nvme0n2 ] && { path=event; break; }
  sleep 0.1; i=$((i + 1))
done
t2=$(up)
if [ "$path" = event ]; then
  log "nvme0n2 appeared by itself (async event) at ${t2}s uptime"
else
  fail "/dev/nvme0n2 did not appear within ${WAIT}s of nvme0n1 (no rescan on the Namespace Attribute Changed event)"
  nvme get-log /dev/nvme0 --log-id=4 --log-len=64 2>&1 | head -3 | sed 's/^/TEST:   changed-ns log: /'
  nvme ns-rescan /dev/nvme0 2>&1 | sed 's/^/TEST:   ns-rescan: /'
  wait_nvme 5 /dev/nvme0n2 && log "  ... but nvme ns-rescan found it" || log "  ... nor did nvme ns-rescan"
fi
dmesg | grep -i nvme | tail -8 | sed 's/^/TEST: dmesg: /'

if [ -b /dev/nvme0n2 ]; then
  sz=$(blockdev --getsize64 /dev/nvme0n2 2>/dev/null)
  [ "$sz" = "$NS2_BYTES" ] || fail "nvme0n2 is '$sz' bytes, expected $NS2_BYTES"
  fio_json ns2-verify --filename=/dev/nvme0n2 --rw=randwrite --bs=4k --size=16M --ioengine=io_uring --direct=1 \
    --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 || fail "nvme0n2 verify"
fi
result_json "{\"name\":\"ns-ready\",\"ns1_s\":$t1,\"ns2_s\":$t2,\"path\":\"${path:-none}\"}"
check_no_nvme_errors || rc=1
exit $rc
