"""GPU benchmarks (skipped without a GPU and a CUDA build of PyTorch).

  python3 -m pytest benchmarks/bench_cuda.py --benchmark-only -q -s

1. Host-to-device throughput of the loader's copy path (pinned pool -> device pool on the
   loader's stream, one event per batch) against a plain loop of
   `dst.copy_(pinned_src, non_blocking=True)` in PyTorch on a side stream, same sizes, in
   the same run: medians of ROUNDS alternating runs.  Ratio = loader GB/s / torch GB/s
   (1.0: the loader costs nothing extra).  The stage's pools are first given every
   buffer a run can have in flight, then warmed until a run allocates nothing
   (warm_stage), and the timed runs are checked to allocate and free nothing: a run that
   grows its pools times cudaHostAlloc / cudaMalloc, not the copy path.
2. Wait-time ratio of a synthetic trainer (a fixed amount of GPU work per step) fed by
   Loader(device="cuda:0"), by Loader(pin_memory=True) + .cuda(non_blocking=True) and by
   pageable batches + .cuda(non_blocking=True): medians of ROUNDS alternating loaders, each
   run for EPOCHS epochs; the first epoch (pools empty: each buffer allocated, pinned or on
   the device) and the last (pools warm) are reported apart.
Lines starting with "[bench_cuda]" are the figures (scripts/gpu-check.sh collects them).
"""

import statistics
import time

import pytest

from mmloader import _core

BATCH_BYTES = 64 << 20  # a large multimodal micro-batch of pixels
NTENSORS = 4
ITERS = 20
ROUNDS = 5
EPOCHS = 3  # the trainer's epochs per loader: the first with fresh pools, the last warm


def stage_for(device, nbytes, iters):
    """A DeviceStage whose pools can keep every buffer of `iters` batches of `nbytes` in
    flight (one bench run queues them all before it waits), so a warm stage frees nothing."""
    cap = 2 * nbytes * (iters + 1)
    return _core.DeviceStage(device, max_cached_bytes=cap), cap


POOLS = ("device", "pinned")


def pool_counts(stats):
    """{pool: (allocs, frees)} of stage.stats(): equal before and after a run when the run
    allocated and freed nothing (the byte figures can stay put while buffers churn)."""
    return {k: (stats[k]["allocs"], stats[k]["frees"]) for k in POOLS}


def describe_change(before, after):
    """What a run changed in each pool, one line: buffers allocated and freed (of those at
    a release: the cache was full), cached bytes and buffers, and the most cached buffers
    one request has found still pending since the pool was made (their copies not done: how
    far the host ran ahead)."""
    parts = []
    for k in POOLS:
        b, a = before[k], after[k]
        parts.append(
            f"{k} +{a['allocs'] - b['allocs']} allocs +{a['frees'] - b['frees']} frees "
            f"({a['release_frees'] - b['release_frees']} at release), cached {a['cached']} "
            f"bytes in {a['cached_bufs']} buffers, pending max {a['pending_max']}"
        )
    return "; ".join(parts)


def warm_stage(stage, cap, nbytes, ntensors, iters, tries=40, reserve=True, log=print):
    """Warms `stage` for runs of stage.bench(nbytes, ntensors, iters); returns
    (stage.stats(), runs).  A run queues its batches as fast as the host can and releases
    each once the next is out, so it needs as many buffers as batches are still being
    copied -- how far the host gets ahead of the copies, which on a GPU is a matter of
    timing (each growth is a cudaHostAlloc / cudaMalloc that lets the copies catch up).
    Grown run by run, the pools follow the largest lag seen so far and may take many runs
    to stop (an H200 still grew after 40).  reserve (the default): one run with hold=True
    first keeps every batch until its end, so each pool caches iters x ntensors buffers,
    every buffer a run can have in flight whatever the timing.  Then runs until two in a
    row allocate and free nothing (pool_counts); `log` gets a line for every run that
    changed a pool.  AssertionError if the pools reach the cap `cap` or still change after
    `tries` runs."""
    before = stage.stats()
    if reserve:
        stage.bench(nbytes, ntensors, iters, hold=True)
        after = stage.stats()
        log(f"[bench_cuda] warm reserve run: {describe_change(before, after)}")
        before = after
    same = 0
    for run in range(1, tries + 1):
        stage.bench(nbytes, ntensors, iters)
        after = stage.stats()
        assert max(after[k]["cached"] + after[k]["live"] for k in POOLS) < cap, (
            f"the stage's pools reached their cap {cap}: {describe_change(before, after)}"
        )
        if pool_counts(after) == pool_counts(before):
            same += 1
        else:
            same = 0
            log(f"[bench_cuda] warm run {run}: {describe_change(before, after)}")
        if same == 2:
            return after, run
        before = after
    raise AssertionError(
        f"the stage's pools still change after {tries} warm-up runs: "
        f"{describe_change(before, after)}"
    )


