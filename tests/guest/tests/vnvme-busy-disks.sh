# shellcheck shell=sh
# vnvme-busy-disks.sh - guest side of bench/busy-disks.sh: fio on every vnvme disk at once, then on every
# QEMU nvme disk at once, in alternation; one RESULT line per pass with the aggregate IOPS.
#   rig.disks=N    disks of each kind (default 8)
#   rig.rounds=R   passes of each kind (default 3)
#   rig.secs=S     seconds per pass (default 10)
#   rig.qd=Q       iodepth per disk (default 32)
#   rig.rw=RW      fio's rw (default randread)
. /guest-lib.sh
N=$(cmdline_get disks 8)
R=$(cmdline_get rounds 3)
S=$(cmdline_get secs 10)
Q=$(cmdline_get qd 32)
RW=$(cmdline_get rw randread)
i=0
while [ "$(ls -d /sys/block/nvme*n1 2>/dev/null | wc -l)" -lt $((2 * N)) ]; do
  [ $i -ge 600 ] && die "$(ls -d /sys/block/nvme*n1 2>/dev/null | wc -l) of $((2 * N)) disks after 60 s"
  sleep 0.1; i=$((i + 1))
done
VNVME='' QEMU=''
for d in /sys/block/nvme*n1; do
  case $(cat "$d/device/model") in
    QEMU*) QEMU="$QEMU ${d##*/}" ;;
    *) VNVME="$VNVME ${d##*/}" ;;
  esac
done
[ "$(echo $VNVME | wc -w)" = "$N" ] && [ "$(echo $QEMU | wc -w)" = "$N" ] \
  || die "expected $N disks of each kind: vnvme:$VNVME; QEMU:$QEMU"
log "busy-disks: vnvme:$VNVME; QEMU:$QEMU; $R rounds of $S s, $RW 4k QD $Q per disk"
jobfile() {   # KIND DISKS...: one job per disk, reported as one group
  _k=$1; shift
  { printf '[global]\nioengine=io_uring\ndirect=1\nrw=%s\nbs=4k\niodepth=%s\nruntime=%s\ntime_based=1\n' "$RW" "$Q" "$S"
    printf 'group_reporting=1\nrandrepeat=0\nnorandommap=1\n'
    for d in "$@"; do printf '[%s]\nfilename=/dev/%s\n' "$d" "$d"; done; } > "/tmp/$_k.fio"
}
# shellcheck disable=SC2086
jobfile vnvme $VNVME
# shellcheck disable=SC2086
jobfile qemu $QEMU
pass() {   # KIND ROUND
  _out=$(fio --output-format=terse --terse-version=3 "/tmp/$1.fio" 2>&1)
  _line=$(echo "$_out" | grep '^3;' | tail -1)
  [ -n "$_line" ] || die "fio on the $1 disks: $(echo "$_out" | tail -3)"
  echo "$_line" | awk -F';' -v k="$1" -v r="$2" \
    '{ printf "RESULT {\"kind\":\"%s\",\"round\":%d,\"iops\":%d,\"err\":%d}\n", k, r, $8 + $49, $5 }'
}
for r in $(seq "$R"); do
  pass vnvme "$r"
  pass qemu "$r"
done
check_no_nvme_errors
log "busy-disks done"
