"""The dataset index and the stream agree on which samples are usable: a global plan made
from an index equals the planning pass's plan (len(), batches, skip counts, exact and
elastic resume) also for samples only a whole read or the settings checks reject — a
record with no trainable turn, a progressive JPEG whose scans above max_jpeg_scans lie
beyond the header bytes the builder reads, a local image above max_object_bytes."""

import hashlib
import json
import os
import warnings

import numpy as np
import pytest

import mmloader
from mmloader import dsindex
from mmloader._dpstate import restore_state_global
from conftest import as_np

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
VISION = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
LIMITS = dict(max_jpeg_scans=4, max_object_bytes=150_000)
PLAN = dict(max_tokens_per_batch=400, balance="tokens", micro_batch_size=None)


@pytest.fixture(scope="module")
def hard(tmp_path_factory):
    return make_shard(tmp_path_factory.mktemp("agree"))


def make_shard(root):
    """A shard of 40 samples: usable ones, and 4 each of the three cases the header-only
    build used to miss."""
    from PIL import Image

    rng = np.random.default_rng(7)
    small = root / "small.png"
    Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(small)
    prog = root / "prog.jpg"  # ~10 scans, all but the first beyond 16 KiB
    Image.fromarray(rng.integers(0, 255, (320, 320, 3), dtype=np.uint8)).save(
        prog, progressive=True, quality=95
    )
    big = root / "big.png"  # a valid image above max_object_bytes
    Image.fromarray(rng.integers(0, 255, (300, 300, 3), dtype=np.uint8)).save(big)
    assert prog.stat().st_size > 60_000 and big.stat().st_size > LIMITS["max_object_bytes"]
    assert prog.stat().st_size < LIMITS["max_object_bytes"]
    lines = []
    for i in range(40):
        kind = i % 10
        if kind == 3:  # no assistant turn: nothing to train on
            rec = {"messages": [{"role": "user", "content": f"question {i} with no reply"}]}
        else:
            img = {5: prog, 7: big}.get(kind, small)
            rec = {
                "messages": [
                    {"role": "user", "content": "<image>" + "describe " * (i % 4 + 1)},
                    {"role": "assistant", "content": f"answer {i} " + "words " * (i % 7)},
                ],
                "images": [str(img)],
            }
        lines.append(json.dumps(rec))
    shard = root / "hard.jsonl"
    shard.write_text("\n".join(lines) + "\n")
    return str(shard)


def make(data, **kw):
    args = dict(tokenizer=TINY, num_threads=2, prefetch=2, seed=3, max_error_rate=1.0)
    args.update(VISION, **LIMITS, **PLAN)
    args.update(kw)
    return mmloader.Loader(data, **args)


def digests(L, n=None):
    out = []
    for k, b in enumerate(L):
        if n is not None and k == n:
            break
        h = hashlib.sha256()
        for key, v in sorted(as_np(b).items()):
            h.update(key.encode() + str(v.dtype).encode() + str(v.shape).encode() + v.tobytes())
        out.append(h.hexdigest())
    return out


PLAN_KEYS = ("usable", "unusable", "steps", "end", "q0", "rank_samples")


def plan(L):
    info = L._core().plan_info(0)
    return {k: info[k] for k in PLAN_KEYS if k in info}, (info["indexed"], info["measured"])


