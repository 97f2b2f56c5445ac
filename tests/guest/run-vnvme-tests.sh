#!/usr/bin/env bash
# run-vnvme-tests.sh - the guest suite: a real Linux guest (QEMU 11.1 vfio-user-pci, TCG) drives one running
# `vnvme serve` through every test, one boot per test. Prints one line per test and a last line
# "N passed, M failed"; exits 1 if any test failed (126: could not even start).
#
# usage: tests/guest/run-vnvme-tests.sh [--compare] [--keep] [--guest-release R] [TEST...]
#   TEST       run only these (names below); default all
#   --guest-release R  boot the guest setup.sh --guest-release R built (trixie, the default, or bookworm:
#              Linux 6.1, nvme-cli 2.4, fio 3.33; RIG_RELEASE too); QEMU is the same. A test whose check needs
#              what that guest lacks says SKIP with the reason, or passes with the check it skipped named
#   --compare  also run the randread test on QEMU's built-in nvme (null-co) for reference IOPS
#   --keep     keep the temp folder (server log, console logs, stats) even when everything passed
# Needs: tests/guest/setup.sh done, root. The server binary is $VNVME if set, else the workspace's
# release build ($CARGO_TARGET_DIR or target/), built with `cargo build --release -p vnvme` if missing.
# Tests:
#   identify   id-ctrl model/serial/firmware, nvme list, id-ns, smart-log, get-feature 7, OACS bit 8
#   verify     fio writes the whole 256 MiB RAM namespace (4 KiB random, 128 KiB sequential) with crc32c
#              verify headers and reads it back verified (the 128 KiB requests come as SGLs: sgl_commands grows)
#   randread   fio 4 KiB randread io_uring at QD 1 and 32; no nvme timeout/reset/error in dmesg
#   shadow     (only with --doorbells and --stats) QD 32 randread uses shadow doorbells: shadow reads > 0,
#              <= 0.1 doorbell traps per I/O (the server runs in adaptive mode), from the server's --stats JSON
#   reset      controller reset from inside the guest (twice), nvme subsystem-reset refused (no CAP.NSSRS),
#              then verified I/O
#   kill       QEMU SIGKILLed mid-I/O; the server survives; a new QEMU boots on it and passes fio verify
#   passthru   nvme admin-passthru vendor info (C2h, "VNVMEVND"), unregistered C4h fails; io-passthru
#              vendor checksum (C0h, CRC32C); fio io_uring_cmd on /dev/ng0n1: verified write/read, randread
#   passthru-table  the seed's passthrough table, short (tests/passthru-table.sh, as `vnvme bench passthru
#              --guest` runs it): 64 KiB written with dd to /dev/nvme0n1 reads back the same through
#              synchronous passthrough (nvme-sync-read.c, built with cc -static, NVME_IOCTL_IO64_CMD on
#              /dev/ng0n1); then at QD 1 and 8, 3 s each: that reader, fio io_uring_cmd on /dev/ng0n1, fio
#              io_uring on /dev/nvme0n1, every point with IOPS > 0 and no error (ratios are the bench's job)
# Tests with their own server (a second `vnvme serve` for that boot only, its log in the temp folder):
#   ns-ready   --ns 256M:ram --ns 64M:ram,ready=5s: Linux (CC.CRIME clear) waits >= 5 s for CSTS.RDY,
#              then finds both namespaces in its first scan with their sizes; verified fio on both
#   ns-attach  --max-namespaces 8 --nvm-capacity 1G --ns 256M:ram --ns 64M:ram,detached: clean scan,
#              list-ns --all shows nsid 2; attach-ns makes nvme0n2 appear (event); create-ns + attach-ns,
#              verified fio, detach-ns makes it disappear, delete-ns
#   format     nvme format --lbaf=0: logical block size 512, verified fio (512 B, 4 KiB); --lbaf=3 back
#   file       --ns 128M:file=F (io_uring, several requests in flight per queue): the verify test on it
#   nbd        --ns nbd=nbd+unix:///?socket=S, an NBD export of nbdkit's memory plugin (128M, started by
#              the test on a UNIX socket; multi-conn, so a connection per queue): the verify test on it
#   nbd-restart  --ns nbd=URI on nbdkit's file plugin: 16 MiB written; nbdkit SIGKILLed while the guest reads
#              and started again 4 s later (tests/vnvme-nbd-restart.sh): the reads fail meanwhile (I/O
#              errors in dmesg, no timeout or reset) and fio ends on time; the server reconnects (its log
#              says so) and stays up; the 16 MiB read back intact; new verified writes
#   nvm-io     --ns 64M:ram --ns 64M:file=F: nvme-cli verify, write-uncor, write-zeroes and copy on both
#              namespaces: verify fails on a write-uncor block, as does a dd read, until it is written;
#              copied blocks read back equal (cmp); copy limits (MSSRL) and ranges past the end refused
#   sanitize   --ns 64M:ram --ns 64M:file=F --sanitize-rate 64M --self-test-rate 2M: nvme sanitize block
#              erase (I/O and device-self-test refused while it runs, sanitize-log progress, then both
#              namespaces read zeroes), overwrite (2 passes, pattern kept with --no-dealloc), crypto erase;
#              device-self-test short (result 0), failing on a write-uncor block (segment 2, NSID, LBA),
#              extended aborted (result 1); persistent-event-log has 3 Sanitize Start and 3 Sanitize
#              Completion events; then the server must stop on SIGTERM within 5 s while the
#              16-pass overwrite the guest left running goes on
#   file-backed-ram  --ns 64M:ram, guest RAM in a regular file (run-test.sh --mem-file /dev/shm/F: QEMU's
#              memory-backend-file, share=on) instead of a memfd: the verify test on 64 MiB; fails if
#              QEMU does not start (the server refused the memory), the server never mmapped that file
#              (checked in /proc/PID/maps by device and inode), data is wrong, or the file is left behind
#   upgrade    --ns 256M:file=F --control C (adaptive doorbells, the default; QEMU maps the doorbell page): fio randrw 4k-128k with crc32c verify (verify_backlog) for 60 s
#              (tests/vnvme-upgrade.sh) while the host upgrades the server 10 times (vnvme ctl upgrade, one
#              every 5 s; each new process takes the client over from the last): 0 verify errors, no nvme
#              timeout/abort/reset in dmesg, every upgrade reported with its phases (drain, save, pass,
#              restore), the last process serving at the end. Prints the stall the guest saw (fio's largest
#              completion latency, runs of 100 ms windows without a completion) and the phases per upgrade
#   upgrade-background  --ns 64M:file=F --sanitize-rate 4M --control C: background work across live
#              upgrades (tests/vnvme-upgrade-background.sh): a firmware image downloaded half before an upgrade
#              and half after is committed and runs (FR); a block erase under way at an upgrade is still in
#              progress in the new process, then completes (SSTAT 0x101) and the namespace reads zeroes
#   upgrade-many  a `[[controllers]]` config (two controllers, each a 128M `file` namespace, one process):
#              one VM with both disks runs fio randrw 4k-64k with crc32c verify on both for 40 s
#              (tests/vnvme-upgrade-many.sh) while the host upgrades the process 5 times through the first
#              controller's control socket: 0 verify errors on either disk, no nvme timeout/abort/reset,
#              5 upgrades reported, the last process serving both at the end
#   crash      --supervise --ns 256M:file=F: fio randwrite 4k-64k with crc32c verify (verify_backlog) for 40 s
#              (tests/vnvme-crash.sh) while the host SIGKILLs the supervised server 5 times (one every 5 s;
#              each new server restores the client on its connection, the commands in flight completed
#              with Command Interrupted): 0 verify errors, no nvme timeout/abort/reset in dmesg (its nvme
#              lines printed), every kill followed by a restore, no other error in the server's log. Prints
#              the stall the guest saw (fio's largest completion latency, runs of 100 ms windows without a
#              completion) and the commands completed as interrupted per kill
#   crash-zns  the same on --ns 256M:file=F,zoned,zone-size=2M (tests/vnvme-crash-zns.sh): rounds of fio
#              --zonemode=zbd randwrite 4 KiB with crc32c verify, 64 MiB at QD 8, 4 zones open at most, the
#              zones reset between rounds; every round verified, no I/O error (a write retried after
#              Command Interrupted finds its write pointer), no nvme timeout/abort/reset
#   crash-upgrade  --supervise --ns 256M:file=F --control C: the crash test's fio (tests/vnvme-crash.sh,
#              rig.name=crash-upgrade) while the host upgrades the supervised server 3 times (vnvme ctl
#              upgrade twice, SIGUSR2 to the supervisor once) and SIGKILLs it 3 times, interleaved (upgrade,
#              3 s, kill, 3 s): 0 verify errors, no nvme timeout/abort/reset, the supervisor following each
#              upgrade to its new process and restoring the client after each kill, no other error
#   many-disks  eight `vnvme serve --ns 64M:ram` with default settings (no --serial), one VM with all eight
#              (tests/vnvme-many-disks.sh): eight controllers and namespaces, no "Duplicate cntlid" or
#              "duplicate IDs" in dmesg, distinct serials, NQNs, EUI-64s, NGUIDs, UUIDs and wwids, and a
#              by-id name per disk (nvme-WWID, as udev makes) that writes that disk; then each server
#              restarted on its socket reports the serial it had
#   multipath  `vnvme serve --socket A --socket B --ns 256M:ram` (one subsystem, two controllers), one VM with
#              both (tests/vnvme-multipath.sh): Linux's native multipath makes one nvme-subsystem, one
#              /dev/nvme0n1 with two paths, both ANA optimized; fio randwrite 4k with crc32c verify for 30 s,
#              round-robin I/O policy, while this script flips controller 2 between inaccessible and
#              optimized every 3 s (vnvme ctl ana_set): 0 fio errors, the guest saw both states, and by each
#              controller's counters (vnvme ctl stats controller=N) I/O succeeded on both controllers in every
#              window where both were optimized and on controller 1 alone (at most 10 successes on 2: its
#              admin commands) while 2 was inaccessible
#   shared-disk  the same server, two VMs at once, each on its own controller (tests/vnvme-shared-disk.sh):
#              both see the namespace with the same NGUID; each writes and flushes 1 MiB of its own and reads
#              the other's (O_DIRECT) once it is there
#   shared-reservations  the same, --ns 256M:file=F, two VMs as two hosts (Host Identifiers AAAAAAAA and
#              BBBBBBBB; tests/vnvme-shared-reservations.sh), with nvme-cli: A registers and takes Write
#              Exclusive, B's write gets Reservation Conflict and its read succeeds, A releases, B writes;
#              A takes it again and runs fio randwrite 256k QD 32, B preempts and aborts A meanwhile: A's
#              fio ends in error, A's write conflicts, B holds it; on the host, each controller answered
#              at least one Reservation Conflict. How many of A's commands were in the server at the
#              preempt (completed as aborted) is a race with the TCG guest's speed: reported, not asserted
#              (the controller tests hold commands in flight and assert the abort exactly)
#   hugepage-ram  --ns 64M:ram, guest RAM in a file on hugetlbfs (2 MiB pages; the test mounts hugetlbfs in
#              its temp folder and reserves the pages, then gives them back): a controller reset, then fio
#              randrw 4k-128k with crc32c verify (tests/vnvme-hugepage-ram.sh). Then the same with one 1 GiB
#              page where the kernel can allocate one now (else that half is skipped with the reason)
#   viommu     --ns 128M:ram, the guest behind a virtual IOMMU (-device intel-iommu,caching-mode=on,
#              intel_iommu=on): its nvme driver maps each I/O buffer, QEMU sends a DMA_MAP and a DMA_UNMAP for
#              each; the controller is in a translated IOMMU group, fio randrw 4k-128k QD 16 with crc32c verify
#              over 64 MiB (tests/vnvme-viommu.sh); QEMU reports no DMA_MAP/DMA_UNMAP error (vfio-user
#              commands 2 and 3), also not at shutdown, and the server logs its share of the messages' time
#   nvme-cli-admin  --ns 256M:ram --max-io-queues 8 --msix-vectors 6: nvme-cli's nvm-id-ns (ELBAF),
#              nvm-id-ctrl, list-ns --csi, cmdset-ind-id-ns, id-iocs, id-uuid, id-domain (refused),
#              primary-ctrl-caps (with -c, and without: CNTID 0), list-secondary; get/set-feature 6 and
#              security-recv/send refused (no volatile write cache, no security protocol); get/set-feature
#              timestamp (advances across a sleep), host behavior, I/O command set profile, software
#              progress marker (kept across a reset), host identifier (8 then 16 bytes), keep alive timer
#              and command, -s 1/2/3
#   logs       --ns 64M:ram: nvme-cli's log pages with content: supported-log-pages lists exactly what
#              is answered; telemetry-log saves files whose header (LID, last blocks, generation) fits
#              their size; endurance-log --group-id=1 counts the writes made; persistent-event-log
#              (establish, read, release) shows the power-on, a sysfs reset and a format's events;
#              controller-initiated telemetry captured at a CSTS.CFS provoked with devmem, then released
#   firmware   --ns 64M:ram: nvme fw-download (out of order, overlap, gap, past 16 MiB), fw-commit to the
#              read-only slot 1, slots 0/3/4, action 6; action 1 + controller reset and action 3 (no
#              reset, the activation notice) each show the new revision in fw-log, id-ctrl FR and sysfs;
#              persistent-event-log has one Firmware Commit event per fw-commit (9)
#   pi         --ns 64M:file=F: nvme format --lbaf=4 (4096+8) --pi=1/2/3 and --lbaf=6 (4096+16, 64-bit guard)
#              --pi=1/3: id-ns DPS, /sys/block/nvme0n1/integrity/format (T10-DIF-TYPE1-CRC, T10-DIF-TYPE3-CRC,
#              EXT-DIF-TYPE1-CRC64, EXT-DIF-TYPE3-CRC64), fio verify with the kernel generating and checking
#              PI; nvme write --prinfo with a wrong guard refused (0x282), nvme read with a wrong application
#              tag (0x283) and, type 2, reference tag (0x284); --lbaf=5 (4096+64) --pi=1 with PI last and
#              first: fio verify; --lbaf=3 --pi=0: integrity "none"
#   directives --ns 64M:ram: Identify and Streams directives with nvme-cli dir-receive/dir-send
#              (enable, parameters, allocate 4, a write with --dir-type=1 --dir-spec=2 opens stream 2,
#              stream 5 refused, release identifier and resources)
#   zns        --ns 64M:ram --ns 128M:ram,zoned,zone-size=2M,max-open=4,max-active=6,zone-ext=64 --control
#              SOCK: NSID 2 is a host-managed zoned block device (64 zones, open/active limits 4/6 in sysfs
#              and nvme zns id-ns); a dd write shows the same write pointer in blkzone report and nvme zns
#              report-zones; blkzone reset; a write off the write pointer gets Zone Invalid Write;
#              zone-append returns the LBA; open-zone hits Too Many Open / Active Zones; fio
#              --zonemode=zbd randwrite with crc32c verify over 32 zones with --max_open_zones=4; blkzone
#              reset of all zones; set-zone-desc and report-zones --extended; then the host fails zones
#              with `vnvme ctl zone_set_state` (read only, offline, full): blkzone and report-zones show them,
#              changed-zone-list lists them, writes fail (tests/vnvme-zns.sh)
#   faults     --ns 64M:ram,vwc --max-namespaces 4 --control SOCK, nvme_core.io_timeout=5: while the guest runs,
#              the host injects through `vnvme ctl` (tests/vnvme-faults.sh): an Unrecovered Read Error with
#              DNR (dd and nvme read fail), namespace_add (nvme0n2 appears, verified fio) and namespace_remove
#              (it goes), a never-completing read (Linux times out, aborts, retries: the read succeeds),
#              2 s of latency, 3 s not ready, a SMART temperature warning (smart-log), controller_fatal
#              (Linux sees CSTS.CFS at its timeout and resets), power loss (a write flushed with fsync
#              survives, unflushed ones vanish); what Linux logged is in the report
#   reservations  --ns 64M:file=F: nvme-cli resv-register/acquire/release/report from two hosts (the
#              second: a controller reset and another Host Identifier, the only way a guest can show
#              one): reports checked field by field (rtype, regctl, ptpls, cntlid ffff for the other
#              host, rcsts, host id, key), Reservation Conflict for the second host's write, register,
#              acquire, not for its read; preempt, release (wrong type: Invalid Field); with PTPL set
#              the keys are in F.reservations, and a second boot on a new server over F finds them
#              (a third host's write conflicts), then clears them
#   unprivileged  QEMU and the server as two unprivileged users sharing a group, as under libvirt (users
#              vnvme-t-serve and vnvme-t-qemu and group vnvme-t-vm, created for the test where missing and
#              removed after): the server (setpriv, that group its one other group) serves
#              --socket-group vnvme-t-vm, the socket must be vnvme-t-serve:vnvme-t-vm 660 on the host;
#              QEMU as vnvme-t-qemu with only its own group must fail to connect ("Permission
#              denied", no boot); QEMU as vnvme-t-qemu in group vnvme-t-vm (run-test.sh --qemu-user)
#              boots and passes fio verify (64 MiB, 4k random + 128k sequential)
# Boot tests: the guest boots from a vnvme disk through firmware, not QEMU's -kernel (RIG_BOOT=disk).
# make-boot-image.sh writes a 66 MiB image with 512-byte sectors holding the rig's kernel, its initramfs
# with tests/vnvme-boot.sh as /test.sh, and the command line; the test's own server serves it as
# --ns IMAGE:file (no format=: its log must show the GPT or MBR taken as 512-byte sectors, LBA format 0)
# and --ns 64M:ram; the first vfio-user device has bootindex 0 and there is no NIC. In the guest
# (tests/vnvme-boot.sh): the command line is the boot entry's, /sys/firmware/efi is there only under
# UEFI, NSID 1 has 512-byte blocks and its FAT32 partition, fio verify (4k random, 128k sequential,
# crc32c) on NSID 2
#   boot-uefi  OVMF (Debian's ovmf, -bios /usr/share/ovmf/OVMF.fd); GPT with an EFI system partition:
#              systemd-boot as \EFI\BOOT\BOOTX64.EFI (the removable-media path, no boot variable needed),
#              a loader entry with the kernel (its EFI stub), initramfs and command line; the console
#              must show OVMF starting the vnvme disk's boot option
#   boot-bios  SeaBIOS (QEMU's default); MBR with GRUB's boot.img, its core.img (an embedded configuration
#              that loads kernel and initramfs from the FAT32 partition with the command line) after the
#              MBR; the console must show that configuration's "GRUB: booting the vnvme rig"
#   hotplug    disks attached and detached at run time, as a cloud does: one server per doorbell mode
#              (trap, shadow, adaptive, mmap-poll; --interrupts msi, the detach procedure QEMU 11.1
#              needs), a guest booted with no disk and a pcie-root-port; for each mode, 5 rounds of QMP
#              device_add, fio verify (8 MiB), device_del (odd rounds: the guest removes the device in
#              sysfs first) (tests/vnvme-hotplug.sh); QEMU and the guest survive every round, the
#              device leaves QEMU and the server sees the client go before the next round; every
#              server is still up at the end. HOTPLUG_INTERRUPTS=msix serves MSI-X instead: with QEMU 11.1
#              that run fails, QEMU aborting at the first device_del (a reproducer for QEMU's bug)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
GT=$HERE/tests
ALL="identify verify randread shadow reset kill passthru passthru-table ns-ready ns-attach format file nvm-io sanitize file-backed-ram hugepage-ram viommu nvme-cli-admin logs firmware directives pi zns faults reservations nbd nbd-restart boot-uefi boot-bios unprivileged hotplug many-disks multipath shared-disk shared-reservations upgrade upgrade-background upgrade-many crash crash-upgrade crash-zns"
COMPARE=0 KEEP=0 ONLY=''
while [ $# -gt 0 ]; do
  case $1 in
    --compare) COMPARE=1 ;;
    --keep) KEEP=1 ;;
    --guest-release) [ $# -ge 2 ] || { echo "run-vnvme-tests: --guest-release needs trixie or bookworm" >&2; exit 126; }
      RIG_RELEASE=$2; shift ;;
    --guest-release=*) RIG_RELEASE=${1#*=} ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run-vnvme-tests: unknown option $1" >&2; exit 126 ;;
    *) case " $ALL " in *" $1 "*) ONLY="$ONLY $1" ;; *) echo "run-vnvme-tests: unknown test $1" >&2; exit 126 ;; esac ;;
  esac
  shift
