# shellcheck shell=sh
# vnvme-identify.sh - guest test (run-vnvme-tests.sh): the controller identifies as vnvme, and nvme-cli's
# views of it agree with each other and with what the host configured.
#   rig.serial=S rig.fr=F rig.ns_bytes=N   expected serial, firmware revision, namespace 1 size in bytes
#   rig.dbbuf=1|0                          OACS bit 8 (Doorbell Buffer Config) must be set / clear; unset: not checked
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
SERIAL=$(cmdline_get serial VNVME0001); FR=$(cmdline_get fr); NS_BYTES=$(cmdline_get ns_bytes); DBBUF=$(cmdline_get dbbuf)
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }
# "name : value" lines of nvme-cli's text output, value trimmed
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }

nvme id-ctrl /dev/nvme0 > /tmp/id-ctrl || die "nvme id-ctrl failed"
mn=$(field mn /tmp/id-ctrl); sn=$(field sn /tmp/id-ctrl); fr=$(field fr /tmp/id-ctrl)
oacs=$(field oacs /tmp/id-ctrl); nn=$(field nn /tmp/id-ctrl); sqes=$(field sqes /tmp/id-ctrl); cqes=$(field cqes /tmp/id-ctrl)
log "id-ctrl: mn='$mn' sn='$sn' fr='$fr' oacs=$oacs nn=$nn sqes=$sqes cqes=$cqes"
[ "$mn" = vnvme ] || fail "model number '$mn', expected 'vnvme'"
[ "$sn" = "$SERIAL" ] || fail "serial '$sn', expected '$SERIAL'"
[ -n "$fr" ] || fail "empty firmware revision"
[ -z "$FR" ] || [ "$fr" = "$FR" ] || fail "firmware revision '$fr', expected '$FR'"
[ "$nn" -ge 1 ] 2>/dev/null || fail "nn '$nn'"
[ "$sqes" = 0x66 ] || fail "sqes $sqes, expected 0x66"
[ "$cqes" = 0x44 ] || fail "cqes $cqes, expected 0x44"
case $DBBUF in
  1) [ $((oacs & 0x100)) != 0 ] || fail "OACS $oacs lacks bit 8 (Doorbell Buffer Config)" ;;
  0) [ $((oacs & 0x100)) = 0 ] || fail "OACS $oacs has bit 8 (Doorbell Buffer Config) in trap mode" ;;
esac

# nvme list: one line for nvme0n1 with the same serial, model and firmware
nvme list > /tmp/list 2>&1 || fail "nvme list failed"
line=$(grep '^/dev/nvme0n1 ' /tmp/list)
log "nvme list: $line"
case $line in *" $sn "*) ;; *) fail "nvme list does not show serial $sn";; esac
case $line in *" $mn "*) ;; *) fail "nvme list does not show model $mn";; esac
case $line in *" $fr"*) ;; *) fail "nvme list does not show firmware $fr";; esac

# id-ns: size = capacity = utilisation (RAM namespace, fully provisioned), 4 KiB LBA format in use,
# and the block layer agrees
nvme id-ns /dev/nvme0n1 > /tmp/id-ns || die "nvme id-ns failed"
nsze=$(field nsze /tmp/id-ns); ncap=$(field ncap /tmp/id-ns)
inuse=$(grep 'in use' /tmp/id-ns)
log "id-ns: nsze=$nsze ncap=$ncap $inuse"
lbads=$(echo "$inuse" | sed -n 's/.*lbads:\([0-9]*\).*/\1/p')
[ "$lbads" = 12 ] || fail "LBA format in use has lbads '$lbads', expected 12 (4 KiB)"
[ $((nsze)) = $((ncap)) ] || fail "nsze $nsze != ncap $ncap"
bytes=$(( $(cat /sys/block/nvme0n1/size) * 512 ))
[ $((nsze * 4096)) = "$bytes" ] || fail "nsze $nsze * 4096 != block device size $bytes"
[ -z "$NS_BYTES" ] || [ "$bytes" = "$NS_BYTES" ] || fail "namespace is $bytes bytes, host configured $NS_BYTES"
[ "$(cat /sys/block/nvme0n1/queue/logical_block_size)" = 4096 ] || fail "logical block size not 4096"

# smart-log: healthy, and its command counters move with the I/O we do
smart() { nvme smart-log /dev/nvme0 > /tmp/smart || die "nvme smart-log failed"; }
num() { field "$1" /tmp/smart | tr -d ',' | sed 's/[^0-9].*//'; }
smart
cw=$(num critical_warning); r0=$(num host_read_commands); w0=$(num host_write_commands)
log "smart-log: critical_warning=$cw host_read_commands=$r0 host_write_commands=$w0"
[ "$cw" = 0 ] || fail "critical_warning $cw"
dd if=/dev/nvme0n1 of=/dev/null bs=4096 count=64 iflag=direct 2>/dev/null || fail "dd read failed"
dd if=/dev/zero of=/dev/nvme0n1 bs=4096 count=16 seek=1000 oflag=direct 2>/dev/null || fail "dd write failed"
smart
r1=$(num host_read_commands); w1=$(num host_write_commands)
log "smart-log after 64 reads, 16 writes: host_read_commands=$r1 host_write_commands=$w1"
[ $((r1 - r0)) -ge 1 ] && [ $((r1 - r0)) -le 64 ] || fail "host_read_commands moved by $((r1 - r0)) for 64 direct 4 KiB reads"
[ $((w1 - w0)) -ge 1 ] && [ $((w1 - w0)) -le 16 ] || fail "host_write_commands moved by $((w1 - w0)) for 16 direct 4 KiB writes"

# Number of Queues (feature 7): what the controller allocated covers the queues Linux uses
f7=$(nvme get-feature /dev/nvme0 -f 7 2>&1) || fail "get-feature -f 7 failed: $f7"
val=$(echo "$f7" | sed -n 's/.*[Cc]urrent value: *\(0x[0-9a-fA-F]*\).*/\1/p')
hwq=$(ls /sys/block/nvme0n1/mq | wc -l)
log "get-feature 7: $val; blk-mq hardware queues: $hwq"
[ -n "$val" ] || fail "no value in: $f7"
if [ -n "$val" ]; then
  nsqa=$(( (val & 0xffff) + 1 )); ncqa=$(( ((val >> 16) & 0xffff) + 1 ))
  [ "$hwq" -le "$nsqa" ] && [ "$hwq" -le "$ncqa" ] || fail "$hwq hardware queues but NSQA=$nsqa NCQA=$ncqa"
fi
result_json "{\"name\":\"identify\",\"mn\":\"$mn\",\"sn\":\"$sn\",\"fr\":\"$fr\",\"oacs\":\"$oacs\",\"nsze\":\"$nsze\",\"queues\":$hwq}"
check_no_nvme_errors || rc=1
exit $rc
