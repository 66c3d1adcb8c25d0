"""Loader(plan_only=True): the batch composition of the real stream without pixel work,
and seek(..., ahead): no work past a bound, output unchanged."""

import warnings

import numpy as np
import pytest

import mmloader
from mmloader.datagen import make_dataset

KW = dict(tokenizer="tiny", micro_batch_size=3, seed=2, num_threads=2, max_pixels=64 * 28 * 28)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("plan"))
    d = make_dataset(root, n_samples=30, seed=9, n_images=8, min_size=32, max_size=128)
    shard = d["shards"][0]  # two records name a missing image: skips move boundaries
    lines = open(shard, encoding="utf-8").read().splitlines()
    idx = [i for i, line in enumerate(lines) if "images/img-" in line][:2]
    for i in idx:
        lines[i] = lines[i].replace("images/img-", "images/missing-", 1)
    open(shard, "w", encoding="utf-8").write("\n".join(lines) + "\n")
    return root


def _cursors(L, n, plan):
    out = []
    while len(out) < n:
        try:
            b = next(L)
        except StopIteration:
            out.append("end")
            continue
        assert (b == {}) == plan
        out.append(tuple(L._c.cursor()))
    return out


@pytest.mark.parametrize("packing", [False, True])
def test_plan_only_gives_the_real_composition(data, packing):
    kw = dict(KW, packing=packing, pack_length=512) if packing else KW
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = mmloader.Loader(data, **kw)
        plan = mmloader.Loader(data, plan_only=True, **kw)
        n = 25
        assert _cursors(plan, n, True) == _cursors(real, n, False)
        assert plan.stats()["skipped"] > 0
        real.close()
        plan.close()


def test_seek_ahead_bounds_work_and_keeps_output(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        free = mmloader.Loader(data, **KW)
        want = [{k: np.from_dlpack(v).tobytes() for k, v in next(free).items()} for _ in range(4)]
        # as mmloader.ray's producers: nothing made before the first seek (start="next")
        L = mmloader.Loader(data, **KW, start="next")
        got, ends = [], []
        start = (0, 0, 0)
        for i in range(4):
            L._c.seek(*start, KW["micro_batch_size"])
            got.append({k: np.from_dlpack(v).tobytes() for k, v in next(L).items()})
            start = tuple(L._c.cursor())
            ends.append(start)
        assert got == want
        # only the samples the batches needed were read (skips extend the bound by one)
        s = L.stats()
        assert s["samples"] == ends[-1][1] and s["samples"] - s["skipped"] == 4 * 3
        free.close()
        L.close()
