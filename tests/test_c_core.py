"""Runs the C core's own tests (tests/c: one runner, run-tests, each test in its own child
process) built plain, under ASan+UBSan and under TSan."""

import glob
import os
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.timeout(1200)  # builds the core and every test program; slow on a busy machine
@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_c_core(variant):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    r = subprocess.run(
        ["make", "-s", "-C", os.path.join(HERE, "c"), "-j2", variant],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-8000:]
    assert "FAIL" not in out, out[-8000:]
    assert "WARNING: ThreadSanitizer" not in out, out[-8000:]
    assert "ERROR: AddressSanitizer" not in out, out[-8000:]
    assert "runtime error:" not in out, out[-8000:]


def test_every_c_test_is_listed():
    """A TEST() that is not in tests/c/test-list.h would never run."""
    c = os.path.join(HERE, "c")
    defined = set()
    for path in glob.glob(os.path.join(c, "test-*.c")) + glob.glob(
        os.path.join(c, "*", "test-*.c")
    ):
        with open(path) as f:
            defined |= set(re.findall(r"^TEST\((\w+)\)", f.read(), re.M))
    with open(os.path.join(c, "test-list.h")) as f:
        text = f.read()
    declared = set(re.findall(r"^TEST_DECLARE\((\w+)\)", text, re.M))
    entries = re.findall(r"^\s*TEST_ENTRY\((\w+)\)", text, re.M)
    assert defined, "no TEST() found"
    assert sorted(defined - declared) == [], "TEST()s missing from test-list.h"
    assert sorted(set(entries) ^ declared) == [], "TEST_DECLARE and TEST_ENTRY differ"
    assert len(entries) == len(set(entries)), "a test listed twice"
