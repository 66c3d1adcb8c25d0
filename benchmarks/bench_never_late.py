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
  wall time since the first call) and the same after the warm-up; the first call's wait
  (it starts the loader and waits for its first batch from nothing) as its share of that
  ratio; and the output queue's depth as each next() is called (its peak since the last
  call: only next() drains it), and how often it was full (`prefetch` finished batches:
  the workers then start no new batch, and their slack is lost until the trainer takes one).

MML_NEVER_LATE_PREFETCH=4,8,16 runs the step's part at each prefetch in turn (the order
rotated per repeat, the same step: 1.2x the first prefetch's production), on the same data.

test_one_image_bound (issue 34's "split one huge image's resize over idle workers": is it
worth it?): each image of the same batches timed alone through mmloader.ImageProcessor (the
same preset and pixels, one thread, median of 3), and per batch whether its largest image
takes longer than the rest together: with 2 workers, such a batch cannot be produced in
less than that image's time however its decodes are ordered, and splitting that image is
the only lever on it.

The figures are medians over REPEATS repeats with the load average beside them; nothing is
asserted on them (they follow the machine's load).
"""

from __future__ import annotations

import os
import json
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
PREFETCH = [int(x) for x in os.environ.get("MML_NEVER_LATE_PREFETCH", "4").split(",")]
WARMUP = 5
FACTOR = 1.2
TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")


def _pct(v: List[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def _loader(shard: str, prefetch: int = PREFETCH[0]) -> mmloader.Loader:
    return mmloader.Loader(
        shard,
        tokenizer=TINY,
        preset="qwen2.5-vl",
        micro_batch_size=8,
        num_threads=2,
        prefetch=prefetch,
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


def waits(shard: str, step_ms: float, prefetch: int = PREFETCH[0]) -> Dict[str, object]:
    """Each next() wait (ms) with the trainer sleeping step_ms after every batch."""
    w: List[float] = []
    depth: List[int] = []  # finished batches in the output queue as each next() is called
    with _loader(shard, prefetch) as L:
        it = iter(L)
        for k in range(WARMUP + BATCHES):
            if k > 0:
                depth.append(L.stats()["queue_depth"])
            t = time.perf_counter()
            next(it)
            w.append((time.perf_counter() - t) * 1e3)
            time.sleep(step_ms / 1e3)
        st = L.stats()
        ratio, wall_s = st["wait_time_ratio"], st["wall_s"]
    # the first call waits for the first batch (start-up): the ratio's own definition
    # counts from the first call's return, so does "after the warm-up" here
    after = w[WARMUP:]
    wall_after = sum(after) + len(after) * step_ms
    return {
        "waits": w[1:],
        "ratio": ratio,
        "ratio_after_warmup": sum(after) / wall_after,
        # the first call's part of the whole-run ratio (its wait over the run's wall time)
        "first": w[0] / 1e3 / wall_s if wall_s > 0 else 0.0,
        "full": sum(d >= prefetch for d in depth) / len(depth),
        "depth": statistics.median(depth),
    }


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
        over = sum(p > FACTOR * statistics.median(prod) for p in prod) / len(prod)
        print(
            f"\nrepeat {r}: load {load0:.1f}; production per batch (prefetch {PREFETCH[0]}) "
            f"{_summary(prod)} (mean {mean:.1f}; {100 * over:.0f}% over 1.2x the median)"
        )
        order = PREFETCH[r % len(PREFETCH) :] + PREFETCH[: r % len(PREFETCH)]
        for pf in order:
            wt = waits(shard, FACTOR * mean, pf)
            rows.append(
                {
                    "prod": prod,
                    "mean": mean,
                    "over": over,
                    "pf": pf,
                    **wt,
                    "load": (load0, os.getloadavg()[0]),
                }
            )
            print(
                f"  prefetch {pf}, step {FACTOR * mean:.1f} ms: next() waits "
                f"{_summary(wt['waits'])}, wait-time ratio {100 * wt['ratio']:.2f}% (the first "
                f"call {100 * wt['first']:.2f}%; {100 * wt['ratio_after_warmup']:.2f}% after the "
                f"warm-up); output queue at a call: median {wt['depth']:g} batches, full at {100 * wt['full']:.0f}%; load "
                f"{os.getloadavg()[0]:.1f}"
            )

    def med(xs, f) -> float:
        return statistics.median(f(x) for x in xs)

    base = [x for x in rows if x["pf"] == PREFETCH[0]]
    print(
        f"\nmedians of {REPEATS} repeats ({RECORDS} records, {BATCHES} batches of 8 after "
        f"{WARMUP} of warm-up; load {min(x['load'][0] for x in rows):.1f}-"
        f"{max(x['load'][1] for x in rows):.1f}): production per batch p50 "
        f"{med(base, lambda x: _pct(x['prod'], 50)):.1f} / p90 "
        f"{med(base, lambda x: _pct(x['prod'], 90)):.1f} / p99 "
        f"{med(base, lambda x: _pct(x['prod'], 99)):.1f} ms (mean {med(base, lambda x: x['mean']):.1f}"
        f", {100 * med(base, lambda x: x['over']):.0f}% over 1.2x the median)"
    )
    for pf in PREFETCH:
        xs = [x for x in rows if x["pf"] == pf]
        print(
            f"prefetch {pf}, step = 1.2x the mean: next() waits p50 "
            f"{med(xs, lambda x: _pct(x['waits'], 50)):.2f} / p90 "
            f"{med(xs, lambda x: _pct(x['waits'], 90)):.2f} / p99 "
            f"{med(xs, lambda x: _pct(x['waits'], 99)):.1f} ms, wait-time ratio "
            f"{100 * med(xs, lambda x: x['ratio']):.2f}% (the first call "
            f"{100 * med(xs, lambda x: x['first']):.2f}%; after the warm-up "
            f"{100 * med(xs, lambda x: x['ratio_after_warmup']):.2f}%); output queue at a call: "
            f"median {med(xs, lambda x: x['depth']):g} batches, full at "
            f"{100 * med(xs, lambda x: x['full']):.0f}%"
        )


def _images(rec: Dict[str, object]) -> List[str]:
    x = rec.get("image") or rec.get("images") or []
    return [x] if isinstance(x, str) else list(x)  # type: ignore[arg-type]


def test_one_image_bound(benchmark, shard):
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    proc = mmloader.ImageProcessor("qwen2.5-vl")
    root = os.path.dirname(shard)
    with open(shard, encoding="utf-8") as f:
        recs = [json.loads(ln) for _, ln in zip(range(8 * (WARMUP + BATCHES)), f)]
    ms: Dict[str, float] = {}
    bound = 0
    excess = total = 0.0
    for i in range(0, len(recs), 8):
        t = []
        for name in (p for r in recs[i : i + 8] for p in _images(r)):
            if name not in ms:
                with open(os.path.join(root, name), "rb") as f:
                    data = f.read()
                runs = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    proc([data])
                    runs.append((time.perf_counter() - t0) * 1e3)
                ms[name] = statistics.median(runs)
            t.append(ms[name])
        if t:
            big, rest = max(t), sum(t) - max(t)
            bound += big > rest
            excess += max(0.0, big - sum(t) / 2)  # beyond an even split over 2 workers
            total += sum(t) / 2
    n = len(recs) // 8
    print(
        f"\n{n} batches of 8, {len(ms)} distinct images (load {os.getloadavg()[0]:.1f}): "
        f"{bound} batches ({100 * bound / n:.0f}%) have one image longer than the rest "
        f"together; their largest images' time beyond an even split over 2 workers is "
        f"{100 * excess / total:.1f}% of the batches' decode time / 2"
    )
