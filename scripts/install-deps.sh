#!/usr/bin/env bash
# Installs what building and testing mmloader needs on a fresh Debian 12/13 machine.
# Safe to run twice: it skips what is already there.
#   scripts/install-deps.sh          system libraries + runtime Python packages
#   scripts/install-deps.sh --test   also the packages the tests and benchmarks use
#   --system-only                    the Debian packages only (no pip)
set -euo pipefail
cd "$(dirname "$0")/.."
test="" pip=1
for a in "$@"; do
  case $a in
    --test) test=--test ;;
    --system-only) pip=0 ;;
    *) echo "usage: scripts/install-deps.sh [--test] [--system-only]" >&2; exit 2 ;;
  esac
done

# the system libraries' -dev packages come from csrc/system-libs.txt (declared there only;
# rows marked `tests` only with --test)
APT_PKGS="build-essential pkg-config $(awk -v t="$test" '!/^#/ && NF && ($6 != "tests" ||
  t == "--test") { print $5 }' csrc/system-libs.txt)"
# the ffmpeg CLI: tests compare the video decoder with Debian's own FFmpeg conversion
# (clang-format comes pinned from PyPI: requirements-test.txt)
# iproute2 (ip, tc): the emulated multi-node cluster of tests/test_ray_netcluster.py
[ -z "$test" ] || APT_PKGS="$APT_PKGS ffmpeg iproute2"
. scripts/python.sh
venv=""
case $PYTHON in "$PWD/.venv/"*) venv=1 ;; esac
# no python3 at all, or the system's: the interpreter, its headers and venv come from Debian
if [ -n "$venv" ] || ! command -v "$PYTHON" > /dev/null; then
  APT_PKGS="$APT_PKGS python3 python3-dev python3-venv"
fi
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

if ! command -v "$PYTHON" > /dev/null; then  # python3 just came from Debian: look again
  unset PYTHON
  . scripts/python.sh
  case $PYTHON in "$PWD/.venv/"*) venv=1 ;; esac
fi
if [ -n "$venv" ] && [ ! -x "$PYTHON" ]; then
  echo "[mmloader] python3 is the system's (externally managed): making the venv .venv"
  python3 -m venv .venv
fi
[ $pip = 1 ] || exit 0
PY=$PYTHON
export PIP_ROOT_USER_ACTION=ignore  # as root in a container or CI machine: fine
req=requirements.txt
[ -z "$test" ] || req=requirements-test.txt
if ! $PY -m pip install -q --disable-pip-version-check -r "$req"; then
  echo "[mmloader] pip install -r $req failed" >&2
  exit 1
fi
