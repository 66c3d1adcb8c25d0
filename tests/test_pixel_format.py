"""pixel_format="float32" | "bfloat16" | "uint8" and mmloader.torch.expand_pixels.

The float32 format is the HF processor's values (checked bit for bit here against
transformers' Qwen2-VL PIL processor configured as Qwen2-VL, Qwen2.5-VL and Qwen3-VL, on
real photos); bfloat16 is exactly those values rounded to nearest even; uint8 holds the
resized RGB patches, one frame per row, and expand_pixels turns them back into exactly the
float32 / bfloat16 values, on the CPU here and on a GPU in the tests marked gpu.
"""

import io
import os

import numpy as np
import pytest
from child import child_env

torch = pytest.importorskip("torch")

import mmloader  # noqa: E402
import mmloader.torch as mt  # noqa: E402
from conftest import same  # noqa: E402
from photos import encode, photos, rgb  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
PRESETS = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")

try:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
except Exception:  # pragma: no cover - depends on the environment
    Qwen2VLImageProcessorPil = None

needs_tf = pytest.mark.skipif(
    Qwen2VLImageProcessorPil is None,
    reason="transformers with the Qwen2-VL PIL processor not installed",
)
cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device and a CUDA build of torch"
)


def bits(t):
    """The bit pattern of a float tensor/array, for exact comparisons (NaN-safe, -0 != 0)."""
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


@pytest.fixture(scope="module")
def photo_bytes():
    """The real photos, as JPEG and PNG, at a size that keeps the test fast."""
    out = []
    for i, im in enumerate(photos(256).values()):
        out.append(encode(rgb(im), "JPEG", quality=92) if i % 2 else encode(im, "PNG"))
    return out


def hf_reference(preset, datas):
    from PIL import Image

    c = mmloader.ImageProcessor(preset).config
    proc = Qwen2VLImageProcessorPil(
        min_pixels=c["min_pixels"],
        max_pixels=c["max_pixels"],
        patch_size=c["patch_size"],
        merge_size=c["merge_size"],
        temporal_patch_size=c["temporal_patch_size"],
        image_mean=c["image_mean"],
        image_std=c["image_std"],
    )
    return proc([Image.open(io.BytesIO(d)) for d in datas], return_tensors="np")


# ---------------------------------------------------------------- the processor formats


@needs_tf
@pytest.mark.parametrize("preset", PRESETS)
def test_formats_and_expansion_match_the_hf_processor_bit_for_bit(preset, photo_bytes):
    ref = hf_reference(preset, photo_bytes)
    want = torch.from_numpy(ref["pixel_values"].astype(np.float32))
    f32 = mmloader.ImageProcessor(preset)(photo_bytes)
    bf16 = mmloader.ImageProcessor(preset, pixel_format="bfloat16")(photo_bytes)
    u8 = mmloader.ImageProcessor(preset, pixel_format="uint8")(photo_bytes)
    c = mmloader.ImageProcessor(preset).config
    P, T = c["patch_size"], c["temporal_patch_size"]
    rows = want.shape[0]
    for got in (f32, bf16, u8):
        np.testing.assert_array_equal(got["image_grid_thw"], ref["image_grid_thw"])
    assert f32["pixel_values"].shape == (rows, 3 * T * P * P)
    assert u8["pixel_values"].shape == (rows, 3 * P * P) and u8["pixel_values"].dtype == np.uint8
    assert bf16["pixel_values"].dtype == np.uint16  # the bfloat16 bits (NumPy has no bf16)
    assert torch.equal(bits(f32["pixel_values"]), bits(want))
    assert torch.equal(bits(bf16["pixel_values"].view(np.int16)), bits(want.to(torch.bfloat16)))
    grid = torch.from_numpy(u8["image_grid_thw"])
    patches = torch.from_numpy(u8["pixel_values"].copy())
    out = mt.expand_pixels(patches, grid, preset=preset)
    assert out.dtype == torch.float32 and torch.equal(bits(out), bits(want))
    out16 = mt.expand_pixels(patches, grid, preset=preset, dtype=torch.bfloat16)
    assert out16.dtype == torch.bfloat16 and torch.equal(bits(out16), bits(want.to(torch.bfloat16)))


