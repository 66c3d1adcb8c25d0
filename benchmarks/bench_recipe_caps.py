"""Decode-bound recipes: real photos re-encoded at 3-12 MP, resized to a recipe's cap
(LLaMA-Factory's image_max_pixels 768*768, and 200,704 pixels), exact against
fast_decode=True, with the decode-only floors measured in every repeat (issue 34).

    python3 -m pytest benchmarks/bench_recipe_caps.py --benchmark-only -q -s

The images: the scikit-image / matplotlib sample photos of tests/photos.py (colour and
grey), each upscaled (bicubic) to 3-12 MP and saved as JPEG at quality 85-95, one in seven
progressive (the e2e dataset's share), 14 images.  For each cap, 3 repeats, the peers
interleaved within each repeat, every figure CPU time (time.process_time) per image on one
thread, the median over the repeats:

- decode-only, full size (`_core.decode_only`): the floor of the exact path;
- decode-only at the fast path's scale (`_core.decode_only(datas, scales)`, each image's
  libjpeg scale_denom from its plan): the floor of fast_decode=True;
- `mmloader.ImageProcessor` exact and fast_decode=True, uint8 and float32;
- `mmloader.Loader` (one worker thread, one image a sample, the records cycled): uint8
  exact and fast_decode=True, and float32 exact (the float32 half of the exact path's
  target): CPU of the whole process per sample;
- Pillow: `Image.open` + `convert("RGB")`, full size and with `draft()` (libjpeg's scaled
  decode, what a PIL pipeline could use), and the transformers PIL processor
  (`Qwen2VLImageProcessorPil`) after a full-size Pillow decode: the DataLoader's per-image
  work.

It prints the figures, the ratios (fast path / its scaled floor, exact / fast, the
processor against the floor) and fast_decode's deviation from the exact path (max and mean
absolute difference of the normalised float32 values, PSNR of the uint8 pixels).  Time
figures are ratios within one run; no assertion is made on them.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import mmloader  # noqa: E402
from mmloader import _core  # noqa: E402

Image = pytest.importorskip("PIL.Image")
photos = pytest.importorskip("photos")  # tests/photos.py: the sample photos

CAPS = {"768x768": 768 * 768, "200704": 200704}
MPS = (3, 4, 6, 8, 10, 12)
N_IMAGES = 14
REPEATS = 3
TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")


def make_photos(n: int = N_IMAGES, seed: int = 0) -> List[bytes]:
    """The photos re-encoded at 3-12 MP (JPEG quality 85-95, one in seven progressive)."""
    rng = np.random.default_rng(seed)
    names = sorted(photos._PHOTOS)
    out = []
    for k in range(n):
        pkg, fname = photos._PHOTOS[names[k % len(names)]]
        im = Image.open(photos.data_file(pkg, fname))
        im.load()
        im = im.convert("L" if im.mode in ("L", "I;16", "1") else "RGB")
        w0, h0 = im.size
        f = (MPS[k % len(MPS)] * 1e6 / (w0 * h0)) ** 0.5
        im = im.resize((int(w0 * f), int(h0 * f)), Image.BICUBIC)
        b = io.BytesIO()
        im.save(b, "JPEG", quality=int(rng.integers(85, 96)), progressive=k % 7 == 6)
        out.append(b.getvalue())
    return out


@pytest.fixture(scope="module")
def files() -> List[bytes]:
    return make_photos()


def _cpu_ms(fn: Callable[[], object], n: int) -> float:
    c = time.process_time()
    fn()
    return (time.process_time() - c) / n * 1e3


def _loader_ms(path: str, cap: int, fast: bool, n: int, fmt: str = "uint8") -> float:
    """Process CPU per sample of a one-thread Loader over n samples (records cycled), in
    pixel format fmt."""
    c = time.process_time()
    got = 0
    with mmloader.Loader(
        path,
        tokenizer=TINY,
        micro_batch_size=2,
        max_pixels=cap,
        fast_decode=fast,
        pixel_format=fmt,
        num_threads=1,
        cycle=True,
    ) as L:
        for b in L:
            got += int(b["image_grid_thw"].shape[0])
            if got >= n:
                break
    return (time.process_time() - c) / got * 1e3


def deviation(files: List[bytes], cap: int) -> Dict[str, float]:
    """fast_decode=True against the exact path: |diff| of the normalised float32 values
    (max, mean) and the PSNR of the uint8 pixels (peak 255)."""
    kw = dict(max_pixels=cap)
    ex = mmloader.ImageProcessor("qwen2.5-vl", **kw)(files)["pixel_values"]
    fa = mmloader.ImageProcessor("qwen2.5-vl", fast_decode=True, **kw)(files)["pixel_values"]
    exu = mmloader.ImageProcessor("qwen2.5-vl", pixel_format="uint8", **kw)(files)
    fau = mmloader.ImageProcessor("qwen2.5-vl", pixel_format="uint8", fast_decode=True, **kw)(files)
    d = np.abs(ex.astype(np.float64) - fa.astype(np.float64))
    mse = np.mean(
        (exu["pixel_values"].astype(np.float64) - fau["pixel_values"].astype(np.float64)) ** 2
    )
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "psnr_db": float(10 * np.log10(255.0**2 / mse)) if mse > 0 else float("inf"),
    }


def measure(files: List[bytes], cap: int, tmp: str) -> Dict[str, object]:
    n = len(files)
    kw = dict(max_pixels=cap)
    proc = {
        (fast, fmt): mmloader.ImageProcessor("qwen2.5-vl", fast_decode=fast, pixel_format=fmt, **kw)
        for fast in (False, True)
        for fmt in ("uint8", "float32")
    }
    plans = [proc[(True, "uint8")].plan(d) for d in files]
    scales = [int(p["decode_scale"]) for p in plans]
    paths = []
    for i, d in enumerate(files):
        p = os.path.join(tmp, f"photo-{i:02d}.jpg")
        with open(p, "wb") as f:
            f.write(d)
        paths.append(p)
    shard = os.path.join(tmp, "train.jsonl")
    with open(shard, "w") as f:
        for p in paths:
            msg = [
                {"role": "user", "content": "<image>What is in the photo?"},
                {"role": "assistant", "content": "A photo."},
            ]
            f.write(json.dumps({"messages": msg, "images": [p]}) + "\n")

    def pil_full() -> None:
        for d in files:
            Image.open(io.BytesIO(d)).convert("RGB")

    def pil_draft() -> None:
        for d, p in zip(files, plans):
            im = Image.open(io.BytesIO(d))
            im.draft("RGB", (p["dst_w"], p["dst_h"]))
            im.convert("RGB")

    hf = None
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        hf = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=cap)
    except ImportError:
        pass

    peers: Dict[str, Callable[[], float]] = {
        "decode_full": lambda: _cpu_ms(lambda: _core.decode_only(files), n),
        "decode_scaled": lambda: _cpu_ms(lambda: _core.decode_only(files, scales), n),
        "exact_uint8": lambda: _cpu_ms(lambda: proc[(False, "uint8")](files), n),
        "fast_uint8": lambda: _cpu_ms(lambda: proc[(True, "uint8")](files), n),
        "exact_float32": lambda: _cpu_ms(lambda: proc[(False, "float32")](files), n),
        "fast_float32": lambda: _cpu_ms(lambda: proc[(True, "float32")](files), n),
        "loader_exact_uint8": lambda: _loader_ms(shard, cap, False, 3 * n),
        "loader_fast_uint8": lambda: _loader_ms(shard, cap, True, 3 * n),
        "loader_exact_float32": lambda: _loader_ms(shard, cap, False, 3 * n, "float32"),
        "pillow_full": lambda: _cpu_ms(pil_full, n),
        "pillow_draft": lambda: _cpu_ms(pil_draft, n),
    }
    if hf is not None:
        peers["hf_pil_processor"] = lambda: _cpu_ms(
            lambda: hf([Image.open(io.BytesIO(d)).convert("RGB") for d in files]), n
        )
    runs: Dict[str, List[float]] = {k: [] for k in peers}
    for fn in proc.values():  # warm the scratch
        fn(files[:2])
    for _ in range(REPEATS):
        for k, fn in peers.items():
            runs[k].append(fn())
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"ms": med, "runs": runs, "scales": scales, "load": os.getloadavg()[0]}


def _report(name: str, files: List[bytes], r: Dict[str, object], dev: Dict[str, float]) -> None:
    m = r["ms"]  # type: ignore[index]
    scales = r["scales"]  # type: ignore[index]
    print(
        f"\ncap {name}: {len(files)} photos at 3-12 MP, decode scales "
        f"{ {s: scales.count(s) for s in sorted(set(scales))} }, load {r['load']:.1f}"
    )
    for k, v in m.items():  # type: ignore[union-attr]
        print(f"  {k:20s} {v:7.2f} ms/image CPU (median of {REPEATS})")

    def ratio(a: str, b: str) -> str:
        return f"{m[a] / m[b]:.2f}" if a in m and b in m else "n/a"

    print(
        f"  fast uint8 / scaled decode {ratio('fast_uint8', 'decode_scaled')}, "
        f"fast float32 / scaled decode {ratio('fast_float32', 'decode_scaled')}, "
        f"exact uint8 / full decode {ratio('exact_uint8', 'decode_full')}, "
        f"exact float32 / full decode {ratio('exact_float32', 'decode_full')}, "
        f"Loader exact uint8 / full decode {ratio('loader_exact_uint8', 'decode_full')}, "
        f"Loader exact float32 / full decode {ratio('loader_exact_float32', 'decode_full')}"
    )
    print(
        f"  exact / fast: ImageProcessor uint8 {ratio('exact_uint8', 'fast_uint8')}, "
        f"float32 {ratio('exact_float32', 'fast_float32')}, Loader uint8 "
        f"{ratio('loader_exact_uint8', 'loader_fast_uint8')}; full / scaled decode "
        f"{ratio('decode_full', 'decode_scaled')}; Pillow full / draft "
        f"{ratio('pillow_full', 'pillow_draft')}; HF PIL processor / fast float32 "
        f"{ratio('hf_pil_processor', 'fast_float32')}"
    )
    print(
        f"  fast_decode deviation: normalised values max |diff| {dev['max_abs']:.3f}, mean "
        f"{dev['mean_abs']:.4f}; uint8 PSNR {dev['psnr_db']:.1f} dB"
    )


@pytest.mark.parametrize("cap", sorted(CAPS))
def test_recipe_cap(benchmark, files, cap, tmp_path):
    px = CAPS[cap]
    fast = mmloader.ImageProcessor("qwen2.5-vl", max_pixels=px, fast_decode=True)
    benchmark.pedantic(fast, args=(files,), rounds=1, iterations=1, warmup_rounds=0)
    r = measure(files, px, str(tmp_path))
    _report(cap, files, r, deviation(files, px))
