#!/usr/bin/env bash
# The test command: installs what it needs, builds, runs the C core tests (plain, ASan+UBSan,
# TSan) and the pytest suite (which also runs a part of itself against an ASan build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
bash scripts/build.sh
exec ${PYTHON:-python3} -m pytest -q -m "not slow and not gpu" "$@"
