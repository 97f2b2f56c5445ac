# shellcheck shell=sh
# vnvme-shared-reservations.sh - guest test (run-vnvme-tests.sh shared-reservations): one of two VMs running
# at once, each on its own controller of one vnvme subsystem (`vnvme serve --socket A --socket B --ns
# SIZE:file=F`), each a host of its own (Host Identifier "AAAAAAAA" or "BBBBBBBB", Set Features 81h).
# They take turns through two mailbox blocks on the disk (A's at 1 MiB, B's at 2 MiB, read O_DIRECT) and
# the Reservation Report:
#   A: register a1, acquire Write Exclusive; mailbox "A-HOLDS"
#   B: its write is a Reservation Conflict, its read works; register b2 (A waits for 2 registrants)
#   A: release;   B (waits for no reservation): its write works; mailbox "B-WROTE"
#   A: acquire Write Exclusive again, fio randwrite 256k QD 32 (O_DIRECT) in the background; "A-BUSY"
#   B: preempt and abort A (racqa 2, prkey a1) while A's fio runs: report rtype 1, B the one registrant,
#      its write works
#   A: fio ends with an error (its commands aborted, then Reservation Conflict), the report shows B
#      holding, A's write conflicts and its read works
# The host counts the aborted commands (controller 1's "aborted-preempt-and-abort" completions).
#   rig.role=a|b   which VM this is
. /guest-lib.sh
ROLE=$(cmdline_get role a)
wait_nvme 30 || die "no /dev/nvme0n1"
C=/dev/nvme0 NS=/dev/nvme0n1
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
run() {   # CMD...: runs it, logs the command and its output; output in /tmp/out, status in S
  "$@" > /tmp/out 2>&1; S=$?
  log "\$ $* -> exit $S: $(tr '\n' ' ' < /tmp/out | tr -s ' ' | cut -c1-300)"
}
ok() { run "$@"; [ $S = 0 ] || fail "$*: exit $S"; }
conflict() {   # CMD...: must fail with Reservation Conflict (SC 83h)
  run "$@"
  [ $S != 0 ] && grep -qi 'reservation.conflict\|0x83)\|0x4083' /tmp/out || fail "$*: not a reservation conflict: exit $S"
}
# report: the raw Reservation Report (EDS) in /tmp/rr.bin; RTYPE, REGCTL and the first holder's host id byte
report() {
  nvme io-passthru $NS --opcode=0x0e --namespace-id=1 --cdw10=$((4096 / 4 - 1)) --cdw11=1 --data-len=4096 \
    --read --raw-binary > /tmp/rr.bin 2> /tmp/rr.err || { echo "error"; return; }
  echo "$(le /tmp/rr.bin 4 1) $(le /tmp/rr.bin 5 2)"
}
mailbox() { dd if=$NS bs=4096 skip="$1" count=1 iflag=direct 2>/dev/null | tr -d '\000'; }
post() { printf '%s' "$2" | dd of=$NS bs=4096 seek="$1" count=1 conv=sync oflag=direct 2>/dev/null; }
wait_for() {   # WHAT TEST: until the shell test TEST holds, 300 s at most
  _what=$1 _i=0
  until eval "$2"; do
    [ $_i -ge 600 ] && die "waited 300 s for $_what"
    sleep 0.5; _i=$((_i + 1))
  done
  log "after ~$((_i / 2)) s: $_what"
}
A_BOX=256 B_BOX=512
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
write() { nvme write $NS -s 0 -c 0 -z 4096 -d /tmp/blk; }
read_() { nvme read $NS -s 0 -c 0 -z 4096 -d /tmp/back; }
case $ROLE in a) L=A ;; b) L=B ;; *) die "rig.role=$ROLE" ;; esac
printf '%s%s%s%s%s%s%s%s' $L $L $L $L $L $L $L $L > /tmp/hid
ok nvme set-feature $C -f 0x81 --value=0 -l 8 -d /tmp/hid
log "host $L on cntlid $(cat /sys/class/nvme/nvme0/cntlid)"

case $ROLE in
a)
  ok nvme resv-register $NS --nrkey=0xa1 --rrega=0
  ok nvme resv-acquire $NS --crkey=0xa1 --rtype=1 --racqa=0
  post $A_BOX A-HOLDS || fail "mailbox A-HOLDS"
  wait_for "B registered" '[ "$(report)" = "1 2" ]'
  ok nvme resv-release $NS --crkey=0xa1 --rtype=1 --rrela=0
  wait_for "B wrote" '[ "$(mailbox $B_BOX)" = B-WROTE ]'
  ok nvme resv-acquire $NS --crkey=0xa1 --rtype=1 --racqa=0
  fio --name=busy --filename=$NS --rw=randwrite --bs=256k --iodepth=32 --ioengine=libaio --direct=1 \
    --offset=8M --size=64M --time_based --runtime=200 > /tmp/fio.out 2>&1 &
  fpid=$!
  sleep 5
  kill -0 $fpid 2>/dev/null || fail "fio is not running: $(tr '\n' ' ' < /tmp/fio.out | cut -c1-300)"
  post $A_BOX A-BUSY || fail "mailbox A-BUSY"
  log "fio running, mailbox A-BUSY"
  wait $fpid; frc=$?
  log "fio exit $frc: $(grep -iE 'error|err=' /tmp/fio.out | head -3 | tr '\n' ' ' | cut -c1-300)"
  [ $frc != 0 ] || fail "fio ended without an error: the preempt and abort did not stop it"
  got=$(report)
  [ "$got" = "1 1" ] || fail "report after the preempt: rtype/regctl $got, expected 1 1"
  [ "$(od -A n -t x1 -j 80 -N 1 /tmp/rr.bin | tr -d ' ')" = 42 ] || fail "the holder is not host B"
  conflict write
  ok read_
  log "what Linux logged: $(nvme_errors | head -4 | tr '\n' ' ' | cut -c1-400)"
  ;;
b)
  wait_for "A holds" '[ "$(mailbox $A_BOX)" = A-HOLDS ]'
  conflict write
  ok read_
  ok nvme resv-register $NS --nrkey=0xb2 --rrega=0
  wait_for "A released" '[ "$(report)" = "0 2" ]'
  ok write
  post $B_BOX B-WROTE || fail "mailbox B-WROTE"
  wait_for "A busy" '[ "$(mailbox $A_BOX)" = A-BUSY ]'
  ok nvme resv-acquire $NS --crkey=0xb2 --prkey=0xa1 --rtype=1 --racqa=2
  got=$(report)
  [ "$got" = "1 1" ] || fail "report after the preempt: rtype/regctl $got, expected 1 1"
  ok write
  ;;
esac
exit $rc
