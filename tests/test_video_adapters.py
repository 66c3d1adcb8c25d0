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
from conftest import same  # noqa: E402
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


# ---- compact pixel formats for videos (pixel_format bfloat16 / uint8) ---------------------


def bits(t):
    """The raw bits of a float tensor (bitwise comparison, NaN-safe)."""
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def batches(path, cls=mt.Loader, mbs=2, **over):
    with cls(path, micro_batch_size=mbs, **kw(**over)) as L:
        return [{k: v.clone() for k, v in mt.to_torch(b).items()} for b in L]


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_video_formats_carry_the_same_values(shard, preset):
    """pixel_values_videos in bfloat16 is the float32 batch rounded to nearest even; in uint8
    it is the frames' bytes (3*T*P*P per row: a temporal patch keeps its T frames), which
    expand_pixels(videos=True) turns into exactly the float32 / bfloat16 values, on the CPU
    (the core's loop) and through the GPU path's one-pass gather (run here on the CPU)."""
    path, _ = shard
    f32, b16, u8 = (
        batches(path, cls=mmloader.Loader, preset=preset, pixel_format=f)
        for f in ("float32", "bfloat16", "uint8")
    )
    P, T = (14, 2) if preset == "qwen2.5-vl" else (16, 2)
    videos = 0
    for a, b, c in zip(f32, b16, u8, strict=True):
        assert sorted(a) == sorted(b) == sorted(c)
        for k in a:
            if k not in ("pixel_values", "pixel_values_videos"):
                assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]), k
        if "pixel_values_videos" not in a:
            continue
        videos += 1
        want = a["pixel_values_videos"]
        assert b["pixel_values_videos"].dtype == torch.bfloat16
        assert torch.equal(bits(b["pixel_values_videos"]), bits(want.to(torch.bfloat16)))
        raw = c["pixel_values_videos"]
        assert raw.dtype == torch.uint8 and raw.shape == (want.shape[0], 3 * T * P * P)
        grid = c["video_grid_thw"]
        got = mt.expand_pixels(raw, grid, preset=preset, videos=True)
        assert torch.equal(bits(got), bits(want))
        got16 = mt.expand_pixels(raw, grid, preset=preset, videos=True, dtype=torch.bfloat16)
        assert torch.equal(bits(got16), bits(b["pixel_values_videos"]))
        flat = mt.pixel_table(preset, videos=True).reshape(-1)
        gpu_path = mt._gather(flat, raw, raw.shape[1], 1, one_pass=True)
        assert torch.equal(bits(gpu_path), bits(want))
        # the image rows of the same batches still expand with the image table
        if "pixel_values" in c and int(c["image_grid_thw"][0, 0]):
            img = mt.expand_pixels(c["pixel_values"], c["image_grid_thw"], preset=preset)
            assert torch.equal(bits(img), bits(a["pixel_values"]))
    assert videos == 2


def test_video_pixel_table_is_the_fused_torchvision_arithmetic():
    """The video processor (torchvision backend) fuses rescale and normalise: (x - 255 mean) /
    (255 std) in float32, which differs from the image processor's table in some entries."""
    for preset in ("qwen2.5-vl", "qwen3-vl"):
        cfg = mmloader.presets.vision_config(preset)
        # transformers' _fuse_mean_std_and_rescale_factor, then F.normalize
        mean = torch.tensor(cfg["image_mean"]) * (1.0 / (1 / 255))
        std = torch.tensor(cfg["image_std"]) * (1.0 / (1 / 255))
        x = torch.arange(256, dtype=torch.float32).expand(3, 256)
        want = (x - mean[:, None]) / std[:, None]
        got = mt.pixel_table(preset, videos=True)
        assert torch.equal(bits(got), bits(want))
    assert not torch.equal(mt.pixel_table("qwen2.5-vl", videos=True), mt.pixel_table("qwen2.5-vl"))
    with pytest.raises(ValueError, match="video rows keep their T frames"):
        mt.expand_pixels(torch.zeros((4, 588), dtype=torch.uint8), videos=True)


def test_uint8_refuses_a_video_the_processor_resizes(tmp_path, shard):
    """A video the processor itself resizes (here a checkpoint whose video processor allows
    fewer pixels per frame than qwen-vl-utils gives it) has float values between the bytes:
    uint8 cannot hold it, so that sample is refused with its reason (float32 and bfloat16
    load it)."""
    _, singles = shard
    model = tmp_path / "model"
    model.mkdir()
    size = {"shortest_edge": 3136, "longest_edge": 6272}
    (model / "video_preprocessor_config.json").write_text(json.dumps({"size": size}))
    a = alone(singles[1], model_dir=str(model))
    assert tuple(a["video_grid_thw"][0]) == (2, 4, 6)  # 84x56 after the processor
    (b,) = batches(singles[1], mbs=1, pixel_format="bfloat16", model_dir=str(model))
    assert np.array_equal(b["video_grid_thw"].numpy(), a["video_grid_thw"])
    want = torch.from_numpy(a["pixel_values_videos"]).to(torch.bfloat16)
    assert torch.equal(bits(b["pixel_values_videos"]), bits(want))
    with pytest.raises(mmloader.Error, match="pixel_format=uint8 cannot hold this video"):
        alone(singles[1], pixel_format="uint8", on_error="raise", model_dir=str(model))
    assert alone(singles[1], pixel_format="uint8")["video_grid_thw"].shape == (1, 3)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
def test_torch_loader_uint8_wire_expands_videos_too(shard, fmt):
    """wire_format="uint8" (the default with a CUDA device): images and videos travel as
    bytes and the adapter expands both into exactly the batches of pixel_format itself."""
    path, _ = shard
    for preset in ("qwen2.5-vl", "qwen3-vl"):
        want = batches(path, preset=preset, pixel_format=fmt)
        got = batches(path, preset=preset, pixel_format=fmt, wire_format="uint8")
        same(got, want)
        assert sum("pixel_values_videos" in b for b in want) == 2


def test_megatron_get_batch_with_the_uint8_wire_carries_videos(shard):
    """The Megatron adapter's loader with uint8 on the wire (its default on a GPU):
    get_batch hands the model the same image and video tensors as float32 batches."""
    mm = pytest.importorskip("mmloader.megatron")
    path, _ = shard
    args = dict(keys="megatron", shift_labels=True, text_only_vision="placeholder")
    want = batches(path, **args)
    got = batches(path, wire_format="uint8", **args)
    n = 0
    for a, b in zip(want, got, strict=True):
        x, y = mm.get_batch(iter([a]), device="cpu"), mm.get_batch(iter([b]), device="cpu")
        assert sorted(x) == sorted(y)
        assert [k for k in x if x[k] is None] == [k for k in y if y[k] is None]
        same(
            {k: y[k] for k in x if isinstance(x[k], torch.Tensor)},
            {k: v for k, v in x.items() if isinstance(v, torch.Tensor)},
        )
        n += x["pixel_values_videos"] is not None
    assert n == 2
