#!/usr/bin/env bash
# run-guest.sh - boot the rig guest (built by build-guest.sh) under QEMU (TCG) from the Debian chroot,
# with QEMU's built-in emulated NVMe controller backed by a null block device.
#
# usage: run-guest.sh [TEST_SCRIPT]
#   TEST_SCRIPT (host path) is appended to the initramfs as /test.sh and run by /init (with busybox sh,
#   cwd /tmp), whose output goes to the serial console (stdout); /init then prints "RIG-EXIT=<status>"
#   and the guest powers off. guest-lib.sh (next to this script) is always appended as /guest-lib.sh.
#   Without TEST_SCRIPT, /init runs /tests/$NAME.sh if rig.test=NAME is in RIG_APPEND, or a shell with
#   rig.shell. For a harness with exit status, timeout and log file, use run-test.sh.
#
# Variables (all optional):
#   VNVME_RIG_CACHE cache root (default ~/.cache/vnvme-rig)
#   RIG_CHROOT     Debian trixie chroot holding qemu-system-x86 (default $VNVME_RIG_CACHE/trixie)
#   RIG_OUT        where build-guest.sh put vmlinuz + initramfs.cpio[.gz] (default $VNVME_RIG_CACHE/guest,
#                  or $VNVME_RIG_CACHE/guest-RELEASE with RIG_RELEASE other than trixie: setup.sh --guest-release)
#   RIG_MEM        guest RAM, also the memfd backend size (default 1G)
#   RIG_SMP        vCPUs (default 2)
#   RIG_CPU        -cpu model (default: QEMU's default)
#   RIG_APPEND     extra kernel command line, e.g. "nvme.poll_queues=1"
#   RIG_NVME       extra -device nvme properties, e.g. "dbcs=off" (comma-separated)
#   RIG_NO_NVME    1 = do not add the built-in nvme device (e.g. when attaching vfio-user-pci)
#   RIG_VFIO_USER  paths of vfio-user server sockets (space-separated), as seen INSIDE the chroot (e.g. /tmp/vnvme.sock);
#                  adds one QEMU vfio-user-pci device connected to each (run-test.sh maps host paths for you)
#   RIG_TRACE      QEMU trace event pattern(s), comma-separated, e.g. "pci_nvme_mmio_doorbell*"
#   RIG_TRACE_FILE host path to copy the trace log to (default $RIG_OUT/trace.log)
#   RIG_TIMESTAMP  1 = prefix console lines with host seconds since QEMU start
#   RIG_QEMU_ARGS  extra raw QEMU arguments (word-split)
#   RIG_PIDFILE    host path: write QEMU's pid there once it is started (to kill it mid-test)
#   RIG_QEMU_USER  UID:GID: run QEMU as that user with that one group (chroot --userspec; numbers, so the
#                  chroot needs no entry for them); the staged kernel and initrd are made readable to it
#   RIG_GUEST_FILES host paths, space-separated: each is appended to the initramfs as /BASENAME
#                  (e.g. a static program a test runs: nvme-sync-read)
#   RIG_BOOT       kernel (default: QEMU's -kernel/-initrd/-append) | disk: the firmware boots the first
#                  vfio-user device (bootindex 0), no -kernel; the disk holds kernel, initramfs, test and
#                  command line (make-boot-image.sh), and TEST_SCRIPT is then not used; no NIC (-nic none)
#   RIG_FIRMWARE   -bios FILE, a path INSIDE the chroot (default: QEMU's, SeaBIOS), e.g.
#                  /usr/share/ovmf/OVMF.fd (Debian's ovmf: UEFI, variables in memory only)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}
CHROOT=${RIG_CHROOT:-$CACHE/trixie}
case ${RIG_RELEASE:-trixie} in trixie) OUT=${RIG_OUT:-$CACHE/guest} ;; *) OUT=${RIG_OUT:-$CACHE/guest-$RIG_RELEASE} ;; esac
MEM=${RIG_MEM:-1G}
SMP=${RIG_SMP:-2}
TEST=${1:-}

INITRD="$OUT/initramfs.cpio.gz"; [ -f "$INITRD" ] || INITRD="$OUT/initramfs.cpio"
[ -f "$OUT/vmlinuz" ] && [ -f "$INITRD" ] || { echo "run-guest: no guest in $OUT: run tests/guest/setup.sh${RIG_RELEASE:+ --guest-release $RIG_RELEASE} first" >&2; exit 1; }
[ -x "$CHROOT/usr/bin/qemu-system-x86_64" ] || { echo "run-guest: no QEMU in $CHROOT: run tests/guest/setup.sh first" >&2; exit 1; }
[ -z "$TEST" ] || [ -f "$TEST" ] || { echo "run-guest: no such test script: $TEST" >&2; exit 1; }
mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"