done
[ -n "$ONLY" ] || ONLY=$ALL
# which guest: run-guest.sh takes RIG_RELEASE's folder unless RIG_OUT names one
RIG_CACHE=${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}
case ${RIG_RELEASE:=trixie} in
  trixie) RIG_OUT=${RIG_OUT:-$RIG_CACHE/guest} ;;
  bookworm) RIG_OUT=${RIG_OUT:-$RIG_CACHE/guest-$RIG_RELEASE} ;;
  *) echo "run-vnvme-tests: --guest-release '$RIG_RELEASE': the rig builds trixie or bookworm guests" >&2; exit 126 ;;
esac
export RIG_RELEASE RIG_OUT
[ -f "$RIG_OUT/vmlinuz" ] || { echo "run-vnvme-tests: no guest in $RIG_OUT: run tests/guest/setup.sh --guest-release $RIG_RELEASE first" >&2; exit 126; }

NS_BYTES=$((256 << 20))
SERIAL=VNVMEGUEST01
RT=${RIG_RUNTIME:-5}          # seconds per fio randread point

# --- the server binary ---
if [ -z "${VNVME:-}" ]; then
  VNVME=${CARGO_TARGET_DIR:-$ROOT/target}/release/vnvme
  if [ ! -x "$VNVME" ]; then
    echo "run-vnvme-tests: building $VNVME (cargo build --release -p vnvme)"
    (cd "$ROOT" && cargo build --release -p vnvme) >&2 || { echo "run-vnvme-tests: build failed" >&2; exit 126; }
  fi
