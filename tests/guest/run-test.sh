#!/usr/bin/env bash
# run-test.sh - boot the rig guest, run one guest script in it, exit with that script's exit status.
#
# usage: run-test.sh [--qemu-nvme [--dbcs on|off] | --vfio-user SOCK... | --no-disk] [options] GUEST_SCRIPT
#   --qemu-nvme         QEMU's built-in nvme, null-co backend reading zeroes (default)
#   --no-disk           no NVMe device at boot (a hot-plug test adds them over QMP: --qemu-arg -qmp ...)
#   --dbcs on|off       shadow doorbells (Doorbell Buffer Config) of the built-in nvme (QEMU default: on)
#   --vfio-user SOCK    attach a vfio-user-pci device connected to the server socket SOCK, a HOST path
#                       (its folder is bind-mounted read-only into the chroot in a private mount namespace,
#                       so nothing leaks if the harness dies); no built-in nvme then; repeatable (one
#                       device per socket, in the order given)
#   --socket-wait SECS  wait up to SECS for SOCK to appear (default 10)
#   --mem-file PATH     guest RAM in a regular file instead of a memfd: memory-backend-file on PATH (a HOST
#                       path, e.g. /dev/shm/vm.ram) with share=on, RIG_MEM bytes; the file alone is
#                       bind-mounted read-write at $RIG_CHROOT/run/rig-mem.XXXXXX in the private mount
#                       namespace. Created if missing, then removed at exit; an existing file is used as
#                       is and kept (QEMU grows an empty one, refuses one of another size)
#   --timeout SECS      hard limit for the whole run, QEMU is killed then (default 300); exit 124
#   --append "ARGS"     extra kernel command line (e.g. "nvme.poll_queues=1 rig.qd=32"; guest scripts
#                       read rig.KEY=VALUE with cmdline_get KEY); repeatable
#   --qemu-arg ARG      extra raw QEMU argument (no spaces inside); repeatable
#   --guest-file PATH   also put the host file PATH into the guest as /BASENAME (e.g. a static program the
#                       script runs); repeatable
#   --pidfile FILE      write QEMU's pid to FILE once it runs (a test can kill QEMU mid-I/O); removed at exit
#   --qemu-user USER:GROUP  run QEMU as USER with GROUP as its only group (host names or numbers, passed to
#                       the chroot as numbers: it needs no entry for them): its vfio-user connect is then
#                       an unprivileged one, as under libvirt. QEMU's own -run-with user= drops privileges
#                       only after the devices connected, so it tests no socket permission
#   --log FILE          console log (default $VNVME_RIG_CACHE/logs/NAME-DATE-PID.log); its path is printed
#   --results FILE      also write the guest's RESULT lines there, without the "RESULT " prefix (JSON lines)
#   -v                  also copy the console to stdout as it comes
#   GUEST_SCRIPT        host path; runs in the guest as /test.sh under busybox sh (cwd /tmp); it may
#                       ". /guest-lib.sh" (wait_nvme, check_no_nvme_errors, fio_json, ...)
# Output: stdout gets the guest's "RESULT ..." lines (and the console with -v); stderr gets harness lines.
# Exit status: the guest script's (from the "RIG-EXIT=<n>" line /init prints); 124 = timeout;
#   125 = no RIG-EXIT line (QEMU failed, guest crashed or was killed; the last 30 console lines are shown);
#   126 = harness error (rig not set up, socket missing, bad usage).
# All run-guest.sh variables apply (RIG_MEM, RIG_SMP, RIG_NVME, RIG_APPEND, RIG_QEMU_ARGS, ...).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VNVME_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vnvme-rig}
CHROOT=${RIG_CHROOT:-$CACHE/trixie}
export VNVME_RIG_CACHE=$CACHE RIG_CHROOT=$CHROOT

