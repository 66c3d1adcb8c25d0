"""Never late (issue 34): how long mmloader takes per batch, batch by batch, and how long
the trainer waits in next() when its step is 1.2x the mean production time.

    python3 -m pytest benchmarks/bench_never_late.py --benchmark-only -q -s

The data: the end-to-end suite's mix with real photos (benchmarks/pipelines/dataset.py,
photos=True: generated photos and screenshots, and three in ten references the
scikit-image / matplotlib photos re-encoded at 0.3-12 MP), RECORDS records, read in record
order and cycled; the Qwen2.5-VL preset at the model's default pixel limits, float32
pixels, micro_batch_size 8, 2 worker threads, prefetch 4, as the suite runs mmloader.

Each repeat, in a fresh Loader each:

- step 0 (the loader's own rate): the time between consecutive next() returns after the
  warm-up (the first WARMUP batches, which the prefetch serves from work done before the
  first call), BATCHES of them: the production time per batch, p50 / p90 / p99 / max, and
  the share of batches over 1.2x the median;
- step = 1.2x that repeat's mean production time: the trainer sleeps the step after each
  batch; every next() wait (p50 / p90 / p99 / max), and the wait-time ratio of the whole
  run (warm-up included) as Loader.stats() reports it (time blocked in next() over the
  wall time since the first call) and the same after the warm-up.

The figures are medians over REPEATS repeats with the load average beside them; nothing is
asserted on them (they follow the machine's load).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Dict, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import mmloader  # noqa: E402
from pipelines import dataset  # noqa: E402

RECORDS = int(os.environ.get("MML_NEVER_LATE_RECORDS", "128"))
BATCHES = int(os.environ.get("MML_NEVER_LATE_BATCHES", "96"))
REPEATS = int(os.environ.get("MML_NEVER_LATE_REPEATS", "3"))
WARMUP = 5
FACTOR = 1.2
TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")


def _pct(v: List[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def _loader(shard: str) -> mmloader.Loader:
    return mmloader.Loader(
        shard,
        tokenizer=TINY,
        preset="qwen2.5-vl",
        micro_batch_size=8,
        num_threads=2,
        prefetch=4,
        max_inflight=64,
        shuffle=False,
        cycle=True,
    )


def production(shard: str) -> List[float]:
    """ms between consecutive next() returns at step 0, after the warm-up."""
    out = []
    with _loader(shard) as L:
        it = iter(L)
        for _ in range(WARMUP):
            next(it)
        t = time.perf_counter()
        for _ in range(BATCHES):
            next(it)
            now = time.perf_counter()
            out.append((now - t) * 1e3)
            t = now
    return out


def waits(shard: str, step_ms: float) -> Dict[str, object]:
    """Each next() wait (ms) with the trainer sleeping step_ms after every batch."""
    w: List[float] = []
    with _loader(shard) as L:
        it = iter(L)
        for k in range(WARMUP + BATCHES):
            t = time.perf_counter()
            next(it)
            w.append((time.perf_counter() - t) * 1e3)
            time.sleep(step_ms / 1e3)
        ratio = L.stats()["wait_time_ratio"]
    # the first call waits for the first batch (start-up): the ratio's own definition
    # counts from the first call's return, so does "after the warm-up" here
    after = w[WARMUP:]
    wall_after = sum(after) + len(after) * step_ms
    return {"waits": w[1:], "ratio": ratio, "ratio_after_warmup": sum(after) / wall_after}


def _summary(v: List[float]) -> str:
    return (
        f"p50 {_pct(v, 50):.1f} / p90 {_pct(v, 90):.1f} / p99 {_pct(v, 99):.1f} / "
        f"max {max(v):.1f} ms"
    )


@pytest.fixture(scope="module")
def shard() -> str:
    pytest.importorskip("PIL")
    base = dataset.cached(RECORDS, photos=True)
    return dataset.repeated(base, 8)


def test_never_late(benchmark, shard):
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    rows = []
    for r in range(REPEATS):
        load0 = os.getloadavg()[0]
        prod = production(shard)
        mean = statistics.mean(prod)
        wt = waits(shard, FACTOR * mean)
        rows.append(
            {
                "prod": prod,
                "mean": mean,
                "over": sum(p > FACTOR * statistics.median(prod) for p in prod) / len(prod),
                **wt,
                "load": (load0, os.getloadavg()[0]),
            }
        )
        print(
            f"\nrepeat {r}: load {load0:.1f} -> {os.getloadavg()[0]:.1f}; production per batch "
            f"{_summary(prod)} (mean {mean:.1f}; {100 * rows[-1]['over']:.0f}% over 1.2x "
            f"the median); step {FACTOR * mean:.1f} ms: next() waits "
            f"{_summary(wt['waits'])}, wait-time ratio {100 * wt['ratio']:.2f}% "
            f"({100 * wt['ratio_after_warmup']:.2f}% after the warm-up)"
        )

    def med(f) -> float:
        return statistics.median(f(x) for x in rows)

    print(
        f"\nmedians of {REPEATS} repeats ({RECORDS} records, {BATCHES} batches of 8 after "
        f"{WARMUP} of warm-up; load {min(x['load'][0] for x in rows):.1f}-"
        f"{max(x['load'][1] for x in rows):.1f}): production per batch p50 "
        f"{med(lambda x: _pct(x['prod'], 50)):.1f} / p90 {med(lambda x: _pct(x['prod'], 90)):.1f}"
        f" / p99 {med(lambda x: _pct(x['prod'], 99)):.1f} ms (mean {med(lambda x: x['mean']):.1f}"
        f", {100 * med(lambda x: x['over']):.0f}% over 1.2x the median); at step = 1.2x the "
        f"mean: next() waits p50 {med(lambda x: _pct(x['waits'], 50)):.2f} / p90 "
        f"{med(lambda x: _pct(x['waits'], 90)):.2f} / p99 {med(lambda x: _pct(x['waits'], 99)):.1f}"
        f" ms, wait-time ratio {100 * med(lambda x: x['ratio']):.2f}% (after the warm-up "
        f"{100 * med(lambda x: x['ratio_after_warmup']):.2f}%)"
    )