fi
[ -x "$VNVME" ] || { echo "run-vnvme-tests: no server binary $VNVME" >&2; exit 126; }
FR=$("$VNVME" --version | awk '{print $2}')
SERVE_HELP=$("$VNVME" serve --help 2>&1)
has_opt() { case $SERVE_HELP in *"$1"*) return 0 ;; esac; return 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-guest.XXXXXX")
SOCK=$TMP/vnvme.sock STATS=$TMP/stats.json SLOG=$TMP/serve.log
SPID='' XPID=''
cleanup() {
  [ -z "$XPID" ] || stop_xserver
  [ -z "${UNPRIV_MADE:-}${UNPRIV_DIR:-}" ] || unpriv_clean
  if [ -n "$SPID" ] && kill -0 "$SPID" 2>/dev/null; then
    kill -TERM "$SPID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SPID" 2>/dev/null || true
  fi
  if [ "$KEEP" = 1 ] || [ "${FAILED:-1}" != 0 ]; then echo "run-vnvme-tests: logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- start the server: one process for the whole suite (the kill test relies on that) ---
ARGS=(serve --socket "$SOCK" --ns "$((NS_BYTES >> 20))M:ram" --serial "$SERIAL")
DBBUF=''      # expected OACS bit 8, empty = unknown (older server without --doorbells)
if has_opt --doorbells; then ARGS+=(--doorbells adaptive); DBBUF=1; fi
HAVE_STATS=0
if has_opt --stats; then ARGS+=(--stats "$STATS"); HAVE_STATS=1; fi
"$VNVME" "${ARGS[@]}" > "$SLOG" 2>&1 &
SPID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
if [ ! -S "$SOCK" ]; then
  echo "run-vnvme-tests: server did not start:"; tail -20 "$SLOG"; FAILED=1; exit 126
fi
echo "run-vnvme-tests: $VNVME ${ARGS[*]} (pid $SPID), doorbells: $([ -n "$DBBUF" ] && echo adaptive || echo "no --doorbells option"), stats: $([ $HAVE_STATS = 1 ] && echo "$STATS" || echo 'no --stats option')"
echo "run-vnvme-tests: guest $RIG_RELEASE ($RIG_OUT, kernel $(cat "$RIG_OUT/kernel-version" 2>/dev/null || echo unknown))"

PASSED=0 FAILED=0 SKIPPED=0 CHECKS_SKIPPED=0 SKIPS=''
report() {   # STATUS NAME SECONDS DETAIL; then the checks the guest skipped (SKIPS, from boot)
  printf '%-4s %-10s %6.1fs  %s%s\n' "$1" "$2" "$3" "$4" "${SKIPS:+ [checks skipped, the guest lacks what they need: $SKIPS]}"
  case $1 in PASS) PASSED=$((PASSED + 1)) ;; FAIL) FAILED=$((FAILED + 1)) ;; SKIP) SKIPPED=$((SKIPPED + 1)) ;; esac
  SKIPS=''
}
# a guest that lacks what a check needs (an older kernel or nvme-cli: --guest-release) prints
# "TEST: SKIP-CHECK: WHAT: WHY" and goes on; those lines of the boot's console go into its report line
note_skips() {   # CONSOLE...
  local n
  n=$(cat "$@" 2>/dev/null | tr -d '\r' | grep -ac '^TEST: SKIP-CHECK: ')
  [ "$n" -gt 0 ] || return 0
  CHECKS_SKIPPED=$((CHECKS_SKIPPED + n))
  SKIPS="${SKIPS:+$SKIPS | }$(cat "$@" | tr -d '\r' | sed -n 's/^TEST: SKIP-CHECK: //p' | tr '\n' '|' | sed 's/|$//; s/|/ | /g')"
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
server_alive() { kill -0 "$SPID" 2>/dev/null; }
# the guest's RESULT lines of a run: "name iops" pairs, for the summary
iops_of() { sed -n 's/.*"name":"\([^"]*\)","iops":\([0-9]*\).*/\1=\2/p' "$1" | tr '\n' ' '; }

# boot: NAME GUEST_SCRIPT [run-test.sh options...]; sets RC, OUT (RESULT lines), LOG (console)
boot() {
  local name=$1 script=$2; shift 2
  OUT=$TMP/$name.results LOG=$TMP/$name.console
  "$HERE/run-test.sh" --vfio-user "${XSOCK:-$SOCK}" --log "$LOG" --results "$OUT" "$@" "$script" > /dev/null 2> "$TMP/$name.harness"
  RC=$?
  note_skips "$LOG"
}
fail_detail() {   # why a boot failed: the guest's FAIL lines, else the harness's last line
  local d
  d=$(grep -h 'TEST: FAIL' "$LOG" 2>/dev/null | sed 's/^TEST: FAIL: //' | head -3 | tr '\n' ';')
  [ -n "$d" ] || d=$(tail -1 "$TMP/$1.harness")
  echo "exit $RC: $d (console $LOG)"
}

# --- per-test servers: a test that needs other namespaces starts its own server for its boot ---
XSOCK='' XLOG='' XMSG=''
start_xserver() {   # NAME SERVE-ARGS...: sets XSOCK (boot uses it), XPID, XLOG; 1 if it did not start
  local name=$1; shift
  XSOCK=$TMP/$name.sock XLOG=$TMP/$name.serve.log
  "$VNVME" serve --socket "$XSOCK" "$@" > "$XLOG" 2>&1 &
  XPID=$!
  for _ in $(seq 100); do [ -S "$XSOCK" ] && return 0; kill -0 "$XPID" 2>/dev/null || break; sleep 0.1; done
  return 1
}
stop_xserver() {    # sets XMSG: why the server is not healthy (died during the boot, errors in its log), if so
  local alive=1
  XMSG=''
  [ -n "$XPID" ] || { XSOCK=''; return 0; }
  kill -0 "$XPID" 2>/dev/null || { alive=0; XMSG="the test's server died (log $XLOG)"; }
  if [ $alive = 1 ]; then
    kill -TERM "$XPID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$XPID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$XPID" 2>/dev/null || true
  fi
  wait "$XPID" 2>/dev/null
  grep -qiE 'panic|ERROR' "$XLOG" && XMSG="${XMSG:+$XMSG; }the test's server log has errors: $(grep -iE 'panic|ERROR' "$XLOG" | head -2 | tr '\n' ' ')"
  XPID='' XSOCK=''
}
# own_server_test NAME OPTION-NEEDED GUEST_SCRIPT SERVE-ARGS -- RUN-TEST-ARGS...: boot on a fresh server
own_server_test() {
  local name=$1 need=$2 script=$3 t0 srv; shift 3; t0=$(now)
  local sargs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sargs+=("$1"); shift; done
  shift
  if ! has_opt "$need"; then report SKIP "$name" 0 "server has no '$need' option"; return; fi
  if ! start_xserver "$name" "${sargs[@]}"; then
    report FAIL "$name" "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  boot "$name" "$GT/$script" "$@"
  stop_xserver; srv=$XMSG
  if [ $RC = 0 ] && [ -z "$srv" ]; then
    report PASS "$name" "$(since "$t0")" "$(grep -h '^TEST: ' "$LOG" | grep -v 'TEST: dmesg' | sed 's/^TEST: //' | tail -4 | tr '\n' ';') $(iops_of "$OUT")"
  elif [ $RC = 0 ]; then
    report FAIL "$name" "$(since "$t0")" "$srv"
  else
    report FAIL "$name" "$(since "$t0")" "$(fail_detail "$name")${srv:+; $srv}"
  fi
}

# --- stats: counters from the server's --stats JSON (first occurrence of a key = the controller total) ---
stat_num() { grep -o "\"$1\": *[0-9]*" "$STATS" 2>/dev/null | head -1 | grep -o '[0-9]*$'; }
stats_snapshot() {   # prints "sq_traps cq_traps shadow_reads commands" or nothing
  local a b c d
  a=$(stat_num sq_doorbell_traps); b=$(stat_num cq_doorbell_traps); c=$(stat_num shadow_reads); d=$(stat_num commands)
  [ -n "$a" ] && [ -n "$b" ] && [ -n "$c" ] && [ -n "$d" ] && echo "$a $b $c $d"
}
stats_fresh() {   # wait up to 5 s for the stats file to be rewritten after now (it may be periodic)
  local t0; t0=$(date +%s)
  for _ in $(seq 50); do
    [ -f "$STATS" ] && [ "$(stat -c %Y "$STATS" 2>/dev/null || echo 0)" -gt "$t0" ] && return 0
    sleep 0.1
  done
  return 0
}

t_identify() {
  local t0; t0=$(now)
  boot identify "$GT/vnvme-identify.sh" --timeout 120 \
    --append "rig.serial=$SERIAL rig.fr=$FR rig.ns_bytes=$NS_BYTES${DBBUF:+ rig.dbbuf=$DBBUF}"
  if [ $RC = 0 ]; then
    report PASS identify "$(since "$t0")" "$(grep -h 'TEST: id-ctrl' "$LOG" | sed 's/^TEST: id-ctrl: //')"
  else
    report FAIL identify "$(since "$t0")" "$(fail_detail identify)"
  fi
}

t_verify() {
  local t0 sgl0='' sgl1=''; t0=$(now)
  [ $HAVE_STATS = 1 ] && { stats_fresh; sgl0=$(stat_num sgl_commands); }
  # Linux takes SGLs (once SGLS offers them) for requests whose segments
  # average nvme.sgl_threshold (32 KiB by default, which fio's 4 KiB pages
  # never reach): at 4 KiB the 128k sequential part comes as SGLs.
  boot verify "$GT/vnvme-fio-verify.sh" --timeout 300 --append "rig.size=$NS_BYTES nvme.sgl_threshold=4096"
  [ $HAVE_STATS = 1 ] && { stats_fresh; sgl1=$(stat_num sgl_commands); }
  if [ $RC = 0 ] && [ -n "$sgl0" ] && [ "$((sgl1 - sgl0))" -le 0 ]; then
    report FAIL verify "$(since "$t0")" "data verified, but no command came with an SGL (sgl_commands $sgl0 -> $sgl1)"
  elif [ $RC = 0 ]; then
    report PASS verify "$(since "$t0")" "$((NS_BYTES >> 20)) MiB written and read back verified, 4k random + 128k sequential, ${sgl1:+$((sgl1 - sgl0)) commands by SGL, }$(iops_of "$OUT")"
  else
    report FAIL verify "$(since "$t0")" "$(fail_detail verify)"
  fi
}

t_randread() {
  local t0; t0=$(now)
  boot randread "$GT/vnvme-randread.sh" --timeout 180 --append "rig.runtime=$RT rig.qds=1,32"
  if [ $RC = 0 ]; then
    report PASS randread "$(since "$t0")" "IOPS $(iops_of "$OUT")"
  else
    report FAIL randread "$(since "$t0")" "$(fail_detail randread)"
  fi
}

t_shadow() {
  local t0 s0 s1; t0=$(now)
  if [ -z "$DBBUF" ] || [ $HAVE_STATS = 0 ]; then
    report SKIP shadow 0 "server has no --doorbells/--stats option: shadow doorbell counters not checked"
    return
  fi
  stats_fresh; s0=$(stats_snapshot)
  if [ -z "$s0" ]; then
    report SKIP shadow "$(since "$t0")" "no sq/cq_doorbell_traps, shadow_reads, commands in $STATS"
    return
  fi
  boot shadow "$GT/vnvme-randread.sh" --timeout 180 --append "rig.runtime=$((RT * 2)) rig.qds=32"
  stats_fresh; s1=$(stats_snapshot)
  if [ $RC != 0 ]; then report FAIL shadow "$(since "$t0")" "$(fail_detail shadow)"; return; fi
  # whole boot: admin commands and the partition scan are noise next to ~100K reads at QD 32
  read -r a0 b0 c0 d0 <<< "$s0"; read -r a1 b1 c1 d1 <<< "$s1"
  local traps=$(( (a1 - a0) + (b1 - b0) )) shadow=$((c1 - c0)) cmds=$((d1 - d0))
  local per; per=$(awk -v t=$traps -v c=$cmds 'BEGIN { printf "%.3f", c ? t / c : 99 }')
  local detail="$cmds commands, $traps doorbell traps ($per per command), $shadow shadow reads; $(iops_of "$OUT")"
  # adaptive mode polls, then dozes, with EventIdx behind: the guest should hardly ever trap
  if [ "$shadow" -gt 0 ] && awk -v p="$per" 'BEGIN { exit !(p <= 0.1) }'; then
    report PASS shadow "$(since "$t0")" "$detail"
  else
    report FAIL shadow "$(since "$t0")" "want shadow reads > 0 and <= 0.1 traps per I/O: $detail"
  fi
}

t_reset() {
  local t0; t0=$(now)
  boot reset "$GT/vnvme-reset.sh" --timeout 180
  if [ $RC = 0 ]; then
    report PASS reset "$(since "$t0")" "$(grep -h 'TEST: reset' "$LOG" | sed 's/^TEST: //' | tr '\n' ';') $(iops_of "$OUT")"
  else
    report FAIL reset "$(since "$t0")" "$(fail_detail reset)"
  fi
}

t_kill() {
  local t0 pidfile bg qpid waited=0; t0=$(now)
  pidfile=$TMP/kill.qemu.pid LOG=$TMP/kill-busy.console
  "$HERE/run-test.sh" --vfio-user "$SOCK" --log "$LOG" --pidfile "$pidfile" --timeout 180 \
    --append "rig.runtime=60" "$GT/vnvme-busy.sh" > /dev/null 2> "$TMP/kill-busy.harness" &
  bg=$!
  # wait until fio runs in the guest, let I/O flow 3 s, then SIGKILL QEMU
  while ! grep -q BUSY-IO-STARTING "$LOG" 2>/dev/null; do
    if ! kill -0 $bg 2>/dev/null || [ $waited -ge 600 ]; then break; fi
    sleep 0.1; waited=$((waited + 1))
  done
  if ! grep -q BUSY-IO-STARTING "$LOG" 2>/dev/null; then
    wait $bg; RC=$?
    report FAIL kill "$(since "$t0")" "the busy guest never started I/O: $(fail_detail kill-busy)"
    return
  fi
  sleep 3
  qpid=$(cat "$pidfile" 2>/dev/null)
  [ -n "$qpid" ] && kill -KILL "$qpid" 2>/dev/null
  wait $bg; RC=$?
  if [ $RC != 125 ]; then
    report FAIL kill "$(since "$t0")" "QEMU pid '$qpid' was not killed mid-I/O (run-test exit $RC, expected 125; console $LOG)"
    return
  fi
  if ! server_alive; then
    report FAIL kill "$(since "$t0")" "the server died when QEMU was killed (log $SLOG)"
    return
  fi
  # the same server, a new QEMU: boots and passes a verified write/read
  boot kill-after "$GT/vnvme-fio-verify.sh" --timeout 180 --append "rig.size=64M rig.name=after-kill"
  if [ $RC = 0 ]; then
    report PASS kill "$(since "$t0")" "QEMU killed mid-I/O; new QEMU on the same server: $(iops_of "$OUT")"
  else
    report FAIL kill "$(since "$t0")" "after the kill: $(fail_detail kill-after)"
  fi
}

t_passthru() {
  local t0; t0=$(now)
  boot passthru "$GT/passthru.sh" --timeout 180 --append "rig.runtime=$((RT < 3 ? RT : 3)) rig.qds=1,32"
  if [ $RC = 0 ]; then
    report PASS passthru "$(since "$t0")" "$(grep -h 'TEST: checksum' "$LOG" | sed 's/^TEST: //' | tr '\n' ';') $(iops_of "$OUT")"
  else
    report FAIL passthru "$(since "$t0")" "$(fail_detail passthru)"
  fi
}

t_passthru-table() {
  local t0 reader p iops missing=''; t0=$(now)
  reader=$TMP/nvme-sync-read
  if ! "${CC:-cc}" -static -O2 -Wall -o "$reader" "$HERE/nvme-sync-read.c" 2> "$TMP/nvme-sync-read.cc.log"; then
    report FAIL passthru-table "$(since "$t0")" "${CC:-cc} -static nvme-sync-read.c failed (needs gcc and libc6-dev): $(head -3 "$TMP/nvme-sync-read.cc.log" | tr '\n' ' ')"
    return
  fi
  boot passthru-table "$GT/passthru-table.sh" --guest-file "$reader" --timeout 240 \
    --append "rig.qds=1,8 rig.runtime=3 rig.apis=sync,async,block rig.check=1"
  if [ $RC != 0 ]; then report FAIL passthru-table "$(since "$t0")" "$(fail_detail passthru-table)"; return; fi
  grep -q '"name":"sync-check"' "$OUT" || missing="sync-check"
  for p in sync-qd1 async-qd1 block-qd1 sync-qd8 async-qd8 block-qd8; do
    iops=$(sed -n "s/.*\"name\":\"$p\",\"iops\":\([0-9]*\).*\"err\":0}\$/\1/p" "$OUT" | head -1)
    [ "${iops:-0}" -gt 0 ] || missing="$missing $p"
  done
  if [ -z "$missing" ]; then
    report PASS passthru-table "$(since "$t0")" "$(grep -h 'TEST: nvme-sync-read' "$LOG" | sed 's/^TEST: //') IOPS $(iops_of "$OUT")"
  else
    report FAIL passthru-table "$(since "$t0")" "no successful result with IOPS > 0 for:$missing (console $LOG)"
  fi
}

t_ns-ready() {
  own_server_test ns-ready ready= vnvme-ns-ready.sh --ns 256M:ram --ns 64M:ram,ready=5s -- \
    --timeout 180 --append "rig.ready=5 rig.ns1_bytes=$((256 << 20)) rig.ns2_bytes=$((64 << 20))"
}

t_ns-attach() {
  own_server_test ns-attach --max-namespaces vnvme-ns-attach.sh \
    --max-namespaces 8 --nvm-capacity 1G --ns 256M:ram --ns 64M:ram,detached -- --timeout 180 --append "rig.wait=15"
}

t_format() {
  own_server_test format --format-duration vnvme-format.sh --ns 256M:ram -- --timeout 180 --append "rig.ns_bytes=$((256 << 20))"
}

t_logs() {
  own_server_test logs --ns vnvme-nvme-cli-logs.sh --ns 64M:ram -- --timeout 300
}

t_directives() {
  # its stats file shows the writes counted per stream
  own_server_test directives --ns vnvme-nvme-cli-directives.sh --ns 64M:ram --stats "$TMP/directives.stats.json" -- --timeout 180
}

# answer_asks NAME CTL PID ACTION...: while the boot PID runs, runs `vnvme ctl --control CTL ACTION` each
# time the console $LOG shows "<NAME>-ASK <step>" (step 1 is the first ACTION), waiting at most
# ASK_LIMIT tenths of a second (default 6000) in all; appends to why
answer_asks() {
  local name=$1 ctl=$2 bg=$3 step waited=0 mark limit=${ASK_LIMIT:-6000}; shift 3
  mark=$(echo "$name" | tr '[:lower:]' '[:upper:]')-ASK
  for step in $(seq $#); do
    while ! grep -aq "$mark $step" "$LOG" 2>/dev/null; do
      if ! kill -0 "$bg" 2>/dev/null || [ $waited -ge "$limit" ]; then break 2; fi
      sleep 0.1; waited=$((waited + 1))
    done
    # shellcheck disable=SC2086
    echo "step $step: vnvme ctl ${!step}: $("$VNVME" ctl --control "$ctl" ${!step} 2>&1 | tr '\n' ' ')" >> "$TMP/$name.ctl.log"
  done
  [ "$(wc -l < "$TMP/$name.ctl.log" 2>/dev/null || echo 0)" = $# ] || why="${why:+$why; }the guest asked for $(grep -c . "$TMP/$name.ctl.log" 2>/dev/null || echo 0) of $# steps"
  grep -q 'vnvme: error' "$TMP/$name.ctl.log" && why="${why:+$why; }vnvme ctl failed: $(grep 'vnvme: error' "$TMP/$name.ctl.log" | head -2 | tr '\n' ' ')"
  return 0
}

t_zns() {
  local t0 name=zns ctl bg why='' srv; t0=$(now)
  if ! has_opt --control; then report SKIP $name 0 "server has no '--control' option"; return; fi
  ctl=$TMP/$name.control.sock
  if ! start_xserver $name --ns 64M:ram --ns 128M:ram,zoned,zone-size=2M,max-open=4,max-active=6,zone-ext=64 --control "$ctl"; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  OUT=$TMP/$name.results LOG=$TMP/$name.console
  "$HERE/run-test.sh" --vfio-user "$XSOCK" --log "$LOG" --results "$OUT" --timeout 600 \
    "$GT/vnvme-zns.sh" > /dev/null 2> "$TMP/$name.harness" &
  bg=$!
  answer_asks $name "$ctl" $bg "zone_set_state nsid=2 zslba=$((40 * 512)) state=read-only" \
    "zone_set_state nsid=2 zslba=$((41 * 512)) state=offline" "zone_set_state nsid=2 zslba=$((42 * 512)) state=full"
  wait $bg; RC=$?
  note_skips "$LOG"
  stop_xserver; srv=$XMSG
  [ $RC = 0 ] || why="${why:+$why; }$(fail_detail $name)"
  [ -z "$srv" ] || why="${why:+$why; }$srv"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -ah '^TEST: ' "$LOG" | grep -v 'TEST: dmesg' | sed 's/^TEST: //' | tail -4 | tr '\n' ';')"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

t_reservations() {
  # two boots, each on a new server over the same image: the keys persist (PTPL) in IMG.reservations
  local t0 name=reservations why='' img=$TMP/reservations.img phase; t0=$(now)
  for phase in 1 2; do
    if ! start_xserver $name --ns "64M:file=$img"; then
      why="server $phase did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; break
    fi
    boot $name.$phase "$GT/vnvme-nvme-cli-reservations.sh" --timeout 240 --append "rig.phase=$phase"
    [ $RC = 0 ] || why="phase $phase: $(fail_detail $name.$phase)"
    stop_xserver; [ -z "$XMSG" ] || why="${why:+$why; }phase $phase: $XMSG"
    [ -z "$why" ] || break
    if [ $phase = 1 ] && ! grep -q '^registrant 4242424242424242[0 ]* 8 00000000000000b2$' "$img.reservations"; then
      why="after phase 1, $img.reservations lacks host B's key: $(tr '\n' ' ' < "$img.reservations" 2>&1)"; break
    fi
  done
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -ah '^TEST: ' "$TMP"/$name.*.console | grep -c '^TEST: \$') commands checked; keys kept in $(basename "$img").reservations across a server restart"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

t_file() {
  own_server_test file --ns vnvme-fio-verify.sh --ns "128M:file=$TMP/file-ns.img" -- \
    --timeout 300 --append "rig.size=128M rig.name=file"
}

# t_boot KIND: boot-uefi / boot-bios (see the header)
t_boot() {
  local kind=$1 name=boot-$1 t0 img why='' fw='' sig detected; t0=$(now)
  img=$TMP/$name.img
  case $kind in
    uefi) fw=/usr/share/ovmf/OVMF.fd sig='BdsDxe: starting Boot[0-9A-F]* "UEFI vnvme' detected='a GPT header at byte 512' ;;
    bios) sig='GRUB: booting the vnvme rig' detected='an MBR partition table' ;;
  esac
  if ! "$HERE/make-boot-image.sh" "--$kind" --append "rig.boot=$kind rig.size=32M" "$GT/vnvme-boot.sh" "$img" \
       > "$TMP/$name.image.log" 2>&1; then
    report FAIL $name "$(since "$t0")" "make-boot-image.sh failed: $(tail -2 "$TMP/$name.image.log" | tr '\n' ' ')"; return
  fi
  if ! start_xserver $name --ns "$img:file" --ns 64M:ram; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  RIG_BOOT=disk RIG_FIRMWARE=$fw boot $name "$GT/vnvme-boot.sh" --timeout 240
  stop_xserver; why=$XMSG
  grep -q "$detected (512-byte sectors): LBA format 0" "$XLOG" \
    || why="${why:+$why; }the server did not take the image's 512-byte sectors: $(grep -m1 'LBA format' "$XLOG")"
  # without the escape sequences of SeaBIOS's serial console (cursor moves can split a line of GRUB's)
  tr -d '\r' < "$LOG" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g' | grep -aq "$sig" \
    || why="${why:+$why; }the console has no '$sig': not booted by that firmware from vnvme?"
  [ $RC = 0 ] || why="$(fail_detail $name)${why:+; $why}"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -ah '^TEST: ' "$LOG" | sed 's/^TEST: //' | tr '\n' ';') $(iops_of "$OUT")"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}
t_boot-uefi() { t_boot uefi; }
t_boot-bios() { t_boot bios; }

t_pi() {
  own_server_test pi pi= vnvme-pi.sh --ns "64M:file=$TMP/pi.img" -- --timeout 600
}

t_nbd() {
  local sock=$TMP/nbdkit.sock npid t0; t0=$(now)
  if ! command -v nbdkit >/dev/null; then
    report FAIL nbd 0 "nbdkit is not installed (apt-get install nbdkit; .ci/run does)"; return
  fi
  nbdkit --foreground --exit-with-parent --unix "$sock" memory size=128M >"$TMP/nbdkit.log" 2>&1 &
  npid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  if [ ! -S "$sock" ]; then
    report FAIL nbd "$(since "$t0")" "nbdkit did not listen: $(tail -3 "$TMP/nbdkit.log" | tr '\n' ' ')"
    kill "$npid" 2>/dev/null; wait "$npid" 2>/dev/null; return
  fi
  own_server_test nbd --ns vnvme-fio-verify.sh --ns "nbd=nbd+unix:///?socket=$sock" -- \
    --timeout 300 --append "rig.size=128M rig.name=nbd"
  kill "$npid" 2>/dev/null; wait "$npid" 2>/dev/null
}

t_nbd-restart() {
  local name=nbd-restart sock=$TMP/nbdkit-restart.sock img=$TMP/nbd-restart.img t0 why='' srv
  local pids=$TMP/nbd-restart.pids watcher first; t0=$(now)
  if ! command -v nbdkit >/dev/null; then
    report FAIL $name 0 "nbdkit is not installed (apt-get install nbdkit; .ci/run does)"; return
  fi
  truncate -s 64M "$img"
  nbd_up() {   # starts nbdkit on $sock, records its pid; 1 if it does not listen
    rm -f "$sock"
    nbdkit --foreground --unix "$sock" file "$img" >>"$TMP/nbdkit-restart.log" 2>&1 &
    echo $! >> "$pids"
    for _ in $(seq 100); do [ -S "$sock" ] && return 0; sleep 0.1; done
    return 1
  }
  : > "$pids"
  # Each nbdkit runs under a subshell that waits for it (nbdkit exits when its parent does), so the
  # SIGKILL below is not reported as a job of this shell.
  ( nbd_up && wait ) 2>/dev/null &
  first=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  if [ ! -S "$sock" ]; then
    report FAIL $name "$(since "$t0")" "nbdkit did not listen"; kill $(cat "$pids") 2>/dev/null; return
  fi
  if ! start_xserver $name --ns "nbd=nbd+unix:///?socket=$sock"; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"
    stop_xserver; kill $(cat "$pids") 2>/dev/null; return
  fi
  # When the guest's reads start: kill nbdkit, and start it again 4 s later.
  ( for _ in $(seq 600); do grep -q 'nbd-restart: I/O running' "$TMP/$name.console" 2>/dev/null && break; sleep 0.5; done
    sleep 2; kill -KILL "$(head -1 "$pids")"; echo "$(date +%T) killed" > "$TMP/$name.killed"
    sleep 4; nbd_up && wait ) 2>/dev/null &
  watcher=$!
  boot $name "$GT/vnvme-nbd-restart.sh" --timeout 300
  [ $RC = 0 ] || why="$(fail_detail $name)"
  [ -s "$TMP/$name.killed" ] || why="${why:+$why; }nbdkit was never killed"
  kill -0 "$XPID" 2>/dev/null || why="${why:+$why; }the server died (log $XLOG)"
  grep -q 'reconnected' "$XLOG" || why="${why:+$why; }the server log does not show a reconnection"
  # Backend errors while nbdkit is away are the point of the test: only a panic counts against the server.
  grep -qi panic "$XLOG" && why="${why:+$why; }the server panicked (log $XLOG)"
  stop_xserver
  # Stop the nbdkits and let their subshells reap them; a watcher still waiting for the guest is killed.
  kill $(cat "$pids") 2>/dev/null
  for _ in $(seq 20); do kill -0 "$watcher" 2>/dev/null || break; sleep 0.1; done
  kill "$watcher" 2>/dev/null
  wait "$watcher" "$first" 2>/dev/null
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -h '^TEST: ' "$LOG" | grep -v 'TEST: dmesg' | sed 's/^TEST: //' | tail -3 | tr '\n' ';')"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

t_nvm-io() {
  own_server_test nvm-io --ns vnvme-nvme-cli-io.sh --ns 64M:ram --ns "64M:file=$TMP/nvm-io.img" -- \
    --timeout 300 --append "rig.devs=nvme0n1,nvme0n2"
}

t_nvme-cli-admin() {
  # its own server: the features it sets (software progress marker) outlive a guest
  own_server_test nvme-cli-admin --msix-vectors vnvme-nvme-cli-admin.sh \
    --ns 256M:ram --max-io-queues 8 --msix-vectors 6 -- --timeout 300 --append "rig.vqprt=9 rig.viprt=6"
}

t_firmware() {
  # its own server: the firmware slots outlive a guest
  own_server_test firmware --ns vnvme-nvme-cli-firmware.sh --ns 64M:ram -- --timeout 300 --append "rig.fr=$FR"
}

t_sanitize() {
  local t0 name=sanitize why='' code; t0=$(now)
  if ! has_opt --sanitize-rate; then report SKIP $name 0 "server has no '--sanitize-rate' option"; return; fi
  if ! start_xserver $name --ns 64M:ram --ns "64M:file=$TMP/$name.img" --sanitize-rate 64M --self-test-rate 2M; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  boot $name "$GT/vnvme-nvme-cli-sanitize.sh" --timeout 300
  [ $RC = 0 ] || why="$(fail_detail $name)"
  # The guest left a 16-pass overwrite running (about 30 s): SIGTERM must stop the server all the same.
  if kill -0 "$XPID" 2>/dev/null; then
    kill -TERM "$XPID"
    for _ in $(seq 50); do kill -0 "$XPID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$XPID" 2>/dev/null; then
      why="${why:+$why; }the server was still running 5 s after SIGTERM, with a sanitize in progress"
      kill -KILL "$XPID" 2>/dev/null
    fi
    wait "$XPID" 2>/dev/null; code=$?
    [ "$code" = 0 ] || why="${why:+$why; }the server exited $code on SIGTERM"
  else
    why="${why:+$why; }the test's server died (log $XLOG)"
  fi
  grep -qiE 'panic|ERROR' "$XLOG" && why="${why:+$why; }the test's server log has errors: $(grep -iE 'panic|ERROR' "$XLOG" | head -2 | tr '\n' ' ')"
  XPID='' XSOCK=''
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -h '^TEST: ' "$LOG" | grep -v 'TEST: dmesg' | sed 's/^TEST: //' | tail -4 | tr '\n' ';') server stopped on SIGTERM mid-sanitize"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

t_file-backed-ram() {
  local t0 mf seen srv name=file-backed-ram; t0=$(now)
  mf=/dev/shm/vnvme-guest-ram.$$
  rm -f "$mf"
  if ! start_xserver $name --ns 64M:ram; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  # watch the server's mappings while the guest runs: the guest RAM file (device:inode) must show up
  seen=$TMP/$name.mapped
  ( pid=$XPID
    while kill -0 "$pid" 2>/dev/null; do
      if [ -f "$mf" ] && id=$(stat -c '%Hd %Ld %i' "$mf" 2>/dev/null); then
        set -- $id
        if grep -q " $(printf '%02x:%02x' "$1" "$2") $3 " "/proc/$pid/maps" 2>/dev/null; then
          echo "$mf $(printf '%02x:%02x' "$1" "$2") $3" > "$seen"; exit 0
        fi
      fi
      sleep 0.2
    done ) &
  local wpid=$!
  boot $name "$GT/vnvme-fio-verify.sh" --mem-file "$mf" --timeout 300 --append "rig.size=64M rig.name=file-ram"
  kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null
  stop_xserver; srv=$XMSG
  local why=''
  [ $RC = 0 ] || why="$(fail_detail $name)"
  [ $RC = 125 ] && why="QEMU did not start or died (did the server refuse the file-backed memory?): $why"
  [ -s "$seen" ] || why="${why:+$why; }the server never mmapped the guest RAM file $mf"
  # QEMU does not stop when the server refuses a DMA_MAP (vfio-user command 2): it logs this and goes on
  grep -aq 'error reply on async request command 2 ' "$LOG" 2>/dev/null &&
    why="$why; QEMU got errors in reply to DMA_MAP (console $LOG)"
  if [ -e "$mf" ]; then why="${why:+$why; }run-test.sh left $mf behind"; rm -f "$mf"; fi
  [ -z "$srv" ] || why="${why:+$why; }$srv"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "guest RAM in $mf (mmapped by the server), 64 MiB verified 4k random + 128k sequential: $(iops_of "$OUT")"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

# One boot with the guest RAM on hugetlbfs pages of KIB KiB: mounts hugetlbfs (pagesize) in the temp
# folder, adds the pages to the kernel's pool, runs the guest, then unmounts and gives the pages back.
# Sets HP_WHY (empty when it passed) or HP_SKIP (the kernel could not give the pages now).
hugepage_boot() {   # NAME KIB RIG_MEM_MIB
  local name=$1 kib=$2 mib=$3 dir pool before want got
  HP_WHY='' HP_SKIP=''
  pool=/sys/kernel/mm/hugepages/hugepages-${kib}kB
  [ -d "$pool" ] || { HP_SKIP="this kernel has no ${kib} KiB huge pages"; return; }
  want=$((mib * 1024 / kib))
  before=$(cat "$pool/nr_hugepages")
  echo $((before + want)) > "$pool/nr_hugepages" 2>/dev/null
  got=$(( $(cat "$pool/free_hugepages") ))
  if [ "$got" -lt "$want" ]; then
    # A host up for hours has its free memory in small pieces: free the page cache and compact
    # it, as an operator would before reserving huge pages, then ask once more.
    sync
    echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    echo 1 > /proc/sys/vm/compact_memory 2>/dev/null || true
    echo $((before + want)) > "$pool/nr_hugepages" 2>/dev/null
    got=$(( $(cat "$pool/free_hugepages") ))
  fi
  if [ "$got" -lt "$want" ]; then
    echo "$before" > "$pool/nr_hugepages"
    HP_SKIP="the kernel found memory for $got of $want ${kib} KiB huge pages now"; return
  fi
  dir=$TMP/$name.hugetlbfs
  mkdir -p "$dir"
  if ! mount -t hugetlbfs -o "pagesize=${kib}K" nodev "$dir"; then
    echo "$before" > "$pool/nr_hugepages"; HP_WHY="mount -t hugetlbfs -o pagesize=${kib}K failed"; return
  fi
  if start_xserver $name --ns 64M:ram; then
    RIG_MEM=${mib}M boot $name "$GT/vnvme-hugepage-ram.sh" --mem-file "$dir/vm.ram" --timeout 400 \
      --append "rig.size=64M rig.name=$name"
    [ $RC = 0 ] || HP_WHY="$(fail_detail $name)"
    grep -aq 'error reply on async request command 2 ' "$LOG" 2>/dev/null &&
      HP_WHY="${HP_WHY:+$HP_WHY; }QEMU got errors in reply to DMA_MAP (console $LOG)"
    grep -aE 'refused|not mapped|fatal' "$XLOG" > /dev/null &&
      HP_WHY="${HP_WHY:+$HP_WHY; }the server log: $(grep -aE 'refused|not mapped|fatal' "$XLOG" | head -2 | tr '\n' ' ')"
  else
    HP_WHY="server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"
  fi
  stop_xserver; [ -z "$XMSG" ] || HP_WHY="${HP_WHY:+$HP_WHY; }$XMSG"
  umount "$dir" || HP_WHY="${HP_WHY:+$HP_WHY; }umount $dir failed"
  echo "$before" > "$pool/nr_hugepages"
  [ "$(cat "$pool/nr_hugepages")" = "$before" ] || HP_WHY="${HP_WHY:+$HP_WHY; }the pool kept $(cat "$pool/nr_hugepages") pages, had $before"
}

t_hugepage-ram() {
  local t0 name=hugepage-ram why='' detail=''; t0=$(now)
  hugepage_boot $name-2M 2048 512
  if [ -n "$HP_SKIP" ]; then why="2 MiB pages: $HP_SKIP"
  elif [ -n "$HP_WHY" ]; then why="2 MiB pages: $HP_WHY"
  else detail="2 MiB pages (512 MiB RAM): reset + randrw 4k-128k verified $(iops_of "$OUT")"; fi
  if [ -z "$why" ]; then
    hugepage_boot $name-1G 1048576 1024
    if [ -n "$HP_SKIP" ]; then detail="$detail; 1 GiB pages not run: $HP_SKIP"
    elif [ -n "$HP_WHY" ]; then why="1 GiB pages: $HP_WHY"
    else detail="$detail; 1 GiB page (1 GiB RAM): verified $(iops_of "$OUT")"; fi
  fi
  if [ -z "$why" ]; then report PASS $name "$(since "$t0")" "$detail"; else report FAIL $name "$(since "$t0")" "$why"; fi
}

t_viommu() {
  local t0 name=viommu why='' srv; t0=$(now)
  if ! start_xserver $name --ns 128M:ram; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  boot $name "$GT/vnvme-viommu.sh" --timeout 400 --qemu-arg -device --qemu-arg intel-iommu,caching-mode=on \
    --append "intel_iommu=on rig.size=64M rig.name=viommu"
  stop_xserver; srv=$XMSG
  [ $RC = 0 ] || why="$(fail_detail $name)"
  grep -aqE 'error reply on async request:? command [23]|vfio_container_dma_(un)?map' "$LOG" 2>/dev/null &&
    why="${why:+$why; }QEMU got errors in reply to DMA_MAP/DMA_UNMAP: $(grep -aE 'command [23]|vfio_container_dma' "$LOG" | head -2 | tr '\n' ' ')"
  [ -z "$srv" ] || why="${why:+$why; }$srv"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -ah '^TEST: controller' "$LOG" | sed 's/^TEST: //'); verified $(iops_of "$OUT"); server: $(grep -ao "[0-9]* messages in .*DMA_UNMAP [0-9]* ([^)]*)" "$XLOG" | sed 's/ VERSION.*DMA_MAP/ DMA_MAP/' | head -1)"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

# The unprivileged test's users, group and folder: what it made, removed by unpriv_clean (also at exit).
UNPRIV_G=vnvme-t-vm UNPRIV_S=vnvme-t-serve UNPRIV_Q=vnvme-t-qemu UNPRIV_MADE='' UNPRIV_DIR=''
unpriv_make() {   # creates what is missing; 1 with UNPRIV_WHY set if it cannot
  UNPRIV_WHY=''
  if ! getent group $UNPRIV_G > /dev/null; then
    groupadd --system $UNPRIV_G 2> "$TMP/unprivileged.users" || { UNPRIV_WHY="groupadd $UNPRIV_G: $(cat "$TMP/unprivileged.users")"; return 1; }
    UNPRIV_MADE="$UNPRIV_MADE group:$UNPRIV_G"
  fi
  for u in $UNPRIV_S $UNPRIV_Q; do
    id -u $u > /dev/null 2>&1 && continue
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin $u \
      2> "$TMP/unprivileged.users" || { UNPRIV_WHY="useradd $u: $(cat "$TMP/unprivileged.users")"; return 1; }
    UNPRIV_MADE="$UNPRIV_MADE user:$u"
  done
}
unpriv_clean() {
  local m
  [ -z "$UNPRIV_DIR" ] || rm -rf "$UNPRIV_DIR"
  for m in $UNPRIV_MADE; do   # users before the group (userdel also removes a user's own group)
    case $m in user:*) userdel "${m#user:}" 2> /dev/null ;; esac
  done
  for m in $UNPRIV_MADE; do
    case $m in group:*) groupdel "${m#group:}" 2> /dev/null ;; esac
  done
  UNPRIV_MADE='' UNPRIV_DIR=''
}

