#!/usr/bin/env bash
# The main job: generates a small multimodal dataset, iterates it with mmloader and prints
# throughput and the wait-time ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
. scripts/python.sh  # the interpreter install-deps.sh installed into
exec "$PYTHON" -m mmloader demo "$@"
