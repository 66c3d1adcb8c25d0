"""Batches stay bitwise identical across refactors: one epoch of the benchmark dataset
(benchmarks/pipelines/dataset.py, small) under several configurations, every tensor of every
batch hashed (key, dtype, shape, bytes), compared with tests/data/batch_digest.json.

The committed file also holds a digest of the generated input files: the generator encodes
JPEG/PNG with Pillow, whose encoder bytes may change between Pillow releases, so a machine
producing different inputs skips (saying so) instead of comparing unlike things.  With the
same inputs any difference in any batch fails.

    python3 tests/test_batch_digest.py          # prints the digest as JSON
    python3 tests/test_batch_digest.py --write  # rewrites tests/data/batch_digest.json
(Rewrite only for an intended change of output, and say so in the commit.)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from typing import Any, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "data", "batch_digest.json")
N_SAMPLES = 48
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 160)

# Each configuration drives a different part of the engine (templates, label modes, keys,
# packing, M-RoPE, text-only handling, shuffling across threads).
CONFIGS: Dict[str, Dict[str, Any]] = {
    "padded-qwen25": dict(preset="qwen2.5-vl", shuffle=True, seed=3, micro_batch_size=4),
    "padded-qwen3-seq": dict(
        preset="qwen3-vl",
        shuffle=False,
        micro_batch_size=3,
        seq_length=1024,
        max_length=1024,
        label_mode="last_assistant",
        text_only_vision="empty",
        mm_token_type_ids=True,
    ),
    "packed-megatron": dict(
        preset="qwen2-vl",
        shuffle=True,
        seed=11,
        micro_batch_size=1,
        packing=True,
        pack_length=2048,
        pad_to_multiple=8,
        keys="megatron",
        shift_labels=True,
        mrope=True,
        label_mode="no_nonfinal_end",
        text_only_vision="omit",
        attention_mask=False,
    ),
    "padded-mrope-2rank": dict(
        preset="qwen2.5-vl",
        shuffle=True,
        seed=5,
        micro_batch_size=2,
        dp_rank=1,
        dp_size=2,
        mrope=True,
        legacy_resize=True,
    ),
}


def _dataset(base: str) -> str:
    sys.path.insert(0, os.path.dirname(HERE))
    from benchmarks.pipelines import dataset

    return dataset.cached(N_SAMPLES, seed=0, base=base)


def input_digest(shard: str) -> str:
    """sha256 over the shard and every file of its image folder, in name order."""
    h = hashlib.sha256()
    with open(shard, "rb") as f:
        h.update(f.read())
    img = os.path.join(os.path.dirname(shard), "images")
    for name in sorted(os.listdir(img)):
        h.update(name.encode())
        with open(os.path.join(img, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def epoch_digest(shard: str, cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Digest of one epoch: batch count and one sha256 over all tensors in order."""
    import mmloader
    from mmloader.tokenizer import TINY_TOKENIZER_PATH

    h = hashlib.sha256()
    n = rows = 0
    keys: List[str] = []
    with mmloader.Loader(
        shard, tokenizer=TINY_TOKENIZER_PATH, num_threads=3, prefetch=2, **SMALL, **cfg
    ) as L:
        for b in L:
            n += 1
            for k in sorted(b):
                a = np.asarray(b[k].numpy())
                h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
                h.update(np.ascontiguousarray(a).tobytes())
                if k not in keys:
                    keys.append(k)
            rows += int(
                np.asarray(b["input_ids" if "input_ids" in b else "tokens"].numpy()).shape[0]
            )
    return {"batches": n, "rows": rows, "keys": sorted(keys), "sha256": h.hexdigest()}


def compute(base: str) -> Dict[str, Any]:
    shard = _dataset(base)
    return {
        "inputs": input_digest(shard),
        "epochs": {name: epoch_digest(shard, cfg) for name, cfg in CONFIGS.items()},
    }


def test_batches_bitwise_as_recorded(tmp_path_factory):
    import pytest

    with open(REF) as f:
        ref = json.load(f)
    got = compute(str(tmp_path_factory.mktemp("digest")))
    if got["inputs"] != ref["inputs"]:
        pytest.skip(
            "the benchmark dataset generator wrote different input bytes here "
            f"(Pillow {__import__('PIL').__version__}); the recorded batch digests "
            "are not comparable (regenerate with --write on a known-good build)"
        )
    assert set(got["epochs"]) == set(CONFIGS)
    for name in CONFIGS:
        assert got["epochs"][name]["batches"] > 0, name
        assert got["epochs"][name] == ref["epochs"][name], name


if __name__ == "__main__":
    base = os.environ.get("MML_BENCH_DATA") or os.path.join(
        tempfile.gettempdir(), "mmloader-digest"
    )
    out = compute(base)
    text = json.dumps(out, indent=1, sort_keys=True) + "\n"
    if "--write" in sys.argv:
        os.makedirs(os.path.dirname(REF), exist_ok=True)
        with open(REF, "w") as f:
            f.write(text)
    print(text, end="")
