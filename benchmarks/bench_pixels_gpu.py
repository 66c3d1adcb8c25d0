"""GPU benchmarks of the compact pixel path (skipped without a GPU and a CUDA build of
PyTorch); scripts/gpu-check.sh runs them and collects the "[bench_pixels]" lines.

  python3 -m pytest benchmarks/bench_pixels_gpu.py --benchmark-only -q -s

1. expand_pixels output bandwidth: uint8 patches [N, 3*P*P] on the device -> float32 (and
   bfloat16) [N, 3*T*P*P], GB/s of output written, against a device-to-device copy of a
   tensor of the output's size (torch clone: about what the memory allows) in the same run.
2. uint8 host-to-device: the loader's copy path (mmloader's device stage: pinned pool ->
   device pool on its own stream, one event per batch) for a uint8 pixel batch, against a
   raw pinned copy of the same bytes (`dst.copy_(pinned, non_blocking=True)`, a
   cudaMemcpyAsync) in the same run, medians of ROUNDS alternating runs.  Target: ratio
   >= 0.8.  The stage is warmed as bench_cuda.warm_stage does (every buffer a run can have
   in flight, then until a run allocates nothing) and the bench fails if a timed run
   allocated or freed: it would time cudaHostAlloc, not the copies.
3. Per batch, on the device: uint8 copy + expand_pixels against the float32 copy it
   replaces (the time the 8x fewer bytes save).

The measuring functions take the device as an argument, so their logic also runs on the
CPU (`python3 benchmarks/bench_pixels_gpu.py` does that as a smoke check, timings aside).
"""

import os
import statistics
import sys
import time

import pytest

# the source tree last: an installed mmloader (scripts/gpu-check.sh's wheel mode) wins
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmloader import _core  # noqa: E402

ROWS = 1 << 18  # patches per expanded batch: 154 MiB uint8 -> 1.2 GiB float32 out
BATCH_ROWS = 16384  # a large micro-batch of images: 9.2 MiB uint8, 73.5 MiB float32
P, T = 14, 2
ITERS = 10
ROUNDS = 5  # every figure is the median of ROUNDS timed runs


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


def _timer(torch, device):
    """seconds(fn, iters): the median of ROUNDS rounds of `iters` calls, timed with CUDA
    events on a GPU (the work queued on the current stream), with perf_counter on the CPU."""
    cuda = torch.device(device).type == "cuda"

    def seconds(fn, iters):
        runs = []
        for _ in range(ROUNDS):
            if cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                for _ in range(iters):
                    fn()
                end.record()
                end.synchronize()
                runs.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                runs.append(time.perf_counter() - t0)
        return statistics.median(runs) / iters

    return seconds


def expand_bandwidth(torch, device, rows=ROWS, iters=ITERS):
    """{dtype: GB/s of expand_pixels output} and the clone GB/s of a float32 output-sized
    tensor (read + write, counted as the bytes written, like expand's)."""
    import mmloader.torch as mt

    seconds = _timer(torch, device)
    patches = torch.randint(0, 256, (rows, 3 * P * P), dtype=torch.uint8, device=device)
    table = mt.pixel_table("qwen2.5-vl")
    out = {}
    for dtype in (torch.float32, torch.bfloat16):

        def run():
            mt.expand_pixels(
                patches, None, table=table, patch_size=P, temporal_patch_size=T, dtype=dtype
            )

        run()  # the table goes to the device once
        nbytes = rows * 3 * T * P * P * torch.empty((), dtype=dtype).element_size()
        out[str(dtype).replace("torch.", "")] = nbytes / seconds(run, iters) / 1e9
    big = torch.empty(rows * 3 * T * P * P, dtype=torch.float32, device=device)
    out["clone_float32"] = big.numel() * 4 / seconds(lambda: big.clone(), iters) / 1e9
    # the result is exact too (the bench measures the real thing)
    want = table[
        torch.arange(3, device="cpu").repeat_interleave(P * P).repeat(4, 1),
        patches[:4].cpu().long(),
    ]
    got = (
        mt.expand_pixels(patches[:4], None, table=table, patch_size=P, temporal_patch_size=T)
        .cpu()
        .view(4, 3, T, P * P)[:, :, 0]
    )
    assert torch.equal(got.reshape(4, -1), want)
    return out


