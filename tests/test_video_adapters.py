"""Mixed image + video records through the torch adapter and with Megatron key names: every
batch carries pixel_values / image_grid_thw for its images and pixel_values_videos /
video_grid_thw (+ second_per_grid_ts on Qwen2.5-VL) for its videos, in sample order, each
sample's rows equal to what it gives alone; packing keeps them; mmloader.megatron.get_batch
hands the video keys to the model (None in batches without a video)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

import mmloader  # noqa: E402
import mmloader.torch as mt  # noqa: E402
from photos import photos, rgb  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixed")
    ims = [rgb(im) for im in photos(400).values()]
    paths = []
    for i, im in enumerate(ims[:6]):
        p = str(tmp / f"p{i}.jpg")
        im.resize((160, 120)).save(p, quality=90)
        paths.append(p)
    a = lambda t: {"from": "gpt", "value": t}  # noqa: E731
    recs = [
        {
            "conversations": [{"from": "human", "value": "<image>What is it?"}, a("A photo.")],
            "images": [paths[0]],
        },
        {
            "conversations": [{"from": "human", "value": "<video>What happens?"}, a("Motion.")],
            "videos": [paths[1:4]],
        },
        {
            "conversations": [{"from": "human", "value": "<image> then <video>"}, a("Both.")],
            "images": [paths[4]],
            "videos": [[paths[5], paths[0], paths[1], paths[2]]],
        },
        {"conversations": [{"from": "human", "value": "Just text."}, a("Yes.")]},
    ]
    path = str(tmp / "mixed.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    singles = []
    for i, r in enumerate(recs):
        p = str(tmp / f"single{i}.jsonl")
        with open(p, "w") as f:
            f.write(json.dumps(r) + "\n")
        singles.append(p)
    return path, singles


def kw(**over):
    d = dict(tokenizer=TINY, shuffle=False, num_threads=2, mrope=True, preset="qwen2.5-vl")
    d.update(over)
    return d


def alone(path, **over):
    with mmloader.Loader(path, micro_batch_size=1, **kw(**over)) as L:
        return {k: np.array(v.numpy(), copy=True) for k, v in next(iter(L)).items()}


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_mixed_batch_through_torch_adapter(shard, preset):
    path, singles = shard
    with mt.Loader(path, micro_batch_size=4, **kw(preset=preset)) as L:
        b = next(iter(L))
    assert all(isinstance(v, torch.Tensor) for v in b.values())
    parts = [alone(p, preset=preset) for p in singles]
    assert b["video_grid_thw"].shape == (2, 3)
    assert torch.equal(
        b["video_grid_thw"],
        torch.from_numpy(np.concatenate([parts[1]["video_grid_thw"], parts[2]["video_grid_thw"]])),
    )
    assert torch.equal(
        b["pixel_values_videos"],
        torch.from_numpy(
            np.concatenate([parts[1]["pixel_values_videos"], parts[2]["pixel_values_videos"]])
        ),
    )
    assert torch.equal(
        b["pixel_values"],
        torch.from_numpy(np.concatenate([parts[0]["pixel_values"], parts[2]["pixel_values"]])),
    )
    assert ("second_per_grid_ts" in b) == (preset == "qwen2.5-vl")
    for i, p in enumerate(parts):  # each row as the sample alone
        n = p["input_ids"].shape[1]
        assert np.array_equal(b["input_ids"][i, :n].numpy(), p["input_ids"][0])
        assert np.array_equal(b["position_ids"][:, i, :n].numpy(), p["position_ids"][:, 0])
    assert "pixel_values_videos" not in parts[0] and "pixel_values_videos" not in parts[3]


def test_packed_mixed_batch_keeps_every_video(shard):
    path, singles = shard
    with mmloader.Loader(path, packing=True, pack_length=8192, **kw()) as L:
        b = {k: np.array(v.numpy(), copy=True) for k, v in next(iter(L)).items()}
    parts = [alone(p) for p in singles]
    assert np.array_equal(
        b["video_grid_thw"],
        np.concatenate([parts[1]["video_grid_thw"], parts[2]["video_grid_thw"]]),
    )
    assert np.array_equal(
        b["second_per_grid_ts"],
        np.concatenate([parts[1]["second_per_grid_ts"], parts[2]["second_per_grid_ts"]]),
    )
    cu = b["cu_seqlens"]
    for i, p in enumerate(parts):
        n = p["input_ids"].shape[1]
        assert np.array_equal(b["input_ids"][0, cu[i] : cu[i] + n], p["input_ids"][0])
        assert np.array_equal(b["position_ids"][1:, 0, cu[i] : cu[i] + n], p["position_ids"][:, 0])


def test_megatron_key_names_and_get_batch(shard):
    path, _ = shard
    pytest.importorskip("mmloader.megatron")
    from mmloader.megatron import get_batch

    with mmloader.Loader(path, micro_batch_size=2, keys="megatron", shift_labels=True, **kw()) as L:
        it = iter(mt.to_torch(b) for b in L)
        first = get_batch(it, device="cpu")
        second = get_batch(it, device="cpu")
    assert first["tokens"].shape[0] == 2
    assert first["pixel_values_videos"] is not None and first["video_grid_thw"].shape == (1, 3)
    assert first["second_per_grid_ts"].shape == (1,)
    assert second["video_grid_thw"].shape == (1, 3)
    assert "loss_mask" in first and first["pixel_values"] is not None
    with mmloader.Loader(path, micro_batch_size=1, keys="megatron", **kw()) as L:
        it = iter(mt.to_torch(b) for b in L)
        only_image = get_batch(it, device="cpu")
    assert only_image["pixel_values_videos"] is None and only_image["video_grid_thw"] is None
