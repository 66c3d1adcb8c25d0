"""Shared pytest settings for the benchmark suites (benchmarks/bench_*.py)."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Last: pyproject.toml's pythonpath puts the tree first anyway; an installed mmloader that
# scripts/gpu-check.sh puts on PYTHONPATH (and keeps the tree off) must win over the tree.
sys.path.append(ROOT)


def pytest_configure(config):
    if not os.environ.get("MML_TEST_PACKAGE"):
        return
    import pytest

    spec = importlib.util.spec_from_file_location(
        "mml_child", os.path.join(ROOT, "tests", "child.py")
    )
    child = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(child)
    try:
        child.check_package()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_addoption(parser):
    g = parser.getgroup("mmloader e2e benchmark")
    g.addoption(
        "--e2e-smoke",
        action="store_true",
        default=False,
        help="bench_e2e: a tiny dataset, one short run each: checks the suite works",
    )
    g.addoption(
        "--e2e-full",
        action="store_true",
        default=False,
        help="bench_e2e: also the naive/case-study/Ray peers, thread and wait sweeps",
    )
    g.addoption(
        "--e2e-out",
        default=None,
        help="bench_e2e: folder for e2e.json and the plots (default benchmarks/results)",
    )


def pytest_collection_modifyitems(config, items):
    """One end-to-end measurement can take minutes on a loaded machine: the repository's
    300 s per-test timeout is for the test suite, not for these."""
    import pytest

    for item in items:
        if "bench_e2e" in item.nodeid:
            item.add_marker(pytest.mark.timeout(3600))
    # bench_e2e runs repeat by repeat (its collection_order); the other suites keep theirs
    e2e = [i for i in items if hasattr(i.module, "collection_order")]
    if e2e:
        first = items.index(e2e[0])
        rest = [i for i in items if not hasattr(i.module, "collection_order")]
        e2e.sort(key=lambda i: i.module.collection_order(i))
        items[:] = rest[:first] + e2e + rest[first:]
