"""Where bytes become floats, bitwise: one epoch of the benchmark dataset (the one
tests/test_batch_digest.py hashes) for every pixel_format a user can ask for, each
compared with the digest recorded in tests/data/pixel_digest.json.

The digests were recorded (4f9e8f8) for the combinations of the three knobs there were:
the engine's pixel_format (float32, bfloat16, uint8), with and without compact_pixels
(floats expanded from uint8 rows when the batch is finished, or written by the workers),
and mmloader.torch.Loader's wire_format (uint8 from the engine, expanded by torch where the
tensor is).  pixel_format is now the one knob: each recorded combination is asked for by its
new spelling (SPELLINGS) and must give the recorded batches, and each old spelling is a
ConfigError naming that new spelling.

    python3 tests/test_pixel_digest.py --write  # rewrites tests/data/pixel_digest.json
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_batch_digest import SMALL, _dataset, input_digest  # noqa: E402

REF = os.path.join(HERE, "data", "pixel_digest.json")
BASE = dict(preset="qwen2.5-vl", shuffle=True, seed=3, micro_batch_size=4)

#: recorded combination -> (adapter, its old spelling, the pixel_format that says it now)
SPELLINGS: Dict[str, Tuple[str, Dict[str, Any], str]] = {
    "float32-compact": ("core", dict(pixel_format="float32", compact_pixels=True), "float32"),
    "float32-direct": (
        "core",
        dict(pixel_format="float32", compact_pixels=False),
        "float32-decode",
    ),
    "bfloat16-compact": ("core", dict(pixel_format="bfloat16", compact_pixels=True), "bfloat16"),
    "bfloat16-direct": (
        "core",
        dict(pixel_format="bfloat16", compact_pixels=False),
        "bfloat16-decode",
    ),
    "uint8": ("core", dict(pixel_format="uint8"), "uint8"),
    "torch-float32-wire-uint8": (
        "torch",
        dict(pixel_format="float32", wire_format="uint8"),
        "float32-consumer",
    ),
    "torch-bfloat16-wire-uint8": (
        "torch",
        dict(pixel_format="bfloat16", wire_format="uint8"),
        "bfloat16-consumer",
    ),
    "torch-float32-wire-float32": (
        "torch",
        dict(pixel_format="float32", wire_format="float32"),
        "float32",
    ),
}
#: old spellings that were not recorded (the same batches as one that was), and the new one
OTHER_OLD: List[Tuple[str, Dict[str, Any], str]] = [
    ("core", dict(compact_pixels=False), "float32-decode"),
    ("core", dict(compact_pixels=True), "float32"),
    ("core", dict(pixel_format="uint8", compact_pixels=False), "uint8"),
    ("torch", dict(wire_format="uint8"), "float32-consumer"),
    ("torch", dict(pixel_format="uint8", wire_format="uint8"), "uint8"),
    ("torch", dict(pixel_format="bfloat16", wire_format="bfloat16"), "bfloat16"),
    ("torch", dict(pixel_format="bfloat16", compact_pixels=False), "bfloat16-decode"),
]


def _hash(batches: Any) -> Dict[str, Any]:
    import torch

    h = hashlib.sha256()
    n = 0
    keys: List[str] = []
    for b in batches:
        n += 1
        for k in sorted(b):
            if k == "use_cache":
                continue
            t = b[k] if isinstance(b[k], torch.Tensor) else torch.from_dlpack(b[k])
            t = t.cpu().contiguous()
            h.update(f"{k}|{str(t.dtype).replace('torch.', '')}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
            if k not in keys:
                keys.append(k)
    return {"batches": n, "keys": sorted(keys), "sha256": h.hexdigest()}


def _make(adapter: str, shard: str, pixels: Dict[str, Any]) -> Any:
    """The adapter's loader over `shard` with the digest's settings and `pixels`."""
    import mmloader

    common = dict(tokenizer="tiny", num_threads=3, prefetch=2, **SMALL, **BASE)
    if adapter == "core":
        return mmloader.Loader(shard, **common, **pixels)
    import mmloader.torch

    return mmloader.torch.Loader(
        shard,
        **common,
        keys="qwen",
        mrope=False,
        attention_mask=True,
        text_only_vision="placeholder",
        mm_token_type_ids=False,
        **pixels,
    )


def combo_digest(shard: str, name: str) -> Dict[str, Any]:
    adapter, _, pixel_format = SPELLINGS[name]
    L = _make(adapter, shard, dict(pixel_format=pixel_format))
    try:
        return _hash(L)
    finally:
        L.close()


def compute(base: str) -> Dict[str, Any]:
    shard = _dataset(base)
    return {"inputs": input_digest(shard), "epochs": {n: combo_digest(shard, n) for n in SPELLINGS}}


def test_every_pixel_combination_bitwise_as_recorded(tmp_path_factory):
    import pytest

    pytest.importorskip("torch")
    with open(REF) as f:
        ref = json.load(f)
    got = compute(str(tmp_path_factory.mktemp("pixdigest")))
    if got["inputs"] != ref["inputs"]:
        pytest.skip("the benchmark dataset generator wrote different input bytes here")
    assert got["epochs"] == ref["epochs"]
    e = got["epochs"]
    # where the floats are made never changes them
    assert e["float32-compact"] == e["float32-direct"] == e["torch-float32-wire-uint8"]
    assert e["float32-compact"] == e["torch-float32-wire-float32"]
    assert e["bfloat16-compact"] == e["bfloat16-direct"] == e["torch-bfloat16-wire-uint8"]
    assert e["uint8"]["batches"] == e["float32-compact"]["batches"] > 0


def test_every_pixel_format_is_one_recorded_combination():
    """The new spellings cover every recorded behaviour, one spelling each, and every
    choice of the option table's pixel_format row is one of them."""
    import collections

    from mmloader._options import OPTIONS

    news = collections.Counter(new for _, _, new in SPELLINGS.values())
    assert set(news) == set(OPTIONS["pixel_format"]["choices"])
    # "float32" twice: the engine expanding, recorded under the core Loader and under
    # torch.Loader's wire_format="float32" (the same batches, asserted below)
    assert news == collections.Counter(set(news)) + collections.Counter(["float32"])


