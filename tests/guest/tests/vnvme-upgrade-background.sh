# shellcheck shell=sh
# vnvme-upgrade-background.sh - guest test (run-vnvme-tests.sh upgrade-background): background work
# across live upgrades. Server: --ns 64M:file=F --sanitize-rate 4M --control C. Each time this asks
# ("UPGRADE-ASK n") the host upgrades the server (vnvme ctl upgrade); this goes on 5 s later
# ("UPGRADE-RESUME n"; the host checks its upgrade was done by then):
#   1. the first 4 KiB of an 8 KiB firmware image downloaded, an upgrade, the rest downloaded and
#      committed to slot 2 with activation at once: id-ctrl FR is the image's revision
#   2. random data written, a block erase started (64 MiB at 4 MiB/s: 16 s), an upgrade while it
#      runs: the Sanitize Status log (raw) still says in progress after it, then SSTAT completed
#      with global data erased (0x101), and the namespace reads all zeroes
#   3. no nvme errors in dmesg
. /guest-lib.sh
wait_nvme 10 || die "no /dev/nvme0n1"
C=/dev/nvme0
ask() { log "UPGRADE-ASK $1"; sleep 5; log "UPGRADE-RESUME $1"; }
nv() { nvme "$@" > /tmp/out 2>&1 || die "nvme $*: $(grep -v WARNING /tmp/out | tail -1)"; }
field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }
sstat() { log_raw /tmp/san-log 0x81 512 || die "get-log 81h: $(cat /tmp/log_raw.err)"; le /tmp/san-log 2 2; }

{ printf 'UPGRADED'; dd if=/dev/urandom bs=8184 count=1 2>/dev/null; } > /tmp/fw.bin
dd if=/tmp/fw.bin of=/tmp/fw-a.bin bs=4096 count=1 2>/dev/null
dd if=/tmp/fw.bin of=/tmp/fw-b.bin bs=4096 skip=1 2>/dev/null
nv fw-download $C --fw=/tmp/fw-a.bin
ask 1
nv fw-download $C --fw=/tmp/fw-b.bin --offset=1024
nv fw-commit $C --slot=2 --action=3
nv id-ctrl $C
fr=$(field fr /tmp/out)
[ "$fr" = UPGRADED ] || die "FR '$fr' after the commit, expected UPGRADED"
log "firmware: half downloaded before an upgrade, half after, committed: FR $fr"

dd if=/dev/urandom of=/dev/nvme0n1 bs=1M count=64 oflag=direct 2>/dev/null || die "writing the namespace"
nv sanitize $C --sanact=2
[ $(($(sstat) & 7)) = 2 ] || die "SSTAT $(sstat) right after the start: not in progress"
ask 2
s=$(sstat)
[ $((s & 7)) = 2 ] || die "SSTAT $s after the upgrade: the sanitize is not in progress any more (64 MiB at 4 MiB/s takes 16 s)"
log "sanitize: in progress after the upgrade (SPROG $(le /tmp/san-log 0 2))"
i=0
while [ $(($(sstat) & 7)) = 2 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
s=$(sstat)
[ "$s" = $((0x101)) ] || die "SSTAT $s after the sanitize, expected 0x101 (completed, global data erased)"
dd if=/dev/zero of=/tmp/zeroes bs=1M count=64 2>/dev/null
dd if=/dev/nvme0n1 bs=1M count=64 iflag=direct 2>/dev/null | cmp -s - /tmp/zeroes || die "the namespace is not all zeroes after the sanitize"
log "sanitize: completed in the new process, SSTAT 0x101, the namespace reads zeroes"
check_no_nvme_errors || die "nvme errors in dmesg"
log "upgrade-background: PASS"
