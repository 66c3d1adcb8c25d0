"""pixel_format "float32" / "bfloat16" (the default): the loader decodes images into
uint8 patch rows while their batch is being built and expands pixel_values from them when
the batch is finished (loader_place.c COMPACT, loader_collator.c expand_images).  The
batches must be bitwise those of "float32-decode" / "bfloat16-decode" (the float rows
written directly by the workers),
also when samples fail only at decode (the planner rewinds and moves rows: now uint8 ones),
in padded and packed batches, on one and several threads, and under max_memory.  tests/test_batch_digest.py checks the default against the recorded digests."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

import mmloader
from conftest import same
from test_plan_decode import CONFIGS, SMALL, TINY, shards  # noqa: F401 (the fixture)

# bfloat16 batches are compared as torch tensors (NumPy has no bfloat16)
torch = pytest.importorskip("torch", reason="needs torch (bfloat16 tensors)")


def _epoch(path, threads, **cfg):
    """One epoch's batches (torch tensors: bfloat16 has no NumPy dtype) and the stats."""
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
            batches = [{k: torch.from_dlpack(v).clone() for k, v in b.items()} for b in L]
            return batches, L.stats()


@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_compact_batches_are_the_direct_ones(shards, name, fmt):  # noqa: F811
    threads = 3 if name.startswith("packed") else 2
    direct, st_d = _epoch(shards["late"], threads, pixel_format=f"{fmt}-decode", **CONFIGS[name])
    compact, st_c = _epoch(shards["late"], threads, pixel_format=fmt, **CONFIGS[name])
    same(compact, direct)
    assert st_d["pixel_rows_expanded"] == 0
    # every delivered image row was expanded from its uint8 row (and maybe rows of the
    # next epoch's batches prefetched meanwhile; placeholder rows are not images)
    rows = sum(int(b["image_grid_thw"].prod(1).sum()) for b in compact if "image_grid_thw" in b)
    assert st_c["pixel_rows_expanded"] >= rows > 0
    # each in its own buffer, grown to the float rows (no second buffer)
    if _kernel_moves_pages():
        assert st_c["pixel_rows_expanded_in_place"] == st_c["pixel_rows_expanded"]
    assert st_c["skipped"] == st_d["skipped"] > 0
    if name.startswith("packed"):  # late failures moved rows in both forms
        assert st_c["pixel_rows_moved"] > 0 and st_d["pixel_rows_moved"] > 0


@pytest.mark.parametrize("shard", ["early", "late"])
def test_compact_pixels_under_max_memory(shards, shard):  # noqa: F811
    # the budget counts the uint8 rows and keeps room for the expansions: compact stays on
    # under a cap, and the batches are those of the float rows written directly (also with
    # late failures: rows moved), on a tight cap too
    plain, st_p = _epoch(shards[shard], 2, micro_batch_size=2, pixel_format="float32-decode")
    for cap in (256 << 20, 64 << 20):
        capped, st = _epoch(shards[shard], 2, micro_batch_size=2, max_memory=cap)
        same(capped, plain)
        assert st["pixel_rows_expanded"] > 0 and st_p["pixel_rows_expanded"] == 0


def _gate(rows, popped_upto, prefetch):
    """The emission gate's batches emitted (expanded) once the engine is idle, after the
    consumer took batches 0..popped_upto-1 (ld_emit_gated_locked, G1): up to `prefetch`
    ahead of the batch the consumer holds (the test's batches are far below the output
    queue's byte budget, and under max_memory far below the cap: the ledger grants every
    emission, G2)."""
    return [min(len(rows), k + prefetch) for k in range(popped_upto + 1)]


@pytest.fixture(scope="module")
def big_then_small(tmp_path_factory):
    """Two batches of large images, then batches of small ones: the large pair sets the
    high-water that two small batches ahead fit in."""
    from test_plan_decode import _jpeg

    import numpy as np

    root = tmp_path_factory.mktemp("gate")
    rng = np.random.default_rng(3)
    (root / "big.jpg").write_bytes(_jpeg(rng, 500, 375))
    (root / "small.jpg").write_bytes(_jpeg(rng, 64, 64))
    lines = []
    for i in range(30):
        rec = {
            "messages": [
                {"role": "user", "content": f"<image>\nsample {i}"},
                {"role": "assistant", "content": "answer"},
            ],
            "images": ["big.jpg" if i < 6 else "small.jpg"],
        }
        lines.append(json.dumps(rec))
    path = root / "gate.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    "capped", [False, True], ids=["prefetch_ahead", "max_memory_prefetch_ahead"]
)
def test_compact_emission_gate_expands_what_its_rule_allows_ahead(big_then_small, capped):
    """With the consumer idle on batch i, the batches expanded ahead are exactly what the
    gate allows (_gate): `prefetch` ahead, so a slow batch finds the rest of prefetch
    expanded, not waiting as uint8 rows for a worker busy decoding (issue 34).  Under a
    max_memory with room for them the same (G2: the memory ledger grants each expansion
    at its batch's seq; before it decided, max_memory kept at most two ahead)."""
    import time

    prefetch = 4
    cfg = dict(
        tokenizer=TINY, num_threads=2, prefetch=prefetch, micro_batch_size=3, max_error_rate=1.0
    )
    extra = dict(max_memory=4 << 30) if capped else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(big_then_small, pixel_format="float32-decode", **SMALL, **cfg) as L:
            rows = [int(b["pixel_values"].shape[0]) for b in L]
        want = _gate(rows, len(rows) - 3, prefetch)
        assert want[1] - 1 == prefetch > 2, repr((rows, want))  # more than the old two
        with mmloader.Loader(big_then_small, **SMALL, **cfg, **extra) as L:
            it = iter(L)
            # k batches taken, the last one held; the batches ahead all of this epoch (the
            # loader goes on into the next one, reshuffled)
            for k in range(1, len(rows) - (prefetch - 1)):
                next(it)
                expect = sum(rows[: want[k]])
                deadline = time.monotonic() + 60
                while L.stats()["pixel_rows_expanded"] < expect and time.monotonic() < deadline:
                    time.sleep(0.005)
                time.sleep(0.05)  # and nothing more is expanded while the consumer idles
                assert L.stats()["pixel_rows_expanded"] == expect, (k, rows, want)
            if _kernel_moves_pages():  # the large batches' mappings grew in place
                st = L.stats()
                assert st["pixel_rows_expanded_in_place"] == st["pixel_rows_expanded"] > 0


