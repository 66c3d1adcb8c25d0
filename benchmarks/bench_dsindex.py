"""The dataset index: build throughput at 10^6 samples with local images, and the Loader's
time to first batch at 10^4 vs 10^6 samples with and without the index, in the same run.

    python3 -m pytest benchmarks/bench_dsindex.py --benchmark-only -q -s

Data: MML_BENCH_IDX_SAMPLES JSONL records (default 1,000,000) in shards of 10,000, each
naming one or two of MML_BENCH_IDX_IMAGES image files (default 1,000: real photos from
scikit-image re-encoded as JPEG/PNG/WebP at 0.1-4 MP and 2% at 12 MP, a fifth of the
JPEGs with an EXIF orientation) and a
few sentences of text; the real Qwen tokenizer when ../shared has it, else the tiny one.

What is measured:
  - build: ``mmloader.dsindex.build`` (python -m mmloader index) over all shards with the
    machine's CPUs: samples/s and bytes read per sample (record + image headers); its
    peer in the same run is what a loader must otherwise do per sample before it knows a
    length: the planning pass ``Loader(plan_only=True)`` (record read + parse, the whole
    image file read, header probe, template + tokenizer; no decode), over the first
    MML_BENCH_IDX_PEER samples (default 50,000), as samples/s and bytes per sample.
  - global plan start: ``Loader(max_tokens_per_batch=16384)`` construction, which needs
    every sample's tokens: from the index vs a planning pass (index=False), over 1 shard
    and the first MML_BENCH_IDX_PEER samples.
  - first batch: ``Loader(...)`` construction, and construction + ``next()`` (8 samples
    decoded), medians of MML_BENCH_IDX_ROUNDS (default 3), for 1 shard
    (10^4 samples) and all shards (10^6), index used vs ``index=False`` (the scan of
    every shard at start).  Everything runs with max_pixels=200704.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
import warnings

import pytest

pytestmark = pytest.mark.timeout(3600)  # minutes at 10^6 samples on a loaded machine

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import mmloader  # noqa: E402
from mmloader import dsindex  # noqa: E402

SAMPLES = int(os.environ.get("MML_BENCH_IDX_SAMPLES", "1000000"))
IMAGES = int(os.environ.get("MML_BENCH_IDX_IMAGES", "1000"))
PEER = int(os.environ.get("MML_BENCH_IDX_PEER", "50000"))
ROUNDS = int(os.environ.get("MML_BENCH_IDX_ROUNDS", "3"))
PER_SHARD = 10_000
VISION = dict(max_pixels=200704)  # the settings the index is built for and the Loader uses
QWEN = os.path.join(
    os.path.dirname(os.path.dirname(HERE)), "shared", "data", "qwen3-tokenizer", "tokenizer.json"
)
TOKENIZER = (
    QWEN
    if os.path.exists(QWEN)
    else os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
)
WORDS = (
    "the a photo of cat dog street city river mountain shows what is in this image "
    "describe colour left right small large two three near far"
).split()


def _images(root: str) -> list:
    PIL = pytest.importorskip("PIL.Image")
    skd = pytest.importorskip("skimage.data")
    photos = [skd.astronaut(), skd.coffee(), skd.chelsea(), skd.rocket()]
    rng = random.Random(0)
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    names = []
    for i in range(IMAGES):
        mp = 12 if i % 50 == 0 else rng.choice([0.1, 0.3, 1, 2, 4])
        a = rng.uniform(0.5, 2.0)
        w = max(32, int((mp * 1e6 * a) ** 0.5))
        h = max(32, int(mp * 1e6 / w))
        im = PIL.fromarray(rng.choice(photos)).resize((min(w, 2048), min(h, 2048)))
        im = im.resize((w, h)) if (w, h) != im.size else im
        fmt = rng.choice(["JPEG", "JPEG", "PNG", "WEBP"])
        name = f"images/im{i:05d}.{fmt.lower().replace('jpeg', 'jpg')}"
        kw = {"quality": 85} if fmt != "PNG" else {"compress_level": 1}
        if fmt == "JPEG" and i % 5 == 0:
            ex = PIL.Exif()
            ex[0x0112] = 6  # EXIF orientation
            kw["exif"] = ex.tobytes()
        im.save(os.path.join(root, name), fmt, **kw)
        names.append(name)
    return names


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bench-idx"))
    names = _images(root)
    rng = random.Random(1)
    shards = []
    for s in range(0, SAMPLES, PER_SHARD):
        p = os.path.join(root, f"data-{s // PER_SHARD:05d}.jsonl")
        with open(p, "w") as f:
            for i in range(s, min(SAMPLES, s + PER_SHARD)):
                k = 2 if i % 5 == 0 else 1
                q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
                a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 120)))
                f.write(
                    json.dumps(
                        {
                            "messages": [
                                {"role": "user", "content": "<image>" * k + q},
                                {"role": "assistant", "content": a},
                            ],
                            "images": [rng.choice(names) for _ in range(k)],
                        }
                    )
                    + "\n"
                )
        shards.append(p)
    return root, shards


def test_build_throughput(benchmark, data):
    root, shards = data
    s = benchmark.pedantic(
        lambda: dsindex.build(shards, tokenizer=TOKENIZER, **VISION), rounds=1, iterations=1
    )
    built = s["samples"] - s["resumed"]
    assert built == SAMPLES and s["good"] == SAMPLES, s["bad"]
    rate, per = built / s["seconds"], s["bytes_read"] / built
    # the peer: the planning pass a loader runs without an index, on the first shards
    peer = shards[: max(1, PEER // PER_SHARD)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        L = mmloader.Loader(
            peer,
            tokenizer=TOKENIZER,
            plan_only=True,
            index=False,
            **VISION,
            micro_batch_size=64,
            shuffle=False,
        )
    t0 = time.perf_counter()
    for _ in L:
        pass
    dt = time.perf_counter() - t0
    st = L.stats()
    L.close()
    prate, pper = st["samples"] / dt, st["bytes_read"] / st["samples"]
    print(
        f"\nindex build: {built:,} samples, {s['images']:,} images in {s['seconds']:.1f} s "
        f"with {os.cpu_count()} CPUs: {rate:,.0f} samples/s, {per:,.0f} bytes read per sample "
        f"(index files {sum(os.path.getsize(dsindex.sidecar_path(p)) for p in shards) / built:.1f} "
        f"bytes per sample)"
    )
    print(
        f"peer (Loader plan_only pass, {st['samples']:,} samples): {prate:,.0f} samples/s, "
        f"{pper:,.0f} bytes read per sample; index build / planning pass: "
        f"{rate / prate:.2f}x the rate, {per / pper:.3f}x the bytes"
    )


def _first_batch(shards, **kw):
    start, first = [], []
    for _ in range(ROUNDS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            L = mmloader.Loader(
                shards, tokenizer=TOKENIZER, **dict(dict(micro_batch_size=8), **VISION, **kw)
            )
            t1 = time.perf_counter()
            next(iter(L))
            start.append(t1 - t0)
            first.append(time.perf_counter() - t0)
            used = L.index_shards
            L.close()
    return statistics.median(start), statistics.median(first), used


def test_time_to_first_batch(benchmark, data):
    root, shards = data
    dsindex.build(shards, tokenizer=TOKENIZER, **VISION)  # up to date after test_build_throughput

    def run():
        return {
            (n, ix): _first_batch(shards[:n], **({} if ix else {"index": False}))
            for n in (1, len(shards))
            for ix in (True, False)
        }

    r = benchmark.pedantic(run, rounds=1, iterations=1)
    for n in (1, len(shards)):
        (s, t, used), (s0, t0, _) = r[(n, True)], r[(n, False)]
        assert used == n
        print(
            f"\n{n * PER_SHARD:>9,} samples: with the index: Loader() {1000 * s:6.0f} ms, first "
            f"batch {1000 * t:6.0f} ms; index=False (scan): Loader() {1000 * s0:6.0f} ms, "
            f"first batch {1000 * t0:6.0f} ms (medians of {ROUNDS})"
        )
    big, small = r[(len(shards), True)], r[(1, True)]
    big0, small0 = r[(len(shards), False)], r[(1, False)]
    print(
        f"{len(shards)}x the data: with the index {big[1] / small[1]:.2f}x the time to first "
        f"batch (Loader() {big[0] / small[0]:.1f}x); scanning {big0[1] / small0[1]:.2f}x "
        f"(Loader() {big0[0] / small0[0]:.1f}x)"
    )


def test_global_plan_start(benchmark, data):
    """The global plan (max_tokens_per_batch=...) needs every sample's tokens before the
    first batch: from the index, or from a planning pass over the data (index=False)."""
    root, shards = data
    dsindex.build(shards, tokenizer=TOKENIZER, **VISION)
    sizes = sorted({1, max(1, PEER // PER_SHARD)})

    def run():
        return {
            (n, ix): _first_batch(
                shards[:n],
                max_tokens_per_batch=16384,
                micro_batch_size=None,
                **({} if ix else {"index": False}),
            )
            for n in sizes
            for ix in (True, False)
        }

    r = benchmark.pedantic(run, rounds=1, iterations=1)
    for n in sizes:
        (s, t, _), (s0, t0, _) = r[(n, True)], r[(n, False)]
        print(
            f"\nglobal plan, {n * PER_SHARD:>9,} samples: Loader() {1000 * s:7.0f} ms with the "
            f"index, {1000 * s0:7.0f} ms with the planning pass (index=False): "
            f"{s0 / s:.1f}x; first batch {1000 * t:.0f} vs {1000 * t0:.0f} ms"
        )
