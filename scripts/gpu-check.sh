#!/usr/bin/env bash
# GPU check, to run as is on a machine with an NVIDIA GPU and a CUDA build of PyTorch:
#   scripts/gpu-check.sh [RESULTS_DIR]          (default: gpu-results/)
#   MML_GPU_CHECK_WHEEL=dist/mmloader-...-cp312-...whl scripts/gpu-check.sh [RESULTS_DIR]
# (on a lent device machine: scripts/gpu-check.sh "$OUT", so the results come back).
# Two modes:
#   in place (default)  builds the extension in place (the machine needs the build
#                       dependencies: headers of csrc/system-libs.txt) and tests the tree
#   wheel               MML_GPU_CHECK_WHEEL names a built wheel: pip installs it (--no-deps)
#                       into a fresh folder and the tests import that package -- pytest
#                       runs from a folder outside the repository with the rootdir kept
#                       off sys.path, and tests/conftest.py (MML_TEST_PACKAGE) stops the
#                       run if another mmloader was imported.  What a cluster installs; the
#                       wheel bundles its C libraries, so no headers are needed.
# Nothing else is installed: torch, pytest, pytest-benchmark, numpy, pillow must be there.
# Writes to RESULTS_DIR:
#   env.txt          GPU, driver, torch, which mmloader (and wheel), which libcudart it loaded
#   c-tests.txt      the C core tests (plain build; the CUDA layer against its fake runtime);
#                    skipped, with the missing headers named, where they cannot be built
#   gpu-tests.txt    pytest -m gpu on the test files that hold GPU tests (mostly
#                    tests/test_cuda.py: device batches == CPU batches, no stream races
#                    under a consumer on its own stream, no leak, pinned memory and
#                    non_blocking copies of released batches; expand_pixels on the device)
#   fallback.txt     the CPU-fallback tests with CUDA hidden (MML_CUDA_DISABLE=1)
#   bench.txt/.json  benchmarks/bench_cuda.py (H2D throughput vs torch, wait-time ratio)
#   pixels.txt/.json benchmarks/bench_pixels_gpu.py (expand_pixels output bandwidth, uint8
#                    H2D through the loader vs a raw pinned copy: target >= 0.80)
#   summary.txt      one line per step: ok / FAILED / ALL SKIPPED / skipped: why
# Exit status: 0 when every step that ran passed and the GPU tests really ran.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=$(realpath -m "${1:-gpu-results}")
PY=${PYTHON:-python3}
WHEEL=${MML_GPU_CHECK_WHEEL:-}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
status=0
note() { echo "$1" | tee -a "$OUT/summary.txt"; }

{
  date -u
  nvidia-smi || echo "nvidia-smi: not available"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'devices', torch.cuda.device_count())" \
    || echo "torch: not importable"
} > "$OUT/env.txt" 2>&1

if [ -n "$WHEEL" ]; then
  # The installed wheel, imported from a folder outside the repository: a Python started
  # in the repository root would import the source tree's mmloader/ (no _core in it).
  WHEEL=$(realpath "$WHEEL") || { note "install: FAILED (no wheel $MML_GPU_CHECK_WHEEL)"; exit 1; }
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/mml-gpu-check.XXXXXX")
  site=$scratch/site
  if ! $PY -m pip install -q --no-deps --no-index --no-compile --target "$site" "$WHEEL" \
    > "$OUT/build.txt" 2>&1; then
    note "install: FAILED (see build.txt)"; tail -20 "$OUT/build.txt"; exit 1
  fi
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} MML_TEST_PACKAGE=$site/mmloader
  RUNDIR=$scratch/run
  mkdir -p "$RUNDIR"
  ROOTPATH=(-o pythonpath=)  # pyproject.toml's pythonpath = ["."] puts the tree first
  note "install: ok ($(basename "$WHEEL"))"
else
  if ! $PY setup.py -q build_ext --inplace -j "$(nproc)" > "$OUT/build.txt" 2>&1; then
    note "build: FAILED (see build.txt)"; tail -20 "$OUT/build.txt"; exit 1
  fi
  RUNDIR=$REPO
  ROOTPATH=()
  note "build: ok"
