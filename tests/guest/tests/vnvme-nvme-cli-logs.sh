# shellcheck shell=sh
# vnvme-nvme-cli-logs.sh - guest test (run-vnvme-tests.sh): the log pages with content of their own,
# read by nvme-cli 2.x. Server: its own, --ns 64M:ram (LBA format 3, 4096+0), freshly started.
#   * id-ctrl LPA bits 3 (telemetry) and 4 (persistent event log), CTRATT bit 4, ENDGIDMAX 1, PELS 1;
#     id-ns ENDGID 1
#   * supported-log-pages lists exactly 00h-05h, 07h-09h, 0Dh
#   * endurance-log --group-id=1 counts exactly the writes made; group 2 is refused
#   * telemetry-log --output-file: the file is (Data Area 3 Last Block + 1) x 512 bytes, the header's
#     LID is 07h, three areas, the generation counts the captures; data area 1 starts with the
#     VNVMETEL signature and counts the host writes the endurance log counted, data area 2's newest
#     error record is the refused group 2 request
#   * persistent-event-log: the default action (0xff, LSP 7Fh: reserved action 11b) is refused; action
#     1 establishes a context, 0 reads it (the power-on event first), 2 releases it; after a sysfs
#     controller reset and an nvme format, the reset's and the format's events are there, in order
#   * controller-initiated telemetry: none at first; then the driver is unbound, CC written by hand
#     (devmem) with AQA = 0 so the controller refuses the enable with CSTS.CFS, the driver bound
#     again: telemetry-log --controller-init saves the capture (Data Available 1, reason "enable
#     refused: AQA..."), reading it released it (Data Available 0 after). While no data is
#     available nvme-cli 2.13 needs --rae: without it, it writes a freed buffer of unset size to the
#     file ("write failed with error : Bad address")
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }
u8_at() { od -A n -t u1 -j "$2" -N 1 "$1" | tr -d ' '; }     # FILE OFFSET
u16_at() { od -A n -t u2 -j "$2" -N 2 "$1" | tr -d ' '; }
run() {   # CMD...: runs it, logs the command and its first output line; its output in /tmp/out
  "$@" > /tmp/out 2>&1; _s=$?
  log "\$ $* -> exit $_s: $(head -1 /tmp/out)"
  return $_s
}
wait_live() {
  _i=0
  while [ "$(cat /sys/class/nvme/nvme0/state 2>/dev/null)" != live ]; do
    [ $_i -ge 300 ] && { fail "nvme0 not live 30 s after $1"; return 1; }
    sleep 0.1; _i=$((_i + 1))
  done
}

# --- Identify ---
nvme id-ctrl /dev/nvme0 > /tmp/id-ctrl || die "id-ctrl"
lpa=$(field lpa /tmp/id-ctrl); ctratt=$(field ctratt /tmp/id-ctrl)
endgidmax=$(field endgidmax /tmp/id-ctrl); pels=$(field pels /tmp/id-ctrl)
log "id-ctrl: lpa $lpa ctratt $ctratt endgidmax $endgidmax pels $pels"
[ $((lpa & 0x18)) = $((0x18)) ] || fail "LPA $lpa: telemetry (bit 3) and persistent event log (bit 4) expected"
[ $((ctratt & 0x10)) = $((0x10)) ] || fail "CTRATT $ctratt: endurance groups (bit 4) expected"
[ "$endgidmax" = 1 ] || fail "ENDGIDMAX $endgidmax"
[ "$pels" = 1 ] || fail "PELS $pels"
nvme id-ns /dev/nvme0n1 > /tmp/id-ns || die "id-ns"
[ "$(field endgid /tmp/id-ns)" = 1 ] || fail "id-ns ENDGID $(field endgid /tmp/id-ns)"

# --- Supported Log Pages ---
# from the raw page (LIDS n at 4n, bit 0 LSUPP): nvme-cli 2.3 prints no list, 2.13 one line per LID
run nvme supported-log-pages /dev/nvme0 || fail "supported-log-pages"
log_raw /tmp/slp.bin 0 1024 || fail "get-log 00h: $(cat /tmp/log_raw.err)"
lids=$(od -A n -t u4 -v /tmp/slp.bin | awk '{ for (i = 1; i <= NF; i++) { if ($i % 2) printf (n ? "%#x " : "0 "), n; n++ } }')
log "supported-log-pages: $lids"
[ "$lids" = "0 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8 0x9 0xc 0xd 0x80 0x81 0xbf " ] || fail "supported log pages: '$lids'"

