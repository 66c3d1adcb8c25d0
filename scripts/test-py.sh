#!/usr/bin/env bash
# The pytest suite on another Python:  scripts/test-py.sh 3.12   (CI runs it for 3.12)
# Makes a venv build/venv-pyX.Y from that interpreter (python3.X on PATH, else pyenv's),
# installs the package the pip way (pip install -e .) and the test packages except torch,
# accelerate (which pulls torch) and megatron-core (PyPI's torch is a multi-GB CUDA build off 3.11; the tests that need
# them skip and say so), then runs pytest -m "not slow and not gpu" without the C core
# tests (the same C for every Python; scripts/test.sh runs them).  Arguments after the
# version go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${1:?usage: scripts/test-py.sh X.Y [pytest args]}
shift
py=""
for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$ver".*/bin/python "$(command -v "python$ver")"; do
  if [ -x "$c" ] && "$c" -V > /dev/null 2>&1; then py=$c; break; fi
done
[ -n "$py" ] || { echo "[mmloader] no python$ver found (pyenv, PATH)" >&2; exit 1; }
bash scripts/install-deps.sh --test --system-only
mkdir -p build
venv=build/venv-py$ver
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
export PIP_ROOT_USER_ACTION=ignore
grep -vE '^(torch|megatron-core|accelerate)\b' requirements-test.txt > "build/requirements-py$ver.txt"
sed -i 's|^-r requirements.txt|-r ../requirements.txt|' "build/requirements-py$ver.txt"
"$venv/bin/pip" install -q -r "build/requirements-py$ver.txt"
"$venv/bin/pip" install -q -e .
echo "[mmloader] pytest on $("$venv/bin/python" -V) (no torch, no megatron-core)"
exec "$venv/bin/python" -m pytest -q -m "not slow and not gpu" --deselect tests/test_c_core.py "$@"
