"""CUDA support: the runtime is loaded at run time, so everything here but the tests marked
`gpu` runs (and must pass) on machines without CUDA.  The GPU tests skip cleanly without a
GPU and a CUDA build of PyTorch; scripts/gpu-check.sh runs them on a GPU machine.

The device stage itself (fences, streams, reuse rules) is tested without a GPU in
tests/c/test-cuda.c against a fake runtime; these tests cover the Python surface."""

import ast
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

import mmloader
from child import PACKAGE_ROOT, child_env
from mmloader import _core

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, **env):
    """Runs code in a fresh interpreter (the runtime choice is made once per process), in
    a folder outside the repository, importing the mmloader this test imported."""
    e = child_env()
    e.pop("MML_CUDA_DISABLE", None)
    e.pop("MML_CUDART", None)
    e.update(env)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tempfile.gettempdir(),
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def require_gpu():
    # torch first: its libcudart is then the one mmloader finds (one runtime per process)
    if torch_cuda() is None:
        pytest.skip("no GPU visible to PyTorch (the GPU tests check results through torch)")
    if not _core.cuda_available():
        pytest.skip(f"no usable CUDA runtime: {_core.cuda_unavailable_reason()}")


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
    out = run_py(
        """
        import mmloader
        from mmloader import _core
        print(_core.cuda_available(), _core.cuda_device_count())
        print(_core.cuda_unavailable_reason())
        try:
            _core.cuda_load()
        except mmloader.CudaError as e:
            print('raised', e)
    """,
        MML_CUDA_DISABLE="1",
    )
    lines = out.splitlines()
    assert lines[0] == "False 0"
    assert "MML_CUDA_DISABLE=1" in lines[1]
    assert lines[2].startswith("raised CUDA disabled")


def test_runtime_of_installed_wheel_found_before_torch_import(tmp_path, fake_cudart):
    # pip's PyTorch loads site-packages/nvidia/cuda_runtime/lib/libcudart.so.12 (cu13:
    # nvidia/cu13/lib/libcudart.so.13); mmloader must find it even when it loads CUDA
    # before torch is imported.  Every `nvidia` folder on sys.path is one namespace package,
    # searched in sys.path order: the first folder's runtime comes first and is the one
    # loaded; a later one (here `later`, on a machine with a pip PyTorch also that of its
    # site-packages) is a candidate after it.
    import shutil

    lib = tmp_path / "first" / "nvidia" / "cuda_runtime" / "lib"
    later = tmp_path / "later" / "nvidia" / "cu13" / "lib"
    for d, name in ((lib, "libcudart.so.12"), (later, "libcudart.so.13")):
        d.mkdir(parents=True)
        shutil.copy(fake_cudart, d / name)
    out = run_py(
        """
        import sys
        from mmloader import _core, _cudart
        print(_cudart.candidates())
        print(_core.cuda_available(), _core.cuda_load())
    """,
        PYTHONPATH=os.pathsep.join(
            [str(tmp_path / "first"), str(tmp_path / "later"), PACKAGE_ROOT]
        ),
    )
    want, then = str(lib / "libcudart.so.12"), str(later / "libcudart.so.13")
    found, loaded = out.splitlines()
    found = ast.literal_eval(found)
    assert found[:2] == [want, then], found
    assert loaded == f"True {want}"


def test_missing_library_named_in_error():
    out = run_py(
        """
        from mmloader import _core
        print(_core.cuda_available(), _core.cuda_unavailable_reason())
    """,
        MML_CUDART="/nonexistent/libcudart.so.12",
    )
    assert out.startswith("False cannot load MML_CUDART=/nonexistent/libcudart.so.12")


def test_library_without_runtime_symbols():
    libm = "libm.so.6"
    out = run_py(
        """
        from mmloader import _core
        print(_core.cuda_available(), _core.cuda_unavailable_reason())
    """,
        MML_CUDART=libm,
    )
    assert out.startswith("False")
    assert "missing symbol cudaGetDeviceCount" in out


