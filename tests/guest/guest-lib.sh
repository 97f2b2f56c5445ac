# shellcheck shell=sh
# guest-lib.sh - helpers for guest test scripts (busybox sh). run-guest.sh / run-test.sh append this file
# to the initramfs as /guest-lib.sh; a test starts with:   . /guest-lib.sh
#
#   log MSG...                 print "TEST: MSG" (stands out in the console log)
#   die MSG...                 print "TEST: FAIL: MSG" and exit 1
#   cmdline_get KEY [DEFAULT]  value of rig.KEY=VALUE on the kernel command line (run-test.sh --append)
#   wait_nvme [SECS] [DEV]     wait until block device DEV (default /dev/nvme0n1) exists, up to SECS (10)
#   nvme_errors                print kernel log lines that look like nvme trouble (timeout, reset, error...)
#   check_no_nvme_errors       fail (return 1, lines printed) if nvme_errors finds anything
#   fio_json NAME [FIO ARGS]   run one fio job (group reporting) and print one line
#                                RESULT {"name":..,"iops":..,"read_iops":..,"write_iops":..,"bw_kib":..,
#                                        "lat_mean_us":..,"clat_p50_us":..,"clat_p99_us":..,"clat_pcts_us":[[PCT,US],..],"io_kib":..,"runtime_ms":..,"err":..}
#                              (read fields when the job reads, else write fields; lat_p50_us.. with
#                              --lat_percentiles=1); return = fio's status
#   result_json JSON           print "RESULT JSON" (one line); run-test.sh collects these lines
#   fio_randread NAME ENGINE QD [SECS] [DEV]   4 KiB random read, direct, time based (default 10 s);
#                              ENGINE io_uring_cmd (async passthrough): give DEV /dev/ngXnY
#   run_nvme ARGS...           nvme-cli, logged as "TEST: nvme ARGS: exit N: <output>"; sets OUT, NRC (its exit
#                              status) and SC (status code type and code in hex, e.g. 281, or empty)
#   expect_ok ARGS...          run_nvme, and `fail` (the test's own) unless it exits 0
#   expect_sc SC ARGS...       run_nvme, and `fail` unless it fails with status SC
# Raw bytes, for what nvme-cli versions print differently (the guest suite runs on nvme-cli 2.3 and 2.13):
#   le FILE OFFSET N           the little-endian unsigned number in N bytes (N <= 6) at OFFSET of FILE
#   id_raw FILE CNS [NSID [CSI]]  Identify (06h): its 4096 bytes into FILE through admin-passthru; 1 on failure
#   log_raw FILE LID LEN [GET-LOG OPTIONS...]  Get Log Page: LEN raw bytes into FILE (get-log --raw-binary)
#   nvme_cli_version           nvme-cli's version as a number, 2.3 -> 203, 2.13 -> 213
#   kernel_before X.Y          true if the guest's Linux is older than X.Y (what it does not do yet)
#   skip_check WHAT: WHY       print "TEST: SKIP-CHECK: WHAT: WHY" (run-vnvme-tests.sh shows these beside PASS)

log() { echo "TEST: $*"; }
die() { echo "TEST: FAIL: $*"; exit 1; }

cmdline_get() {
  for _w in $(cat /proc/cmdline); do
    case "$_w" in "rig.$1="*) echo "${_w#rig.$1=}"; return 0;; esac
  done
  echo "${2:-}"
}

wait_nvme() {
  _secs=${1:-10}; _dev=${2:-/dev/nvme0n1}; _i=0
  while [ ! -b "$_dev" ]; do
    [ $_i -ge $((_secs * 10)) ] && { echo "TEST: $_dev did not appear within $_secs s"; return 1; }
    sleep 0.1; _i=$((_i + 1))
  done
  return 0
}

# reset_live WHAT: a controller reset from sysfs, then wait (30 s at most) until nvme0 is live again;
# logs "WHAT: controller live again after ~N s", dies naming WHAT if it is not
reset_live() {
  echo 1 > /sys/class/nvme/nvme0/reset_controller || die "writing reset_controller failed"
  _n=0
  while [ "$(cat /sys/class/nvme/nvme0/state)" != live ]; do
    [ $_n -ge 300 ] && die "controller state '$(cat /sys/class/nvme/nvme0/state)' 30 s after $1"
    sleep 0.1; _n=$((_n + 1))
  done
  log "$1: controller live again after ~$((_n / 10)).$((_n % 10)) s"
}

