# shellcheck shell=sh
# vnvme-nvme-cli-reservations.sh - guest test (run-vnvme-tests.sh reservations): Reservation Register,
# Acquire, Release and Report through nvme-cli 2.x, from two hosts. There is one controller: the second
# host is the same controller after a reset with another Host Identifier (Set Features 81h, which the
# guest kernel passes through), so the first host's registration stays with CNTLID FFFFh.
# Server: its own, --ns 64M:file=F. Two boots on two servers over the same file (rig.phase=1, 2).
# Phase 1:
#   * id-ctrl ONCS bit 5; id-ns RESCAP FFh (types 1h-6h, IEKEY, PTPLS on a file namespace), NMIC 0
#   * host A (host id "AAAAAAAA"): report empty; register key a1 with --cptpl=3 (PTPL on: get-feature
#     0x83 is 1); registering another key is a Reservation Conflict; acquire Write Exclusive; report:
#     rtype 1, one registrant (cntlid 1, rcsts 1, rkey a1, host id, ptpls 1); a write works
#   * reset, host B ("BBBBBBBB"): report shows A with cntlid ffff; a write is a Reservation Conflict, a
#     read works; acquire unregistered is a conflict; register b2; acquire is a conflict (A holds it);
#     release (not the holder) succeeds with no effect; preempt A (prkey a1) as Exclusive Access:
#     A is gone, B holds rtype 2; the write works; release with the wrong type is Invalid Field;
#     release; acquire Write Exclusive - Registrants Only, left held for phase 2
# Phase 2 (a new server on the same image: the keys persisted with PTPL):
#   * report: ptpls 1, rtype 3, B with key b2 and cntlid ffff; host C's write is a Reservation Conflict
#     (not a registrant), its read works; reset, host B: the write works; clear (rrela 1): report empty
# Every command is logged as "TEST: $ cmd -> exit N: <its output>".
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
C=/dev/nvme0 NS=/dev/nvme0n1
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
run() {   # CMD...: runs it, logs the command and its output; output in /tmp/out, status in S
  "$@" > /tmp/out 2>&1; S=$?
  log "\$ $* -> exit $S: $(tr '\n' ' ' < /tmp/out | tr -s ' ' | cut -c1-400)"
}
ok() { run "$@"; [ $S = 0 ] || fail "$*: exit $S"; }
conflict() {   # CMD...: must fail with Reservation Conflict (SC 83h)
  run "$@"
  [ $S != 0 ] && grep -qi 'reservation.conflict\|0x83)\|0x4083' /tmp/out || fail "$*: not a reservation conflict: exit $S"
}
invalid() {
  run "$@"
  [ $S != 0 ] && grep -qi 'invalid.field\|0x2)\|0x4002' /tmp/out || fail "$*: not Invalid Field: exit $S"
}
field() { sed -n "s/^ *$1 *: *//p" /tmp/out | head -1; }   # NAME: the first "NAME : value" of /tmp/out
# report RTYPE REGCTL PTPLS: resv-report runs (its exit checked); the fields are read from the raw
# Reservation Report (io-passthru, opcode 0Eh, EDS set: the extended structure with 128-bit host ids, as
# nvme-cli 2.13 asks for it; 2.3 asks for the 64-bit one and prints its fields in another order)
report() {
  run nvme resv-report $NS
  [ $S = 0 ] || { fail "resv-report: exit $S"; return; }
  nvme io-passthru $NS --opcode=0x0e --namespace-id=1 --cdw10=$((4096 / 4 - 1)) --cdw11=1 --data-len=4096 \
    --read --raw-binary > /tmp/rr.bin 2> /tmp/rr.err || { fail "raw reservation report: $(cat /tmp/rr.err)"; return; }
  # bytes 4 RTYPE, 6:5 REGCTL, 9 PTPLS
  got="$(le /tmp/rr.bin 4 1) $(le /tmp/rr.bin 5 2) $(le /tmp/rr.bin 9 1)"
  log "reservation report (raw): rtype/regctl/ptpls $got"
  [ "$got" = "$1 $2 $3" ] || fail "resv-report: rtype/regctl/ptpls $got, expected $1 $2 $3"
}
# entry WANT...: the registrants of the last report, each "cntlid rcsts rkey hostid" in hex: the registrant
# extended data structures from byte 64, 64 bytes each (1:0 CNTLID, 2 RCSTS, 15:8 RKEY, 31:16 HOSTID)
entry() {
  got='' _i=0
  while [ $_i -lt "$(le /tmp/rr.bin 5 2)" ]; do
    _o=$((64 + 64 * _i))
    got="$got $(printf '%x' "$(le /tmp/rr.bin $_o 2)") $(le /tmp/rr.bin $((_o + 2)) 1)"
    got="$got $(printf '%x' "$(le /tmp/rr.bin $((_o + 8)) 6)")"
    got="$got $(od -A n -t x1 -v -j $((_o + 16)) -N 16 /tmp/rr.bin | tr -d ' \n')"
    _i=$((_i + 1))
  done
  got=${got# }
  [ "$got" = "$*" ] || fail "resv-report entries: '$got', expected '$*'"
}
as_host() {   # LETTER: reset (the host id is set once per reset), then that host's 8-byte identifier
  [ "${1}" = first ] || reset_live "reset for host $1"
  printf '%s%s%s%s%s%s%s%s' "$2" "$2" "$2" "$2" "$2" "$2" "$2" "$2" > /tmp/hid
  ok nvme set-feature $C -f 0x81 --value=0 -l 8 -d /tmp/hid
  log "now host $2"
}
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
write() { nvme write $NS -s 0 -c 0 -z 4096 -d /tmp/blk; }
read_() { nvme read $NS -s 0 -c 0 -z 4096 -d /tmp/back; }

case $(cmdline_get phase 1) in
1)
  run nvme id-ctrl $C
  oncs=$(field oncs)
  [ $((oncs & 0x20)) != 0 ] || fail "ONCS $oncs lacks Reservations (bit 5)"
  run nvme id-ns $NS
  [ "$(field rescap) $(field nmic)" = "0xff 0" ] || fail "id-ns rescap/nmic $(field rescap)/$(field nmic), expected 0xff/0"

  as_host first A
  report 0 0 0
  ok nvme resv-register $NS --nrkey=0xa1 --rrega=0 --cptpl=3
  run nvme get-feature $NS -f 0x83 -n 1
  grep -q "Current value:\(0x\)\{0,1\}0*1$" /tmp/out || fail "PTPL not 1 after --cptpl=3"
  conflict nvme resv-register $NS --nrkey=0xb2 --rrega=0
  ok nvme resv-acquire $NS --crkey=0xa1 --rtype=1 --racqa=0
  report 1 1 1
  entry 1 1 a1 41414141414141410000000000000000
  ok write

  as_host next B
  report 1 1 1
  entry ffff 1 a1 41414141414141410000000000000000
  conflict write
  ok read_
  conflict nvme resv-acquire $NS --crkey=0xb2 --rtype=1 --racqa=0
  ok nvme resv-register $NS --nrkey=0xb2 --rrega=0
  conflict nvme resv-acquire $NS --crkey=0xb2 --rtype=1 --racqa=0
  ok nvme resv-release $NS --crkey=0xb2 --rtype=1 --rrela=0
  report 1 2 1
  entry ffff 1 a1 41414141414141410000000000000000 1 0 b2 42424242424242420000000000000000
  ok nvme resv-acquire $NS --crkey=0xb2 --prkey=0xa1 --rtype=2 --racqa=1
  report 2 1 1
  entry 1 1 b2 42424242424242420000000000000000
  ok write
  invalid nvme resv-release $NS --crkey=0xb2 --rtype=1 --rrela=0
  ok nvme resv-release $NS --crkey=0xb2 --rtype=2 --rrela=0
  report 0 1 1
  ok nvme resv-acquire $NS --crkey=0xb2 --rtype=3 --racqa=0
  report 3 1 1
  ;;
2)
  as_host first C
  report 3 1 1
  entry ffff 1 b2 42424242424242420000000000000000
  conflict write
  ok read_
  as_host next B
  ok write
  ok nvme resv-release $NS --crkey=0xb2 --rrela=1
  report 0 0 1
  ;;
esac
[ $rc = 0 ] || exit 1
log "reservations phase $(cmdline_get phase 1) passed"