# --- the device path on a fake runtime (no GPU needed) ----------------------------------
# tests/c/fake_cudart.c is a CUDA runtime that runs on the CPU ("device" memory is host
# memory, streams are threads).  Pointing MML_CUDART at it runs the real device stage, the
# DLPack stream handshake and the buffer lifetime rules from Python.


@pytest.fixture(scope="session")
def fake_cudart(tmp_path_factory):
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake CUDA runtime")
    out = str(tmp_path_factory.mktemp("fakecuda") / "libfakecudart.so")
    src = os.path.join(REPO_ROOT, "tests", "c", "fake_cudart.c")
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-D_GNU_SOURCE",
            "-O1",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-o",
            out,
            src,
            "-lpthread",
        ],
        check=True,
        timeout=120,
    )
    return out


FAKE_PRELUDE = """
import ctypes, gc, os
import numpy as np
import mmloader
from mmloader import _core
fake = ctypes.CDLL(os.environ["MML_CUDART"])
for f in ("fake_cudart_live_device", "fake_cudart_live_pinned", "fake_cudart_live_events"):
    getattr(fake, f).restype = ctypes.c_long
fake.fake_cudart_stream_new.restype = ctypes.c_void_p
fake.fake_cudart_gate.argtypes = [ctypes.c_void_p, ctypes.c_int]
fake.fake_cudart_quiesce.argtypes = [ctypes.c_void_p]
fake.fake_cudart_memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
fake.fake_cudart_sync.argtypes = [ctypes.c_void_p]
fake.fake_cudart_last_stream.restype = ctypes.c_void_p
fake.fake_cudart_queued.argtypes = [ctypes.c_void_p]
fake.fake_cudart_queued.restype = ctypes.c_long
assert _core.cuda_available(), _core.cuda_unavailable_reason()

def host_view(t):
    # the fake's device memory is host memory: wait on the default stream, then read it
    t.__dlpack__(stream=None)
    return np.frombuffer(ctypes.string_at(t.data_ptr, t.nbytes), dtype=t.dtype).reshape(t.shape)
"""


def run_fake(fake_cudart, code):
    return run_py(FAKE_PRELUDE + textwrap.dedent(code), MML_CUDART=fake_cudart)


def test_fake_device_copy_and_dlpack_protocol(fake_cudart):
    out = run_fake(
        fake_cudart,
        """
        s = _core.DeviceStage(1)
        arrays = {"pixel_values": np.random.default_rng(0).random((5, 7), dtype=np.float32),
                  "input_ids": np.arange(-3, 30, dtype=np.int64),
                  "lengths": np.array([1, 2, 3], dtype=np.int32),
                  "mask": np.array([True, False, True]),
                  "raw": np.arange(256, dtype=np.uint8)}
        d = s.copy(arrays)
        assert set(d) == set(arrays)
        for k, a in arrays.items():
            t = d[k]
            assert t.device == "cuda:1" and t.__dlpack_device__() == (2, 1), k
            assert t.shape == a.shape and t.dtype == a.dtype.name, k
            assert np.array_equal(host_view(t), a), k
        t = d["pixel_values"]
        side = fake.fake_cudart_stream_new()
        for stream in (None, -1, 0, 1, 2, side):
            cap = t.__dlpack__(stream=stream)
            assert type(cap).__name__ == "PyCapsule"
        t.__dlpack__(stream=side, max_version=(1, 0))
        for bad, exc in (("x", TypeError), (-7, ValueError), (1.5, TypeError)):
            try:
                t.__dlpack__(stream=bad)
            except exc:
                pass
            else:
                raise AssertionError(f"stream={bad!r} accepted")
        try:
            t.__dlpack__(dl_device=(1, 0))
        except BufferError:
            pass
        else:
            raise AssertionError("exported cuda memory as cpu")
        try:
            _core.DeviceStage(2)
        except mmloader.CudaError as e:
            assert "cuda:2 does not exist" in str(e) or "device 2" in str(e), e
        else:
            raise AssertionError("DeviceStage(2) on a 2-device runtime")
        print("ok")
    """,
    )
    assert out.strip().endswith("ok")