nvme_errors() {
  dmesg | grep -iE 'nvme' | grep -iE 'timeout|timed out|reset|error|abort|fail|disabl|offline|I/O [0-9]+ QID|dead|removing' \
    | grep -viE 'failfast|Shutdown timeout set'
}

check_no_nvme_errors() {
  _e=$(nvme_errors)
  if [ -n "$_e" ]; then
    echo "TEST: nvme errors in dmesg:"; echo "$_e" | sed 's/^/  /'
    return 1
  fi
  return 0
}

result_json() { echo "RESULT $*"; }

# fio terse v3 fields (1-based): 5 error; read: 6 KiB, 7 bw KiB/s, 8 iops, 18-37 clat percentiles, 40 lat mean us;
# write: 47 KiB, 48 bw, 49 iops, 59-78 clat percentiles, 81 lat mean us. With --lat_percentiles=1
# the percentile fields are of the total latency (submission + completion): named lat_* then.
fio_json() {
  _name=$1; shift
  _k=clat; case " $* " in *" --lat_percentiles=1 "*) _k=lat ;; esac
  _out=$(fio --name="$_name" --group_reporting --output-format=terse --terse-version=3 "$@" 2>&1)
  _rc=$?
  _line=$(echo "$_out" | grep '^3;' | tail -1)
  if [ -z "$_line" ]; then
    echo "TEST: fio $_name failed (status $_rc):"; echo "$_out" | tail -10 | sed 's/^/  /'
    _msg=$(echo "$_out" | tail -1 | tr -d '"\\' | cut -c1-200)
    echo "RESULT {\"name\":\"$_name\",\"err\":\"fio status $_rc: $_msg\"}"
    [ $_rc = 0 ] && _rc=1
    return $_rc
  fi
  echo "$_line" | awk -F';' -v name="$_name" -v k="$_k" '
    function pct(a, b, want,   i, kv) {     # percentile "99.000000%=123" in fields a..b
      for (i = a; i <= b; i++) { split($i, kv, "%="); if (kv[1] + 0 == want) return kv[2] + 0 }
      return -1
    }
    function pcts(a, b,   i, kv, out) {    # every percentile in fields a..b as [[p, us], ...]
      for (i = a; i <= b; i++) {
        split($i, kv, "%="); if (kv[1] + 0 <= 0) continue
        out = out (out == "" ? "" : ",") "[" kv[1] + 0 "," kv[2] + 0 "]"
      }
      return "[" out "]"
    }
    {
      rd = ($8 + 0 > 0 || $49 + 0 == 0)
      if (rd) { bw = $7; lat = $40; a = 18 } else { bw = $48; lat = $81; a = 59 }
      printf "RESULT {\"name\":\"%s\",\"iops\":%d,\"read_iops\":%d,\"write_iops\":%d,\"bw_kib\":%d,\"lat_mean_us\":%.1f,\"%s_p50_us\":%d,\"%s_p99_us\":%d,\"%s_pcts_us\":%s,\"io_kib\":%d,\"runtime_ms\":%d,\"err\":%d}\n",
        name, $8 + $49, $8, $49, bw, lat, k, pct(a, a + 19, 50), k, pct(a, a + 19, 99), k, pcts(a, a + 19),
        $6 + $47, ($9 > $50 ? $9 : $50), $5
    }'
  [ "$(echo "$_line" | cut -d';' -f5)" = 0 ] || return 1
  return $_rc
}

fio_randread() {
  # the char device is always direct: fio refuses --direct=1 there
  case $2 in io_uring_cmd) _x=--cmd_type=nvme ;; *) _x=--direct=1 ;; esac
  # engine options (cmd_type) are known only after --ioengine
  fio_json "$1" --filename="${5:-/dev/nvme0n1}" --rw=randread --bs=4k --ioengine="$2" "$_x" \
    --iodepth="$3" --numjobs=1 --time_based --runtime="${4:-10}" --ramp_time=1
}

run_nvme() {
  OUT=$(nvme "$@" 2>&1); NRC=$?
  SC=$(echo "$OUT" | sed -n 's/.*NVMe [Ss]tatus:.*(\(0x\)\{0,1\}\([0-9a-fA-F]*\)).*/\2/p' | head -1)
  [ -n "$SC" ] && SC=$(printf '%x' $((0x$SC & 0x7ff)))
  log "nvme $*: exit $NRC: $(echo "$OUT" | tr '\n' ' ' | tr -s ' ' | cut -c1-200)"
}
expect_ok() { run_nvme "$@"; [ $NRC = 0 ] || fail "nvme $*: exit $NRC ($OUT)"; }
expect_sc() {
  _want=$1; shift
  run_nvme "$@"
  [ $NRC != 0 ] && [ "$SC" = "$_want" ] || fail "nvme $*: exit $NRC status '$SC', expected $_want ($OUT)"
}

