# shellcheck shell=sh
# vnvme-nvme-cli-admin.sh - guest test (run-vnvme-tests.sh nvme-cli-admin): the admin commands of
# issue 17 items 1, 2 and 4 as nvme-cli 2.x runs them, each answer checked for content: the I/O
# command set Identify structures, SR-IOV visibility, features with a data buffer, the Select field;
# and issue 37 item 4: primary-ctrl-caps without -c, the Volatile Write Cache feature and Security
# Send/Receive refused as the specification says when absent.
#   rig.vqprt=N rig.viprt=N   the server's I/O queues + 1 and MSI-X vectors (Primary Controller Caps)
# The guest kernel refuses Set Features for Keep Alive Timer and Host Behavior Support from user
# space (EACCES before any command is sent): those are read here, and set in the controller tests.
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
VQPRT=$(cmdline_get vqprt); VIPRT=$(cmdline_get viprt)
C=/dev/nvme0 NS=/dev/nvme0n1
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
# "name : value" lines of nvme-cli's text output, value trimmed
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/[[:space:]]*$//'; }
# nvme ARGS...: runs nvme-cli into /tmp/out, logs the command and its status; returns its status
nv() {
  nvme "$@" > /tmp/out 2>&1; _s=$?
  log "nvme $* -> exit $_s$( [ $_s = 0 ] || echo ": $(tail -1 /tmp/out)")"
  return $_s
}
# expect_status TEXT ARGS...: the command fails and nvme-cli names TEXT as the NVMe status
expect_status() {
  _want=$1; shift
  if nv "$@"; then fail "nvme $* succeeded, expected '$_want'"
  elif ! grep -q "$_want" /tmp/out; then fail "nvme $*: expected '$_want', got: $(cat /tmp/out)"; fi
}
timestamp() { sed -n 's/.*The timestamp is : \([0-9]*\).*/\1/p' /tmp/out; }
# the bytes of nvme-cli's hex dump in /tmp/out, "xx " each
hexdump_bytes() { sed -n 's/^[0-9a-f]\{4\}: \(\([0-9a-f][0-9a-f] \)*\).*/\1/p' /tmp/out | tr -d '\n'; }

# --- Identify Controller: what the new commands and features rest on ---
nv id-ctrl $C && cp /tmp/out /tmp/id-ctrl || die "id-ctrl failed"
cntlid=$(field cntlid /tmp/id-ctrl); kas=$(field kas /tmp/id-ctrl)
ctratt=$(field ctratt /tmp/id-ctrl); oncs=$(field oncs /tmp/id-ctrl)
log "id-ctrl: cntlid=$cntlid kas=$kas ctratt=$ctratt oncs=$oncs"
[ "$kas" = 1 ] || fail "KAS $kas, expected 1 (100 ms)"
[ $((ctratt & 0x8001)) = $((0x8001)) ] || fail "CTRATT $ctratt lacks HIDS (0) or ELBAS (15)"
[ $((oncs & 0x50)) = $((0x50)) ] || fail "ONCS $oncs lacks Save/Select (4) or Timestamp (6)"

