#!/usr/bin/env bash
# Start a Docker daemon for this machine's builds when none answers (root only), and print its pid.
# No bridge and no iptables rules: builds and runs use --network host (no image registry is reachable and
# nothing needs a container network). Stop it with: kill "$(cat /var/run/clipbert-dockerd.pid)"
#   DOCKERD_LOG=FILE   its log (default /var/log/clipbert-dockerd/dockerd.log)
#   DOCKERD_PIDFILE=FILE  its pid file (default /var/run/clipbert-dockerd.pid)
# The log is written as root, so only into a folder that nobody else can write to: a planted symlink
# (a fixed name in /tmp was one) would make root overwrite whatever it points at. The default folder is
# made 0700; a log FILE whose folder is not root's alone, or that is itself a symlink, is refused, and so
# is one under a parent folder that someone else can write without the sticky bit (they could rename the
# 0700 folder away and put a symlink in its place between this check and dockerd's open).
# Exits 0 when a daemon already answers (printing nothing), 1 with the reason when it cannot start one.
set -euo pipefail
PIDFILE="${DOCKERD_PIDFILE:-/var/run/clipbert-dockerd.pid}"
LOG="${DOCKERD_LOG:-/var/log/clipbert-dockerd/dockerd.log}"
die() { echo "[start_dockerd] ERROR: $*" >&2; exit 1; }

# a folder only root can change: a real directory (not a symlink), owned by uid 0, no group/other write
root_only_dir() {
  local d=$1 owner mode
  [ ! -L "$d" ] || die "log folder $d is a symlink: refusing to write root's log through it (set DOCKERD_LOG)"
  [ -d "$d" ] || { mkdir -p -m 0700 "$d" || die "cannot create the log folder $d (set DOCKERD_LOG)"; }
  read -r owner mode < <(stat -c '%u %a' "$d")
  [ "$owner" = 0 ] || die "log folder $d is owned by uid $owner, not root: use a root-owned DOCKERD_LOG folder"
  (( (8#$mode & 8#022) == 0 )) \
    || die "log folder $d (mode $mode) is writable by others, who could plant a symlink: use a folder only root can write (DOCKERD_LOG)"
  safe_parents "$d"
}

# every folder above the log folder: a real directory owned by root, not writable by group or others
# unless sticky (/tmp: others cannot rename what root owns there)
safe_parents() {
  local p owner mode
  p=$(cd "$1" && pwd -P) || die "cannot resolve the log folder $1"
  while [ "$p" != / ]; do
    p=$(dirname "$p")
    read -r owner mode < <(stat -c '%u %a' "$p")
    [ "$owner" = 0 ] || die "folder $p above the log folder is owned by uid $owner, not root: use a root-owned DOCKERD_LOG path"
    if (( (8#$mode & 8#022) != 0 && (8#$mode & 8#1000) == 0 )); then
      die "folder $p above the log folder (mode $mode) is writable by others without the sticky bit: they could rename the log folder and plant a symlink; use another DOCKERD_LOG path"
    fi
  done
}

docker info >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] || die "starting dockerd needs root (sudo $0), or start the docker service"
root_only_dir "$(dirname "$LOG")"
[ ! -L "$LOG" ] || die "log file $LOG is a symlink: refusing to follow it (remove it or set DOCKERD_LOG)"
command -v dockerd >/dev/null 2>&1 || die "no dockerd: install it (apt-get install -y docker.io)"
nohup dockerd --bridge none --iptables=false --pidfile "$PIDFILE" </dev/null >"$LOG" 2>&1 &
for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then echo "$(cat "$PIDFILE")"; exit 0; fi
  sleep 1
done
die "dockerd did not answer within 60 s (log: $LOG)"
