#!/usr/bin/env bash
# The test command: installs what it needs, builds, checks the formatting (scripts/format.sh
# --check) and the package's types (mypy, pyproject [tool.mypy]), runs the pytest suite
# (which includes the C core's own tests built plain, under ASan+UBSan and under TSan),
# then runs the engine-facing Python suites again against an ASan+UBSan build.
# Arguments are passed to the first pytest run.  A failing test run does not stop the
# next one: every step runs, a summary names each step's result, and the exit status is
# non-zero when any failed (installing or building failing stops at once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
bash scripts/build.sh
. scripts/python.sh  # the interpreter install-deps.sh installed into
PY=$PYTHON

summary=() status=0
step() {  # step NAME COMMAND...: runs it, records "ok" or "FAILED (exit N)"
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "[mmloader] == $name"
  "$@" || rc=$?
  if [ $rc -eq 0 ]; then summary+=("ok      $name ($((SECONDS - t0))s)")
  else summary+=("FAILED  $name (exit $rc, $((SECONDS - t0))s)"); status=1; fi
}
# LLaMA-Factory's own venv for tests/test_recipe_llamafactory.py (made once; when it
# cannot be made those tests skip, saying so, and the run goes on)
step "LLaMA-Factory venv (scripts/setup-llamafactory.sh)" bash -c 'bash scripts/setup-llamafactory.sh ||
  echo "[mmloader] no LLaMA-Factory venv: tests/test_recipe_llamafactory.py skips"'
# transformers 5.24's venv for tests/test_qwen3_video_prompt.py (qwen3_video_prompt=
# "blocks-in-pair"; made once, skipped with the reason when it cannot be made)
step "transformers 5.24 venv (scripts/setup-transformers524.sh)" bash -c 'bash scripts/setup-transformers524.sh ||
  echo "[mmloader] no transformers 5.24 venv: tests/test_qwen3_video_prompt.py skips blocks-in-pair"'
step "formatting (scripts/format.sh --check)" bash scripts/format.sh --check
step "types (mypy)" "$PY" -m mypy
step "pytest (${PY})" "$PY" -m pytest -q -m "not slow and not gpu" "$@"
step "pytest under ASan+UBSan" bash scripts/test-asan.sh
step "fuzz smoke (libFuzzer, ASan+UBSan)" bash scripts/fuzz.sh --smoke
echo "[mmloader] == summary"
printf '[mmloader]   %s\n' "${summary[@]}"
exit $status
