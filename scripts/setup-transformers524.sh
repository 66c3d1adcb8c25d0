#!/usr/bin/env bash
# Makes (once) the venv in which tests/test_qwen3_video_prompt.py runs transformers 5.24's
# own Qwen3VLProcessor (qwen3_video_prompt="blocks-in-pair"): a plain venv with torch
# (the CPU wheel) and the packages of requirements-transformers524.txt.  Reused while that
# file is unchanged: a second run takes well under a second.
#   MMLOADER_TRANSFORMERS524_VENV  the venv (default /work/venvs/transformers-5.24)
#   PYTHON311                     the Python to make it with (default python3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MMLOADER_TRANSFORMERS524_VENV:-/work/venvs/transformers-5.24}
py=${PYTHON311:-python3.11}
reqs=requirements-transformers524.txt
stamp="$venv/.mmloader-requirements"
if cmp -s "$reqs" "$stamp" 2>/dev/null; then
  exit 0
fi
t0=$SECONDS
echo "[transformers-5.24] making $venv"
rm -f "$stamp"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" install "$(grep '^torch==' "$reqs")"  # first: the CPU wheel, not CUDA's
"${pip[@]}" install -r "$reqs"
# PyPI's torchvision does not load beside the CPU torch 2.13 wheel; the tests put the
# suite's stand-in (tests/tvshim) on the path, as for the suite's own references
"${pip[@]}" uninstall -y torchvision 2>/dev/null || true
cp "$reqs" "$stamp"
echo "[transformers-5.24] ready in $((SECONDS - t0))s"
