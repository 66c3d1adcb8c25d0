"""Plan before decode (csrc/core/loader/loader_place.c): batches are composed from image headers
before any pixel work, and each image is decoded straight into its slice of its batch's
pixel_values.  A sample whose image fails only at decode (a valid header, corrupt data
after it) is discovered after its batch was planned; it must still give exactly the
batches of the same data where that sample fails before any pixel work (a missing file):
same composition, order and pixels, whatever the thread count."""

from __future__ import annotations

import io
import json
import os
import warnings

import numpy as np
import pytest

import mmloader
from conftest import same

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
N = 40
# positions of the failing samples: first of the stream, runs, ends of batches/packs
BAD = {0, 5, 6, 11, 17, 18, 19, 26, 33, 39}


def _jpeg(rng: np.random.Generator, w: int, h: int) -> bytes:
    from PIL import Image

    small = rng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two copies of one dataset: BAD samples' last image is truncated (late: fails at
    decode) in one and missing (early: fails before any pixel work) in the other."""
    root = tmp_path_factory.mktemp("plan_decode")
    rng = np.random.default_rng(7)
    sizes = [(64, 64), (300, 200), (120, 400), (500, 375), (90, 160), (256, 256)]
    imgs = []
    for k, (w, h) in enumerate(sizes):
        data = _jpeg(rng, w, h)
        (root / f"ok{k}.jpg").write_bytes(data)
        imgs.append(data)
    out = {}
    for kind in ("late", "early"):
        lines = []
        for i in range(N):
            n_img = i % 3  # 0, 1 or 2 images
            refs = [f"ok{(i + j) % len(sizes)}.jpg" for j in range(n_img)]
            if i in BAD:
                if not refs:
                    refs = ["ok0.jpg"]
                bad = f"{kind}{i}.jpg"
                if kind == "late":
                    data = imgs[i % len(imgs)]
                    (root / bad).write_bytes(data[: len(data) * 2 // 5])
                refs[-1] = bad
            text = "".join("<image>" for _ in refs) + f"\nsample {i}: " + "word " * (i % 7)
            rec = {
                "messages": [
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": "answer " * (1 + i % 5)},
                ]
            }
            if refs:
                rec["images"] = refs
            lines.append(json.dumps(rec))
        path = root / f"{kind}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        out[kind] = str(path)
    return out


CONFIGS = {
    "padded": dict(micro_batch_size=3, shuffle=True, seed=1),
    "padded-1": dict(micro_batch_size=1, shuffle=False),
    "packed": dict(
        micro_batch_size=1, packing=True, pack_length=1024, pad_to_multiple=8, shuffle=True, seed=2
    ),
    "packed-mrope": dict(
        micro_batch_size=1,
        packing=True,
        pack_length=512,
        mrope=True,
        keys="megatron",
        shift_labels=True,
        shuffle=False,
    ),
}


def _epoch(path, threads, **cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(
            path,
            tokenizer=TINY,
            num_threads=threads,
            prefetch=2,
            max_error_rate=1.0,
            **SMALL,
            **cfg,
        ) as L:
            batches = [{k: np.array(v.numpy()) for k, v in b.items()} for b in L]
            return batches, L.stats()


def test_bad_samples_fail_only_at_decode(shards):
    """The late copy's bad images have good headers: planning alone passes them."""
    _, st = _epoch(shards["late"], 2, micro_batch_size=2, plan_only=True)
    assert st["skipped"] == 0
    _, st = _epoch(shards["late"], 2, micro_batch_size=2)
    assert st["skipped_by_reason"] == {"corrupt_image": len(BAD)}
    _, st = _epoch(shards["early"], 2, micro_batch_size=2)
    assert st["skipped_by_reason"] == {"missing_file": len(BAD)}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_late_failure_gives_the_batches_of_an_early_one(shards, name, threads):
    late, st_late = _epoch(shards["late"], threads, **CONFIGS[name])
    early, st_early = _epoch(shards["early"], threads, **CONFIGS[name])
    assert len(late) == len(early) > 0
    same(late, early)
    assert st_late["skipped"] == st_early["skipped"]
    assert st_early["pixel_rows_moved"] == 0  # nothing fails late: nothing is ever copied
    if name.startswith("packed"):
        # a pack that held a late failure was planned again: its rows taken so far moved
        assert st_late["pixel_rows_moved"] > 0


