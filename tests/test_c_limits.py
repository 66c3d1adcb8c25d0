"""Issue 19's size limits stay kept: no C file under csrc/ over ~900 lines, no C function
over ~80 (scripts/c_limits.py measures; `python3 scripts/c_limits.py` lists the longest)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import c_limits  # noqa: E402


def test_c_files_and_functions_within_the_limits():
    files, funcs = c_limits.measure()
    assert len(files) > 50 and len(funcs) > 500  # the whole engine was measured
    assert c_limits.over_limits(files, funcs) == []


def test_functions_are_measured_signature_to_brace():
    text = "\n".join(
        [
            "#include <x.h>",
            "static const int table[] = {",
            "    1, 2,",
            "};",
            "struct s {",
            "  int a;",
            "};",
            "static int small(int a) { return a; }",
            "int f(int a,",
            "      int b) { /* the body */",
            *["  a++;"] * 77,
            "  return a + b;",
            "}",
            "void g(void);",
            "static inline void h(void) {",
            "  if (1) {",
            "  }",
            "}",
        ]
    )
    got = {f.name: f.lines for f in c_limits.functions("x.c", text)}
    assert got == {"f": 81, "h": 4}  # one-line bodies and declarations are not counted
    over = c_limits.over_limits([("x.c", 901)], c_limits.functions("x.c", text))
    assert over == ["x.c: 901 lines (limit 900)", "x.c:9: f() is 81 lines (limit 80)"]