def run(data, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with make(data, **kw) as L:
            n = len(L)
            info, how = plan(L)
            d = digests(L)
            st = L.stats()
    return n, d, st, sorted(str(x.message) for x in w), info, how


def test_index_plan_equals_planning_pass(hard):
    dsindex.build([hard], tokenizer=TINY, threads=2, **VISION, **LIMITS)
    n_idx, d_idx, st_idx, w_idx, p_idx, how_idx = run([hard])
    n_pass, d_pass, st_pass, w_pass, p_pass, how_pass = run([hard], index=False)
    assert how_idx == (40, 0) and how_pass == (0, 40)  # counts: the index / the pass
    bad = st_pass["skipped_by_reason"]
    assert bad == {"no_trainable_turn": 4, "too_many_scans": 4, "object_too_large": 4}
    assert st_idx["skipped_by_reason"] == bad
    assert p_idx == p_pass and p_idx["unusable"] == 12
    assert n_idx == n_pass == len(d_pass) == p_pass["steps"]
    assert d_idx == d_pass
    assert w_idx == w_pass  # the same warnings, naming the same samples and reasons


def test_index_records_the_statuses(hard):
    dsindex.build([hard], tokenizer=TINY, threads=2, **VISION, **LIMITS)
    x = dsindex.read(hard + ".mmlidx")
    bad = [i for i, s in enumerate(x["status"]) if s]
    assert bad == [i for i in range(40) if i % 10 in (3, 5, 7)]


def test_resume_exact_and_elastic_from_the_index(hard):
    dsindex.build([hard], tokenizer=TINY, threads=2, **VISION, **LIMITS)
    with make([hard], index=False) as L:
        want = digests(L)
    with make([hard]) as L:  # interrupted after 2 batches, resumed from its state
        it = iter(L)
        first = [next(it) for _ in range(2)]
        state = L.state_dict()
    assert len(first) == 2
    with make([hard]) as L:
        L.load_state_dict(state)
        rest = digests(L)
    assert rest == want[2:]


def test_elastic_resume_from_the_index_equals_planning_pass(hard):
    """Two ranks take a batch each and resume on one rank: from the index as from the
    planning pass (the same global count, the same batches after it)."""
    dsindex.build([hard], tokenizer=TINY, threads=2, **VISION, **LIMITS)
    got = []
    for kw in ({}, dict(index=False)):
        states = []
        for r in (0, 1):
            with make([hard], dp_rank=r, dp_size=2, **kw) as L:
                next(iter(L))
                states.append(L.state_dict())
        with make([hard], dp_rank=0, dp_size=1, **kw) as L:
            restore_state_global(L, states)  # a list of 2 states on 1 rank
            info, _ = plan(L)
            got.append(([s["plan_pos"] for s in states], info, digests(L)))
    assert got[0][0][0] > 0 and got[0][1]["q0"] == got[0][0][0]
    assert got[0] == got[1]


def test_index_of_other_limits_is_not_trusted(hard):
    """The statuses depend on max_jpeg_scans, max_object_bytes and label_mode: an index
    built under other values keeps its offsets, its counts are not used (a warning says
    so) and the planning pass decides."""
    dsindex.build([hard], tokenizer=TINY, threads=2, **VISION, **LIMITS)
    for over in (
        dict(max_jpeg_scans=100),
        dict(max_object_bytes=10**6),
        dict(label_mode="last_assistant"),
    ):
        n, d, st, w, p, how = run([hard], **over)
        assert how == (0, 40), over
        assert any("built with other settings" in x for x in w), over
        n0, d0, st0, _, p0, _ = run([hard], index=False, **over)
        assert (n, d, p, st["skipped_by_reason"]) == (n0, d0, p0, st0["skipped_by_reason"])


PIXEL_LIMIT = 1_000_000  # bytes of pixel_values: float32 rows of 4704 bytes, uint8 of 1176


@pytest.fixture(scope="module")
def pixels(tmp_path_factory):
    """20 samples: 5 with a 224x224 image (256 patch rows: 1.2 MB as float32, 0.3 MB as
    uint8), 5 with two 160x160 images (144 rows each: each alone under the limit as float32,
    together 1.35 MB), 10 with a small image; the files are small (smooth gradients)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("pixels")
    ramp = np.linspace(0, 255, 224, dtype=np.uint8)
    Image.fromarray(np.dstack([np.add.outer(ramp, ramp) // 2] * 3)).save(root / "mid.png")
    Image.fromarray(np.dstack([np.add.outer(ramp, ramp)[:160, :160] // 2] * 3)).save(
        root / "half.png"
    )
    Image.fromarray(np.full((40, 56, 3), 90, np.uint8)).save(root / "small.png")
    lines = []
    for i in range(20):
        imgs = {1: ["mid.png"], 3: ["half.png", "half.png"]}.get(i % 4, ["small.png"])
        lines.append(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "<image>" * len(imgs) + "what " * (i % 3)},
                        {"role": "assistant", "content": f"answer {i} " + "word " * (i % 5)},
                    ],
                    "images": [str(root / p) for p in imgs],
                }
            )
        )
    shard = root / "pixels.jsonl"
    shard.write_text("\n".join(lines) + "\n")
    return str(shard)


def test_max_sample_pixel_bytes_applies_at_plan_time(pixels):
    """max_sample_pixel_bytes is applied by the index plan and the planning pass with the
    bytes formula the worker uses (mml_sample_pixel_bytes), so len(), the batches and the
    skip counts agree and the stream skips nothing the plan kept. The index's counts do
    not depend on it or on pixel_format: one index serves every value."""
    dsindex.build([pixels], tokenizer=TINY, threads=2, **VISION, **LIMITS)
    for fmt, over in (("float32", 10), ("uint8", 0)):
        kw = dict(max_sample_pixel_bytes=PIXEL_LIMIT, pixel_format=fmt)
        n_idx, d_idx, st_idx, w_idx, p_idx, how_idx = run([pixels], **kw)
        n_pass, d_pass, st_pass, w_pass, p_pass, how_pass = run([pixels], index=False, **kw)
        assert how_idx == (20, 0) and how_pass == (0, 20), fmt
        want = {"sample_too_large": over} if over else {}
        assert st_pass["skipped_by_reason"] == want, fmt
        assert st_idx["skipped_by_reason"] == want, fmt
        assert p_idx == p_pass and p_idx["unusable"] == over, fmt
        assert n_idx == n_pass == len(d_pass) == len(d_idx) == p_pass["steps"], fmt
        assert d_idx == d_pass, fmt
        assert w_idx == w_pass, fmt
