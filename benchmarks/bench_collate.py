"""Collation of finished samples into a batch: mmloader's C collator against the usual
PyTorch / Hugging Face Python path, same samples, same run, one thread.

- padded: [micro_batch_size, seq_length] rows with M-RoPE position ids.  Peer: torch
  padding (the typical DataLoader collate_fn) + transformers' Qwen2-VL get_rope_index.
- packed: [1, pack_length] rows with per-sample positions and cu_seqlens.  Peer: transformers'
  DataCollatorWithFlattening (+ pixel_values concatenation), greedy packs of the same size.

Both sides start from Python lists of token ids and numpy pixel rows (mmloader's test hook
converts them, as the peer's torch.tensor calls do), so the figures include that conversion.

    python3 -m pytest benchmarks/bench_collate.py --benchmark-only -q -s
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from mmloader import _core  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IMAGE_PAD, VISION_START, VISION_END, PAD = 151655, 151652, 151653, 151643
COLS = 1176
MBS, SEQ = 8, 4096
PACK = 8192
RESULTS = {}


def _samples(n=64, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids, grids = [], []
        for _ in range(rng.choice([0, 1, 1, 2])):
            ids += [rng.randint(0, 150000) for _ in range(rng.randint(8, 40))]
            h, w = 2 * rng.randint(6, 14), 2 * rng.randint(6, 14)
            grids.append((1, h, w))
            ids += [VISION_START] + [IMAGE_PAD] * (h * w // 4) + [VISION_END]
        ids += [rng.randint(0, 150000) for _ in range(rng.randint(64, 1500))]
        ids = ids[:SEQ]
        labels = [t if j > len(ids) // 2 else -100 for j, t in enumerate(ids)]
        s = dict(input_ids=ids, labels=labels, grids=grids)
        rows = sum(t * h * w for t, h, w in grids)
        if rows:
            s["pixel_values"] = np.full((rows, COLS), float(i), np.float32)
        out.append(s)
    return out


SAMPLES = _samples()


def _rope_model():
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    cfg = Qwen2VLConfig(
        text_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=151936,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [2, 3, 3],
                "rope_theta": 10000.0,
            },
        ),
        vision_config=dict(
            depth=1, embed_dim=32, hidden_size=32, num_heads=2, spatial_merge_size=2
        ),
    )
    return Qwen2VLModel(cfg).eval()


@pytest.fixture(scope="module")
def rope_model():
    try:
        return _rope_model()
    except Exception as e:  # pragma: no cover
        pytest.skip(f"cannot build the reference model: {e}")


# ---- padded ---------------------------------------------------------------------------


def mml_padded():
    return _core._collate(
        SAMPLES,
        dict(
            micro_batch_size=MBS,
            seq_length=SEQ,
            mrope=1,
            attention_mask=1,
            mm_token_type_ids=1,
            pixel_cols=COLS,
        ),
    )


def torch_padded(model):
    out = []
    for k in range(0, len(SAMPLES), MBS):
        group = SAMPLES[k : k + MBS]
        ids = torch.full((MBS, SEQ), PAD, dtype=torch.long)
        labels = torch.full((MBS, SEQ), -100, dtype=torch.long)
        mask = torch.zeros((MBS, SEQ), dtype=torch.long)
        for r, s in enumerate(group):
            n = len(s["input_ids"])
            ids[r, :n] = torch.tensor(s["input_ids"])
            labels[r, :n] = torch.tensor(s["labels"])
            mask[r, :n] = 1
        px = [torch.from_numpy(s["pixel_values"]) for s in group if "pixel_values" in s]
        pixel_values = torch.cat(px) if px else torch.zeros((1, COLS))
        grids = torch.tensor([g for s in group for g in s["grids"]], dtype=torch.long)
        tt = (ids == IMAGE_PAD).int()
        with torch.no_grad():
            pos, deltas = model.get_rope_index(
                ids,
                mm_token_type_ids=tt,
                image_grid_thw=grids if len(grids) else None,
                attention_mask=mask,
            )
        out.append(
            dict(
                input_ids=ids,
                labels=labels,
                attention_mask=mask,
                position_ids=pos,
                rope_deltas=deltas,
                pixel_values=pixel_values,
                image_grid_thw=grids,
            )
        )
    return out


def test_padded_mmloader(benchmark):
    benchmark.pedantic(mml_padded, rounds=5, iterations=1, warmup_rounds=1)
    RESULTS["padded_mmloader"] = benchmark.stats.stats.median


def test_padded_torch_transformers(benchmark, rope_model):
    benchmark.pedantic(torch_padded, args=(rope_model,), rounds=3, iterations=1, warmup_rounds=1)
    RESULTS["padded_peer"] = benchmark.stats.stats.median


# ---- packed ---------------------------------------------------------------------------


def mml_packed():
    return _core._collate(SAMPLES, dict(packing=True, pack_length=PACK, pixel_cols=COLS))


def hf_packed():
    from transformers import DataCollatorWithFlattening

    coll = DataCollatorWithFlattening(return_tensors="pt")
    out, cur, used = [], [], 0
    for s in SAMPLES + [None]:
        if s is None or used + len(s["input_ids"]) > PACK:
            batch = coll([dict(input_ids=c["input_ids"], labels=c["labels"]) for c in cur])
            px = [torch.from_numpy(c["pixel_values"]) for c in cur if "pixel_values" in c]
            batch["pixel_values"] = torch.cat(px) if px else torch.zeros((1, COLS))
            out.append(batch)
            cur, used = [], 0
        if s is not None:
            cur.append(s)
            used += len(s["input_ids"])
    return out


def test_packed_mmloader(benchmark):
    benchmark.pedantic(mml_packed, rounds=5, iterations=1, warmup_rounds=1)
    RESULTS["packed_mmloader"] = benchmark.stats.stats.median


def test_packed_hf_flattening(benchmark):
    benchmark.pedantic(hf_packed, rounds=3, iterations=1, warmup_rounds=1)
    RESULTS["packed_peer"] = benchmark.stats.stats.median


@pytest.fixture(scope="module", autouse=True)
def report():
    """Prints the ratios (peer time / mmloader time) once the module's runs are done."""
    yield
    tokens = sum(len(s["input_ids"]) for s in SAMPLES)
    rows = sum(s.get("pixel_values", np.zeros((0, COLS))).shape[0] for s in SAMPLES)
    print(
        f"\ncollate: {len(SAMPLES)} samples, {tokens} tokens, {rows} pixel rows "
        f"({rows * COLS * 4 / 2**20:.0f} MiB)"
    )
    for mode in ("padded", "packed"):
        a, b = RESULTS.get(f"{mode}_mmloader"), RESULTS.get(f"{mode}_peer")
        if a and b:
            print(f"  {mode}: mmloader {a * 1e3:.1f} ms, peer {b * 1e3:.1f} ms, ratio {b / a:.1f}x")