def test_fake_consumer_waits_for_copy_and_holds_buffer(fake_cudart):
    out = run_fake(
        fake_cudart,
        """
        s = _core.DeviceStage(0)
        stage_stream = fake.fake_cudart_last_stream()   # created by DeviceStage
        side = fake.fake_cudart_stream_new()            # the consumer's stream
        a = np.arange(4096, dtype=np.int64)
        fake.fake_cudart_gate(stage_stream, 1)          # the copy cannot run yet
        t = s.copy({"x": a})["x"]
        t.__dlpack__(stream=side)                       # torch.from_dlpack on `side`
        seen = np.full(4096, -1, dtype=np.int64)
        fake.fake_cudart_memcpy(seen.ctypes.data, t.data_ptr, t.nbytes, side)  # a kernel
        fake.fake_cudart_quiesce(side)
        assert (seen == -1).all(), "the consumer read before the copy"
        fake.fake_cudart_gate(stage_stream, 0)
        fake.fake_cudart_sync(side)
        assert np.array_equal(seen, a)

        # the consumer queues a read, drops the tensor; the next copy must not reuse it
        old = t.data_ptr
        fake.fake_cudart_gate(side, 1)
        seen[:] = -1
        fake.fake_cudart_memcpy(seen.ctypes.data, t.data_ptr, t.nbytes, side)
        del t
        gc.collect()
        u = s.copy({"x": a + 1000})["x"]
        assert u.data_ptr != old, "device buffer reused while the consumer reads it"
        fake.fake_cudart_gate(side, 0)
        fake.fake_cudart_sync(side)
        assert np.array_equal(seen, a)
        assert np.array_equal(host_view(u), a + 1000)

        # pin_memory: a trainer's .cuda(non_blocking=True) on its stream, then release
        p = s.pinned({"x": a}, stream=side)["x"]
        assert p.device == "cpu" and p.__dlpack_device__() == (1, 0) and p.is_pinned
        assert np.array_equal(np.from_dlpack(p), a)
        old = p.data_ptr
        fake.fake_cudart_gate(side, 1)
        seen[:] = -1
        fake.fake_cudart_memcpy(seen.ctypes.data, p.data_ptr, p.nbytes, side)
        del p
        gc.collect()
        q = s.pinned({"x": a * 0})["x"]
        assert q.data_ptr != old, "pinned buffer reused while the trainer copies it"
        fake.fake_cudart_gate(side, 0)
        fake.fake_cudart_sync(side)
        assert np.array_equal(seen, a)
        print("ok")
    """,
    )
    assert out.strip().endswith("ok")


def test_fake_many_batches_no_leak(fake_cudart):
    out = run_fake(
        fake_cudart,
        """
        base = (fake.fake_cudart_live_device(), fake.fake_cudart_live_pinned())
        s = _core.DeviceStage(0, max_cached_bytes=8 << 20)
        side = fake.fake_cudart_stream_new()
        rng = np.random.default_rng(1)
        for i in range(300):
            n = int(rng.integers(1000, 50000))
            d = s.copy({"a": np.full(n, i, dtype=np.int32), "b": np.ones((3, 9), np.float32)})
            t = d["a"]
            t.__dlpack__(stream=side if i % 2 else None)
            if i % 50 == 0:
                assert (host_view(t) == i).all()
            del d, t
        gc.collect()
        fake.fake_cudart_sync(side)
        u = s.usage()
        assert u["device_live"] == 0 and u["pinned_live"] == 0, u
        assert u["device_cached"] <= 8 << 20 and u["pinned_cached"] <= 8 << 20, u
        s.close()
        assert (fake.fake_cudart_live_device(), fake.fake_cudart_live_pinned()) == base
        assert fake.fake_cudart_live_events() == 0, fake.fake_cudart_live_events()
        print("ok")
    """,
    )
    assert out.strip().endswith("ok")


