#!/usr/bin/env bash
# The three libraries bullseye has too old for mmloader, built from Debian 12's patched
# sources (unpacked by scripts/wheel/root.sh in /usr/src/mml) into /opt/mml, inside the
# bullseye build root (root.sh runs it there through inroot):
#   libcurl 7.88  (CURLOPT_PROTOCOLS_STR needs 7.85; bullseye has 7.74): lib/ only, the
#                 protocols mmloader fetches over (HTTP(S), file) and TLS, HTTP/2, zstd
#   libtiff 4.5   (TIFFOpenOptions* needs 4.5; bullseye has 4.2): the library only
#   FFmpeg 5.1    (avformat_index_get_entry needs 4.4; bullseye has 4.3): the decoders,
#                 demuxers and parsers the README lists, LGPL only (no --enable-gpl), AV1
#                 through bullseye's libdav1d; no programs, docs, encoders, filters, devices
# 1. The three build at once, each with make -jJOBS and its own log (/usr/src/mml/NAME.log):
#    their configure steps are serial, so one library's configure overlaps another's make.
# 2. No debug info (curl -O2, libtiff and FFmpeg -O3, none with -g): less to compile, smaller wheels.
# 3. Each writes its licence files to /opt/mml/share/licenses/NAME/ last: a library with
#    that folder is complete and is not built again (a run stopped half-way).
# Usage (inside the root): JOBS=N libs.sh
set -euo pipefail
P=/opt/mml
J=${JOBS:-2}
export PKG_CONFIG_PATH=$P/lib/pkgconfig CPPFLAGS=-I$P/include LDFLAGS="-L$P/lib -Wl,-rpath,$P/lib"
lic() { mkdir -p $P/share/licenses/"$1"; cp "${@:2}" $P/share/licenses/"$1"/; }

build_curl() {
  cd /usr/src/mml/curl-*/
  CFLAGS=-O2 ./configure --prefix=$P --disable-static --disable-dependency-tracking --with-openssl \
    --with-nghttp2 --with-zlib --with-zstd --without-libpsl --without-libidn2 --without-brotli \
    --without-librtmp --without-libssh2 --without-libgsasl --disable-ldap --disable-ldaps \
    --disable-rtsp --disable-dict --disable-telnet --disable-tftp --disable-pop3 --disable-imap \
    --disable-smtp --disable-gopher --disable-mqtt --disable-smb --disable-manual \
    --with-ca-bundle=/etc/ssl/certs/ca-certificates.crt
  make -j"$J" -C lib
  make -C lib install
  make -C include install
  make install-pkgconfigDATA
  lic curl COPYING
}

build_tiff() {
  cd /usr/src/mml/tiff-*/
  cmake -S . -B mml-build -DCMAKE_INSTALL_PREFIX=$P -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -Dcxx=OFF -Djbig=OFF -Dlerc=OFF -Dtiff-tools=OFF -Dtiff-tests=OFF \
    -Dtiff-contrib=OFF -Dtiff-docs=OFF
  make -j"$J" -C mml-build
  make -C mml-build install
  lic tiff LICENSE.md
}

build_ffmpeg() {
  cd /usr/src/mml/ffmpeg-*/
  ./configure --prefix=$P --enable-shared --disable-static --disable-debug --disable-programs \
    --disable-doc --disable-avdevice --disable-avfilter --disable-swresample --disable-postproc \
    --disable-network --disable-everything --disable-autodetect --enable-pic --enable-zlib \
    --enable-libdav1d \
    --enable-decoder=h264,hevc,vp8,vp9,libdav1d,mpeg4,mjpeg,mpeg1video,mpeg2video,h263 \
    --enable-demuxer=mov,matroska,avi \
    --enable-parser=h264,hevc,vp8,vp9,av1,mpeg4video,mjpeg,mpegvideo,h263 \
    --enable-protocol=file
  make -j"$J"
  make install
  lic ffmpeg LICENSE.md COPYING.LGPLv2.1
}

declare -A pid
for name in curl tiff ffmpeg; do
  [ -d $P/share/licenses/$name ] && continue
  ( t0=$SECONDS
    "build_$name" > /usr/src/mml/$name.log 2>&1
    echo "[wheel-root]   $name: $((SECONDS - t0))s" ) &
  pid[$name]=$!
done
bad=0
for name in "${!pid[@]}"; do
  wait "${pid[$name]}" && continue
  tail -30 /usr/src/mml/$name.log
  echo "[wheel-root] FAILED: $name (log: /usr/src/mml/$name.log in the build root)"
  bad=1
done
[ $bad = 0 ] || exit 1
echo "[wheel-root] libcurl $(pkg-config --modversion libcurl), libtiff" \
  "$(pkg-config --modversion libtiff-4), FFmpeg libavcodec $(pkg-config --modversion libavcodec)"
echo $P/lib > /etc/ld.so.conf.d/mml.conf && ldconfig # for ldd and auditwheel