def test_bfloat16_avx2_writer_is_the_portable_table_bit_for_bit(photo_bytes, tmp_path):
    """The AVX2 bfloat16 writer (used where the CPU has AVX2) against the portable table
    writer (MML_DISABLE_AVX2=1 in a child process), bit for bit, for P=14 and P=16 and
    the mean/std of every preset."""
    import subprocess
    import sys

    datas = photo_bytes + [encode(rgb(im), "JPEG", quality=80) for im in photos(97).values()]
    for i, d in enumerate(datas):
        (tmp_path / f"{i:02d}.img").write_bytes(d)
    code = (
        "import glob, sys, numpy as np, mmloader\n"
        "d = [open(p, 'rb').read() for p in sorted(glob.glob(sys.argv[1] + '/*.img'))]\n"
        "for i, preset in enumerate(%r):\n"
        "    o = mmloader.ImageProcessor(preset, pixel_format='bfloat16')(d)\n"
        "    np.save(f'{sys.argv[1]}/{sys.argv[2]}{i}.npy', o['pixel_values'])\n" % (PRESETS,)
    )
    env = child_env()
    for tag, extra in (("simd", {}), ("table", {"MML_DISABLE_AVX2": "1"})):
        env.pop("MML_DISABLE_AVX2", None)
        r = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path), tag],
            env=dict(env, **extra),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
    for i in range(len(PRESETS)):
        a, b = np.load(tmp_path / f"simd{i}.npy"), np.load(tmp_path / f"table{i}.npy")
        assert a.dtype == np.uint16 and a.shape == b.shape and a.size > 0
        assert np.array_equal(a, b), PRESETS[i]


