# shellcheck shell=sh
# vnvme-faults.sh - guest test (run-vnvme-tests.sh t_faults): faults injected through the control
# socket while Linux runs, and what Linux makes of them. The host acts when this script prints
# "FAULTS-ASK <step>"; the guest cannot see the host's action, so it repeats its probe until the
# effect shows (bounded). Kernel command line: nvme_core.io_timeout=5 (a lost command times out in 5 s).
#   1 status: unrecovered-read-error, DNR, count 2 on LBA 8 reads: dd and nvme read fail, with the status
#   2 namespace_add 32M:ram: /dev/nvme0n2 appears without a rescan, 32 MiB, verified write/read
#   3 namespace_remove 2: /dev/nvme0n2 disappears
#   4 never-complete, count 1, on LBA 16 reads: the read times out, Linux aborts it and retries: dd succeeds
#   5 latency 2s fixed, count 1, on LBA 24 reads: one dd takes >= 2 s and succeeds
#   6 not-ready 3s on nsid 1: reads fail with Namespace Not Ready, succeed once it is over
#   7 smart-warning temperature: nvme smart-log shows critical_warning 0x2
#   8 controller_fatal: the next I/O times out, Linux sees CSTS.CFS, resets the controller, the read succeeds
#   9 power loss (the namespace is ram,vwc: Linux sees a volatile write cache): LBA 48 written and flushed
#     (dd conv=fsync), then overwritten without a flush, LBA 56 written without a flush; after the power
#     loss (and Linux's reset) LBA 48 reads the flushed data and LBA 56 zeroes: the unflushed writes vanished
# Each step prints what Linux logged (dmesg lines new since the step began, "TEST: dmesg[N]: ...").
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
up() { cut -d' ' -f1 /proc/uptime; }                      # seconds, 2 decimals
secs_since() { awk -v a="$1" -v b="$(up)" 'BEGIN { printf "%.2f", b - a }'; }
rd() { dd if=/dev/nvme0n1 of=/dev/null bs=4k count=1 skip="$1" iflag=direct 2>/dev/null; }
mark=0
step() { mark=$(dmesg | wc -l); echo "FAULTS-ASK $1"; }
new_dmesg() { dmesg | tail -n +"$((mark + 1))" | grep -i nvme | head -8 | sed "s/^/TEST: dmesg[$1]: /"; }
# until CMD... succeeds, at most $1 tenths of a second
until_ok() { _n=$1; shift; _i=0; while ! "$@"; do [ $_i -ge "$_n" ] && return 1; sleep 0.1; _i=$((_i + 1)); done; }
fails() { ! "$@"; }
# slow_read LBA SECS TRIES WHAT: read LBA until one read takes >= SECS (the host's fault took hold),
# at most TRIES times; sets slow (the seconds it took, empty if none did); a failed read is a failure
slow_read() {
  slow=''; _i=0
  while [ $_i -lt "$3" ]; do
    _t=$(up); rd "$1" || fail "a read of LBA $1 failed ($4)"
    _d=$(secs_since "$_t"); if awk -v d="$_d" -v s="$2" 'BEGIN { exit !(d >= s) }'; then slow=$_d; return; fi
    sleep 0.3; _i=$((_i + 1))
  done
}

rd 8 || die "reading LBA 8 before any fault"

# 1: a status with DNR
step 1
if until_ok 300 fails rd 8; then
  out=$(nvme read /dev/nvme0n1 --start-block=8 --block-count=0 --data-size=4096 --data=/dev/null 2>&1)
  log "status: dd failed; nvme read: $out"
  case $out in *"Unrecovered Read Error"*|*"UNRECOVERED_READ"*|*"0x4281"*|*"0x281"*) ;; *) fail "nvme read did not report the status: $out" ;; esac
  rd 8 || fail "LBA 8 still fails after the fault's count was spent"
else
  fail "reads of LBA 8 never failed"
fi
new_dmesg status

# 2 and 3: a namespace added and removed while running
step 2
if wait_nvme 30 /dev/nvme0n2; then
  sz=$(blockdev --getsize64 /dev/nvme0n2)
  log "namespace_add: nvme0n2 appeared, $sz bytes"
  [ "$sz" = $((32 << 20)) ] || fail "nvme0n2 is $sz bytes, expected 32 MiB"
  fio_json added-verify --filename=/dev/nvme0n2 --rw=randwrite --bs=4k --size=8M --ioengine=io_uring \
    --direct=1 --iodepth=4 --verify=crc32c --verify_fatal=1 --do_verify=1 || fail "nvme0n2 verify"