def test_wait_emit_s_is_the_wait_after_the_batch_was_composed(big_then_small):
    """stats()["wait_emit_s"]: of wait_s, the part after the batch waited for was composed
    (its emission: with float32 pixels, its expansion).  A consumer that starts the loader
    waits through the first batch's decodes and then its emission: both parts are
    counted.  One that comes after the gate expanded what it may (G1): no wait, nothing
    added."""
    import time

    prefetch = 4
    cfg = dict(
        tokenizer=TINY, num_threads=2, prefetch=prefetch, micro_batch_size=3, max_error_rate=1.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(big_then_small, pixel_format="float32-decode", **SMALL, **cfg) as L:
            rows = [int(b["pixel_values"].shape[0]) for b in L]
        with mmloader.Loader(big_then_small, start="next", **SMALL, **cfg) as L:
            it = iter(L)
            next(it)
            st = L.stats()
            assert 0 < st["wait_emit_s"] < st["wait_s"], st
            expect = sum(rows[: 1 + prefetch])  # the batch held and `prefetch` ahead
            deadline = time.monotonic() + 60
            while L.stats()["pixel_rows_expanded"] < expect and time.monotonic() < deadline:
                time.sleep(0.005)
            assert L.stats()["pixel_rows_expanded"] == expect
            next(it)
            assert L.stats()["wait_emit_s"] == st["wait_emit_s"]


def _kernel_moves_pages():
    """Linux >= 5.7 (mremap MREMAP_DONTUNMAP): the pool moves pages, and its large
    buffers can grow in place (pool.c); before, only buffers under 1 MiB do."""
    rel = os.uname().release.split("-")[0].split(".")
    return os.uname().sysname == "Linux" and tuple(int(x) for x in rel[:2]) >= (5, 7)


def test_shared_expansion_is_the_same_batches(tmp_path):
    # loader_expand.c X1: batches large enough for their expansion to be shared (over 1024
    # rows past the first in-place run) come out bitwise those written directly, and some
    # of their rows were expanded by a worker other than the emitting one (the consumer
    # takes every batch at once, so the output queue is empty while each is expanded; at
    # the end of the epoch nothing is left to decode and the other worker helps when it runs)
    import json

    from test_plan_decode import _jpeg

    rng = np.random.default_rng(3)
    sizes = [(700, 560), (448, 896), (980, 700), (640, 640)]
    for k, (w, h) in enumerate(sizes):
        (tmp_path / f"big{k}.jpg").write_bytes(_jpeg(rng, w, h))
    with open(tmp_path / "big.jsonl", "w") as f:
        for i in range(16):
            refs = [f"big{(i + j) % len(sizes)}.jpg" for j in range(1 + i % 2)]
            text = "".join("<image>" for _ in refs) + f"\nsample {i}: " + "word " * (i % 5)
            rec = {
                "messages": [
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": "answer " * (1 + i % 3)},
                ],
                "images": refs,
            }
            f.write(json.dumps(rec) + "\n")
    path = str(tmp_path / "big.jsonl")

    def epoch(pixel_format):
        with mmloader.Loader(
            path,
            tokenizer=TINY,
            num_threads=2,
            prefetch=2,
            micro_batch_size=4,
            pixel_format=pixel_format,
        ) as L:
            return [{k: torch.from_dlpack(v).clone() for k, v in b.items()} for b in L], L.stats()

    for fmt in ("float32", "bfloat16"):
        direct, _ = epoch(f"{fmt}-decode")
        # Whether the other worker gets a chunk depends on the scheduler (on a loaded
        # machine it may not run before the emitter took them all): every epoch must be
        # bitwise the direct one, and one of a few must have been shared.
        for _ in range(8):
            compact, st = epoch(fmt)
            same(compact, direct)
            assert len(compact) == 4
            assert st["pixel_rows_expanded"] >= sum(
                int(b["image_grid_thw"].prod(1).sum()) for b in compact
            )
            assert st["pixel_rows_expanded_shared"] < st["pixel_rows_expanded"]
            if st["pixel_rows_expanded_shared"] > 0:
                break
        assert st["pixel_rows_expanded_shared"] > 0, "no expansion was shared in 8 epochs"
