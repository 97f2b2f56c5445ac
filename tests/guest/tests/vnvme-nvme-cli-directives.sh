# shellcheck shell=sh
# vnvme-nvme-cli-directives.sh - guest test (run-vnvme-tests.sh directives): the Identify and Streams
# directives through nvme-cli 2.x. Server: its own, --ns 64M:ram, freshly started.
#   * id-ctrl OACS bit 5 (Directives)
#   * dir-receive -D 0 -O 1: Identify supported 03h (Identify, Streams), enabled 01h
#   * dir-receive -D 1 before streams are enabled: refused with Invalid Field (2h)
#   * dir-send -D 0 -O 1 -T 1 -e 1 enables streams: enabled 03h; stream parameters MSL 16, NSA 0
#   * dir-receive -D 1 -O 3 -r 4 allocates 4 (NAR 4; NSA 4, NSSA 12)
#   * nvme write --dir-type=1 --dir-spec=2: done, the data reads back; dir-receive -D 1 -O 2 lists
#     stream 2 open; a write to stream 5 (beyond the 4 allocated) is refused with Invalid Field
#   * dir-send -D 1 -O 1 -S 2 (release identifier) closes it; -D 1 -O 2 (release resources) gives NSA 0
# Every command is logged as "TEST: $ cmd -> exit N: <its output>".
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
dev=/dev/nvme0n1
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
u8_at() { od -A n -t u1 -j "$2" -N 1 "$1" | tr -d ' '; }     # FILE OFFSET
u16_at() { od -A n -t u2 -j "$2" -N 2 "$1" | tr -d ' '; }
run() {   # CMD...: runs it, logs the command and its output; output in /tmp/out, status in S
  "$@" > /tmp/out 2>&1; S=$?
  log "\$ $* -> exit $S: $(tr '\n' ' ' < /tmp/out | tr -s ' ' | cut -c1-300)"
}
# binary OUT ARGS...: dir-receive with raw binary output into OUT
binary() { out=$1; shift; nvme dir-receive "$dev" "$@" -b > "$out" 2>/tmp/err; S=$?; log "\$ nvme dir-receive $dev $* -b -> exit $S, $(wc -c < "$out") bytes"; }

run nvme id-ctrl "$dev"
oacs=$(grep -E '^oacs[[:space:]]*:' /tmp/out | sed 's/^[^:]*: *//')
[ $((oacs & 0x20)) != 0 ] || fail "OACS $oacs lacks Directives (bit 5)"

run nvme dir-receive "$dev" -D 0 -O 1 -H
[ $S = 0 ] || fail "identify return parameters: exit $S"
binary /tmp/id -D 0 -O 1
[ "$(u8_at /tmp/id 0) $(u8_at /tmp/id 32)" = "3 1" ] || fail "identify: supported/enabled $(u8_at /tmp/id 0)/$(u8_at /tmp/id 32), expected 3/1"

run nvme dir-receive "$dev" -D 1 -O 1 -H
[ $S != 0 ] && grep -qi 'invalid field\|0x2)\|0x4002' /tmp/out || fail "stream parameters before enable: exit $S"

run nvme dir-send "$dev" -D 0 -O 1 -T 1 -e 1
[ $S = 0 ] || fail "enable streams: exit $S"
binary /tmp/id -D 0 -O 1
[ "$(u8_at /tmp/id 32)" = 3 ] || fail "identify after enable: enabled $(u8_at /tmp/id 32), expected 3"
run nvme dir-receive "$dev" -D 1 -O 1 -H
[ $S = 0 ] || fail "stream parameters: exit $S"
binary /tmp/sp -D 1 -O 1
[ "$(u16_at /tmp/sp 0) $(u16_at /tmp/sp 22)" = "16 0" ] || fail "MSL/NSA $(u16_at /tmp/sp 0)/$(u16_at /tmp/sp 22), expected 16/0"

run nvme dir-receive "$dev" -D 1 -O 3 -r 4
[ $S = 0 ] || fail "allocate resources: exit $S"
binary /tmp/sp -D 1 -O 1
[ "$(u16_at /tmp/sp 2) $(u16_at /tmp/sp 22)" = "12 4" ] || fail "after allocate: NSSA/NSA $(u16_at /tmp/sp 2)/$(u16_at /tmp/sp 22), expected 12/4"

bs=$(blockdev --getss "$dev")
dd if=/dev/urandom of=/tmp/pat bs=4096 count=1 2>/dev/null
run nvme write "$dev" --start-block=8 --block-count=$((4096 / bs - 1)) --data-size=4096 --data=/tmp/pat --dir-type=1 --dir-spec=2
[ $S = 0 ] || fail "write to stream 2: exit $S"
dd if="$dev" of=/tmp/got bs=4096 skip=$((8 * bs / 4096)) count=1 iflag=direct 2>/dev/null
cmp -s /tmp/pat /tmp/got || fail "stream 2's write does not read back"
run nvme dir-receive "$dev" -D 1 -O 2 -H
binary /tmp/st -D 1 -O 2
[ "$(u16_at /tmp/st 0) $(u16_at /tmp/st 2)" = "1 2" ] || fail "status: OSC/first id $(u16_at /tmp/st 0)/$(u16_at /tmp/st 2), expected 1/2"
run nvme write "$dev" --start-block=8 --block-count=$((4096 / bs - 1)) --data-size=4096 --data=/tmp/pat --dir-type=1 --dir-spec=5
[ $S != 0 ] || fail "write to stream 5 beyond the 4 allocated succeeded"

run nvme dir-send "$dev" -D 1 -O 1 -S 2
[ $S = 0 ] || fail "release identifier: exit $S"
binary /tmp/st -D 1 -O 2
[ "$(u16_at /tmp/st 0)" = 0 ] || fail "status after release identifier: OSC $(u16_at /tmp/st 0)"
run nvme dir-send "$dev" -D 1 -O 2
[ $S = 0 ] || fail "release resources: exit $S"
binary /tmp/sp -D 1 -O 1
[ "$(u16_at /tmp/sp 2) $(u16_at /tmp/sp 22)" = "16 0" ] || fail "after release: NSSA/NSA $(u16_at /tmp/sp 2)/$(u16_at /tmp/sp 22)"

unexpected=$(nvme_errors | grep -viE 'I/O error, dev|Buffer I/O error')
if [ -n "$unexpected" ]; then echo "TEST: nvme errors in dmesg:"; echo "$unexpected" | sed 's/^/  /'; rc=1; fi
result_json "{\"name\":\"directives\",\"ok\":$((1 - rc))}"
exit $rc
