#!/usr/bin/env bash
# setup.sh - install the vnvme guest rig on a Debian bookworm machine (as root), idempotently:
#   host: debootstrap (apt-get update + install, only if missing)
#   $VNVME_RIG_CACHE/trixie : Debian trixie chroot with QEMU 11.1 (trixie-backports, has vfio-user-pci)
#   $VNVME_RIG_CACHE/guest  : guest kernel + initramfs (busybox, fio, nvme-cli, blkzone, nvme.ko)
#   with --guest-release bookworm: $VNVME_RIG_CACHE/bookworm (a Debian 12 chroot the guest's packages come
#   from) and $VNVME_RIG_CACHE/guest-bookworm (its kernel + initramfs); QEMU stays the trixie chroot's
#   boot tools in the chroot (OVMF, systemd-boot, GRUB i386-pc, mtools, mkfs.fat, sfdisk) for the boot tests
# Each step is skipped when its stamp file records the hash of the scripts that produced it (and the
# outputs are still there), so a second run takes a second or two.
#
# usage: setup.sh [--force] [--smoke] [--guest-release trixie|bookworm] | --clean
#   --force   rebuild both steps even if the stamps match
#   --guest-release R  build the guest from Debian R (default trixie, or RIG_RELEASE): bookworm is Linux 6.1,
#             nvme-cli 2.4, fio 3.33; it leaves the trixie guest alone (run-vnvme-tests.sh takes the same option)
#   --clean   unmount $RIG_CHROOT/proc and delete the whole cache (never rm -rf it by hand while proc is mounted);
#             with --guest-release bookworm only that release's chroot and guest
#   --smoke   afterwards boot the guest once with QEMU's built-in nvme and check the exit-status plumbing
# Variables: VNVME_RIG_CACHE (default ~/.cache/vnvme-rig), RIG_CHROOT, RIG_OUT, RIG_MIRROR (see the scripts),
#   RIG_RELEASE (as --guest-release), RIG_GUEST_CHROOT (the other release's chroot, $VNVME_RIG_CACHE/RELEASE).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FORCE=0 SMOKE=0 CLEAN=0
while [ $# -gt 0 ]; do
  case $1 in
    --force) FORCE=1 ;;
    --smoke) SMOKE=1 ;;
    --clean) CLEAN=1 ;;
    --guest-release) [ $# -ge 2 ] || { echo "setup.sh: --guest-release needs trixie or bookworm" >&2; exit 2; }
      RIG_RELEASE=$2; shift ;;
    --guest-release=*) RIG_RELEASE=${1#*=} ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
die() { echo "rig: ERROR: $*" >&2; exit 1; }
CACHE=${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}
CHROOT=${RIG_CHROOT:-$CACHE/trixie}
RELEASE=${RIG_RELEASE:-trixie}
# QEMU (vfio-user-pci needs 11.1, trixie-backports) always runs from the trixie chroot; another release
# only gives the guest's kernel and tools, from a chroot of its own, into an output folder of its own
case $RELEASE in
  trixie) GUEST_CHROOT=$CHROOT OUT=${RIG_OUT:-$CACHE/guest} ;;
  bookworm) GUEST_CHROOT=${RIG_GUEST_CHROOT:-$CACHE/$RELEASE} OUT=${RIG_OUT:-$CACHE/guest-$RELEASE} ;;
  *) die "--guest-release '$RELEASE': the rig builds trixie (default) or bookworm guests" ;;
esac
export VNVME_RIG_CACHE=$CACHE RIG_CHROOT=$CHROOT RIG_OUT=$OUT RIG_RELEASE=$RELEASE
now() { date +%s; }
[ "$(id -u)" = 0 ] || die "setup.sh must run as root (debootstrap, chroot and mount need it)"
[ "$(uname -m)" = x86_64 ] || die "x86_64 host needed (got $(uname -m))"
for c in sha256sum chroot mount mountpoint; do command -v $c >/dev/null || die "missing host command: $c"; done
# unmount anything under a folder (proc in a chroot), deepest first, then delete it on this filesystem only
remove_tree() {
  awk -v c="$1/" 'index($2"/", c) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount "$m" || umount -l "$m"; done
  rm -rf --one-file-system "$1"
}
if [ $CLEAN = 1 ]; then
  if [ "$GUEST_CHROOT" != "$CHROOT" ]; then
    # --clean --guest-release R: only that release's chroot and guest; the trixie rig stays
    remove_tree "$GUEST_CHROOT"; remove_tree "$OUT"
    echo "rig: removed $GUEST_CHROOT and $OUT"
    exit 0
  fi
  remove_tree "$CACHE"
  echo "rig: removed $CACHE"
  exit 0
fi
mkdir -p "$CACHE" "$OUT"
T0=$(now)