def test_fake_stage_held_run_reserves_every_buffer_in_flight(fake_cudart):
    """DeviceStage.bench(hold=True) leaves each pool caching iters x ntensors buffers, so a
    later run allocates nothing even when no copy completes before the host has queued the
    last batch (the stage's stream gated until then: the most a GPU can lag).  The pools'
    counts say so: allocs, reuses, and the cached buffers requests found still pending."""
    out = run_fake(
        fake_cudart,
        """
        import threading, time
        NB, NT, IT = 1 << 20, 4, 6
        s = _core.DeviceStage(0, max_cached_bytes=64 << 20)
        ss = fake.fake_cudart_last_stream()
        s.bench(NB, NT, IT, hold=True)
        st = s.stats()
        for k in ("device", "pinned"):
            p = st[k]
            assert (p["allocs"], p["reuses"], p["frees"]) == (NT * IT, 0, 0), (k, p)
            assert p["cached_bufs"] == NT * IT and p["live"] == 0, (k, p)
            assert p["cached"] == IT * NB, (k, p)  # NB // NT bytes each, whole 4 KiB pages
        fake.fake_cudart_gate(ss, 1)

        def open_when_all_queued():  # IT batches: NT copies and one event record each
            t0 = time.monotonic()
            while fake.fake_cudart_queued(ss) < IT * (NT + 1) and time.monotonic() - t0 < 30:
                time.sleep(0.001)
            fake.fake_cudart_gate(ss, 0)

        th = threading.Thread(target=open_when_all_queued)
        th.start()
        total, queued = s.bench(NB, NT, IT, timings=True)
        th.join()
        assert 0 <= queued <= total, (queued, total)
        after = s.stats()
        for k in ("device", "pinned"):
            a, b = after[k], st[k]
            assert a["allocs"] == b["allocs"] and a["frees"] == 0, (k, a)
            assert a["reuses"] == NT * IT, (k, a)
            # the last batch's requests passed over every buffer of the batches before it
            # (device: the previous batch was still live, so not in the cache)
            want = NT * (IT - 1) if k == "pinned" else NT * (IT - 2)
            assert a["pending_max"] == want, (k, a["pending_max"], want)
        s.close()
        print("ok")
    """,
    )
    assert out.strip().endswith("ok")


# --- the Loader's pin_memory / device options ---------------------------------------------

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
LOADER_ARGS = dict(
    tokenizer=TINY,
    micro_batch_size=4,
    num_threads=2,
    prefetch=2,
    min_pixels=28 * 28 * 4,
    max_pixels=28 * 28 * 16,
    shuffle=False,
)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("cudads"))
    return make_dataset(
        root, n_samples=24, seed=3, n_shards=2, n_images=8, min_size=32, max_size=128
    )


LOADER_PRELUDE = """
import json, warnings
import numpy as np
import mmloader
SHARDS = json.loads(%r)
ARGS = json.loads(%r)
def load(**kw):
    a = dict(ARGS); a.update(kw)
    return mmloader.Loader(SHARDS, **a)
def cpu_epoch():
    with load() as L:
        return [{k: np.array(v.numpy(), copy=True) for k, v in b.items()} for b in L]
"""


def loader_code(ds, body):
    import json

    return LOADER_PRELUDE % (json.dumps(ds["shards"]), json.dumps(LOADER_ARGS)) + textwrap.dedent(
        body
    )


