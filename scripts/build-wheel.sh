#!/usr/bin/env bash
# Builds the binary wheels (CPython 3.9-3.13, tagged manylinux_2_31: glibc 2.31 and newer,
# so Ubuntu 20.04+, Debian 11+, RHEL/Rocky 9+) and the sdist, and proves them:
#   1. scripts/wheel/root.sh: a Debian 11 (bullseye, glibc 2.31) build root made with
#      debootstrap: its gcc, its -dev packages, and libcurl / libtiff / FFmpeg built from
#      Debian 12's sources where bullseye's are too old; and a clean bullseye run root
#   2. the sdist (python -m build --sdist), then each wheel built from that sdist (so the
#      sdist is proven to hold everything needed to build) by that CPython -- the host's
#      interpreter (pyenv's, or python3.X on PATH) drives setuptools, but every compile,
#      link and pkg-config call runs chrooted in the build root (scripts/wheel/cc): the
#      extension sees only bullseye's glibc, headers and libraries, and the host's
#      interpreter gives only its Python headers.  Why not CPython built inside the root:
#      Debian's archive has sources for 3.11 and 3.13 only, and four CPython builds on
#      2 cores would take most of CI's time; the extension links no libpython, so the
#      headers of each version are all it takes from the interpreter.
#   3. scripts/wheel/repair.sh, inside the build root: auditwheel repair to
#      manylinux_2_31, every remaining non-glibc library bundled too (libz, libstdc++, ...),
#      the licences of every bundled library into the wheel's .dist-info/licenses/
#   4. scripts/wheel/prove.sh: the cp39 wheel in the clean bullseye root (its python3, a
#      venv, nothing else) and the host Python's wheel on this machine with the system's
#      copies of the bundled libraries hidden: ldd, import, the demo, the six codecs.
# Usage: scripts/build-wheel.sh [X.Y ...]     (default: 3.9 3.10 3.11 3.12 3.13; root)
# Env:   MML_WHEEL_ROOTS (default build/wheel-roots): where the roots are kept
# Output: dist/mmloader-VERSION-cpXY-cpXY-manylinux_2_31_x86_64.whl, dist/mmloader-VERSION.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
versions=${*:-3.9 3.10 3.11 3.12 3.13}
roots=$(realpath -m "${MML_WHEEL_ROOTS:-build/wheel-roots}")
work=$ROOT/build/wheel
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
say() { echo "[build-wheel] $*"; }
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap, chroot, mount)"; exit 1; }
. scripts/wheel/inroot.sh
t_all=$SECONDS
cpu() {  # CPU seconds (user + sys) of this script's finished children so far (from a
  # subshell too: $$ is this script)
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%d", ($14 + $15) / hz }' /proc/$$/stat
}
since() { echo "$((SECONDS - $1))s, CPU $(($(cpu) - $2))s"; }  # since T0 C0: wall, CPU

python_of() {  # python_of X.Y: the interpreter for that version (pyenv's, then PATH's)
  local c
  for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python "$(command -v "python$1")"; do
    if [ -x "$c" ] && "$c" -V > /dev/null 2>&1; then echo "$c"; return 0; fi
  done
  say "no python$1 found (pyenv, PATH)"
  return 1
}