usage() { sed -n '4,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 126; }
err() { echo "run-test: $*" >&2; exit 126; }
MODE=qemu DBCS='' SOCKS=() MEMFILE='' GFILES='' SOCKWAIT=10 TIMEOUT=300 APPEND='' QARGS='' PIDFILE='' LOG='' RESULTS='' VERBOSE=0 SCRIPT='' QUSER=''
while [ $# -gt 0 ]; do
  case $1 in
    --qemu-nvme) MODE=qemu ;;
    --no-disk) MODE=none ;;
    --dbcs) [ $# -ge 2 ] || usage; case $2 in on|off) DBCS=$2;; *) err "--dbcs takes on or off";; esac; shift ;;
    --vfio-user) [ $# -ge 2 ] || usage; MODE=vfio; SOCKS+=("$2"); shift ;;
    --socket-wait) [ $# -ge 2 ] || usage; SOCKWAIT=$2; shift ;;
    --mem-file) [ $# -ge 2 ] || usage; MEMFILE=$2; shift ;;
    --timeout) [ $# -ge 2 ] || usage; TIMEOUT=$2; shift ;;
    --append) [ $# -ge 2 ] || usage; APPEND="$APPEND $2"; shift ;;
    --qemu-arg) [ $# -ge 2 ] || usage; QARGS="$QARGS $2"; shift ;;
    --guest-file) [ $# -ge 2 ] || usage; [ -f "$2" ] || err "no such guest file: $2"
                  case $2 in *' '*) err "--guest-file: no spaces in the path, please: $2";; esac
                  GFILES="$GFILES $(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift ;;
    --pidfile) [ $# -ge 2 ] || usage; PIDFILE=$2; shift ;;
    --qemu-user) [ $# -ge 2 ] || usage; QUSER=$2; shift ;;
    --log) [ $# -ge 2 ] || usage; LOG=$2; shift ;;
    --results) [ $# -ge 2 ] || usage; RESULTS=$2; shift ;;
    -v|--verbose) VERBOSE=1 ;;
    -h|--help) usage ;;
    -*) err "unknown option $1 (see --help)" ;;
    *) [ -z "$SCRIPT" ] || err "one guest script only"; SCRIPT=$1 ;;
  esac
  shift
done
[ -n "$SCRIPT" ] || usage
[ -f "$SCRIPT" ] || err "no such guest script: $SCRIPT"
case $TIMEOUT in ''|*[!0-9]*) err "--timeout takes whole seconds";; esac
[ "$MODE" != qemu ] && [ -n "$DBCS" ] && err "--dbcs applies to --qemu-nvme only"
[ "$(id -u)" = 0 ] || err "must run as root (chroot)"
if [ -n "$MEMFILE" ]; then
  [ -d "$(dirname "$MEMFILE")" ] || err "--mem-file: no folder $(dirname "$MEMFILE")"
  [ ! -e "$MEMFILE" ] || [ -f "$MEMFILE" ] || err "--mem-file: $MEMFILE is not a regular file"
fi
[ -x "$CHROOT/usr/bin/qemu-system-x86_64" ] || err "rig not set up (no QEMU in $CHROOT): run tests/guest/setup.sh"
if [ -n "$QUSER" ]; then
  case $QUSER in *:*) ;; *) err "--qemu-user takes USER:GROUP";; esac
  QUID=$(id -u "${QUSER%%:*}" 2>/dev/null) || err "--qemu-user: no user ${QUSER%%:*}"
  QGID=$(getent group "${QUSER#*:}" | cut -d: -f3) || true
  [ -n "$QGID" ] || err "--qemu-user: no group ${QUSER#*:}"
  [ -z "$MEMFILE" ] || err "--qemu-user and --mem-file: the RAM file would have to be the user's; not supported"
  export RIG_QEMU_USER=$QUID:$QGID
else
  unset RIG_QEMU_USER
