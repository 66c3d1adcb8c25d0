"""Where bytes become floats, bitwise: one epoch of the benchmark dataset (the one
tests/test_batch_digest.py hashes) for every combination of the pixel options, each
compared with the digest recorded in tests/data/pixel_digest.json.

The combinations are those users could ask for: the engine's pixel_format (float32,
bfloat16, uint8), with and without compact_pixels (floats expanded from uint8 rows when the
batch is finished, or written by the workers), and mmloader.torch.Loader's wire_format
(uint8 from the engine, expanded by torch where the tensor is).  Recorded before the
options' spelling changes, so a new spelling must give the same batches.

    python3 tests/test_pixel_digest.py --write  # rewrites tests/data/pixel_digest.json
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_batch_digest import SMALL, _dataset, input_digest  # noqa: E402

REF = os.path.join(HERE, "data", "pixel_digest.json")
BASE = dict(preset="qwen2.5-vl", shuffle=True, seed=3, micro_batch_size=4)

#: combination name -> (adapter, the Loader arguments that asked for it)
COMBOS: Dict[str, Dict[str, Any]] = {
    "float32-compact": dict(pixel_format="float32", compact_pixels=True),
    "float32-direct": dict(pixel_format="float32", compact_pixels=False),
    "bfloat16-compact": dict(pixel_format="bfloat16", compact_pixels=True),
    "bfloat16-direct": dict(pixel_format="bfloat16", compact_pixels=False),
    "uint8": dict(pixel_format="uint8"),
}
TORCH_COMBOS: Dict[str, Dict[str, Any]] = {
    "torch-float32-wire-uint8": dict(pixel_format="float32", wire_format="uint8"),
    "torch-bfloat16-wire-uint8": dict(pixel_format="bfloat16", wire_format="uint8"),
    "torch-float32-wire-float32": dict(pixel_format="float32", wire_format="float32"),
}


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


def combo_digest(shard: str, name: str) -> Dict[str, Any]:
    import mmloader

    common = dict(tokenizer="tiny", num_threads=3, prefetch=2, **SMALL, **BASE)
    if name in COMBOS:
        with mmloader.Loader(shard, **common, **COMBOS[name]) as L:
            return _hash(L)
    import mmloader.torch

    L = mmloader.torch.Loader(
        shard,
        **common,
        keys="qwen",
        mrope=False,
        attention_mask=True,
        text_only_vision="placeholder",
        mm_token_type_ids=False,
        **TORCH_COMBOS[name],
    )
    try:
        return _hash(L)
    finally:
        L.close()


def compute(base: str) -> Dict[str, Any]:
    shard = _dataset(base)
    names = list(COMBOS) + list(TORCH_COMBOS)
    return {"inputs": input_digest(shard), "epochs": {n: combo_digest(shard, n) for n in names}}


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


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = compute(d)
    if "--write" in sys.argv:
        with open(REF, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
    print(json.dumps(out, indent=1, sort_keys=True))
