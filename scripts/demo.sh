#!/usr/bin/env bash
# The main job: generates a small multimodal dataset, iterates it with mmloader (throughput,
# per-stage busy time), then runs a PyTorch DataLoader + PIL + Hugging Face processor and
# mmloader side by side on the same data under a simulated trainer step and prints the
# samples/s and wait-time ratio of each (scripts/demo_compare.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
. scripts/python.sh  # the interpreter install-deps.sh installed into
export PIP_ROOT_USER_ACTION=ignore
# the side-by-side's baseline needs torch and transformers: installed only when missing
# (torch 2.13.0: the CPU build where one lies on disk; an installed torch is kept)
"$PYTHON" -c "import torch" 2> /dev/null ||
  "$PYTHON" -m pip install -q --disable-pip-version-check torch==2.13.0
"$PYTHON" -c "import transformers" 2> /dev/null ||
  "$PYTHON" -m pip install -q --disable-pip-version-check transformers
"$PYTHON" -m mmloader demo  # flags: python -m mmloader demo --help
"$PYTHON" scripts/demo_compare.py
