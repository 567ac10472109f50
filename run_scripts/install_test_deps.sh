#!/usr/bin/env bash
# System packages the tests need beyond the venv: openssh-server, whose sshd (started by the test on
# loopback, never as a service of its own) plays the second host in tests/test_multinode.py.
# Installs only what is missing, as root with apt-get; otherwise prints why and exits 0 (those tests then
# skip with the reason). SKIP_SYSTEM_PACKAGES=1 skips it. Note: on a machine running systemd, Debian's
# package also enables and starts the ssh service.
set -uo pipefail
say() { echo "[install_test_deps] $*" >&2; }
[ -x /usr/sbin/sshd ] && exit 0
if [ "${SKIP_SYSTEM_PACKAGES:-0}" = 1 ]; then
  say "SKIP_SYSTEM_PACKAGES=1: not installing openssh-server; the multi-node ssh tests will skip"
elif ! command -v apt-get >/dev/null 2>&1; then
  say "no apt-get: install openssh-server (sshd) yourself; the multi-node ssh tests will skip"
elif [ "$(id -u)" != 0 ]; then
  say "not root: run 'sudo apt-get install -y openssh-server'; the multi-node ssh tests will skip"
else
  say "installing openssh-server (apt-get)"
  log="$(mktemp)"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get install -y -q --no-install-recommends openssh-server >"$log" 2>&1 \
     || { apt-get update -q && apt-get install -y -q --no-install-recommends openssh-server; } >>"$log" 2>&1; then
    say "openssh-server installed"
  else
    tail -n 20 "$log" >&2
    say "could not install openssh-server (output above); the multi-node ssh tests will skip"
  fi
  rm -f "$log"
fi
exit 0
