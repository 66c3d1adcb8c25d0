#!/usr/bin/env bash
# Makes (once) the venv in which tests/test_recipe_llamafactory.py runs LLaMA-Factory's own
# data path: a plain venv (LLaMA-Factory pins its own transformers, apart from the suite's)
# with torch (the CPU wheel), the packages of requirements-llamafactory.txt, and
# LLaMA-Factory's demo data (data/ of the same release's source distribution, from PyPI)
# in <venv>/llamafactory-data.  Reused while requirements-llamafactory.txt is unchanged:
# a second run takes well under a second.
#   MMLOADER_LLAMAFACTORY_VENV  the venv (default /work/venvs/llamafactory)
#   PYTHON311                   the Python to make it with (default python3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MMLOADER_LLAMAFACTORY_VENV:-/work/venvs/llamafactory}
py=${PYTHON311:-python3.11}
reqs=requirements-llamafactory.txt
stamp="$venv/.mmloader-requirements"
if cmp -s "$reqs" "$stamp" 2>/dev/null && [ -f "$venv/llamafactory-data/dataset_info.json" ]; then
  exit 0
fi
t0=$SECONDS
echo "[llamafactory] making $venv"
rm -f "$stamp"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" install "$(grep '^torch==' "$reqs")"  # first: the CPU wheel, not CUDA's
"${pip[@]}" install -r "$reqs"
# PyPI's torchvision and torchaudio builds do not load beside the CPU torch 2.13 wheel
# (undefined operators); transformers runs without torchvision (PIL backends) and the
# tests give LLaMA-Factory's mm_plugin a torchaudio stand-in (tests/lfshim: no audio)
"${pip[@]}" uninstall -y torchvision torchaudio
# the demo data ships in the source distribution only
lf=$(grep '^llamafactory==' "$reqs" | cut -d= -f3)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${pip[@]}" download --no-deps --no-binary :all: -d "$tmp" "llamafactory==$lf"
tar xzf "$tmp"/llamafactory-"$lf".tar.gz -C "$tmp" "llamafactory-$lf/data"
rm -rf "$venv/llamafactory-data"
mv "$tmp/llamafactory-$lf/data" "$venv/llamafactory-data"
cp "$reqs" "$stamp"
echo "[llamafactory] ready in $((SECONDS - t0))s"