# --- Endurance Group Information ---
endurance_writes() {   # host_write_cmds of group 1 (empty if the log could not be read)
  nvme endurance-log /dev/nvme0 --group-id=1 > /tmp/eg 2>&1 && field host_write_cmds /tmp/eg | tr -d ',.'
}
w0=$(endurance_writes)
dd if=/dev/urandom of=/dev/nvme0n1 bs=4k count=16 oflag=direct 2>/dev/null || fail "dd write"
w1=$(endurance_writes)
log "endurance-log --group-id=1: host_write_cmds $w0 -> $w1, $(grep -E '^data_units_written' /tmp/eg | tr -s ' \t' ' ')"
[ -n "$w0" ] && [ -n "$w1" ] || fail "endurance-log: $(cat /tmp/eg)"
[ $((w1 - w0)) = 16 ] || fail "host_write_cmds grew by $((w1 - w0)) for 16 writes"
# Refused, and the newest error record, which the telemetry below must carry.
if run nvme endurance-log /dev/nvme0 --group-id=2; then fail "endurance group 2 answered"; fi
grep -qi 'invalid field' /tmp/out || fail "group 2: $(cat /tmp/out)"

# --- Telemetry Host-Initiated ---
telemetry() {   # FILE GENERATION: saves a new host-initiated capture and checks it
  run nvme telemetry-log /dev/nvme0 --output-file="$1" || { fail "telemetry-log: $(cat /tmp/out)"; return; }
  size=$(stat -c %s "$1"); lb1=$(u16_at "$1" 8); lb2=$(u16_at "$1" 10); lb3=$(u16_at "$1" 12)
  log "telemetry $1: $size bytes, LID $(u8_at "$1" 0), last blocks $lb1 $lb2 $lb3, generation $(u8_at "$1" 381)"
  [ "$(u8_at "$1" 0)" = 7 ] || fail "telemetry LID $(u8_at "$1" 0)"
  [ "$size" = $(((lb3 + 1) * 512)) ] || fail "telemetry file $size bytes, data area 3 last block $lb3"
  [ "$lb1" -ge 1 ] && [ "$lb2" -gt "$lb1" ] && [ "$lb3" -gt "$lb2" ] || fail "last blocks $lb1 $lb2 $lb3: three areas expected"
  [ "$(u8_at "$1" 381)" = "$2" ] || fail "host generation $(u8_at "$1" 381), expected $2"
  [ "$(dd if="$1" bs=1 skip=384 count=14 2>/dev/null)" = host-initiated ] || fail "reason identifier"
}
telemetry /tmp/t.bin 1
# Data area 1: signature, then counters (host_write_commands is the 21st, low dword at 512 + 24 + 20 x 8);
# data area 2: the newest error record's status (byte 12) is group 2's Invalid Field, DNR (4002h << 1).
[ "$(dd if=/tmp/t.bin bs=1 skip=512 count=8 2>/dev/null)" = VNVMETEL ] || fail "no VNVMETEL signature in data area 1"
twc=$(od -A n -t u4 -j $((512 + 24 + 20 * 8)) -N 4 /tmp/t.bin | tr -d ' ')
err=$(u16_at /tmp/t.bin $((512 * (lb1 + 1) + 12)))
log "telemetry content: host_write_commands $twc, newest error status $(printf %#x "$err")"
[ "$twc" = "$w1" ] || fail "telemetry host_write_commands $twc, endurance log $w1"
[ "$err" = $((0x4002 << 1)) ] || fail "newest error record status $err"
telemetry /tmp/t2.bin 2

