#!/usr/bin/env bash
# build-guest.sh - build a minimal Linux guest (kernel + initramfs) for the NVMe test rig.
#
# Everything comes from Debian packages installed inside a Debian trixie chroot:
#   linux-image-amd64, busybox-static, fio, nvme-cli (+ their shared libraries, found via ldd).
# Output: $RIG_OUT/vmlinuz and $RIG_OUT/initramfs.cpio.gz (or .cpio when RIG_COMPRESS=none).
#
# Variables (all optional):
#   VNVME_RIG_CACHE  cache root        (default ~/.cache/vnvme-rig)
#   RIG_CHROOT    Debian trixie chroot (default $VNVME_RIG_CACHE/trixie)
#   RIG_OUT       output directory     (default $VNVME_RIG_CACHE/guest)
#   RIG_INSTALL   1 = apt-get install the needed packages in the chroot first (default 1)
#   RIG_APT_UPDATE 1 = apt-get update before installing (default 1)
#   RIG_COMPRESS  gzip | none          (default gzip)
#   RIG_EXTRA_BINS space-separated extra binaries (paths inside chroot) to copy with their libs
set -euo pipefail

CACHE=${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}
CHROOT=${RIG_CHROOT:-$CACHE/trixie}
OUT=${RIG_OUT:-$CACHE/guest}
INSTALL=${RIG_INSTALL:-1}
COMPRESS=${RIG_COMPRESS:-gzip}
EXTRA_BINS=${RIG_EXTRA_BINS:-}
HERE=$(cd "$(dirname "$0")" && pwd)

[ -d "$CHROOT/usr" ] || { echo "no chroot at $CHROOT" >&2; exit 1; }
mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"

if [ "$INSTALL" = 1 ]; then
  if [ "${RIG_APT_UPDATE:-1}" = 1 ]; then chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive apt-get update -qq; fi
  # INITRD=No: the kernel's postinst hook skips update-initramfs (we build our own initramfs)
  chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive INITRD=No apt-get install -y -qq --no-install-recommends \
      linux-image-amd64 busybox-static fio nvme-cli kmod >/dev/null \
    || { echo "build-guest: apt-get install of the guest packages failed" >&2; exit 1; }
fi

# newest installed kernel
KVER=$(ls -1 "$CHROOT/lib/modules" | sort -V | tail -1)
[ -f "$CHROOT/boot/vmlinuz-$KVER" ] || { echo "no kernel vmlinuz-$KVER" >&2; exit 1; }
echo "kernel: $KVER"

mkdir -p "$OUT"
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/rig-initramfs.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT

# --- skeleton (usr-merged like trixie so ldd paths resolve) ---
mkdir -p "$STAGE"/{bin,sbin,dev,proc,sys,tmp,run,etc,root,tests,usr/bin,usr/sbin,usr/lib,usr/lib64,mnt}
ln -s usr/lib "$STAGE/lib"
ln -s usr/lib64 "$STAGE/lib64"
BB="$CHROOT/usr/bin/busybox"
[ -x "$BB" ] || { echo "busybox-static missing in chroot" >&2; exit 1; }
file_is_static() { ! chroot "$CHROOT" ldd "$1" >/dev/null 2>&1; }
file_is_static /usr/bin/busybox || { echo "busybox in chroot is not static" >&2; exit 1; }
cp "$BB" "$STAGE/bin/busybox"
for a in $("$STAGE/bin/busybox" --list); do
  [ -e "$STAGE/bin/$a" ] || ln -s busybox "$STAGE/bin/$a"
done
# device nodes needed before devtmpfs is mounted
mknod -m 600 "$STAGE/dev/console" c 5 1
mknod -m 666 "$STAGE/dev/null" c 1 3

# --- dynamic binaries + their libraries (ldd run inside the chroot) ---
copy_with_libs() {
  local bin=$1 dst lib
  dst="$STAGE$bin"
  mkdir -p "$(dirname "$dst")"
  cp -L "$CHROOT$bin" "$dst"
  for lib in $(chroot "$CHROOT" ldd "$bin" | awk '/=> \//{print $3} /^\t\//{print $1}'); do
    [ -e "$STAGE$lib" ] && continue
    mkdir -p "$STAGE$(dirname "$lib")"
    cp -L "$CHROOT$lib" "$STAGE$lib"
  done
}
# blkzone (util-linux, already in the chroot): zoned namespace tests
for b in /usr/bin/fio /usr/sbin/nvme /usr/sbin/blkzone $EXTRA_BINS; do copy_with_libs "$b"; done

