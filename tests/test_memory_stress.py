"""max_memory under random schedules of the real loader (issue 33): random caps from the
largest sample up, random thread counts, prefetch depths, windows and pixel formats (compact
float32, float32-decode),
a consumer that sleeps at random and sometimes keeps the previous batch while it asks
for the next, images (JPEG, PNG) and short videos, and samples whose images fail only
at decode (a good header, truncated data: a late failure rewinds the planner).

Every schedule must end: it delivers the whole epoch, bitwise the batches of the same
settings without a cap, with the pool never above the cap -- or it raises
OutOfMemoryError, and only where the cap is tight (a few of the largest batches).  A
schedule that hangs fails the test within its time limit: the schedules run in a child
process, which dumps every thread's stack and exits when one takes too long.

The default run is a few dozen schedules (seconds); MML_STRESS_SCHEDULES=2000 runs more
(the slow-marked test runs 600).  A failure prints the seed that reproduces it
(MML_STRESS_SEED).  MML_STRESS_SEED=1000 hung (a packed epoch, a consumer keeping its
previous batch, the next pack's video rows unable to fit beside the room held for the
head pack's expansion, which could only come after them, while the deadlock rule looked at
the head ticket, the open pack waiting for nothing): it is a fixed schedule below."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from child import child_env

import mmloader

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
MB = 1 << 20
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 96)
N = 18  # samples per epoch
LATE = {2, 9, 10, 16}  # samples whose last image is truncated: they fail at decode


def _jpeg(rng: np.random.Generator, w: int, h: int, fmt: str = "JPEG") -> bytes:
    from PIL import Image

    small = rng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(small).resize((w, h), Image.BICUBIC).save(out, fmt)
    return out.getvalue()


def _videos(root) -> list[str]:
    """Two short videos, or none where PyAV cannot write them (the schedules then run
    on images alone: the report says so)."""
    try:
        import av  # noqa: F401

        sys.path.insert(0, os.path.dirname(__file__))
        from test_video import make_video

        return [
            os.path.basename(make_video(str(root / "v0.mp4"), "libx264", n=24)),
            os.path.basename(make_video(str(root / "v1.mp4"), "libx264", n=36, w=96, h=64)),
        ]
    except (ImportError, pytest.skip.Exception):
        return []


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    root = tmp_path_factory.mktemp("memstress")
    rng = np.random.default_rng(11)
    sizes = [(64, 64), (320, 240), (120, 400), (480, 360), (90, 160)]
    imgs = []
    for k, (w, h) in enumerate(sizes):
        data = _jpeg(rng, w, h)
        (root / f"i{k}.jpg").write_bytes(data)
        imgs.append(f"i{k}.jpg")
    (root / "p.png").write_bytes(_jpeg(rng, 200, 150, "PNG"))
    imgs.append("p.png")
    vids = _videos(root)
    lines = []
    for i in range(N):
        rec: dict = {}
        if vids and i % 4 == 3:
            rec["videos"] = [{"video": vids[(i // 4) % len(vids)], "nframes": 2 + i % 3}]
            text = "<video>"
        else:
            refs = [imgs[(i + j) % len(imgs)] for j in range(1 + i % 3)]
            if i in LATE:
                data = (root / refs[-1]).read_bytes()
                (root / f"late{i}.jpg").write_bytes(data[: len(data) * 2 // 5])
                refs[-1] = f"late{i}.jpg"
            rec["images"] = refs
            text = "<image>" * len(refs)
        rec["messages"] = [
            {"role": "user", "content": text + f"\nsample {i}: " + "word " * (i % 6)},
            {"role": "assistant", "content": "answer " * (1 + i % 4)},
        ]
        lines.append(json.dumps(rec))
    path = root / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path), len(vids)


# The child: runs the schedules, one loader each, and prints one line per schedule.
CHILD = r"""
import faulthandler, json, random, sys, time, warnings, zlib
import numpy as np
import mmloader