# --- CNS 05h: NVM Identify Namespace, one ELBAF per LBA format: 16-bit guards (PIF 0) but formats 6 and 7,
#     whose 64-bit guard is PIF 2; no storage tags. Checked in the raw structure (admin-passthru): nvme-cli
#     2.3 prints pif:0 for every format, 2.13 decodes bits 8:7 ---
nv id-ns $NS && cp /tmp/out /tmp/id-ns || fail "id-ns failed"
nlbaf=$(field nlbaf /tmp/id-ns); flbas=$(field flbas /tmp/id-ns)
nv nvm-id-ns $NS || fail "nvm-id-ns failed: $(cat /tmp/out)"
nsid=$(cat /sys/block/nvme0n1/nsid)
if id_raw /tmp/nvm-id-ns.bin 5 "$nsid" 0; then
  # bytes 7:0 LBSTM, 8 PIC, then ELBAF n at 12 + 4n: bits 6:0 STS, 8:7 PIF (NVM Command Set 1.0 §4.1.5.2)
  n=0 zero=0 wide=0 rest='' elbafs=''
  i=0
  while [ $i -lt 64 ]; do
    e=$(le /tmp/nvm-id-ns.bin $((12 + 4 * i)) 4)
    if [ $i -le $((nlbaf)) ]; then
      n=$((n + 1)); elbafs="$elbafs $i:$(printf '%#x' "$e")"
      [ "$e" = 0 ] && zero=$((zero + 1))
      { [ $i = 6 ] || [ $i = 7 ]; } && [ "$e" = $((2 << 7)) ] && wide=$((wide + 1))
    elif [ "$e" != 0 ]; then rest="$rest $i:$e"
    fi
    i=$((i + 1))
  done
  lbstm=$(le /tmp/nvm-id-ns.bin 0 8); pic=$(le /tmp/nvm-id-ns.bin 8 1)
  log "nvm-id-ns (raw): lbstm=$lbstm pic=$pic elbaf=$n (16b guard, sts 0: $zero; 64b guard, sts 0: $wide):$elbafs; id-ns nlbaf=$nlbaf flbas=$flbas"
  [ "$n" = $((nlbaf + 1)) ] || fail "$n ELBAF entries for NLBAF $nlbaf"
  [ "$zero" = $((n - 2)) ] && [ "$wide" = 2 ] || fail "ELBAF: $zero with a 16-bit guard, $wide (formats 6, 7) with a 64-bit one, of $n:$elbafs"
  [ -z "$rest" ] || fail "ELBAF past NLBAF not zero:$rest"
  [ "$lbstm" = 0 ] && [ "$pic" = 0 ] || fail "LBSTM/PIC not 0"
else fail "Identify CNS 05h through admin-passthru failed: $(cat /tmp/id_raw.err)"; fi

# --- CNS 06h: NVM Identify Controller, no size limits reported ---
if nv nvm-id-ctrl $C; then
  for f in vsl wzsl wusl dmrl dmrsl dmsl; do
    [ "$(field $f /tmp/out)" = 0 ] || fail "nvm-id-ctrl $f = $(field $f /tmp/out)"
  done
else fail "nvm-id-ctrl failed: $(cat /tmp/out)"; fi

# --- CNS 07h/1Ah: the namespace lists per command set; CSI 2 (zoned) lists none on this server ---
nv list-ns $C --csi=0 && grep -q '^\[ *0\]:0x1$' /tmp/out || fail "list-ns --csi=0: $(cat /tmp/out)"
nv list-ns $C --all --csi=0 && grep -q '^\[ *0\]:0x1$' /tmp/out || fail "list-ns --all --csi=0: $(cat /tmp/out)"
if nv list-ns $C --csi=2; then
  grep -q '^\[ *[0-9]*\]:0x' /tmp/out && fail "list-ns --csi=2 lists a zoned namespace: $(cat /tmp/out)"
else fail "list-ns --csi=2 failed: $(cat /tmp/out)"; fi

# --- CNS 08h: I/O Command Set Independent Identify Namespace ---
# the NSID given: nvme-cli 2.3 sends NSID 0 without it (its "nsid = nvme_get_nsid(...)" keeps the return
# code, 0, not the NSID), which the controller rightly answers with Invalid Namespace or Format
if nv cmdset-ind-id-ns $NS --namespace-id="$nsid"; then
  nstat=$(field nstat /tmp/out); nsfeat=$(field nsfeat /tmp/out)
  log "cmdset-ind-id-ns: nstat=$nstat nsfeat=$nsfeat"
  [ "$nstat" = 0x1 ] || fail "NSTAT $nstat, expected ready (0x1)"
  # RAM namespace: bit 5, Volatile Write Cache Not Present (nvme-cli 2.13 labels it "is Present")
  [ "$nsfeat" = 0x20 ] || fail "NSFEAT $nsfeat, expected 0x20 (VWCPN)"
else fail "cmdset-ind-id-ns failed: $(cat /tmp/out)"; fi

# --- CNS 1Ch: one I/O Command Set Combination, the NVM and Zoned Namespace command sets (bits 0, 2) ---
if nv id-iocs $C; then
  grep -q 'Combination\[0\]:5$' /tmp/out || fail "id-iocs: combination 0 is not NVM + ZNS: $(cat /tmp/out)"
  [ "$(grep -c 'Combination\[' /tmp/out)" = 1 ] || fail "id-iocs: more than one combination: $(cat /tmp/out)"
