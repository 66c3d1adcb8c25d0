#!/usr/bin/env bash
# The proof of scripts/build-wheel.sh: each wheel installed where it must run, then
# scripts/wheel/check.sh (ldd, import, the demo, the six codecs bit for bit):
#   1. the cp39 wheel in the clean bullseye root (minbase + python3 3.9 + python3-venv, no
#      -dev package, no library of mmloader's): its python3, a venv, pip install the wheel
#      and Pillow (the demo's dataset writer), nothing else from the system
#   2. the cp311 wheel on this machine (Debian 12), with the system's copies of every library
#      the wheel bundles hidden (bind-mounted empty by scripts/wheel/hide.py, in one process
#      that needs none of them); the libraries the interpreter and numpy map themselves stay
#      visible (they are loaded before mmloader; ldd shows mmloader's own resolve inside the
#      wheel).  Control: the unrepaired wheel, run the same way, must fail on a hidden file,
#      so the hiding is real.
# Usage: prove.sh RUN_ROOT WORK CP39_WHEEL CP311_WHEEL RAW_DIR   (a wheel "" is skipped)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
runroot=$1 work=$2 cp39=$3 cp311=$4 raw=$5
say() { echo "[prove] $*"; }
. scripts/wheel/inroot.sh
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
codecs=$work/codecs
if [ ! -f "$codecs/.made" ]; then  # build-wheel.sh makes them while the roots build
  "$work/tools/bin/pip" install -q "$(grep -E '^av==' requirements-test.txt)" numpy
  rm -rf "$codecs"
  "$work/tools/bin/python" scripts/wheel/codecs.py make "$codecs" > "$work/codecs.log" 2>&1 ||
    { cat "$work/codecs.log"; exit 1; }
  touch "$codecs/.made"
fi
say "the codec files (PyAV's encoders): $(cd "$codecs" && ls *.mp4 *.mkv *.webm *.avi | tr '\n' ' ')"

if [ -n "$cp39" ]; then
  say "$(basename "$cp39") in the clean bullseye root"
  MML_BIND="$ROOT" inroot "$runroot" bash -euo pipefail -c '
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    echo "[prove] $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -1), $(python3 -V)"
    rm -rf /tmp/mml-venv /tmp/mml-run
    python3 -m venv /tmp/mml-venv
    /tmp/mml-venv/bin/pip install -q -U pip
    /tmp/mml-venv/bin/pip install -q "$2" pillow
    bash "$1/scripts/wheel/check.sh" /tmp/mml-venv "$3" /tmp/mml-run' sh "$ROOT" "$cp39" "$codecs"
fi

[ -n "$cp311" ] || exit 0
say "$(basename "$cp311") on this machine ($(. /etc/os-release; echo "$PRETTY_NAME"))," \
  "the system's copies hidden"
host=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11.*/bin/python 2> /dev/null | head -1)
host=${host:-$(command -v python3.11)}
venv=$work/check-cp311
rm -rf "$venv" "$work/run"
"$host" -m venv "$venv"
"$venv/bin/pip" install -q "$cp311" pillow
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
# what to hide: this machine's copy of each library the wheel bundles (by its original
# soname, from the wheel's LIBRARIES.txt) and of each the unrepaired extension needs
rm -rf "$work/x" && mkdir -p "$work/x"
"$venv/bin/python" -m zipfile -e "$(ls "$raw"/mmloader-*-cp311-*.whl)" "$work/x"
GLIBC='^(ld-linux-x86-64\.so\.2|lib(c|m|dl|pthread|rt|resolv|util|nsl|anl)\.so\.[0-9]+)$'
names=$( (awk '!/^#/ { print $2 }' "$site"/mmloader-*.dist-info/licenses/bundled/LIBRARIES.txt
  objdump -p "$work"/x/mmloader/_core*.so | awk '$1 == "NEEDED" { print $2 }') |
  grep -vE "$GLIBC" | sort -u)
originals=$(for n in $names; do
  ldconfig -p | awk -v n="$n" '$1 == n && /x86-64/ { print $NF }'
done | xargs -r realpath | sort -u)
used=$("$venv/bin/python" -c "
import numpy, PIL.Image, yaml  # what the demo imports before mmloader
print('\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))
" | grep '^/' | grep -v "^$site/" | xargs -r realpath | sort -u)
hide=$(comm -23 <(echo "$originals") <(echo "$used"))
kept=$(comm -12 <(echo "$originals") <(echo "$used") | xargs -r -n1 basename | tr '\n' ' ')
say "hiding $(echo "$hide" | wc -w) system libraries: $(echo "$hide" | xargs -n1 basename | tr '\n' ' ')"
[ -z "$kept" ] || say "left visible (the interpreter, numpy or Pillow load them): $kept"
wrap=(unshare -m --propagation private "$host" "$ROOT/scripts/wheel/hide.py" $hide --)
if (cd "$work/x" && LD_LIBRARY_PATH= "${wrap[@]}" "$venv/bin/python" -c 'import mmloader') \
  > "$work/control.log" 2>&1; then
  say "FAILED: the unrepaired wheel imports with the system copies hidden: the hiding failed"
  exit 1
fi
grep -q "file too short" "$work/control.log" ||
  { cat "$work/control.log"; say "FAILED: the control did not fail on a hidden file"; exit 1; }
say "control, the unrepaired wheel: $(grep -m1 -o '[^ ]*: file too short' "$work/control.log")"
bash scripts/wheel/check.sh "$venv" "$codecs" "$work/run" "${wrap[@]}"
