#!/usr/bin/env bash
# GPU check, to run as is on a machine with an NVIDIA GPU and a CUDA build of PyTorch:
#   scripts/gpu-check.sh [RESULTS_DIR]          (default: gpu-results/)
# (on a lent device machine: scripts/gpu-check.sh "$OUT", so the results come back).
# Nothing is installed: the machine needs the build dependencies and a CUDA PyTorch.
# Builds the extension in place, then writes to RESULTS_DIR:
#   env.txt          GPU, driver, torch, which libcudart mmloader loaded
#   c-tests.txt      the C core tests (plain build; the CUDA layer against its fake runtime)
#   gpu-tests.txt    pytest -m gpu tests/ (mostly tests/test_cuda.py: device batches ==
#                    CPU batches, no stream races under a consumer on its own stream, no
#                    leak, pinned memory and non_blocking copies of released batches)
#   fallback.txt     the CPU-fallback tests with CUDA hidden (MML_CUDA_DISABLE=1)
#   bench.txt/.json  benchmarks/bench_cuda.py (H2D throughput vs torch, wait-time ratio)
#   pixels.txt/.json benchmarks/bench_pixels_gpu.py (expand_pixels output bandwidth, uint8
#                    H2D through the loader vs a raw pinned copy: target >= 0.80)
#   summary.txt      one line per step: ok / FAILED / ALL SKIPPED
# Exit status: 0 when every step passed and the GPU tests really ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-results}
PY=${PYTHON:-python3}
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

if ! $PY setup.py -q build_ext --inplace -j "$(nproc)" > "$OUT/build.txt" 2>&1; then
  note "build: FAILED (see build.txt)"; tail -20 "$OUT/build.txt"; exit 1
fi
note "build: ok"
$PY -c "import torch, mmloader._core as c; print('mmloader cudart:', c.cuda_load(), 'devices:', c.cuda_device_count())" \
  >> "$OUT/env.txt" 2>&1 || { note "cuda_load: FAILED (see env.txt)"; status=1; }

if timeout 600 make -s -C tests/c -j "$(nproc)" plain > "$OUT/c-tests.txt" 2>&1; then note "c-tests: ok"
else note "c-tests: FAILED (see c-tests.txt)"; status=1; fi

timeout 600 $PY -m pytest -q -rs -m gpu -p no:cacheprovider tests/ \
  --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.txt" 2>&1
rc=$?
if [ $rc -ne 0 ]; then note "gpu-tests: FAILED (rc=$rc, see gpu-tests.txt)"; status=1
elif grep -qE "[0-9]+ passed" "$OUT/gpu-tests.txt"; then note "gpu-tests: ok ($(tail -1 "$OUT/gpu-tests.txt"))"
else note "gpu-tests: ALL SKIPPED (no usable GPU/torch CUDA? see gpu-tests.txt)"; status=1; fi

if MML_CUDA_DISABLE=1 timeout 600 $PY -m pytest -q -rs -m "not gpu" -p no:cacheprovider \
     tests/test_cuda.py > "$OUT/fallback.txt" 2>&1; then note "fallback-tests: ok"
else note "fallback-tests: FAILED (see fallback.txt)"; status=1; fi

if timeout 600 $PY -m pytest -q -s -p no:cacheprovider benchmarks/bench_cuda.py --benchmark-only \
     --benchmark-json="$OUT/bench.json" > "$OUT/bench.txt" 2>&1; then
  if grep -qE "[0-9]+ passed" "$OUT/bench.txt"; then note "bench: ok"
  else note "bench: ALL SKIPPED (see bench.txt)"; status=1; fi
  grep -E "^\[bench_cuda\]" "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
else note "bench: FAILED (see bench.txt)"; status=1; fi

if timeout 600 $PY -m pytest -q -s -p no:cacheprovider benchmarks/bench_pixels_gpu.py \
     --benchmark-only --benchmark-json="$OUT/pixels.json" > "$OUT/pixels.txt" 2>&1; then
  if grep -qE "[0-9]+ passed" "$OUT/pixels.txt"; then note "pixels-bench: ok"
  else note "pixels-bench: ALL SKIPPED (see pixels.txt)"; status=1; fi
  grep -E "^\[bench_pixels\]" "$OUT/pixels.txt" | tee -a "$OUT/summary.txt"
else note "pixels-bench: FAILED (see pixels.txt)"; status=1; fi

exit $status