shard, tok, small, n_sched, seed0, limit_s = sys.argv[1:7]
small, n_sched, seed0, limit_s = json.loads(small), int(n_sched), int(seed0), float(limit_s)
MB = 1 << 20
RESERVE = 16 * MB  # MML_SCRATCH_RESERVE, per worker
SHAPES = [
    dict(micro_batch_size=1, shuffle=False),
    dict(micro_batch_size=2, shuffle=True, seed=3),
    dict(micro_batch_size=3, shuffle=True, seed=5, pixel_format="uint8"),
    dict(micro_batch_size=1, packing=True, pack_length=768, shuffle=True, seed=7),
]
warnings.simplefilter("ignore")


def epoch(rng, cfg, delays=False, keep_prev=False):
    # digests of one epoch's batches (every tensor), consumed with random delays; the
    # previous batch kept alive while the next is asked for when keep_prev
    out, prev = [], None
    with mmloader.Loader(shard, tokenizer=tok, max_error_rate=1.0, **small, **cfg) as L:
        for b in L:
            arrs = sorted((k, v.numpy()) for k, v in b.items())
            out.append(tuple((k, str(a.dtype), a.shape, a.nbytes,
                              zlib.crc32(np.ascontiguousarray(a).data)) for k, a in arrs))
            del arrs
            if delays and rng.random() < 0.3:
                time.sleep(rng.random() * 0.004)
            prev = b if keep_prev else None
            del b
        del prev
        return out, L.stats()


