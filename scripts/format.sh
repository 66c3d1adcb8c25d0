#!/usr/bin/env bash
# Formats the tree: clang-format (.clang-format) on the C sources (csrc/, tests/c/, fuzz/)
# and ruff format (pyproject [tool.ruff]) on the Python.
#   scripts/format.sh           apply, in place
#   scripts/format.sh --check   change nothing: print how many lines each tool would change
#                               (and ruff check's findings); exit 1 when anything would
# Needs clang-format (14, as scripts/install-deps.sh installs) and ruff (requirements-test.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
CF=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$CF" ]; then echo "[mmloader] clang-format is not installed" >&2; exit 2; fi
if ! command -v ruff > /dev/null; then echo "[mmloader] ruff is not installed" >&2; exit 2; fi
mapfile -t cfiles < <(git ls-files 'csrc/*.c' 'csrc/*.h' 'tests/c/*.c' 'tests/c/*.h' 'fuzz/*.c' 'fuzz/*.h')
pyroots=(mmloader tests scripts benchmarks)
if [ "${1:-}" != "--check" ]; then
  "$CF" -i "${cfiles[@]}"
  ruff format -q "${pyroots[@]}"
  exit 0
fi
clines=0 cchanged=0
for f in "${cfiles[@]}"; do
  n=$("$CF" "$f" | diff "$f" - | grep -c '^>' || true)
  if [ "$n" -gt 0 ]; then clines=$((clines + n)) cchanged=$((cchanged + 1)); fi
done
pylines=$(ruff format --diff "${pyroots[@]}" 2> /dev/null | grep -c '^+[^+]' || true)
echo "[mmloader] clang-format would change $clines lines in $cchanged of ${#cfiles[@]} C files"
echo "[mmloader] ruff format would change $pylines lines"
lint=0
ruff check -q --output-format concise "${pyroots[@]}" || lint=1
[ "$clines" -eq 0 ] && [ "$pylines" -eq 0 ] && [ "$lint" -eq 0 ]