def test_page_fault_stats(shards):
    """In a fresh process (the memory a pool maps stays mapped: after earlier loaders in
    this one, a small epoch may legitimately map nothing new), the engine's threads count
    the faults of the memory they map."""
    import subprocess
    import sys

    code = (
        "import json, sys, test_plan_decode as t\n"
        "b, st = t._epoch(sys.argv[1], 2, micro_batch_size=1, shuffle=False)\n"
        "print(json.dumps([len(b), st['page_faults'], st['page_faults_per_batch']]))\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    path = [here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    out = subprocess.run(
        [sys.executable, "-c", code, str(shards["early"])],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    n, faults, per_batch = json.loads(out.stdout.strip().splitlines()[-1])
    assert n == N  # a padded epoch fills its batches after skips
    assert faults > 0  # the engine's threads did map memory
    # counted per batch only after the pool has filled
    assert per_batch is None or per_batch >= 0


def _at_rest(loaders, prefetch, deadline_s=120.0):
    """Polls the loaders' stats until every queue holds `prefetch` batches and their sample
    counts agree and stay put between two polls (the collator cannot run further ahead),
    or the deadline passes: returns the last stats of each."""
    import time

    end, last = time.monotonic() + deadline_s, None
    while True:
        now = [L.stats() for L in loaders]
        key = [(s["queue_depth"], s["samples"], s["good_samples"]) for s in now]
        rest = all(k[0] == prefetch for k in key) and len({k[1:] for k in key}) == 1
        if (rest and key == last) or time.monotonic() > end:
            return now
        last = key
        time.sleep(0.05)


@pytest.mark.parametrize("name", ["padded", "packed"])
def test_samples_stat_counts_each_collated_sample_once(shards, name):
    """stats()["samples"] / ["good_samples"] count the samples the collator took, once
    each: a late failure's rewind (its batch planned again) counts nothing twice, so at
    rest both copies show the same figures.  They run ahead of the consumer: after an
    epoch they include the next epoch's batches already queued (prefetch) and the one
    being composed (this is why 24 records read over HTTP showed 28 or 32), while
    "batches" counts the batches delivered and "skipped" the failures the consumer
    passed."""
    # pixel_format="float32-decode" (float rows written by the workers): "at rest" is a
    # full output queue of `prefetch` batches, and with "float32" the queue holds one
    # expanded batch (the rest of prefetch waits as uint8 rows)
    cfg = dict(
        CONFIGS[name],
        tokenizer=TINY,
        num_threads=2,
        prefetch=2,
        max_error_rate=1.0,
        pixel_format="float32-decode",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with (
            mmloader.Loader(shards["late"], **SMALL, **cfg) as late,
            mmloader.Loader(shards["early"], **SMALL, **cfg) as early,
        ):
            n_late, n_early = sum(1 for _ in late), sum(1 for _ in early)
            st_late, st_early = _at_rest([late, early], 2)
    assert n_late == n_early == st_late["batches"] == st_early["batches"] > 0
    assert st_late["skipped"] == st_early["skipped"] == len(BAD)
    for k in ("samples", "good_samples", "queue_depth"):
        assert st_late[k] == st_early[k], (k, st_late, st_early)
    # the 40 records, the next epoch's first failures and its queued batches' samples
    assert st_late["samples"] > N and st_late["good_samples"] > N - len(BAD)
    if name == "padded":  # fixed batches: delivered + queued + at most the one composed
        mbs, made = cfg["micro_batch_size"], st_late["batches"] + st_late["queue_depth"]
        assert mbs * made <= st_late["good_samples"] <= mbs * (made + 1)
