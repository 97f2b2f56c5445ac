# shellcheck shell=sh
# vnvme-hotplug.sh - guest test (run-vnvme-tests.sh hotplug): disks attached and detached at run time.
# For each mode in rig.modes (one vnvme server per mode on the host) and each of rig.rounds rounds,
# the guest asks the host to hot-add the mode's disk ("HOTPLUG-ASK <step> add <mode> <round>"; the
# host sends QMP device_add of vfio-user-pci on a pcie-root-port), waits for /dev/nvme0n1, runs a
# verified fio write/read of rig.size, then asks for the detach ("HOTPLUG-ASK <step> del ..."; the host
# sends device_del) and waits until the PCI device is gone. In odd rounds the guest releases the
# device itself first (sysfs remove), in even rounds it leaves that to its PCIe hot-plug driver.
# Last, it asks for the first mode's disk once more ("add <mode> final") and reads from it: the host
# checks each detach up to the server's side before it answers, and the guest must not power off
# before the host has checked the last one.
# rig.irq=msi (msix): the device's vectors must be MSI (MSI-X) ones.
#   rig.modes=trap,shadow,adaptive,mmap-poll  rig.rounds=5  rig.size=8M  rig.irq=
. /guest-lib.sh
MODES=$(cmdline_get modes trap,shadow,adaptive,mmap-poll)
ROUNDS=$(cmdline_get rounds 5); SIZE=$(cmdline_get size 8M); IRQ=$(cmdline_get irq)
step=0 done=0
for m in $(echo "$MODES" | tr , ' '); do
  r=1
  while [ "$r" -le "$ROUNDS" ]; do
    step=$((step + 1))
    echo "HOTPLUG-ASK $step add $m $r"
    wait_nvme 60 || die "$m round $r: no /dev/nvme0n1 60 s after the device_add"
    dev=$(basename "$(readlink -f /sys/class/nvme/nvme0/device)")
    irqs=$(grep 'nvme0q' /proc/interrupts)
    if [ "$r" = 1 ]; then
      log "$m: $dev, $(echo "$irqs" | grep -c .) interrupt line(s): $(echo "$irqs" | head -1 | tr -s ' ' | cut -d' ' -f4-)"
    fi
    if [ "$IRQ" = msi ] && { ! echo "$irqs" | grep -q 'MSI' || echo "$irqs" | grep -q 'MSIX'; }; then
      die "$m round $r: expected MSI vectors, /proc/interrupts has: $irqs"
    fi
    if [ "$IRQ" = msix ] && ! echo "$irqs" | grep -q 'MSIX'; then
      die "$m round $r: expected MSI-X vectors, /proc/interrupts has: $irqs"
    fi
    fio_json "$m-$r" --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size="$SIZE" --ioengine=io_uring \
      --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 \
      || die "$m round $r: fio verify failed"
    how="device_del"
    if [ $((r % 2)) = 1 ]; then
      echo 1 > "/sys/bus/pci/devices/$dev/remove" || die "$m round $r: cannot remove $dev"
      how="sysfs remove, then device_del"
    fi
    step=$((step + 1))
    echo "HOTPLUG-ASK $step del $m $r"
    i=0
    while [ -e "/sys/bus/pci/devices/$dev" ] || [ -b /dev/nvme0n1 ]; do
      [ $i -ge 600 ] && die "$m round $r: $dev still present 60 s after the device_del"
      sleep 0.1; i=$((i + 1))
    done
    log "$m round $r: detached ($how)"
    done=$((done + 1)); r=$((r + 1))
  done
done
first=$(echo "$MODES" | cut -d, -f1)
step=$((step + 1))
echo "HOTPLUG-ASK $step add $first final"
wait_nvme 60 || die "final: no /dev/nvme0n1 60 s after the device_add"
dd if=/dev/nvme0n1 of=/dev/null bs=4k count=16 iflag=direct 2>/dev/null || die "final: cannot read /dev/nvme0n1"
log "final: $first attached again and readable"
# Hot removal logs "removing" lines of its own: only timeouts, resets and aborts count here.
bad=$(nvme_errors | grep -iE 'timeout|timed out|reset|abort|dead')
[ -z "$bad" ] || die "nvme errors in dmesg: $bad"
log "hotplug: $done rounds attached, verified and detached"
