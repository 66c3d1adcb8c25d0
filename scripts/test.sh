#!/usr/bin/env bash
# The test command: installs what it needs, builds, runs the pytest suite (which includes
# the C core's own tests built plain, under ASan+UBSan and under TSan), then runs the
# engine-facing Python suites again against an ASan+UBSan build of the extension.
# Arguments are passed to the first pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
bash scripts/build.sh
${PYTHON:-python3} -m pytest -q -m "not slow and not gpu" "$@"
bash scripts/test-asan.sh