def _torch_cuda():
    try:  # torch first: mmloader then shares its CUDA runtime
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no GPU visible to PyTorch")
    if not _core.cuda_available():
        pytest.skip(f"no usable CUDA runtime: {_core.cuda_unavailable_reason()}")
    return torch


def test_h2d_throughput(benchmark):
    torch = _torch_cuda()
    stage, cap = stage_for(0, BATCH_BYTES, ITERS)
    each = BATCH_BYTES // NTENSORS
    src = [torch.empty(each, dtype=torch.uint8, pin_memory=True) for _ in range(NTENSORS)]
    dst = [torch.empty(each, dtype=torch.uint8, device="cuda:0") for _ in range(NTENSORS)]
    side = torch.cuda.Stream()

    def torch_loop():
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            for _ in range(ITERS):
                for s, d in zip(src, dst):
                    d.copy_(s, non_blocking=True)
        side.synchronize()
        return time.perf_counter() - t0

    warmed, warm_runs = warm_stage(stage, cap, BATCH_BYTES, NTENSORS, ITERS)
    torch_loop()
    times, queued, torch_times = [], [], []

    def both():  # alternating, so both see the same machine
        total, enqueue = stage.bench(BATCH_BYTES, NTENSORS, ITERS, timings=True)
        times.append(total)
        queued.append(enqueue)
        torch_times.append(torch_loop())

    benchmark.pedantic(both, rounds=ROUNDS, iterations=1)
    # then the runs timed cudaHostAlloc / cudaMalloc (or cudaFree) too
    allocated = pool_counts(stage.stats()) != pool_counts(warmed)
    loader_s = statistics.median(times)
    torch_s = statistics.median(torch_times)
    gb = BATCH_BYTES * ITERS / 1e9
    ratio = (gb / loader_s) / (gb / torch_s)
    print(
        f"\n[bench_cuda] h2d {BATCH_BYTES >> 20} MiB x {ITERS} batches: loader "
        f"{gb / loader_s:.1f} GB/s, torch non_blocking copy_ {gb / torch_s:.1f} GB/s, "
        f"ratio {ratio:.2f} (medians of {ROUNDS}; pools warm after {warm_runs} runs"
        f"{', ALLOCATED while timed' if allocated else ''}); the loader's host had queued "
        f"every copy after {statistics.median(queued) * 1e3:.2f} of {loader_s * 1e3:.2f} ms"
    )
    benchmark.extra_info.update(
        loader_gbps=gb / loader_s, torch_gbps=gb / torch_s, ratio=ratio, warm_runs=warm_runs
    )
    stage.close()
    assert not allocated, "the timed runs allocated: they timed the allocator, not the copies"


