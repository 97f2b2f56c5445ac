#!/usr/bin/env bash
# trace-mmio.sh - count MMIO doorbell writes per I/O on QEMU's built-in nvme device, using QEMU's
# trace events (log backend).  Runs tests/fio-sweep.sh in fixed-I/O-count mode with markers
# (nvme get-feature fid 8 before/after each fio job) and counts trace events between markers.
#
# usage: RIG_NVME=dbcs=on|off RIG_APPEND="rig.engines=io_uring rig.qds=1,32 rig.number_ios=20000" trace-mmio.sh
# (rig.markers=1 is added automatically; all run-guest.sh variables apply)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${RIG_OUT:-${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}/guest}
TRACE=${RIG_TRACE_FILE:-$OUT/trace-mmio.log}
CONSOLE=${RIG_CONSOLE_FILE:-$OUT/trace-mmio.console}
export RIG_TRACE="pci_nvme_mmio_write,pci_nvme_mmio_doorbell_sq,pci_nvme_mmio_doorbell_cq,pci_nvme_getfeat,pci_nvme_io_cmd,pci_nvme_irq_msix,pci_nvme_dbbuf_config"
export RIG_TRACE_FILE=$TRACE
export RIG_APPEND="${RIG_APPEND:-} rig.markers=1"
"$HERE/run-guest.sh" "$HERE/tests/fio-sweep.sh" > "$CONSOLE" 2>&1
grep -a '^RESULT' "$CONSOLE" | tr -d '\r' > "$CONSOLE.results"
grep -aq 'pci_nvme_dbbuf_config' "$TRACE" && echo "dbbuf config command seen: yes" || echo "dbbuf config command seen: no"
awk -v results="$CONSOLE.results" '
function val(key,   i) { for (i = 1; i < NF; i++) if ($i == key) return $(i+1) + 0; return -1 }
BEGIN { n = 0; while ((getline l < results) > 0) { n++; R[n] = l } }
/pci_nvme_getfeat/ && / fid 0x8 / {
  m++
  if (m % 2 == 1) { w++; inwin = 1; sq = cq = asq = acq = wr = io = irq = 0 }
  else {
    inwin = 0; split(R[w], f, " "); ios = f[7]; sub("ios=", "", ios)
    if (ios + 0 == 0) ios = io
    printf "%-22s %-8s ios=%-7d io_cmds=%-7d sq_db/io=%.3f cq_db/io=%.3f mmio_wr/io=%.3f irq/io=%.3f (admin sq/cq db=%d/%d)\n",
      f[2], f[3], ios, io, sq/ios, cq/ios, wr/ios, irq/ios, asq, acq
  }
  next
}
!inwin { next }
/pci_nvme_mmio_doorbell_sq/ { if (val("sqid") > 0) sq++; else asq++; next }
/pci_nvme_mmio_doorbell_cq/ { if (val("cqid") > 0) cq++; else acq++; next }
/pci_nvme_mmio_write/       { wr++; next }
/pci_nvme_io_cmd/           { io++; next }
/pci_nvme_irq_msix/         { irq++; next }
' "$TRACE"