hash_of() { cat "$@" | sha256sum | cut -c1-16; }
CHROOT_HASH=$(hash_of "$HERE/make-chroot.sh")
# the release enters the hash only when it is not trixie, so the trixie guest's stamp stays what it was
GUEST_HASH=$(hash_of "$HERE/build-guest.sh" "$HERE"/tests/*.sh <(echo "$CHROOT_HASH") \
  <([ "$RELEASE" = trixie ] || echo "$RELEASE"))
CHROOT_STAMP=$CACHE/.chroot.stamp
GUEST_STAMP=$OUT/.guest.stamp

# --- 1. chroot with QEMU ---
qemu_version() { chroot "$CHROOT" qemu-system-x86_64 --version 2>/dev/null | head -1 | awk '{print $4}'; }
APT_UPDATE=1   # the guest step refreshes apt lists unless the chroot step just did
if [ $FORCE = 0 ] && [ "$(cat "$CHROOT_STAMP" 2>/dev/null)" = "$CHROOT_HASH" ] && [ -x "$CHROOT/usr/bin/qemu-system-x86_64" ]; then
  mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"
  echo "rig: chroot ready (QEMU $(qemu_version), cached)"
else
  echo "rig: building chroot $CHROOT (debootstrap trixie + QEMU from trixie-backports) ..."
  t=$(now)
  rm -f "$CHROOT_STAMP" "$GUEST_STAMP"
  "$HERE/make-chroot.sh" > "$CACHE/make-chroot.log" 2>&1 \
    || { tail -20 "$CACHE/make-chroot.log" >&2; die "make-chroot.sh failed (log: $CACHE/make-chroot.log)"; }
  V=$(qemu_version)
  case $V in 1[1-9].*|[2-9][0-9].*) ;; *) die "QEMU in the chroot is '$V', need >= 11.1 (vfio-user-pci)";; esac
  echo "$CHROOT_HASH" > "$CHROOT_STAMP"
  APT_UPDATE=0
  echo "rig: chroot ready (QEMU $V) in $(( $(now) - t )) s"
fi
chroot "$CHROOT" qemu-system-x86_64 -device help 2>/dev/null | grep -q '"vfio-user-pci"' \
  || die "QEMU in $CHROOT has no vfio-user-pci device"

# --- 1b. the other release's chroot: a minbase debootstrap; build-guest.sh installs the guest's packages.
# debootstrap removes $GUEST_CHROOT/debootstrap when it succeeds, so a folder with it is a broken run ---
if [ "$GUEST_CHROOT" != "$CHROOT" ]; then
  if [ $FORCE = 0 ] && [ -x "$GUEST_CHROOT/usr/bin/apt-get" ] && [ ! -d "$GUEST_CHROOT/debootstrap" ]; then
    echo "rig: $RELEASE chroot ready (cached, $GUEST_CHROOT)"
  else
    echo "rig: building the $RELEASE chroot $GUEST_CHROOT (debootstrap --variant=minbase) ..."
    t=$(now)
    rm -f "$GUEST_STAMP"
    [ ! -d "$GUEST_CHROOT" ] || remove_tree "$GUEST_CHROOT"
    command -v debootstrap >/dev/null || die "no debootstrap on the host (the trixie step installs it: run setup.sh once without --guest-release)"
    mkdir -p "$GUEST_CHROOT"
    debootstrap --variant=minbase "$RELEASE" "$GUEST_CHROOT" "${RIG_MIRROR:-http://deb.debian.org/debian}" \
      > "$CACHE/debootstrap-$RELEASE.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap-$RELEASE.log" >&2; die "debootstrap $RELEASE failed (log: $CACHE/debootstrap-$RELEASE.log)"; }
    echo 'force-unsafe-io' > "$GUEST_CHROOT/etc/dpkg/dpkg.cfg.d/unsafe-io"
    echo "rig: $RELEASE chroot ready in $(( $(now) - t )) s"
  fi
fi

# --- 2. guest kernel + initramfs ---
if [ $FORCE = 0 ] && [ "$(cat "$GUEST_STAMP" 2>/dev/null)" = "$GUEST_HASH" ] && [ -f "$OUT/vmlinuz" ] \
   && { [ -f "$OUT/initramfs.cpio.gz" ] || [ -f "$OUT/initramfs.cpio" ]; }; then
  echo "rig: guest ready (kernel $(cat "$OUT/kernel-version"), cached)"
else
  echo "rig: building the $RELEASE guest kernel + initramfs into $OUT ..."
  t=$(now)
  rm -f "$GUEST_STAMP"
  RIG_CHROOT=$GUEST_CHROOT RIG_APT_UPDATE=$APT_UPDATE "$HERE/build-guest.sh" > "$OUT/build-guest.log" 2>&1 \
    || { tail -20 "$OUT/build-guest.log" >&2; die "build-guest.sh failed (log: $OUT/build-guest.log)"; }
  echo "$GUEST_HASH" > "$GUEST_STAMP"
  echo "rig: guest built in $(( $(now) - t )) s (kernel $(cat "$OUT/kernel-version"))"
fi

# --- 3. boot tools: the boot-uefi and boot-bios guest tests build disk images with these (make-boot-image.sh)
# and boot them with OVMF. Installed where missing, outside the stamps, so adding them rebuilds nothing ---
BOOT_PKGS="ovmf systemd-boot-efi grub-pc-bin mtools dosfstools fdisk"
MISSING=''
for p in $BOOT_PKGS; do
  chroot "$CHROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || MISSING="$MISSING $p"
done
if [ -n "$MISSING" ]; then
  echo "rig: installing boot tools in the chroot:$MISSING"
  # shellcheck disable=SC2086
  { chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $MISSING >/dev/null 2>&1 \
    || { chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
         && chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $MISSING >/dev/null; }; } \
    || die "installing the boot tools ($MISSING) in the chroot failed"
else
  echo "rig: boot tools ready (OVMF, systemd-boot, GRUB i386-pc, mtools)"
fi

# --- 4. optional smoke test ---
if [ $SMOKE = 1 ]; then
  S=$(mktemp "${TMPDIR:-/tmp}/rig-smoke.XXXXXX.sh")
  trap 'rm -f "$S"' EXIT
  printf '. /guest-lib.sh\nwait_nvme 10 || exit 9\nnvme list\nexit 7\n' > "$S"
  set +e; "$HERE/run-test.sh" --qemu-nvme --timeout 120 "$S"; rc=$?; set -e
  [ $rc = 7 ] || die "smoke test: expected guest exit 7, got $rc"
  echo "rig: smoke test passed (guest booted, nvme seen, exit status 7 came back)"
fi
echo "rig: ready in $(( $(now) - T0 )) s (cache $CACHE)"
