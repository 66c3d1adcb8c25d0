"""The C tree's shape stays kept: no C function over ~80 lines (scripts/c_limits.py
measures; `python3 scripts/c_limits.py` lists the longest), and csrc/core's subsystem
folders include only lower levels (scripts/c_layers.py)."""

from __future__ import annotations

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import c_layers  # noqa: E402
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
    over = c_limits.over_limits([("x.c", 5000)], c_limits.functions("x.c", text))
    assert over == ["x.c:9: f() is 81 lines (limit 80)"]


def test_subsystem_folders_include_only_lower_levels():
    assert c_layers.violations() == []
    pairs = {(s, d) for s, d, _, _ in c_layers.edges()}
    assert ("loader", "base") in pairs and ("video", "vision") in pairs  # the graph was read


def test_an_include_up_or_sideways_breaks_the_layers(tmp_path, monkeypatch):
    core = tmp_path / "csrc" / "core"
    for d, body in {
        "base": '#include "mml/loader.h"\n',  # up: base -> loader
        "text": '#include "mml/image.h"\n',  # sideways: same level
        "loader": '#include "mml/common.h"\n',  # down: fine
        "image": "",
    }.items():
        (core / d).mkdir(parents=True)
        (core / d / "x.c").write_text(body)
    for name, d in {"common": "base", "loader": "loader", "image": "image"}.items():
        (core / d / f"{name}.c").write_text("")
    (tmp_path / "csrc" / "include" / "mml").mkdir(parents=True)
    monkeypatch.setattr(c_layers, "ROOT", str(tmp_path))
    monkeypatch.setattr(c_layers, "CORE", str(core))
    bad = c_layers.violations()
    assert len(bad) == 2, bad
    assert any("(base -> loader): not a lower level" in b for b in bad)
    assert any("(text -> image)" in b for b in bad)


def test_c_tests_mirror_the_subsystem_folders():
    """tests/c has a folder per csrc/core subsystem (and no other), each with its tests
    (test-<area>.c): a reader finds a subsystem's tests where its code is."""
    core = {f for fs in c_layers.LEVELS for f in fs}
    assert core == {
        d for d in os.listdir(c_layers.CORE) if os.path.isdir(os.path.join(c_layers.CORE, d))
    }
    tests = os.path.join(ROOT, "tests", "c")
    have = {
        d
        for d in os.listdir(tests)
        if os.path.isdir(os.path.join(tests, d))
        and any(
            f.startswith("test-") and f.endswith(".c") for f in os.listdir(os.path.join(tests, d))
        )
    }
    assert have == core


def _callers(name: str) -> set:
    """The C files (relative to csrc/) that call `name`, comments and its definition left
    out."""
    out = set()
    for path in glob.glob(os.path.join(ROOT, "csrc", "**", "*.c"), recursive=True):
        with open(path) as f:
            src = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        src = re.sub(r"^\w[^;{]*\b" + name + r"\([^;{]*\)\s*\{", "", src, flags=re.M)
        if re.search(r"\b" + name + r"\(", src):
            out.add(os.path.relpath(path, os.path.join(ROOT, "csrc")))
    return out


def test_one_measuring_path_and_no_second_loader():
    """Issue 32: the worker, the planning pass and the index builder size a sample with one
    function, and the planning pass runs no second Loader.  The worker calls
    mml_sample_plan (= mml_sample_measure + the settings' checks); the planning pass and the
    index builder call measure.c's ld_measure, which ends in mml_sample_measure; only the
    binding makes a Loader."""
    assert _callers("mml_sample_measure") == {"core/loader/pipeline.c", "core/loader/measure.c"}
    assert _callers("mml_sample_plan") == {"core/loader/loader_worker.c"}
    assert _callers("ld_measure") == {"core/loader/loader_plan.c", "core/loader/dsindex_build.c"}
    assert _callers("mml_loader_new") == {"py/loader_py.c"}