def test_loader_device_without_cuda_fails_at_construction(ds):
    out = run_py(
        loader_code(
            ds,
            """
        for dev in ("cuda:0", "cuda"):
            try:
                load(device=dev)
            except mmloader.ConfigError as e:  # says why CUDA is unusable
                assert "MML_CUDA_DISABLE" in str(e) and dev in str(e), e
                print("NoCuda")
        for dev in ("gpu", "cuda:x", "cuda:-1", 3):
            try:
                load(device=dev)
            except mmloader.ConfigError as e:
                print("ConfigError")
    """,
        ),
        MML_CUDA_DISABLE="1",
    )
    assert out.split() == ["NoCuda"] * 2 + ["ConfigError"] * 4


def test_loader_pin_memory_without_cuda_warns_once_and_works(ds):
    out = run_py(
        loader_code(
            ds,
            """
        ref = cpu_epoch()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with load(pin_memory=True) as L:
                got = [{k: np.array(v.numpy(), copy=True) for k, v in b.items()} for b in L]
                got2 = [b for b in L]  # a second epoch: still no more warnings
                assert got2 and not any(v.is_pinned for b in got2 for v in b.values())
        msgs = [str(x.message) for x in w]
        assert len(msgs) == 1, msgs
        assert "pin_memory" in msgs[0] and "MML_CUDA_DISABLE" in msgs[0], msgs
        assert len(got) == len(ref) > 0
        for a, b in zip(ref, got):
            assert sorted(a) == sorted(b)
            for k in a:
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        print("ok")
    """,
        ),
        MML_CUDA_DISABLE="1",
    )
    assert out.strip() == "ok"


def test_loader_on_fake_device_equals_cpu(ds, fake_cudart):
    out = run_fake(
        fake_cudart,
        loader_code(
            ds,
            """
        base = fake.fake_cudart_live_device()
        ref = cpu_epoch()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # CUDA is "there": no fallback warning
            with load(pin_memory=True) as L:
                pinned = [b for b in L]
            with load(device="cuda:1") as L:
                dev = [b for b in L]
        assert len(pinned) == len(dev) == len(ref) > 0
        for a, p, d in zip(ref, pinned, dev):
            assert sorted(a) == sorted(p) == sorted(d)
            for k in a:
                assert p[k].device == "cpu" and p[k].__dlpack_device__() == (1, 0), k
                assert p[k].is_pinned and not d[k].is_pinned, k
                assert np.array_equal(np.from_dlpack(p[k]), a[k]), k
                assert d[k].device == "cuda:1" and d[k].__dlpack_device__() == (2, 1), k
                assert d[k].dtype == a[k].dtype.name and d[k].shape == a[k].shape, k
                assert np.array_equal(host_view(d[k]), a[k]), k
        del pinned, dev, p, d
        gc.collect()
        assert fake.fake_cudart_live_device() == base, (fake.fake_cudart_live_device(), base)
        print("ok")
    """,
        ),
    )
    assert out.strip().endswith("ok")


def test_fake_pinned_batch_held_while_consumer_stream_reads(ds, fake_cudart):
    # pin_memory: a released batch is not recycled while the copy the trainer queued on
    # its stream (torch's current stream, passed by Loader.__next__) is pending.
    out = run_fake(
        fake_cudart,
        loader_code(
            ds,
            """
        with load(pin_memory=True, prefetch=1, shuffle=True) as L:
            side = fake.fake_cudart_stream_new()
            L._c.set_consumer_stream(0, side)  # what __next__ does with torch's stream
            b = next(L)
            snap = {k: np.array(np.from_dlpack(v), copy=True) for k, v in b.items()}
            seen = {k: np.full_like(a, 0) for k, a in snap.items()}
            old = set()
            fake.fake_cudart_gate(side, 1)
            for k, v in b.items():  # the trainer's .cuda(non_blocking=True) of every tensor
                fake.fake_cudart_memcpy(seen[k].ctypes.data, v.data_ptr, v.nbytes, side)
                old.add(v.data_ptr)
            del b, v
            gc.collect()
            later = [next(L) for _ in range(4)]
            reused = [k for bb in later for k, v in bb.items() if v.data_ptr in old]
            assert not reused, reused
            fake.fake_cudart_gate(side, 0)
            fake.fake_cudart_sync(side)
            for k in snap:
                assert np.array_equal(seen[k], snap[k]), k
        print("ok")
    """,
        ),
    )
    assert out.strip().endswith("ok")


