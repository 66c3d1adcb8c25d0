"""CUDA support: the runtime is loaded at run time, so everything here but the tests marked
`gpu` runs (and must pass) on machines without CUDA.  The GPU tests skip cleanly without a
GPU and a CUDA build of PyTorch; scripts/gpu-check.sh runs them on a GPU machine.

The device stage itself (fences, streams, reuse rules) is tested without a GPU in
tests/c/test-cuda.c against a fake runtime; these tests cover the Python surface."""
import os
import subprocess
import sys
import textwrap

import pytest

import mmloader
from mmloader import _core

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, **env):
    """Runs code in a fresh interpreter (the runtime choice is made once per process)."""
    e = dict(os.environ)
    e.pop("MML_CUDA_DISABLE", None)
    e.pop("MML_CUDART", None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def require_gpu():
    if not _core.cuda_available():
        pytest.skip(f"no usable CUDA runtime: {_core.cuda_unavailable_reason()}")
    if torch_cuda() is None:
        pytest.skip("PyTorch without CUDA (the GPU tests check results through torch)")


# --- without a GPU ---------------------------------------------------------------------

def test_availability_is_consistent():
    avail = _core.cuda_available()
    assert isinstance(avail, bool)
    assert (_core.cuda_device_count() > 0) == avail
    reason = _core.cuda_unavailable_reason()
    assert (reason is None) == avail
    if not avail:
        with pytest.raises(mmloader.CudaError) as ei:
            _core.cuda_load()
        assert str(ei.value) == reason
        assert isinstance(ei.value, mmloader.Error)


def test_import_does_not_load_the_runtime():
    out = run_py("""
        import mmloader
        print(any('libcudart' in l for l in open('/proc/self/maps')))
    """)
    assert out.strip() == "False"


def test_disabled_by_environment():
    out = run_py("""
        import mmloader
        from mmloader import _core
        print(_core.cuda_available(), _core.cuda_device_count())
        print(_core.cuda_unavailable_reason())
        try:
            _core.cuda_load()
        except mmloader.CudaError as e:
            print('raised', e)
    """, MML_CUDA_DISABLE="1")
    lines = out.splitlines()
    assert lines[0] == "False 0"
    assert "MML_CUDA_DISABLE=1" in lines[1]
    assert lines[2].startswith("raised CUDA disabled")


def test_missing_library_named_in_error():
    out = run_py("""
        from mmloader import _core
        print(_core.cuda_available(), _core.cuda_unavailable_reason())
    """, MML_CUDART="/nonexistent/libcudart.so.12")
    assert out.startswith("False cannot load MML_CUDART=/nonexistent/libcudart.so.12")


def test_library_without_runtime_symbols():
    libm = "libm.so.6"
    out = run_py("""
        from mmloader import _core
        print(_core.cuda_available(), _core.cuda_unavailable_reason())
    """, MML_CUDART=libm)
    assert out.startswith("False")
    assert "missing symbol cudaGetDeviceCount" in out

