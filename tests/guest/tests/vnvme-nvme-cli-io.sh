# shellcheck shell=sh
# vnvme-nvme-cli-io.sh - guest test (run-vnvme-tests.sh nvm-io): the NVM commands nvme-cli sends besides
# read and write, on every namespace given (rig.devs=nvme0n1,nvme0n2; the server: a RAM and a file namespace).
#   * id-ctrl ONCS has Write Uncorrectable (bit 1), Verify (7) and Copy (8), OCFS = 1; id-ns MSSRL, MCL > 0
#   * 16 blocks of a random pattern written with dd; `nvme verify` of them succeeds
#   * `nvme write-uncor` of block 5: `nvme verify` fails with Unrecovered Read Error (281h), a direct dd read
#     of block 5 fails and of block 4 does not; dd writing block 5 again clears it (verify, read back equal)
#   * `nvme write-uncor` then `nvme write-zeroes` of blocks 20-21: verify succeeds, they read zeroes;
#     `nvme dsm --idr` (a hint) leaves a block uncorrectable, `nvme dsm --ad` (deallocate) clears it
#   * `nvme copy` of blocks 0-3 and 8-11 to block 100: read back equal (cmp); a copy onto its own source's
#     blocks writes the source as it was; a copy from an uncorrectable block fails (281h); a range of
#     MSSRL + 1 blocks fails with Command Size Limit Exceeded (183h); past the end with LBA Out of Range (80h)
#   * no nvme timeouts, resets or aborts in dmesg (the medium errors of the reads meant to fail aside)
# Every nvme-cli command is logged as "TEST: nvme ...: exit N: <its output>".
. /guest-lib.sh
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }

# blocks DEV FIRST COUNT OUT: a direct read of COUNT blocks at FIRST into OUT; its status
blocks() { dd if="$1" of="$4" bs="$BS" skip="$2" count="$3" iflag=direct 2>/tmp/dd.err; }