# --- on a GPU (scripts/gpu-check.sh) ------------------------------------------------------


@pytest.mark.gpu
def test_gpu_pinned_memory_is_pinned_and_cpu():
    require_gpu()
    import numpy as np

    torch = torch_cuda()
    # torch answers is_pinned() False for any memory until it has initialised CUDA itself
    # (ATen's Context::isPinnedPtr), as a trainer has; the first GPU test of a run had not
    torch.cuda.init()
    s = _core.DeviceStage(0)
    a = np.arange(1 << 16, dtype=np.float32)
    p = s.pinned({"x": a})["x"]
    assert p.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(p)
    assert t.device.type == "cpu" and t.is_pinned()
    assert torch.equal(t.cuda(non_blocking=True).cpu(), torch.from_numpy(a))


@pytest.mark.gpu
def test_gpu_device_copy_equals_host():
    require_gpu()
    import numpy as np

    torch = torch_cuda()
    s = _core.DeviceStage(0)
    rng = np.random.default_rng(0)
    arrays = {
        "pixel_values": rng.random((37, 1176), dtype=np.float32),
        "input_ids": rng.integers(0, 150000, 4099).astype(np.int64),
        "cu_seqlens": np.array([0, 7, 4099], dtype=np.int32),
        "mask": rng.random(100) > 0.5,
        "raw": np.arange(255, dtype=np.uint8),
    }
    d = s.copy(arrays)
    for k, a in arrays.items():
        t = torch.from_dlpack(d[k])
        assert t.device == torch.device("cuda", 0), k
        assert torch.equal(t.cpu(), torch.from_numpy(a)), k


@pytest.mark.gpu
def test_gpu_no_race_with_consumer_on_its_own_stream():
    # The consumer works on a side stream kept busy (so it runs behind the host); each
    # batch must be read only after its copy, and its buffer reused only after the
    # consumer's kernels queued before the release are done.
    require_gpu()
    import numpy as np

    torch = torch_cuda()
    s = _core.DeviceStage(0)
    side = torch.cuda.Stream()
    n = 8 << 20  # 32 MiB of int32 per batch: copies take long enough to race
    sums = []
    with torch.cuda.stream(side):
        for i in range(40):
            torch.cuda._sleep(200_000)  # the consumer is busy: its stream runs behind
            t = torch.from_dlpack(s.copy({"x": np.full(n, i, dtype=np.int32)})["x"])
            sums.append(t.sum(dtype=torch.int64))
            del t  # released while the sum is still queued on `side`
    side.synchronize()
    assert [int(x) for x in sums] == [i * n for i in range(40)]


@pytest.mark.gpu
def test_gpu_nonblocking_copy_of_pinned_batch_is_safe():
    # pin_memory: the trainer copies a pinned batch with non_blocking=True and drops it at
    # once; the next batches must not overwrite it before the copy has read it.
    require_gpu()
    import numpy as np

    torch = torch_cuda()
    s = _core.DeviceStage(0)
    n = 4 << 20
    outs = []
    for i in range(30):
        torch.cuda._sleep(200_000)  # the default stream runs behind the host
        p = torch.from_dlpack(s.pinned({"x": np.full(n, i, dtype=np.int32)})["x"])
        outs.append(p.cuda(non_blocking=True))
        del p
    torch.cuda.synchronize()
    assert [int(o[0]) for o in outs] == list(range(30))
    assert [int(o[-1]) for o in outs] == list(range(30))


