"""GPU benchmarks (skipped without a GPU and a CUDA build of PyTorch).

  python3 -m pytest benchmarks/bench_cuda.py --benchmark-only -q -s

1. Host-to-device throughput of the loader's copy path (pinned pool -> device pool on the
   loader's stream, one event per batch) against a plain loop of
   `dst.copy_(pinned_src, non_blocking=True)` in PyTorch on a side stream, same sizes, in
   the same run: medians of ROUNDS alternating runs.  Ratio = loader GB/s / torch GB/s
   (1.0: the loader costs nothing extra).  The stage is warmed until a run allocates
   nothing (warm_stage) and the timed runs are checked to allocate nothing: a run that
   grows its pools times cudaHostAlloc / cudaMalloc, not the copy path.
2. Wait-time ratio of a synthetic trainer (a fixed amount of GPU work per step) fed by
   Loader(device="cuda:0"), by Loader(pin_memory=True) + .cuda(non_blocking=True) and by
   pageable batches + .cuda(non_blocking=True): medians of ROUNDS alternating runs.
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


def stage_for(device, nbytes, iters):
    """A DeviceStage whose pools can keep every buffer of `iters` batches of `nbytes` in
    flight (one bench run queues them all before it waits), so a warm stage frees nothing."""
    cap = 2 * nbytes * (iters + 1)
    return _core.DeviceStage(device, max_cached_bytes=cap), cap


def warm_stage(stage, cap, nbytes, ntensors, iters, tries=40):
    """Runs stage.bench(nbytes, ntensors, iters) until two runs in a row leave the pools'
    bytes as they were; returns (stage.usage(), runs).  Below the pools' cap `cap` nothing
    is freed, so equal bytes mean a run allocated nothing: the pools hold what `iters`
    batches in flight need (they grow over several runs: the warmer the pools, the further
    ahead of the copies the host gets).  AssertionError if they reach the cap or still grow
    after `tries` runs."""
    before, same = stage.usage(), 0
    for run in range(1, tries + 1):
        stage.bench(nbytes, ntensors, iters)
        after = stage.usage()
        assert max(after.values()) < cap, f"the stage's pools reached their cap {cap}: {after}"
        same = same + 1 if after == before else 0
        if same == 2:
            return after, run
        before = after
    raise AssertionError(f"the stage's pools still grow after {tries} warm-up runs: {after}")


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
    times, torch_times = [], []

    def both():  # alternating, so both see the same machine
        times.append(stage.bench(BATCH_BYTES, NTENSORS, ITERS))
        torch_times.append(torch_loop())

    benchmark.pedantic(both, rounds=ROUNDS, iterations=1)
    allocated = stage.usage() != warmed  # then the runs timed cudaHostAlloc / cudaMalloc too
    loader_s = statistics.median(times)
    torch_s = statistics.median(torch_times)
    gb = BATCH_BYTES * ITERS / 1e9
    ratio = (gb / loader_s) / (gb / torch_s)
    print(
        f"\n[bench_cuda] h2d {BATCH_BYTES >> 20} MiB x {ITERS} batches: loader "
        f"{gb / loader_s:.1f} GB/s, torch non_blocking copy_ {gb / torch_s:.1f} GB/s, "
        f"ratio {ratio:.2f} (medians of {ROUNDS}; pools warm after {warm_runs} runs"
        f"{', ALLOCATED while timed' if allocated else ''})"
    )
    benchmark.extra_info.update(
        loader_gbps=gb / loader_s, torch_gbps=gb / torch_s, ratio=ratio, warm_runs=warm_runs
    )
    stage.close()
    assert not allocated, "the timed runs allocated: they timed the allocator, not the copies"


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
        with mmloader.Loader(ds["shards"], **kw, **args) as L:
            t0 = time.perf_counter()
            steps = 0
            for b in L:
                if kw.get("device", "cpu") == "cpu":
                    t = {k: torch.from_dlpack(v).cuda(non_blocking=True) for k, v in b.items()}
                else:
                    t = {k: torch.from_dlpack(v) for k, v in b.items()}
                torch.cuda._sleep(cycles)
                for v in t.values():
                    v.sum()
                torch.cuda.current_stream().synchronize()
                steps += 1
            return L.stats()["wait_time_ratio"], steps / (time.perf_counter() - t0)

    train(device="cuda:0")  # warm up (CUDA context, pools)
    kinds = {"device": dict(device="cuda:0"), "pinned": dict(pin_memory=True), "pageable": {}}
    runs = {k: [] for k in kinds}

    def all_kinds():  # alternating, so each sees the same machine
        for k, kw in kinds.items():
            runs[k].append(train(**kw))

    benchmark.pedantic(all_kinds, rounds=ROUNDS, iterations=1)
    res = {
        k: (statistics.median(w for w, _ in r), statistics.median(s for _, s in r))
        for k, r in runs.items()
    }
    for k, (w, sps) in res.items():
        print(
            f"[bench_cuda] trainer {k}: wait_time_ratio {w:.3f}, {sps:.1f} steps/s "
            f"(medians of {ROUNDS})"
        )
    print(
        f"[bench_cuda] trainer steps/s ratio device/pinned "
        f"{res['device'][1] / res['pinned'][1]:.2f}, device/pageable "
        f"{res['device'][1] / res['pageable'][1]:.2f}"
    )
    benchmark.extra_info.update(
        {k: {"wait_time_ratio": w, "steps_per_s": s} for k, (w, s) in res.items()}
    )