else fail "id-iocs failed: $(cat /tmp/out)"; fi

# --- CNS 17h/18h: an empty UUID list; no Domain List in a single-domain subsystem ---
nv id-uuid $C || fail "id-uuid failed: $(cat /tmp/out)"
grep -qi 'uuid.*:.*[1-9a-f]' /tmp/out && fail "id-uuid lists a UUID: $(cat /tmp/out)"
expect_status "Invalid Field in Command" id-domain $C

# --- CNS 14h/15h: SR-IOV visibility without secondary controllers ---
if nv primary-ctrl-caps $C -c "$cntlid"; then
  cp /tmp/out /tmp/pcc
  log "primary-ctrl-caps: cntlid=$(field cntlid /tmp/pcc) crt=$(field crt /tmp/pcc) vqprt=$(field vqprt /tmp/pcc) viprt=$(field viprt /tmp/pcc) vqfrt=$(field vqfrt /tmp/pcc)"
  [ $(($(field cntlid /tmp/pcc))) = $((cntlid)) ] || fail "primary-ctrl-caps CNTLID"
  [ "$(field crt /tmp/pcc)" = 0 ] || fail "CRT: flexible resources without Virtualization Management"
  [ -z "$VQPRT" ] || [ "$(field vqprt /tmp/pcc)" = "$VQPRT" ] || fail "VQPRT, expected $VQPRT"
  [ -z "$VIPRT" ] || [ "$(field viprt /tmp/pcc)" = "$VIPRT" ] || fail "VIPRT, expected $VIPRT"
  for f in vqfrt vqrfa vqrfap vifrt virfa virfap; do [ "$(field $f /tmp/pcc)" = 0 ] || fail "$f not 0"; done
else fail "primary-ctrl-caps -c $cntlid failed: $(cat /tmp/out)"; fi
# Without -c nvme-cli sends CNTID 0: this controller's capabilities, as QEMU's nvme answers; a CNTID
# that names another controller is refused
if nv primary-ctrl-caps $C; then
  log "primary-ctrl-caps (CNTID 0): cntlid=$(field cntlid /tmp/out) vqprt=$(field vqprt /tmp/out)"
  [ $(($(field cntlid /tmp/out))) = $((cntlid)) ] && [ "$(field vqprt /tmp/out)" = "$(field vqprt /tmp/pcc)" ] \
    || fail "primary-ctrl-caps without -c is not this controller's: $(cat /tmp/out)"
else fail "primary-ctrl-caps without -c failed: $(cat /tmp/out)"; fi
expect_status "Invalid Field in Command" primary-ctrl-caps $C -c $((cntlid + 1))
nv list-secondary $C && grep -q 'NUMID.*: 0$' /tmp/out || fail "list-secondary: $(cat /tmp/out)"

# --- Volatile Write Cache (06h) on a controller without one (VWC bit 0 clear: a RAM namespace): Get and
#     Set Features abort with Invalid Field in Command, as the NVMe Base specification requires (QEMU's
#     nvme always reports a cache, so it answers) ---
vwc=$(field vwc /tmp/id-ctrl)
log "id-ctrl: vwc=$vwc"
[ $((vwc & 1)) = 0 ] || fail "VWC $vwc says a volatile write cache is present on a RAM namespace"
expect_status "Invalid Field in Command" get-feature $C -f 6
expect_status "Invalid Field in Command" get-feature $C -f 6 -s 3
expect_status "Invalid Field in Command" set-feature $C -f 6 --value=0

# --- Security Send/Receive: not supported (OACS bit 0 clear, no CSUPP in the effects log), so Invalid
#     Command Opcode, the status for a command the controller does not implement ---
[ $((oacs & 1)) = 0 ] || fail "OACS $oacs claims Security Send/Receive"
expect_status "Invalid Command Opcode" security-recv $C -x 512
expect_status "Invalid Command Opcode" security-recv $NS -p 1 -s 1 -x 512
printf 'x' > /tmp/sec; expect_status "Invalid Command Opcode" security-send $C -t 1 -f /tmp/sec
nv effects-log $C --csi=0 || fail "effects-log failed: $(cat /tmp/out)"
grep -qiE 'Security (Send|Receive|Recv)' /tmp/out && fail "effects log lists a security command: $(grep -i security /tmp/out)"

