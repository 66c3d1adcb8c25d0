"""The benchmark's dataset: a realistic multimodal SFT mix, generated once per (n, seed) and
cached under the temp folder.

Records come from mmloader.datagen.make_dataset (LLaVA, messages and HF content-part
formats, one to three turns, 0-2 images each, one shard, image paths relative to it); each
image reference then gets its own new file at a realistic size and content: photo-like JPEGs
(smooth content plus sensor noise, quality 85-95), one in ten of all images a progressive
JPEG, and one in five a screenshot-like PNG (flat panels and text-like strokes; RGB, RGBA
or palette), from thumbnails to 1080p in portrait and landscape.

With photos=True (the end-to-end suite's set) three in ten references are instead real
photographs (tests/photos.py: the scikit-image and matplotlib sample photos, colour and
grey) re-encoded at 0.3 to 12 megapixels (PHOTO_MP), mostly JPEG (some progressive), some
PNG up to 2 MP.  photos=False keeps the original generator byte for byte
(tests/test_batch_digest.py depends on it).

With photo_mp=(3, 4, 6, 8, 10, 12) (RECIPE_MP, the recipe-cap set of issue 34 and
bench_recipe_caps.py) every reference is instead one of those photos re-encoded as a JPEG
at one of these sizes, drawn uniformly (quality 85-95, about one in seven progressive):
the decode-bound recipe-cap dataset of bench_e2e.py's MML_BENCH_PHOTO_MP.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Dict, Optional, Sequence

import numpy as np

from .common import parse_record

SIZES = [
    ((320, 240), 0.10),
    ((640, 480), 0.25),
    ((800, 600), 0.15),
    ((1024, 768), 0.20),
    ((1280, 720), 0.15),
    ((1920, 1080), 0.10),
    ((768, 1024), 0.05),
]
PHOTO_MP = [
    (0.3, 0.30),
    (0.5, 0.20),
    (1.0, 0.20),
    (2.0, 0.13),
    (4.0, 0.10),
    (8.0, 0.05),
    (12.0, 0.02),
]
RECIPE_MP = (3.0, 4.0, 6.0, 8.0, 10.0, 12.0)  # bench_recipe_caps.py's MPS
PHOTO_EVERY = (0, 4, 7)  # reference k is a real photo when k % 10 is one of these


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
        img[y : y + 2, x : x + n][:, mask] = 20
    return img


def _kind(i: int) -> str:
    """Image i's kind: 10% progressive JPEG, 20% PNG, the rest baseline JPEG."""
    k = i % 10
    return {3: "jpeg_progressive", 1: "png", 6: "png_rgba" if i % 20 == 6 else "png_palette"}.get(
        k, "jpeg"
    )


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
            path, "JPEG", quality=int(rng.integers(85, 96)), progressive=kind == "jpeg_progressive"
        )
    else:
        img = Image.fromarray(_screen(rng, w, h))
        if kind == "png_rgba":
            img.putalpha(255)
        elif kind == "png_palette":
            img = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=128)
        img.save(path, "PNG")
    return name


_PHOTO_CACHE: Dict[str, object] = {}