def test_uint8_rows_are_the_resized_pixels_in_the_hf_layout():
    """The uint8 format is the resized image itself, patchified with the HF row/column
    order (T left out): checked against mmloader's Pillow-exact resize of the decode."""
    from mmloader import _core

    im = rgb(photos(256)["astronaut"])
    data = encode(im, "PNG")
    proc = mmloader.ImageProcessor(
        "qwen2.5-vl", pixel_format="uint8", min_pixels=100 * 28 * 28, max_pixels=100 * 28 * 28
    )
    got = proc(data)
    plan = proc.plan(data)
    h, w = plan["dst_h"], plan["dst_w"]
    buf, sh, sw = _core.image_decode(data, 1)
    resized = np.frombuffer(_core.resize_bicubic(buf, sh, sw, h, w), np.uint8).reshape(h, w, 3)
    P, M = 14, 2
    gh, gw = h // P, w // P
    x = resized.transpose(2, 0, 1).reshape(3, gh // M, M, P, gw // M, M, P)
    want = x.transpose(1, 4, 2, 5, 0, 3, 6).reshape(gh * gw, 3 * P * P)
    np.testing.assert_array_equal(got["pixel_values"], want)
    assert got["image_grid_thw"].tolist() == [[1, gh, gw]]


def test_pixel_table_is_the_pil_backend_arithmetic():
    """Each entry: float32(float64(v) * (1/255)), then (x - mean) / std in float32 — the
    transformers PIL backend's rescale + normalize, not a fused or float64 formula."""
    t = mt.pixel_table("qwen2.5-vl")
    assert t.shape == (3, 256) and t.dtype == torch.float32
    mean = np.float32([0.48145466, 0.4578275, 0.40821073])
    std = np.float32([0.26862954, 0.26130258, 0.27577711])
    x = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    want = (x[None] - mean[:, None]) / std[:, None]
    assert torch.equal(bits(t), bits(want))
    fused = (
        (np.arange(256, dtype=np.float32)[None] - (mean * 255)[:, None]) / (std * 255)[:, None]
    ).astype(np.float32)
    assert not np.array_equal(want, fused)  # the difference is real: the formula matters
    q3 = mt.pixel_table("qwen3-vl")
    assert float(q3[0, 0]) == -1.0 and float(q3[2, 255]) == 1.0


def test_expand_pixels_checks_its_input():
    u8 = torch.zeros((8, 588), dtype=torch.uint8)
    with pytest.raises(TypeError, match="uint8"):
        mt.expand_pixels(u8.float())
    with pytest.raises(ValueError, match="neither"):
        mt.expand_pixels(torch.zeros((8, 500), dtype=torch.uint8))
    with pytest.raises(ValueError, match="holds 16 patches"):
        mt.expand_pixels(u8, torch.tensor([[1, 4, 4]]))
    with pytest.raises(TypeError, match="dtype"):
        mt.expand_pixels(u8, dtype=torch.float16)
    assert mt.expand_pixels(u8, torch.tensor([[1, 2, 4]])).shape == (8, 1176)
    # rows that keep their T frames (a video's temporal patch) are gathered, not repeated
    two = torch.randint(0, 256, (4, 1176), dtype=torch.uint8)
    out = mt.expand_pixels(two)
    table = mt.pixel_table()
    c = torch.arange(3).repeat_interleave(2 * 196).repeat(4, 1)
    assert torch.equal(bits(out), bits(table[c, two.long()]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("frames", [1, 2])
def test_the_gpu_gather_and_the_cpu_paths_agree(frames, dtype):
    """expand_pixels gathers with torch ops on a GPU (_gather, which runs on any device:
    here the CPU) and with the core's loop on the CPU: the same bits."""
    u8 = torch.randint(0, 256, (37, 3 * frames * 196), dtype=torch.uint8)
    flat = mt.pixel_table("qwen2.5-vl").reshape(-1).to(dtype)
    repeat = 2 if frames == 1 else 1
    a = mt._gather(flat, u8, 3 * frames * 196, repeat)
    c = mt.expand_pixels(u8, dtype=dtype)
    assert a.shape == c.shape == (37, 3 * 2 * 196)
    assert a.dtype == c.dtype == dtype
    assert torch.equal(bits(a), bits(c))
    assert torch.equal(bits(mt.expand_pixels(u8[:0], dtype=dtype)), bits(c[:0]))  # no rows


def test_vision_processor_rejects_an_unknown_format():
    with pytest.raises(mmloader.ConfigError, match="pixel_format"):
        mmloader.ImageProcessor("qwen2.5-vl", pixel_format="float16")


# ---------------------------------------------------------------- the loader formats


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("pixfmt"))
    return make_dataset(
        root, n_samples=30, seed=5, n_shards=2, n_images=10, min_size=32, max_size=160
    )


def epoch(ds, cls=mmloader.Loader, **kw):
    args = dict(
        tokenizer=TINY,
        micro_batch_size=3,
        num_threads=2,
        prefetch=2,
        seq_length=384,
        shuffle=True,
        seed=3,
        **SMALL,
    )
    args.update(kw)
    with cls(ds["shards"], **args) as L:
        return [
            {
                k: torch.from_dlpack(v).clone() if not isinstance(v, torch.Tensor) else v.clone()
                for k, v in b.items()
            }
            for b in L
        ]


@pytest.mark.parametrize("keys", ["qwen", "megatron"])
def test_loader_formats_carry_the_same_values(ds, keys):
    mbs = 1 if keys == "megatron" else 3  # single samples: some batches are text-only
    f32 = epoch(ds, keys=keys, micro_batch_size=mbs)
    bf16 = epoch(ds, keys=keys, micro_batch_size=mbs, pixel_format="bfloat16")
    u8 = epoch(ds, keys=keys, micro_batch_size=mbs, pixel_format="uint8")
    assert len(f32) == len(bf16) == len(u8) == 30 // mbs
    placeholders = 0
    for a, b, u in zip(f32, bf16, u8):
        assert sorted(a) == sorted(b) == sorted(u)
        for k in a:
            if k != "pixel_values":
                assert torch.equal(a[k], b[k]) and torch.equal(a[k], u[k]), k
        pv = a["pixel_values"]
        assert b["pixel_values"].dtype == torch.bfloat16 and u["pixel_values"].dtype == torch.uint8
        assert b["pixel_values"].shape == pv.shape
        assert u["pixel_values"].shape == (pv.shape[0], pv.shape[1] // 2)
        assert torch.equal(bits(b["pixel_values"]), bits(pv.to(torch.bfloat16)))
        grid = a["image_grid_thw"]
        if int(grid[0, 0]) == 0:  # the text-only placeholder: zeros in every format
            placeholders += 1
            assert not u["pixel_values"].any() and not pv.any()
        else:
            assert torch.equal(bits(mt.expand_pixels(u["pixel_values"], grid)), bits(pv))
    if keys == "megatron":
        assert placeholders > 0  # the dataset has text-only batches: the case is covered


def test_torch_loader_expands_with_its_own_preset(ds):
    """Issue 28: a uint8 batch is expanded with the loader's own vision settings, so a
    Qwen3-VL user does not repeat preset= (mmloader.torch.expand_pixels' default preset is
    Qwen2.5-VL's: other patch size, mean and std)."""
    want = epoch(ds, cls=mt.Loader, preset="qwen3-vl")
    with mt.Loader(
        ds["shards"],
        tokenizer=TINY,
        micro_batch_size=3,
        num_threads=2,
        prefetch=2,
        seq_length=384,
        shuffle=True,
        seed=3,
        preset="qwen3-vl",
        pixel_format="uint8",
        **SMALL,
    ) as L:
        raw = [dict(b) for b in L]
        got = [L.expand_pixels(b) for b in raw]
        v = L.vision_config
    same(got, want)
    b = next(r for r in raw if int(r["image_grid_thw"][0, 0]) > 0)
    with_cfg = mt.expand_pixels(b["pixel_values"], b["image_grid_thw"], vision_config=v)
    assert torch.equal(bits(with_cfg), bits(L.expand_pixels(b)["pixel_values"]))
    # without them, the trap the loader's own avoids is an error that says what to pass
    with pytest.raises(ValueError, match="vision_config=loader.vision_config"):
        mt.expand_pixels(b["pixel_values"], b["image_grid_thw"])


def test_uint8_batches_are_an_eighth_of_float32(ds):
    with mmloader.Loader(
        ds["shards"],
        tokenizer=TINY,
        micro_batch_size=3,
        seq_length=384,
        pixel_format="uint8",
        **SMALL,
    ) as L:
        b = next(L)
        assert L._c.options()["pixel_format"] == "uint8"  # what the engine runs with
    with mmloader.Loader(
        ds["shards"], tokenizer=TINY, micro_batch_size=3, seq_length=384, **SMALL
    ) as L:
        a = next(L)
    assert a["pixel_values"].nbytes == 8 * b["pixel_values"].nbytes
    assert b["pixel_values"].dtype == "uint8"


def test_bfloat16_tensors_say_numpy_cannot_hold_them(ds):
    with mmloader.Loader(
        ds["shards"],
        tokenizer=TINY,
        micro_batch_size=3,
        seq_length=384,
        pixel_format="bfloat16",
        **SMALL,
    ) as L:
        b = next(L)
        assert b["pixel_values"].dtype == "bfloat16"
        with pytest.raises(TypeError, match="NumPy has no bfloat16"):
            b["pixel_values"].numpy()
        assert torch.from_dlpack(b["pixel_values"]).dtype == torch.bfloat16


def test_pixel_format_is_a_checked_loader_option(ds):
    with pytest.raises(mmloader.ConfigError, match="pixel_format"):
        mmloader.Loader(ds["shards"], tokenizer=TINY, pixel_format="float16")


# ---------------------------------------------------------------- the torch adapter


@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
@pytest.mark.parametrize("packing", [False, True])
def test_torch_loader_consumer_expansion_gives_the_same_batches(ds, fmt, packing):
    """pixel_format="<fmt>-consumer": the engine makes uint8 patches and the adapter expands
    them (where the batch is: here the CPU) into exactly the batches of "<fmt>" (the engine
    expanding)."""
    kw: dict = dict(cls=mt.Loader)
    if packing:
        kw.update(packing=True, seq_length=None, pack_length=512)
    want = epoch(ds, pixel_format=fmt, **kw)
    got = epoch(ds, pixel_format=f"{fmt}-consumer", **kw)
    same(got, want)
    assert any("pixel_values" in b for b in want)


def test_torch_loader_pixel_format_defaults_and_checks(ds):
    args = dict(tokenizer=TINY, micro_batch_size=3, seq_length=384, **SMALL)
    with mt.Loader(ds["shards"], **args) as L:  # no CUDA device: the engine expands
        assert L.pixel_format == "float32" and L._expand is None
    with mt.Loader(ds["shards"], pixel_format="float32-consumer", **args) as L:
        assert L.loader._c.options()["pixel_format"] == "uint8"
        assert L.loader.vision_config["patch_size"] == 14
        b = next(L)
        assert "pixel_values" not in b or b["pixel_values"].dtype == torch.float32
    with mt.Loader(ds["shards"], pixel_format="uint8", **args) as L:
        assert L.pixel_format == "uint8" and L._expand is None  # uint8 asked: not expanded
    with pytest.raises(mmloader.ConfigError, match="wire_format"):
        mt.Loader(ds["shards"], wire_format="bfloat16", **args)
    with pytest.raises(mmloader.ConfigError, match="pixel_format must be one of"):
        mt.Loader(ds["shards"], pixel_format="uint8-consumer", **args)


def test_megatron_provider_and_get_batch_with_the_uint8_wire(ds):
    """The Megatron adapter with uint8 on the wire (what it does on a GPU by default; on
    this CPU through pixel_format="float32-consumer"): get_batch returns the same tensors,
    placeholder batches included."""
    mm = pytest.importorskip("mmloader.megatron")
    if not torch.cuda.is_available():
        assert mm.default_device() == "cpu"
    args = dict(
        data=ds["shards"],
        tokenizer=TINY,
        num_threads=2,
        prefetch=2,
        micro_batch_size=1,
        seq_length=384,
        resume=False,
        **SMALL,
    )
    want, _, _ = mm.make_provider(**args)([0, 0, 0])
    got, _, _ = mm.make_provider(pixel_format="float32-consumer", **args)([0, 0, 0])
    with want, got:
        assert got.pixel_format == "float32-consumer"
        assert got.loader._c.options()["pixel_format"] == "uint8"
        placeholders = 0
        for _ in range(len(want)):
            a = mm.get_batch(want, device="cpu", drop_placeholder=False)
            b = mm.get_batch(got, device="cpu", drop_placeholder=False)
            tensors = {k: v for k, v in a.items() if isinstance(v, torch.Tensor)}
            same({k: b[k] for k in tensors}, tensors)
            placeholders += int(a["image_grid_thw"][0, 0]) == 0
        assert placeholders > 0


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("preset", PRESETS)
def test_expand_pixels_on_the_gpu_is_bit_identical(preset, photo_bytes):
    f32 = mmloader.ImageProcessor(preset)(photo_bytes)
    u8 = mmloader.ImageProcessor(preset, pixel_format="uint8")(photo_bytes)
    patches = torch.from_numpy(u8["pixel_values"].copy()).cuda()
    grid = torch.from_numpy(u8["image_grid_thw"]).cuda()
    want = torch.from_numpy(f32["pixel_values"])
    out = mt.expand_pixels(patches, grid, preset=preset)
    assert out.is_cuda and torch.equal(bits(out.cpu()), bits(want))
    out16 = mt.expand_pixels(patches, grid, preset=preset, dtype=torch.bfloat16)
    assert torch.equal(bits(out16.cpu()), bits(want.to(torch.bfloat16)))


@pytest.mark.gpu
@cuda
def test_torch_loader_on_cuda_moves_uint8_and_expands_on_the_device(ds):
    want = epoch(ds, cls=mt.Loader)
    with mt.Loader(
        ds["shards"],
        tokenizer=TINY,
        micro_batch_size=3,
        num_threads=2,
        prefetch=2,
        seq_length=384,
        shuffle=True,
        seed=3,
        device="cuda",
        **SMALL,
    ) as L:
        assert L.pixel_format == "float32-consumer"  # the default with a CUDA device
        got = []
        for b in L:
            assert all(v.is_cuda for v in b.values())
            got.append({k: v.cpu() for k, v in b.items()})
    same(got, want)
