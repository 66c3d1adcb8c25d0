"""Mixture construction: a Loader over 100 sources holding 10^7 samples in all, against
Megatron-Core's blended-dataset index (``build_blending_indices``, its C++ helper) for the
same weights and epoch size, in the same run.

    python3 -m pytest benchmarks/bench_mixture.py --benchmark-only -q -s

What is measured (medians of MML_BENCH_MIX_ROUNDS rounds, default 3):
  - mmloader: ``Loader(data=[Source(...) x 100])`` from call to return: indexing every
    shard (one pass over the bytes, 8 bytes per sample of line offsets) and the mixture
    (per-source counts; blending is a pure function of the position, so nothing per
    sample is built), and the growth of the process's resident memory it causes; then
    the time to the first batch.
  - Megatron: ``build_blending_indices`` filling its two per-sample arrays (int16 source,
    int64 index within the source: 10 bytes per sample) for the same weights; the
    per-dataset shuffle indices Megatron also builds are not counted.
Records are tiny text-only lines ("{...}" with one user and one assistant turn), so the
files stay as small as valid records allow (80 bytes a line: 0.8 GB for 10^7).

Environment: MML_BENCH_MIX_SAMPLES (default 10_000_000), MML_BENCH_MIX_SOURCES (100).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import mmloader  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SAMPLES = int(os.environ.get("MML_BENCH_MIX_SAMPLES", str(10_000_000)))
SOURCES = int(os.environ.get("MML_BENCH_MIX_SOURCES", "100"))
ROUNDS = int(os.environ.get("MML_BENCH_MIX_ROUNDS", "3"))
LINE = '{"messages":[{"role":"user","content":"q %d"},{"role":"assistant","content":"a"}]}\n'


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-mix")
    rng = np.random.default_rng(0)
    raw = rng.uniform(0.2, 1.8, size=SOURCES)
    sizes = np.maximum(1, (raw / raw.sum() * SAMPLES).astype(np.int64))
    sizes[-1] += SAMPLES - sizes.sum()
    weights = rng.uniform(0.1, 1.0, size=SOURCES)
    paths = []
    for s, n in enumerate(sizes):
        p = root / f"src{s:03d}.jsonl"
        line = LINE % s
        with open(p, "w") as f:
            for _ in range(0, int(n), 100_000):
                f.write(line * min(100_000, int(n) - _))
        paths.append(str(p))
    return paths, sizes, weights


def _build(paths, weights):
    data = [
        mmloader.Source(p, name=f"s{i}", weight=float(w))
        for i, (p, w) in enumerate(zip(paths, weights))
    ]
    return mmloader.Loader(data, tokenizer=TINY, micro_batch_size=8, num_threads=1, prefetch=1)


def test_construction_100_sources_1e7_samples(benchmark, mixture):
    paths, sizes, weights = mixture
    times, grew = [], []

    def run():
        for _ in range(ROUNDS):
            gc.collect()
            r0 = _rss()
            t0 = time.perf_counter()
            L = _build(paths, weights)
            times.append(time.perf_counter() - t0)
            grew.append(_rss() - r0)
            if len(times) == 1:
                t1 = time.perf_counter()
                next(iter(L))
                first = time.perf_counter() - t1
                st = L.stats()["sources"]
                assert L.samples_per_epoch == int(sizes.sum())
                assert len(st) == SOURCES
            L.close()
            del L
        return first

    first = benchmark.pedantic(run, rounds=1, iterations=1)
    t_med, rss_med = statistics.median(times), statistics.median(grew)
    print(
        f"\nmmloader: Loader over {SOURCES} sources, {int(sizes.sum()):,} samples: "
        f"{t_med:.2f} s (median of {ROUNDS}; {', '.join(f'{t:.2f}' for t in times)}), "
        f"resident memory +{rss_med / 2**20:.0f} MiB "
        f"({rss_med / sizes.sum():.1f} bytes/sample); first batch {1000 * first:.0f} ms"
    )

    try:
        from megatron.core.datasets import helpers
    except Exception as e:  # pragma: no cover - depends on the environment
        print(f"megatron peer skipped: {e!r}")
        return
    w = (weights / weights.sum()).astype(np.float64)
    size = int(sizes.sum())
    mt = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        di = np.zeros(size, dtype=np.int16)
        dsi = np.zeros(size, dtype=np.int64)
        helpers.build_blending_indices(di, dsi, w, SOURCES, size, False)
        mt.append(time.perf_counter() - t0)
        nbytes = di.nbytes + dsi.nbytes
        del di, dsi
    m_med = statistics.median(mt)
    print(
        f"megatron build_blending_indices, same weights and size: {m_med:.2f} s "
        f"(median of {ROUNDS}), {nbytes / 2**20:.0f} MiB of index arrays; "
        f"mmloader / megatron time: {t_med / m_med:.2f}"
    )
