"""compact_pixels (default on): with the float pixel formats the loader decodes images into
uint8 patch rows while their batch is being built and expands pixel_values from them when
the batch is finished (loader_place.c COMPACT, loader_collator.c expand_images).  The
batches must be bitwise those of compact_pixels=False (the float rows written directly),
also when samples fail only at decode (the planner rewinds and moves rows: now uint8 ones),
in padded and packed batches, on one and several threads; and it is off where it is unsafe
(max_memory).  tests/test_batch_digest.py checks the default against the recorded digests."""

from __future__ import annotations

import warnings

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
    direct, st_d = _epoch(
        shards["late"], threads, pixel_format=fmt, compact_pixels=False, **CONFIGS[name]
    )
    compact, st_c = _epoch(shards["late"], threads, pixel_format=fmt, **CONFIGS[name])
    same(compact, direct)
    assert st_d["pixel_rows_expanded"] == 0
    # every delivered image row was expanded from its uint8 row (and maybe rows of the
    # next epoch's batches prefetched meanwhile; placeholder rows are not images)
    rows = sum(int(b["image_grid_thw"].prod(1).sum()) for b in compact if "image_grid_thw" in b)
    assert st_c["pixel_rows_expanded"] >= rows > 0
    assert st_c["skipped"] == st_d["skipped"] > 0
    if name.startswith("packed"):  # late failures moved rows in both forms
        assert st_c["pixel_rows_moved"] > 0 and st_d["pixel_rows_moved"] > 0


def test_compact_pixels_is_off_under_max_memory(shards):  # noqa: F811
    capped, st = _epoch(shards["early"], 2, micro_batch_size=2, max_memory=256 << 20)
    plain, st_c = _epoch(shards["early"], 2, micro_batch_size=2)
    same(capped, plain)
    assert st["pixel_rows_expanded"] == 0 and st_c["pixel_rows_expanded"] > 0
