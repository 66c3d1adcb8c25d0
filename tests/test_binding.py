"""The CPython binding's conventions (csrc/py): every type is a heap type owned by a module
object, each module object has its own types and exception classes (module state,
multi-phase init), instances give their type reference back, and a reference cycle
through a _Loader is collected (its threads stop)."""

import gc
import glob
import importlib.util
import os
import sys

import numpy as np
import pytest

import mmloader
from mmloader import _core
from mmloader.datagen import make_dataset
from mmloader.presets import vision_config

from conftest import n_threads, threads_down_to

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(os.path.dirname(HERE), "mmloader", "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE
EXCEPTIONS = (
    "Error",
    "ConfigError",
    "SampleError",
    "FetchError",
    "StateError",
    "CudaError",
    "OutOfMemoryError",
)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds"))
    return make_dataset(root, n_samples=16, seed=3, n_images=8, min_size=32, max_size=96)


def a_jpeg(ds):
    return open(sorted(glob.glob(os.path.join(ds["root"], "images", "*.jpg")))[0], "rb").read()


def second_core():
    """A second, independent module object made from the same extension file."""
    spec = importlib.util.spec_from_file_location("mmloader._core", _core.__file__)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_every_type_is_a_heap_type(ds):
    types = [v for v in vars(_core).values() if isinstance(v, type)]
    proc = _core.VisionProcessor(vision_config("qwen2.5-vl", **SMALL))
    types.append(type(proc.process([(0, a_jpeg(ds))])[0]))  # VisionBuffer: no module name
    names = sorted(t.__name__ for t in types)
    for name in (
        "Tensor",
        "_Loader",
        "Tokenizer",
        "Fetcher",
        "VisionProcessor",
        "VisionBuffer",
        "DeviceStage",
    ) + EXCEPTIONS:
        assert name in names
    static = [t.__name__ for t in types if not t.__flags__ & HEAPTYPE]
    assert static == []


def test_each_module_object_has_its_own_types_and_exceptions():
    m2 = second_core()
    assert m2 is not _core
    for name in ("Tensor", "_Loader", "Tokenizer", "Fetcher", "VisionProcessor", "DeviceStage"):
        assert getattr(m2, name) is not getattr(_core, name), name
        assert getattr(m2, name).__qualname__ == getattr(_core, name).__qualname__
    for name in EXCEPTIONS:
        e1, e2 = getattr(_core, name), getattr(m2, name)
        assert e2 is not e1 and e2.__name__ == e1.__name__ and e2.__module__ == "mmloader"
        assert issubclass(e2, m2.Error)
        assert [b.__name__ for b in e2.__mro__] == [b.__name__ for b in e1.__mro__]
    # a module function raises its own module's class
    with pytest.raises(m2.ConfigError) as ei:
        m2.check_loader_options({"no_such_option": 1})
    assert not isinstance(ei.value, _core.ConfigError)
    # a method finds its module through its type: the same for a slot (tp_init)
    f = m2.Fetcher()
    f.close()
    with pytest.raises(m2.Error, match="closed") as ei:
        f.get("http://127.0.0.1:1/x")
    assert not isinstance(ei.value, _core.Error)
    tok2 = m2.Tokenizer(TINY)
    assert tok2.encode("hello world") == mmloader.Tokenizer(TINY).encode("hello world")
    with pytest.raises(m2.ConfigError):
        m2._Loader({}, tok2)
    # objects of one module object are not another's
    with pytest.raises(TypeError, match="Tokenizer"):
        m2._Loader({}, mmloader.Tokenizer(TINY))
    # dropping the second module object leaves the first working
    del m2, f, tok2
    gc.collect()
    with pytest.raises(_core.ConfigError):
        _core.check_loader_options({"no_such_option": 1})


def test_instances_give_their_type_reference_back(ds):
    """A heap type's instances hold a reference to it: a dealloc that forgets to drop it,
    or an instance that leaks, shows as the type's reference count growing."""
    cfg = vision_config("qwen2.5-vl", **SMALL)
    jpeg = a_jpeg(ds)
    proc = _core.VisionProcessor(cfg)
    buf_type = type(proc.process([(0, jpeg)])[0])
    gc.collect()

    def counts():
        return [
            sys.getrefcount(t)
            for t in (
                _core.Tensor,
                _core._Loader,
                _core.Tokenizer,
                mmloader.Tokenizer,
                _core.Fetcher,
                _core.VisionProcessor,
                buf_type,
            )
        ]

    def churn():
        for _ in range(3):
            tok = mmloader.Tokenizer(TINY)
            L = mmloader.Loader(
                ds["shards"], tokenizer=tok, micro_batch_size=4, num_threads=2, prefetch=2, **SMALL
            )
            batches = list(L)
            assert batches and all(isinstance(t, _core.Tensor) for t in batches[0].values())
            arrays = [np.from_dlpack(t) for t in batches[0].values()]  # capsules too
            L.close()
            del L, batches, arrays, tok
            _core.Fetcher().close()
            p = _core.VisionProcessor(cfg)
            out = [p.process([(0, jpeg)])[0] for _ in range(4)]
            del p, out
        gc.collect()

    churn()  # first use may cache (e.g. method lookups)
    before = counts()
    churn()
    assert counts() == before


def test_a_cycle_through_the_engine_is_collected(ds, monkeypatch):
    """_Loader -> tokenizer -> its __dict__ -> _Loader: the collector clears the _Loader
    (which stops its engine before dropping the tokenizer the engine borrows) and every
    engine thread ends."""
    seen = {}
    real = _core._Loader

    def capture(cfg, tok):
        seen["cfg"] = cfg
        return real(cfg, tok)

    monkeypatch.setattr(_core, "_Loader", capture)
    tok = mmloader.Tokenizer(TINY)
    mmloader.Loader(
        ds["shards"], tokenizer=tok, micro_batch_size=2, num_threads=3, prefetch=2, **SMALL
    ).close()
    monkeypatch.undo()
    gc.collect()
    base = n_threads()
    c = real(dict(seen["cfg"]), tok)
    assert c.next() and n_threads() > base
    tok.engine = c  # the cycle
    del c, tok
    gc.collect()
    assert threads_down_to(base) <= base


@pytest.mark.skipif(
    importlib.util.find_spec("_interpreters") is None,
    reason="needs CPython >= 3.13 (_interpreters, interpreter configs with strict checks)",
)
def test_loads_in_a_strict_subinterpreter():
    """A subinterpreter that refuses single-phase extensions (shared GIL): the module loads
    and works there, with its own state."""
    import _interpreters

    iid = _interpreters.create(_interpreters.new_config("isolated", gil="shared"))
    try:
        code = (
            "import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('mmloader._core', {_core.__file__!r})\n"
            "_core = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(_core)\n"
            f"assert _core.Tokenizer({TINY!r}).encode('hello world')\n"
            "try:\n"
            "    _core.check_loader_options({'no_such_option': 1})\n"
            "except _core.ConfigError:\n"
            "    pass\n"
        )
        assert _interpreters.run_string(iid, code) is None
    finally:
        _interpreters.destroy(iid)