# stage kernel/initrd where the chrooted QEMU can see them
RUN=$(mktemp -d "$CHROOT/tmp/rigrun.XXXXXX")
RUNREL=${RUN#"$CHROOT"}
QPID=
cleanup() {
  [ -n "$QPID" ] && kill "$QPID" 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
cp "$OUT/vmlinuz" "$RUN/vmlinuz"
# second archive: /guest-lib.sh, /test.sh and the guest files. The kernel unpacks concatenated archives
# (later files win), but each must start 4-byte aligned (zero padding between them is skipped).
mkdir -p "$RUN/t"
[ -f "$HERE/guest-lib.sh" ] && cp "$HERE/guest-lib.sh" "$RUN/t/guest-lib.sh"
[ -n "$TEST" ] && cp "$TEST" "$RUN/t/test.sh"
for f in ${RIG_GUEST_FILES:-}; do
  case $(basename "$f") in
    guest-lib.sh|test.sh) echo "run-guest: guest file $f would replace /$(basename "$f")" >&2; exit 1 ;;
  esac
  [ -f "$f" ] || { echo "run-guest: no such guest file: $f" >&2; exit 1; }
  cp "$f" "$RUN/t/"
done
chmod 755 "$RUN"/t/* 2>/dev/null || true
(cd "$RUN/t" && ls -1 | "$CHROOT/usr/bin/busybox" cpio -o -H newc 2>/dev/null) > "$RUN/extra.cpio"
cp "$INITRD" "$RUN/initrd"
pad=$(( (4 - $(stat -c %s "$RUN/initrd") % 4) % 4 ))
head -c "$pad" /dev/zero >> "$RUN/initrd"
cat "$RUN/extra.cpio" >> "$RUN/initrd"

BOOT=${RIG_BOOT:-kernel}
case $BOOT in kernel|disk) ;; *) echo "run-guest: RIG_BOOT is kernel or disk, not '$BOOT'" >&2; exit 1 ;; esac
[ "$BOOT" = kernel ] || [ -n "${RIG_VFIO_USER:-}" ] || { echo "run-guest: RIG_BOOT=disk boots a vfio-user device: set RIG_VFIO_USER" >&2; exit 1; }
ARGS=(-accel tcg -nographic -no-reboot -m "$MEM" -smp "$SMP"
      -object "memory-backend-memfd,id=mem,size=$MEM,share=on" -machine q35,memory-backend=mem)
if [ "$BOOT" = kernel ]; then
  ARGS+=(-kernel "$RUNREL/vmlinuz" -initrd "$RUNREL/initrd" -append "console=ttyS0 panic=-1 quiet ${RIG_APPEND:-}")
else
  ARGS+=(-nic none)   # nothing to network-boot from if the disk fails
fi
if [ -n "${RIG_FIRMWARE:-}" ]; then
  [ -f "$CHROOT$RIG_FIRMWARE" ] || { echo "run-guest: no firmware $RIG_FIRMWARE in $CHROOT (RIG_FIRMWARE)" >&2; exit 1; }
  ARGS+=(-bios "$RIG_FIRMWARE")
fi
[ -n "${RIG_CPU:-}" ] && ARGS+=(-cpu "$RIG_CPU")
if [ "${RIG_NO_NVME:-0}" != 1 ]; then
  ARGS+=(-drive id=nvm,if=none,file=null-co://,file.read-zeroes=off,format=raw
         -device "nvme,serial=deadbeef,drive=nvm${RIG_NVME:+,$RIG_NVME}")
fi
BOOTINDEX=''; [ "$BOOT" = disk ] && BOOTINDEX=',"bootindex":0'   # the first device is the boot disk
for s in ${RIG_VFIO_USER:-}; do
  ARGS+=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$s\",\"type\":\"unix\"}$BOOTINDEX}")
  BOOTINDEX=''
done
if [ -n "${RIG_TRACE:-}" ]; then
  IFS=, read -ra EV <<< "$RIG_TRACE"
  for e in "${EV[@]}"; do ARGS+=(-trace "enable=$e"); done
  ARGS+=(-D "$RUNREL/trace.log")
fi
# shellcheck disable=SC2206
[ -n "${RIG_QEMU_ARGS:-}" ] && ARGS+=(${RIG_QEMU_ARGS})

# QEMU runs in the background so that its pid is known (chroot execs it: $! is QEMU's pid)
CHROOT_AS=()
if [ -n "${RIG_QEMU_USER:-}" ]; then
  chmod 755 "$RUN"   # mktemp -d made it 0700: the user must read vmlinuz and initrd in it
  CHROOT_AS=(--userspec="$RIG_QEMU_USER" --groups="${RIG_QEMU_USER#*:}")
fi
set +e
if [ "${RIG_TIMESTAMP:-0}" = 1 ]; then
  t0=${EPOCHREALTIME/./}
  chroot "${CHROOT_AS[@]}" "$CHROOT" qemu-system-x86_64 "${ARGS[@]}" </dev/null > >(while IFS= read -r l; do
    d=$(( ${EPOCHREALTIME/./} - t0 )); printf '[%4d.%03d] %s\n' $((d/1000000)) $(((d/1000)%1000)) "${l%$'\r'}"
  done) 2>&1 &
else
  chroot "${CHROOT_AS[@]}" "$CHROOT" qemu-system-x86_64 "${ARGS[@]}" </dev/null &
fi
QPID=$!
[ -n "${RIG_PIDFILE:-}" ] && echo "$QPID" > "$RIG_PIDFILE"
wait "$QPID"
rc=$?
QPID=
set -e
if [ -n "${RIG_TRACE:-}" ] && [ -f "$RUN/trace.log" ]; then
  mv "$RUN/trace.log" "${RIG_TRACE_FILE:-$OUT/trace.log}"
fi
exit $rc
