#!/usr/bin/env bash
# Run a command of the image build with what docker/build_extras/ holds (see its README): pip's
# configuration, a CA bundle for pip, git and Python, and a folder of local wheels. Absent items change nothing.
#   docker/with_build_extras.sh EXTRAS_DIR command...
set -euo pipefail
X=$1; shift
if [ -f "$X/pip.conf" ]; then export PIP_CONFIG_FILE="$X/pip.conf"; fi
if [ -f "$X/ca.crt" ]; then
  export PIP_CERT="$X/ca.crt" SSL_CERT_FILE="$X/ca.crt" REQUESTS_CA_BUNDLE="$X/ca.crt" GIT_SSL_CAINFO="$X/ca.crt"
fi
if [ -d "$X/wheels" ]; then export PIP_FIND_LINKS="$X/wheels"; fi
exec "$@"
