# shellcheck shell=sh
# vnvme-upgrade.sh - guest test (run-vnvme-tests.sh upgrade): the namespace is a `file` namespace whose
# server the host upgrades (vnvme ctl upgrade) 10 times while this runs fio randrw, 4k-128k blocks,
# crc32c verify (verify_backlog: written blocks are read back and checked as it goes, and all at the end),
# for rig.secs (60) seconds after "TEST: upgrade: I/O running". 0 verify errors, no nvme timeout, abort or
# reset in dmesg. Prints the pause the guest saw: fio's largest completion latency, and a per-100 ms IOPS
# trace (fio --write_iops_log, log_avg_msec=100) as RESULT upgrade-trace {"stalls_ms":[..]} (each run of
# 100 ms windows with no completion) and TEST: iops100ms N N N ...
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
D=/dev/nvme0n1
SECS=$(cmdline_get secs 60)
log "upgrade: I/O running"
cd /tmp || die "no /tmp"
fio --name=upgrade --filename=$D --rw=randrw --bsrange=4k-128k --size=128M --ioengine=io_uring --direct=1 \
  --iodepth=16 --time_based --runtime="$SECS" --verify=crc32c --verify_fatal=1 --verify_backlog=64 \
  --write_iops_log=upgrade --log_avg_msec=100 --group_reporting \
  --output-format=terse --terse-version=3 >/tmp/upgrade.out 2>&1
rc=$?
line=$(grep '^3;' /tmp/upgrade.out | tail -1)
[ -n "$line" ] || { tail -10 /tmp/upgrade.out; die "fio produced no result (status $rc)"; }
err=$(echo "$line" | cut -d';' -f5)
# terse v3: read clat max (us) field 15, write clat max field 56; read/write iops 8 and 49
echo "$line" | awk -F';' '{ printf "RESULT {\"name\":\"upgrade\",\"err\":%d,\"read_iops\":%d,\"write_iops\":%d,\"read_clat_max_us\":%d,\"write_clat_max_us\":%d,\"io_kib\":%d}\n", $5, $8, $49, $15, $56, $6 + $47 }'
# the IOPS logs (one per direction, or one file with both): "msec, iops, ddir, bs, offset" per 100 ms
cat upgrade_iops*.log 2>/dev/null | awk -F', *' '
  { w = int(($1 + 50) / 100); sum[w] += $2; if (w > last) last = w }
  END {
    run = 0; stalls = ""; trace = ""
    for (i = 1; i <= last; i++) {
      trace = trace " " int(sum[i] + 0.5)
      if (sum[i] + 0 == 0) { run++ } else { if (run > 0) stalls = stalls (stalls == "" ? "" : ",") run * 100; run = 0 }
    }
    if (run > 0) stalls = stalls (stalls == "" ? "" : ",") run * 100
    printf "RESULT {\"name\":\"upgrade-trace\",\"windows\":%d,\"stalls_ms\":[%s]}\n", last, stalls
    print "TEST: iops100ms" trace
  }'
[ "$err" = 0 ] && [ $rc = 0 ] || { tail -5 /tmp/upgrade.out; die "fio failed (status $rc, error $err): verify errors or I/O errors across the upgrades"; }
check_no_nvme_errors || die "nvme timeouts or resets in dmesg"
log "upgrade: $SECS s of verified randrw across the upgrades, no error"