le() {
  od -A n -t u1 -v -j "$2" -N "$3" "$1" | awk '{ for (i = 1; i <= NF; i++) b[n++] = $i }
    END { v = 0; for (i = n - 1; i >= 0; i--) v = v * 256 + b[i]; printf "%.0f\n", v }'
}
id_raw() {
  nvme admin-passthru /dev/nvme0 --opcode=0x06 --cdw10="$2" --namespace-id="${3:-0}" --cdw11=$(( ${4:-0} << 24 )) \
    --data-len=4096 --read --raw-binary > "$1" 2> /tmp/id_raw.err && [ "$(wc -c < "$1")" = 4096 ]
}
log_raw() {
  _f=$1 _lid=$2 _len=$3; shift 3
  nvme get-log /dev/nvme0 --log-id="$_lid" --log-len="$_len" --raw-binary "$@" > "$_f" 2> /tmp/log_raw.err \
    && [ "$(wc -c < "$_f")" = "$_len" ]
}
nvme_cli_version() {
  nvme version | sed -n 's/^nvme version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | { read -r _a _b; echo $((_a * 100 + _b)); }
}
kernel_before() {
  _k=$(uname -r | sed -n 's/^\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  set -- "$1" $_k
  [ $(($2 * 1000 + $3)) -lt $((${1%%.*} * 1000 + ${1#*.})) ]
}
skip_check() { echo "TEST: SKIP-CHECK: $*"; }
# fio_verify_trace NAME RW BSRANGE SECS: fio RW (4 KiB-aligned BSRANGE blocks, QD 16) with crc32c verify on
# $D for SECS s (verify_backlog: written blocks are read back and checked as it goes, and all at the end),
# while the host does something to the server. Prints RESULT NAME (errors, IOPS, fio's largest completion
# latencies) and the pause the guest saw as a per-100 ms IOPS trace (fio --write_iops_log,
# log_avg_msec=100): RESULT NAME-trace {"stalls_ms":[..]} (each run of 100 ms windows with no completion)
# and TEST: iops100ms N N N ... Sets fio_rc (fio's status) and fio_err (its error count); /tmp/NAME.out
# holds its output.
fio_verify_trace() {
  _name=$1
  (cd /tmp && fio --name="$_name" --filename=$D --rw="$2" --bsrange="$3" --size=128M --ioengine=io_uring \
    --direct=1 --iodepth=16 --time_based --runtime="$4" --verify=crc32c --verify_fatal=1 --verify_backlog=64 \
    --write_iops_log="$_name" --log_avg_msec=100 --group_reporting \
    --output-format=terse --terse-version=3 >"/tmp/$_name.out" 2>&1)
  fio_rc=$?
  _line=$(grep '^3;' "/tmp/$_name.out" | tail -1)
  [ -n "$_line" ] || { tail -10 "/tmp/$_name.out"; die "fio produced no result (status $fio_rc)"; }
  fio_err=$(echo "$_line" | cut -d';' -f5)
  # terse v3: read clat max (us) field 15, write clat max field 56; read/write iops 8 and 49
  echo "$_line" | awk -F';' -v n="$_name" '{ printf "RESULT {\"name\":\"%s\",\"err\":%d,\"read_iops\":%d,\"write_iops\":%d,\"read_clat_max_us\":%d,\"write_clat_max_us\":%d,\"io_kib\":%d}\n", n, $5, $8, $49, $15, $56, $6 + $47 }'
  # the IOPS logs (one per direction, or one file with both): "msec, iops, ddir, bs, offset" per 100 ms
  cat "/tmp/$_name"_iops*.log 2>/dev/null | awk -F', *' -v n="$_name" '
    { w = int(($1 + 50) / 100); sum[w] += $2; if (w > last) last = w }
    END {
      run = 0; stalls = ""; trace = ""
      for (i = 1; i <= last; i++) {
        trace = trace " " int(sum[i] + 0.5)
        if (sum[i] + 0 == 0) { run++ } else { if (run > 0) stalls = stalls (stalls == "" ? "" : ",") run * 100; run = 0 }
      }
      if (run > 0) stalls = stalls (stalls == "" ? "" : ",") run * 100
      printf "RESULT {\"name\":\"%s-trace\",\"windows\":%d,\"stalls_ms\":[%s]}\n", n, last, stalls
      print "TEST: iops100ms" trace
    }'
}
