"""Mixed image + video records through the torch adapter and with Megatron key names: every
batch carries pixel_values / image_grid_thw for its images and pixel_values_videos /
video_grid_thw (+ second_per_grid_ts on Qwen2.5-VL) for its videos, in sample order, each
sample's rows equal to what it gives alone; packing keeps them; mmloader.megatron.get_batch
hands the video keys to the model (None in batches without a video).  And against the
reference itself: a batch of mixed records (images, mp4 / webm files, frame lists, text)
through the torch adapter and through mmloader.megatron.get_batch (pixel_format float32 and
float32-consumer), on Qwen2.5-VL and Qwen3-VL, equals qwen-vl-utils + the transformers processor on
each record, bit for bit."""

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
        gpu_path = mt._gather(flat, raw, raw.shape[1], 1)
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
    """pixel_format="<fmt>-consumer" (float32's the default with a CUDA device): images and
    videos travel as bytes and the adapter expands both into exactly the batches of
    pixel_format "<fmt>" (the engine expanding)."""
    path, _ = shard
    for preset in ("qwen2.5-vl", "qwen3-vl"):
        want = batches(path, preset=preset, pixel_format=fmt)
        got = batches(path, preset=preset, pixel_format=f"{fmt}-consumer")
        same(got, want)
        assert sum("pixel_values_videos" in b for b in want) == 2


def test_megatron_get_batch_with_the_uint8_wire_carries_videos(shard):
    """The Megatron adapter's loader with uint8 on the wire (its default on a GPU):
    get_batch hands the model the same image and video tensors as float32 batches."""
    mm = pytest.importorskip("mmloader.megatron")
    path, _ = shard
    args = dict(keys="megatron", shift_labels=True, text_only_vision="placeholder")
    want = batches(path, **args)
    got = batches(path, pixel_format="float32-consumer", **args)
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


# ---- mixed image + video records against the processor, through both adapters ----------

PRESETS = ["qwen2.5-vl", "qwen3-vl"]
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
PAD = {"image": "<|image_pad|>", "video": "<|video_pad|>"}


