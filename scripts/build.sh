#!/usr/bin/env bash
# Builds mmloader._core in place: the package then imports from the checkout (what the
# scripts and tests use; nothing is installed).  To install: pip install . (or -e .).
# setup.py first checks the compiler, the Python headers and the system libraries
# (csrc/system-libs.txt) and names whatever is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
PY=$PYTHON
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! $PY setup.py -q build_ext --inplace -j "$(nproc)" > "$log" 2>&1; then
  grep -vE '^(copying|running) ' "$log" >&2
  echo "[mmloader] building mmloader._core failed (see above)" >&2
  exit 1
fi
grep -E ': (warning|error): ' "$log" >&2 || true  # compiler diagnostics stay visible
$PY -c "import mmloader"