fi
(cd "$RUNDIR" && $PY -c "import os, torch, mmloader, mmloader._core as c; print('mmloader:', os.path.dirname(mmloader.__file__), '_core:', os.path.basename(c.__file__)); print('mmloader cudart:', c.cuda_load(), 'devices:', c.cuda_device_count())") \
  >> "$OUT/env.txt" 2>&1 || { note "cuda_load: FAILED (see env.txt)"; status=1; }
[ -z "$WHEEL" ] || echo "wheel: $(basename "$WHEEL")" >> "$OUT/env.txt"

missing_headers() {  # the headers of csrc/system-libs.txt this machine's compiler cannot find
  local name pc header flags
  while read -r name pc header _; do
    flags=$( [ "$pc" = - ] || pkg-config --cflags-only-I "$pc" 2> /dev/null)
    # shellcheck disable=SC2086
    echo "#include <$header>" | ${CC:-cc} -E $flags -x c - > /dev/null 2>&1 || echo -n "$header "
  done < <(awk '!/^#/ && NF' csrc/system-libs.txt)
}
missing=$(missing_headers)
if [ -n "$missing" ]; then
  echo "skipped: no headers: ${missing% }" > "$OUT/c-tests.txt"
  note "c-tests: skipped: no headers (${missing% })"
elif timeout 600 make -s -C tests/c -j "$(nproc)" plain > "$OUT/c-tests.txt" 2>&1; then
  note "c-tests: ok"
else note "c-tests: FAILED (see c-tests.txt)"; status=1; fi

run_pytest() {  # run_pytest ARGS...: from RUNDIR, on the tree's tests, importing the mmloader chosen above
  (cd "$RUNDIR" && timeout 600 $PY -m pytest -p no:cacheprovider ${ROOTPATH[@]+"${ROOTPATH[@]}"} "$@")
}

# Only the files that hold GPU tests: collecting the others would need what they import
# (Ray, Megatron, moto, ...), which a GPU machine may not have.
mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" "$REPO"/tests/test_*.py)
run_pytest -q -rs -m gpu "${gpu_files[@]}" --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.txt" 2>&1
rc=$?
if [ $rc -ne 0 ]; then note "gpu-tests: FAILED (rc=$rc, see gpu-tests.txt)"; status=1
elif grep -qE "[0-9]+ passed" "$OUT/gpu-tests.txt"; then note "gpu-tests: ok ($(tail -1 "$OUT/gpu-tests.txt"))"
else note "gpu-tests: ALL SKIPPED (no usable GPU/torch CUDA? see gpu-tests.txt)"; status=1; fi

if MML_CUDA_DISABLE=1 run_pytest -q -rs -m "not gpu" "$REPO/tests/test_cuda.py" > "$OUT/fallback.txt" 2>&1; then
  note "fallback-tests: ok ($(tail -1 "$OUT/fallback.txt"))"
else note "fallback-tests: FAILED (see fallback.txt)"; status=1; fi

if run_pytest -q -s "$REPO/benchmarks/bench_cuda.py" --benchmark-only \
  --benchmark-json="$OUT/bench.json" > "$OUT/bench.txt" 2>&1; then
  if grep -qE "[0-9]+ passed" "$OUT/bench.txt"; then note "bench: ok"
  else note "bench: ALL SKIPPED (see bench.txt)"; status=1; fi
  grep -E "^\[bench_cuda\]" "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
else note "bench: FAILED (see bench.txt)"; status=1; fi

if run_pytest -q -s "$REPO/benchmarks/bench_pixels_gpu.py" --benchmark-only \
  --benchmark-json="$OUT/pixels.json" > "$OUT/pixels.txt" 2>&1; then
  if grep -qE "[0-9]+ passed" "$OUT/pixels.txt"; then note "pixels-bench: ok"
  else note "pixels-bench: ALL SKIPPED (see pixels.txt)"; status=1; fi
  grep -E "^\[bench_pixels\]" "$OUT/pixels.txt" | tee -a "$OUT/summary.txt"
else note "pixels-bench: FAILED (see pixels.txt)"; status=1; fi

[ -z "$WHEEL" ] || rm -rf "$scratch"
exit $status