def h2d_ratio(torch, device, nbytes, iters=ITERS, rounds=ROUNDS):
    """(loader GB/s, raw pinned copy GB/s, allocated) for one tensor of `nbytes` per batch:
    medians of `rounds` alternating runs, the stage warmed until a run allocates nothing
    (bench_cuda.warm_stage); allocated: the timed runs allocated (and so timed the allocator
    too)."""
    from bench_cuda import pool_counts, stage_for, warm_stage

    stage, cap = stage_for(torch.device(device).index or 0, nbytes, iters)
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    side = torch.cuda.Stream()

    def raw():
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            for _ in range(iters):
                dst.copy_(src, non_blocking=True)
        side.synchronize()
        return time.perf_counter() - t0

    try:
        warmed, _ = warm_stage(stage, cap, nbytes, 1, iters)
        raw()
        loader_runs, raw_runs = [], []
        for _ in range(rounds):  # alternating, so both see the same machine
            loader_runs.append(stage.bench(nbytes, 1, iters))
            raw_runs.append(raw())
        allocated = pool_counts(stage.stats()) != pool_counts(warmed)
        loader_s, raw_s = statistics.median(loader_runs), statistics.median(raw_runs)
    finally:
        stage.close()
    gb = nbytes * iters / 1e9
    return gb / loader_s, gb / raw_s, allocated


def batch_times(torch, device, rows=BATCH_ROWS, iters=ITERS):
    """Seconds per batch on `device`: float32 copy from pinned memory, and uint8 copy +
    expand_pixels to float32 (the same values), both on the current stream."""
    import mmloader.torch as mt

    seconds = _timer(torch, device)
    pin = torch.device(device).type == "cuda"
    f32 = torch.empty((rows, 3 * T * P * P), dtype=torch.float32, pin_memory=pin)
    u8 = torch.randint(0, 256, (rows, 3 * P * P), dtype=torch.uint8)
    u8 = u8.pin_memory() if pin else u8
    table = mt.pixel_table("qwen2.5-vl")

    def copy_f32():
        f32.to(device, non_blocking=True)

    def copy_u8_expand():
        mt.expand_pixels(
            u8.to(device, non_blocking=True), None, table=table, patch_size=P, temporal_patch_size=T
        )

    copy_u8_expand()
    return seconds(copy_f32, iters), seconds(copy_u8_expand, iters)


def test_expand_pixels_bandwidth(benchmark):
    torch = _torch_cuda()
    res = {}
    benchmark.pedantic(
        lambda: res.update(expand_bandwidth(torch, "cuda:0")), rounds=1, iterations=1
    )
    print(
        f"\n[bench_pixels] expand_pixels {ROWS} patches: float32 out {res['float32']:.0f} GB/s, "
        f"bfloat16 out {res['bfloat16']:.0f} GB/s; device clone of the float32 size "
        f"{res['clone_float32']:.0f} GB/s; ratio float32/clone "
        f"{res['float32'] / res['clone_float32']:.2f}"
    )
    benchmark.extra_info.update(res)


def test_uint8_h2d_vs_raw_pinned_copy(benchmark):
    torch = _torch_cuda()
    nbytes = BATCH_ROWS * 3 * P * P
    res = {}
    benchmark.pedantic(
        lambda: res.setdefault("u8", h2d_ratio(torch, "cuda:0", nbytes)), rounds=1, iterations=1
    )
    loader, raw, allocated = res["u8"]
    ratio = loader / raw
    print(
        f"[bench_pixels] uint8 h2d {nbytes / 2**20:.1f} MiB/batch: loader {loader:.1f} GB/s, "
        f"raw pinned copy {raw:.1f} GB/s, ratio {ratio:.2f} (target >= 0.80: "
        f"{'met' if ratio >= 0.8 else 'NOT met'}; medians of {ROUNDS}"
        f"{', ALLOCATED while timed' if allocated else ''})"
    )
    f32_s, u8_s = batch_times(torch, "cuda:0")
    print(
        f"[bench_pixels] per batch of {BATCH_ROWS} patches on the device: float32 copy "
        f"{f32_s * 1e3:.2f} ms, uint8 copy + expand_pixels {u8_s * 1e3:.2f} ms "
        f"({f32_s / u8_s:.1f}x)"
    )
    benchmark.extra_info.update(
        loader_gbps=loader,
        raw_gbps=raw,
        ratio=ratio,
        f32_copy_ms=f32_s * 1e3,
        u8_copy_expand_ms=u8_s * 1e3,
    )
    assert not allocated, "the timed runs allocated: they timed the allocator, not the copies"


if __name__ == "__main__":  # the measuring logic on the CPU (timings mean nothing here)
    import torch

    print("expand (cpu):", expand_bandwidth(torch, "cpu", rows=4096, iters=2))
    print("batch (cpu):", batch_times(torch, "cpu", rows=1024, iters=2))
