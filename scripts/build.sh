#!/usr/bin/env bash
# Builds mmloader._core in place (the package then imports from the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
${PYTHON:-python3} setup.py -q build_ext --inplace -j "$(nproc)" 2>&1 | grep -vE '^(copying|running)' || true
${PYTHON:-python3} -c "import mmloader" 