refs, biggest = {}, {}
for i, shape in enumerate(SHAPES):
    got, st = epoch(None, dict(shape, num_threads=2))
    refs[i] = got
    # the largest batch's pixels, in the pool's pages
    big = 0
    for b in got:
        n = sum(nb for k, _, _, nb, _ in b if k.startswith("pixel_values"))
        big = max(big, -(-n // (2 * MB)) * 2 * MB)
    biggest[i] = big
    print(json.dumps({"ref": i, "batches": len(got), "largest_batch": big,
                      "skipped": st["skipped"]}), flush=True)

for k in range(n_sched):
    seed = seed0 + k
    rng = random.Random(seed)
    i = rng.randrange(len(SHAPES))
    threads = rng.choice([1, 2, 3])
    cfg = dict(SHAPES[i], num_threads=threads, prefetch=rng.choice([1, 2, 3, 4]),
               pixel_format="float32" if rng.random() < 0.7 else "float32-decode")
    if SHAPES[i].get("pixel_format") == "uint8":
        cfg["pixel_format"] = "uint8"
    if rng.random() < 0.5:
        cfg["window"] = rng.choice([2, 4, 8, 32])
    # beside the workers' reserve: from the least max_memory allows (8 MiB) or half the
    # largest batch up to ten largest batches
    big = biggest[i]
    room = max(8 * MB, int(big * (0.5 + 9.5 * rng.random() ** 2)))
    cap = threads * RESERVE + room + rng.randrange(4 * MB)
    cfg["max_memory"] = cap
    keep_prev = rng.random() < 0.3
    res = dict(seed=seed, shape=i, cap=cap, keep_prev=keep_prev, largest_batch=big,
               cfg={a: b for a, b in cfg.items() if a != "max_memory"})
    print(json.dumps({"start": res}), flush=True)
    faulthandler.dump_traceback_later(limit_s, exit=True)
    t0 = time.monotonic()
    try:
        got, st = epoch(rng, cfg, delays=True, keep_prev=keep_prev)
        res.update(ok=got == refs[i], n=len(got), pool_peak=st["pool_peak_bytes"])
    except mmloader.OutOfMemoryError as e:
        res.update(oom=str(e)[:300])
    faulthandler.cancel_dump_traceback_later()
    res["s"] = round(time.monotonic() - t0, 3)
    print(json.dumps(res), flush=True)
"""


def _stress(shard, n, seed0, limit_s=60.0):
    path, nvid = shard
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            path,
            TINY,
            json.dumps(SMALL),
            str(n),
            str(seed0),
            str(limit_s),
        ],
        capture_output=True,
        text=True,
        timeout=limit_s * 4 + 30 * n,
        env=child_env(),
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    runs = [r for r in lines if "seed" in r]
    started = [r["start"] for r in lines if "start" in r]
    assert proc.returncode == 0 and len(runs) == n, (
        f"schedule {started[-1] if started else seed0} (MML_STRESS_SEED=seed) did not end "
        f"(a hang: the stack below) or crashed, rc {proc.returncode}:\n{proc.stderr[-6000:]}"
    )
    refs = {r["ref"]: r for r in lines if "ref" in r}
    assert all(r["batches"] > 0 and r["skipped"] == len(LATE) for r in refs.values()), refs
    ooms = 0
    for r in runs:
        if "oom" in r:
            ooms += 1
            # an error only where the cap is tight.  Today's gates may hold, beside the
            # workers' reserve, the batches prefetched and the consumer's (two planes each:
            # a pack's buffers are its bound) when the pack the consumer waits for needs
            # more room; one ordered ledger (issue 33) would bring this down to the
            # consumer's batches, the next one and its expansion
            room = r["cap"] - r["cfg"]["num_threads"] * 16 * MB
            assert room < 2 * (r["cfg"]["prefetch"] + 2) * r["largest_batch"] + 8 * MB, r
            continue
        assert r["ok"], f"batches differ from the uncapped ones: {r}"
        assert r["pool_peak"] <= r["cap"], r
    print(f"{n} schedules ({nvid} videos in the data): {ooms} out of memory, the rest whole")
    return runs


def test_random_schedules_under_max_memory_never_hang(shard):
    n = int(os.environ.get("MML_STRESS_SCHEDULES", "24"))
    seed0 = int(os.environ.get("MML_STRESS_SEED", "2000"))
    _stress(shard, n, seed0)


def test_the_packed_schedule_that_hung_ends(shard):
    # MML_STRESS_SEED=1000 (a pack of video rows after an open image pack, the consumer
    # keeping its previous batch, prefetch 1): the next pack's buffers waited for the room
    # held for the head pack's expansion (its bound's float rows), which could only come
    # after them, and the deadlock rule looked at the head ticket only: next() waited
    # forever.  The cap holds the epoch: it is delivered (or, where the order decodes end in
    # leaves it a few KB short, OutOfMemoryError), bitwise the uncapped batches.
    _stress(shard, 1, 1000)


@pytest.mark.slow
def test_many_random_schedules_under_max_memory(shard):
    _stress(shard, 600, 50000)


# A hang the schedules found (loader_place.c needed_ticket), now a fixed schedule that
# must end: the whole epoch or OutOfMemoryError (which of the two depends on the
# order decodes finish in), never next_timeout_s's error.  A packed epoch whose next
# sample (a video) opens the ticket after a pack the collator still composes.
PACKED = dict(micro_batch_size=1, packing=True, pack_length=768, shuffle=True, seed=7)


def _ends(path, **kw):
    import warnings

    n, prev = 0, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(
            path, tokenizer=TINY, max_error_rate=1.0, next_timeout_s=20, **SMALL, **PACKED, **kw
        ) as L:
            try:
                for b in L:
                    n += 1
                    prev = b  # the consumer keeps the previous batch while it asks
                    del b
            except mmloader.OutOfMemoryError as e:
                assert "cannot hold" in str(e)
                return "oom"
            finally:
                del prev
    assert n > 0
    return "whole"


def test_a_pack_after_an_open_one_gets_its_buffer_when_the_window_is_full(shard):
    # window 2, the video plane's pack bound above a quarter of the cap (so its buffer is
    # sized when the pack is complete): the collator needs sample 6, the first of the next
    # pack, and the window is full; the planner gave buffers only to the head ticket's
    # open pack, so sample 6 was never decoded ('no batch for 20 s')
    path, nvid = shard
    if not nvid:
        pytest.skip("PyAV cannot write the test's videos: the schedule has no video plane")
    _ends(path, num_threads=1, prefetch=3, window=2, max_memory=56772948)
