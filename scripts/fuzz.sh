#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan) and runs each.  Any
# crash, sanitizer report, leak or timeout fails the run; the input is kept in
# fuzz/build/findings/<target>/ (turn it into a regression case in
# tests/c/test-hardening.c and a seed in fuzz/corpus/<target>/).
#   scripts/fuzz.sh                 fuzz every target at random for $FUZZ_SECONDS
#                                   (default 60) seconds each: the search, run it here
#   scripts/fuzz.sh --smoke         what CI runs: every target's seeds, then a fixed number
#                                   of mutations from a fixed libFuzzer seed (the same
#                                   inputs on every run; seeds only where runs vary:
#                                   SMOKE_REPLAY; fuzz/Makefile says why)
#   scripts/fuzz.sh record state    the named targets only (with or after --smoke)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60} mode=run
if [ "${1:-}" = "--smoke" ]; then mode=smoke; shift; fi
# clang and its libFuzzer runtime (Debian: clang + libclang-rt-<version>-dev)
fuzzer_links() {
  echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
    clang -x c -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1
}
if ! command -v clang >/dev/null || ! fuzzer_links; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  command -v clang >/dev/null || $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=600 clang >/dev/null
  ver=$(clang -dumpversion | cut -d. -f1)
  $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=600 "libclang-rt-$ver-dev" >/dev/null
  fuzzer_links || { echo "[fuzz] clang cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi
make -s -C fuzz -j "$(nproc)" all
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  read -r -a targets <<<"$(make -s -C fuzz list)"
fi
failed=()
for t in "${targets[@]}"; do
  log=fuzz/build/$t.log
  if [ $mode = smoke ]; then what=$(make -s -C fuzz smoke-runs T="$t"); else what="${secs}s"; fi
  printf '[fuzz] %-16s %-12s ... ' "$t" "$what"
  if make -s -C fuzz "$mode" T="$t" SECONDS="$secs" >"$log" 2>&1; then
    echo "ok ($(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 'each once') runs)"
  else
    echo "FAILED (see $log)"
    tail -40 "$log" >&2
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "[fuzz] findings in: ${failed[*]}" >&2
  exit 1
fi