@pytest.mark.gpu
def test_gpu_many_batches_no_leak():
    require_gpu()
    import numpy as np

    torch = torch_cuda()
    s = _core.DeviceStage(0, max_cached_bytes=256 << 20)
    a = np.ones(1 << 20, dtype=np.float32)
    for i in range(50):  # warm the pools
        torch.from_dlpack(s.copy({"x": a})["x"]).sum()
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    for i in range(1000):
        t = torch.from_dlpack(s.copy({"x": a, "y": a[: 1000 + i]})["x"])
        t.sum()
        del t
    torch.cuda.synchronize()
    u = s.usage()
    assert u["device_live"] == 0 and u["pinned_live"] == 0, u
    assert u["device_cached"] <= 256 << 20, u
    assert free0 - torch.cuda.mem_get_info()[0] <= 256 << 20


@pytest.mark.gpu
def test_gpu_loader_device_batches_equal_cpu_batches(ds):
    require_gpu()
    import numpy as np

    torch = torch_cuda()
    args = dict(LOADER_ARGS)
    with mmloader.Loader(ds["shards"], **args) as L:
        ref = [{k: np.array(v.numpy(), copy=True) for k, v in b.items()} for b in L]
    side = torch.cuda.Stream()
    got = []
    with mmloader.Loader(ds["shards"], device="cuda:0", **args) as L, torch.cuda.stream(side):
        for b in L:
            torch.cuda._sleep(100_000)  # the consumer's stream runs behind
            t = {k: torch.from_dlpack(v) for k, v in b.items()}
            got.append({k: v.clone() for k, v in t.items()})  # queued on `side`
            del t, b
    side.synchronize()
    assert len(got) == len(ref) > 0
    for a, g in zip(ref, got):
        assert sorted(a) == sorted(g)
        for k in a:
            assert g[k].device == torch.device("cuda", 0)
            assert torch.equal(g[k].cpu(), torch.from_numpy(a[k])), k


@pytest.mark.gpu
def test_gpu_loader_pin_memory(ds):
    require_gpu()
    import numpy as np

    torch = torch_cuda()
    with mmloader.Loader(ds["shards"], **LOADER_ARGS) as L:
        ref = [{k: np.array(v.numpy(), copy=True) for k, v in b.items()} for b in L]
    for on_side in (False, True):  # default stream, then a side stream made current
        stream = torch.cuda.Stream() if on_side else torch.cuda.current_stream()
        got = []
        with (
            torch.cuda.stream(stream),
            mmloader.Loader(ds["shards"], pin_memory=True, **LOADER_ARGS) as L,
        ):
            assert L.stats()["pinned"]
            for b in L:
                torch.cuda._sleep(200_000)  # the copies run behind the host
                h = {k: torch.from_dlpack(v) for k, v in b.items()}
                assert all(t.device.type == "cpu" and t.is_pinned() for t in h.values())
                got.append({k: t.cuda(non_blocking=True) for k, t in h.items()})
                del b, h  # released while the copies are queued
        stream.synchronize()
        assert len(got) == len(ref) > 0
        for a, g in zip(ref, got):
            for k in a:
                assert torch.equal(g[k].cpu(), torch.from_numpy(a[k])), (on_side, k)


@pytest.mark.gpu
def test_gpu_torch_loader_batches_are_pinned_before_any_cuda_call(ds):
    # In a fresh process nothing has initialised torch's CUDA, and torch answers is_pinned()
    # False for every pointer until it has: mmloader.torch.Loader(pin_memory=True) does it
    require_gpu()
    code = loader_code(
        ds,
        """
        import torch
        import mmloader.torch as mt
        with mt.Loader(SHARDS, pin_memory=True, **ARGS) as L:
            b = next(L)
            print(sorted(b) and all(v.device.type == "cpu" and v.is_pinned() for v in b.values()))
    """,
    )
    assert run_py(code).split() == ["True"]
