#!/usr/bin/env bash
# Builds mmloader._core with AddressSanitizer + UndefinedBehaviorSanitizer into
# build/asan/ and runs the Python suites that drive the engine through it (the Python
# interpreter itself is not instrumented: libasan is preloaded, leak checking is off
# because CPython keeps memory until exit).  Any sanitizer report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
PY=$PYTHON
out=build/asan
rm -rf "$out/mmloader"
mkdir -p "$out"
MML_SANITIZE=address $PY setup.py -q build_ext --build-lib "$out" --build-temp build/asan-tmp \
  -j "$(nproc)" 2>&1 | grep -vE '^(copying|running)|Setuptools|corresp|^\s*$|\*\*\*|!!' || true
# The package's Python files beside the instrumented extension.
for f in mmloader/*.py mmloader/*.pyi mmloader/py.typed; do cp "$f" "$out/mmloader/"; done
cp -r mmloader/data "$out/mmloader/"
if [ $# -gt 0 ]; then suites=("$@"); else
  suites=(tests/test_loader.py tests/test_loader_lifecycle.py tests/test_tokenizer.py
          tests/test_vision.py tests/test_template.py tests/test_collate.py tests/test_fetch.py
          tests/test_image_bmp.py tests/test_image_gif.py tests/test_image_jpeg.py
          tests/test_image_refused.py tests/test_image_datauri.py tests/test_image_routes.py
          tests/test_mixture.py tests/test_files.py tests/test_records.py
          tests/test_webdataset.py tests/test_plan_only.py tests/test_hardening.py
          tests/test_video.py tests/test_video_resize.py tests/test_video_simd.py
          tests/test_parquet.py)
fi
log=$(mktemp)
set +e
LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:handle_segv=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
MML_ASAN_BUILD=1 PYTHONPATH="$PWD/$out" \
  $PY -P -m pytest -q -p no:cacheprovider -o pythonpath="$out" -m "not slow and not gpu" \
  --deselect tests/test_c_core.py "${suites[@]}" \
  2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if grep -qE "ERROR: AddressSanitizer|runtime error:" "$log"; then
  echo "[mmloader] sanitizer report in the ASan run" >&2
  exit 1
fi
exit "$rc"
