#!/usr/bin/env bash
# make-chroot.sh - create the Debian trixie folder that holds QEMU 11.1 (trixie-backports), which has
# the vfio-user-pci device. Debian packages only. Needs root; installs debootstrap on the host if missing.
#   RIG_CHROOT  target folder (default $VNVME_RIG_CACHE/trixie, VNVME_RIG_CACHE default ~/.cache/vnvme-rig);
#               re-running on an existing one only makes sure the packages are installed.
#   RIG_MIRROR  Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail
CACHE=${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}
CHROOT=${RIG_CHROOT:-$CACHE/trixie}
MIRROR=${RIG_MIRROR:-http://deb.debian.org/debian}
die() { echo "make-chroot: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mount)"
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq || die "apt-get update failed on the host"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null || die "cannot install debootstrap"
fi
if [ ! -x "$CHROOT/usr/bin/apt-get" ]; then
  mkdir -p "$CHROOT"
  debootstrap --variant=minbase trixie "$CHROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap trixie failed (log: $CACHE/debootstrap.log)"; }
fi
echo "deb $MIRROR trixie-backports main" > "$CHROOT/etc/apt/sources.list.d/backports.list"
# fewer fsyncs: the chroot is a cache, not a system
echo 'force-unsafe-io' > "$CHROOT/etc/dpkg/dpkg.cfg.d/unsafe-io"
mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"
chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive apt-get update -qq || die "apt-get update in the chroot failed"
chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -t trixie-backports qemu-system-x86 >/dev/null || die "installing qemu-system-x86 from trixie-backports failed"
chroot "$CHROOT" qemu-system-x86_64 --version | head -1
chroot "$CHROOT" qemu-system-x86_64 -device help | grep -q vfio-user-pci && echo "vfio-user-pci: available" \
  || die "this QEMU has no vfio-user-pci device"