t_unprivileged() {
  local t0 name=unprivileged why='' srv gid owner refused; t0=$(now)
  if ! has_opt --socket-group; then report SKIP $name 0 "server has no '--socket-group' option"; return; fi
  if ! unpriv_make; then report FAIL $name "$(since "$t0")" "$UNPRIV_WHY"; unpriv_clean; return; fi
  gid=$(getent group $UNPRIV_G | cut -d: -f3)
  # The socket's folder: the server's, searchable by the group (run-test.sh bind-mounts it into the
  # chroot as it is). The binary is copied there: $VNVME may sit under a folder only root can enter.
  UNPRIV_DIR=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-unpriv.XXXXXX")
  cp "$VNVME" "$UNPRIV_DIR/vnvme"
  chown -R $UNPRIV_S:$UNPRIV_G "$UNPRIV_DIR"; chmod 750 "$UNPRIV_DIR"
  XSOCK=$UNPRIV_DIR/vnvme.sock XLOG=$TMP/$name.serve.log
  setpriv --reuid $UNPRIV_S --regid $UNPRIV_S --groups "$gid" -- "$UNPRIV_DIR/vnvme" serve --socket "$XSOCK" \
    --socket-group $UNPRIV_G --ns 64M:ram > "$XLOG" 2>&1 &
  XPID=$!
  for _ in $(seq 100); do [ -S "$XSOCK" ] && break; kill -0 "$XPID" 2>/dev/null || break; sleep 0.1; done
  if [ ! -S "$XSOCK" ]; then
    report FAIL $name "$(since "$t0")" "server as $UNPRIV_S did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"
    stop_xserver; unpriv_clean; return
  fi
  owner=$(stat -c '%U:%G %a' "$XSOCK")
  [ "$owner" = "$UNPRIV_S:$UNPRIV_G 660" ] || why="socket is $owner, want $UNPRIV_S:$UNPRIV_G 660"
  # Not in the group: refused at connect, before any boot.
  boot $name-refused "$GT/vnvme-fio-verify.sh" --qemu-user $UNPRIV_Q:$UNPRIV_Q --timeout 60
  refused=$(grep -ao "Failed to connect to [^ ]*: Permission denied" "$LOG" | head -1)
  if [ $RC != 125 ] || [ -z "$refused" ]; then
    why="${why:+$why; }QEMU as $UNPRIV_Q without the group was not refused (run-test exit $RC, console $LOG)"
  fi
  # In the group: boots, verified I/O.
  boot $name "$GT/vnvme-fio-verify.sh" --qemu-user $UNPRIV_Q:$UNPRIV_G --timeout 300 \
    --append "rig.size=64M rig.name=unprivileged"
  [ $RC = 0 ] || why="${why:+$why; }$(fail_detail $name)"
  stop_xserver; srv=$XMSG
  [ -z "$srv" ] || why="${why:+$why; }$srv"
  unpriv_clean
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "server as $UNPRIV_S, socket $owner; QEMU as $UNPRIV_Q alone: '$refused'; QEMU as $UNPRIV_Q:$UNPRIV_G: 64 MiB verified $(iops_of "$OUT")"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

t_faults() {
  local t0 name=faults ctl bg why='' srv; t0=$(now)
  if ! has_opt --control; then report SKIP $name 0 "server has no '--control' option"; return; fi
  ctl=$TMP/$name.control.sock
  if ! start_xserver $name --ns 64M:ram,vwc --max-namespaces 4 --control "$ctl"; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  OUT=$TMP/$name.results LOG=$TMP/$name.console
  "$HERE/run-test.sh" --vfio-user "$XSOCK" --log "$LOG" --results "$OUT" --timeout 420 \
    --append "nvme_core.io_timeout=5" "$GT/vnvme-faults.sh" > /dev/null 2> "$TMP/$name.harness" &
  bg=$!
  # what the host does at each of the guest's "FAULTS-ASK <step>" lines (see vnvme-faults.sh)
  local actions=(
    "fault_add kind=status nsid=1 opcodes=read lba=8 status=unrecovered-read-error dnr=true count=2"
    "namespace_add ns=32M:ram"
    "namespace_remove nsid=2"
    "fault_add kind=never-complete nsid=1 opcodes=read lba=16 count=1"
    "fault_add kind=latency latency=2s nsid=1 opcodes=read lba=24 count=1"
    "fault_add kind=not-ready nsid=1 duration=3s"
    "fault_add kind=smart-warning warning=temperature"
    "controller_fatal reason=guest-test"
    "fault_add kind=power-loss"
  )
  ASK_LIMIT=4000 answer_asks $name "$ctl" $bg "${actions[@]}"
  wait $bg; RC=$?
  note_skips "$LOG"
  stop_xserver; srv=$XMSG
  [ $RC = 0 ] || why="${why:+$why; }$(fail_detail $name)"
  [ -z "$srv" ] || why="${why:+$why; }$srv"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -ah '^TEST: ' "$LOG" | grep -v 'TEST: dmesg' | sed 's/^TEST: //' | tr '\n' ';') (dmesg per step in $LOG)"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

# many-disks: several default servers in one VM; their identities must all differ, and stay at a restart
t_many-disks() {
  local name=many-disks t0 n=8 i why='' pids=() serials=() again; t0=$(now)
  for i in $(seq $n); do
    "$VNVME" serve --socket "$TMP/$name.$i.sock" --ns 64M:ram > "$TMP/$name.$i.serve.log" 2>&1 &
    pids+=($!)
  done
  local args=()
  for i in $(seq $n); do
    for _ in $(seq 100); do [ -S "$TMP/$name.$i.sock" ] && break; sleep 0.1; done
    [ -S "$TMP/$name.$i.sock" ] || why="${why:+$why; }server $i did not start: $(tail -2 "$TMP/$name.$i.serve.log" | tr '\n' ' ')"
    args+=(--vfio-user "$TMP/$name.$i.sock")
    serials+=("$(grep -o 'serial=[^ ]*' "$TMP/$name.$i.serve.log" | head -1)")
  done
  if [ -z "$why" ]; then
    OUT=$TMP/$name.results LOG=$TMP/$name.console
    "$HERE/run-test.sh" "${args[@]}" --log "$LOG" --results "$OUT" --timeout 400 --append "rig.disks=$n" \
      "$GT/vnvme-many-disks.sh" > /dev/null 2> "$TMP/$name.harness"
    RC=$?
    [ $RC = 0 ] || why="$(fail_detail $name)"
  fi
  for i in $(seq $n); do
    kill -TERM "${pids[$((i - 1))]}" 2>/dev/null
  done
  for i in $(seq $n); do
    wait "${pids[$((i - 1))]}" 2>/dev/null
    grep -qiE 'panic|ERROR' "$TMP/$name.$i.serve.log" &&
      why="${why:+$why; }server $i logged errors: $(grep -iE 'panic|ERROR' "$TMP/$name.$i.serve.log" | head -1)"
  done
  # Stable: server 1 again on its socket has the serial it had (namespace ids derive from it).
  "$VNVME" serve --socket "$TMP/$name.1.sock" --ns 64M:ram > "$TMP/$name.again.serve.log" 2>&1 &
  i=$!
  for _ in $(seq 100); do grep -q 'serial=' "$TMP/$name.again.serve.log" && break; sleep 0.1; done
  kill -TERM $i 2>/dev/null; wait $i 2>/dev/null
  again=$(grep -o 'serial=[^ ]*' "$TMP/$name.again.serve.log" | head -1)
  [ -n "${serials[0]}" ] && [ "$again" = "${serials[0]}" ] ||
    why="${why:+$why; }server 1 restarted on its socket: '$again', before '${serials[0]}'"
  [ "$(printf '%s\n' "${serials[@]}" | sort -u | wc -l)" = $n ] || why="${why:+$why; }the servers logged the same serial: ${serials[*]}"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -ah '^TEST: ' "$LOG" | grep -v dmesg | sed 's/^TEST: //' | head -2 | tr '\n' ';') restart keeps ${serials[0]}"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

t_hotplug() {
  local name=hotplug t0 modes="trap shadow adaptive mmap-poll" rounds=5 m r step=0 bg why='' dir qmp
  local spids=() secs dels='' chroot irq=${HOTPLUG_INTERRUPTS:-msi}; t0=$(now)
  if ! has_opt --interrupts; then report SKIP $name 0 "server has no '--interrupts' option"; return; fi
  if ! python3 -c 'import json, socket' 2>/dev/null; then
    report FAIL $name 0 "python3 is not installed (the QMP client, tests/guest/qmp.py, needs it; apt-get install python3)"; return
  fi
  # The QMP socket and the servers' sockets in one folder inside the chroot, so QEMU sees them as they
  # are (a device_add names its socket by QEMU's path); removed at the end.
  chroot=${RIG_CHROOT:-${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}/trixie}
  dir=$(mktemp -d "$chroot/run/vnvme-hotplug.XXXXXX") || { report FAIL $name 0 "no folder in $chroot/run"; return; }
  qmp=$dir/qmp.sock
  for m in $modes; do
    "$VNVME" serve --socket "$dir/$m.sock" --ns 64M:ram --doorbells "$m" --interrupts "$irq" \
      > "$TMP/$name.$m.serve.log" 2>&1 &
    spids+=($!)
  done
  for m in $modes; do
    for _ in $(seq 100); do [ -S "$dir/$m.sock" ] && break; sleep 0.1; done
    [ -S "$dir/$m.sock" ] || why="${why:+$why; }the $m server did not start: $(tail -2 "$TMP/$name.$m.serve.log" | tr '\n' ' ')"
  done
  OUT=$TMP/$name.results LOG=$TMP/$name.console
  if [ -z "$why" ]; then
    "$HERE/run-test.sh" --no-disk --log "$LOG" --results "$OUT" --timeout 420 \
      --qemu-arg -qmp --qemu-arg "unix:${dir#"$chroot"}/qmp.sock,server=on,wait=off" \
      --qemu-arg -device --qemu-arg pcie-root-port,id=rp1,chassis=1,slot=1 \
      --append "rig.nvme_wait=0 rig.modes=$(echo $modes | tr ' ' ,) rig.rounds=$rounds rig.size=8M rig.irq=$irq" \
      "$GT/vnvme-hotplug.sh" > /dev/null 2> "$TMP/$name.harness" &
    bg=$!
    for m in $modes; do
      for r in $(seq $rounds); do
        step=$((step + 1))
        hotplug_ask $bg "$step add $m $r" || { why="the guest never asked for step $step (add $m $r)"; break 2; }
        if ! python3 "$HERE/qmp.py" "$qmp" add "{\"driver\":\"vfio-user-pci\",\"id\":\"vnvme-$m-$r\",\"bus\":\"rp1\",\"socket\":{\"type\":\"unix\",\"path\":\"${dir#"$chroot"}/$m.sock\"}}" 2>> "$TMP/$name.qmp.log"; then
          why="device_add $m round $r failed: $(tail -1 "$TMP/$name.qmp.log")"; break 2
        fi
        step=$((step + 1))
        hotplug_ask $bg "$step del $m $r" || { why="the guest never asked for step $step (del $m $r)"; break 2; }
        if ! secs=$(python3 "$HERE/qmp.py" "$qmp" del "vnvme-$m-$r" 60 2>> "$TMP/$name.qmp.log"); then
          why="device_del $m round $r: $(tail -1 "$TMP/$name.qmp.log")"; break 2
        fi
        dels="$dels $secs"
        # QEMU closes the vfio-user connection when it frees the device: the next add needs the server free.
        for _ in $(seq 100); do
          [ "$(grep -c 'client disconnected' "$TMP/$name.$m.serve.log")" -ge "$r" ] && break; sleep 0.1
        done
        [ "$(grep -c 'client disconnected' "$TMP/$name.$m.serve.log")" -ge "$r" ] ||
          { why="$m round $r: the server did not see QEMU close the connection within 10 s of the device_del"; break 2; }
      done
    done
    # The guest's last step: the first mode's disk once more, left attached at power-off.
    m=${modes%% *} step=$((step + 1))
    if [ -z "$why" ]; then
      if ! hotplug_ask $bg "$step add $m final"; then
        why="the guest never asked for step $step (add $m final)"
      elif ! python3 "$HERE/qmp.py" "$qmp" add "{\"driver\":\"vfio-user-pci\",\"id\":\"vnvme-final\",\"bus\":\"rp1\",\"socket\":{\"type\":\"unix\",\"path\":\"${dir#"$chroot"}/$m.sock\"}}" 2>> "$TMP/$name.qmp.log"; then
        why="the final device_add failed: $(tail -1 "$TMP/$name.qmp.log")"
      fi
    fi
    [ -z "$why" ] || kill -TERM $bg 2>/dev/null   # the guest would wait for a device that never comes
    wait $bg; RC=$?
    [ $RC = 0 ] || why="${why:+$why; }$(fail_detail $name)"
    grep -aq 'Assertion' "$LOG" && why="${why:+$why; }QEMU aborted: $(grep -a 'Assertion' "$LOG" | head -1)"
  fi
  local i=0
  for m in $modes; do
    if kill -0 "${spids[$i]}" 2>/dev/null; then kill -TERM "${spids[$i]}"; else why="${why:+$why; }the $m server died (log $TMP/$name.$m.serve.log)"; fi
    wait "${spids[$i]}" 2>/dev/null
    grep -qiE 'panic|ERROR' "$TMP/$name.$m.serve.log" && why="${why:+$why; }the $m server log has errors: $(grep -iE 'panic|ERROR' "$TMP/$name.$m.serve.log" | head -1)"
    i=$((i + 1))
  done
  rm -rf "$dir"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "--interrupts $irq, $rounds rounds per mode ($modes): attached, 8 MiB verified, detached, the server free again; device_del took$dels s; a last attach served"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}
t_upgrade() {
  local name=upgrade img=$TMP/upgrade.img ctlsock=$TMP/upgrade.ctl reports=$TMP/upgrade.reports t0 why='' watcher
  local first n pids; t0=$(now)
  if ! has_opt --control; then report SKIP $name 0 "server has no '--control' option"; return; fi
  if ! "$VNVME" ctl --help 2>&1 | grep -q upgrade; then report SKIP $name 0 "server has no upgrade method"; return; fi
  : > "$reports"
  if ! start_xserver $name --ns "256M:file=$img" --control "$ctlsock"; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  first=$XPID
  # Once the guest's fio runs: an upgrade every 5 s, 10 in all, each report (JSON) or error on a line.
  ( for _ in $(seq 600); do grep -q 'upgrade: I/O running' "$TMP/$name.console" 2>/dev/null && break; sleep 0.5; done
    sleep 3
    for i in $(seq 10); do
      "$VNVME" ctl --control "$ctlsock" upgrade >> "$reports" 2>&1 || echo "upgrade $i failed" >> "$reports"
      sleep 5
    done ) &
  watcher=$!
  boot $name "$GT/vnvme-upgrade.sh" --timeout 400
  [ $RC = 0 ] || why="$(fail_detail $name)"
  for _ in $(seq 100); do kill -0 "$watcher" 2>/dev/null || break; sleep 0.5; done
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  wait "$first" 2>/dev/null   # the first server exits at its handover: reap it
  n=$(grep -c '"phases_ms"' "$reports")
  [ "$n" = 10 ] || why="${why:+$why; }$n of 10 upgrades done: $(grep -v phases_ms "$reports" | head -3 | tr '\n' ' ')"
  pids=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$reports" | tr '\n' ' ')
  # The last new process serves now: stop_xserver stops it (and checks it is alive and the log clean).
  XPID=$(echo "$pids" | awk '{print $NF}')
  [ -n "$XPID" ] || XPID=$first
  stop_xserver; [ -z "$XMSG" ] || why="${why:+$why; }$XMSG"
  rm -f "$img"
  # Phases per upgrade (ms), and what the guest saw.
  echo "upgrade phases (ms: drain save pass restore total):" > "$TMP/$name.summary"
  sed -n 's/.*"drain":\([0-9.]*\),"pass":\([0-9.]*\),"restore":\([0-9.]*\),"save":\([0-9.]*\)}.*"total_ms":\([0-9.]*\).*/  \1 \4 \2 \3 \5/p' "$reports" >> "$TMP/$name.summary"
  grep -h '^RESULT' "$OUT" >> "$TMP/$name.summary" 2>/dev/null
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "10 upgrades (pids $pids); $(grep -h 'clat_max' "$OUT" | sed 's/^RESULT //'); $(grep -h 'stalls_ms' "$OUT" | sed 's/^RESULT //'); phases in $TMP/$name.summary"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
  cat "$TMP/$name.summary"
}
# The supervisor's log lines that name the server it watches, in $XLOG.
supervising() { grep -c 'supervising the server, pid' "$XLOG"; }
wait_supervising() { for _ in $(seq 100); do [ "$(supervising)" -gt "$1" ] && break; sleep 0.1; done; }
# kill_supervised WHAT FILE: SIGKILLs the server the supervisor logging to $XLOG watches, waits until
# it watches the next (restored) one, and says so in FILE.
kill_supervised() {
  local n pid
  n=$(supervising)
  pid=$(sed -n 's/.*supervising the server, pid \([0-9]*\).*/\1/p' "$XLOG" | tail -1)
  if [ -z "$pid" ] || ! kill -KILL "$pid" 2>/dev/null; then echo "$1: no server to kill" >> "$2"; return; fi
  wait_supervising "$n"
  echo "$1: pid $pid" >> "$2"
}
# restored_kills N FILE: why the supervisor's $XLOG does not show N SIGKILLs, each followed by a
# restore on the same connection (FILE: the host's record of its kills), if so.
restored_kills() {
  local n w=''
  n=$(grep -c 'died (signal: 9 (SIGKILL)) holding a client' "$XLOG")
  [ "$n" = "$1" ] || w="$n of $1 kills seen by the supervisor: $(grep kill "$2" | head -5 | tr '\n' ' ')"
  n=$(grep -c 'starting a new server that serves the client on its connection' "$XLOG")
  [ "$n" = "$1" ] || w="${w:+$w; }$n of $1 restores: $(grep -o 'the client cannot be restored.*' "$XLOG" | head -2 | tr '\n' ' ')"
  echo "$w"
}
t_crash() { crash_test crash "" vnvme-crash.sh; }
# crash-zns: the crash test on a zoned file namespace (tests/vnvme-crash-zns.sh)
t_crash-zns() { crash_test crash-zns ",zoned,zone-size=2M" vnvme-crash-zns.sh; }
# crash_test NAME NS-OPTIONS SCRIPT: 5 SIGKILLs of the supervised server under the guest's SCRIPT
crash_test() {
  local name=$1 img=$TMP/$1.img kills=$TMP/$1.kills t0 why='' watcher n pid
  t0=$(now)
  if ! has_opt --supervise; then report SKIP $name 0 "server has no '--supervise' option"; return; fi
  : > "$kills"
  if ! start_xserver $name --supervise --ns "256M:file=$img$2"; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  # Once the guest's fio runs: a SIGKILL of the supervised server every 5 s, 5 in all, each once the
  # server before it is serving (the supervisor's "supervising the server, pid N" line).
  ( for _ in $(seq 600); do grep -q 'crash: I/O running' "$TMP/$name.console" 2>/dev/null && break; sleep 0.5; done
    sleep 4
    for i in $(seq 5); do
      kill_supervised "kill $i" "$kills"
      sleep 5
    done ) &
  watcher=$!
  boot $name "$GT/$3" --timeout 240
  [ $RC = 0 ] || why="$(fail_detail $name)"
  for _ in $(seq 100); do kill -0 "$watcher" 2>/dev/null || break; sleep 0.5; done
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  n=$(restored_kills 5 "$kills"); [ -z "$n" ] || why="${why:+$why; }$n"
  # The deaths are errors in the log by design; anything else is not.
  local other; other=$(grep -iE 'panic|ERROR' "$XLOG" | grep -v 'died (signal: 9 (SIGKILL)) holding a client' | head -2 | tr '\n' ' ')
  kill -0 "$XPID" 2>/dev/null || why="${why:+$why; }the supervisor died (log $XLOG)"
  stop_xserver
  [ -z "$other" ] || why="${why:+$why; }errors in the server's log: $other"
  rm -f "$img"
  {
    echo "crash: per kill, the supervisor's log (the death, the new server, its restore):"
    grep -E 'died \(signal|supervising the server, pid|restoring the client from|commands in flight at the crash' "$XLOG" \
      | sed -E -e 's/^([^ ]*) .* ([0-9]+ commands in flight at the crash completed with Command Interrupted).*/  \1 \2/;t' \
        -e 's/^([^ ]*) .*(died|supervising the server, pid [0-9]*|restoring the client from the crash area.s slot [0-9]*|[0-9]* commands in flight at the crash completed with Command Interrupted).*/  \1 \2/'
    grep -h '^RESULT' "$OUT" 2>/dev/null
    grep -h 'TEST: dmesg' "$LOG" 2>/dev/null | head -20
  } > "$TMP/$name.summary"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "5 kills, 5 restores on the same connection; $(grep -h '"name":"crash"' "$OUT" | sed 's/^RESULT //'); $(grep -h 'stalls_ms' "$OUT" | sed 's/^RESULT //'); details in $TMP/$name.summary"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
  cat "$TMP/$name.summary"
}
# crash-upgrade: a supervised server upgraded 3 times (vnvme ctl upgrade twice, SIGUSR2 to the
# supervisor once) and SIGKILLed 3 times, interleaved, while the guest runs the crash test's fio verify
t_crash-upgrade() {
  local name=crash-upgrade img=$TMP/crash-upgrade.img ctlsock=$TMP/crash-upgrade.ctl
  local events=$TMP/crash-upgrade.events t0 why='' watcher n other
  t0=$(now)
  if ! has_opt --supervise; then report SKIP $name 0 "server has no '--supervise' option"; return; fi
  : > "$events"
  if ! start_xserver $name --supervise --ns "256M:file=$img" --control "$ctlsock"; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  # Once the guest's fio runs: an upgrade, 3 s, a kill, 3 s; three times. Each waits until the
  # supervisor watches the next server.
  ( for _ in $(seq 600); do grep -q "$name: I/O running" "$TMP/$name.console" 2>/dev/null && break; sleep 0.5; done
    sleep 4
    for i in 1 2 3; do
      n=$(supervising)
      if [ $i = 3 ]; then
        kill -USR2 "$XPID" && echo "upgrade $i: SIGUSR2 to the supervisor" >> "$events"
      else
        "$VNVME" ctl --control "$ctlsock" upgrade >> "$events" 2>&1 || echo "upgrade $i failed" >> "$events"
      fi
      wait_supervising "$n"
      sleep 3
      kill_supervised "kill $i" "$events"
      sleep 3
    done ) &
  watcher=$!
  boot $name "$GT/vnvme-crash.sh" --timeout 240 --append "rig.name=$name"
  [ $RC = 0 ] || why="$(fail_detail $name)"
  for _ in $(seq 100); do kill -0 "$watcher" 2>/dev/null || break; sleep 0.5; done
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  n=$(grep -c 'handed over to a new process running' "$XLOG")
  [ "$n" = 3 ] || why="${why:+$why; }$n of 3 upgrades seen by the supervisor: $(grep upgrade "$events" | head -3 | tr '\n' ' ')"
  n=$(restored_kills 3 "$events"); [ -z "$n" ] || why="${why:+$why; }$n"
  other=$(grep -iE 'panic|ERROR' "$XLOG" | grep -v 'died (signal: 9 (SIGKILL)) holding a client' | head -2 | tr '\n' ' ')
  kill -0 "$XPID" 2>/dev/null || why="${why:+$why; }the supervisor died (log $XLOG)"
  stop_xserver
  [ -z "$other" ] || why="${why:+$why; }errors in the server's log: $other"
  rm -f "$img"
  {
    echo "$name: the host's events, then the supervisor's log:"
    sed 's/^/  /' "$events"
    grep -E 'died \(signal|handed over to a new process|supervising the server, pid|restoring the client from' "$XLOG" \
      | sed -E -e 's/^([^ ]*) .*(handed over to a new process).*(supervising the server, pid [0-9]*).*/  \1 \2, \3/;t' \
        -e 's/^([^ ]*) .*(died|supervising the server, pid [0-9]*|restoring the client from the crash area.s slot [0-9]*).*/  \1 \2/'
    grep -h '^RESULT' "$OUT" 2>/dev/null
  } > "$TMP/$name.summary"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "3 upgrades and 3 kills on the same connection; $(grep -h "\"name\":\"$name\"" "$OUT" | sed 's/^RESULT //'); $(grep -h 'stalls_ms' "$OUT" | sed 's/^RESULT //'); details in $TMP/$name.summary"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
  cat "$TMP/$name.summary"
}
# upgrade-many: a server of several controllers ([[controllers]]) upgraded live under a VM using both
t_upgrade-many() {
  local name=upgrade-many cfg=$TMP/upgrade-many.toml reports=$TMP/upgrade-many.reports t0 why='' watcher
  local first n pids i log=$TMP/upgrade-many.serve.log; t0=$(now)
  : > "$reports"
  {
    echo "workers = 1"
    for i in 1 2; do
      printf '\n[[controllers]]\nsocket = "%s"\n' "$TMP/$name.$i.sock"
      [ $i = 1 ] && printf 'control = "%s"\n' "$TMP/$name.ctl"
      printf '[[controllers.namespaces]]\nsize = "128M"\nbackend = "file"\npath = "%s"\n' "$TMP/$name.$i.img"
    done
  } > "$cfg"
  "$VNVME" serve --config "$cfg" > "$log" 2>&1 &
  first=$!
  for _ in $(seq 100); do [ -S "$TMP/$name.2.sock" ] && [ -S "$TMP/$name.ctl" ] && break; sleep 0.1; done
  if ! [ -S "$TMP/$name.2.sock" ]; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$log" | tr '\n' ' ')"
    kill -TERM $first 2>/dev/null; wait $first 2>/dev/null; return
  fi
  ( for _ in $(seq 600); do grep -q 'upgrade-many: I/O running' "$TMP/$name.console" 2>/dev/null && break; sleep 0.5; done
    sleep 3
    for i in $(seq 5); do
      "$VNVME" ctl --control "$TMP/$name.ctl" upgrade >> "$reports" 2>&1 || echo "upgrade $i failed" >> "$reports"
      sleep 5
    done ) &
  watcher=$!
  OUT=$TMP/$name.results LOG=$TMP/$name.console
  "$HERE/run-test.sh" --vfio-user "$TMP/$name.1.sock" --vfio-user "$TMP/$name.2.sock" --log "$LOG" \
    --results "$OUT" --timeout 400 "$GT/vnvme-upgrade-many.sh" > /dev/null 2> "$TMP/$name.harness"
  RC=$?
  [ $RC = 0 ] || why="$(fail_detail $name)"
  for _ in $(seq 100); do kill -0 "$watcher" 2>/dev/null || break; sleep 0.5; done
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  wait "$first" 2>/dev/null   # the first process exits at its handover: reap it
  n=$(grep -c '"phases_ms"' "$reports")
  [ "$n" = 5 ] || why="${why:+$why; }$n of 5 upgrades done: $(grep -v phases_ms "$reports" | head -3 | tr '\n' ' ')"
  pids=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$reports" | tr '\n' ' ')
  # The last process serves now: it must be alive, stop on SIGTERM, and have logged no error.
  XPID=$(echo "$pids" | awk '{print $NF}') XLOG=$log
  [ -n "$XPID" ] || XPID=$first
  stop_xserver; [ -z "$XMSG" ] || why="${why:+$why; }$XMSG"
  rm -f "$TMP/$name".*.img
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "5 upgrades (pids $pids); $(tr '\n' ' ' < "$OUT")"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

t_upgrade-background() {
  local name=upgrade-background img=$TMP/upgrade-background.img ctlsock=$TMP/upgrade-background.ctl
  local reports=$TMP/upgrade-background.reports t0 why='' watcher first pids; t0=$(now)
  if ! has_opt --control || ! has_opt --sanitize-rate; then report SKIP $name 0 "server has no '--control' or '--sanitize-rate' option"; return; fi
  : > "$reports"
  if ! start_xserver $name --ns "64M:file=$img" --sanitize-rate 4M --control "$ctlsock"; then
    report FAIL $name "$(since "$t0")" "server did not start: $(tail -3 "$XLOG" | tr '\n' ' ')"; stop_xserver; return
  fi
  first=$XPID
  # At each "UPGRADE-ASK n" of the guest: an upgrade, done before the guest's "UPGRADE-RESUME n".
  ( for n in 1 2; do
      for _ in $(seq 1200); do grep -q "UPGRADE-ASK $n" "$TMP/$name.console" 2>/dev/null && break; sleep 0.2; done
      grep -q "UPGRADE-ASK $n" "$TMP/$name.console" 2>/dev/null || { echo "the guest never asked for upgrade $n" >> "$reports"; exit; }
      "$VNVME" ctl --control "$ctlsock" upgrade >> "$reports" 2>&1 || echo "upgrade $n failed" >> "$reports"
      grep -q "UPGRADE-RESUME $n" "$TMP/$name.console" && echo "the guest went on before upgrade $n was done" >> "$reports"
    done ) &
  watcher=$!
  boot $name "$GT/vnvme-upgrade-background.sh" --timeout 300
  [ $RC = 0 ] || why="$(fail_detail $name)"
  for _ in $(seq 100); do kill -0 "$watcher" 2>/dev/null || break; sleep 0.5; done
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  wait "$first" 2>/dev/null   # the first server exits at its handover: reap it
  [ "$(grep -c '"phases_ms"' "$reports")" = 2 ] || why="${why:+$why; }$(grep -v phases_ms "$reports" | head -3 | tr '\n' ' ')"
  pids=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$reports" | tr '\n' ' ')
  XPID=$(echo "$pids" | awk '{print $NF}')
  [ -n "$XPID" ] || XPID=$first
  stop_xserver; [ -z "$XMSG" ] || why="${why:+$why; }$XMSG"
  rm -f "$img"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "2 upgrades (pids $pids); $(grep -h '^TEST: \(firmware\|sanitize\):' "$LOG" | sed 's/^TEST: //' | tr '\n' ';')"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}
# hotplug_ask PID STEP: wait (up to 2 min) until the console $LOG shows "HOTPLUG-ASK STEP" while PID runs
hotplug_ask() {
  local waited=0
  while ! { [ -f "$LOG" ] && tr -d '\r' < "$LOG" | grep -aq "HOTPLUG-ASK $2\$"; }; do
    kill -0 "$1" 2>/dev/null && [ $waited -lt 600 ] || return 1
    sleep 0.2; waited=$((waited + 1))
  done
  return 0
}

# --- one subsystem, two controllers (serve --socket A --socket B): multipath and shared-disk ---
subsys_start() {   # NAME [NS]: starts the subsystem server (its namespace NS, 256M:ram by default) in
  # $TMP/NAME/; sets SUB_DIR SUB_PID; 1 with SUB_WHY if not
  SUB_DIR=$TMP/$1 SUB_WHY=''
  mkdir -p "$SUB_DIR"
  "$VNVME" serve --socket "$SUB_DIR/a.sock" --socket "$SUB_DIR/b.sock" --ns "${2:-256M:ram}" \
    --control "$SUB_DIR/ctl.sock" > "$SUB_DIR/serve.log" 2>&1 &
  SUB_PID=$!
  for _ in $(seq 100); do
    [ -S "$SUB_DIR/a.sock" ] && [ -S "$SUB_DIR/b.sock" ] && [ -S "$SUB_DIR/ctl.sock" ] && return 0
    kill -0 "$SUB_PID" 2>/dev/null || break; sleep 0.1
  done
  SUB_WHY="server did not start: $(tail -3 "$SUB_DIR/serve.log" | tr '\n' ' ')"
  return 1
}
subsys_stop() {   # appends to SUB_WHY what is wrong with the server (died, errors in its log)
  kill -0 "$SUB_PID" 2>/dev/null || SUB_WHY="${SUB_WHY:+$SUB_WHY; }the server died (log $SUB_DIR/serve.log)"
  kill -TERM "$SUB_PID" 2>/dev/null
  wait "$SUB_PID" 2>/dev/null
  grep -qiE 'panic|ERROR' "$SUB_DIR/serve.log" &&
    SUB_WHY="${SUB_WHY:+$SUB_WHY; }server log has errors: $(grep -iE 'panic|ERROR' "$SUB_DIR/serve.log" | head -2 | tr '\n' ' ')"
}
sub_ctl() { "$VNVME" ctl --control "$SUB_DIR/ctl.sock" --json "$@"; }
sub_successes() {   # CNTLID: successful completions of that controller so far
  sub_ctl stats "controller=$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["completions"].get("success", 0))'
}
console_has() { [ -f "$1" ] && tr -d '\r' < "$1" | grep -aq "$2"; }

t_multipath() {
  local name=multipath t0 why='' rpid state=optimized n=0 a1 a2 b1 b2 d1 d2 windows='' bad=''; t0=$(now)
  has_opt 'CNTLID' || { report SKIP $name 0 "server has no subsystem (several --socket)"; return; }
  if ! subsys_start $name; then report FAIL $name "$(since "$t0")" "$SUB_WHY"; subsys_stop; return; fi
  OUT=$TMP/$name.results LOG=$TMP/$name.console
  "$HERE/run-test.sh" --vfio-user "$SUB_DIR/a.sock" --vfio-user "$SUB_DIR/b.sock" --log "$LOG" --results "$OUT" \
    --timeout 400 --append "rig.runtime=30 rig.nvme_wait=0" "$GT/vnvme-multipath.sh" > /dev/null 2> "$TMP/$name.harness" &
  rpid=$!
  # Flip controller 2 every 3 s while the guest's fio runs; count each controller's successes per window
  # (from 0.5 s after the change, so the host has read the ANA log).
  while kill -0 $rpid 2>/dev/null && ! console_has "$LOG" 'TEST: fio starts'; do sleep 0.2; done
  # The first flip waits for fio's I/O on both paths: a TCG guest on a loaded host can take seconds to
  # start fio, and a window before its first I/O would count nothing on either controller.
  a1=$(sub_successes 1); a2=$(sub_successes 2)
  while kill -0 $rpid 2>/dev/null && ! console_has "$LOG" 'TEST: fio done' &&
    { [ "$(sub_successes 1)" -le "$a1" ] || [ "$(sub_successes 2)" -le "$a2" ]; }; do sleep 0.2; done
  while kill -0 $rpid 2>/dev/null && ! console_has "$LOG" 'TEST: fio done'; do
    if [ $state = optimized ]; then state=inaccessible; else state=optimized; fi
    sub_ctl ana_set controller=2 state=$state > /dev/null || bad="${bad:+$bad; }ana_set $state failed"
    sleep 0.5
    a1=$(sub_successes 1); a2=$(sub_successes 2)
    sleep 2.5
    console_has "$LOG" 'TEST: fio done' && break
    b1=$(sub_successes 1); b2=$(sub_successes 2)
    d1=$((b1 - a1)) d2=$((b2 - a2)) n=$((n + 1))
    windows="$windows $state:$d1/$d2"
    case $state in
      optimized) [ $d1 -gt 0 ] && [ $d2 -gt 10 ] || bad="${bad:+$bad; }window $n both optimized: $d1 on 1, $d2 on 2" ;;
      inaccessible) [ $d1 -gt 0 ] && [ $d2 -le 10 ] || bad="${bad:+$bad; }window $n 2 inaccessible: $d1 on 1, $d2 on 2" ;;
    esac
  done
  sub_ctl ana_set controller=2 state=optimized > /dev/null
  wait $rpid; RC=$?
  subsys_stop
  [ $RC = 0 ] || why="$(fail_detail $name)"
  case $windows in *optimized:*) ;; *) why="${why:+$why; }no window with both optimized measured" ;; esac
  case $windows in *inaccessible:*) ;; *) why="${why:+$why; }no window with controller 2 inaccessible measured" ;; esac
  why="${why:+$why; }$bad"; why=${why#; }
  [ -z "$SUB_WHY" ] || why="${why:+$why; }$SUB_WHY"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$(grep -ah '^TEST: ' "$LOG" | grep -v dmesg | sed 's/^TEST: //' | tail -1) successes 1/2 per window:$windows"
  else
    report FAIL $name "$(since "$t0")" "$why (windows:$windows)"
  fi
}

