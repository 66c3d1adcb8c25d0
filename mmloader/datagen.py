"""A small, deterministic multimodal SFT dataset for tests, demos and benchmarks.

``make_dataset(root)`` writes JSONL shards mixing the three record formats mmloader reads
(LLaVA ``conversations``, ``messages`` + ``images``, HF content parts), multi-turn, with
0, 1 or 2 images per record, and the images they name: JPEG (baseline and progressive)
and PNG (RGB, RGBA, palette, grayscale) of mixed sizes and aspect ratios.  The same
arguments always give byte-identical files.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Dict, List, Sequence

FORMATS = ("llava", "messages", "parts")

_WORDS = (
    "the a red blue green small large cat dog tree house car road sky cloud river "
    "person two three left right top bottom near far picture photo shows what where "
    "how many color is are of in on with and this that there image describe count "
    "answer yes no bright dark old new round square"
).split()


def _sentence(rng: random.Random, lo: int = 4, hi: int = 18) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    s = " ".join(words)
    return s[0].upper() + s[1:] + rng.choice([".", "?", "!", "."])


def _make_image(rng: random.Random, path: str, kind: str, w: int, h: int) -> None:
    import numpy as np
    from PIL import Image

    nrng = np.random.default_rng(rng.getrandbits(32))
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack(
        [
            (xx * 255 // max(1, w - 1)),
            (yy * 255 // max(1, h - 1)),
            ((xx + yy) * 127 // max(1, w + h - 2)),
        ],
        axis=-1,
    )
    noise = nrng.integers(0, 48, size=(h, w, 3))
    rgb = np.clip(base + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(rgb, "RGB")
    if kind == "jpeg":
        img.save(path, "JPEG", quality=rng.choice([75, 85, 95]))
    elif kind == "jpeg_progressive":
        img.save(path, "JPEG", quality=85, progressive=True)
    elif kind == "png_rgba":
        alpha = (nrng.integers(0, 256, size=(h, w))).astype(np.uint8)
        rgba = np.dstack([rgb, alpha])
        Image.fromarray(rgba, "RGBA").save(path, "PNG")
    elif kind == "png_palette":
        img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(path, "PNG")
    elif kind == "png_gray":
        img.convert("L").save(path, "PNG")
    else:
        img.save(path, "PNG")


_KINDS = ("jpeg", "jpeg", "jpeg", "jpeg_progressive", "png", "png_rgba", "png_palette", "png_gray")


def _record(rng: random.Random, fmt: str, images: List[str]) -> Dict[str, Any]:
    turns = rng.randint(1, 3)
    msgs = []  # (role, text, n_images_in_this_turn)
    remaining = list(images)
    if rng.random() < 0.2:
        msgs.append(("system", "You are a careful visual assistant.", 0))
    for t in range(turns):
        k = len(remaining) if t == 0 else 0
        msgs.append(("user", _sentence(rng), k))
        msgs.append(("assistant", " ".join(_sentence(rng) for _ in range(rng.randint(1, 3))), 0))
        remaining = remaining[k:]
    if fmt == "llava":
        role = {"system": "system", "user": "human", "assistant": "gpt"}
        conv = [{"from": role[r], "value": "<image>\n" * k + text} for r, text, k in msgs]
        rec: Dict[str, Any] = {"id": rng.getrandbits(32), "conversations": conv}
        if len(images) == 1:
            rec["image"] = images[0]
        elif images:
            rec["image"] = list(images)
        return rec
    if fmt == "messages":
        rec = {"messages": [{"role": r, "content": "<image>" * k + text} for r, text, k in msgs]}
        if images:
            rec["images"] = list(images)
        return rec
    # HF content parts
    out = []
    it = iter(images)
    for r, text, k in msgs:
        parts = [{"type": "image", "image": next(it)} for _ in range(k)]
        parts.append({"type": "text", "text": text})
        out.append({"role": r, "content": parts})
    return {"messages": out}


_MANIFEST = ".manifest.json"


def make_dataset(
    root: str,
    n_samples: int = 256,
    seed: int = 0,
    formats: Sequence[str] = FORMATS,
    n_shards: int = 2,
    n_images: int = 0,
    min_size: int = 48,
    max_size: int = 640,
    text_only_fraction: float = 0.15,
    two_image_fraction: float = 0.2,
) -> Dict[str, Any]:
    """Writes the dataset under `root` and returns its description.

    Layout: ``root/data-00000.jsonl`` ... and ``root/images/img-00000.{jpg,png}``; image
    paths in records are relative to the shard folder (mmloader's default image_root).
    ``n_images`` distinct image files are shared by the records (default: n_samples // 2,
    at least 8).  Returns {"root", "shards", "images", "n_samples", "n_images"}.
    """
    for fm in formats:
        if fm not in FORMATS:
            raise ValueError(f"unknown record format {fm!r}; choose from {FORMATS}")
    if n_samples < 1 or n_shards < 1:
        raise ValueError("n_samples and n_shards must be >= 1")
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    n_images = n_images or max(8, n_samples // 2)
    names: List[str] = []
    for i in range(n_images):
        kind = _KINDS[i % len(_KINDS)]
        ext = "jpg" if kind.startswith("jpeg") else "png"
        w = rng.randint(min_size, max_size)
        h = max(min_size, min(max_size * 2, int(w * rng.choice([0.5, 0.75, 1.0, 1.33, 2.0]))))
        name = f"images/img-{i:05d}.{ext}"
        _make_image(rng, os.path.join(root, name), kind, w, h)
        names.append(name)
    shards = [os.path.join(root, f"data-{s:05d}.jsonl") for s in range(n_shards)]
    files = [open(p, "w", encoding="utf-8") for p in shards]
    try:
        for i in range(n_samples):
            r = rng.random()
            k = (
                0
                if r < text_only_fraction
                else (2 if r < text_only_fraction + two_image_fraction else 1)
            )
            imgs = [rng.choice(names) for _ in range(k)]
            fmt = formats[i % len(formats)]
            rec = _record(rng, fmt, imgs)
            files[i % n_shards].write(json.dumps(rec, ensure_ascii=False) + "\n")
    finally:
        for f in files:
            f.close()
    desc = {
        "root": root,
        "shards": shards,
        "images": [os.path.join(root, n) for n in names],
        "n_samples": n_samples,
        "n_images": n_images,
    }
    # hidden, so a folder given as data (every *.json inside) does not take it for a shard
    with open(os.path.join(root, _MANIFEST), "w", encoding="utf-8") as f:
        json.dump(
            {
                "n_samples": n_samples,
                "seed": seed,
                "n_images": n_images,
                "shards": [os.path.basename(s) for s in shards],
            },
            f,
        )
    return desc


def load_manifest(root: str) -> Dict[str, Any]:
    """The description of a dataset written by make_dataset (KeyError/OSError if absent)."""
    path = os.path.join(root, _MANIFEST)
    if not os.path.exists(path) and os.path.exists(os.path.join(root, "manifest.json")):
        path = os.path.join(root, "manifest.json")  # written by older versions
    with open(path, encoding="utf-8") as f:
        m = json.load(f)
    return {
        "root": root,
        "shards": [os.path.join(root, s) for s in m["shards"]],
        "n_samples": m["n_samples"],
        "n_images": m["n_images"],
    }


__all__ = ["make_dataset", "load_manifest", "FORMATS"]
