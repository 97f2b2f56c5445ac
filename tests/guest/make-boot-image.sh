#!/usr/bin/env bash
# make-boot-image.sh - a bootable disk image holding the rig guest (kernel + initramfs + a test script), so
# the guest boots from a disk through firmware instead of QEMU's -kernel. Debian packages only, no mounts:
# sfdisk (fdisk) writes the partition table, mkfs.fat (dosfstools) the FAT file system inside the image at
# its offset, mtools copies the files in, dd puts GRUB's boot code in; all run inside the rig's chroot
# (tests/guest/setup.sh installs them).
#
# usage: make-boot-image.sh --uefi|--bios [--append "ARGS"] [--guest-file PATH]... GUEST_SCRIPT IMAGE
#   --uefi    GPT, 512-byte sectors; one EFI system partition (FAT32) with systemd-boot (systemd-boot-efi) as
#             \EFI\BOOT\BOOTX64.EFI (the removable-media path firmware boots without a boot entry), a loader
#             entry for /vmlinuz (Debian's kernel, an EFI stub) with /initrd and the command line; the menu
#             timeout is 0. For OVMF (run-guest.sh RIG_FIRMWARE=/usr/share/ovmf/OVMF.fd).
#   --bios    MBR, 512-byte sectors; one FAT32 partition with /vmlinuz and /initrd; GRUB (grub-pc-bin): its
#             boot.img as the MBR's boot code, core.img (grub-mkimage: biosdisk, part_msdos, fat, linux, echo,
#             and an embedded configuration that loads them with the command line) in the sectors between
#             the MBR and the partition. For SeaBIOS, QEMU's default firmware.
#   --append  appended to the kernel command line, after "console=ttyS0 panic=-1 quiet" (as run-guest.sh's)
#   --guest-file  also put this host file into the initramfs as /BASENAME (as run-guest.sh's RIG_GUEST_FILES)
#   GUEST_SCRIPT  host path, put into the initramfs as /test.sh (with guest-lib.sh), run by /init
#   IMAGE     host path of the image to write (replaced); 64 MiB for the partition + 2 MiB
# The initramfs is the rig's ($RIG_OUT/initramfs.cpio.gz) with a second archive appended, exactly as
# run-guest.sh stages it. Variables: VNVME_RIG_CACHE, RIG_CHROOT, RIG_OUT, RIG_RELEASE (as run-guest.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}
CHROOT=${RIG_CHROOT:-$CACHE/trixie}
case ${RIG_RELEASE:-trixie} in trixie) OUT=${RIG_OUT:-$CACHE/guest} ;; *) OUT=${RIG_OUT:-$CACHE/guest-$RIG_RELEASE} ;; esac
die() { echo "make-boot-image: $*" >&2; exit 1; }
usage() { sed -n '8,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

KIND='' APPEND='' FILES=() SCRIPT='' IMAGE=''
while [ $# -gt 0 ]; do
  case $1 in
    --uefi) KIND=uefi ;;
    --bios) KIND=bios ;;
    --append) [ $# -ge 2 ] || usage; APPEND="$APPEND $2"; shift ;;
    --guest-file) [ $# -ge 2 ] || usage; [ -f "$2" ] || die "no such guest file: $2"; FILES+=("$2"); shift ;;
    -h|--help) usage ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) if [ -z "$SCRIPT" ]; then SCRIPT=$1; elif [ -z "$IMAGE" ]; then IMAGE=$1; else usage; fi ;;
  esac
  shift
done
[ -n "$KIND" ] && [ -n "$IMAGE" ] || usage
[ -f "$SCRIPT" ] || die "no such guest script: $SCRIPT"
[ "$(id -u)" = 0 ] || die "must run as root (chroot)"
INITRD="$OUT/initramfs.cpio.gz"; [ -f "$INITRD" ] || INITRD="$OUT/initramfs.cpio"
[ -f "$OUT/vmlinuz" ] && [ -f "$INITRD" ] || die "no guest in $OUT: run tests/guest/setup.sh first"
in_chroot() { chroot "$CHROOT" "$@"; }
for t in sfdisk mkfs.fat mcopy; do
  in_chroot sh -c "command -v $t" >/dev/null || die "no $t in $CHROOT: run tests/guest/setup.sh (it installs the boot tools)"
done
mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"

