"""Runs the C core's own tests (tests/c) built plain, under ASan+UBSan and under TSan."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.timeout(1200)  # builds the core and every test program; slow on a busy machine
@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_c_core(variant):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    r = subprocess.run(["make", "-s", "-C", os.path.join(HERE, "c"), "-j2", variant],
                       capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-8000:]
    assert "FAIL" not in out, out[-8000:]
    assert "WARNING: ThreadSanitizer" not in out, out[-8000:]
    assert "ERROR: AddressSanitizer" not in out, out[-8000:]
    assert "runtime error:" not in out, out[-8000:]
