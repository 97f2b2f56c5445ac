# shellcheck shell=bash
# disks-lib.sh - sourced by bench/idle-cost.sh and bench/busy-disks.sh: N vnvme disks for one rig guest.
#
# start_disks WHO PROCS N SIZE BACKEND [SERVE_ARGS...]
#   Starts N disks of SIZE (backend ram or null) in a new folder $TMP (removed at exit with the
#   servers, by SIGTERM): one `vnvme serve --config` with a [[controllers]] table per disk and
#   `workers = 1` when PROCS is 0, one `vnvme serve` per disk when it is 1; waits for the sockets
#   $TMP/d1.sock .. $TMP/dN.sock. Sets PIDS (the servers), WHAT ("one process" or "N processes") and
#   DISK_ARGS (run-test.sh's --vfio-user arguments). WHO prefixes the error messages. Needs $VNVME.
start_disks() {
  local who=$1 procs=$2 n=$3 size=$4 backend=$5 i
  shift 5
  TMP=$(mktemp -d "/tmp/vnvme-$who.XXXXXX")
  PIDS=()
  trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
  if [ "$procs" = 1 ]; then
    for i in $(seq "$n"); do
      "$VNVME" serve --socket "$TMP/d$i.sock" --ns "$size:$backend" "$@" > "$TMP/d$i.log" 2>&1 &
      PIDS+=($!)
    done
    WHAT="$n processes"
  else
    { echo "workers = 1"
      for i in $(seq "$n"); do
        printf '\n[[controllers]]\nsocket = "%s"\n[[controllers.namespaces]]\nsize = "%s"\nbackend = "%s"\n' \
          "$TMP/d$i.sock" "$size" "$backend"
      done; } > "$TMP/serve.toml"
    "$VNVME" serve --config "$TMP/serve.toml" "$@" > "$TMP/serve.log" 2>&1 &
    PIDS+=($!)
    WHAT="one process"
  fi
  DISK_ARGS=()
  for i in $(seq "$n"); do
    for _ in $(seq 100); do [ -S "$TMP/d$i.sock" ] && break; sleep 0.1; done
    [ -S "$TMP/d$i.sock" ] || { echo "$who: server of disk $i did not start: $(tail -2 "$TMP"/*.log)" >&2; exit 1; }
    DISK_ARGS+=(--vfio-user "$TMP/d$i.sock")
  done
}