check_dev() {   # DEV
  dev=/dev/$1
  wait_nvme 15 "$dev" || { fail "$dev did not appear"; return; }
  BS=$(blockdev --getss "$dev")
  log "$dev: logical block size $BS, $(blockdev --getsize64 "$dev") bytes"

  expect_ok id-ctrl "$dev"
  echo "$OUT" > /tmp/id-ctrl
  oncs=$(field oncs /tmp/id-ctrl); ocfs=$(field ocfs /tmp/id-ctrl)
  [ $((oncs & 0x182)) = $((0x182)) ] || fail "$dev: ONCS $oncs lacks Write Uncorrectable, Verify or Copy"
  [ "$((ocfs))" = 1 ] || fail "$dev: OCFS '$ocfs', expected 0x1"
  expect_ok id-ns "$dev"
  echo "$OUT" > /tmp/id-ns
  nsze=$(($(field nsze /tmp/id-ns))); mssrl=$(field mssrl /tmp/id-ns); mcl=$(field mcl /tmp/id-ns)
  log "$dev: oncs $oncs ocfs $ocfs nsze $nsze mssrl $mssrl mcl $mcl msrc $(field msrc /tmp/id-ns)"
  [ "${mssrl:-0}" -gt 0 ] && [ "${mcl:-0}" -ge "${mssrl:-0}" ] || fail "$dev: MSSRL '$mssrl', MCL '$mcl'"

  # 16 blocks of a pattern, verified
  dd if=/dev/urandom of=/tmp/pat bs="$BS" count=16 2>/dev/null
  dd if=/tmp/pat of="$dev" bs="$BS" count=16 oflag=direct 2>/dev/null || fail "$dev: dd write of the pattern"
  expect_ok verify "$dev" --start-block=0 --block-count=15
  expect_sc 80 verify "$dev" --start-block=$((nsze - 1)) --block-count=1

  # block 5 uncorrectable until written
  expect_ok write-uncor "$dev" --start-block=5 --block-count=0
  expect_sc 281 verify "$dev" --start-block=0 --block-count=15
  if blocks "$dev" 5 1 /tmp/b5; then fail "$dev: dd read of uncorrectable block 5 succeeded"
  else log "$dev: dd read of block 5: $(tr '\n' ' ' < /tmp/dd.err)"; fi
  blocks "$dev" 4 1 /tmp/b4 || fail "$dev: dd read of block 4 next to it: $(cat /tmp/dd.err)"
  dd if=/tmp/pat of="$dev" bs="$BS" skip=5 seek=5 count=1 oflag=direct 2>/dev/null || fail "$dev: dd write of block 5"
  expect_ok verify "$dev" --start-block=0 --block-count=15
  blocks "$dev" 0 16 /tmp/back || fail "$dev: dd read after rewriting block 5: $(cat /tmp/dd.err)"
  cmp /tmp/pat /tmp/back || fail "$dev: blocks 0-15 differ from the pattern"

  # Write Zeroes clears it too
  expect_ok write-uncor "$dev" --start-block=20 --block-count=1
  expect_sc 281 verify "$dev" --start-block=21 --block-count=0
  expect_ok write-zeroes "$dev" --start-block=20 --block-count=1
  expect_ok verify "$dev" --start-block=20 --block-count=1
  dd if=/dev/zero of=/tmp/zero bs="$BS" count=2 2>/dev/null
  blocks "$dev" 20 2 /tmp/z && cmp /tmp/zero /tmp/z || fail "$dev: blocks 20-21 after write-zeroes are not zeroes"

  # Copy: two ranges to block 100
  expect_ok copy "$dev" --sdlba=100 --slbs=0,8 --blocks=3,3
  { dd if=/tmp/pat bs="$BS" count=4; dd if=/tmp/pat bs="$BS" skip=8 count=4; } > /tmp/want 2>/dev/null
  blocks "$dev" 100 8 /tmp/got && cmp /tmp/want /tmp/got || fail "$dev: blocks 100-107 are not blocks 0-3 and 8-11"
  # onto its own source: blocks 0-7 to 2-9
  expect_ok copy "$dev" --sdlba=2 --slbs=0 --blocks=7
  { dd if=/tmp/pat bs="$BS" count=2; dd if=/tmp/pat bs="$BS" count=8; dd if=/tmp/pat bs="$BS" skip=10 count=6; } > /tmp/want 2>/dev/null
  blocks "$dev" 0 16 /tmp/got && cmp /tmp/want /tmp/got || fail "$dev: overlapping copy: blocks 0-15 wrong"
  # from an uncorrectable block; too long a range; past the end
  expect_ok write-uncor "$dev" --start-block=30 --block-count=0
  expect_sc 281 copy "$dev" --sdlba=200 --slbs=29 --blocks=1
  blocks "$dev" 200 2 /tmp/got && cmp /tmp/zero /tmp/got || fail "$dev: a failed copy wrote blocks 200-201"
  expect_sc 183 copy "$dev" --sdlba=1000 --slbs=0 --blocks="$mssrl"
  expect_sc 80 copy "$dev" --sdlba=$((nsze - 1)) --slbs=0 --blocks=1

  # Dataset Management: a hint leaves block 30 uncorrectable, deallocation clears it (reads zeroes)
  expect_ok dsm "$dev" --idr --slbs=30 --blocks=1
  expect_sc 281 verify "$dev" --start-block=30 --block-count=0
  expect_ok dsm "$dev" --ad --slbs=30 --blocks=1
  expect_ok verify "$dev" --start-block=30 --block-count=0
  blocks "$dev" 30 2 /tmp/got && cmp /tmp/zero /tmp/got || fail "$dev: blocks 30-31 after deallocation are not zeroes"
}

for d in $(cmdline_get devs nvme0n1 | tr ',' ' '); do check_dev "$d"; done
expected=$(dmesg | grep -ciE 'critical medium error|sc 0x81')
log "dmesg: $expected lines of the expected medium errors"
unexpected=$(nvme_errors | grep -viE 'critical medium error|sc 0x81|Buffer I/O error|I/O error, dev')
if [ -n "$unexpected" ]; then echo "TEST: nvme errors in dmesg:"; echo "$unexpected" | sed 's/^/  /'; rc=1; fi
result_json "{\"name\":\"nvm-io\",\"ok\":$((1 - rc))}"
exit $rc
