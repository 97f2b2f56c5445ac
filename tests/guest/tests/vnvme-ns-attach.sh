# shellcheck shell=sh
# vnvme-ns-attach.sh - guest test (run-vnvme-tests.sh): Namespace Management and Attachment from nvme-cli.
# Server: --max-namespaces 8 --nvm-capacity 1G --ns 256M:ram --ns 64M:ram,detached.
#   * the detached nsid 2 does not upset the scan: nvme0n1 works, no nvme0n2, no nvme errors in dmesg, and
#     `nvme list-ns --all` (allocated) lists nsid 2 while `nvme list-ns` (attached) does not
#   * `nvme attach-ns -n 2 -c CNTLID` makes /dev/nvme0n2 appear by itself: the controller sends a Namespace
#     Attribute Changed event and Linux rescans (no `nvme ns-rescan`; required, as for ns-ready)
#   * `nvme create-ns` (32 MiB, LBA format 3) + `attach-ns` gives a new block device of that size that
#     passes a verified fio write/read; `nvme detach-ns` makes it disappear, `nvme delete-ns` frees it
#   * no nvme errors in dmesg at the end
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
WAIT=$(cmdline_get wait 15); NEW_BYTES=$((32 << 20))
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }
# nsids listed by nvme list-ns ("[   0]:0x2" lines) as decimal, space separated
nsids() { sed -n 's/.*\]:0x\([0-9a-fA-F]*\).*/\1/p' | while read -r h; do printf '%d ' "0x$h"; done; }
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }
wait_gone() {   # SECS DEV
  _i=0
  while [ -b "$2" ]; do [ $_i -ge $(($1 * 10)) ] && return 1; sleep 0.1; _i=$((_i + 1)); done
  return 0
}

nvme id-ctrl /dev/nvme0 > /tmp/id-ctrl || die "nvme id-ctrl failed"
cntlid=$(field cntlid /tmp/id-ctrl); oacs=$(field oacs /tmp/id-ctrl); nn=$(field nn /tmp/id-ctrl)
log "id-ctrl: cntlid=$cntlid oacs=$oacs nn=$nn tnvmcap=$(field tnvmcap /tmp/id-ctrl) unvmcap=$(field unvmcap /tmp/id-ctrl)"
[ $((oacs & 0x8)) != 0 ] || fail "OACS $oacs lacks bit 3 (Namespace Management and Attachment)"
[ "$nn" = 8 ] || fail "nn $nn, expected 8"

# --- the detached namespace at boot ---
[ -b /dev/nvme0n2 ] && fail "/dev/nvme0n2 exists although nsid 2 is detached"
fio_json ns1-verify --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=8M --ioengine=io_uring --direct=1 \
  --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 || fail "nvme0n1 verify"
check_no_nvme_errors || fail "nvme errors in dmesg after the scan"
allocated=$(nvme list-ns /dev/nvme0 --all 2>&1 | nsids); attached=$(nvme list-ns /dev/nvme0 2>&1 | nsids)
log "list-ns --all: $allocated; list-ns: $attached"
has "$allocated" 2 || fail "list-ns --all does not show nsid 2: '$allocated'"
has "$attached" 2 && fail "list-ns (attached) shows the detached nsid 2: '$attached'"
has "$attached" 1 || fail "list-ns (attached) does not show nsid 1: '$attached'"

# --- attach nsid 2: the event makes Linux find it ---
out=$(nvme attach-ns /dev/nvme0 -n 2 -c "$cntlid" 2>&1) || fail "attach-ns 2: $out"
log "attach-ns 2: $out"
if wait_nvme "$WAIT" /dev/nvme0n2; then
  log "nvme0n2 appeared after attach-ns (async event)"
  sz=$(blockdev --getsize64 /dev/nvme0n2); [ "$sz" = $((64 << 20)) ] || fail "nvme0n2 is $sz bytes, expected 64 MiB"
else
  fail "/dev/nvme0n2 did not appear within ${WAIT}s of attach-ns (no rescan on the event)"
  nvme ns-rescan /dev/nvme0; wait_nvme 5 /dev/nvme0n2 && log "  ... but nvme ns-rescan found it" || log "  ... nor did nvme ns-rescan"
fi

# --- create + attach a new namespace ---
out=$(nvme create-ns /dev/nvme0 --nsze=$((NEW_BYTES / 4096)) --ncap=$((NEW_BYTES / 4096)) --flbas=3 2>&1)
log "create-ns: $out"
new=$(echo "$out" | sed -n 's/.*nsid:* *\([0-9][0-9]*\).*/\1/p' | head -1)
if [ -z "$new" ]; then
  fail "create-ns: $out"
else
  has "$(nvme list-ns /dev/nvme0 --all 2>&1 | nsids)" "$new" || fail "list-ns --all does not show the new nsid $new"
  out=$(nvme attach-ns /dev/nvme0 -n "$new" -c "$cntlid" 2>&1) || fail "attach-ns $new: $out"
  if wait_nvme "$WAIT" "/dev/nvme0n$new"; then
    sz=$(blockdev --getsize64 "/dev/nvme0n$new")
    log "nvme0n$new appeared after create-ns + attach-ns, $sz bytes"
    [ "$sz" = "$NEW_BYTES" ] || fail "nvme0n$new is $sz bytes, expected $NEW_BYTES"
    fio_json new-verify --filename="/dev/nvme0n$new" --rw=randwrite --bs=4k --size=16M --ioengine=io_uring --direct=1 \
      --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 || fail "nvme0n$new verify"
  else
    fail "/dev/nvme0n$new did not appear within ${WAIT}s of attach-ns"
  fi
  # --- detach: the block device goes away; then delete ---
  out=$(nvme detach-ns /dev/nvme0 -n "$new" -c "$cntlid" 2>&1) || fail "detach-ns $new: $out"
  if wait_gone "$WAIT" "/dev/nvme0n$new"; then log "nvme0n$new disappeared after detach-ns"
  else fail "/dev/nvme0n$new still there ${WAIT}s after detach-ns"; fi
  has "$(nvme list-ns /dev/nvme0 2>&1 | nsids)" "$new" && fail "list-ns (attached) still shows nsid $new"
  out=$(nvme delete-ns /dev/nvme0 -n "$new" 2>&1) || fail "delete-ns $new: $out"
  has "$(nvme list-ns /dev/nvme0 --all 2>&1 | nsids)" "$new" && fail "list-ns --all still shows deleted nsid $new"
fi
dmesg | grep -i nvme | tail -8 | sed 's/^/TEST: dmesg: /'
result_json "{\"name\":\"ns-attach\",\"cntlid\":\"$cntlid\",\"created\":\"$new\"}"
check_no_nvme_errors || rc=1
exit $rc