fi
NAME=$(basename "$SCRIPT"); NAME=${NAME%.sh}
if [ -z "$LOG" ]; then   # default log folder: keep the newest 200
  mkdir -p "$CACHE/logs"; LOG=$CACHE/logs/$NAME-$(date +%Y%m%d-%H%M%S)-$$.log
  { ls -1t "$CACHE"/logs/*.log 2>/dev/null || true; } | tail -n +201 | xargs -r rm -f
fi
mkdir -p "$(dirname "$LOG")"; : > "$LOG"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/rig-test.XXXXXX")
export RIG_PIDFILE=${PIDFILE:-$TMP/qemu.pid}
rm -f "$RIG_PIDFILE"

RG='' TAILPID='' TIMER='' MNTS=() MEMMNT='' MEMMADE=''
qemu_pid() { cat "$RIG_PIDFILE" 2>/dev/null || true; }
stop_qemu() {   # TERM, then KILL after 3 s
  local q; q=$(qemu_pid)
  [ -n "$q" ] && kill -0 "$q" 2>/dev/null || return 0
  kill -TERM "$q" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$q" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$q" 2>/dev/null || true
}
cleanup() {
  if [ -n "$RG" ] && kill -0 "$RG" 2>/dev/null; then stop_qemu; kill "$RG" 2>/dev/null || true; wait "$RG" 2>/dev/null || true; fi
  [ -n "$TAILPID" ] && { kill "$TAILPID" 2>/dev/null || true; }
  [ -n "$TIMER" ] && { kill "$TIMER" 2>/dev/null || true; }
  for m in "${MNTS[@]}"; do rmdir "$m" 2>/dev/null || true; done
  [ -n "$MEMMNT" ] && { rm -f "$MEMMNT" 2>/dev/null || true; }
  [ -n "$MEMMADE" ] && { rm -f "$MEMMADE" 2>/dev/null || true; }
  rm -f "$RIG_PIDFILE"; rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

export RIG_APPEND="${RIG_APPEND:-}$APPEND"
export RIG_QEMU_ARGS="${RIG_QEMU_ARGS:-}$QARGS"
export RIG_GUEST_FILES="${RIG_GUEST_FILES:-}$GFILES"
LAUNCH=("$HERE/run-guest.sh" "$SCRIPT")
BINDS=()   # SRC DST ro|rw triples, bind-mounted in QEMU's private mount namespace
CREAL=$(cd "$CHROOT" && pwd -P)
if [ -n "$MEMFILE" ]; then
  # Guest RAM in a regular file. run-guest.sh always declares a memfd backend "mem"; a second backend
  # and a later -machine memory-backend= replace it as the machine's RAM (QEMU keeps the last value),
  # and the unused memfd is never allocated as guest RAM.
  if [ ! -e "$MEMFILE" ]; then : > "$MEMFILE" || err "--mem-file: cannot create $MEMFILE"; MEMMADE=$MEMFILE; fi
  # always bind-mounted (even from inside the chroot), so QEMU's mem-path is a plain /run/rig-mem.XXXXXX
  MEMMNT=$(mktemp "$CHROOT/run/rig-mem.XXXXXX")   # the mount point: an empty file
  BINDS+=("$MEMFILE" "$MEMMNT" rw)
  export RIG_QEMU_ARGS="$RIG_QEMU_ARGS -object memory-backend-file,id=rigmemfile,size=${RIG_MEM:-1G},mem-path=${MEMMNT#"$CHROOT"},share=on -machine memory-backend=rigmemfile"
fi
if [ "$MODE" = vfio ]; then
  RIG_VFIO_USER='' MOUNTED=()   # folder:mount point pairs, one bind mount per folder
  for SOCK in "${SOCKS[@]}"; do
    for _ in $(seq $((SOCKWAIT * 10))); do [ -S "$SOCK" ] && break; sleep 0.1; done
    [ -S "$SOCK" ] || err "no vfio-user socket at $SOCK (waited $SOCKWAIT s)"
    case $SOCK in *' '*) err "--vfio-user: no spaces in the path, please: $SOCK";; esac
    SDIR=$(cd "$(dirname "$SOCK")" && pwd -P); SBASE=$(basename "$SOCK")
    case "$SDIR/" in
      "$CREAL"/*) RIG_VFIO_USER="$RIG_VFIO_USER ${SDIR#"$CREAL"}/$SBASE"; continue ;;   # already inside the chroot
    esac
    MNT=''
    for m in "${MOUNTED[@]}"; do [ "${m%%:*}" = "$SDIR" ] && MNT=${m#*:}; done
    if [ -z "$MNT" ]; then
      MNT=$(mktemp -d "$CHROOT/run/rig-sock.XXXXXX"); MNTS+=("$MNT")
      MOUNTED+=("$SDIR:$MNT"); BINDS+=("$SDIR" "$MNT" ro)
    fi
    RIG_VFIO_USER="$RIG_VFIO_USER ${MNT#"$CHROOT"}/$SBASE"
  done
  export RIG_VFIO_USER=${RIG_VFIO_USER# }
  export RIG_NO_NVME=1
  DESC="vfio-user ${SOCKS[*]}"
elif [ "$MODE" = none ]; then
  unset RIG_VFIO_USER
  export RIG_NO_NVME=1
  DESC="no disk at boot"
else
  unset RIG_VFIO_USER
  export RIG_NO_NVME=0
  [ -n "$DBCS" ] && export RIG_NVME="dbcs=$DBCS${RIG_NVME:+,$RIG_NVME}"
  DESC="qemu nvme${RIG_NVME:+ ($RIG_NVME)}"
fi

if [ ${#BINDS[@]} -gt 0 ]; then
  # private mount namespace: the bind mounts exist only for QEMU, and vanish with it
  LAUNCH=(unshare -m --propagation private bash -c
          'while [ "$1" != -- ]; do
             mount --bind "$1" "$2" || exit
             if [ "$3" = ro ]; then mount -o remount,bind,ro "$2" || exit; fi
             shift 3
           done; shift; exec "$@"'
          _ "${BINDS[@]}" -- "${LAUNCH[@]}")
fi
[ -n "$MEMFILE" ] && DESC="$DESC, guest RAM in file $MEMFILE"
[ -n "$QUSER" ] && DESC="$DESC, QEMU as $QUSER ($RIG_QEMU_USER)"
echo "run-test: $NAME on $DESC, timeout ${TIMEOUT}s, log $LOG" >&2
T0=${EPOCHREALTIME/./}
"${LAUNCH[@]}" > "$LOG" 2>&1 &
RG=$!
if [ "$VERBOSE" = 1 ]; then tail -n +1 -s 0.2 -f --pid="$RG" "$LOG" & TAILPID=$!; fi
# Wait for the guest or the timeout, whichever comes first, without a polling loop: the harness
# must not run while the guest is measured (a `sleep 0.2` loop spawned five processes a second, each
# ~1 ms of a core, and the benchmark's vCPUs queued behind them).
sleep "$TIMEOUT" & TIMER=$!
set +e; wait -n "$RG" "$TIMER"; set -e
TIMEDOUT=0
if kill -0 "$RG" 2>/dev/null; then
  TIMEDOUT=1
  echo "run-test: timeout after ${TIMEOUT}s: killing QEMU (pid $(qemu_pid))" >&2
  stop_qemu
fi
kill "$TIMER" 2>/dev/null || true; wait "$TIMER" 2>/dev/null || true; TIMER=
set +e; wait "$RG"; RGRC=$?; set -e
RG=
[ -n "$TAILPID" ] && { wait "$TAILPID" 2>/dev/null || true; TAILPID=; }
WALL=$(( (${EPOCHREALTIME/./} - T0) / 1000 ))

CLEAN=$TMP/console.txt
tr -d '\r' < "$LOG" > "$CLEAN"
CODE=$(grep -ao 'RIG-EXIT=[0-9]\+' "$CLEAN" | tail -1 | cut -d= -f2 || true)
BOOT=$(sed -n 's/.*RIG: init start uptime=\([0-9.]*\).*/\1/p' "$CLEAN" | head -1)
grep -a '^RESULT ' "$CLEAN" > "$TMP/results" || true
[ "$VERBOSE" = 1 ] || cat "$TMP/results"
[ -n "$RESULTS" ] && sed 's/^RESULT //' "$TMP/results" > "$RESULTS"
tail30() { echo "---- last 30 console lines ($LOG) ----" >&2; tail -n 30 "$CLEAN" >&2; echo "----" >&2; }
SUM="wall $((WALL / 1000)).$(printf %03d $((WALL % 1000)) | cut -c1)s, guest /init at ${BOOT:-?}s uptime, log $LOG"
if [ $TIMEDOUT = 1 ]; then
  tail30; echo "run-test: $NAME: TIMEOUT ($SUM)" >&2; exit 124
fi
if [ -z "$CODE" ]; then
  tail30; echo "run-test: $NAME: no RIG-EXIT line: QEMU exited with $RGRC ($SUM)" >&2; exit 125
fi
echo "run-test: $NAME: exit $CODE ($SUM)" >&2
exit "$CODE"