# --- kernel modules: nvme + dependencies, resolved from modules.dep, stored uncompressed ---
MODDIR="$CHROOT/lib/modules/$KVER"
: > "$STAGE/etc/modules.order"
declare -A SEEN=()
add_mod() {   # $1 = path relative to $MODDIR, as in modules.dep
  local rel=$1 deps d
  [ -n "${SEEN[$rel]:-}" ] && return 0
  SEEN[$rel]=1
  deps=$(awk -v m="$rel:" '$1==m{for(i=2;i<=NF;i++)print $i}' "$MODDIR/modules.dep")
  for d in $deps; do add_mod "$d"; done      # deps first
  local out="$STAGE/lib/modules/$KVER/${rel%.xz}"
  out="${out%.gz}"; out="${out%.zst}"
  mkdir -p "$(dirname "$out")"
  case "$rel" in
    *.xz)  "$BB" xz -dc  "$MODDIR/$rel" > "$out" ;;
    *.gz)  "$BB" gzip -dc "$MODDIR/$rel" > "$out" ;;
    *.zst) chroot "$CHROOT" zstd -dc "/lib/modules/$KVER/$rel" > "$out" ;;
    *)     cp "$MODDIR/$rel" "$out" ;;
  esac
  echo "/lib/modules/$KVER/${out#"$STAGE/lib/modules/$KVER/"}" >> "$STAGE/etc/modules.order"
}
for want in nvme; do
  # built in?  then nothing to load
  if grep -qE "/$want\.ko" "$MODDIR/modules.builtin"; then echo "$want is built in"; continue; fi
  rel=$(awk -F: -v w="/$want.ko" 'index($1,w){print $1; exit}' "$MODDIR/modules.dep")
  [ -n "$rel" ] || { echo "module $want not found" >&2; exit 1; }
  add_mod "$rel"
done
echo "modules:"; sed 's/^/  /' "$STAGE/etc/modules.order"

# --- baked-in test scripts (optional): $HERE/tests/*.sh ---
if [ -d "$HERE/tests" ]; then cp "$HERE"/tests/*.sh "$STAGE/tests/" 2>/dev/null || true; fi

# --- /init ---
cat > "$STAGE/init" <<'INIT'
#!/bin/busybox sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
echo "RIG: init start uptime=$(cut -d' ' -f1 /proc/uptime)"
CMDLINE=$(cat /proc/cmdline)
# load modules; pass "<module>.<param>=<val>" options from the kernel cmdline (kmod does this, busybox insmod does not)
while read -r m; do
  name=$(basename "$m" .ko | tr - _)
  args=""
  for w in $CMDLINE; do case "$w" in "$name".*=*) args="$args ${w#"$name".}";; esac; done
  insmod "$m" $args || echo "RIG: insmod $m failed"
done < /etc/modules.order
# wait for the namespace (rig.nvme_wait=SECONDS, default 10; 0 = do not wait)
W=10; for w in $CMDLINE; do case "$w" in rig.nvme_wait=*) W=${w#rig.nvme_wait=};; esac; done
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt $((W*10)) ]; do sleep 0.1; i=$((i+1)); done
echo "RIG: modules loaded uptime=$(cut -d' ' -f1 /proc/uptime) nvme0n1=$([ -b /dev/nvme0n1 ] && echo yes || echo no)"
# test selection: /test.sh (appended by run-guest.sh) > rig.test=<name> (baked /tests/<name>.sh) > shell
T=""
for w in $CMDLINE; do case "$w" in rig.test=*) T="/tests/${w#rig.test=}.sh";; esac; done
[ -f /test.sh ] && T=/test.sh
if [ -n "$T" ] && [ -f "$T" ]; then
  echo "RIG: running $T"
  (cd /tmp && sh "$T" </dev/null 2>&1)
  rc=$?
  echo "RIG: test exit=$rc"
  echo "RIG-EXIT=$rc"
elif case " $CMDLINE " in *" rig.shell "*) true;; *) false;; esac; then
  echo "RIG: no test script; starting shell (exit to power off)"
  setsid cttyhack sh
else
  echo "RIG: no test script (pass one to run-guest.sh, or rig.test=NAME / rig.shell on the cmdline)"
fi
echo "RIG: done uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
poweroff -f
INIT
chmod 755 "$STAGE/init"

# --- kernel + archive ---
cp "$CHROOT/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
echo "$KVER" > "$OUT/kernel-version"
if [ "$COMPRESS" = none ]; then
  ARCH="$OUT/initramfs.cpio"
  (cd "$STAGE" && find . | "$BB" cpio -o -H newc 2>/dev/null) > "$ARCH"
else
  ARCH="$OUT/initramfs.cpio.gz"
  (cd "$STAGE" && find . | "$BB" cpio -o -H newc 2>/dev/null | gzip -6) > "$ARCH"
fi
echo "wrote $OUT/vmlinuz and $ARCH ($(du -h "$ARCH" | cut -f1))"
