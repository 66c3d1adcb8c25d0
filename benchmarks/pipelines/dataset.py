"""The benchmark's dataset: a realistic multimodal SFT mix, generated once per (n, seed) and
cached under the temp folder.

Records come from mmloader.datagen.make_dataset (LLaVA, messages and HF content-part
formats, one to three turns, 0-2 images each, one shard, image paths relative to it); each
image reference then gets its own new file at a realistic size and content: photo-like JPEGs
(smooth content plus sensor noise, quality 85-95), one in ten of all images a progressive
JPEG, and one in five a screenshot-like PNG (flat panels and text-like strokes; RGB, RGBA
or palette), from thumbnails to 1080p in portrait and landscape.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Dict, Optional

import numpy as np

from .common import parse_record

SIZES = [((320, 240), .10), ((640, 480), .25), ((800, 600), .15), ((1024, 768), .20),
         ((1280, 720), .15), ((1920, 1080), .10), ((768, 1024), .05)]



def _photo(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    from PIL import Image
    small = rng.integers(0, 256, (max(2, h // 48), max(2, w // 48), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), np.int16)
    img = img + rng.normal(0, 5, img.shape).astype(np.int16)
    return np.clip(img, 0, 255).astype(np.uint8)


def _screen(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    img = np.empty((h, w, 3), np.uint8)
    img[:] = rng.integers(200, 256, 3, dtype=np.uint8)
    for _ in range(int(rng.integers(3, 9))):  # panels
        x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
        x1, y1 = x0 + int(rng.integers(8, w // 2 + 9)), y0 + int(rng.integers(8, h // 2 + 9))
        img[y0:y1, x0:x1] = rng.integers(0, 256, 3, dtype=np.uint8)
    for _ in range(int(rng.integers(10, 40))):  # text-like strokes
        y, x = int(rng.integers(0, h - 3)), int(rng.integers(0, w - 8))
        n = int(rng.integers(8, min(w - x, 300) + 1))
        mask = rng.random(n) < 0.6
        img[y:y + 2, x:x + n][:, mask] = 20
    return img


def _kind(i: int) -> str:
    """Image i's kind: 10% progressive JPEG, 20% PNG, the rest baseline JPEG."""
    k = i % 10
    return {3: "jpeg_progressive", 1: "png", 6: "png_rgba" if i % 20 == 6 else "png_palette"
            }.get(k, "jpeg")


def _write_image(rng: np.random.Generator, root: str, k: int) -> str:
    """Writes reference k's realistic image; returns its name relative to root."""
    from PIL import Image
    sizes = [s for s, _ in SIZES]
    (w, h) = sizes[int(rng.choice(len(SIZES), p=[p for _, p in SIZES]))]
    kind = _kind(k)
    name = f"images/ref-{k:06d}" + (".jpg" if kind.startswith("jpeg") else ".png")
    path = os.path.join(root, name)
    if kind.startswith("jpeg"):
        Image.fromarray(_photo(rng, w, h)).save(
            path, "JPEG", quality=int(rng.integers(85, 96)),
            progressive=kind == "jpeg_progressive")
    else:
        img = Image.fromarray(_screen(rng, w, h))
        if kind == "png_rgba":
            img.putalpha(255)
        elif kind == "png_palette":
            img = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=128)
        img.save(path, "PNG")
    return name


def make(root: str, n_samples: int, seed: int = 0) -> str:
    """Writes the dataset under root (if not already complete); returns the shard path.

    datagen's records share its images; here every image reference, in record order, gets
    its own new file, so the mix above holds for the references themselves."""
    from mmloader.datagen import make_dataset
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        with open(marker) as f:
            return os.path.join(root, f.read().strip())
    desc = make_dataset(root, n_samples=n_samples, seed=seed, n_shards=1,
                        n_images=8, min_size=16, max_size=32)
    shard = desc["shards"][0]
    old = {json.dumps(os.path.relpath(p, root)) for p in desc["images"]}
    pattern = re.compile("|".join(re.escape(o) for o in sorted(old)))
    rng = np.random.default_rng(seed)
    count = [0]

    def fresh(m: "re.Match[str]") -> str:
        k = count[0]
        count[0] += 1
        return json.dumps(_write_image(rng, root, k))

    with open(shard, encoding="utf-8") as f:
        text = pattern.sub(fresh, f.read())
    with open(shard, "w", encoding="utf-8") as f:
        f.write(text)
    for p in desc["images"]:
        os.remove(p)
    with open(marker, "w") as f:
        f.write(os.path.basename(shard))
    return shard


def cached(n_samples: int, seed: int = 0, base: Optional[str] = None) -> str:
    """The shard of the cached dataset (generated on first use)."""
    base = base or os.environ.get("MML_BENCH_DATA") or os.path.join(
        tempfile.gettempdir(), "mmloader-bench")
    return make(os.path.join(base, f"mix3-{n_samples}-{seed}"), n_samples, seed)


def subset(shard: str, k: int) -> str:
    """A shard of the first k records of `shard`, written beside it (same image folder)."""
    path = shard[:-len(".jsonl")] + f".first{k}.jsonl"
    if not os.path.exists(path):
        with open(shard, encoding="utf-8") as f:
            lines = [ln for ln in f if ln.strip()][:k]
        if len(lines) < k:
            raise ValueError(f"{shard} has {len(lines)} records, fewer than {k}")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(path + ".tmp", path)
    return path


def describe(shard: str) -> Dict[str, object]:
    """What the dataset holds: records, turns, images by kind and size, bytes."""
    from PIL import Image
    root = os.path.dirname(shard)
    recs = turns = 0
    kinds: Dict[str, int] = {}
    sizes: Dict[str, int] = {}
    nbytes = 0
    with open(shard, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            recs += 1
            messages, refs = parse_record(shard, line)
            turns += sum(1 for m in messages if m["role"] == "assistant")
            for path in refs:
                nbytes += os.path.getsize(path)
                with Image.open(path) as im:
                    kind = im.format + ("-progressive" if im.info.get("progressive") else "")
                    kind += "-" + im.mode if im.format == "PNG" else ""
                    size = f"{im.width}x{im.height}"
                kinds[kind] = kinds.get(kind, 0) + 1
                sizes[size] = sizes.get(size, 0) + 1
    n_img = sum(kinds.values())
    return {"records": recs, "turns_per_record": round(turns / max(recs, 1), 2),
            "images": n_img, "image_kinds": kinds, "image_sizes": sizes,
            "image_mb": round(nbytes / 2**20, 1)}