def copy_profile(torch, run, each):
    """What the GPU did with the host-to-device copies `run()` queues, from CUDA's activity
    records (torch.profiler): {copies, kinds (the source memory the runtime saw), one copy's
    median GB/s, busy (copy time / the span from the first copy's start to the last one's
    end), span GB/s, the median gap between copies in us}.  `each`: bytes per copy."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    evs = sorted(
        (e for e in prof.events() if "Memcpy HtoD" in e.name),
        key=lambda e: e.time_range.start,
    )
    if not evs:
        return {"copies": 0}
    starts = [e.time_range.start for e in evs]  # microseconds
    ends = [e.time_range.end for e in evs]
    durs = [b - a for a, b in zip(starts, ends)]
    span = max(ends) - starts[0]
    gaps = [max(0.0, b - a) for a, b in zip(ends, starts[1:])] or [0.0]
    return {
        "copies": len(evs),
        "kinds": sorted({e.name for e in evs}),
        "copy_gbps": each / statistics.median(durs) / 1e3,
        "busy": sum(durs) / span,
        "span_gbps": each * len(evs) / span / 1e3,
        "gap_us": statistics.median(gaps),
    }


def test_h2d_copy_profile(benchmark):
    """Where the loader's copy path loses to a raw copy, seen from the GPU: per copy (the
    same DMA rate? pinned source?) or between copies (the host late).  The loader's warm
    stage, PyTorch copying the same 4 buffers over and over (test_h2d_throughput's peer),
    and PyTorch rotating over as many distinct buffers as the loader's pools hold."""
    torch = _torch_cuda()
    stage, cap = stage_for(0, BATCH_BYTES, ITERS)
    each = BATCH_BYTES // NTENSORS
    n = ITERS * NTENSORS
    src = [torch.empty(each, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    dst = [torch.empty(each, dtype=torch.uint8, device="cuda:0") for _ in range(n)]
    side = torch.cuda.Stream()

    def torch_copies(k):
        with torch.cuda.stream(side):
            for i in range(n):
                dst[i % k].copy_(src[i % k], non_blocking=True)
        side.synchronize()

    warm_stage(stage, cap, BATCH_BYTES, NTENSORS, ITERS)
    torch_copies(n)
    paths = {
        "loader": lambda: stage.bench(BATCH_BYTES, NTENSORS, ITERS),
        f"torch {NTENSORS} buffers": lambda: torch_copies(NTENSORS),
        f"torch {n} buffers": lambda: torch_copies(n),
    }
    res = {}
    benchmark.pedantic(
        lambda: res.update({k: copy_profile(torch, f, each) for k, f in paths.items()}),
        rounds=1,
        iterations=1,
    )
    stage.close()
    for k, r in res.items():
        if r["copies"]:
            print(
                f"[bench_cuda] profile {k}: {r['copies']} copies of {each >> 20} MiB "
                f"({', '.join(r['kinds'])}): one copy {r['copy_gbps']:.1f} GB/s, busy "
                f"{r['busy']:.2f} of the span, span {r['span_gbps']:.1f} GB/s, median gap "
                f"{r['gap_us']:.1f} us"
            )
    benchmark.extra_info.update(res)
    for k, r in res.items():
        assert r["copies"] == n, f"{k}: the profile saw {r['copies']} of {n} copies"


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from mmloader.datagen import make_dataset

    return make_dataset(
        str(tmp_path_factory.mktemp("benchcuda")),
        n_samples=96,
        seed=5,
        n_shards=2,
        n_images=16,
        min_size=64,
        max_size=320,
    )


def test_trainer_wait_time_ratio(benchmark, ds):
    """A trainer whose step is a fixed GPU kernel (about 1 ms) plus a reduction over every
    tensor of the batch, synchronising once per step (as loss.item() does)."""
    torch = _torch_cuda()
    import os
    import mmloader

    tiny = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
    args = dict(
        tokenizer=tiny,
        micro_batch_size=4,
        num_threads=max(1, (os.cpu_count() or 2) - 2),
        prefetch=4,
        min_pixels=28 * 28 * 16,
        max_pixels=448 * 448,
    )
    cycles = 2_000_000  # GPU clock cycles: about 1 ms

    def train(**kw):
        """[(wait ratio, steps/s)] of each of EPOCHS epochs of one loader: the time the
        trainer spent in next() over the epoch's wall time.  The first epoch's loader
        starts with empty pools (every buffer a cudaHostAlloc / cudaMalloc, where the
        loader pins or copies), the last one's have served the epochs before."""
        out = []
        with mmloader.Loader(ds["shards"], **kw, **args) as L:
            for _ in range(EPOCHS):
                t0 = time.perf_counter()
                steps, waited = 0, 0.0
                it = iter(L)
                while True:
                    tw = time.perf_counter()
                    b = next(it, None)
                    waited += time.perf_counter() - tw
                    if b is None:
                        break
                    if kw.get("device", "cpu") == "cpu":
                        t = {k: torch.from_dlpack(v).cuda(non_blocking=True) for k, v in b.items()}
                    else:
                        t = {k: torch.from_dlpack(v) for k, v in b.items()}
                    torch.cuda._sleep(cycles)
                    for v in t.values():
                        v.sum()
                    torch.cuda.current_stream().synchronize()
                    steps += 1
                wall = time.perf_counter() - t0
                out.append((waited / wall, steps / wall))
        return out

    train(device="cuda:0")  # warm up (CUDA context)
    kinds = {"device": dict(device="cuda:0"), "pinned": dict(pin_memory=True), "pageable": {}}
    runs = {k: [] for k in kinds}

    def all_kinds():  # alternating, so each sees the same machine
        for k, kw in kinds.items():
            runs[k].append(train(**kw))

    benchmark.pedantic(all_kinds, rounds=ROUNDS, iterations=1)
    first, last = (
        {
            k: (statistics.median(r[e][0] for r in rs), statistics.median(r[e][1] for r in rs))
            for k, rs in runs.items()
        }
        for e in (0, EPOCHS - 1)
    )
    for k in kinds:
        print(
            f"[bench_cuda] trainer {k}: epoch 1 wait ratio {first[k][0]:.3f}, "
            f"{first[k][1]:.1f} steps/s; epoch {EPOCHS} wait ratio {last[k][0]:.3f}, "
            f"{last[k][1]:.1f} steps/s (medians of {ROUNDS} loaders)"
        )
    for name, res in (("epoch 1", first), (f"epoch {EPOCHS}", last)):
        print(
            f"[bench_cuda] trainer {name} steps/s ratio device/pinned "
            f"{res['device'][1] / res['pinned'][1]:.2f}, device/pageable "
            f"{res['device'][1] / res['pageable'][1]:.2f}"
        )
    benchmark.extra_info.update(
        {
            k: {
                "wait_ratio_first": first[k][0],
                "steps_per_s_first": first[k][1],
                "wait_ratio_last": last[k][0],
                "steps_per_s_last": last[k][1],
            }
            for k in kinds
        }
    )