def _sources() -> Dict[str, object]:
    """name -> PIL image of each sample photo tests/photos.py names (loaded once)."""
    if not _PHOTO_CACHE:
        import importlib.util
        from PIL import Image

        path = os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "tests",
            "photos.py",
        )
        spec = importlib.util.spec_from_file_location("mml_test_photos", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        for name, (pkg, fname) in sorted(mod._PHOTOS.items()):
            im = Image.open(mod.data_file(pkg, fname))
            im.load()
            _PHOTO_CACHE[name] = im.convert("L" if im.mode in ("L", "I;16", "1") else "RGB")
    return _PHOTO_CACHE


def _write_photo(
    rng: np.random.Generator,
    root: str,
    k: int,
    max_mp: float,
    photo_mp: Optional[Sequence[float]] = None,
) -> str:
    """Reference k as a real photo re-encoded at a drawn size (0.3-12 MP, capped at
    max_mp; with photo_mp, one of those sizes drawn uniformly, always JPEG); returns its
    name relative to root."""
    from PIL import Image

    srcs = _sources()
    src = srcs[sorted(srcs)[int(rng.integers(len(srcs)))]]
    if photo_mp:
        mp = float(photo_mp[int(rng.integers(len(photo_mp)))])
    else:
        mp = min(max_mp, PHOTO_MP[int(rng.choice(len(PHOTO_MP), p=[p for _, p in PHOTO_MP]))][0])
    w0, h0 = src.size  # type: ignore[attr-defined]
    f = (mp * 1e6 / (w0 * h0)) ** 0.5
    w, h = max(16, int(round(w0 * f))), max(16, int(round(h0 * f)))
    im = src.resize((w, h), Image.BICUBIC)  # type: ignore[attr-defined]
    png = not photo_mp and mp <= 2.0 and rng.random() < 0.15
    name = f"images/photo-{k:06d}" + (".png" if png else ".jpg")
    if png:
        im.save(os.path.join(root, name), "PNG")
    else:
        im.save(
            os.path.join(root, name),
            "JPEG",
            quality=int(rng.integers(85, 96)),
            progressive=bool(rng.random() < 0.15),
        )
    return name


def make(
    root: str,
    n_samples: int,
    seed: int = 0,
    photos: bool = False,
    max_mp: float = 12.0,
    photo_mp: Optional[Sequence[float]] = None,
) -> str:
    """Writes the dataset under root (if not already complete); returns the shard path.

    datagen's records share its images; here every image reference, in record order, gets
    its own new file, so the mix above holds for the references themselves (with photo_mp:
    every reference a real photo at one of those sizes)."""
    from mmloader.datagen import make_dataset

    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        with open(marker) as f:
            return os.path.join(root, f.read().strip())
    desc = make_dataset(
        root, n_samples=n_samples, seed=seed, n_shards=1, n_images=8, min_size=16, max_size=32
    )
    shard = desc["shards"][0]
    old = {json.dumps(os.path.relpath(p, root)) for p in desc["images"]}
    pattern = re.compile("|".join(re.escape(o) for o in sorted(old)))
    rng = np.random.default_rng(seed)
    photo_rng = np.random.default_rng([seed, 1])  # its own stream: rng stays as before
    count = [0]

    def fresh(m: "re.Match[str]") -> str:
        k = count[0]
        count[0] += 1
        if photo_mp:
            return json.dumps(_write_photo(photo_rng, root, k, max_mp, photo_mp))
        if photos and k % 10 in PHOTO_EVERY:
            return json.dumps(_write_photo(photo_rng, root, k, max_mp))
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


def cached(
    n_samples: int,
    seed: int = 0,
    base: Optional[str] = None,
    photos: bool = False,
    max_mp: float = 12.0,
    photo_mp: Optional[Sequence[float]] = None,
) -> str:
    """The shard of the cached dataset (generated on first use)."""
    base = (
        base
        or os.environ.get("MML_BENCH_DATA")
        or os.path.join(tempfile.gettempdir(), "mmloader-bench")
    )
    name = (
        f"mix3-{n_samples}-{seed}" if not photos else f"mix4-photos-{n_samples}-{seed}-{max_mp:g}mp"
    )
    if photo_mp:
        name = f"photos-only-{n_samples}-{seed}-" + "-".join(f"{m:g}" for m in photo_mp) + "mp"
    return make(
        os.path.join(base, name), n_samples, seed, photos=photos, max_mp=max_mp, photo_mp=photo_mp
    )


def repeated(shard: str, times: int, seed: int = 0) -> str:
    """A shard holding `shard`'s records `times` times over (the same image files), each
    pass in its own seeded order, written beside it: long runs without a second copy of
    the images, and any prefix of the records is a fair sample of the whole mix."""
    path = shard[: -len(".jsonl")] + f".x{times}s{seed}.jsonl"
    if not os.path.exists(path):
        with open(shard, encoding="utf-8") as f:
            lines = [ln if ln.endswith("\n") else ln + "\n" for ln in f if ln.strip()]
        rng = np.random.default_rng([seed, 2])
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for _ in range(times):
                f.writelines(lines[i] for i in rng.permutation(len(lines)))
        os.replace(path + ".tmp", path)
    return path


def subset(shard: str, k: int) -> str:
    """A shard of the first k records of `shard`, written beside it (same image folder)."""
    path = shard[: -len(".jsonl")] + f".first{k}.jsonl"
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
    """What the dataset holds: records, turns, images by kind, source and size, bytes."""
    from PIL import Image

    recs = turns = photos = 0
    kinds: Dict[str, int] = {}
    mp_buckets: Dict[str, int] = {}
    nbytes = 0
    pixels = []
    with open(shard, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            recs += 1
            messages, refs = parse_record(shard, line)
            turns += sum(1 for m in messages if m["role"] == "assistant")
            for path in refs:
                nbytes += os.path.getsize(path)
                photos += os.path.basename(path).startswith("photo-")
                with Image.open(path) as im:
                    kind = im.format + ("-progressive" if im.info.get("progressive") else "")
                    kind += "-" + im.mode if im.format == "PNG" or im.mode == "L" else ""
                    pixels.append(im.width * im.height)
                kinds[kind] = kinds.get(kind, 0) + 1
                mp = pixels[-1] / 1e6
                b = next(
                    lab
                    for lim, lab in (
                        (0.5, "<0.5"),
                        (1.0, "0.5-1"),
                        (2.1, "1-2"),
                        (4.1, "2-4"),
                        (8.1, "4-8"),
                        (1e9, ">8"),
                    )
                    if mp < lim
                )
                mp_buckets[b] = mp_buckets.get(b, 0) + 1
    n_img = sum(kinds.values())
    return {
        "records": recs,
        "turns_per_record": round(turns / max(recs, 1), 2),
        "images": n_img,
        "photos": photos,
        "image_kinds": kinds,
        "megapixels": mp_buckets,
        "mean_mp": round(sum(pixels) / max(len(pixels), 1) / 1e6, 2),
        "max_mp": round(max(pixels, default=0) / 1e6, 1),
        "image_mb": round(nbytes / 2**20, 1),
    }