# --- Persistent Event Log ---
if run nvme persistent-event-log /dev/nvme0; then fail "the reserved default action was accepted"; fi
grep -qi 'invalid field' /tmp/out || fail "default action: $(cat /tmp/out)"
pel() {   # reads the log through a context into /tmp/pel (all events: log_len past TLL, see below)
  run nvme persistent-event-log /dev/nvme0 --action=1 || { fail "establish: $(cat /tmp/out)"; return; }
  grep -q 'Establishing Persistent Event Log Context' /tmp/out || fail "establish: $(cat /tmp/out)"
  run nvme persistent-event-log /dev/nvme0 --action=0 || fail "read: $(cat /tmp/out)"
  tnev=$(field 'Total Number of Events' /tmp/out); tll=$(field 'Total Log Length' /tmp/out)
  shown=$(grep -c '^Event Number' /tmp/out)
  # nvme-cli 2.13 stops before an event that ends exactly at the buffer's end (">= size"), so with
  # log_len = TLL it never shows the last event; 4 bytes more (read as zeroes) show them all.
  [ "$shown" = "$tnev" ] || [ "$shown" = $((tnev - 1)) ] || fail "$shown events shown of $tnev"
  run nvme persistent-event-log /dev/nvme0 --action=0 --log_len=$((tll + 4)) || fail "read all: $(cat /tmp/out)"
  cp /tmp/out /tmp/pel
  [ "$(grep -c '^Event Number' /tmp/pel)" = "$tnev" ] || fail "$(grep -c '^Event Number' /tmp/pel) events of $tnev"
  run nvme persistent-event-log /dev/nvme0 --action=2 || fail "release: $(cat /tmp/out)"
  sed -n 's/^Event Type: \(.*\)(0x.*/\1/p' /tmp/pel | tr '\n' ';' > /tmp/pel.types
  log "persistent-event-log: $tnev events, $tll bytes, LHL $(field 'Log Header Length' /tmp/pel), revision $(field 'Log Revision' /tmp/pel): $(cat /tmp/pel.types)"
}
pel
cp /tmp/pel.types /tmp/pel0.types
grep -q '^Log Identifier: 13$' /tmp/pel || fail "PEL log identifier"
grep -q '^Serial Number (SN): VNVME' /tmp/pel || fail "PEL serial number"
[ "$(cut -d';' -f1 /tmp/pel0.types)" = "Power-on or Reset Event" ] || fail "first event: $(cut -d';' -f1 /tmp/pel0.types)"
# nvme-cli 2.3 names it "Set Telemetry CRT  Event" (two spaces)
[ "$(grep -o 'Set Telemetry CRT *Event' /tmp/pel0.types | wc -l)" = 2 ] || fail "two telemetry create events expected"
resets0=$(grep -o 'Power-on or Reset Event' /tmp/pel0.types | wc -l)
log "sysfs reset_controller"
echo 1 > /sys/class/nvme/nvme0/reset_controller || fail "sysfs reset_controller"
wait_live "reset_controller"
run nvme format /dev/nvme0n1 --lbaf=3 --force || fail "format: $(cat /tmp/out)"
pel
resets1=$(grep -o 'Power-on or Reset Event' /tmp/pel.types | wc -l)
[ "$resets1" = $((resets0 + 1)) ] || fail "reset events $resets0 -> $resets1 after one controller reset"
case "$(cat /tmp/pel.types)" in
  *"Power-on or Reset Event;Format NVM Start Event;Format NVM Completion Event;") ;;
  *) fail "the log does not end with the reset, then the format: $(cat /tmp/pel.types)" ;;
esac
grep -A1 '^Format NVM Completion Event Entry' /tmp/pel | grep -q '^Namespace Identifier: 1$' || fail "format completion NSID"

