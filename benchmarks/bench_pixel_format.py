"""pixel_format on the CPU: bytes and CPU per sample of float32, bfloat16 and uint8 output.

    python3 -m pytest benchmarks/bench_pixel_format.py --benchmark-only -q -s

One run, on one generated dataset (real photos from the wheels re-encoded as JPEG/PNG,
mixed with mmloader.datagen images; Qwen2.5-VL, max_pixels 640*640), measures for each
format an epoch of mmloader.Loader (same threads, same composition): CPU seconds per sample
(the whole process, every thread: getrusage), wall time, and pixel_values bytes per
sample; and, in the same run, the decode-only CPU per sample of the same image files
(libjpeg-turbo / libpng into RGB, _core.decode_only), so each format's cost is also given
as a ratio to decoding alone.  Also: uint8 followed by mmloader.torch.expand_pixels on the
CPU (what a CPU consumer of uint8 batches pays to get the float32 values back).  Formats
run interleaved, ROUNDS rounds; each figure is the median (min-max).  Lines starting with
"[bench_pixel_format]" are the figures.

Environment: MML_BENCH_PF_SAMPLES (default 192), MML_BENCH_PF_ROUNDS (default 3),
MML_BENCH_PF_THREADS (default min(2, CPUs)).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import mmloader  # noqa: E402
from mmloader import _core  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SAMPLES = int(os.environ.get("MML_BENCH_PF_SAMPLES", "192"))
ROUNDS = int(os.environ.get("MML_BENCH_PF_ROUNDS", "3"))
try:
    CPUS = len(os.sched_getaffinity(0))
except AttributeError:  # pragma: no cover
    CPUS = os.cpu_count() or 1
THREADS = int(os.environ.get("MML_BENCH_PF_THREADS", str(min(2, CPUS))))
MAX_PIXELS = 640 * 640


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """make_dataset's images, a third of them replaced by the real photos re-encoded."""
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("bench-pixfmt"))
    d = make_dataset(
        root,
        n_samples=SAMPLES,
        seed=0,
        n_images=max(8, SAMPLES // 2),
        min_size=160,
        max_size=800,
        text_only_fraction=0.0,
        two_image_fraction=0.0,
    )
    try:
        from photos import encode, photos, rgb

        real = list(photos(1600).values())
    except BaseException:  # noqa: BLE001 - the photo wheels are optional here
        real = []
    for i, path in enumerate(sorted(d["images"])[::3]):
        if not real:
            break
        im = rgb(real[i % len(real)])
        with open(path, "wb") as f:  # the same name: JPEG or PNG bytes, told by magic
            f.write(encode(im, "JPEG", quality=90) if path.endswith(".jpg") else encode(im, "PNG"))
    d["real_photos"] = bool(real)
    return d


def _epoch(ds, fmt: str, expand: bool = False):
    """(CPU s, wall s, pixel bytes, samples) of one epoch with pixel_format=fmt."""
    kw = dict(
        tokenizer=TINY,
        micro_batch_size=4,
        num_threads=THREADS,
        prefetch=4,
        max_pixels=MAX_PIXELS,
        shuffle=False,
        pixel_format=fmt,
    )
    with mmloader.Loader(ds["shards"], **kw) as L:
        n = nbytes = 0
        c0, t0 = _cpu(), time.perf_counter()
        for b in L:
            pv = b["pixel_values"]
            nbytes += pv.nbytes
            if expand:
                import torch
                import mmloader.torch as mt

                out = mt.expand_pixels(
                    torch.from_dlpack(pv), torch.from_dlpack(b["image_grid_thw"])
                )
                del out
            n += int(b["input_ids"].shape[0])
        return _cpu() - c0, time.perf_counter() - t0, nbytes, n


def _decode_only(ds):
    files = []
    for p in sorted(ds["images"]):
        with open(p, "rb") as f:
            files.append(f.read())
    c0 = _cpu()
    _core.decode_only(files)
    return (_cpu() - c0) / len(files)


def _fmt(xs, scale=1.0, spec=".2f"):
    m = statistics.median(xs) * scale
    return f"{m:{spec}} ({min(xs) * scale:{spec}}-{max(xs) * scale:{spec}})"


def test_pixel_format_cpu_and_bytes_per_sample(benchmark, ds):
    runs = {"float32": [], "bfloat16": [], "uint8": [], "uint8+expand_pixels(cpu)": []}
    decode = []
    _epoch(ds, "float32")  # warm up: page cache, pools

    def one_round():
        for name in runs:
            fmt = name.split("+")[0]
            runs[name].append(_epoch(ds, fmt, expand="+" in name))
        decode.append(_decode_only(ds))

    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            runs.pop("uint8+expand_pixels(cpu)")
    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    # decode-only is per image file; a sample here has exactly one image
    dec_ms = statistics.median(decode) * 1e3
    print(
        f"\n[bench_pixel_format] {SAMPLES} samples (1 image each; real photos mixed in: "
        f"{ds['real_photos']}), {THREADS} threads, {ROUNDS} rounds, median (min-max)"
    )
    print(f"[bench_pixel_format] decode-only CPU per image {_fmt(decode, 1e3)} ms")
    info = {"decode_only_ms": dec_ms}
    for name, rs in runs.items():
        cpu = [r[0] / r[3] for r in rs]
        wall = [r[1] / r[3] for r in rs]
        nb = [r[2] / r[3] for r in rs]
        ratio = statistics.median(cpu) * 1e3 / dec_ms
        print(
            f"[bench_pixel_format] {name:26s} CPU/sample {_fmt(cpu, 1e3)} ms "
            f"(x{ratio:.2f} decode-only), wall/sample {_fmt(wall, 1e3)} ms, "
            f"pixel bytes/sample {statistics.median(nb) / 1e6:.3f} MB"
        )
        info[name] = {
            "cpu_ms": statistics.median(cpu) * 1e3,
            "wall_ms": statistics.median(wall) * 1e3,
            "bytes": statistics.median(nb),
            "cpu_over_decode": ratio,
        }
    benchmark.extra_info.update(info)
