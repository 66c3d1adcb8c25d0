"""Engine benchmarks: decoded images per second per core, mmloader against a PyTorch
DataLoader with the same number of workers whose Dataset does the same image work with PIL
(decode, convert RGB, smart_resize, bicubic resize, rescale + normalise to float32); and
the Python-side cost of Loader.__next__ per batch when batches are ready.

    python3 -m pytest benchmarks/bench_loader.py --benchmark-only -q -s

Environment: MML_BENCH_LOADER_SAMPLES (default 96), MML_BENCH_LOADER_WORKERS (default:
min(2, CPUs)).  Kept short: a few seconds per peer on a 2-core machine.
"""

from __future__ import annotations

import json
import math
import resource
import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import mmloader  # noqa: E402
from mmloader.datagen import make_dataset  # noqa: E402
from mmloader.presets import vision_config  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SAMPLES = int(os.environ.get("MML_BENCH_LOADER_SAMPLES", "96"))
try:
    CPUS = len(os.sched_getaffinity(0))
except AttributeError:  # pragma: no cover
    CPUS = os.cpu_count() or 1
WORKERS = int(os.environ.get("MML_BENCH_LOADER_WORKERS", str(min(2, CPUS))))
MAX_PIXELS = 640 * 640
RESULTS = {}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bench-loader"))
    return make_dataset(
        root,
        n_samples=SAMPLES,
        seed=0,
        n_images=max(8, SAMPLES // 2),
        min_size=160,
        max_size=800,
        text_only_fraction=0.0,
        two_image_fraction=0.0,
    )


def _smart_resize(h: int, w: int, factor: int, min_pixels: int, max_pixels: int):
    hb, wb = round(h / factor) * factor, round(w / factor) * factor
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hb, wb


class PILDataset:
    """What a typical PyTorch SFT Dataset does per record: parse JSON, open each image with
    PIL, resize as Qwen-VL does and normalise to float32 (no tokenisation: favours it)."""

    def __init__(self, shards):
        self.lines = []
        for s in shards:
            with open(s, encoding="utf-8") as f:
                self.lines += [(os.path.dirname(s), ln) for ln in f if ln.strip()]
        v = vision_config("qwen2.5-vl", max_pixels=MAX_PIXELS)
        self.factor = v["patch_size"] * v["merge_size"]
        self.min_pixels, self.max_pixels = v["min_pixels"], v["max_pixels"]
        self.mean = np.array(v["image_mean"], np.float32) * 255
        self.std = np.array(v["image_std"], np.float32) * 255

    def __len__(self):
        return len(self.lines)

    def _images(self, rec):
        if "image" in rec:
            return rec["image"] if isinstance(rec["image"], list) else [rec["image"]]
        if "images" in rec:
            return rec["images"]
        return [
            p.get("image")
            for m in rec["messages"]
            if isinstance(m["content"], list)
            for p in m["content"]
            if p.get("type") == "image"
        ]

    def __getitem__(self, i):
        from PIL import Image

        root, line = self.lines[i]
        rec = json.loads(line)
        out = []
        for name in self._images(rec):
            with Image.open(os.path.join(root, name)) as im:
                im = im.convert("RGB")
                h, w = _smart_resize(
                    im.height, im.width, self.factor, self.min_pixels, self.max_pixels
                )
                im = im.resize((w, h), Image.BICUBIC)
                out.append((np.asarray(im, np.float32) - self.mean) / self.std)
        return out


def _cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _mmloader_images_per_s(ds, threads):
    """(images per wall second, images per CPU second of the whole process, stats)."""
    with mmloader.Loader(
        ds["shards"],
        tokenizer=TINY,
        micro_batch_size=4,
        shuffle=False,
        num_threads=threads,
        prefetch=4,
        max_pixels=MAX_PIXELS,
    ) as L:
        c0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
        for _ in L:
            pass
        dt, cpu = time.perf_counter() - t0, _cpu(resource.RUSAGE_SELF) - c0
        st = L.stats()
    return st["images"] / dt, st["images"] / cpu, st


def _dataloader_images_per_s(ds, workers):
    import torch.utils.data as tud

    dset = PILDataset(ds["shards"])
    dl = tud.DataLoader(
        dset,
        batch_size=4,
        num_workers=workers,
        collate_fn=lambda b: b,
        prefetch_factor=4 if workers else None,
        persistent_workers=False,
    )
    n = 0
    c0 = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    for batch in dl:
        n += sum(len(x) for x in batch)
    dt = time.perf_counter() - t0
    del dl  # workers exit and are reaped: their CPU time lands in RUSAGE_CHILDREN
    cpu = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN) - c0
    return n / dt, n / cpu


def test_images_per_core_vs_dataloader(benchmark, ds):
    def run():
        mml, mml_cpu, st = _mmloader_images_per_s(ds, WORKERS)
        tdl, tdl_cpu = _dataloader_images_per_s(ds, WORKERS)
        return mml, mml_cpu, tdl, tdl_cpu, st

    mml, mml_cpu, tdl, tdl_cpu, st = benchmark.pedantic(run, rounds=1, iterations=1)
    RESULTS["images_per_core"] = (mml / WORKERS, tdl / WORKERS)
    print(
        f"\n[bench_loader] decoded images/s per core ({WORKERS} worker(s), "
        f"{SAMPLES} samples): mmloader {mml / WORKERS:.1f}, PyTorch DataLoader+PIL "
        f"{tdl / WORKERS:.1f} -> ratio {mml / tdl:.2f}x; per CPU-second (all threads and "
        f"processes): mmloader {mml_cpu:.1f}, DataLoader {tdl_cpu:.1f} -> ratio "
        f"{mml_cpu / tdl_cpu:.2f}x; mmloader wait-time ratio "
        f"{st['wait_time_ratio']:.2f}, busy s: read {st['read_s']:.2f} vision "
        f"{st['vision_s']:.2f} tokenize {st['tokenize_s']:.2f} collate {st['collate_s']:.2f}"
    )
    assert mml > 0 and tdl > 0


def test_next_cost_per_batch(benchmark, ds):
    """Python-side cost of __next__ with batches already queued (no waiting)."""
    n = 32
    with mmloader.Loader(
        ds["shards"],
        tokenizer=TINY,
        micro_batch_size=1,
        shuffle=False,
        num_threads=WORKERS,
        prefetch=n,
        cycle=True,
        max_pixels=28 * 28 * 16,
    ) as L:
        next(L)
        costs = []

        def fill_then_time():
            deadline = time.monotonic() + 30
            while L.stats()["queue_depth"] < n and time.monotonic() < deadline:
                time.sleep(0.01)
            t0 = time.perf_counter()
            for _ in range(n):
                next(L)
            costs.append((time.perf_counter() - t0) / n)

        benchmark.pedantic(fill_then_time, rounds=3, iterations=1)
    best = min(costs)
    RESULTS["next_us"] = best * 1e6
    print(
        f"\n[bench_loader] Loader.__next__ Python-side cost: {best * 1e6:.1f} us per batch "
        f"(batch dict of ~6 tensors, queue full)"
    )
    assert best > 0
