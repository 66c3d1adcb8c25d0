"""Packaging facts that must not drift: declared dependencies vs. the requirements files
the set-up scripts install."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _names(reqs) -> set:
    return {re.split(r"[\s\[<>=!~;]", r.strip(), maxsplit=1)[0].lower() for r in reqs}


def _req_file(name: str) -> list:
    with open(os.path.join(ROOT, name)) as f:
        return [ln.split("#", 1)[0].strip() for ln in f if ln.split("#", 1)[0].strip()]


def test_requirements_txt_is_dependencies_demo_extra_and_build_requires():
    pp = _pyproject()
    proj = pp["project"]
    declared = (
        proj["dependencies"]
        + proj["optional-dependencies"]["demo"]
        + pp["build-system"]["requires"]
    )
    assert _names(_req_file("requirements.txt")) == _names(declared)


def test_requirements_test_covers_the_test_extra():
    lines = _req_file("requirements-test.txt")
    assert "-r requirements.txt" in lines
    test_extra = _names(_pyproject()["project"]["optional-dependencies"]["test"])
    listed = _names(ln for ln in lines if not ln.startswith("-")) | _names(
        _req_file("requirements.txt")
    )
    assert test_extra <= listed


def test_system_libs_table_is_well_formed():
    rows = [
        ln.split("#", 1)[0].split() for ln in open(os.path.join(ROOT, "csrc", "system-libs.txt"))
    ]
    rows = [r for r in rows if r]
    assert rows
    for r in rows:
        assert len(r) in (5, 6) and r[5:] in ([], ["tests"]), r
        assert r[2].endswith(".h") and r[4].endswith("-dev") or r[4] == "build-essential", r
    assert len({r[0] for r in rows}) == len(rows)