# --- Telemetry Controller-Initiated ---
# ctel_empty FILE: the controller-initiated header while no data is available, without a trap for the host:
# nvme-cli's telemetry-log --rae where it has it (2.13), else the raw header (get-log 08h --rae: nvme-cli
# 2.3 has no --rae there, and the header is what is checked)
if nvme telemetry-log --help 2>&1 | grep -q -- '--rae'; then TEL_RAE=1; else TEL_RAE=0; fi
ctel_empty() {
  if [ $TEL_RAE = 1 ]; then
    run nvme telemetry-log /dev/nvme0 --controller-init --rae --output-file="$1" || fail "controller telemetry: $(cat /tmp/out)"
  else
    log "nvme-cli $(nvme version | head -1 | cut -d' ' -f3) has no telemetry-log --rae: the header through get-log 08h --rae"
    log_raw "$1" 8 512 --rae || fail "get-log 08h: $(cat /tmp/log_raw.err)"
  fi
}
ctel_empty /tmp/c0.bin
[ $TEL_RAE = 0 ] || grep -q 'Not Available' /tmp/out || fail "controller-initiated data before any failure"
[ "$(u8_at /tmp/c0.bin 0)" = 8 ] && [ "$(u8_at /tmp/c0.bin 382)" = 0 ] || fail "empty controller-initiated header"
bdf=$(basename "$(readlink /sys/class/nvme/nvme0/device)")
bar0=$(head -1 "/sys/bus/pci/devices/$bdf/resource" | cut -d' ' -f1)
log "provoking CSTS.CFS: unbind $bdf, BAR0 $bar0: CC = 0, AQA = 0, CC.EN = 1"
timeout 30 sh -c "echo $bdf > /sys/bus/pci/drivers/nvme/unbind" || fail "unbind"
timeout 10 devmem $((bar0 + 0x14)) 32 0 && timeout 10 devmem $((bar0 + 0x24)) 32 0 \
  && timeout 10 devmem $((bar0 + 0x14)) 32 0x00460001 || fail "devmem writes to BAR0"
csts=$(timeout 10 devmem $((bar0 + 0x1c)) 32)
log "CSTS after the refused enable: $csts"
[ $((csts & 2)) = 2 ] || fail "CSTS.CFS not set: $csts"
timeout 60 sh -c "echo $bdf > /sys/bus/pci/drivers/nvme/bind" || fail "bind"
wait_nvme 20 || fail "no /dev/nvme0n1 after bind"
wait_live "bind"
run nvme telemetry-log /dev/nvme0 --controller-init --output-file=/tmp/c1.bin || fail "controller telemetry: $(cat /tmp/out)"
size=$(stat -c %s /tmp/c1.bin); lb3=$(u16_at /tmp/c1.bin 12)
reason=$(dd if=/tmp/c1.bin bs=1 skip=384 count=128 2>/dev/null | tr -d '\0')
log "controller telemetry: $size bytes, available $(u8_at /tmp/c1.bin 382), generation $(u8_at /tmp/c1.bin 383), reason '$reason'"
[ "$(u8_at /tmp/c1.bin 0)" = 8 ] || fail "controller telemetry LID"
[ "$(u8_at /tmp/c1.bin 382)" = 1 ] && [ "$(u8_at /tmp/c1.bin 383)" = 1 ] || fail "controller data not available"
[ "$size" = $(((lb3 + 1) * 512)) ] || fail "controller telemetry $size bytes, last block $lb3"
case "$reason" in "enable refused: AQA"*) ;; *) fail "reason '$reason'" ;; esac
if [ $TEL_RAE = 0 ]; then
  # nvme-cli 2.3 reads log 08h with RAE set, always (nvme_get_ctrl_telemetry(fd, true, ...)): the data stays
  # available, as it should. The host releases it as 2.13 does without --rae: a read with RAE cleared.
  log "nvme-cli 2.3's telemetry-log keeps RAE set: get-log 08h without --rae releases the data"
  log_raw /tmp/c1r.bin 8 512 || fail "get-log 08h: $(cat /tmp/log_raw.err)"
  [ "$(u8_at /tmp/c1r.bin 382)" = 1 ] || fail "controller data not available at the releasing read"
fi
ctel_empty /tmp/c2.bin
[ "$(u8_at /tmp/c2.bin 382)" = 0 ] && [ "$(u8_at /tmp/c2.bin 383)" = 1 ] || fail "reading did not release the data"
pel
resets2=$(grep -o 'Power-on or Reset Event' /tmp/pel.types | wc -l)
# CC.EN 1 -> 0 by hand resets the controller left ready by the driver's shutdown; the disable at
# bind follows the refused enable, the controller was never ready: a reset of nothing, not recorded.
[ "$resets2" = $((resets1 + 1)) ] || fail "reset events $resets1 -> $resets2 across unbind / CFS / bind"

sed 's/^/  pel: /' /tmp/pel
result_json "{\"name\":\"nvme-cli-logs\",\"ok\":$((1 - rc))}"
exit $rc