@pytest.fixture(scope="module")
def processor_cases(tmp_path_factory):
    """Mixed records in qwen-vl-utils' messages layout (image + H.264 mp4 file, frame list,
    two images + VP9 webm file + frame list, image only, text only) and, for each preset,
    qwen-vl-utils 0.0.14 process_vision_info (videos) + transformers' processor +
    get_rope_index on each record with media (tests/video_reference.py, one process).  The
    images go to the processor as decoded files (its own resize, mmloader's image rule, as
    tests/test_vision.py), not through qwen-vl-utils' fetch_image, whose extra resize for
    Qwen3-VL (min_pixels 4*32*32, not the checkpoint's 65536) is a different pipeline."""
    pytest.importorskip("av")
    from test_video import make_video
    from test_video_frames import frame_files, reference_many

    tmp = str(tmp_path_factory.mktemp("mixed-ref"))
    ims = [rgb(im) for im in photos(400).values()]
    img = []
    for i, im in enumerate(ims[:3]):
        img.append(os.path.join(tmp, f"img{i}.jpg"))
        im.resize((200 + 40 * i, 150 + 16 * i)).save(img[-1], quality=90)
    mp4 = make_video(os.path.join(tmp, "a.mp4"), "libx264")
    webm = make_video(os.path.join(tmp, "a.webm"), "libvpx-vp9", w=65, h=48)
    frames = frame_files(tmp, "fl", 4, (160, 120))
    frames2 = frame_files(tmp, "fl2", 6, (96, 64), start=2)
    I = lambda p: {"type": "image", "image": p}  # noqa: E731,E741
    V = lambda v, **k: dict(k, type="video", video=v)  # noqa: E731
    T = lambda t: {"type": "text", "text": t}  # noqa: E731
    users = [
        [I(img[0]), V(mp4, nframes=6), T("What is shown, then what happens?")],
        [V(frames), T("What moves?")],
        [I(img[1]), V(webm, fps=4.0), T("and"), I(img[2]), V(frames2), T("Compare.")],
        [I(img[2]), T("What is it?")],
        [T("Just text.")],
    ]
    recs = [
        {"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": "Yes."}]}
        for u in users
    ]
    shard = os.path.join(tmp, "mixed.jsonl")
    with open(shard, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    items = {}
    for preset in PRESETS:
        for i, u in enumerate(users):
            if all(p["type"] == "text" for p in u):
                continue
            body = "".join(
                p["text"]
                if p["type"] == "text"
                else f"<|vision_start|>{PAD[p['type']]}<|vision_end|>"
                for p in u
            )
            text = (
                SYSTEM if preset != "qwen3-vl" else ""
            ) + f"<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\nYes.<|im_end|>\n"
            items[(preset, i)] = {
                "op": "process",
                "preset": preset,
                "tokenizer": TINY,
                "text": text,
                "messages": recs[i]["messages"],
                "raw_images": True,
                "out": os.path.join(tmp, f"ref-{preset}-{i}.npz"),
            }
    refs = dict(zip(items, reference_many(list(items.values()))))
    return shard, len(recs), refs


def _split(rows, grid):
    """Per-item row blocks of a flattened pixel tensor (rows per item = t * h * w)."""
    return np.split(np.asarray(rows), np.cumsum([int(np.prod(g)) for g in grid])[:-1])


def _check_against_processor(get, refs, preset, nrec, ids_key, spans=None):
    """get(key) -> the batch's tensor as numpy (None when absent).  Each sample's tokens,
    M-RoPE positions and every image / video row block equal the processor's, bitwise.
    spans: a packed batch's sample starts (cu_seqlens), else one row per sample."""
    ids, pos = get(ids_key), get("position_ids")
    if spans is None:
        row = lambda i, n: (ids[i, :n], pos[:, i, :n])  # noqa: E731
    else:  # one row; the 3 M-RoPE rows (after the packed text positions in HF's layout)
        assert ids.shape[0] == 1 and pos.shape[0] in (3, 4)
        pos = pos[-3:]
        row = lambda i, n: (ids[0, spans[i] : spans[i] + n], pos[:, 0, spans[i] : spans[i] + n])  # noqa: E731
    igrid, vgrid = get("image_grid_thw"), get("video_grid_thw")
    ipix = _split(get("pixel_values"), igrid) if igrid is not None else []
    vpix = _split(get("pixel_values_videos"), vgrid) if vgrid is not None else []
    secs = get("second_per_grid_ts")
    assert (secs is not None) == (preset == "qwen2.5-vl")
    ni = nv = 0
    for i in range(nrec):
        ref = refs.get((preset, i))
        if ref is None:  # the text-only record: no pixels of its own
            continue
        n = ref["input_ids"].shape[1]
        got_ids, got_pos = row(i, n)
        assert got_ids.tolist() == ref["input_ids"][0].tolist(), i
        assert np.array_equal(got_pos, ref["position_ids"][:, 0]), i
        for key, grid, blocks, k in (
            ("image", igrid, ipix, ni),
            ("video", vgrid, vpix, nv),
        ):
            if f"{key}_grid_thw" not in ref:
                continue
            want_grid = ref[f"{key}_grid_thw"]
            want = _split(
                ref["pixel_values" if key == "image" else "pixel_values_videos"], want_grid
            )
            m = len(want_grid)
            assert np.array_equal(grid[k : k + m], want_grid), (i, key)
            for got_block, want_block in zip(blocks[k : k + m], want, strict=True):
                assert np.array_equal(got_block, want_block), (i, key)
            if key == "video" and secs is not None:
                assert np.array_equal(
                    secs[k : k + m], ref["second_per_grid_ts"].astype(np.float32)
                ), i
        ni += len(ref["image_grid_thw"]) if "image_grid_thw" in ref else 0
        nv += len(ref["video_grid_thw"]) if "video_grid_thw" in ref else 0
    assert ni == len(ipix) and nv == len(vpix)  # nothing else in the batch
    assert ni == 4 and nv == 4


@pytest.mark.parametrize("preset", PRESETS)
def test_mixed_files_and_frame_lists_through_torch_adapter_equal_the_processor(
    processor_cases, preset
):
    """mmloader.torch.Loader, one batch of all five records (images, an mp4 and a webm
    file, frame lists, text only): every sample's input_ids and position_ids, and every
    image's and video's pixel rows, grids and second_per_grid_ts equal qwen-vl-utils + the
    transformers processor on that record alone, bit for bit."""
    shard, nrec, refs = processor_cases
    with mt.Loader(shard, micro_batch_size=nrec, **kw(preset=preset)) as L:
        b = next(iter(L))
        assert all(isinstance(v, torch.Tensor) for v in b.values())
    _check_against_processor(
        lambda k: b[k].numpy() if k in b else None, refs, preset, nrec, "input_ids"
    )


@pytest.mark.parametrize("pixels", ["float32", "float32-consumer"])
@pytest.mark.parametrize("preset", PRESETS)
def test_mixed_files_and_frame_lists_through_megatron_get_batch_equal_the_processor(
    processor_cases, preset, pixels
):
    """The Megatron adapter (keys="megatron", mmloader.megatron.get_batch) on the same
    batch, with float32 and with uint8 on the wire (expanded by the torch adapter):
    tokens, position_ids, every image / video tensor equal the processor's, bit for bit."""
    mm = pytest.importorskip("mmloader.megatron")
    shard, nrec, refs = processor_cases
    args = kw(preset=preset, keys="megatron", shift_labels=True, pixel_format=pixels)
    with mt.Loader(shard, micro_batch_size=nrec, **args) as L:
        got = mm.get_batch(iter(L), device="cpu")
    assert got["packed_seq_params"] is None
    _check_against_processor(
        lambda k: got[k].numpy() if got.get(k) is not None else None, refs, preset, nrec, "tokens"
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_mixed_packed_batch_through_megatron_get_batch_equals_the_processor(
    processor_cases, preset
):
    """The same records packed into one sequence (packing=True) through get_batch: THD
    PackedSeqParams, and each sample's span of the pack (cu_seqlens) carries the
    processor's tokens and M-RoPE positions, every image / video tensor in order."""
    mm = pytest.importorskip("mmloader.megatron")
    shard, nrec, refs = processor_cases
    args = kw(preset=preset, keys="megatron", shift_labels=True, packing=True, pack_length=8192)
    with mt.Loader(shard, **args) as L:
        got = mm.get_batch(iter(L), device="cpu")
    p = got["packed_seq_params"]
    assert p is not None and p.qkv_format == "thd"
    cu = got["cu_seqlens"].tolist()
    assert len(cu) == nrec + 1 and torch.equal(p.cu_seqlens_q, got["cu_seqlens"])
    _check_against_processor(
        lambda k: got[k].numpy() if got.get(k) is not None else None,
        refs,
        preset,
        nrec,
        "tokens",
        spans=cu,
    )
