"""Loader(start=...): production before the first next() (issue 34, "never late").

start="construction" (the default) starts the workers when the Loader is built, for the
first batches of cursor (0, 0, 0); start="next" starts them at the first next().  Checked
with the loader's own stats (what it made, what waited in its output queue), never with
wall-clock thresholds: a trainer that spends set-up time between building the loader and
its first next() finds batches made, load_state_dict / set_epoch after that early work
still continue bitwise (loader.c DESIGN "Start", S1), the early work stays within
prefetch and max_memory, and start never changes a batch."""

from __future__ import annotations

import os
import time

import pytest

import mmloader
from mmloader.datagen import make_dataset
from conftest import same, take  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
MB = 1 << 20


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("start"))
    return make_dataset(
        root, n_samples=40, seed=2, n_shards=2, n_images=12, min_size=32, max_size=160
    )


def make(data, **kw):
    args = dict(tokenizer=TINY, micro_batch_size=4, num_threads=2, prefetch=2, seed=5, **SMALL)
    args.update(kw)
    return mmloader.Loader(data, **args)


def set_up(L, want=1, timeout_s=120.0):
    """The trainer's set-up (loading its model): sleeps until `want` finished batches wait
    in the loader's output queue, or the timeout.  The queue's depth when it returns.
    (With float32 pixels the queue holds one expanded batch before the first next(); the
    rest of `prefetch` waits decoded as uint8 rows: loader_collator.c, the emission gate.)"""
    deadline = time.monotonic() + timeout_s
    while L.stats()["queue_depth"] < want and time.monotonic() < deadline:
        time.sleep(0.01)
    return L.stats()["queue_depth"]


def test_first_next_finds_batches_made_during_set_up(ds):
    with make(ds["shards"]) as L:
        assert set_up(L) >= 1, "no batch was made before the first next()"
        before = L.stats()
        assert before["samples"] >= 4, before
        # nothing was consumed yet: the ratio's clock starts at the first next() (S2)
        assert before["batches"] == 0 and before["wall_s"] == 0 and before["wait_s"] == 0
        next(L)  # popped from the queue: no sample of it was decoded during this call
        after = L.stats()
        assert after["batches"] == 1
        assert after["samples"] >= before["samples"]  # the workers go on behind it


def test_start_next_reads_nothing_before_the_first_next(ds):
    with make(ds["shards"]) as early, make(ds["shards"], start="next") as lazy:
        assert set_up(early) >= 1  # early made a batch meanwhile
        st = lazy.stats()
        assert st["samples"] == 0 and st["queue_depth"] == 0 and st["bytes_read"] == 0, st
        same(take(early, 3), take(lazy, 3))


def test_start_changes_no_batch(ds):
    with make(ds["shards"], start="next") as L:
        ref = take(L, 25)  # two epochs and a half: epoch ends included
    with make(ds["shards"]) as L:
        set_up(L)
        same(ref, take(L, 25))


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("cut", [0, 3, 10, 13])
def test_restore_after_early_production_resumes_bitwise(ds, packing, cut):
    kw = dict(packing=True, seq_length=1024) if packing else {}
    with make(ds["shards"], start="next", **kw) as L:
        ref = take(L, 16)
    with make(ds["shards"], start="next", **kw) as L:
        take(L, cut)
        state = L.state_dict()
    with make(ds["shards"], **kw) as R:
        assert set_up(R) >= 1  # batches from (0, 0, 0) made and queued
        R.load_state_dict(state)  # drops them (cut 0: nothing to drop, the same cursor)
        assert R.state_dict() == state
        same(ref[cut:], take(R, 16 - cut))


def test_set_epoch_after_early_production(ds):
    with make(ds["shards"], start="next") as L:
        take(L, len(L))
        e1 = take(L, len(L))
    with make(ds["shards"]) as L:
        set_up(L)
        L.set_epoch(1)
        same(e1, take(L, len(L)))


def test_early_production_stays_within_prefetch_and_max_memory(ds):
    cap = 48 * MB
    # float32-decode: finished batches are queued as they are (no emission gate), so
    # the queue fills to prefetch before the first next()
    with make(ds["shards"], prefetch=3, max_memory=cap, pixel_format="float32-decode") as L:
        assert set_up(L, want=3) == 3
        time.sleep(0.2)  # anything still allowed to start has started
        st = L.stats()
        assert st["queue_depth"] == 3 and st["pool_live_bytes"] > 0, st
        assert st["pool_live_bytes"] + st["pool_cached_bytes"] <= cap, st
        assert st["pool_peak_bytes"] <= cap, st


def test_a_bad_start_is_a_config_error(ds):
    with pytest.raises(mmloader.ConfigError, match="start"):
        make(ds["shards"], start="iter")
