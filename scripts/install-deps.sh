#!/usr/bin/env bash
# Installs what building and testing mmloader needs on a fresh Debian 12/13 machine.
# Safe to run twice: it skips what is already there.
#   scripts/install-deps.sh          system libraries + runtime Python packages
#   scripts/install-deps.sh --test   also the packages the tests and benchmarks use
set -euo pipefail
cd "$(dirname "$0")/.."

# the system libraries' -dev packages come from csrc/system-libs.txt (declared there only;
# rows marked `tests` only with --test)
APT_PKGS="build-essential pkg-config $(awk -v t="${1:-}" '!/^#/ && NF && ($6 != "tests" ||
  t == "--test") { print $5 }' csrc/system-libs.txt)"
missing=""
for p in $APT_PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "[mmloader] apt-get install$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore  # as root in a container or CI machine: fine
req=requirements.txt
[ "${1:-}" = "--test" ] && req=requirements-test.txt
if ! $PY -m pip install -q --disable-pip-version-check -r "$req"; then
  echo "[mmloader] pip install -r $req failed" >&2
  exit 1
fi