# What needs no root, on the host while the roots build (mostly downloads): the tools venv
# (build, PyAV and numpy for the codec files), the sdist, each Python's venv with the build
# requirements of pyproject.toml (the wheels build with --no-isolation: no fresh build env
# per wheel), the codec files of the proof.
host=$(python_of 3.11 2> /dev/null || command -v python3)
rm -rf "$work/raw" "$work/repaired" "$work/tmp" "$work/codecs"
mkdir -p "$work/raw" "$work/repaired" "$work/tmp" dist
prep() {
  set -e
  [ -x "$work/tools/bin/python" ] || "$host" -m venv "$work/tools"
  "$work/tools/bin/pip" install -q build "$(grep -E '^av==' requirements-test.txt)" numpy
  echo "[prep] python -m build --sdist"
  "$work/tools/bin/python" -m build --sdist --outdir "$work/raw" .
  local reqs v venv
  reqs=$("$work/tools/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
  for v in $versions; do
    venv=$work/venv-$v
    [ -x "$venv/bin/python" ] || "$(python_of "$v")" -m venv "$venv"
    echo "[prep] venv-$v: build $(echo $reqs)"
    "$venv/bin/pip" install -q build $reqs
  done
  "$work/tools/bin/python" scripts/wheel/codecs.py make "$work/codecs"
  touch "$work/codecs/.made"
  echo "[prep] ok (${SECONDS}s)"
}
t0=$SECONDS c0=$(cpu)
(SECONDS=0; prep) > "$work/prep.log" 2>&1 &
prep_pid=$!
bash scripts/wheel/root.sh "$roots" || { kill $prep_pid 2> /dev/null; exit 1; }
wait $prep_pid || { tail -40 "$work/prep.log"; say "FAILED: the host side (log: $work/prep.log)"; exit 1; }
say "roots ready ($(since $t0 $c0), with the host side's): $roots/build, $roots/run"
say "host side: $(tail -1 "$work/prep.log")"
printf '[build_ext]\nparallel = %s\n' "$(nproc)" > "$work/parallel.cfg"  # setuptools' extra config
sdist=$(ls "$work"/raw/mmloader-*.tar.gz)
tar -xzf "$sdist" -C "$work/tmp"
src=$(ls -d "$work"/tmp/mmloader-*/)

# Each wheel from the sdist, by that Python, compiled and linked inside the build root.
for v in $versions; do
  t0=$SECONDS c0=$(cpu)
  py=$(python_of "$v")
  base=$("$py" -c 'import sys; print(sys.base_prefix)')
  venv=$work/venv-$v
  say "cp${v/./} wheel: $("$py" -V) ($py), compiled in the bullseye root"
  MML_ROOTFS=$roots/build MML_BIND="$ROOT $base" unshare -m --propagation private sh -c '
    r=$MML_ROOTFS
    mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" || exit 97
    for p in $MML_BIND; do mkdir -p "$r$p" && mount --bind "$p" "$r$p" || exit 98; done
    export MML_ROOTFS CC=$0/scripts/wheel/cc LDSHARED="$0/scripts/wheel/cc -shared" \
      PATH=$0/scripts/wheel/bin:$PATH TMPDIR=$1 \
      DIST_EXTRA_CONFIG=$1/../parallel.cfg
    exec "$2" -m build --wheel --no-isolation --outdir "$3" "$4"' \
    "$ROOT" "$work/tmp" "$venv/bin/python" "$work/raw" "$src" > "$work/build-$v.log" 2>&1 ||
    { tail -40 "$work/build-$v.log"; say "build failed (log: $work/build-$v.log)"; exit 1; }
  say "  built ($(since $t0 $c0)): $(basename "$(ls "$work"/raw/mmloader-*-cp${v/./}-*.whl)")"
done

t0=$SECONDS c0=$(cpu)
say "auditwheel repair, inside the build root"
MML_BIND="$ROOT" inroot "$roots/build" bash "$ROOT/scripts/wheel/repair.sh" "$work/raw" \
  "$work/repaired"
cp "$sdist" "$work"/repaired/*.whl dist/
say "repaired ($(since $t0 $c0))"

t0=$SECONDS c0=$(cpu)
bash scripts/wheel/prove.sh "$roots/run" "$work" \
  "$(ls "$work"/repaired/mmloader-*-cp39-*.whl 2> /dev/null || true)" \
  "$(ls "$work"/repaired/mmloader-*-cp311-*.whl 2> /dev/null || true)" "$work/raw"
say "proven ($(since $t0 $c0))"
say "ok ($(since $t_all 0)): dist/$(basename "$sdist")"
for w in "$work"/repaired/*.whl; do say "ok: dist/$(basename "$w") ($(du -k "$w" | cut -f1) KiB)"; done