def _old_cases() -> List[Tuple[str, Dict[str, Any], str]]:
    return [v for v in SPELLINGS.values() if set(v[1]) - {"pixel_format"}] + OTHER_OLD


def test_each_old_spelling_is_an_error_naming_its_new_one(tmp_path):
    """compact_pixels= and wire_format= are ConfigErrors (in every adapter that took them)
    that name the pixel_format giving the same batches."""
    import pytest

    pytest.importorskip("torch")
    import mmloader

    missing = str(tmp_path / "never-read.jsonl")  # refused before anything is read
    cases = _old_cases()
    assert len(cases) >= 10
    for adapter, old, new in cases:
        for where in ("core", "torch") if adapter == "core" else ("torch",):
            with pytest.raises(mmloader.ConfigError) as e:
                _make(where, missing, old)
            msg = str(e.value)
            assert re.search(rf"pixel_format={re.escape(repr(new))} gives what ", msg), (old, msg)
            assert "is no longer an option" in msg and "docs/pixels.md" in msg, msg
    with pytest.raises(mmloader.ConfigError, match="'float32-consumer' with a CUDA device"):
        _make("torch", missing, dict(wire_format=None))


def test_the_core_loader_refuses_the_consumer_spellings(tmp_path):
    """The core Loader's batches are the engine's: a "-consumer" pixel_format (uint8 for the
    consumer to expand) is a ConfigError naming the engine-side spelling."""
    import pytest

    import mmloader
    from test_batch_digest import SMALL as small

    shard = tmp_path / "one.jsonl"
    shard.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    for fmt, dtype in (("float32-consumer", "float32"), ("bfloat16-consumer", "bfloat16")):
        with pytest.raises(mmloader.ConfigError, match=f"use pixel_format='{dtype}' here"):
            mmloader.Loader(str(shard), tokenizer="tiny", pixel_format=fmt, **small)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = compute(d)
    if "--write" in sys.argv:
        with open(REF, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
    print(json.dumps(out, indent=1, sort_keys=True))