else
  fail "/dev/nvme0n2 did not appear within 30 s of namespace_add"
fi
new_dmesg ns-add
step 3
i=0; while [ -b /dev/nvme0n2 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ -b /dev/nvme0n2 ]; then fail "/dev/nvme0n2 still there 30 s after namespace_remove"; else log "namespace_remove: nvme0n2 disappeared"; fi
new_dmesg ns-remove

# 4: a command that never completes: timeout, abort, retry
step 4
slow_read 16 4 60 "instead of being recovered"
if [ -n "$slow" ]; then log "never-complete: the read took ${slow}s and succeeded"; else fail "no read of LBA 16 was held"; fi
dmesg | tail -n +"$((mark + 1))" | grep -qi 'timeout, aborting' || fail "no 'timeout, aborting' in dmesg"
new_dmesg never-complete

# 5: latency
step 5
slow_read 24 1.9 100 "delayed"
if [ -n "$slow" ]; then log "latency: one read took ${slow}s"; else fail "no read of LBA 24 was delayed"; fi
new_dmesg latency

# 6: not ready for a while
step 6
if until_ok 300 fails rd 0; then
  t=$(up)
  until_ok 100 rd 0 || fail "reads still fail 10 s after the not-ready fault"
  log "not-ready: reads failed, then worked again $(secs_since "$t")s later"
else
  fail "reads never failed while the namespace was not ready"
fi
new_dmesg not-ready

# 7: SMART critical warning
step 7
cw=''
i=0; while [ $i -lt 100 ]; do
  cw=$(nvme smart-log /dev/nvme0 2>/dev/null | sed -n 's/^critical_warning[[:space:]]*:[[:space:]]*//p' | head -1)
  [ -n "$cw" ] && [ "$cw" != 0 ] && break; sleep 0.2; i=$((i + 1))
done
log "smart-warning: critical_warning $cw, temperature $(nvme smart-log /dev/nvme0 2>/dev/null | sed -n 's/^temperature[[:space:]]*:[[:space:]]*//p' | head -1)"
case $cw in 0x2|2) ;; *) fail "critical_warning is '$cw', expected 0x2" ;; esac
new_dmesg smart

# 8: controller fatal status: recovered by a reset
step 8
slow_read 32 3 60 "around the controller's fatal status"
if [ -n "$slow" ]; then log "controller_fatal: a read waited ${slow}s, then succeeded"; else fail "no read waited for the fatal status"; fi
dmesg | tail -n +"$((mark + 1))" | grep -qi 'reset' || fail "no controller reset in dmesg"
new_dmesg fatal
rd 40 || fail "reads fail after the reset"

# 9: power loss with a volatile write cache
vwc=$(nvme id-ctrl /dev/nvme0 2>/dev/null | sed -n 's/^vwc[[:space:]]*:[[:space:]]*//p' | head -1)
for c in A B C; do dd if=/dev/zero bs=4k count=1 2>/dev/null | tr '\000' "$c" > "/tmp/$c"; done
dd if=/dev/zero of=/tmp/Z bs=4k count=1 2>/dev/null
wr() { dd if="/tmp/$1" of=/dev/nvme0n1 bs=4k count=1 seek="$2" oflag=direct "${3:-conv=notrunc}" 2>/dev/null; }
back() { dd if=/dev/nvme0n1 of=/tmp/back bs=4k count=1 skip="$1" iflag=direct 2>/dev/null && cmp -s /tmp/back "/tmp/$2"; }
wr A 48 conv=fsync || fail "flushed write of LBA 48"
wr B 48 || fail "unflushed write of LBA 48"
wr C 56 || fail "unflushed write of LBA 56"
back 48 B || fail "LBA 48 does not read back what was written"
step 9
slow_read 40 3 60 "around the power loss"
[ -n "$slow" ] || fail "no read waited for the power loss's fatal status"
if back 48 A; then a48=flushed; elif back 48 B; then a48=unflushed; else a48=other; fi
if back 56 Z; then a56=zeroes; elif back 56 C; then a56=unflushed; else a56=other; fi
log "power-loss: vwc $vwc; LBA 48 (flushed A, then B unflushed) reads $a48; LBA 56 (C unflushed) reads $a56"
[ "$a48" = flushed ] || fail "LBA 48 reads $a48 after the power loss, expected the flushed data"
[ "$a56" = zeroes ] || fail "LBA 56 reads $a56 after the power loss, expected zeroes (never flushed)"
new_dmesg power-loss
echo "FAULTS-ASK done"
exit $rc
