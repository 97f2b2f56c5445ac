# shellcheck shell=sh
# vnvme-crash.sh - guest test (run-vnvme-tests.sh crash): the namespace is a `file` namespace served by
# `vnvme serve --supervise`, whose server the host SIGKILLs 5 times while this runs fio randwrite, 4k-64k
# blocks, crc32c verify (verify_backlog: written blocks are read back and checked as it goes, and all at
# the end), for rig.secs (40) seconds after "TEST: crash: I/O running". The commands in flight at each kill
# come back as Command Interrupted, which the nvme driver retries. 0 verify errors, no nvme timeout, abort
# or reset in dmesg (every nvme line of dmesg is printed). Prints the pause the guest saw: fio's largest
# completion latency, and a per-100 ms IOPS trace as RESULT crash-trace {"stalls_ms":[..]} (each run of
# 100 ms windows with no completion) and TEST: iops100ms N N N ...
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
D=/dev/nvme0n1
SECS=$(cmdline_get secs 40)
log "crash: I/O running"
cd /tmp || die "no /tmp"
fio --name=crash --filename=$D --rw=randwrite --bsrange=4k-64k --size=128M --ioengine=io_uring --direct=1 \
  --iodepth=16 --time_based --runtime="$SECS" --verify=crc32c --verify_fatal=1 --verify_backlog=64 \
  --write_iops_log=crash --log_avg_msec=100 --group_reporting \
  --output-format=terse --terse-version=3 >/tmp/crash.out 2>&1
rc=$?
line=$(grep '^3;' /tmp/crash.out | tail -1)
[ -n "$line" ] || { tail -10 /tmp/crash.out; die "fio produced no result (status $rc)"; }
err=$(echo "$line" | cut -d';' -f5)
# terse v3: read clat max (us) field 15, write clat max field 56; read/write iops 8 and 49
echo "$line" | awk -F';' '{ printf "RESULT {\"name\":\"crash\",\"err\":%d,\"read_iops\":%d,\"write_iops\":%d,\"read_clat_max_us\":%d,\"write_clat_max_us\":%d,\"io_kib\":%d}\n", $5, $8, $49, $15, $56, $6 + $47 }'
# the IOPS logs (one per direction, or one file with both): "msec, iops, ddir, bs, offset" per 100 ms
cat crash_iops*.log 2>/dev/null | awk -F', *' '
  { w = int(($1 + 50) / 100); sum[w] += $2; if (w > last) last = w }
  END {
    run = 0; stalls = ""; trace = ""
    for (i = 1; i <= last; i++) {
      trace = trace " " int(sum[i] + 0.5)
      if (sum[i] + 0 == 0) { run++ } else { if (run > 0) stalls = stalls (stalls == "" ? "" : ",") run * 100; run = 0 }
    }
    if (run > 0) stalls = stalls (stalls == "" ? "" : ",") run * 100
    printf "RESULT {\"name\":\"crash-trace\",\"windows\":%d,\"stalls_ms\":[%s]}\n", last, stalls
    print "TEST: iops100ms" trace
  }'
echo "TEST: dmesg nvme lines: $(dmesg | grep -ic nvme)"
dmesg | grep -i nvme | sed 's/^/TEST: dmesg: /'
[ "$err" = 0 ] && [ $rc = 0 ] || { tail -5 /tmp/crash.out; die "fio failed (status $rc, error $err): verify errors or I/O errors across the kills"; }
check_no_nvme_errors || die "nvme timeouts or resets in dmesg"
log "crash: $SECS s of verified randwrite across the kills, no error"