# --- Timestamp (0Eh): the kernel set it at init; it advances in ms; the value nvme-cli sets sticks ---
nv get-feature $C -f 0xe -H || fail "get-feature 0xe failed"
t1=$(timestamp); grep -q 'initialized with a Timestamp value using a Set Features' /tmp/out || fail "origin: $(cat /tmp/out)"
sleep 2
nv get-feature $C -f 0xe -H || fail "get-feature 0xe failed"
t2=$(timestamp)
tsd=$(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%d", b - a }')
log "timestamp: $t1 then $t2 two seconds later (+$tsd ms)"
[ -n "$t1" ] && [ "$tsd" -ge 2000 ] && [ "$tsd" -lt 60000 ] || fail "timestamp did not advance by ~2 s: $t1 -> $t2"
nv set-feature $C -f 0xe --value=1700000000000 || fail "set-feature 0xe failed"
nv get-feature $C -f 0xe -H; t3=$(timestamp)
d=$(awk -v a="$t3" 'BEGIN { printf "%d", a - 1700000000000 }')
[ -n "$t3" ] && [ "$d" -ge 0 ] && [ "$d" -lt 60000 ] || fail "timestamp after setting 1700000000000: $t3"
nv get-feature $C -f 0xe -s 1 -H
[ "$(timestamp)" = 0 ] && grep -q 'by a Controller Level Reset' /tmp/out || fail "default timestamp: $(cat /tmp/out)"

# --- Host Behavior Support (16h): the kernel enabled LBAFEE (CTRATT.ELBAS); the default is zeroes ---
# (the 512-byte structure read raw: nvme-cli 2.3's -H shows ACRE alone; byte 0 ACRE, byte 2 LBAFEE)
nv get-feature $C -f 0x16 -H
hbs() {   # SEL: the Host Behavior Support structure into /tmp/hbs.bin
  nvme admin-passthru $C --opcode=0x0a --cdw10=$(( ($1 << 8) | 0x16 )) --data-len=512 --read --raw-binary > /tmp/hbs.bin 2> /tmp/hbs.err
}
hbs 0 && [ "$(le /tmp/hbs.bin 2 1)" = 1 ] && [ "$(le /tmp/hbs.bin 0 1)" = 0 ] \
  || fail "host behavior: ACRE $(le /tmp/hbs.bin 0 1) LBAFEE $(le /tmp/hbs.bin 2 1), expected 0 and 1: $(cat /tmp/hbs.err)"
hbs 1 && [ "$(le /tmp/hbs.bin 2 1)" = 0 ] || fail "host behavior default: LBAFEE $(le /tmp/hbs.bin 2 1): $(cat /tmp/hbs.err)"
( printf '\001\000\001'; dd if=/dev/zero bs=509 count=1 2>/dev/null ) > /tmp/hbs
nv set-feature $C -f 0x16 -l 512 -d /tmp/hbs   # refused by the guest kernel: logged, not checked

# --- I/O Command Set Profile (19h): CC.CSS is 110b (Linux, CAP.CSS.IOCSS), only index 0 exists ---
nv get-feature $C -f 0x19 && grep -q 'Current value:0*$' /tmp/out || fail "get-feature 0x19: $(cat /tmp/out)"
nv set-feature $C -f 0x19 --value=0 || fail "set-feature 0x19 --value=0: $(cat /tmp/out)"
expect_status "combination is rejected" set-feature $C -f 0x19 --value=1

# --- Software Progress Marker (80h): set, read, kept across a controller reset; default 0 ---
nv set-feature $C -f 0x80 --value=5 || fail "set-feature 0x80: $(cat /tmp/out)"
nv get-feature $C -f 0x80 -H && grep -q '(PBSLC): 5$' /tmp/out || fail "get-feature 0x80: $(cat /tmp/out)"
nv get-feature $C -f 0x80 -s 1 && grep -q 'Default value:0*$' /tmp/out || fail "0x80 default: $(cat /tmp/out)"
expect_status "Feature Not Namespace Specific" set-feature $C -f 0x80 --value=6 -n 1

# --- Host Identifier (81h): 8 bytes, set once; a reset clears it; then 16 bytes with EXHID ---
printf 'abcdefgh' > /tmp/hid8; printf '0123456789abcdef' > /tmp/hid16
nv set-feature $C -f 0x81 --value=0 -l 8 -d /tmp/hid8 || fail "set-feature 0x81 (8 bytes): $(cat /tmp/out)"
nv get-feature $C -f 0x81 && grep -q '"abcdefgh"' /tmp/out || fail "host id 8: $(cat /tmp/out)"
expect_status "Command Sequence Error" set-feature $C -f 0x81 --value=1 -l 16 -d /tmp/hid16
reset_live "controller reset"
nv get-feature $C -f 0x80 -H && grep -q '(PBSLC): 5$' /tmp/out || fail "0x80 after reset: $(cat /tmp/out)"
nv get-feature $C -f 0x81 -c 1
[ "$(hexdump_bytes)" = "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 " ] || fail "host id after reset, not 0h: $(cat /tmp/out)"
nv set-feature $C -f 0x81 --value=1 -l 16 -d /tmp/hid16 || fail "set-feature 0x81 (16 bytes): $(cat /tmp/out)"
nv get-feature $C -f 0x81 -c 1 && grep -q '"0123456789abcdef"' /tmp/out || fail "host id 16: $(cat /tmp/out)"

# --- Keep Alive Timer (0Fh) and the Keep Alive command (18h) ---
nv get-feature $C -f 0xf && grep -q 'Current value:0*$' /tmp/out || fail "KATO not 0 (disabled) on PCIe: $(cat /tmp/out)"
nv set-feature $C -f 0xf --value=60000   # refused by the guest kernel: logged, not checked
nv admin-passthru $C --opcode=0x18 || fail "keep alive command: $(cat /tmp/out)"
nv effects-log $C --csi=0 && grep -q 'Keep Alive.*00000001' /tmp/out || fail "effects log lacks Keep Alive: $(cat /tmp/out)"

# --- Supported capabilities (SEL 011b) of every feature: changeable, not saveable; 05h per namespace.
#     Asked per feature through admin-passthru (the completion's dword 0): nvme-cli 2.13's get-feature -s 3
#     without -f walks the features, 2.3's asks for FID 0 alone ---
capsof() {   # FID [NSID]: prints dword 0 in hex, or the error
  _o=$(nvme admin-passthru $C --opcode=0x0a --cdw10=$(( (3 << 8) | $1 )) --namespace-id=${2:-0xffffffff} 2>&1)
  # "NVMe command result:00000004" (2.13), "... is Success and result: 0x00000004" (2.3)
  echo "$_o" | sed -n 's/.*result: *\(0x\)\{0,1\}\([0-9a-fA-F]\{8\}\).*/0x\2/p' | grep . || echo "$_o" | tail -1
}
caps=0
for f in 0x01 0x02 0x04 0x07 0x08 0x09 0x0a 0x0b 0x0e 0x0f 0x16 0x19 0x80 0x81; do
  c=$(capsof $f)
  if [ "$c" = 0x00000004 ]; then caps=$((caps + 1)); else fail "capabilities of $f: $c"; fi
done
log "SEL 3: $caps features changeable, not saveable, controller scope"
c=$(capsof 0x05); echo "$c" | grep -q 'Invalid Namespace' || fail "0x05 with NSID FFFFFFFFh: $c"
c=$(capsof 0x05 1); [ "$c" = 0x00000006 ] || fail "0x05 capabilities: $c"
nv get-feature $C -f 7 -s 2 && grep -q 'Saved value:0x' /tmp/out || fail "SEL saved: $(cat /tmp/out)"

log "summary: ELBAF for $((nlbaf + 1)) formats, timestamp +$tsd ms over sleep 2, $caps features changeable"
result_json "{\"name\":\"nvme-cli-admin\",\"cntlid\":\"$cntlid\",\"ctratt\":\"$ctratt\",\"oncs\":\"$oncs\",\"capabilities\":$caps}"
check_no_nvme_errors || rc=1
exit $rc
