# shellcheck shell=sh
# passthru-table.sh - the async passthrough seed's table inside the guest: the guest side of
# `vnvme bench passthru --guest` and of run-vnvme-tests.sh's passthru-table test.
# For each QD of rig.qds (default 1,8), each API of rig.apis (default sync,async,block) in turn, one job
# of 4 KiB random reads over the whole namespace for rig.runtime seconds (default 3) after a 1 s ramp:
#   sync   /nvme-sync-read on /dev/ng0n1: one NVME_IOCTL_IO64_CMD at a time. QD does not apply (one
#          caller waits for each command, as fio's sync engines ignore iodepth); it runs at every QD
#          anyway, as the seed's Sync-PT column did, so its flatness is measured, not assumed
#   async  fio io_uring_cmd --cmd_type=nvme on /dev/ng0n1 (asynchronous passthrough)
#   block  fio io_uring, direct, on /dev/nvme0n1
# Each prints RESULT {"name":"API-qdN","iops":..,...} (guest-lib.sh's fio_json fields), then the line
# "VNVME-BENCH-END API-qdN" (the bench's progress). First: RESULT {"name":"guest","kernel":..,"fio":..}.
# rig.reps=N (default 1): the whole sweep N times over (the bench takes each point's median).
# rig.check=1 (default; 0 for a null namespace, which keeps no data): before that, 64 KiB of random data
# written with dd to /dev/nvme0n1 at 4 KiB block 1000 must read back the same through /dev/ng0n1 with
# nvme-sync-read -c; prints RESULT {"name":"sync-check","blocks":16}.
# Needs /nvme-sync-read (run-test.sh --guest-file), /dev/ng0n1 and fio's io_uring_cmd engine: fails
# without them. No nvme errors in dmesg afterwards.
. /guest-lib.sh
wait_nvme 20 || die "no /dev/nvme0n1"
QDS=$(cmdline_get qds 1,8 | tr , ' ')
APIS=$(cmdline_get apis sync,async,block | tr , ' ')
RT=$(cmdline_get runtime 3)
REPS=$(cmdline_get reps 1)
READER=/nvme-sync-read
[ -c /dev/ng0n1 ] || die "no /dev/ng0n1: the kernel has no NVMe generic char device"
case " $APIS " in *" sync "*) [ -x $READER ] || die "no $READER: pass it with run-test.sh --guest-file" ;; esac
case " $APIS " in *" async "*) fio --enghelp=io_uring_cmd > /dev/null 2>&1 || die "fio has no io_uring_cmd engine" ;; esac
rc=0
result_json "{\"name\":\"guest\",\"kernel\":\"$(uname -r)\",\"fio\":\"$(fio --version)\"}"

if [ "$(cmdline_get check 1)" = 1 ]; then
  [ -x $READER ] || die "no $READER: pass it with run-test.sh --guest-file"
  dd if=/dev/urandom of=/tmp/pattern bs=4096 count=16 2>/dev/null || die "making the pattern"
  dd if=/tmp/pattern of=/dev/nvme0n1 bs=4096 seek=1000 oflag=direct 2>/dev/null || die "dd write to /dev/nvme0n1"
  if out=$($READER -c /tmp/pattern -s 1000 /dev/ng0n1 2>&1); then
    log "$out"
    result_json '{"name":"sync-check","blocks":16}'
  else
    echo "TEST: FAIL: sync passthrough read-back: $out"; rc=1
  fi
fi

r=0
while [ $r -lt "$REPS" ]; do
  r=$((r + 1))
  for q in $QDS; do
    for a in $APIS; do
      case $a in
        sync)  $READER -n "sync-qd$q" -t "$RT" -r 1 /dev/ng0n1 || { echo "TEST: FAIL: nvme-sync-read (QD $q)"; rc=1; } ;;
        async) fio_randread "async-qd$q" io_uring_cmd "$q" "$RT" /dev/ng0n1 || { echo "TEST: FAIL: fio io_uring_cmd QD $q"; rc=1; } ;;
        block) fio_randread "block-qd$q" io_uring "$q" "$RT" || { echo "TEST: FAIL: fio io_uring QD $q"; rc=1; } ;;
        *) die "unknown API '$a' in rig.apis (sync, async, block)" ;;
      esac
      echo "VNVME-BENCH-END $a-qd$q (pass $r of $REPS)"
    done
  done
done
check_no_nvme_errors || rc=1
exit $rc
