#!/usr/bin/env bash
# Installs the Debian packages the cargo tests start or check against, where
# they are missing (as root on Debian bookworm; tests/run-all.sh runs it).
set -euo pipefail
missing=()
# The guest passthrough test builds a small static C reader (cc -static).
command -v cc >/dev/null || missing+=(gcc)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(libc6-dev)
# The nbd backend's tests start real NBD servers: nbdkit (memory plugin, log
# filter) and qemu-nbd exporting a qcow2 file made by qemu-img.
command -v nbdkit >/dev/null || missing+=(nbdkit)
{ command -v qemu-nbd >/dev/null && command -v qemu-img >/dev/null; } || missing+=(qemu-utils)
# The guest hot-plug test talks QMP to QEMU with tests/guest/qmp.py.
command -v python3 >/dev/null || missing+=(python3)
# A stop test hangs a FUSE filesystem (bindfs) under a file namespace.
command -v bindfs >/dev/null || missing+=(bindfs)
# The socket tests start `vnvme serve` through systemd-socket-activate, and
# check the sample units with systemd-analyze verify (neither needs systemd
# running as init); they run clients as nobody with setpriv (util-linux).
{ command -v systemd-socket-activate >/dev/null && command -v systemd-analyze >/dev/null; } || missing+=(systemd)
command -v setpriv >/dev/null || missing+=(util-linux)
apt_install() {
  echo "== apt-get install $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
fi
# The metrics test runs `promtool check metrics` (package prometheus, whose
# recommended packages are a whole monitoring stack).
command -v promtool >/dev/null || apt_install --no-install-recommends prometheus
