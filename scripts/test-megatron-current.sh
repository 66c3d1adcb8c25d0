#!/usr/bin/env bash
# The Megatron integration against the current Megatron stack: megatron-core 0.19 (with
# megatron.training), Megatron-Bridge 0.6 and Energon 7.4 from PyPI, which need Python 3.12.
# Makes (once) a venv outside the checkout, builds mmloader._core for it in place and runs
# tests/test_megatron_current.py, then the Megatron blocks of README.md and docs/megatron.md
# (tests/test_docs.py).  The default suite (scripts/test.sh) keeps testing the pinned
# megatron-core of requirements-test.txt on the system Python.
#   MMLOADER_MEGATRON_VENV  the venv (default ~/.cache/mmloader/venv312-megatron); it is
#                           reused while requirements-megatron-current.txt is unchanged
#   PYTHON312               the Python 3.12 to make it with (default: python3.12 on PATH,
#                           else the newest pyenv 3.12)
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MMLOADER_MEGATRON_VENV:-$HOME/.cache/mmloader/venv312-megatron}
py=${PYTHON312:-}
if [ -z "$py" ]; then  # the first that runs (a pyenv shim on PATH may not)
  for c in python3.12 $(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python 2>/dev/null | sort -rV); do
    if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      py=$c
      break
    fi
  done
fi
reqs=requirements-megatron-current.txt
stamp="$venv/.mmloader-requirements"
t0=$SECONDS
if ! cmp -s "$reqs" "$stamp" 2>/dev/null; then
  if [ -z "$py" ] || ! "$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    echo "[megatron-current] needs Python 3.12 (set PYTHON312); found: ${py:-none}" >&2
    exit 1
  fi
  echo "[megatron-current] making $venv with $("$py" --version) (a few GB: torch for CUDA)"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q -r "$reqs"
  "$venv/bin/pip" install -q --no-deps $(sed -n 's/^# no-deps: //p' "$reqs")
  cp "$reqs" "$stamp"
  echo "[megatron-current] venv ready in $((SECONDS - t0))s"
fi
PYTHON="$venv/bin/python" bash scripts/build.sh
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_megatron_current.py "$@"
# the Megatron blocks of README.md and docs/megatron.md, run with this venv's Megatron-LM
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_docs.py -k test_megatron_blocks_run