t_shared-disk() {
  local name=shared-disk t0 why='' pa pb rca rcb na nb; t0=$(now)
  has_opt 'CNTLID' || { report SKIP $name 0 "server has no subsystem (several --socket)"; return; }
  if ! subsys_start $name; then report FAIL $name "$(since "$t0")" "$SUB_WHY"; subsys_stop; return; fi
  # Two small TCG VMs on a shared machine: 512 MiB each, a long timeout.
  RIG_MEM=512M "$HERE/run-test.sh" --vfio-user "$SUB_DIR/a.sock" --log "$TMP/$name.a.console" --timeout 500 \
    --append "rig.role=a" "$GT/vnvme-shared-disk.sh" > /dev/null 2> "$TMP/$name.a.harness" &
  pa=$!
  RIG_MEM=512M "$HERE/run-test.sh" --vfio-user "$SUB_DIR/b.sock" --log "$TMP/$name.b.console" --timeout 500 \
    --append "rig.role=b" "$GT/vnvme-shared-disk.sh" > /dev/null 2> "$TMP/$name.b.harness" &
  pb=$!
  wait $pa; rca=$?
  wait $pb; rcb=$?
  subsys_stop
  LOG=$TMP/$name.a.console RC=$rca
  [ $rca = 0 ] || why="VM a: $(fail_detail $name.a)"
  LOG=$TMP/$name.b.console RC=$rcb
  [ $rcb = 0 ] || why="${why:+$why; }VM b: $(fail_detail $name.b)"
  na=$(tr -d '\r' < "$TMP/$name.a.console" | sed -n 's/^TEST: NGUID=//p' | head -1)
  nb=$(tr -d '\r' < "$TMP/$name.b.console" | sed -n 's/^TEST: NGUID=//p' | head -1)
  [ -n "$na" ] && [ "$na" = "$nb" ] || why="${why:+$why; }NGUIDs differ: a '$na', b '$nb'"
  [ -z "$SUB_WHY" ] || why="${why:+$why; }$SUB_WHY"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "NGUID $na in both; $(tr -d '\r' < "$TMP/$name.a.console" | grep -a '^TEST: read' | sed 's/^TEST: //'); $(tr -d '\r' < "$TMP/$name.b.console" | grep -a '^TEST: read' | sed 's/^TEST: //')"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

sub_completions() {   # CNTLID STATUS: that controller's completions with STATUS (its stats name) so far
  sub_ctl stats "controller=$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["completions"].get(sys.argv[1], 0))' "$2"
}

t_shared-reservations() {
  local name=shared-reservations t0 why='' pa pb rca rcb aborted c1 c2; t0=$(now)
  has_opt 'CNTLID' || { report SKIP $name 0 "server has no subsystem (several --socket)"; return; }
  # A file namespace: its writes are in flight in io_uring, where a preempt and abort can meet them.
  if ! subsys_start $name "256M:file=$TMP/$name/disk.img"; then
    report FAIL $name "$(since "$t0")" "$SUB_WHY"; subsys_stop; return
  fi
  RIG_MEM=512M "$HERE/run-test.sh" --vfio-user "$SUB_DIR/a.sock" --log "$TMP/$name.a.console" --timeout 600 \
    --append "rig.role=a" "$GT/vnvme-shared-reservations.sh" > /dev/null 2> "$TMP/$name.a.harness" &
  pa=$!
  RIG_MEM=512M "$HERE/run-test.sh" --vfio-user "$SUB_DIR/b.sock" --log "$TMP/$name.b.console" --timeout 600 \
    --append "rig.role=b" "$GT/vnvme-shared-reservations.sh" > /dev/null 2> "$TMP/$name.b.harness" &
  pb=$!
  wait $pa; rca=$?
  wait $pb; rcb=$?
  aborted=$(sub_completions 1 aborted-preempt-and-abort)
  c1=$(sub_completions 1 reservation-conflict) c2=$(sub_completions 2 reservation-conflict)
  subsys_stop
  LOG=$TMP/$name.a.console RC=$rca
  [ $rca = 0 ] || why="VM a: $(fail_detail $name.a)"
  LOG=$TMP/$name.b.console RC=$rcb
  [ $rcb = 0 ] || why="${why:+$why; }VM b: $(fail_detail $name.b)"
  [ "${c1:-0}" -gt 0 ] && [ "${c2:-0}" -gt 0 ] || why="${why:+$why; }Reservation Conflicts: $c1 on 1, $c2 on 2"
  [ -z "$SUB_WHY" ] || why="${why:+$why; }$SUB_WHY"
  if [ -z "$why" ]; then
    report PASS $name "$(since "$t0")" "$aborted of A's commands aborted by B's preempt and abort; Reservation Conflicts $c1 on A, $c2 on B; $(tr -d '\r' < "$TMP/$name.a.console" | grep -a '^TEST: fio exit' | sed 's/^TEST: //' | cut -c1-120)"
  else
    report FAIL $name "$(since "$t0")" "$why"
  fi
}

T0=$(now)
for t in $ONLY; do
  if ! server_alive; then
    report FAIL "$t" 0 "the server is not running any more (log $SLOG)"
    continue
  fi
  "t_$t"
done

if [ $COMPARE = 1 ]; then   # reference figures, not a test
  "$HERE/run-test.sh" --qemu-nvme --timeout 180 --append "rig.runtime=$RT rig.qds=1,32" \
    --results "$TMP/qemu-nvme.results" "$GT/vnvme-randread.sh" > /dev/null 2>&1
  echo "reference: QEMU built-in nvme (null-co) randread IOPS $(iops_of "$TMP/qemu-nvme.results")"
  [ -f "$TMP/randread.results" ] && echo "reference: vnvme (RAM)               randread IOPS $(iops_of "$TMP/randread.results")"
fi

server_alive || { echo "run-vnvme-tests: the server exited during the suite (log $SLOG)"; FAILED=$((FAILED + 1)); }
if grep -qiE 'panic|ERROR' "$SLOG"; then
  echo "run-vnvme-tests: server log has errors:"; grep -iE 'panic|ERROR' "$SLOG" | head -5 | sed 's/^/  /'
fi
echo "run-vnvme-tests: $(since "$T0")s total, $SKIPPED skipped, $CHECKS_SKIPPED checks skipped inside passing or failing tests (guest $RIG_RELEASE)"
echo "$PASSED passed, $FAILED failed"
[ $FAILED = 0 ]