WORK=$(mktemp -d "$CHROOT/tmp/bootimg.XXXXXX")
W=${WORK#"$CHROOT"}   # the same folder, as the chroot sees it
trap 'rm -rf "$WORK"' EXIT

# --- the initramfs with /guest-lib.sh, /test.sh and the guest files appended (as run-guest.sh does) ---
mkdir -p "$WORK/t"
cp "$HERE/guest-lib.sh" "$WORK/t/guest-lib.sh"
cp "$SCRIPT" "$WORK/t/test.sh"
for f in "${FILES[@]}"; do cp "$f" "$WORK/t/"; done
chmod 755 "$WORK"/t/*
cp "$INITRD" "$WORK/initrd"
pad=$(( (4 - $(stat -c %s "$WORK/initrd") % 4) % 4 ))   # each archive starts 4-byte aligned
head -c "$pad" /dev/zero >> "$WORK/initrd"
(cd "$WORK/t" && ls -1 | "$CHROOT/usr/bin/busybox" cpio -o -H newc 2>/dev/null) >> "$WORK/initrd"
cp "$OUT/vmlinuz" "$WORK/vmlinuz"
CMDLINE="console=ttyS0 panic=-1 quiet${APPEND}"

# --- the disk: 1 MiB before the partition (the table, and the boot loader's room), 1 MiB after it (GPT's
# backup); 512-byte sectors, as disk images are made ---
START=2048 PART_MIB=64
PART_SECTORS=$((PART_MIB * 2048))
NEED=$(( ($(stat -c %s "$WORK/vmlinuz") + $(stat -c %s "$WORK/initrd")) / 1048576 + 4 ))
[ "$NEED" -le "$PART_MIB" ] || die "kernel + initramfs need ${NEED} MiB, the partition has $PART_MIB"
truncate -s $(( (PART_MIB + 2) << 20 )) "$WORK/disk.img"
if [ "$KIND" = uefi ]; then
  TABLE="label: gpt
start=$START, size=$PART_SECTORS, type=U, name=\"EFI system partition\""
else
  TABLE="label: dos
start=$START, size=$PART_SECTORS, type=c, bootable"
fi
echo "$TABLE" | in_chroot sfdisk -q "$W/disk.img" >/dev/null || die "sfdisk failed"
# FAT32 inside the image at the partition's offset; -h: the hidden sectors before it
# (it warns that the image holds more blocks than the file system: it is meant to)
in_chroot mkfs.fat -F 32 -n RIGBOOT --offset $START -h $START "$W/disk.img" $((PART_SECTORS / 2)) > "$WORK/mkfs.log" 2>&1 \
  || { cat "$WORK/mkfs.log" >&2; die "mkfs.fat failed"; }
FAT="$W/disk.img@@$((START * 512))"
mt() { in_chroot env MTOOLS_SKIP_CHECK=1 "$@"; }
mt mcopy -i "$FAT" "$W/vmlinuz" ::/vmlinuz
mt mcopy -i "$FAT" "$W/initrd" ::/initrd

if [ "$KIND" = uefi ]; then
  EFI=/usr/lib/systemd/boot/efi/systemd-bootx64.efi
  [ -f "$CHROOT$EFI" ] || die "no $EFI in $CHROOT: run tests/guest/setup.sh (systemd-boot-efi)"
  mt mmd -i "$FAT" ::/EFI ::/EFI/BOOT ::/loader ::/loader/entries
  mt mcopy -i "$FAT" "$EFI" ::/EFI/BOOT/BOOTX64.EFI
  # timeout 0: no menu (a key pressed would show it); only our entry, no firmware or auto entries
  printf 'timeout 0\ndefault rig.conf\neditor no\nauto-entries no\nauto-firmware no\n' > "$WORK/loader.conf"
  printf 'title vnvme rig\nlinux /vmlinuz\ninitrd /initrd\noptions %s\n' "$CMDLINE" > "$WORK/rig.conf"
  mt mcopy -i "$FAT" "$W/loader.conf" ::/loader/loader.conf
  mt mcopy -i "$FAT" "$W/rig.conf" ::/loader/entries/rig.conf
else
  # GRUB (i386-pc), not SYSLINUX: a boot chain that never loads code where code already ran. SYSLINUX's
  # MBR runs at 0x7C00 and reads the partition's boot sector over itself; under TCG, QEMU keeps the
  # MBR's translated code for that address, since the vfio-user server wrote the new sector into guest
  # RAM through its own mapping, which QEMU's code-page tracking does not see (QEMU's own devices write
  # through QEMU and invalidate it): the old MBR ran again and SYSLINUX stopped with "Boot error".
  # GRUB's boot.img loads core.img at 0x8000, memory not run before.
  GRUBLIB=/usr/lib/grub/i386-pc
  [ -f "$CHROOT$GRUBLIB/boot.img" ] || die "no $GRUBLIB/boot.img in $CHROOT: run tests/guest/setup.sh (grub-pc-bin)"
  # core.img's embedded configuration, run by GRUB's rescue parser (no normal.mod, no menu)
  printf 'echo "GRUB: booting the vnvme rig from (hd0,msdos1)"\nset root=(hd0,msdos1)\nlinux /vmlinuz %s\ninitrd /initrd\nboot\n' \
    "$CMDLINE" > "$WORK/early.cfg"
  in_chroot grub-mkimage -O i386-pc -o "$W/core.img" -c "$W/early.cfg" -p '(hd0,msdos1)/boot/grub' \
    biosdisk part_msdos fat linux echo || die "grub-mkimage failed"
  # core.img (diskboot.img first, its block list already "sector 2, the rest") in the gap after the MBR,
  # from sector 1, where boot.img looks for it by default
  CORE_SECTORS=$(( ($(stat -c %s "$WORK/core.img") + 511) / 512 ))
  [ $((1 + CORE_SECTORS)) -le $START ] || die "core.img ($CORE_SECTORS sectors) does not fit before the partition"
  dd if="$WORK/core.img" of="$WORK/disk.img" bs=512 seek=1 conv=notrunc status=none
  # boot.img's 440 bytes of code, before the disk signature and the partition table
  dd if="$CHROOT$GRUBLIB/boot.img" of="$WORK/disk.img" bs=440 count=1 conv=notrunc status=none
fi
mkdir -p "$(dirname "$IMAGE")"
mv "$WORK/disk.img" "$IMAGE"
echo "make-boot-image: $IMAGE ($KIND, $((PART_MIB + 2)) MiB, cmdline: $CMDLINE)"
