#!/usr/bin/env bash
# Start a Docker daemon for this machine's builds when none answers (root only), and print its pid.
# No bridge and no iptables rules: builds and runs use --network host (no image registry is reachable and
# nothing needs a container network). Stop it with: kill "$(cat /var/run/clipbert-dockerd.pid)"
#   DOCKERD_LOG=FILE   its log (default /tmp/clipbert-dockerd.log)
# Exits 0 when a daemon already answers (printing nothing), 1 with the reason when it cannot start one.
set -euo pipefail
PIDFILE=/var/run/clipbert-dockerd.pid
LOG="${DOCKERD_LOG:-/tmp/clipbert-dockerd.log}"
die() { echo "[start_dockerd] ERROR: $*" >&2; exit 1; }

docker info >/dev/null 2>&1 && exit 0
command -v dockerd >/dev/null 2>&1 || die "no dockerd: install it (apt-get install -y docker.io)"
[ "$(id -u)" = 0 ] || die "starting dockerd needs root (sudo $0), or start the docker service"
nohup dockerd --bridge none --iptables=false --pidfile "$PIDFILE" </dev/null >"$LOG" 2>&1 &
for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then cat "$PIDFILE"; exit 0; fi
  sleep 1
done
die "dockerd did not answer within 60 s (log: $LOG)"
