"""The benchmark's dataset: a realistic multimodal SFT mix, generated once per (n, seed) and
cached under the temp folder.

Images: photo-like JPEGs (smooth content plus sensor noise, quality 85-95; one in ten of all
images is a progressive JPEG) and screenshot-like PNGs (flat panels and text-like strokes,
a quarter of them RGBA), sizes from thumbnails to 1080p in portrait and landscape.
Records: messages style, one to three user/assistant turns, mostly one image, some two,
a few text-only; `<image>` tags in the user turns.  One shard, image paths relative to it.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Dict, List, Optional

import numpy as np

SIZES = [((320, 240), .10), ((640, 480), .25), ((800, 600), .15), ((1024, 768), .20),
         ((1280, 720), .15), ((1920, 1080), .10), ((768, 1024), .05)]
WORDS = ("the a of image shows what is there in this picture describe color left right top "
         "bottom person car tree sky building table chart value number text screen window "
         "button menu label line bar graph red blue green small large near far behind two "
         "three many some each people animal road water light dark background foreground "
         "please explain how why where when does it look like count read").split()


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


def _text(rng: np.random.Generator, lo: int, hi: int) -> str:
    words = rng.choice(WORDS, int(rng.integers(lo, hi)))
    return " ".join(words).capitalize() + "."


def _write_image(rng: np.random.Generator, path_noext: str, k: int) -> str:
    from PIL import Image
    sizes = [s for s, _ in SIZES]
    (w, h) = sizes[int(rng.choice(len(SIZES), p=[p for _, p in SIZES]))]
    kind = rng.random()
    if kind < 0.7:  # photo, baseline or progressive JPEG (10% of all images progressive)
        progressive = k % 10 == 3
        path = path_noext + ".jpg"
        Image.fromarray(_photo(rng, w, h)).save(path, "JPEG", quality=int(rng.integers(85, 96)),
                                                progressive=progressive)
    else:
        if k % 10 == 3:  # keep the progressive share at 10% of all images
            path = path_noext + ".jpg"
            Image.fromarray(_photo(rng, w, h)).save(path, "JPEG", quality=90, progressive=True)
            return path
        path = path_noext + ".png"
        img = Image.fromarray(_screen(rng, w, h))
        if rng.random() < 0.25:
            img.putalpha(255)
        img.save(path, "PNG")
    return path


def make(root: str, n_samples: int, seed: int = 0) -> str:
    """Writes the dataset under root (if not already complete); returns the shard path."""
    shard = os.path.join(root, "data.jsonl")
    if os.path.exists(os.path.join(root, ".complete")):
        return shard
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    rng = np.random.default_rng(seed)
    k = 0
    lines: List[str] = []
    for i in range(n_samples):
        r = rng.random()
        n_img = 0 if r < 0.05 else (2 if r < 0.15 else 1)
        images = []
        for _ in range(n_img):
            p = _write_image(rng, os.path.join(root, "images", f"{k:06d}"), k)
            images.append(os.path.relpath(p, root))
            k += 1
        turns = int(rng.integers(1, 4))
        msgs: List[Dict[str, str]] = []
        tags = ["<image>"] * n_img
        for t in range(turns):
            # the first image opens the first turn; a second one goes into the second turn
            # (or the first, for single-turn records)
            here = tags[:1] if t == 0 else tags[:]
            tags = tags[len(here):]
            if t == turns - 1 and tags:
                here += tags
                tags = []
            prefix = "".join(x + "\n" for x in here)
            msgs.append({"role": "user", "content": prefix + _text(rng, 6, 30)})
            msgs.append({"role": "assistant", "content": _text(rng, 15, 120)})
        lines.append(json.dumps({"messages": msgs, "images": images}))
    with open(shard, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    open(os.path.join(root, ".complete"), "w").close()
    return shard


def cached(n_samples: int, seed: int = 0, base: Optional[str] = None) -> str:
    """The shard of the cached dataset (generated on first use)."""
    base = base or os.environ.get("MML_BENCH_DATA") or os.path.join(
        tempfile.gettempdir(), "mmloader-bench")
    return make(os.path.join(base, f"mix-{n_samples}-{seed}"), n_samples, seed)


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
            rec = json.loads(line)
            recs += 1
            turns += sum(1 for m in rec["messages"] if m["role"] == "assistant")
            for ref in rec["images"]:
                path = os.path.join(root, ref)
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
